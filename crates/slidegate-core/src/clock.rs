//! Time sources. The algorithms never call these; callers read a clock once
//! per decision and pass the nanoseconds in.

use alloc::sync::Arc;
use core::sync::atomic::{AtomicU64, Ordering};
use core::time::Duration;

/// A source of monotonic time in nanoseconds since an arbitrary origin.
///
/// Implementations must never go backwards for one observer. The algorithms
/// tolerate time going backwards (see the crate docs), but their guarantees
/// are stated for non-decreasing time.
pub trait Clock {
    /// Nanoseconds since this clock's origin.
    fn now(&self) -> u64;
}

impl<C: Clock + ?Sized> Clock for &C {
    fn now(&self) -> u64 {
        (**self).now()
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now(&self) -> u64 {
        (**self).now()
    }
}

/// A clock that only moves when told to: for tests, simulations and replays.
///
/// Clones share the same time, so a test can keep one handle and give
/// another to the code under test.
///
/// # Concurrency
///
/// Reads and writes are single atomic operations; `advance` from several
/// threads adds up (saturating at `u64::MAX`).
#[derive(Clone, Debug, Default)]
pub struct ManualClock {
    now: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock showing `now_ns`.
    pub fn new(now_ns: u64) -> Self {
        ManualClock {
            now: Arc::new(AtomicU64::new(now_ns)),
        }
    }

    /// Sets the time; it may go backwards, to test that path.
    pub fn set(&self, now_ns: u64) {
        self.now.store(now_ns, Ordering::SeqCst);
    }

    /// Moves the time forward by `by`, saturating at `u64::MAX` nanoseconds.
    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        let _ = self
            .now
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |t| Some(t.saturating_add(by)));
    }
}

impl Clock for ManualClock {
    fn now(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }
}

/// The operating system's monotonic clock (`std::time::Instant`), counted
/// from the moment this value was created.
#[cfg(feature = "std")]
#[derive(Clone, Copy, Debug)]
pub struct MonotonicClock {
    origin: std::time::Instant,
}

#[cfg(feature = "std")]
impl MonotonicClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        MonotonicClock {
            origin: std::time::Instant::now(),
        }
    }
}

#[cfg(feature = "std")]
impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(feature = "std")]
impl Clock for MonotonicClock {
    fn now(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_is_shared_and_saturates() {
        let clock = ManualClock::new(5);
        let other = clock.clone();
        other.advance(Duration::from_nanos(10));
        assert_eq!(clock.now(), 15);
        clock.advance(Duration::MAX);
        assert_eq!(other.now(), u64::MAX);
        clock.set(3);
        assert_eq!(other.now(), 3);
    }

    #[cfg(feature = "std")]
    #[test]
    fn monotonic_clock_does_not_go_backwards() {
        let clock = MonotonicClock::new();
        let a = clock.now();
        let b = clock.now();
        assert!(b >= a);
    }
}
