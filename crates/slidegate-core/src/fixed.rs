//! `fixed_window`: one counter per fixed window.

use crate::decision::{elapsed_in, fits, saturate};
use crate::{Decision, LimitState, Policy};

/// `fixed_window`: one counter for the current window `floor(t / W)`,
/// reset at each multiple of `W` (the ring of seed 000 with `n = 1`).
///
/// Exact per fixed window: no fixed window ever holds more than `limit`
/// admitted units. Across a boundary a client can get up to `2·limit` in a
/// window of length `W`.
///
/// A late request from an earlier window is refused (its window is no longer
/// kept), as the ring does with a bucket that has left it.
///
/// # Memory
///
/// 16 bytes inline: the window index and the count.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FixedWindow {
    window: u64,
    count: u64,
}

impl FixedWindow {
    /// An empty counter.
    pub fn new() -> Self {
        Self::default()
    }

    /// The count of the window last counted in: the ring never counts more
    /// at any later instant.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The count of window `idx` (0 for a later window, which starts empty).
    fn count_in(&self, idx: u64) -> u64 {
        if idx > self.window { 0 } else { self.count }
    }

    fn roll(&mut self, idx: u64) {
        if idx > self.window {
            self.window = idx;
            self.count = 0;
        }
    }

    /// [`LimitState::admit`] past its hot path (a new window, a late
    /// request or a peek): out of line, so that the hot path's caller
    /// keeps a small frame.
    #[inline(never)]
    fn admit_beyond(&mut self, policy: &Policy, now: u64, cost: u64) -> bool {
        self.check(policy, now, cost).allowed()
    }
}

/// The start of window `idx`, saturating.
fn start(idx: u128, w: u64) -> u64 {
    saturate(idx * u128::from(w))
}

impl LimitState for FixedWindow {
    #[inline]
    fn check(&mut self, policy: &Policy, now: u64, cost: u64) -> Decision {
        let w = policy.step_ns();
        let limit = policy.limit();
        let idx = now / w;
        if cost > 0 {
            self.roll(idx);
        }
        let current = idx.max(self.window);
        let count = self.count_in(idx);
        let in_window = idx >= self.window;
        let fits = count.checked_add(cost).is_some_and(|sum| sum <= limit);
        let allowed = in_window && fits;
        if allowed {
            self.count += cost;
        }
        let after = if allowed { count + cost } else { count };
        let remaining = if in_window { limit.saturating_sub(after) } else { 0 };
        let reset_at = if after > 0 {
            start(u128::from(current) + 1, w)
        } else {
            0
        };
        let retry_at = (!allowed && cost <= limit).then(|| {
            if !in_window && fits {
                start(u128::from(current), w)
            } else {
                start(u128::from(current) + 1, w)
            }
        });
        Decision::at(policy, now, allowed, remaining, reset_at, retry_at, (count, 0, 1))
    }

    /// [`LimitState::check`]'s decision and new state without the
    /// headers, and without a division for a request in the window last
    /// counted in.
    #[inline]
    fn admit(&mut self, policy: &Policy, now: u64, cost: u64) -> bool {
        if cost > 0 && elapsed_in(self.window, policy.step_ns(), now).is_some() {
            let allowed = fits(policy.limit(), self.count, cost);
            if allowed {
                self.count += cost;
            }
            return allowed;
        }
        self.admit_beyond(policy, now, cost)
    }

    fn record(&mut self, policy: &Policy, now: u64, cost: u64) {
        let idx = now / policy.step_ns();
        self.roll(idx);
        if idx == self.window {
            self.count = self.count.saturating_add(cost);
        }
    }

    fn expires_at(&self, policy: &Policy) -> u64 {
        if self.count == 0 {
            0
        } else {
            start(u128::from(self.window) + 1, policy.step_ns())
        }
    }

    fn estimate(&self, policy: &Policy, now: u64) -> f64 {
        self.count_in(now / policy.step_ns()) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Algorithm;
    use core::time::Duration;

    #[test]
    fn resets_at_each_boundary() {
        let p = Policy::new(3, Duration::from_nanos(100), Algorithm::FixedWindow).unwrap();
        let mut s = FixedWindow::new();
        assert!(s.check(&p, 99, 3).allowed());
        let d = s.check(&p, 99, 1);
        assert!(!d.allowed());
        assert_eq!(d.retry_after(), Some(Duration::from_nanos(1)));
        assert_eq!(d.reset_after(), Duration::from_nanos(1));
        // Up to 2× across the boundary: 3 at 99 and 3 at 100.
        let d = s.check(&p, 100, 3);
        assert!(d.allowed());
        assert_eq!(d.remaining(), 0);
        assert_eq!(d.reset_after(), Duration::from_nanos(100));
        // A late request from window 0 is refused; it would pass only in
        // window 2.
        let d = s.check(&p, 50, 1);
        assert!(!d.allowed());
        assert_eq!(d.retry_after(), Some(Duration::from_nanos(150)));
        assert!(!s.check(&p, 4, 4).allowed());
        assert_eq!(s.check(&p, 4, 4).retry_after(), None);
        assert!(s.check(&p, u64::MAX, 3).allowed());
    }
}
