//! The properties every subject must have, written once.
//!
//! Each property is a function of a subject factory (`Fn(&Policy) -> S`)
//! and the generated inputs, returning a [`TestCaseError`] on failure. The
//! [`suite!`](crate::suite!) macro instantiates them as proptests in the
//! calling module (so that failures are persisted beside the calling file);
//! a crate can also call them from its own `proptest!` blocks.

use crate::oracle::{ExactLog, SeedCounter, TextbookGcra};
use crate::strategy::{Family, ring, times};
use crate::subject::Subject;
use proptest::prelude::*;
use slidegate_core::{Algorithm, Decision, LimitState, Policy, State, Weighting};
use std::time::Duration;

/// What a property returns.
pub type TestResult = Result<(), TestCaseError>;

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Checks that `d`, the decision for `cost` at `now` that left `subject`
/// as it is, tells the exact truth about `remaining`, `reset_after` and
/// `retry_after`: it asks forks of the subject what-if questions.
///
/// # Errors
///
/// A failure naming the header that lied.
pub fn assert_headers_true<S: Subject>(
    policy: &Policy,
    subject: &mut S,
    now: u64,
    cost: u64,
    d: &Decision,
) -> TestResult {
    if d.remaining() > 0 {
        prop_assert!(
            subject.fork().check(policy, now, d.remaining()).allowed(),
            "remaining {} must pass at {now}",
            d.remaining()
        );
    }
    if let Some(more) = d.remaining().checked_add(1) {
        prop_assert!(
            !subject.fork().check(policy, now, more).allowed(),
            "remaining + 1 = {more} must be refused at {now}"
        );
    }
    // All counted usage has expired at now + reset_after, and not 1 ns
    // earlier.
    let reset = ns(d.reset_after());
    let at = now.saturating_add(reset);
    prop_assert_eq!(
        subject.estimate(policy, at),
        0.0,
        "usage left at now + reset_after = {}",
        at
    );
    if reset > 0 {
        prop_assert!(subject.estimate(policy, at - 1) > 0.0, "no usage left at {}", at - 1);
    }
    if d.allowed() {
        prop_assert_eq!(d.retry_after(), None);
        return Ok(());
    }
    match d.retry_after() {
        Some(wait) => {
            let at = now.saturating_add(ns(wait));
            prop_assert!(
                subject.fork().check(policy, at, cost).allowed(),
                "cost {cost} must pass at now + retry_after = {at}"
            );
            prop_assert!(
                !subject.fork().check(policy, at - 1, cost).allowed(),
                "cost {cost} must still be refused at {}",
                at - 1
            );
        }
        None => {
            let capacity = match policy.algorithm() {
                Algorithm::Gcra { burst } => burst.min(policy.limit()),
                _ => policy.limit(),
            };
            prop_assert!(
                cost > capacity,
                "only a cost above {capacity} may never pass, got {cost}"
            );
        }
    }
    Ok(())
}

/// sliding_log decides exactly like the exact log, and its headers are
/// exactly true.
///
/// # Errors
///
/// The first check that failed.
pub fn sliding_log_is_exact<S: Subject>(
    new: impl Fn(&Policy) -> S,
    limit: u64,
    window: u64,
    reqs: &[(u64, u64)],
) -> TestResult {
    let policy = Policy::new(limit, Duration::from_nanos(window), Algorithm::SlidingLog).unwrap();
    let mut subject = new(&policy);
    let mut admitted = ExactLog::default();
    for (t, cost) in times(reqs, 0) {
        let used = admitted.count(t, window);
        let d = subject.check(&policy, t, cost);
        prop_assert_eq!(d.allowed(), cost <= limit && used + cost <= limit);
        prop_assert_eq!(d.estimate(), used as f64);
        if d.allowed() && cost > 0 {
            admitted.push(t, cost);
        }
        prop_assert_eq!(d.remaining(), limit - admitted.count(t, window));
        let newest = admitted
            .events
            .iter()
            .map(|&(s, _)| s)
            .filter(|&s| s + window > t)
            .max();
        prop_assert_eq!(
            d.reset_after(),
            Duration::from_nanos(newest.map_or(0, |s| s + window - t))
        );
        assert_headers_true(&policy, &mut subject, t, cost, &d)?;
    }
    prop_assert!(admitted.max_in_any_window(window) <= limit);
    Ok(())
}

