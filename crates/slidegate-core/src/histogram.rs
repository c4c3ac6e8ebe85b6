//! `exponential_histogram`: DGIM over time, generalised to costs.

use crate::decision::{saturate, saturating_sum};
use crate::{Decision, LimitState, Policy};
use alloc::collections::VecDeque;

/// One bucket: `size` units that arrived between `first` and `last`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Bucket {
    first: u64,
    last: u64,
    size: u64,
}

/// `exponential_histogram`: the exponential histogram of Datar, Gionis,
/// Indyk and Motwani (2002) over time, whose estimate of the window's count
/// has a relative error of at most ε.
///
/// Admitted units are kept in buckets (`first`, `last`, `size`), newest
/// last. Buckets whose `last` left the window are dropped. The estimate is
/// exact unless the oldest live bucket straddles the window's start; then it
/// counts half of that bucket. Two adjacent buckets `X` (newer) and `Y` are
/// merged only when `X + Y ≤ 2ε·S`, where `S` is the sum of the buckets
/// newer than `X`. The sum newer than a bucket never shrinks while the
/// bucket lives, so a straddling bucket `F` with newer sum `S` always has
/// `F ≤ 2ε·S`, and the error `≤ F/2 ≤ ε·S ≤ ε·truth`. This is DGIM's
/// invariant with powers of two replaced by the sums themselves, which also
/// admits costs above 1 in one step.
///
/// Sizes grow geometrically (by `1 + 2ε` every two buckets), so a window
/// holding `N` units needs `O((1/ε)·log N)` buckets of `O(log N)` bits:
/// `O((1/ε)·log² N)` bits, DGIM's optimal bound. Merging runs in batches
/// when the bucket count doubles, so a check is amortised O(1).
///
/// A request is admitted when `estimate + cost ≤ limit`; `retry_after` is
/// exact for the estimate (it changes only when a bucket's `first` or `last`
/// leaves the window). A late request is judged and counted at the newest
/// time seen.
///
/// # Memory
///
/// 48 bytes inline plus 24 bytes per bucket.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExponentialHistogram {
    buckets: VecDeque<Bucket>,
    /// Sum of all bucket sizes.
    total: u64,
    /// Bucket count after the last merge pass.
    merged_len: usize,
}

/// The histogram as seen at one instant.
struct View {
    /// The time the request is judged at.
    t: u64,
    /// Leading buckets wholly outside the window.
    skip: usize,
    /// Sum of the live buckets.
    live: u64,
    /// Twice the estimate.
    est2: u128,
}

impl ExponentialHistogram {
    /// An empty histogram.
    pub fn new() -> Self {
        Self::default()
    }

    /// Bytes on the heap: the buckets' capacity.
    pub fn heap_bytes(&self) -> usize {
        self.buckets.capacity() * core::mem::size_of::<Bucket>()
    }

    /// The sum of the bucket sizes, expired or not: the histogram never
    /// counts more at any later instant.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Number of buckets held.
    pub fn buckets(&self) -> usize {
        self.buckets.len()
    }

    fn view(&self, now: u64, w: u64) -> View {
        let t = self.buckets.back().map_or(now, |b| b.last.max(now));
        let (skip, gone, straddling) = match t.checked_sub(w) {
            None => (0, 0, 0),
            Some(cutoff) => {
                let skip = self.buckets.partition_point(|b| b.last <= cutoff);
                let gone = saturating_sum(self.buckets.range(..skip).map(|b| b.size));
                let straddling = self
                    .buckets
                    .get(skip)
                    .filter(|b| b.first <= cutoff)
                    .map_or(0, |b| b.size);
                (skip, gone, straddling)
            }
        };
        let live = self.total.saturating_sub(gone);
        View {
            t,
            skip,
            live,
            est2: 2 * u128::from(live) - u128::from(straddling),
        }
    }

    fn push(&mut self, t: u64, cost: u64, epsilon_ppm: u64) {
        match self.buckets.back_mut() {
            Some(b) if b.first == t && b.last == t => b.size = b.size.saturating_add(cost),
            _ => self.buckets.push_back(Bucket {
                first: t,
                last: t,
                size: cost,
            }),
        }
        self.total = self.total.saturating_add(cost);
        if self.buckets.len() >= 2 * self.merged_len.max(8) {
            self.merge(epsilon_ppm);
        }
    }

    /// One pass from the newest bucket to the oldest, merging each pair
    /// `X + Y ≤ 2ε·S` (in integers: `(X + Y)·10⁶ ≤ 2·ε_ppm·S`).
    fn merge(&mut self, epsilon_ppm: u64) {
        let s = self.buckets.make_contiguous();
        let Some(mut i) = s.len().checked_sub(1) else { return };
        let mut cur = s[i];
        let mut write = s.len();
        let mut newer: u128 = 0;
        while i > 0 {
            let older = s[i - 1];
            let pair = u128::from(cur.size) + u128::from(older.size);
            if pair * 1_000_000 <= 2 * u128::from(epsilon_ppm) * newer {
                cur = Bucket {
                    first: older.first,
                    last: cur.last,
                    size: cur.size.saturating_add(older.size),
                };
            } else {
                write -= 1;
                s[write] = cur;
                newer += u128::from(cur.size);
                cur = older;
            }
            i -= 1;
        }
        write -= 1;
        s[write] = cur;
        self.buckets.drain(..write);
        self.merged_len = self.buckets.len();
    }

