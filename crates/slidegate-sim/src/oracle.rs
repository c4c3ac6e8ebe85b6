//! The exact oracle: true counts over half-open windows `(t − W, t]`.

use std::collections::VecDeque;

/// An exact, growing log of events `(time_ns, cost)` that answers "what is
/// the sum of costs in the half-open window `(t − W, t]`?" exactly.
///
/// Events are expected in time order, and queries at non-decreasing times;
/// both cost amortised O(1) (a deque with a running sum: an event leaves the
/// deque once it can no longer be inside any later window). A late event
/// (older than the newest one recorded) is inserted in its place, in
/// O(events kept); a late event already outside the window of the latest
/// query is dropped, because no later query can see it. A query at an
/// earlier time than a previous one can miss events that were already
/// dropped; the simulations never ask for one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExactWindow {
    window_ns: u64,
    /// Events still possibly inside a later window, oldest first.
    events: VecDeque<(u64, u64)>,
    /// Sum of the costs in `events`, saturating.
    total: u64,
    /// The latest time queried or evicted at; events at or before
    /// `horizon − W` are gone.
    horizon: u64,
}

impl ExactWindow {
    /// An empty log for windows of `window_ns` nanoseconds.
    pub fn new(window_ns: u64) -> Self {
        ExactWindow {
            window_ns,
            ..Self::default()
        }
    }

    /// Events held: those that a later window may still hold.
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.events.len()
    }

    /// The window length in nanoseconds.
    pub fn window_ns(&self) -> u64 {
        self.window_ns
    }

    /// Logs `cost` units at `time_ns`.
    pub fn record(&mut self, time_ns: u64, cost: u64) {
        if self
            .horizon
            .checked_sub(self.window_ns)
            .is_some_and(|cutoff| time_ns <= cutoff)
        {
            // Outside every window a later query can ask about.
            return;
        }
        match self.events.back_mut() {
            Some((t, c)) if *t == time_ns => *c = c.saturating_add(cost),
            Some(&mut (t, _)) if t > time_ns => {
                let at = self.events.partition_point(|&(t, _)| t < time_ns);
                match self.events.get_mut(at) {
                    Some((t, c)) if *t == time_ns => *c = c.saturating_add(cost),
                    _ => self.events.insert(at, (time_ns, cost)),
                }
            }
            _ => self.events.push_back((time_ns, cost)),
        }
        self.total = self.total.saturating_add(cost);
    }

    /// The exact sum of costs logged in `(t − W, t]`.
    ///
    /// Events at or before `t − W` are dropped for good, so later queries
    /// should not go back in time (see the type's docs).
    pub fn count(&mut self, t: u64) -> u64 {
        self.evict(t);
        // Events after `t` (only when recording ran ahead of the query) are
        // in the deque but not in the window.
        let ahead: u64 = self
            .events
            .iter()
            .rev()
            .take_while(|&&(time, _)| time > t)
            .map(|&(_, c)| c)
            .sum();
        self.total.saturating_sub(ahead)
    }

    /// Drops the events at or before `t − W`.
    fn evict(&mut self, t: u64) {
        if t <= self.horizon {
            return;
        }
        self.horizon = t;
        let Some(cutoff) = t.checked_sub(self.window_ns) else {
            return;
        };
        while let Some(&(time, cost)) = self.events.front() {
            if time > cutoff {
                break;
            }
            self.events.pop_front();
            self.total = self.total.saturating_sub(cost);
        }
    }
}

/// The largest sum of costs in any half-open window `(t − W, t]` of length
/// `window_ns`, over events `(time_ns, cost)`.
///
/// The busiest window ends at some event's time, so two pointers over the
/// events sorted by time find it in O(n). Sorted input is used as it is;
/// unsorted input is sorted in a copy first. Sums saturate at `u64::MAX`.
pub fn max_window_sum(events: &[(u64, u64)], window_ns: u64) -> u64 {
    if events.is_sorted_by_key(|&(t, _)| t) {
        max_sorted(events, window_ns)
    } else {
        let mut sorted = events.to_vec();
        sorted.sort_by_key(|&(t, _)| t);
        max_sorted(&sorted, window_ns)
    }
}

