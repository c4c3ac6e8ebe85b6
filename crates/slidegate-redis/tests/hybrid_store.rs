//! The hybrid mode behind `slidegate_store::Store`: alone it decides as the
//! core on both window algorithms; a call over several limits is all or
//! nothing under concurrency and reaches Redis whole; a charge after the
//! fact is kept; two instances over-admit a fixed window within the bound;
//! a stale store answers an outage, which `FailOver` turns into its policy.

mod common;

use common::One;
use proptest::prelude::*;
use proptest::test_runner::TestRunner;
use redis::aio::MultiplexedConnection;
use slidegate_conformance::Figures;
use slidegate_conformance::redis::RedisServer;
use slidegate_conformance::strategy::{config, requests, times};
use slidegate_core::{Algorithm, LimitState, ManualClock, Policy, State, Weighting};
use slidegate_redis::{HybridOptions, HybridStore, RedisClock, RedisStore, microsecond_policy};
use slidegate_store::{Decisions, FailOver, FailurePolicy, Quota, Store, StoreError};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

const PREFIX: &str = "slidegate:hs:";
const CASES: u32 = 32;

async fn conn(server: &RedisServer) -> MultiplexedConnection {
    redis::Client::open(server.url().as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// A store over `server` on `clock`, syncing only when the test says so
/// (its background sync is never started).
async fn store(server: &RedisServer, clock: &ManualClock, options: HybridOptions) -> HybridStore {
    HybridStore::new(conn(server).await, PREFIX, Duration::from_secs(2), options)
        .unwrap()
        .with_clock(RedisClock::client(clock.clone()))
}

fn options() -> HybridOptions {
    HybridOptions::every(Duration::from_millis(50))
}

/// A direct store (with the hybrid stores' prefix) reading the counts
/// they keep for `quota`.
async fn direct(server: &RedisServer, quota: &Quota, clock: &ManualClock) -> One {
    let store = RedisStore::new(conn(server).await, PREFIX, Duration::from_secs(2))
        .unwrap()
        .with_clock(RedisClock::client(clock.clone()));
    One::new(store, *quota.policy())
}

fn decide_now(store: &HybridStore, key: &str, quotas: &[Quota], cost: u64) -> Decisions {
    let mut out = Decisions::new();
    store.decide_now(key, quotas, cost, &mut out).unwrap().unwrap();
    out
}

fn ring(limit: u64, window: Duration, buckets: u32) -> Quota {
    let algorithm = Algorithm::SlidingWindow {
        buckets,
        weighting: Weighting::Conservative,
    };
    Quota::new(Policy::new(limit, window, algorithm).unwrap())
}

fn fixed(limit: u64, window: Duration) -> Quota {
    Quota::new(Policy::new(limit, window, Algorithm::FixedWindow).unwrap())
}

/// Small windows (below 200 µs) and limits (below 12): fixed windows and
/// rings of either weighting.
fn small_window() -> BoxedStrategy<Policy> {
    let algorithm = prop_oneof![
        Just(Algorithm::FixedWindow),
        prop::sample::select(&[2u32, 3, 8, 17][..]).prop_map(|buckets| Algorithm::SlidingWindow {
            buckets,
            weighting: Weighting::Interpolated
        }),
        prop::sample::select(&[2u32, 5][..]).prop_map(|buckets| Algorithm::SlidingWindow {
            buckets,
            weighting: Weighting::Conservative
        }),
    ];
    (1u64..12, 2u64..200, algorithm)
        .prop_filter_map("valid", |(limit, window_us, algorithm)| {
            Policy::new(limit, Duration::from_micros(window_us), algorithm).ok()
        })
        .boxed()
}

/// In-order requests in µs, each with whether a flush follows it.
fn requests_and_flushes() -> BoxedStrategy<Vec<(u64, u64, bool)>> {
    (requests(40, 14), prop::collection::vec(prop::bool::weighted(0.3), 120))
        .prop_map(|(r, flushes)| {
            times(&r, 1_000)
                .into_iter()
                .zip(flushes)
                .map(|((t, cost), flush)| (t, cost, flush))
                .collect()
        })
        .boxed()
}

/// One store alone decides figure for figure as the core (on the policy
/// in microseconds), on fixed windows and rings, whenever it flushes.
#[test]
fn alone_it_decides_like_the_core_on_both_windows() {
    static KEYS: AtomicU64 = AtomicU64::new(0);
    let server = RedisServer::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let fixed_cases = AtomicU64::new(0);
    TestRunner::new(config(CASES))
        .run(&(small_window(), requests_and_flushes()), |(policy, reqs)| {
            let key = format!("alone{}", KEYS.fetch_add(1, Ordering::Relaxed));
            if policy.algorithm() == Algorithm::FixedWindow {
                fixed_cases.fetch_add(1, Ordering::Relaxed);
            }
            rt.block_on(async {
                let micro = microsecond_policy(&policy).unwrap();
                let clock = ManualClock::new(0);
                let store = store(&server, &clock, options()).await;
                let quotas = [Quota::new(policy)];
                let mut core = State::new(&micro);
                for (t, cost, flush) in reqs {
                    clock.set(t * 1000);
                    let got = decide_now(&store, &key, &quotas, cost);
                    let want = Figures::of(&core.check(&micro, t, cost)).scaled(1000);
                    prop_assert_eq!(Figures::of(&got[0]), want, "{} at {} µs, cost {}", policy, t, cost);
                    if flush {
                        store.flush().await.unwrap();
                    }
                }
                Ok(())
            })
        })
        .unwrap();
    assert!(fixed_cases.into_inner() > 0, "no fixed window was tried");
}

/// 16 tasks at once on one key against 5 per minute and 7 per hour: one
/// store admits exactly 5, charged on both limits, and after a flush Redis
/// holds 5 on both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_limits_on_one_key_are_all_or_nothing_under_concurrency() {
    const TASKS: usize = 16;
    let server = RedisServer::start();
    let clock = ManualClock::new(1_700_000_000_000_000_000);
    let shared = Arc::new(store(&server, &clock, options()).await);
    let store: &HybridStore = &shared;
    let quotas: Arc<[Quota]> = Arc::from([ring(5, Duration::from_secs(60), 6), fixed(7, Duration::from_secs(3600))]);
    let barrier = Arc::new(tokio::sync::Barrier::new(TASKS));
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let (store, quotas, barrier) = (Arc::clone(&shared), Arc::clone(&quotas), Arc::clone(&barrier));
            tokio::spawn(async move {
                barrier.wait().await;
                let mut out = Decisions::new();
                // The store itself: `Store for Arc<T>` is meant for
                // `Arc<dyn DynStore>`, and loops on a sized `T`.
                let store: &HybridStore = &store;
                store.decide("k", &quotas, 1, &mut out).await.unwrap();
                out
            })
        })
        .collect();
    let mut admitted = 0;
    for task in tasks {
        let out = task.await.unwrap();
        assert_eq!(out.len(), 2);
        let all = out.iter().all(|d| d.allowed());
        assert!(all || !out[0].allowed(), "only the minute refuses: {out:?}");
        admitted += u64::from(all);
    }
    assert_eq!(admitted, 5);
    let peek = decide_now(store, "k", &quotas, 0);
    assert_eq!((peek[0].remaining(), peek[1].remaining()), (0, 2), "5 charged on both");
    for (quota, left) in quotas.iter().zip([5, 7]) {
        let d = direct(&server, quota, &clock).await;
        assert_eq!(d.check("k", 0).await.unwrap().remaining(), left, "nothing synced yet");
    }
    assert_eq!(store.stats().pending_keys, 2, "the key waits under both limits");
    store.flush().await.unwrap();
    assert_eq!(store.stats().pending_keys, 0);
    for (quota, left) in quotas.iter().zip([0, 2]) {
        let d = direct(&server, quota, &clock).await;
        let peek = d.check("k", 0).await.unwrap();
        assert_eq!((peek.remaining(), peek.estimate()), (left, 5.0), "{}", quota.tag());
    }
    // Each limit's Redis key is `<prefix><tag>:{<key>}`.
    let mut redis = server.sync_conn().unwrap();
    for quota in quotas.iter() {
        let exists: bool = redis::cmd("EXISTS")
            .arg(store.redis_key("k", quota))
            .query(&mut redis)
            .unwrap();
        assert!(exists, "{}", store.redis_key("k", quota));
    }
}

