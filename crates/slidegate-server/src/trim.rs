//! Giving freed memory back to the system after a reload. glibc's
//! allocator keeps the memory a large config took in its arenas after the
//! config is dropped (a 6 MB config: about 250 MB of resident memory kept
//! for good); `malloc_trim` hands the free pages back. This file holds the
//! crate's only `unsafe`.

/// Hands the allocator's free memory back to the system, where the
/// allocator is glibc's (elsewhere: nothing to do). Takes each arena's
/// lock in turn, briefly: call it off the async runtime.
pub fn give_back_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` takes no pointer and is thread-safe (it locks
    // each arena while trimming it); it only releases free pages.
    #[allow(unsafe_code)]
    unsafe {
        libc::malloc_trim(0);
    }
}
