//! `sliding_log`: the exact log of seed 002.

use crate::decision::{saturate, saturating_sum};
use crate::{Decision, LimitState, Policy};
use alloc::collections::VecDeque;

/// `sliding_log`: the times of admitted requests, oldest first (seed 002).
///
/// Exact over the half-open window `(now − W, now]`: an entry made exactly
/// `W` ago is outside it, so the request at exactly `oldest + W` is
/// admitted. No window of length `W` ever holds more than `limit` admitted
/// units. Refused requests are never logged.
///
/// Headers are exactly true: `retry_after` is when enough of the oldest
/// entries leave the window for the request to fit (`oldest + W − now` for a
/// cost of 1), `remaining` is the budget minus the log after the request.
///
/// A late request (time before the newest entry) is judged and logged at the
/// newest entry's time, so the log stays sorted and never under-counts.
///
/// # Memory
///
/// 40 bytes inline plus 16 bytes per distinct admitted timestamp still in the
/// window (`(time, cost)` pairs): at most `limit` entries.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SlidingLog {
    entries: VecDeque<(u64, u64)>,
    /// Sum of the costs in `entries`.
    total: u64,
}

impl SlidingLog {
    /// An empty log.
    pub fn new() -> Self {
        Self::default()
    }

    /// Bytes on the heap: the entries' capacity.
    pub fn heap_bytes(&self) -> usize {
        self.entries.capacity() * core::mem::size_of::<(u64, u64)>()
    }

    /// The sum of the costs logged, expired or not: the log never counts
    /// more at any later instant.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Number of logged entries (distinct timestamps), expired or not.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the log holds no entry.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The time the log judges `now` at: never before its newest entry.
    fn clamp(&self, now: u64) -> u64 {
        self.entries.back().map_or(now, |&(t, _)| t.max(now))
    }

    /// How many leading entries are outside `(t − W, t]`, and their sum.
    fn expired(&self, t: u64, w: u64) -> (usize, u64) {
        let Some(cutoff) = t.checked_sub(w) else { return (0, 0) };
        let n = self.entries.partition_point(|&(time, _)| time <= cutoff);
        (n, saturating_sum(self.entries.range(..n).map(|&(_, c)| c)))
    }

    fn drain_expired(&mut self, t: u64, w: u64) {
        let (n, sum) = self.expired(t, w);
        self.entries.drain(..n);
        self.total = self.total.saturating_sub(sum);
    }

    fn push(&mut self, t: u64, cost: u64) {
        match self.entries.back_mut() {
            Some((time, c)) if *time == t => *c = c.saturating_add(cost),
            _ => self.entries.push_back((t, cost)),
        }
        self.total = self.total.saturating_add(cost);
    }
}

impl LimitState for SlidingLog {
    fn check(&mut self, policy: &Policy, now: u64, cost: u64) -> Decision {
        let w = policy.window_ns();
        let limit = policy.limit();
        let t = self.clamp(now);
        if cost > 0 {
            self.drain_expired(t, w);
        }
        let (skip, gone) = self.expired(t, w);
        let live = self.total.saturating_sub(gone);
        let allowed = live.checked_add(cost).is_some_and(|sum| sum <= limit);
        if allowed && cost > 0 {
            self.push(t, cost);
        }
        let after = if allowed { live + cost } else { live };
        let reset_at = if after > 0 {
            self.entries.back().map_or(0, |&(t, _)| t.saturating_add(w))
        } else {
            0
        };
        let retry_at = (!allowed && cost <= limit).then(|| {
            // Free the oldest entries until the request fits.
            let mut left = live;
            let mut at = t;
            for &(time, c) in self.entries.range(skip..) {
                if left.checked_add(cost).is_some_and(|sum| sum <= limit) {
                    break;
                }
                left = left.saturating_sub(c);
                at = saturate(u128::from(time) + u128::from(w));
            }
            at
        });
        Decision::at(
            policy,
            now,
            allowed,
            limit.saturating_sub(after),
            reset_at,
            retry_at,
            (live, 0, 1),
        )
    }

