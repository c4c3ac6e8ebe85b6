//! The scripts decide exactly as the core: the same figures for the same
//! requests at the same times (in microseconds).

mod common;

use common::{Backend, RedisCluster, RedisServer};
use proptest::prelude::*;
use proptest::test_runner::TestRunner;
use slidegate_conformance::Figures;
use slidegate_conformance::strategy::{Family, any_policy, config, policy_in, requests, steps, times, weighting};
use slidegate_core::{Algorithm, LimitState, ManualClock, Policy, State, Weighting};
use slidegate_redis::{RedisClock, microsecond_policy};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Cases per property: a round trip per request makes each case slow-ish.
const CASES: u32 = 32;

/// A policy drawn with a window of `w` "ns" read as `w` µs: the drawn
/// policy is the one the script runs.
fn in_micros(drawn: &Policy) -> Policy {
    Policy::new(
        drawn.limit(),
        Duration::from_micros(drawn.window_ns()),
        drawn.algorithm(),
    )
    .unwrap()
}

/// Runs `reqs` (absolute times in µs) against a fresh key of a Redis
/// store (one limit) on a manual clock and against the core, comparing every figure.
async fn compare<S: Backend>(server: &S, key: &str, drawn: &Policy, reqs: &[(u64, u64)]) -> Result<(), TestCaseError> {
    let policy = in_micros(drawn);
    let micro = microsecond_policy(&policy).unwrap();
    prop_assert_eq!(&micro, drawn);
    // The core on the policy itself, in ns, decides alike when its step is
    // a whole number of microseconds.
    let whole_us = policy.step_ns() == micro.step_ns() * 1000;
    let interpolated = matches!(
        policy.algorithm(),
        Algorithm::SlidingWindow {
            weighting: Weighting::Interpolated,
            ..
        }
    );
    let clock = ManualClock::new(0);
    let limiter = server.limiter(policy, RedisClock::client(clock.clone())).await;
    let (mut core_us, mut core_ns) = (State::new(&micro), State::new(&policy));
    for &(t, cost) in reqs {
        clock.set(t * 1000);
        let got = Figures::of(&limiter.check(key, cost).await.unwrap());
        let want = Figures::of(&core_us.check(&micro, t, cost)).scaled(1000);
        prop_assert_eq!(got, want, "{} at {} µs, cost {}", policy, t, cost);
        let mut want_ns = Figures::of(&core_ns.check(&policy, t * 1000, cost));
        if interpolated {
            // The oldest bucket decays by the microsecond, not by the ns: the
            // retry rounds up to the next microsecond.
            want_ns.retry_after = want_ns
                .retry_after
                .map(|d| Duration::from_micros(d.as_nanos().div_ceil(1000) as u64));
        }
        if whole_us {
            prop_assert_eq!(got, want_ns, "{} at {} µs, cost {} (ns core)", policy, t, cost);
        }
    }
    Ok(())
}

/// Runs [`CASES`] property cases of `policies × requests` against one
/// server.
fn run(policies: BoxedStrategy<Policy>, reqs: BoxedStrategy<Vec<(u64, u64)>>) {
    run_on(&RedisServer::start(), CASES, policies, reqs);
}

/// Runs `cases` property cases of `policies × requests` against `server`.
fn run_on<S: Backend>(server: &S, cases: u32, policies: BoxedStrategy<Policy>, reqs: BoxedStrategy<Vec<(u64, u64)>>) {
    // Fresh keys across the runs that share a cluster.
    static KEYS: AtomicU64 = AtomicU64::new(0);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut runner = TestRunner::new(config(cases));
    runner
        .run(&(policies, reqs), |(policy, reqs)| {
            let key = format!("case{}", KEYS.fetch_add(1, Ordering::Relaxed));
            rt.block_on(compare(server, &key, &policy, &reqs))
        })
        .unwrap();
}

/// Requests in time order, `(gap, cost)` turned into absolute µs, at most 50.
fn in_order() -> BoxedStrategy<Vec<(u64, u64)>> {
    requests(40, 14)
        .prop_map(|mut r| {
            r.truncate(50);
            times(&r, 1_000)
        })
        .boxed()
}

/// Requests at any time, going backwards too.
fn any_order() -> BoxedStrategy<Vec<(u64, u64)>> {
    steps()
        .prop_map(|mut r| {
            r.truncate(50);
            r
        })
        .boxed()
}

fn sliding_log() -> BoxedStrategy<Policy> {
    any_policy()
        .prop_filter("sliding_log", |p| p.algorithm() == Algorithm::SlidingLog)
        .boxed()
}

#[test]
fn fixed_window_decides_like_the_core() {
    run(policy_in(&Family::FixedWindow), in_order());
}

#[test]
fn gcra_decides_like_the_core() {
    run(policy_in(&Family::Gcra), in_order());
}

#[test]
fn sliding_log_decides_like_the_core() {
    run(sliding_log(), in_order());
}

/// `gcra` and `sliding_log` need no rule of their own for a time going
/// backwards: they decide as the core does.
#[test]
fn gcra_and_sliding_log_decide_like_the_core_when_time_goes_back() {
    run(
        prop_oneof![policy_in(&Family::Gcra), sliding_log()].boxed(),
        any_order(),
    );
}