/// A cost charged after the fact goes past the limit, the next request is
/// refused, and the flush takes the charge to Redis.
#[tokio::test]
async fn a_charge_after_the_fact_is_kept_and_reaches_redis() {
    let server = RedisServer::start();
    let clock = ManualClock::new(1_700_000_000_000_000_000);
    let store = store(&server, &clock, options()).await;
    for quota in [ring(10, Duration::from_secs(60), 4), fixed(10, Duration::from_secs(60))] {
        let quotas = [quota];
        assert!(decide_now(&store, "k", &quotas, 1)[0].allowed());
        store.charge("k", &quotas, 12).await.unwrap();
        let next = decide_now(&store, "k", &quotas, 1);
        assert!(!next[0].allowed(), "{}", quotas[0].tag());
        assert_eq!((next[0].remaining(), next[0].estimate()), (0, 13.0));
        store.flush().await.unwrap();
        let peek = direct(&server, &quotas[0], &clock).await.check("k", 0).await.unwrap();
        assert_eq!((peek.remaining(), peek.estimate()), (0, 13.0), "{}", quotas[0].tag());
        // A charge of nothing counts nothing and marks nothing.
        store.charge("other", &quotas, 0).await.unwrap();
        assert_eq!(store.stats().pending_keys, 0);
    }
}