/// Conservative sliding_window never admits more than the limit in any
/// window of its length; its headers are exactly true.
///
/// # Errors
///
/// The first check that failed.
pub fn conservative_never_over_admits<S: Subject>(
    new: impl Fn(&Policy) -> S,
    (limit, buckets, bucket_ns, extra): (u64, u32, u64, u64),
    reqs: &[(u64, u64)],
) -> TestResult {
    let policy = ring(limit, buckets, bucket_ns, extra, Weighting::Conservative);
    let mut subject = new(&policy);
    let mut admitted = ExactLog::default();
    for (t, cost) in times(reqs, 0) {
        let d = subject.check(&policy, t, cost);
        if d.allowed() && cost > 0 {
            admitted.push(t, cost);
        }
        assert_headers_true(&policy, &mut subject, t, cost, &d)?;
    }
    prop_assert!(admitted.max_in_any_window(policy.effective_window_ns()) <= limit);
    prop_assert!(admitted.max_in_any_window(policy.window_ns()) <= limit);
    Ok(())
}

/// Interpolated sliding_window as a limiter: before each request the
/// estimate is the seed's formula over what was admitted, within the
/// oldest bucket's count of the true count of the window, and the one the
/// decision was based on; the headers are exactly true.
///
/// # Errors
///
/// The first check that failed.
pub fn interpolated_admission_within_oldest_bucket<S: Subject>(
    new: impl Fn(&Policy) -> S,
    (limit, buckets, bucket_ns, extra): (u64, u32, u64, u64),
    reqs: &[(u64, u64)],
    start: u64,
) -> TestResult {
    let policy = ring(limit, buckets, bucket_ns, extra, Weighting::Interpolated);
    let b = policy.step_ns();
    let n = i128::from(buckets);
    let w = policy.effective_window_ns();
    let mut subject = new(&policy);
    let mut admitted = ExactLog::default();
    let mut seed = SeedCounter::new(buckets as usize, b);
    for (t, cost) in times(reqs, start) {
        let est = subject.estimate(&policy, t);
        let expect = seed.estimate(t);
        prop_assert!((est - expect).abs() < 1e-9, "seed says {expect}, we say {est} at {t}");
        let truth = admitted.count(t, w) as f64;
        let bucket = i128::from(t / b);
        let b = i128::from(b);
        let oldest = admitted.between((bucket - n + 1) * b, (bucket - n + 2) * b);
        prop_assert!(
            (est - truth).abs() <= oldest as f64 + 1e-9,
            "estimate {est}, truth {truth}, oldest {oldest}"
        );
        let d = subject.check(&policy, t, cost);
        prop_assert!(
            (d.estimate() - est).abs() < 1e-9,
            "decided on {}, estimated {est}",
            d.estimate()
        );
        if d.allowed() && cost > 0 {
            seed.add(t, cost);
            admitted.push(t, cost);
        }
        assert_headers_true(&policy, &mut subject, t, cost, &d)?;
    }
    Ok(())
}

/// The seed's limiter (`allow`, cost 1) and the subject agree, except
/// where the seed's floating point sits on the boundary.
///
/// # Errors
///
/// The first disagreement.
pub fn sliding_window_decides_like_the_seed<S: Subject>(
    new: impl Fn(&Policy) -> S,
    (limit, buckets, bucket_ns): (u64, u32, u64),
    reqs: &[(u64, u64)],
) -> TestResult {
    let policy = ring(limit, buckets, bucket_ns, 0, Weighting::Interpolated);
    let mut subject = new(&policy);
    let mut seed = SeedCounter::new(buckets as usize, bucket_ns);
    for (t, _) in times(reqs, 0) {
        let est = seed.estimate(t);
        let d = subject.check(&policy, t, 1);
        if (est + 1.0 - limit as f64).abs() > 1e-9 {
            prop_assert_eq!(
                d.allowed(),
                est + 1.0 <= limit as f64,
                "at {} the seed's estimate is {}",
                t,
                est
            );
        }
        if d.allowed() {
            seed.add(t, 1);
        }
    }
    Ok(())
}