/// Figures near the top of the supported ranges: times like the server's
/// (µs since the epoch), windows up to 2⁴⁰ µs, limits and costs up to 2⁴⁰.
fn large_policy() -> BoxedStrategy<Policy> {
    let algorithm = prop_oneof![
        Just(Algorithm::FixedWindow),
        Just(Algorithm::SlidingLog),
        (1u64..=1 << 9).prop_map(|burst| Algorithm::Gcra { burst }),
    ];
    (1u64..=1 << 40, 1u64..=1 << 40, algorithm)
        .prop_filter_map("in range", |(limit, window_us, algorithm)| {
            let policy = Policy::new(limit, Duration::from_nanos(window_us), algorithm).ok()?;
            microsecond_policy(&in_micros(&policy)).ok()
        })
        .boxed()
}

fn large_requests() -> BoxedStrategy<Vec<(u64, u64)>> {
    let cost = prop_oneof![Just(1u64), 0u64..=1 << 40, Just(u64::MAX)];
    prop::collection::vec((0u64..=1 << 41, cost), 1..30)
        .prop_map(|r| times(&r, 1_780_000_000_000_000))
        .boxed()
}

#[test]
fn large_figures_decide_like_the_core() {
    run(large_policy(), large_requests());
}

/// Small rings of `buckets` buckets, either weighting: windows below 200 µs
/// (so that n − 1 often does not divide them), limits below 12.
fn ring_of(buckets: &'static [u32], weighting: impl Strategy<Value = Weighting> + 'static) -> BoxedStrategy<Policy> {
    (1u64..12, 1u64..200, prop::sample::select(buckets), weighting)
        .prop_filter_map("valid", |(limit, window, buckets, weighting)| {
            Policy::new(
                limit,
                Duration::from_nanos(window),
                Algorithm::SlidingWindow { buckets, weighting },
            )
            .ok()
        })
        .boxed()
}

/// The bucket counts the properties draw from.
const BUCKETS: &[u32] = &[2, 3, 8, 17];

#[test]
fn sliding_window_interpolated_decides_like_the_core() {
    run(ring_of(BUCKETS, Just(Weighting::Interpolated)), in_order());
}

#[test]
fn sliding_window_conservative_decides_like_the_core() {
    run(ring_of(BUCKETS, Just(Weighting::Conservative)), in_order());
}

/// A late request is judged at the start of the newest bucket and counted
/// in its own bucket while that is in the ring, refused otherwise: as the
/// core.
#[test]
fn sliding_window_decides_like_the_core_when_time_goes_back() {
    run(ring_of(BUCKETS, weighting()), any_order());
}

/// Larger rings (up to 64 buckets, and the largest the script takes).
#[test]
fn large_rings_decide_like_the_core() {
    run(ring_of(&[31, 64, 256], weighting()), any_order());
}

/// Rings near the top of the supported ranges: epoch-sized times, limit·b
/// up to 2⁵⁰, costs up to the limit and beyond.
fn large_ring() -> BoxedStrategy<Policy> {
    let buckets = prop_oneof![Just(2u32), Just(3), Just(8), Just(17), 2u32..=64];
    let log_uniform = || (0u32..=40).prop_flat_map(|bits| 1u64..=1 << bits);
    (log_uniform(), log_uniform(), buckets, weighting())
        .prop_filter_map("in range", |(limit, window_us, buckets, weighting)| {
            let algorithm = Algorithm::SlidingWindow { buckets, weighting };
            let policy = Policy::new(limit, Duration::from_nanos(window_us), algorithm).ok()?;
            microsecond_policy(&in_micros(&policy)).ok()
        })
        .boxed()
}

/// Requests from an epoch-sized time, gaps up to a few buckets, costs of
/// every size, and some going back.
fn large_ring_requests() -> BoxedStrategy<Vec<(u64, u64)>> {
    let cost = prop_oneof![Just(1u64), 0u64..=1 << 40, Just(u64::MAX)];
    prop::collection::vec((0u64..=1 << 41, cost, any::<bool>()), 1..30)
        .prop_map(|r| {
            let mut t = 1_780_000_000_000_000u64;
            r.into_iter()
                .map(|(gap, cost, back)| {
                    t = if back { t - gap.min(1 << 38) } else { t + gap };
                    (t, cost)
                })
                .collect()
        })
        .boxed()
}

#[test]
fn large_rings_near_the_ranges_decide_like_the_core() {
    run(large_ring(), large_ring_requests());
}

/// Requests as `(time in µs, cost)`.
type Requests = Vec<(u64, u64)>;

/// Every property above on a three-master cluster, fewer cases each: the
/// keys (`case0`, `case1`, ...) spread over the three masters' slots.
#[test]
fn every_property_decides_like_the_core_on_a_cluster() {
    const CLUSTER_CASES: u32 = 8;
    let cluster = RedisCluster::start();
    let properties: [(BoxedStrategy<Policy>, BoxedStrategy<Requests>); 10] = [
        (policy_in(&Family::FixedWindow), in_order()),
        (policy_in(&Family::Gcra), in_order()),
        (sliding_log(), in_order()),
        (
            prop_oneof![policy_in(&Family::Gcra), sliding_log()].boxed(),
            any_order(),
        ),
        (large_policy(), large_requests()),
        (ring_of(BUCKETS, Just(Weighting::Interpolated)), in_order()),
        (ring_of(BUCKETS, Just(Weighting::Conservative)), in_order()),
        (ring_of(BUCKETS, weighting()), any_order()),
        (ring_of(&[31, 64, 256], weighting()), any_order()),
        (large_ring(), large_ring_requests()),
    ];
    for (policies, reqs) in properties {
        run_on(&cluster, CLUSTER_CASES, policies, reqs);
    }
}
