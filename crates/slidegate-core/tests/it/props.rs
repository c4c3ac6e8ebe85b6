//! The guarantees of each algorithm, checked against the oracles.

use crate::oracle::{ExactLog, SeedCounter, TextbookGcra};
use proptest::prelude::*;
use slidegate_core::{Algorithm, Decision, LimitState, Policy, SlidingWindow, State, Weighting};
use std::time::Duration;

const CASES: u32 = 2_000;

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(CASES);
    ProptestConfig {
        cases,
        ..ProptestConfig::default()
    }
}

/// Requests as `(gap since the previous one, cost)`; times never go back.
fn requests(max_gap: u64, max_cost: u64) -> impl Strategy<Value = Vec<(u64, u64)>> {
    let cost = prop_oneof![3 => Just(1u64), 2 => 0..=max_cost];
    let gap = prop_oneof![3 => 0..=max_gap, 1 => Just(0u64), 1 => 0..=max_gap * 8];
    prop::collection::vec((gap, cost), 1..120)
}

fn times(reqs: &[(u64, u64)], start: u64) -> Vec<(u64, u64)> {
    let mut t = start;
    reqs.iter()
        .map(|&(gap, cost)| {
            t += gap;
            (t, cost)
        })
        .collect()
}

fn ring(limit: u64, buckets: u32, bucket_ns: u64, extra_ns: u64, weighting: Weighting) -> Policy {
    // A window that `n − 1` does not always divide: the bucket is rounded up.
    let window = (u64::from(buckets) - 1) * bucket_ns - extra_ns.min(bucket_ns - 1).min(u64::from(buckets) - 2);
    Policy::new(
        limit,
        Duration::from_nanos(window),
        Algorithm::SlidingWindow { buckets, weighting },
    )
    .unwrap()
}

fn any_policy() -> impl Strategy<Value = Policy> {
    let weighting = prop_oneof![Just(Weighting::Interpolated), Just(Weighting::Conservative)];
    let algorithm = prop_oneof![
        (2u32..12, weighting).prop_map(|(buckets, weighting)| Algorithm::SlidingWindow { buckets, weighting }),
        Just(Algorithm::FixedWindow),
        Just(Algorithm::SlidingLog),
        (1u64..12).prop_map(|burst| Algorithm::Gcra { burst }),
        (0.01f64..0.9).prop_map(|epsilon| Algorithm::ExponentialHistogram { epsilon }),
    ];
    (1u64..12, 1u64..200, algorithm).prop_filter_map("valid", |(limit, window, algorithm)| {
        let algorithm = match algorithm {
            Algorithm::Gcra { burst } => Algorithm::Gcra {
                burst: burst.min(limit),
            },
            other => other,
        };
        Policy::new(limit, Duration::from_nanos(window), algorithm).ok()
    })
}

/// Checks that `d`, the decision for `cost` at `now` that left `state`,
/// tells the exact truth about `remaining`, `reset_after` and `retry_after`.
fn assert_headers_true(policy: &Policy, state: &State, now: u64, cost: u64, d: &Decision) {
    let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap();
    if d.remaining() > 0 {
        let mut s = state.clone();
        assert!(
            s.check(policy, now, d.remaining()).allowed(),
            "remaining {} must pass at {now}",
            d.remaining()
        );
    }
    if let Some(more) = d.remaining().checked_add(1) {
        let mut s = state.clone();
        assert!(
            !s.check(policy, now, more).allowed(),
            "remaining + 1 = {more} must be refused at {now}"
        );
    }
    // All counted usage has expired at now + reset_after, and not 1 ns
    // earlier.
    let reset = ns(d.reset_after());
    assert_eq!(
        state.estimate(policy, now + reset),
        0.0,
        "usage left at now + reset_after = {}",
        now + reset
    );
    if reset > 0 {
        assert!(
            state.estimate(policy, now + reset - 1) > 0.0,
            "no usage left at {}",
            now + reset - 1
        );
    }
    if d.allowed() {
        assert_eq!(d.retry_after(), None);
        return;
    }
    match d.retry_after() {
        Some(wait) => {
            let at = now + ns(wait);
            let mut s = state.clone();
            assert!(
                s.check(policy, at, cost).allowed(),
                "cost {cost} must pass at now + retry_after = {at}"
            );
            let mut s = state.clone();
            assert!(
                !s.check(policy, at - 1, cost).allowed(),
                "cost {cost} must still be refused at {}",
                at - 1
            );
        }
        None => {
            let capacity = match policy.algorithm() {
                Algorithm::Gcra { burst } => burst.min(policy.limit()),
                _ => policy.limit(),
            };
            assert!(
                cost > capacity,
                "only a cost above {capacity} may never pass, got {cost}"
            );
        }
    }
}