fn max_sorted(events: &[(u64, u64)], window_ns: u64) -> u64 {
    // The sum is kept in u128 so that removing from a saturated sum stays
    // exact; n events of at most u64::MAX cannot overflow it.
    let mut sum: u128 = 0;
    let mut best: u128 = 0;
    let mut left = 0;
    for &(t, cost) in events {
        sum += u128::from(cost);
        if let Some(cutoff) = t.checked_sub(window_ns) {
            while let Some(&(old, c)) = events.get(left) {
                if old > cutoff {
                    break;
                }
                sum -= u128::from(c);
                left += 1;
            }
        }
        best = best.max(sum);
    }
    u64::try_from(best).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The definition, recounted from scratch.
    fn naive_count(events: &[(u64, u64)], t: u64, w: u64) -> u64 {
        events
            .iter()
            .filter(|&&(time, _)| time <= t && t.checked_sub(w).is_none_or(|c| time > c))
            .map(|&(_, c)| c)
            .sum()
    }

    /// Every window end from 0 to past the last event, recounted.
    fn naive_max(events: &[(u64, u64)], w: u64) -> u64 {
        let end = events.iter().map(|&(t, _)| t).max().unwrap_or(0) + w + 1;
        (0..=end).map(|t| naive_count(events, t, w)).max().unwrap_or(0)
    }

    fn sorted_events() -> impl Strategy<Value = Vec<(u64, u64)>> {
        prop::collection::vec((0u64..60, 0u64..5), 0..40).prop_map(|mut v| {
            v.sort_by_key(|&(t, _)| t);
            v
        })
    }

    proptest! {
        #[test]
        fn count_matches_naive(events in sorted_events(), w in 1u64..20) {
            let mut oracle = ExactWindow::new(w);
            for (i, &(t, c)) in events.iter().enumerate() {
                prop_assert_eq!(oracle.count(t), naive_count(&events[..i], t, w));
                oracle.record(t, c);
                prop_assert_eq!(oracle.count(t), naive_count(&events[..=i], t, w));
            }
            let end = events.last().map_or(0, |&(t, _)| t);
            for t in end..end + w + 2 {
                prop_assert_eq!(oracle.count(t), naive_count(&events, t, w));
            }
        }

        #[test]
        fn max_matches_naive(events in sorted_events(), w in 1u64..20) {
            prop_assert_eq!(max_window_sum(&events, w), naive_max(&events, w));
        }

        #[test]
        fn unsorted_input_is_sorted_first(mut events in sorted_events(), w in 1u64..20) {
            let expect = naive_max(&events, w);
            events.reverse();
            prop_assert_eq!(max_window_sum(&events, w), expect);
        }

        /// Late events still inside the window are counted; the oracle
        /// agrees with the definition over everything it was given.
        #[test]
        fn late_events_inside_the_window(events in prop::collection::vec((0u64..60, 0u64..5), 0..40), w in 1u64..20) {
            let mut oracle = ExactWindow::new(w);
            let mut kept = Vec::new();
            let mut latest = 0u64;
            for &(t, c) in &events {
                oracle.record(t, c);
                if latest.checked_sub(w).is_none_or(|cutoff| t > cutoff) {
                    kept.push((t, c));
                }
                latest = latest.max(t);
                prop_assert_eq!(oracle.count(latest), naive_count(&kept, latest, w));
            }
        }
    }

    #[test]
    fn half_open_window() {
        let mut oracle = ExactWindow::new(10);
        oracle.record(0, 1);
        oracle.record(5, 2);
        assert_eq!(oracle.count(9), 3);
        assert_eq!(oracle.count(10), 2, "an event exactly W ago is outside");
        assert_eq!(oracle.count(15), 0);
        assert_eq!(max_window_sum(&[(0, 1), (5, 2), (10, 4)], 10), 6);
        assert_eq!(max_window_sum(&[(0, 1), (5, 2), (9, 4)], 10), 7);
        assert_eq!(max_window_sum(&[], 10), 0);
        assert_eq!(max_window_sum(&[(0, u64::MAX), (1, u64::MAX)], 10), u64::MAX);
    }
}
