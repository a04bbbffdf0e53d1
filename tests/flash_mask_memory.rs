//! The flash scorer reads a padding mask as it is given: at context 4096 its forward and backward
//! passes with a padding mask `[batch, 1, 1, s_k]` peak within a few MiB of the same passes with
//! no mask, where broadcasting it to `[batch, heads, s_q, s_k]` would cost 64 MiB of bools. Heap
//! bytes are counted by this test binary's allocator (the only test in it, so nothing else
//! allocates meanwhile). Needs the `autodiff` feature.
#![cfg(feature = "autodiff")]

use burn::backend::{Autodiff, Flex};
use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Distribution, Tensor, TensorData};
use coupled_qk::attention::{flash_attention, register_flash_attention};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

struct Counting;

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded to the system allocator unchanged; the counters only observe.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's layout is passed on as it came.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            let now = CURRENT.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        ptr
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) };
        CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

type Ad = Autodiff<Flex>;

const HEADS: usize = 4;
const SEQ: usize = 4096;
const D: usize = 16;

/// Heap bytes above those held before, at the peak of one forward and backward pass.
fn peak_bytes(mask: Option<Tensor<Ad, 4, Bool>>) -> usize {
    let device = Default::default();
    let input = |seed| {
        Ad::seed(&device, seed);
        Tensor::<Ad, 4>::random([1, HEADS, SEQ, D], Distribution::Normal(0.0, 1.0), &device)
            .require_grad()
    };
    let (q, k, v) = (input(1), input(2), input(3));
    let before = CURRENT.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let output = flash_attention(q.clone(), k.clone(), v.clone(), mask, true, None);
    let grads = output.sum().backward();
    let peak = PEAK.load(Ordering::Relaxed) - before;
    assert!(q.grad(&grads).is_some() && k.grad(&grads).is_some());
    peak
}

#[test]
fn a_padding_mask_costs_no_score_matrix() {
    register_flash_attention::<Ad>();
    let device = Default::default();
    // The last 96 keys are padding.
    let bits: Vec<bool> = (0..SEQ).map(|j| j >= SEQ - 96).collect();
    let pad = Tensor::<Ad, 4, Bool>::from_bool(TensorData::new(bits, [1, 1, 1, SEQ]), &device);
    // Once first, so that one-time allocations (thread pools, caches) are not counted.
    peak_bytes(None);
    let without = peak_bytes(None);
    let with = peak_bytes(Some(pad));
    let mib = |b: usize| b as f64 / (1 << 20) as f64;
    let broadcast = HEADS * SEQ * SEQ;
    eprintln!(
        "peak heap of a forward and backward pass at [1, {HEADS}, {SEQ}, {D}]: {:.1} MiB without \
         a mask, {:.1} MiB with a padding mask (broadcast, the mask alone would be {:.0} MiB)",
        mib(without),
        mib(with),
        mib(broadcast)
    );
    assert!(
        with < without + (4 << 20),
        "a padding mask added {:.1} MiB to the peak",
        mib(with.saturating_sub(without))
    );
}
