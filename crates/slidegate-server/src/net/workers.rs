//! Threads that serve connections, each on a single-threaded runtime of its
//! own (`serve --workers`).
//!
//! On tokio's multi-threaded runtime, a task that wakes another runs it
//! next (the LIFO slot): each gRPC stream's task, finishing, runs its
//! connection's task at once, which writes that one response — about one
//! `writev` per call. On a single-threaded runtime the woken connection
//! task waits behind the other streams' tasks and writes their responses
//! together, and no thread wakes another. A connection is accepted on the
//! caller's runtime, moved to the next worker (round robin) and registered
//! with that worker's reactor before anything is read, so that all its IO
//! and all its requests' tasks stay on one thread.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::runtime::Handle;
use tokio::sync::oneshot;

/// The worker threads; they stop when this is dropped.
#[derive(Debug)]
pub(crate) struct Workers {
    handles: Vec<Handle>,
    next: AtomicUsize,
    /// Dropped to stop the threads.
    stops: Mutex<Vec<oneshot::Sender<()>>>,
}

impl Workers {
    /// Starts `n` (at least 1) worker threads, named `slidegate-worker-<i>`.
    ///
    /// # Errors
    ///
    /// When a thread or its runtime cannot be started.
    pub(crate) fn start(n: usize) -> io::Result<Arc<Workers>> {
        let mut handles = Vec::new();
        let mut stops = Vec::new();
        for i in 0..n.max(1) {
            let (stop, stopped) = oneshot::channel::<()>();
            let (started, handle) = std::sync::mpsc::channel();
            std::thread::Builder::new()
                .name(format!("slidegate-worker-{i}"))
                .spawn(move || {
                    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
                    match runtime {
                        Ok(runtime) => {
                            let _ = started.send(Ok(runtime.handle().clone()));
                            // Drives the tasks spawned on it until stopped;
                            // those still running are then dropped.
                            let _ = runtime.block_on(stopped);
                        }
                        Err(e) => {
                            let _ = started.send(Err(e));
                        }
                    }
                })?;
            let handle = handle
                .recv()
                .map_err(|_| io::Error::other("a worker thread stopped before its runtime started"))??;
            handles.push(handle);
            stops.push(stop);
        }
        Ok(Arc::new(Workers {
            handles,
            next: AtomicUsize::new(0),
            stops: Mutex::new(stops),
        }))
    }

    /// The next worker's runtime, round robin.
    pub(crate) fn next(&self) -> Option<&Handle> {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        self.handles.get(i % self.handles.len().max(1))
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        // Dropping the senders ends each thread's `block_on`.
        if let Ok(mut stops) = self.stops.lock() {
            stops.clear();
        }
    }
}