    fn record(&mut self, policy: &Policy, now: u64, cost: u64) {
        let t = self.clamp(now);
        self.drain_expired(t, policy.window_ns());
        if cost > 0 {
            self.push(t, cost);
        }
    }

    fn expires_at(&self, policy: &Policy) -> u64 {
        // An entry at `t` counts while `t > now − W`: until `t + W`.
        self.entries
            .back()
            .map_or(0, |&(t, _)| t.saturating_add(policy.window_ns()))
    }

    fn estimate(&self, policy: &Policy, now: u64) -> f64 {
        let (_, gone) = self.expired(self.clamp(now), policy.window_ns());
        self.total.saturating_sub(gone) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Algorithm;
    use core::time::Duration;

    fn log(limit: u64, w: u64) -> (Policy, SlidingLog) {
        (
            Policy::new(limit, Duration::from_nanos(w), Algorithm::SlidingLog).unwrap(),
            SlidingLog::new(),
        )
    }

    /// Seed 002's rules, budget 2 and W = 10.
    #[test]
    fn seed_002_rules() {
        let (p, mut s) = log(2, 10);
        let d = s.check(&p, 1, 1);
        assert!(d.allowed());
        assert_eq!(d.remaining(), 1, "Remaining = budget − log length after the request");
        assert!(s.check(&p, 4, 1).allowed());
        let d = s.check(&p, 7, 1);
        assert!(!d.allowed());
        assert_eq!(d.remaining(), 0);
        // Retry-After = oldest + W − now = 1 + 10 − 7.
        assert_eq!(d.retry_after(), Some(Duration::from_nanos(4)));
        assert_eq!(s.len(), 2, "refused requests are not logged");
        assert!(!s.check(&p, 10, 1).allowed());
        // The request at exactly oldest + W is admitted.
        let d = s.check(&p, 11, 1);
        assert!(d.allowed());
        assert_eq!(d.remaining(), 0);
        // Reset: the newest entry (11) leaves at 21.
        assert_eq!(d.reset_after(), Duration::from_nanos(10));
        assert_eq!(s.check(&p, 13, 1).retry_after(), Some(Duration::from_nanos(1)));
    }

    #[test]
    fn retry_after_rounds_up_to_seconds() {
        let p = Policy::new(1, Duration::from_secs(60), Algorithm::SlidingLog).unwrap();
        let mut s = SlidingLog::new();
        assert!(s.check(&p, 0, 1).allowed());
        let d = s.check(&p, 59_700_000_000, 1);
        assert_eq!(d.retry_after(), Some(Duration::from_millis(300)));
        assert_eq!(d.retry_after_secs(), Some(1));
    }

    #[test]
    fn costs_free_several_entries() {
        let (p, mut s) = log(5, 10);
        assert!(s.check(&p, 0, 2).allowed());
        assert!(s.check(&p, 3, 2).allowed());
        assert!(s.check(&p, 6, 1).allowed());
        let d = s.check(&p, 8, 4); // needs entries at 0 and 3 gone: 3 + 10
        assert_eq!(d.retry_after(), Some(Duration::from_nanos(5)));
        assert!(!s.check(&p, 12, 4).allowed());
        assert!(s.check(&p, 13, 4).allowed());
        assert_eq!(s.check(&p, 13, 6).retry_after(), None);
    }

    #[test]
    fn late_requests_are_judged_at_the_newest_time() {
        let (p, mut s) = log(1, 10);
        assert!(s.check(&p, 100, 1).allowed());
        let d = s.check(&p, 50, 1);
        assert!(!d.allowed());
        assert_eq!(d.retry_after(), Some(Duration::from_nanos(60)));
        assert!(s.check(&p, 110, 1).allowed());
    }
}
