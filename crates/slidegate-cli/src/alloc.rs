//! The binary's allocator: mimalloc, and handing its free memory back to
//! the system after a reload. This file holds the binary's only `unsafe`.
//!
//! mimalloc costs the service about 12 % fewer instructions a gRPC call
//! than glibc's allocator (a call allocates some 50 times, in hyper, h2,
//! tonic and the engine; BENCHMARKS.md). It keeps freed pages for reuse:
//! after a reload, [`give_back_free_memory`] returns what the old config
//! held (`tests/reload.rs` fails without it: a 6 MB config's memory stays
//! resident).

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Hands the free memory back to the system: mimalloc's, collected on the
/// calling thread (the reload's, which freed the old config), then
/// glibc's, which C code linked in may still use. Call it off the async
/// runtime.
pub(crate) fn give_back_free_memory() {
    // SAFETY: `mi_collect` takes no pointer and only frees memory that no
    // allocation holds; it may be called from any thread at any time.
    #[allow(unsafe_code)]
    unsafe {
        libmimalloc_sys::mi_collect(true);
    }
    slidegate_server::server::give_back_free_memory();
}