/// fixed_window is exact per fixed window; its headers are exactly true.
///
/// # Errors
///
/// The first check that failed.
pub fn fixed_window_is_exact_per_window<S: Subject>(
    new: impl Fn(&Policy) -> S,
    limit: u64,
    window: u64,
    reqs: &[(u64, u64)],
) -> TestResult {
    let policy = Policy::new(limit, Duration::from_nanos(window), Algorithm::FixedWindow).unwrap();
    let mut subject = new(&policy);
    let mut admitted = ExactLog::default();
    for (t, cost) in times(reqs, 0) {
        let k = i128::from(t / window) * i128::from(window);
        let used = admitted.between(k, k + i128::from(window));
        let d = subject.check(&policy, t, cost);
        prop_assert_eq!(d.allowed(), cost <= limit && used + cost <= limit);
        if d.allowed() && cost > 0 {
            admitted.push(t, cost);
        }
        assert_headers_true(&policy, &mut subject, t, cost, &d)?;
    }
    prop_assert!(admitted.max_in_any_fixed_window(window) <= limit);
    Ok(())
}

/// gcra decides exactly like the textbook virtual-scheduling GCRA; its
/// headers are exactly true.
///
/// # Errors
///
/// The first disagreement.
pub fn gcra_matches_textbook<S: Subject>(
    new: impl Fn(&Policy) -> S,
    (limit, window, burst): (u64, u64, u64),
    reqs: &[(u64, u64)],
    start: u64,
) -> TestResult {
    let policy = Policy::new(limit, Duration::from_nanos(window), Algorithm::Gcra { burst }).unwrap();
    let interval = window.div_ceil(limit);
    let mut textbook = TextbookGcra {
        tat: 0,
        interval: u128::from(interval),
        tau: u128::from((burst - 1) * interval),
    };
    let mut subject = new(&policy);
    for (t, cost) in times(reqs, start) {
        let d = subject.check(&policy, t, cost);
        // A cost above the limit is refused whatever the burst.
        let textbook_allows = cost <= limit && textbook.request(t, cost);
        prop_assert_eq!(d.allowed(), textbook_allows, "at {} cost {}", t, cost);
        assert_headers_true(&policy, &mut subject, t, cost, &d)?;
    }
    Ok(())
}

/// exponential_histogram as a limiter: its headers are exactly true.
///
/// # Errors
///
/// The first check that failed.
pub fn exponential_histogram_headers<S: Subject>(
    new: impl Fn(&Policy) -> S,
    (limit, epsilon, window): (u64, f64, u64),
    reqs: &[(u64, u64)],
) -> TestResult {
    let algorithm = Algorithm::ExponentialHistogram { epsilon };
    let policy = Policy::new(limit, Duration::from_nanos(window), algorithm).unwrap();
    let mut subject = new(&policy);
    for (t, cost) in times(reqs, 0) {
        let d = subject.check(&policy, t, cost);
        assert_headers_true(&policy, &mut subject, t, cost, &d)?;
    }
    Ok(())
}

/// Time going backwards: the headers stay true, a zero cost never changes
/// the state, nothing over the limit passes, and nothing panics.
///
/// # Errors
///
/// The first check that failed.
pub fn time_going_backwards<S: Subject>(
    new: impl Fn(&Policy) -> S,
    policy: &Policy,
    steps: &[(u64, u64)],
) -> TestResult {
    let mut subject = new(policy);
    for &(t, cost) in steps {
        let before = subject.snapshot();
        let d = subject.check(policy, t, cost);
        if cost == 0 {
            prop_assert_eq!(&subject.snapshot(), &before);
        }
        prop_assert!(!d.allowed() || cost <= policy.limit());
        assert_headers_true(policy, &mut subject, t, cost, &d)?;
    }
    Ok(())
}