/// A peek changes nothing: no count, no view, nothing to sync.
#[tokio::test]
async fn a_peek_leaves_no_trace() {
    let server = RedisServer::start();
    let clock = ManualClock::new(1_700_000_000_000_000_000);
    let store = store(&server, &clock, options()).await;
    let quotas = [ring(3, Duration::from_secs(1), 4), fixed(2, Duration::from_secs(1))];
    for _ in 0..5 {
        let peek = decide_now(&store, "k", &quotas, 0);
        assert!(peek.iter().all(|d| d.allowed()));
        assert_eq!((peek[0].remaining(), peek[1].remaining()), (3, 2));
    }
    let stats = store.stats();
    assert_eq!((stats.keys, stats.pending_keys), (0, 0), "{stats:?}");
    // A call refused by one limit charges neither.
    assert!(decide_now(&store, "k", &quotas, 2).iter().all(|d| d.allowed()));
    let refused = decide_now(&store, "k", &quotas, 1);
    assert_eq!(
        (refused[0].allowed(), refused[1].allowed()),
        (true, false),
        "the ring's peek, the window's refusal"
    );
    assert_eq!(
        decide_now(&store, "k", &quotas, 0)[0].remaining(),
        1,
        "the ring is not charged"
    );
}

/// Two stores deciding one fixed-window key, each offered 100 requests a
/// second under a limit of 100 a second, flushing every `interval`:
/// together they admit at most the limit plus what the other admits in
/// two intervals in any window, and at least the limit.
#[tokio::test]
async fn two_instances_over_admit_a_fixed_window_within_the_bound() {
    let server = RedisServer::start();
    let quotas = [fixed(100, Duration::from_secs(1))];
    let (instances, gap) = (2u64, 10_000u64);
    for interval in [10_000u64, 50_000, 100_000] {
        let clock = ManualClock::new(0);
        let mut stores = Vec::new();
        for _ in 0..instances {
            stores.push(store(&server, &clock, options()).await);
        }
        let key = format!("shared{interval}");
        let w = 1_000_000u64;
        let start = 10 * w;
        let step = gap / instances;
        let mut per_window: BTreeMap<u64, u64> = BTreeMap::new();
        let mut next_flush = start + interval;
        let mut t = start;
        while t < start + 6 * w {
            if t >= next_flush {
                for s in &stores {
                    s.flush().await.unwrap();
                }
                next_flush += interval;
            }
            clock.set(t * 1000);
            let s = &stores[((t - start) / step % instances) as usize];
            if decide_now(s, &key, &quotas, 1)[0].allowed() {
                *per_window.entry(t / w).or_default() += 1;
            }
            t += step;
        }
        let most = per_window.values().copied().max().unwrap_or(0);
        let least = per_window.values().copied().min().unwrap_or(0);
        let bound = 100 + (instances - 1) * (2 * interval.div_ceil(gap)).min(100);
        eprintln!("{instances} instances, flush every {interval} µs: {least}..={most} in a window (bound {bound})");
        assert!(most <= bound, "{most} admitted in one window, over the bound {bound}");
        assert!(
            least >= 100,
            "{least}: a view never holds more than Redis, so the limit passes"
        );
    }
}

