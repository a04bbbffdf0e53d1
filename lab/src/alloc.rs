//! The example programs' global allocator: mimalloc, wrapped in a counter of the bytes held, so
//! that a program can report the peak memory of a training step on CPU backends.
//!
//! Why not the system allocator: a training step allocates and frees tensors of tens of MB many
//! times. glibc's malloc serves each of those with a fresh `mmap` and returns it with `munmap`, so
//! every step page-faults its memory in again. A training step of one 60m-shape layer on Flex
//! took 1.13–1.25 s with glibc's malloc and 0.74–0.93 s with mimalloc (results/performance.md).
//! Flex keeps no pool of its own, so the counter sees every tensor.
//!
//! The first allocation also tells mimalloc to keep freed memory rather than return it to the
//! OS a second later (its purge delay, set to −1 unless the environment sets it, as
//! `MIMALLOC_PURGE_DELAY` or in any spelling mimalloc reads): a training step frees and
//! allocates the same few hundred MB every step, and returned memory came back as page faults
//! and page zeroing (18.5% of the samples of a 60m-layer Euler-3 run). A trainer holds its peak
//! memory anyway. Measured in results/performance.md.

use mimalloc::MiMalloc;
use std::alloc::{GlobalAlloc, Layout};
use std::ffi::{c_int, c_long};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};

static INNER: MiMalloc = MiMalloc;

/// The allocator of every program that links the harness (examples and tests), installed as the
/// global allocator with the feature `global-allocator` (on by default). Without it, its counts
/// stay at zero.
#[cfg_attr(feature = "global-allocator", global_allocator)]
pub static ALLOC: PeakAlloc = PeakAlloc::new();

pub struct PeakAlloc {
    current: AtomicUsize,
    peak: AtomicUsize,
    configured: AtomicBool,
}

/// mimalloc's `mi_option_purge_delay`: index 15 of `mi_option_t` in mimalloc 2 and 3 (the enum
/// keeps its deprecated slots, so indices do not move); libmimalloc-sys names no constant for it.
const MI_OPTION_PURGE_DELAY: c_int = 15;

unsafe extern "C" {
    fn mi_option_set_default(option: c_int, value: c_long);
    fn mi_option_get(option: c_int) -> c_long;
}

/// mimalloc's purge delay in milliseconds (−1: freed memory is never returned to the OS).
pub fn purge_delay() -> i64 {
    // SAFETY: reads an integer option.
    unsafe { mi_option_get(MI_OPTION_PURGE_DELAY) as i64 }
}

fn keep_freed_memory() {
    // SAFETY: stores an integer, and only if mimalloc did not take the option from the
    // environment at start-up; it never calls back into this allocator.
    unsafe { mi_option_set_default(MI_OPTION_PURGE_DELAY, -1) }
}

impl Default for PeakAlloc {
    fn default() -> Self {
        Self::new()
    }
}

impl PeakAlloc {
    /// An allocator that has counted nothing yet.
    pub const fn new() -> Self {
        Self {
            current: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            configured: AtomicBool::new(false),
        }
    }

    /// Starts a new measurement; returns the bytes held now.
    pub fn reset_peak(&self) -> usize {
        let now = self.current.load(Relaxed);
        self.peak.store(now, Relaxed);
        now
    }

    /// The most bytes held since the last [`reset_peak`](Self::reset_peak).
    pub fn peak(&self) -> usize {
        self.peak.load(Relaxed)
    }

    fn grow(&self, bytes: usize) {
        if !self.configured.load(Relaxed) && !self.configured.swap(true, Relaxed) {
            keep_freed_memory();
        }
        let now = self.current.fetch_add(bytes, Relaxed) + bytes;
        self.peak.fetch_max(now, Relaxed);
    }
}

// SAFETY: every call forwards to the inner allocator unchanged; the counters only observe it.
unsafe impl GlobalAlloc for PeakAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc` (a non-zero-sized layout) is passed on unchanged.
        let ptr = unsafe { INNER.alloc(layout) };
        if !ptr.is_null() {
            self.grow(layout.size());
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`: the caller's layout is passed on unchanged.
        let ptr = unsafe { INNER.alloc_zeroed(layout) };
        if !ptr.is_null() {
            self.grow(layout.size());
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by this allocator, that is by `INNER`, with `layout`.
        unsafe { INNER.dealloc(ptr, layout) };
        self.current.fetch_sub(layout.size(), Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` was allocated by `INNER` with `layout`; the caller guarantees `new_size`.
        let new = unsafe { INNER.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            self.current.fetch_sub(layout.size(), Relaxed);
            self.grow(new_size);
        }
        new
    }
}