/// `admit` decides and counts exactly as `check` does, in time order or
/// in any order (`monotone` false).
///
/// # Errors
///
/// The first disagreement.
pub fn admit_is_check_without_headers<S: Subject>(
    new: impl Fn(&Policy) -> S,
    policy: &Policy,
    steps: &[(u64, u64)],
    monotone: bool,
) -> TestResult {
    let mut checked = new(policy);
    let mut admitted = new(policy);
    let mut t = 0;
    for &(x, cost) in steps {
        t = if monotone { t + x / 8 } else { x };
        let d = checked.check(policy, t, cost);
        prop_assert_eq!(admitted.admit(policy, t, cost), d.allowed(), "at {} cost {}", t, cost);
        prop_assert_eq!(admitted.snapshot(), checked.snapshot());
    }
    Ok(())
}

/// Once a state's `expires_at` has passed, the subject decides like a
/// fresh one (for requests in time order from then on): a store may drop
/// the key. The expiry is the core state's, fed the same requests.
///
/// # Errors
///
/// The first disagreement.
pub fn expired_states_decide_like_fresh_ones<S: Subject>(
    new: impl Fn(&Policy) -> S,
    policy: &Policy,
    before: &[(u64, u64)],
    after: &[(u64, u64)],
    wait: u64,
) -> TestResult {
    let mut subject = new(policy);
    let mut core = State::new(policy);
    let mut t = 0;
    for (at, cost) in times(before, 0) {
        let d = subject.check(policy, at, cost);
        prop_assert_eq!(d.allowed(), LimitState::check(&mut core, policy, at, cost).allowed());
        t = at;
    }
    let expiry = core.expires_at(policy);
    prop_assert!(core.is_idle(policy, expiry));
    let mut fresh = new(policy);
    for (at, cost) in times(after, expiry.max(t) + wait) {
        let (old, new) = (subject.check(policy, at, cost), fresh.check(policy, at, cost));
        prop_assert_eq!(old.allowed(), new.allowed(), "at {} cost {}", at, cost);
        prop_assert_eq!(old.remaining(), new.remaining());
        prop_assert_eq!(old.retry_after(), new.retry_after());
    }
    Ok(())
}

/// No input panics: any limit, window, time and cost, up to `u64::MAX`;
/// nothing above the limit is admitted.
///
/// # Errors
///
/// The first check that failed.
pub fn no_input_panics<S: Subject>(new: impl Fn(&Policy) -> S, policy: &Policy, steps: &[(u64, u64)]) -> TestResult {
    let mut subject = new(policy);
    for &(t, cost) in steps {
        let d = subject.check(policy, t, cost);
        prop_assert_eq!(d.limit(), policy.limit());
        prop_assert!(!d.allowed() || cost <= policy.limit());
        let _ = subject.estimate(policy, t);
        let allowed = subject.admit(policy, t, cost);
        prop_assert!(!allowed || cost <= policy.limit());
    }
    Ok(())
}

/// Every decision of the subject is the core state's decision, header for
/// header: for subjects that are not the core state (a store must decide
/// exactly as the state it keeps).
///
/// The reference keeps the core state as a store keeps a key's: a new key
/// is kept only once its state counts something (`expires_at > now`), so
/// a peek or a refusal leaves nothing; a kept key is never dropped (no
/// other key is inserted to sweep it). The two differ only for requests
/// late by more than the window, which a state would refuse and a fresh
/// one admits.
///
/// # Errors
///
/// The first disagreement.
pub fn decides_like_the_core<S: Subject>(
    new: impl Fn(&Policy) -> S,
    policy: &Policy,
    steps: &[(u64, u64)],
    monotone: bool,
) -> TestResult {
    let mut subject = new(policy);
    let mut kept: Option<State> = None;
    let mut t = 0;
    for (i, &(x, cost)) in steps.iter().enumerate() {
        t = if monotone { t + x / 8 } else { x };
        let is_new = kept.is_none();
        let core = kept.get_or_insert_with(|| State::new(policy));
        if i % 3 == 2 {
            let allowed = subject.admit(policy, t, cost);
            let expect = LimitState::admit(core, policy, t, cost);
            prop_assert_eq!(allowed, expect, "admit at {} cost {}", t, cost);
        } else {
            let (a, b) = (subject.check(policy, t, cost), LimitState::check(core, policy, t, cost));
            prop_assert_eq!(a.allowed(), b.allowed(), "at {} cost {}", t, cost);
            prop_assert_eq!(a.limit(), b.limit());
            prop_assert_eq!(a.remaining(), b.remaining(), "remaining at {} cost {}", t, cost);
            prop_assert_eq!(a.reset_after(), b.reset_after(), "reset_after at {} cost {}", t, cost);
            prop_assert_eq!(a.retry_after(), b.retry_after(), "retry_after at {} cost {}", t, cost);
            prop_assert_eq!(a.estimate(), b.estimate(), "estimate at {} cost {}", t, cost);
        }
        if is_new && core.expires_at(policy) <= t {
            kept = None;
        }
    }
    Ok(())
}