/// Redis killed: decisions go on locally until the syncs have failed for
/// `stale_after`, then the store answers an outage, which `FailOver`
/// turns into its policy (here: admit, counted as `fail_open`).
#[tokio::test]
async fn a_stale_store_answers_an_outage_and_failover_applies_its_policy() {
    let server = RedisServer::start();
    let clock = ManualClock::new(1_700_000_000_000_000_000);
    let mut opts = options();
    opts.stale_after = Duration::from_secs(1);
    opts.sync_timeout = Duration::from_millis(500);
    let guarded = FailOver::new(store(&server, &clock, opts).await, FailurePolicy::Open);
    let store = guarded.inner();
    let quotas = [
        ring(1000, Duration::from_secs(60), 8),
        fixed(1000, Duration::from_secs(60)),
    ];
    assert!(decide_now(store, "k", &quotas, 1).iter().all(|d| d.allowed()));
    store.flush().await.unwrap();
    assert!(decide_now(store, "k", &quotas, 1).iter().all(|d| d.allowed()));
    server.kill();
    assert!(store.flush().await.unwrap_err().is_outage());
    assert_eq!(store.stats().pending_keys, 2, "the counts wait for the next sync");
    assert!(store.stats().errors >= 1);
    clock.advance(Duration::from_millis(900));
    assert!(
        decide_now(store, "k", &quotas, 1).iter().all(|d| d.allowed()),
        "still local"
    );
    assert!(store.flush().await.is_err());
    clock.advance(Duration::from_millis(200));
    let mut out = Decisions::new();
    let err = store.decide("k", &quotas, 1, &mut out).await.unwrap_err();
    assert!(matches!(err, StoreError::Unavailable(_)), "{err}");
    assert!(out.is_empty());
    // A charge is still counted, for Redis once it is back.
    store.charge("k", &quotas, 3).await.unwrap();
    guarded.decide("k", &quotas, 1, &mut out).await.unwrap();
    assert!(out.iter().all(|d| d.allowed()));
    let stats = guarded.stats();
    assert_eq!((stats.failover.fail_open, stats.failover.outages), (1, 1), "{stats:?}");
}

