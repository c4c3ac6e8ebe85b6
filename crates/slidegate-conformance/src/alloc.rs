//! A global allocator that counts the bytes in use and their peak.
//!
//! ```ignore
//! #[global_allocator]
//! static ALLOC: slidegate_conformance::alloc::Counting = slidegate_conformance::alloc::Counting::new();
//! ```

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

thread_local! {
    /// Allocations (and reallocations) made on this thread.
    static HERE: Cell<u64> = const { Cell::new(0) };
}

/// Allocations and reallocations made on the calling thread so far, by
/// any allocator call through [`Counting`]: unlike the byte counts, not
/// moved by other threads (a test harness's own timers and output), so a
/// test of code that must not allocate compares two of these.
pub fn allocations_here() -> u64 {
    HERE.try_with(Cell::get).unwrap_or(0)
}

fn count_here() {
    // During a thread's teardown the counter may be gone: not counted.
    let _ = HERE.try_with(|c| c.set(c.get() + 1));
}

/// The system allocator, counting the bytes of live allocations (as
/// requested: allocator overhead is not included) and their peak.
#[derive(Debug)]
pub struct Counting {
    current: AtomicUsize,
    peak: AtomicUsize,
}

impl Counting {
    /// A counter at zero.
    pub const fn new() -> Self {
        Counting {
            current: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
        }
    }

    /// Bytes allocated and not yet freed.
    pub fn current(&self) -> usize {
        self.current.load(Ordering::Relaxed)
    }

    /// The most bytes in use at once since the last [`Counting::reset_peak`].
    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }

    /// Starts a new peak from the bytes in use now.
    pub fn reset_peak(&self) {
        self.peak.store(self.current(), Ordering::Relaxed);
    }

    fn grew(&self, bytes: usize) {
        count_here();
        let now = self.current.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.peak.fetch_max(now, Ordering::Relaxed);
    }

    fn shrank(&self, bytes: usize) {
        self.current.fetch_sub(bytes, Ordering::Relaxed);
    }
}

impl Default for Counting {
    fn default() -> Self {
        Self::new()
    }
}

// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged, so `System`'s guarantees hold; the counting touches only
// atomics.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as received (see above).
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            self.grew(layout.size());
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as received (see above).
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            self.grew(layout.size());
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded as received (see above).
        unsafe { System.dealloc(ptr, layout) };
        self.shrank(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded as received (see above).
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            self.shrank(layout.size());
            self.grew(new_size);
        }
        new
    }
}