proptest! {
    #![proptest_config(config())]

    /// sliding_log decides exactly like the exact log, and its headers are
    /// exactly true.
    #[test]
    fn sliding_log_is_exact(limit in 1u64..10, window in 1u64..100, reqs in requests(30, 12)) {
        let policy = Policy::new(limit, Duration::from_nanos(window), Algorithm::SlidingLog).unwrap();
        let mut state = State::new(&policy);
        let mut admitted = ExactLog::default();
        for (t, cost) in times(&reqs, 0) {
            let used = admitted.count(t, window);
            let d = state.check(&policy, t, cost);
            prop_assert_eq!(d.allowed(), cost <= limit && used + cost <= limit);
            prop_assert_eq!(d.estimate(), used as f64);
            if d.allowed() && cost > 0 {
                admitted.push(t, cost);
            }
            prop_assert_eq!(d.remaining(), limit - admitted.count(t, window));
            let newest = admitted.events.iter().map(|&(s, _)| s).filter(|&s| s + window > t).max();
            prop_assert_eq!(d.reset_after(), Duration::from_nanos(newest.map_or(0, |s| s + window - t)));
            assert_headers_true(&policy, &state, t, cost, &d);
        }
        prop_assert!(admitted.max_in_any_window(window) <= limit);
    }

    /// Conservative sliding_window never admits more than the limit in any
    /// window of its length.
    #[test]
    fn conservative_never_over_admits(
        limit in 1u64..12, buckets in 2u32..10, bucket_ns in 1u64..20, extra in 0u64..5,
        reqs in requests(15, 6),
    ) {
        let policy = ring(limit, buckets, bucket_ns, extra, Weighting::Conservative);
        let mut state = State::new(&policy);
        let mut admitted = ExactLog::default();
        for (t, cost) in times(&reqs, 0) {
            let d = state.check(&policy, t, cost);
            if d.allowed() && cost > 0 {
                admitted.push(t, cost);
            }
            assert_headers_true(&policy, &state, t, cost, &d);
        }
        prop_assert!(admitted.max_in_any_window(policy.effective_window_ns()) <= limit);
        prop_assert!(admitted.max_in_any_window(policy.window_ns()) <= limit);
    }

    /// Interpolated sliding_window: the estimate is the seed's formula, and is
    /// within the oldest bucket's count of the true count of the window; its
    /// headers are exactly true.
    #[test]
    fn interpolated_estimate_within_oldest_bucket(
        limit in 1u64..12, buckets in 2u32..10, bucket_ns in 1u64..20, extra in 0u64..5,
        reqs in requests(15, 6), start in 0u64..1_000,
    ) {
        let policy = ring(limit, buckets, bucket_ns, extra, Weighting::Interpolated);
        let b = policy.step_ns();
        let n = u64::from(buckets);
        let w = policy.effective_window_ns();
        // Measurement view: everything is counted.
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
        // Admission view: headers are true.
        let mut state = State::new(&policy);
        for (t, cost) in times(&reqs, start) {
            let d = state.check(&policy, t, cost);
            assert_headers_true(&policy, &state, t, cost, &d);
        }
    }

    /// The seed's limiter (`allow`, cost 1) and ours agree, except where the
    /// seed's floating point sits on the boundary.
    #[test]
    fn sliding_window_decides_like_the_seed(
        limit in 1u64..12, buckets in 2u32..10, bucket_ns in 1u64..20, reqs in requests(15, 1),
    ) {
        let policy = ring(limit, buckets, bucket_ns, 0, Weighting::Interpolated);
        let mut state = State::new(&policy);
        let mut seed = SeedCounter::new(buckets as usize, bucket_ns);
        for (t, _) in times(&reqs, 0) {
            let est = seed.estimate(t);
            let d = state.check(&policy, t, 1);
            if (est + 1.0 - limit as f64).abs() > 1e-9 {
                prop_assert_eq!(d.allowed(), est + 1.0 <= limit as f64, "at {} the seed's estimate is {}", t, est);
            }
            if d.allowed() {
                seed.add(t, 1);
            }
        }
    }

    /// fixed_window is exact per fixed window.
    #[test]
    fn fixed_window_is_exact_per_window(limit in 1u64..10, window in 1u64..50, reqs in requests(20, 12)) {
        let policy = Policy::new(limit, Duration::from_nanos(window), Algorithm::FixedWindow).unwrap();
        let mut state = State::new(&policy);
        let mut admitted = ExactLog::default();
        for (t, cost) in times(&reqs, 0) {
            let k = i128::from(t / window) * i128::from(window);
            let used = admitted.between(k, k + i128::from(window));
            let d = state.check(&policy, t, cost);
            prop_assert_eq!(d.allowed(), cost <= limit && used + cost <= limit);
            if d.allowed() && cost > 0 {
                admitted.push(t, cost);
            }
            assert_headers_true(&policy, &state, t, cost, &d);
        }
        prop_assert!(admitted.max_in_any_fixed_window(window) <= limit);
    }

    /// gcra decides exactly like the textbook virtual-scheduling GCRA.
    #[test]
    fn gcra_matches_textbook(
        limit in 1u64..20, window in 1u64..200, burst in 1u64..20, reqs in requests(20, 8), start in 0u64..100,
    ) {
        let policy = Policy::new(limit, Duration::from_nanos(window), Algorithm::Gcra { burst }).unwrap();
        let interval = window.div_ceil(limit);
        let mut textbook = TextbookGcra {
            tat: 0,
            interval: u128::from(interval),
            tau: u128::from((burst - 1) * interval),
        };
        let mut state = State::new(&policy);
        for (t, cost) in times(&reqs, start) {
            let d = state.check(&policy, t, cost);
            // A cost above the limit is refused whatever the burst.
            let textbook_allows = cost <= limit && textbook.request(t, cost);
            prop_assert_eq!(d.allowed(), textbook_allows, "at {} cost {}", t, cost);
            assert_headers_true(&policy, &state, t, cost, &d);
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

    /// exponential_histogram as a limiter: its headers are exactly true.
    #[test]
    fn exponential_histogram_headers(
        limit in 1u64..30, epsilon in 0.01f64..0.6, window in 1u64..100, reqs in requests(10, 8),
    ) {
        let policy = Policy::new(limit, Duration::from_nanos(window), Algorithm::ExponentialHistogram { epsilon }).unwrap();
        let mut state = State::new(&policy);
        for (t, cost) in times(&reqs, 0) {
            let d = state.check(&policy, t, cost);
            assert_headers_true(&policy, &state, t, cost, &d);
        }
    }

    /// Time going backwards: the headers stay true, a zero cost never
    /// changes the state, and nothing panics.
    #[test]
    fn time_going_backwards(policy in any_policy(), steps in prop::collection::vec((0u64..300, 0u64..14), 1..80)) {
        let mut state = State::new(&policy);
        for (t, cost) in steps {
            let before = state.clone();
            let d = state.check(&policy, t, cost);
            if cost == 0 {
                prop_assert_eq!(&state, &before);
            }
            prop_assert!(!d.allowed() || cost <= policy.limit());
            assert_headers_true(&policy, &state, t, cost, &d);
        }
    }

    /// `admit` decides and counts exactly as `check` does, for every
    /// algorithm and any order of time.
    #[test]
    fn admit_is_check_without_headers(
        policy in any_policy(),
        steps in prop::collection::vec((0u64..300, 0u64..14), 1..80),
        monotone in any::<bool>(),
    ) {
        let mut checked = State::new(&policy);
        let mut admitted = State::new(&policy);
        let mut t = 0;
        for (x, cost) in steps {
            t = if monotone { t + x / 8 } else { x };
            let d = checked.check(&policy, t, cost);
            prop_assert_eq!(admitted.admit(&policy, t, cost), d.allowed());
            prop_assert_eq!(&admitted, &checked);
        }
    }

    /// Once a state's `expires_at` has passed it decides like a fresh state
    /// (for requests in time order from then on): a store may drop it.
    #[test]
    fn expired_states_decide_like_fresh_ones(
        policy in any_policy(), before in requests(30, 6), after in requests(30, 6), wait in 0u64..50,
    ) {
        let mut state = State::new(&policy);
        let mut t = 0;
        for (at, cost) in times(&before, 0) {
            state.check(&policy, at, cost);
            t = at;
        }
        let expiry = state.expires_at(&policy);
        prop_assert_eq!(state.is_idle(&policy, expiry), true);
        let mut fresh = State::new(&policy);
        for (at, cost) in times(&after, expiry.max(t) + wait) {
            let (old, new) = (state.check(&policy, at, cost), fresh.check(&policy, at, cost));
            prop_assert_eq!(old.allowed(), new.allowed(), "at {} cost {}", at, cost);
            prop_assert_eq!(old.remaining(), new.remaining());
            prop_assert_eq!(old.retry_after(), new.retry_after());
        }
    }

    /// A ring rebuilt from its parts (the newest bucket and the slots, as a
    /// keyed store keeps it) decides exactly as the ring it came from.
    #[test]
    fn ring_rebuilt_from_parts_decides_alike(
        buckets in 2u32..10, limit in 1u64..12, bucket_ns in 1u64..20, weighting in prop_oneof![Just(Weighting::Interpolated), Just(Weighting::Conservative)],
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

    /// No input panics: any limit, window, time and cost, up to `u64::MAX`.
    #[test]
    fn no_input_panics(
        limit in prop_oneof![Just(u64::MAX), Just(u64::from(u32::MAX)), Just(u64::from(u32::MAX) + 1), 1u64..],
        window in prop_oneof![Just(1u64), Just(u64::MAX), 1u64..],
        algorithm in prop_oneof![
            (2u32..70).prop_map(|buckets| Algorithm::SlidingWindow { buckets, weighting: Weighting::Interpolated }),
            (2u32..70).prop_map(|buckets| Algorithm::SlidingWindow { buckets, weighting: Weighting::Conservative }),
            Just(Algorithm::FixedWindow),
            Just(Algorithm::SlidingLog),
            prop_oneof![Just(u64::MAX), 1u64..].prop_map(|burst| Algorithm::Gcra { burst }),
            (1e-6f64..1.0).prop_map(|epsilon| Algorithm::ExponentialHistogram { epsilon }),
        ],
        steps in prop::collection::vec(
            (prop_oneof![Just(0u64), Just(u64::MAX), any::<u64>()], prop_oneof![Just(0u64), Just(1u64), Just(u64::MAX), any::<u64>()]),
            1..40,
        ),
    ) {
        let policy = Policy::new(limit, Duration::from_nanos(window), algorithm).unwrap();
        let mut state = State::new(&policy);
        for (t, cost) in steps {
            let d = state.check(&policy, t, cost);
            prop_assert_eq!(d.limit(), limit);
            prop_assert!(!d.allowed() || cost <= limit);
            let _ = state.estimate(&policy, t);
            state.record(&policy, t, cost);
        }
    }
}

/// The adversary of `reference/accuracy-and-limits.md`: `L` requests at the
/// very end of a bucket, then as fast as admitted once it is the oldest.
/// Interpolated lets `2L − 1` into one window for every `n`; conservative
/// never more than `L`.
#[test]
fn adversary_gets_twice_the_limit_only_from_interpolated() {
    for buckets in [2u32, 3, 5, 11, 61] {
        for (weighting, expect) in [(Weighting::Interpolated, 199), (Weighting::Conservative, 100)] {
            let policy = ring(100, buckets, 1_000_000, 0, weighting);
            let b = policy.step_ns();
            let mut state = State::new(&policy);
            let mut admitted = ExactLog::default();
            let burst_at = b - 1;
            for _ in 0..100 {
                assert!(state.check(&policy, burst_at, 1).allowed());
                admitted.push(burst_at, 1);
            }
            let from = (u64::from(buckets) - 1) * b;
            for t in (from..from + b).step_by(100) {
                if state.check(&policy, t, 1).allowed() {
                    admitted.push(t, 1);
                }
            }
            assert_eq!(
                admitted.max_in_any_window(policy.effective_window_ns()),
                expect,
                "{buckets} {weighting}"
            );
        }
    }
}
