//! The guarantees of each algorithm, checked against the oracles: the
//! shared suite on the core's `State` directly, and the properties of the
//! core's own measurement API (`record`, `estimate`, a ring's parts).

use proptest::prelude::*;
use slidegate_conformance::oracle::{ExactLog, SeedCounter};
use slidegate_conformance::strategy::{
    CASES, Family, any_policy, config, extreme_policy_in, extreme_steps, requests, ring, steps, times, weighting,
};
use slidegate_core::{Algorithm, LimitState, Limiter, ManualClock, Policy, SlidingWindow, State, Weighting};
use std::time::Duration;

slidegate_conformance::suite! {
    subject: State::new,
    cases: CASES,
    family: any,
    order: any,
}

proptest! {
    #![proptest_config(config(CASES))]

    /// Interpolated sliding_window, measurement view (everything is
    /// counted): the estimate is the seed's formula, and is within the
    /// oldest bucket's count of the true count of the window.
    #[test]
    fn interpolated_estimate_within_oldest_bucket(
        limit in 1u64..12, buckets in 2u32..10, bucket_ns in 1u64..20, extra in 0u64..5,
        reqs in requests(15, 6), start in 0u64..1_000,
    ) {
        let policy = ring(limit, buckets, bucket_ns, extra, Weighting::Interpolated);
        let b = policy.step_ns();
        let n = u64::from(buckets);
        let w = policy.effective_window_ns();
        let mut state = State::new(&policy);
        let mut all = ExactLog::default();
        let mut seed = SeedCounter::new(buckets as usize, b);
        for (t, cost) in times(&reqs, start) {
            let est = state.estimate(&policy, t);
            prop_assert!((est - seed.estimate(t)).abs() < 1e-9, "seed says {}, we say {est}", seed.estimate(t));
            let truth = all.count(t, w) as f64;
            let bucket = i128::from(t / b);
            let oldest = all.between((bucket - i128::from(n) + 1) * i128::from(b), (bucket - i128::from(n) + 2) * i128::from(b));
            prop_assert!((est - truth).abs() <= oldest as f64 + 1e-9, "estimate {est}, truth {truth}, oldest {oldest}");
            state.record(&policy, t, cost);
            seed.add(t, cost);
            all.push(t, cost);
        }
    }

    /// exponential_histogram's estimate has a relative error of at most ε.
    #[test]
    fn exponential_histogram_within_epsilon(
        epsilon in 0.01f64..0.6, window in 1u64..400, reqs in requests(10, 5), queries in prop::collection::vec(0u64..600, 1..20),
    ) {
        let policy = Policy::new(1_000, Duration::from_nanos(window), Algorithm::ExponentialHistogram { epsilon }).unwrap();
        let mut state = State::new(&policy);
        let mut all = ExactLog::default();
        let check = |state: &State, all: &ExactLog, t: u64| -> Result<(), TestCaseError> {
            let est = state.estimate(&policy, t);
            let truth = all.count(t, window) as f64;
            prop_assert!((est - truth).abs() <= epsilon * truth + 1e-9, "estimate {}, truth {}, at {}", est, truth, t);
            Ok(())
        };
        let mut last = 0;
        for (t, cost) in times(&reqs, 0) {
            check(&state, &all, t)?;
            state.record(&policy, t, cost);
            all.push(t, cost);
            last = t;
        }
        for q in queries {
            check(&state, &all, last + q)?;
        }
    }

    /// A ring rebuilt from its parts (the newest bucket and the slots, as a
    /// keyed store keeps it) decides exactly as the ring it came from.
    #[test]
    fn ring_rebuilt_from_parts_decides_alike(
        buckets in 2u32..10, limit in 1u64..12, bucket_ns in 1u64..20, weighting in weighting(),
        reqs in requests(15, 5), monotone in any::<bool>(),
    ) {
        let policy = ring(limit, buckets, bucket_ns, 0, weighting);
        let mut whole = SlidingWindow::<u32>::new(&policy);
        let (mut newest, mut slots) = (0u64, vec![0u32; buckets as usize]);
        let mut t = 0;
        for (x, cost) in reqs {
            t = if monotone { t + x } else { x };
            let mut rebuilt = SlidingWindow::<u32, &mut [u32]>::from_parts(newest, &mut slots[..]).unwrap();
            let (a, b) = (whole.check(&policy, t, cost), rebuilt.check(&policy, t, cost));
            prop_assert_eq!(a, b);
            prop_assert_eq!(whole.expires_at(&policy), rebuilt.expires_at(&policy));
            newest = rebuilt.newest();
        }
    }

    /// `from_parts_in` (the policy's divisor) rebuilds the same ring as
    /// `from_parts` (a division), whatever the newest bucket and with as
    /// many slots as the policy's buckets or another count.
    #[test]
    fn ring_rebuilt_in_a_policy_is_the_same_ring(
        buckets in 2u32..10, slot_count in 2usize..10, same_count in any::<bool>(), newest in any::<u64>(),
        counts in prop::collection::vec(0u32..4, 10),
    ) {
        let policy = ring(5, buckets, 7, 0, Weighting::Interpolated);
        let len = if same_count { buckets as usize } else { slot_count };
        let (mut a, mut b) = (counts[..len].to_vec(), counts[..len].to_vec());
        let plain = SlidingWindow::<u32, &mut [u32]>::from_parts(newest, &mut a[..]).unwrap();
        let in_policy = SlidingWindow::<u32, &mut [u32]>::from_parts_in(&policy, newest, &mut b[..]).unwrap();
        prop_assert_eq!(plain, in_policy);
    }

    /// `SlidingWindow::admit_parts` decides as a ring rebuilt from the same
    /// parts does with `admit`, and leaves the same parts; with as many
    /// slots as the policy's buckets or another count.
    #[test]
    fn ring_admitted_from_parts_decides_alike(
        buckets in 2u32..10, slot_count in 2usize..10, same_count in any::<bool>(), limit in 1u64..12,
        bucket_ns in 1u64..20, weighting in weighting(), reqs in requests(15, 5), monotone in any::<bool>(),
    ) {
        let policy = ring(limit, buckets, bucket_ns, 0, weighting);
        let len = if same_count { buckets as usize } else { slot_count };
        let (mut newest, mut slots) = (0u64, vec![0u32; len]);
        let (mut newest_parts, mut slots_parts) = (0u64, vec![0u32; len]);
        let mut t = 0;
        for (x, cost) in reqs {
            t = if monotone { t + x } else { x };
            let mut rebuilt = SlidingWindow::<u32, &mut [u32]>::from_parts(newest, &mut slots[..]).unwrap();
            let expected = rebuilt.admit(&policy, t, cost);
            newest = rebuilt.newest();
            let got = SlidingWindow::<u32, &mut [u32]>::admit_parts(&policy, &mut newest_parts, &mut slots_parts[..], t, cost);
            prop_assert_eq!(got, Some(expected));
            prop_assert_eq!((newest_parts, &slots_parts), (newest, &slots));
        }
        prop_assert_eq!(SlidingWindow::<u32, &mut [u32]>::admit_parts(&policy, &mut newest, &mut [0u32][..], t, 1), None);
    }

    /// Counting whatever the limit says never panics either: any limit,
    /// window, time and cost, up to `u64::MAX`.
    #[test]
    fn recording_never_panics(policy in extreme_policy_in(&Family::Any), steps in extreme_steps()) {
        let mut state = State::new(&policy);
        for (t, cost) in steps {
            let d = state.check(&policy, t, cost);
            prop_assert!(!d.allowed() || cost <= policy.limit());
            let _ = state.estimate(&policy, t);
            state.record(&policy, t, cost);
            let _ = state.expires_at(&policy);
        }
    }

    /// The same on small policies, whose limits, buckets and windows the
    /// requests reach: many requests in one bucket (the hot path of
    /// `admit`, admitted and refused), bucket and window crossings, and
    /// times going back.
    #[test]
    fn limiter_admit_is_check_without_headers_at_the_limit(
        policy in any_policy(), reqs in requests(15, 6), back in steps(), start in 0u64..1_000,
    ) {
        admits_as_it_checks(policy, times(&reqs, start).into_iter().chain(back))?;
    }

    /// `Limiter::admit` decides as `Limiter::check` does and leaves the
    /// same state: two limiters on one clock, one asked for headers and
    /// one for yes or no, any policy, time (backwards too) and cost.
    #[test]
    fn limiter_admit_is_check_without_headers(policy in extreme_policy_in(&Family::Any), steps in extreme_steps()) {
        admits_as_it_checks(policy, steps)?;
    }
}

/// Two limiters of `policy` on one clock, one asked for headers and one for
/// yes or no, at each `(time, cost)` of `steps`: the same answer and the
/// same state after every request.
fn admits_as_it_checks(policy: Policy, steps: impl IntoIterator<Item = (u64, u64)>) -> Result<(), TestCaseError> {
    let clock = ManualClock::new(0);
    let mut checked = Limiter::new(policy, &clock);
    let mut admitted = Limiter::new(policy, &clock);
    for (t, cost) in steps {
        clock.set(t);
        prop_assert_eq!(
            admitted.admit(cost),
            checked.check(cost).allowed(),
            "at {} cost {}",
            t,
            cost
        );
        prop_assert_eq!(admitted.state(), checked.state());
    }
    Ok(())
}
