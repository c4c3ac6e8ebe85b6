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

/// The monotonic clock of production: nanoseconds counted from the moment
/// this value was created, read from the CPU's time-stamp counter where that
/// is sound and from the operating system's monotonic clock
/// (`std::time::Instant`'s source) otherwise.
///
/// The counter is read through the [`quanta`] crate (governor's default
/// clock too): on `x86_64` with a constant or invariant TSC, and on
/// `aarch64` (its system counter), `quanta` calibrates the counter against
/// the OS clock once per process and scales each reading with a
/// multiplication and a shift (about 10 ns a read on the VM of
/// `BENCHMARKS.md`, against 20–45 ns for `Instant::now`); elsewhere, and
/// when the CPU does not say its counter ticks at a constant rate, it reads
/// the OS clock.
///
/// # Resolution and monotonicity
///
/// - Resolution: one counter tick scaled to nanoseconds (below 1 ns on a
///   GHz counter; the OS clock's own on the fallback).
/// - Monotonic for one observer on one CPU. Across CPUs the counters of
///   one machine are synchronised by the hardware and the kernel where the
///   TSC is invariant; a read on another CPU that came out a few
///   nanoseconds early is a late request to the algorithms (the crate's
///   rule for time going backwards: judged at the newest time a state has
///   seen, never moving its newest bucket back). Readings never go below 0.
/// - The retry-after guarantee (a request refused with `retry_after = d`
///   would be admitted at `now + d` if nothing else were counted) is stated
///   in this clock's nanoseconds: a caller that waits `d` by another clock
///   (a timer of the OS) waits at least as long as this clock measures, up
///   to the calibration's error (parts per million of the elapsed time).
#[cfg(feature = "std")]
#[derive(Clone, Debug)]
pub struct MonotonicClock {
    clock: quanta::Clock,
    /// The counter's raw reading at creation.
    origin: u64,
}

#[cfg(feature = "std")]
impl MonotonicClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        let clock = quanta::Clock::new();
        let origin = clock.raw();
        MonotonicClock { clock, origin }
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
    #[inline]
    fn now(&self) -> u64 {
        // 0 for a reading at or before the origin (another CPU's counter
        // a few ticks behind).
        self.clock.delta_as_nanos(self.origin, self.clock.raw())
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
