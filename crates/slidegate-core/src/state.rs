//! One enum over the states of all the algorithms.

use crate::{
    Algorithm, Decision, ExponentialHistogram, FixedWindow, Gcra, LimitState, Policy, SlidingLog, SlidingWindow,
};

/// The state of any algorithm, chosen from a [`Policy`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum State {
    /// `sliding_window` with a limit that fits 32-bit slots.
    SlidingWindow(SlidingWindow<u32>),
    /// `sliding_window` with a limit above `u32::MAX`.
    SlidingWindowWide(SlidingWindow<u64>),
    /// `fixed_window`.
    FixedWindow(FixedWindow),
    /// `sliding_log`.
    SlidingLog(SlidingLog),
    /// `gcra`.
    Gcra(Gcra),
    /// `exponential_histogram`.
    ExponentialHistogram(ExponentialHistogram),
}

impl State {
    /// A fresh (empty) state for `policy`.
    pub fn new(policy: &Policy) -> State {
        match policy.algorithm() {
            Algorithm::SlidingWindow { .. } if policy.limit() <= u64::from(u32::MAX) => {
                State::SlidingWindow(SlidingWindow::new(policy))
            }
            Algorithm::SlidingWindow { .. } => State::SlidingWindowWide(SlidingWindow::new(policy)),
            Algorithm::FixedWindow => State::FixedWindow(FixedWindow::new()),
            Algorithm::SlidingLog => State::SlidingLog(SlidingLog::new()),
            Algorithm::Gcra { .. } => State::Gcra(Gcra::new()),
            Algorithm::ExponentialHistogram { .. } => State::ExponentialHistogram(ExponentialHistogram::new()),
        }
    }

    /// Bytes this state occupies, inline and on the heap (allocator
    /// overhead not included).
    pub fn bytes(&self) -> usize {
        core::mem::size_of::<Self>()
            + match self {
                State::SlidingWindow(s) => s.heap_bytes(),
                State::SlidingWindowWide(s) => s.heap_bytes(),
                State::SlidingLog(s) => s.heap_bytes(),
                State::ExponentialHistogram(s) => s.heap_bytes(),
                State::FixedWindow(_) | State::Gcra(_) => 0,
            }
    }
}

/// Calls `$call` on the state inside any variant (static dispatch, so the
/// algorithm's code inlines into the caller).
macro_rules! each {
    ($state:expr, $s:ident => $call:expr) => {
        match $state {
            State::SlidingWindow($s) => $call,
            State::SlidingWindowWide($s) => $call,
            State::FixedWindow($s) => $call,
            State::SlidingLog($s) => $call,
            State::Gcra($s) => $call,
            State::ExponentialHistogram($s) => $call,
        }
    };
}

impl State {
    /// [`LimitState::check`] for the variants that `check` does not inline.
    #[inline(never)]
    fn check_rest(&mut self, policy: &Policy, now: u64, cost: u64) -> Decision {
        each!(self, s => s.check(policy, now, cost))
    }

    /// [`LimitState::admit`] for the variants that `admit` does not inline.
    #[inline(never)]
    fn admit_rest(&mut self, policy: &Policy, now: u64, cost: u64) -> bool {
        each!(self, s => s.admit(policy, now, cost))
    }
}

impl LimitState for State {
    #[inline]
    fn check(&mut self, policy: &Policy, now: u64, cost: u64) -> Decision {
        match self {
            State::SlidingWindow(s) => s.check(policy, now, cost),
            State::FixedWindow(s) => s.check(policy, now, cost),
            State::Gcra(s) => s.check(policy, now, cost),
            // Out of line, so that the states above inline into a small frame.
            other => other.check_rest(policy, now, cost),
        }
    }

    #[inline]
    fn admit(&mut self, policy: &Policy, now: u64, cost: u64) -> bool {
        match self {
            State::SlidingWindow(s) => s.admit(policy, now, cost),
            State::FixedWindow(s) => s.admit(policy, now, cost),
            State::Gcra(s) => s.admit(policy, now, cost),
            // Out of line, so that the states above inline into a small frame.
            other => other.admit_rest(policy, now, cost),
        }
    }

    fn record(&mut self, policy: &Policy, now: u64, cost: u64) {
        each!(self, s => s.record(policy, now, cost))
    }

    fn estimate(&self, policy: &Policy, now: u64) -> f64 {
        each!(self, s => s.estimate(policy, now))
    }

    fn expires_at(&self, policy: &Policy) -> u64 {
        each!(self, s => s.expires_at(policy))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;
    use core::time::Duration;

    /// The bytes per key documented on each type.
    #[test]
    fn documented_sizes() {
        assert_eq!(size_of::<SlidingWindow<u32>>(), 48);
        assert_eq!(size_of::<FixedWindow>(), 16);
        assert_eq!(size_of::<SlidingLog>(), 40);
        assert_eq!(size_of::<Gcra>(), 8);
        assert_eq!(size_of::<ExponentialHistogram>(), 48);
        let policy = |buckets| {
            Policy::new(
                100,
                Duration::from_secs(60),
                Algorithm::SlidingWindow {
                    buckets,
                    weighting: crate::Weighting::Interpolated,
                },
            )
            .unwrap()
        };
        assert_eq!(State::new(&policy(2)).bytes(), size_of::<State>() + 8);
        assert_eq!(State::new(&policy(61)).bytes(), size_of::<State>() + 244);
        let wide = Policy::new(u64::MAX, Duration::from_secs(1), Algorithm::TWO_BUCKETS).unwrap();
        assert!(matches!(State::new(&wide), State::SlidingWindowWide(_)));
        assert_eq!(State::new(&wide).bytes(), size_of::<State>() + 16);
    }
}