    fn drop_expired(&mut self, skip: usize) {
        let gone = saturating_sum(self.buckets.drain(..skip).map(|b| b.size));
        self.total = self.total.saturating_sub(gone);
    }
}

impl LimitState for ExponentialHistogram {
    fn check(&mut self, policy: &Policy, now: u64, cost: u64) -> Decision {
        let w = policy.window_ns();
        let limit = policy.limit();
        let mut v = self.view(now, w);
        if cost > 0 {
            self.drop_expired(v.skip);
            v.skip = 0;
        }
        let cap2 = 2 * u128::from(limit);
        let allowed = cost <= limit && v.est2 + 2 * u128::from(cost) <= cap2;
        let after2 = if allowed && cost > 0 {
            self.push(v.t, cost, policy.epsilon_ppm());
            // The push may merge the straddling bucket with a newer one,
            // which then counts half of more: the estimate after the
            // request is read from the new state, so that `remaining` is
            // what the next request at this instant finds.
            self.view(v.t, w).est2
        } else {
            v.est2
        };
        let remaining = saturate(cap2.saturating_sub(after2) / 2);
        let reset_at = match self.buckets.back() {
            Some(b) if after2 > 0 => b.last.saturating_add(w),
            _ => 0,
        };
        let retry_at = (!allowed && cost <= limit).then(|| {
            let fits = |est2: u128| est2 + 2 * u128::from(cost) <= cap2;
            let straddles = |b: &Bucket| v.t.checked_sub(w).is_some_and(|cutoff| b.first <= cutoff);
            let mut rest = v.live;
            for b in self.buckets.range(v.skip..) {
                let newer = rest.saturating_sub(b.size);
                // When `first` leaves, the bucket counts half; when `last`
                // leaves, nothing.
                if !straddles(b) && b.first < b.last && fits(2 * u128::from(newer) + u128::from(b.size)) {
                    return b.first.saturating_add(w);
                }
                if fits(2 * u128::from(newer)) {
                    return b.last.saturating_add(w);
                }
                rest = newer;
            }
            v.t
        });
        Decision::at(
            policy,
            now,
            allowed,
            remaining,
            reset_at,
            retry_at,
            (saturate(v.est2 / 2), (v.est2 % 2) as u64, 2),
        )
    }

    fn record(&mut self, policy: &Policy, now: u64, cost: u64) {
        let v = self.view(now, policy.window_ns());
        self.drop_expired(v.skip);
        if cost > 0 {
            self.push(v.t, cost, policy.epsilon_ppm());
        }
    }

    fn expires_at(&self, policy: &Policy) -> u64 {
        // A bucket counts while its `last` is inside the window.
        self.buckets
            .back()
            .map_or(0, |b| b.last.saturating_add(policy.window_ns()))
    }

    fn estimate(&self, policy: &Policy, now: u64) -> f64 {
        self.view(now, policy.window_ns()).est2 as f64 / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Algorithm;
    use core::time::Duration;

    #[test]
    fn exact_until_buckets_merge_then_within_epsilon() {
        let p = Policy::new(
            1_000_000,
            Duration::from_nanos(1_000),
            Algorithm::ExponentialHistogram { epsilon: 0.1 },
        )
        .unwrap();
        let mut h = ExponentialHistogram::new();
        for t in 0..1_000 {
            h.record(&p, t, 1);
        }
        assert!(h.buckets() < 200, "merged: {} buckets", h.buckets());
        // At t = 1500 the window (500, 1500] holds the 499 events 501..=999.
        let est = h.estimate(&p, 1_500);
        assert!((est - 499.0).abs() <= 0.1 * 499.0, "estimate {est}");
        assert_eq!(h.estimate(&p, 1_999), 0.0);
    }

    #[test]
    fn limits_and_retries() {
        let p = Policy::new(
            3,
            Duration::from_nanos(10),
            Algorithm::ExponentialHistogram { epsilon: 0.5 },
        )
        .unwrap();
        let mut h = ExponentialHistogram::new();
        assert!(h.check(&p, 0, 2).allowed());
        assert!(h.check(&p, 5, 1).allowed());
        let d = h.check(&p, 6, 2);
        assert!(!d.allowed());
        assert_eq!(d.estimate(), 3.0);
        assert_eq!(d.retry_after(), Some(Duration::from_nanos(4)));
        assert!(h.check(&p, 10, 2).allowed());
        assert_eq!(h.check(&p, 10, 4).retry_after(), None);
    }
}