/// The adversary of `reference/accuracy-and-limits.md`: `L` requests at
/// the very end of a bucket, then as fast as admitted once it is the
/// oldest. Interpolated lets `2L − 1` into one window for every `n`;
/// conservative never more than `L`. Run for each bucket count of 2, 3, 5,
/// 11 and 61 that `family` has.
///
/// # Panics
///
/// When the adversary gets another count through.
pub fn adversary_gets_twice_the_limit_only_from_interpolated<S: Subject>(new: impl Fn(&Policy) -> S, family: &Family) {
    let mut tried = 0;
    for buckets in [2u32, 3, 5, 11, 61] {
        for (weighting, expect) in [(Weighting::Interpolated, 199), (Weighting::Conservative, 100)] {
            let policy = ring(100, buckets, 1_000_000, 0, weighting);
            if !family.has(&policy) {
                continue;
            }
            tried += 1;
            let b = policy.step_ns();
            let mut subject = new(&policy);
            let mut admitted = ExactLog::default();
            let burst_at = b - 1;
            for _ in 0..100 {
                assert!(subject.check(&policy, burst_at, 1).allowed());
                admitted.push(burst_at, 1);
            }
            let from = (u64::from(buckets) - 1) * b;
            for t in (from..from + b).step_by(100) {
                if subject.check(&policy, t, 1).allowed() {
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
    assert!(tried > 0, "{family:?} has none of the adversary's policies");
}

/// Instantiates the conformance suite in the calling module: one `#[test]`
/// per property, each a proptest of `cases` cases (unless
/// `PROPTEST_CASES` says otherwise) over subjects built by `subject`, a
/// `Fn(&Policy) -> S` where `S:` [`Subject`]. Failures are persisted in
/// the `proptest-regressions` directory beside the calling file's crate
/// root, as `proptest!` does.
///
/// `family` says which policies the subject serves, and so which
/// properties apply: `any`, `sliding_window(buckets: 2..9, max_limit:
/// 65_535)`, `fixed_window` or `gcra`. `order` is `any`, or `in_order` for
/// a subject that may forget an expired key (a store crowded with other
/// keys), which decides like the core state only for requests in time
/// order.
///
/// ```ignore
/// slidegate_conformance::suite! {
///     subject: slidegate_core::State::new,
///     cases: slidegate_conformance::strategy::CASES,
///     family: any,
///     order: any,
/// }
/// ```
#[macro_export]
macro_rules! suite {
    (
        subject: $new:expr,
        cases: $cases:expr,
        family: $family:ident $(($($args:tt)*))?,
        order: $order:ident $(,)?
    ) => {
        $crate::suite!(@groups $family $(($($args)*))?; $new, $cases, $order);
    };

    (@groups any; $new:expr, $cases:expr, $order:ident) => {
        $crate::suite!(@sliding_log $new, $cases);
        $crate::suite!(@sliding_window $new, $cases, 2u32..10, $crate::strategy::Family::Any);
        $crate::suite!(@fixed_window $new, $cases);
        $crate::suite!(@gcra $new, $cases);
        $crate::suite!(@exponential_histogram $new, $cases);
        $crate::suite!(@any_policy $new, $cases, $crate::strategy::Family::Any, $order);
    };
    (@groups sliding_window(buckets: $buckets:expr, max_limit: $max:expr $(,)?); $new:expr, $cases:expr, $order:ident) => {
        $crate::suite!(@sliding_window $new, $cases, $buckets, $crate::suite!(@family sliding_window(buckets: $buckets, max_limit: $max)));
        $crate::suite!(@any_policy $new, $cases, $crate::suite!(@family sliding_window(buckets: $buckets, max_limit: $max)), $order);
    };
    (@groups fixed_window; $new:expr, $cases:expr, $order:ident) => {
        $crate::suite!(@fixed_window $new, $cases);
        $crate::suite!(@any_policy $new, $cases, $crate::strategy::Family::FixedWindow, $order);
    };
    (@groups gcra; $new:expr, $cases:expr, $order:ident) => {
        $crate::suite!(@gcra $new, $cases);
        $crate::suite!(@any_policy $new, $cases, $crate::strategy::Family::Gcra, $order);
    };

    (@family any) => { $crate::strategy::Family::Any };
    (@family sliding_window(buckets: $buckets:expr, max_limit: $max:expr $(,)?)) => {
        $crate::strategy::Family::SlidingWindow { buckets: $buckets, max_limit: $max }
    };
    (@family fixed_window) => { $crate::strategy::Family::FixedWindow };
    (@family gcra) => { $crate::strategy::Family::Gcra };

    (@sliding_log $new:expr, $cases:expr) => {
        $crate::__proptest::proptest! {
            #![proptest_config($crate::strategy::config($cases))]

            /// sliding_log decides exactly like the exact log.
            #[test]
            fn sliding_log_is_exact(limit in 1u64..10, window in 1u64..100, reqs in $crate::strategy::requests(30, 12)) {
                $crate::suite::sliding_log_is_exact($new, limit, window, &reqs)?;
            }
        }
    };
    (@sliding_window $new:expr, $cases:expr, $buckets:expr, $family:expr) => {
        /// The bucket counts drawn.
        fn suite_buckets() -> ::core::ops::Range<u32> {
            $buckets
        }

        $crate::__proptest::proptest! {
            #![proptest_config($crate::strategy::config($cases))]

            /// Conservative sliding_window never over-admits.
            #[test]
            fn conservative_never_over_admits(
                limit in 1u64..12, buckets in suite_buckets(), bucket_ns in 1u64..20, extra in 0u64..5,
                reqs in $crate::strategy::requests(15, 6),
            ) {
                $crate::suite::conservative_never_over_admits($new, (limit, buckets, bucket_ns, extra), &reqs)?;
            }

            /// Interpolated sliding_window estimates within the oldest bucket.
            #[test]
            fn interpolated_admission_within_oldest_bucket(
                limit in 1u64..12, buckets in suite_buckets(), bucket_ns in 1u64..20, extra in 0u64..5,
                reqs in $crate::strategy::requests(15, 6), start in 0u64..1_000,
            ) {
                $crate::suite::interpolated_admission_within_oldest_bucket(
                    $new, (limit, buckets, bucket_ns, extra), &reqs, start,
                )?;
            }

            /// sliding_window decides like the seed's limiter.
            #[test]
            fn sliding_window_decides_like_the_seed(
                limit in 1u64..12, buckets in suite_buckets(), bucket_ns in 1u64..20,
                reqs in $crate::strategy::requests(15, 1),
            ) {
                $crate::suite::sliding_window_decides_like_the_seed($new, (limit, buckets, bucket_ns), &reqs)?;
            }
        }

        /// The adversary gets `2L − 1` only from interpolated.
        #[test]
        fn adversary_gets_twice_the_limit_only_from_interpolated() {
            $crate::suite::adversary_gets_twice_the_limit_only_from_interpolated($new, &$family);
        }
    };
    (@fixed_window $new:expr, $cases:expr) => {
        $crate::__proptest::proptest! {
            #![proptest_config($crate::strategy::config($cases))]

            /// fixed_window is exact per fixed window.
            #[test]
            fn fixed_window_is_exact_per_window(
                limit in 1u64..10, window in 1u64..50, reqs in $crate::strategy::requests(20, 12),
            ) {
                $crate::suite::fixed_window_is_exact_per_window($new, limit, window, &reqs)?;
            }
        }
    };
    (@gcra $new:expr, $cases:expr) => {
        $crate::__proptest::proptest! {
            #![proptest_config($crate::strategy::config($cases))]

            /// gcra decides like the textbook GCRA.
            #[test]
            fn gcra_matches_textbook(
                limit in 1u64..20, window in 1u64..200, burst in 1u64..20,
                reqs in $crate::strategy::requests(20, 8), start in 0u64..100,
            ) {
                $crate::suite::gcra_matches_textbook($new, (limit, window, burst), &reqs, start)?;
            }
        }
    };
    (@exponential_histogram $new:expr, $cases:expr) => {
        $crate::__proptest::proptest! {
            #![proptest_config($crate::strategy::config($cases))]

            /// exponential_histogram's headers are exactly true.
            #[test]
            fn exponential_histogram_headers(
                limit in 1u64..30, epsilon in 0.01f64..0.6, window in 1u64..100,
                reqs in $crate::strategy::requests(10, 8),
            ) {
                $crate::suite::exponential_histogram_headers($new, (limit, epsilon, window), &reqs)?;
            }
        }
    };
    (@any_policy $new:expr, $cases:expr, $family:expr, any) => {
        $crate::__proptest::proptest! {
            #![proptest_config($crate::strategy::config($cases))]

            /// Time going backwards keeps the headers true.
            #[test]
            fn time_going_backwards(policy in $crate::strategy::policy_in(&$family), steps in $crate::strategy::steps()) {
                $crate::suite::time_going_backwards($new, &policy, &steps)?;
            }

            /// `admit` is `check` without the headers.
            #[test]
            fn admit_is_check_without_headers(
                policy in $crate::strategy::policy_in(&$family),
                steps in $crate::strategy::steps(),
                monotone in $crate::__proptest::prelude::any::<bool>(),
            ) {
                $crate::suite::admit_is_check_without_headers($new, &policy, &steps, monotone)?;
            }
        }
        $crate::suite!(@any_order $new, $cases, $family);
    };
    (@any_policy $new:expr, $cases:expr, $family:expr, in_order) => {
        $crate::__proptest::proptest! {
            #![proptest_config($crate::strategy::config($cases))]

            /// `admit` is `check` without the headers, in time order.
            #[test]
            fn admit_is_check_without_headers(
                policy in $crate::strategy::policy_in(&$family),
                steps in $crate::strategy::steps(),
            ) {
                $crate::suite::admit_is_check_without_headers($new, &policy, &steps, true)?;
            }
        }
        $crate::suite!(@any_order $new, $cases, $family);
    };
    (@any_order $new:expr, $cases:expr, $family:expr) => {
        $crate::__proptest::proptest! {
            #![proptest_config($crate::strategy::config($cases))]

            /// Expired states decide like fresh ones.
            #[test]
            fn expired_states_decide_like_fresh_ones(
                policy in $crate::strategy::policy_in(&$family),
                before in $crate::strategy::requests(30, 6),
                after in $crate::strategy::requests(30, 6),
                wait in 0u64..50,
            ) {
                $crate::suite::expired_states_decide_like_fresh_ones($new, &policy, &before, &after, wait)?;
            }

            /// No input panics.
            #[test]
            fn no_input_panics(
                policy in $crate::strategy::extreme_policy_in(&$family),
                steps in $crate::strategy::extreme_steps(),
            ) {
                $crate::suite::no_input_panics($new, &policy, &steps)?;
            }
        }
    };
}

/// Instantiates [`decides_like_the_core`] in the calling module, as
/// [`suite!`](crate::suite!) does the suite (same arguments): for
/// subjects other than the core state itself.
#[macro_export]
macro_rules! decides_like_the_core {
    (
        subject: $new:expr,
        cases: $cases:expr,
        family: $family:ident $(($($args:tt)*))?,
        order: $order:ident $(,)?
    ) => {
        $crate::__proptest::proptest! {
            #![proptest_config($crate::strategy::config($cases))]

            /// Every decision is the core state's, header for header.
            #[test]
            fn decides_like_the_core(
                policy in $crate::strategy::policy_in(&$crate::suite!(@family $family $(($($args)*))?)),
                steps in $crate::strategy::steps(),
                monotone in $crate::decides_like_the_core!(@order $order),
            ) {
                $crate::suite::decides_like_the_core($new, &policy, &steps, monotone)?;
            }
        }
    };
    (@order any) => { $crate::__proptest::prelude::any::<bool>() };
    (@order in_order) => { $crate::__proptest::prelude::Just(true) };
}