/// `supports` takes the window algorithms and refuses the exact ones,
/// which a decision refuses too.
#[tokio::test]
async fn the_exact_algorithms_are_left_to_the_direct_store() {
    let server = RedisServer::start();
    let clock = ManualClock::new(1_700_000_000_000_000_000);
    let store = store(&server, &clock, options()).await;
    let window = Duration::from_secs(1);
    assert!(store.supports(&ring(10, window, 4)).is_ok());
    assert!(store.supports(&fixed(10, window)).is_ok());
    for algorithm in [Algorithm::Gcra { burst: 3 }, Algorithm::SlidingLog] {
        let quota = Quota::new(Policy::new(10, window, algorithm).unwrap());
        let err = store.supports(&quota).unwrap_err();
        assert!(matches!(err, StoreError::Unsupported { .. }), "{err}");
        let mut out = Decisions::new();
        let err = store
            .decide("k", &[fixed(10, window), quota], 1, &mut out)
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::Unsupported { .. }), "{err}");
    }
    assert_eq!(
        decide_now(&store, "k", &[fixed(10, window)], 0)[0].remaining(),
        10,
        "nothing charged"
    );
    let mut out = Decisions::new();
    assert!(matches!(
        store.decide("k", &[], 1, &mut out).await,
        Err(StoreError::NoQuota)
    ));
}

/// The background sync covers the limits made after it started.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_background_sync_covers_limits_made_later() {
    let server = RedisServer::start();
    let clock = ManualClock::new(1_700_000_000_000_000_000);
    let store = store(&server, &clock, HybridOptions::every(Duration::from_millis(10))).await;
    let _sync = store.spawn_sync();
    let quotas = [ring(10, Duration::from_secs(60), 4), fixed(10, Duration::from_secs(60))];
    for _ in 0..3 {
        assert!(decide_now(&store, "late", &quotas, 1).iter().all(|d| d.allowed()));
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while store.stats().pending_keys > 0 && std::time::Instant::now() < deadline {
        tokio::task::yield_now().await;
    }
    let stats = store.stats();
    assert_eq!(stats.pending_keys, 0, "{stats:?}");
    assert!(stats.sync_commands >= 2, "{stats:?}");
    for quota in &quotas {
        let peek = direct(&server, quota, &clock).await.check("late", 0).await.unwrap();
        assert_eq!(peek.remaining(), 7, "{}", quota.tag());
    }
}

/// The bounded mode keeps two limits of one key all or nothing: a limit
/// whose lease cannot cover the cost refuses the call, and the other limit,
/// whose lease could, is not charged either (a decision's `remaining` is
/// what its lease still allows, so the peek says what the charge would).
#[tokio::test]
async fn the_bounded_mode_keeps_two_limits_all_or_nothing() {
    let server = RedisServer::start();
    let clock = ManualClock::new(1_700_000_000_000_000_000);
    let hybrid = store(&server, &clock, HybridOptions::leased(Duration::from_millis(50))).await;
    let (small, large) = (
        ring(10, Duration::from_secs(60), 8),
        ring(100, Duration::from_secs(60), 8),
    );
    let both = [small.clone(), large.clone()];
    // The large limit's demand is 31 (a lease of 62), the small one's 1
    // (a lease of 2); nothing is admitted before the leases.
    assert!(!decide_now(&hybrid, "k", std::slice::from_ref(&large), 30)[0].allowed());
    assert!(decide_now(&hybrid, "k", &both, 1).iter().all(|d| !d.allowed()));
    hybrid.flush().await.unwrap();
    let peek = decide_now(&hybrid, "k", &both, 0);
    assert_eq!((peek[0].remaining(), peek[1].remaining()), (2, 62), "each lease");
    // 3 fits the large lease, not the small one: nothing is charged.
    let d = decide_now(&hybrid, "k", &both, 3);
    assert!(!d[0].allowed());
    assert!(d[1].allowed(), "the large limit shows its peek");
    assert_eq!(d[1].remaining(), 62, "and was not charged");
    // 2 fits both: both are charged.
    let d = decide_now(&hybrid, "k", &both, 2);
    assert!(d.iter().all(|d| d.allowed()));
    assert_eq!((d[0].remaining(), d[1].remaining()), (0, 60));
}
