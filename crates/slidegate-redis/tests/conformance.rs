//! The scripts decide exactly as the core: the same figures for the same
//! requests at the same times (in microseconds).

mod common;

use common::RedisServer;
use proptest::prelude::*;
use proptest::test_runner::TestRunner;
use slidegate_conformance::Figures;
use slidegate_conformance::strategy::{Family, any_policy, config, policy_in, requests, steps, times};
use slidegate_core::{Algorithm, LimitState, ManualClock, Policy, State};
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
/// limiter on a manual clock and against the core, comparing every figure.
async fn compare(server: &RedisServer, key: &str, drawn: &Policy, reqs: &[(u64, u64)]) -> Result<(), TestCaseError> {
    let policy = in_micros(drawn);
    let micro = microsecond_policy(&policy).unwrap();
    prop_assert_eq!(&micro, drawn);
    // The core on the policy itself, in ns, decides alike when its step is
    // a whole number of microseconds.
    let whole_us = policy.step_ns() == micro.step_ns() * 1000;
    let clock = ManualClock::new(0);
    let limiter = server.limiter(policy, RedisClock::client(clock.clone())).await;
    let (mut core_us, mut core_ns) = (State::new(&micro), State::new(&policy));
    for &(t, cost) in reqs {
        clock.set(t * 1000);
        let got = Figures::of(&limiter.check(key, cost).await.unwrap());
        let want = Figures::of(&core_us.check(&micro, t, cost)).scaled(1000);
        prop_assert_eq!(got, want, "{} at {} µs, cost {}", policy, t, cost);
        let want_ns = Figures::of(&core_ns.check(&policy, t * 1000, cost));
        if whole_us {
            prop_assert_eq!(got, want_ns, "{} at {} µs, cost {} (ns core)", policy, t, cost);
        }
    }
    Ok(())
}

/// Runs `cases` property cases of `policies × requests` against one server.
fn run(policies: BoxedStrategy<Policy>, reqs: BoxedStrategy<Vec<(u64, u64)>>) {
    let server = RedisServer::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let keys = AtomicU64::new(0);
    let mut runner = TestRunner::new(config(CASES));
    runner
        .run(&(policies, reqs), |(policy, reqs)| {
            let key = format!("case{}", keys.fetch_add(1, Ordering::Relaxed));
            rt.block_on(compare(&server, &key, &policy, &reqs))
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
