//! A hint to the processor that an address is about to be read.

/// Asks the processor to bring the cache line at `addr` closer, without
/// waiting for it. A prefetch never faults, whatever the address, so any
/// `addr` is sound; on processors without the instruction this does nothing.
#[inline]
pub(crate) fn prefetch(addr: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `_mm_prefetch` needs SSE, which every x86-64 processor has
    // (it is in the x86-64 baseline that Rust targets), and a prefetch
    // reads nothing and cannot fault on any address.
    #[allow(unsafe_code)]
    unsafe {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        _mm_prefetch::<_MM_HINT_T0>(addr as *const i8);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = addr;
}
