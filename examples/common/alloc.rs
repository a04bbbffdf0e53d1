//! The example programs' global allocator: mimalloc, wrapped in a counter of the bytes held, so
//! that a program can report the peak memory of a training step on CPU backends.
//!
//! Why not the system allocator: a training step allocates and frees tensors of tens of MB many
//! times. glibc's malloc serves each of those with a fresh `mmap` and returns it with `munmap`, so
//! every step page-faults its memory in again. A training step of one 60m-shape layer on Flex
//! took 1.13–1.25 s with glibc's malloc and 0.74–0.93 s with mimalloc (docs/performance.md).
//! Flex keeps no pool of its own, so the counter sees every tensor.

use mimalloc::MiMalloc;
use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

static INNER: MiMalloc = MiMalloc;

/// The allocator of every program that includes `common` (examples and the harness's tests).
#[global_allocator]
pub static ALLOC: PeakAlloc = PeakAlloc::new();

pub struct PeakAlloc {
    current: AtomicUsize,
    peak: AtomicUsize,
}

impl PeakAlloc {
    pub const fn new() -> Self {
        Self {
            current: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
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
        let now = self.current.fetch_add(bytes, Relaxed) + bytes;
        self.peak.fetch_max(now, Relaxed);
    }
}

// SAFETY: every call forwards to the inner allocator unchanged; the counters only observe it.
unsafe impl GlobalAlloc for PeakAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let ptr = unsafe { INNER.alloc(layout) };
        if !ptr.is_null() {
            self.grow(layout.size());
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let ptr = unsafe { INNER.alloc_zeroed(layout) };
        if !ptr.is_null() {
            self.grow(layout.size());
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { INNER.dealloc(ptr, layout) };
        self.current.fetch_sub(layout.size(), Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let new = unsafe { INNER.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            self.current.fetch_sub(layout.size(), Relaxed);
            self.grow(new_size);
        }
        new
    }
}
