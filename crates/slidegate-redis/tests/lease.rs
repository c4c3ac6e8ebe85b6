//! The hybrid mode's bounded form (issue [lease]): instances decide
//! locally on leases Redis grants at each sync, so that together they never
//! admit more than the limit in any window, whatever the traffic, the
//! interleaving of requests and syncs, and however many instances; one
//! busy instance gets close to the whole limit; an idle instance's share
//! flows back; a dead instance's lease expires. Every test runs on a
//! manual clock (the scripts take the client's time) against throw-away
//! Redis servers.

mod common;

use common::{Backend, RedisCluster, RedisServer};
use proptest::prelude::*;
use proptest::test_runner::TestRunner;
use slidegate_conformance::oracle::ExactLog;
use slidegate_conformance::strategy::config;
use slidegate_core::{Algorithm, Clock, LimitState, ManualClock, Policy, State, Weighting};
use slidegate_redis::{HybridLimiter, HybridOptions, RedisClock, StaleSyncs};
use slidegate_store::StoreError;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A bounded-mode limiter of `policy` on `clock`, its lease lasting
/// `lease`, syncing only when the test says so.
async fn leased<B: Backend>(
    backend: &B,
    policy: Policy,
    clock: &ManualClock,
    lease: Duration,
) -> HybridLimiter<B::Conn> {
    let redis = backend.store(RedisClock::client(clock.clone())).await;
    let mut options = HybridOptions::every(lease / 4);
    options.lease = Some(lease);
    HybridLimiter::any_window(redis, policy, options).unwrap()
}

fn ring(limit: u64, window: Duration, buckets: u32, weighting: Weighting) -> Policy {
    Policy::new(limit, window, Algorithm::SlidingWindow { buckets, weighting }).unwrap()
}

/// One step of the traffic.
#[derive(Clone, Debug)]
enum Op {
    /// Instance `i` asks for `cost`.
    Ask(usize, u64),
    /// Instance `i` syncs.
    Sync(usize),
    /// The clock moves on by this many µs.
    Wait(u64),
    /// Instance `i` dies: it neither asks nor syncs again.
    Die(usize),
}

fn ops(instances: usize) -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        6 => (0..instances, 1u64..=3).prop_map(|(i, c)| Op::Ask(i, c)),
        3 => (0..instances).prop_map(Op::Sync),
        3 => (0u64..40).prop_map(Op::Wait),
        1 => (0..instances).prop_map(Op::Die),
    ];
    prop::collection::vec(op, 1..200)
}

/// Small windows (below 200 µs) of every form the mode covers: rings of
/// either weighting, and fixed windows.
fn policies() -> impl Strategy<Value = Policy> {
    let weighting = prop_oneof![Just(Weighting::Conservative), Just(Weighting::Interpolated)];
    let sliding = (
        1u64..12,
        10u64..200,
        prop::sample::select(&[2u32, 3, 8, 17][..]),
        weighting,
    )
        .prop_map(|(limit, window_us, buckets, weighting)| {
            ring(limit, Duration::from_micros(window_us), buckets, weighting)
        });
    let fixed = (1u64..12, 10u64..200).prop_map(|(limit, window_us)| {
        Policy::new(limit, Duration::from_micros(window_us), Algorithm::FixedWindow).unwrap()
    });
    prop_oneof![sliding, fixed].prop_filter("windows in whole µs buckets", |p| {
        slidegate_redis::microsecond_policy(p).is_ok()
    })
}

/// Arbitrary interleavings of requests, syncs, waits and deaths on 2 to 4
/// instances sharing one key: at most the limit in any window (in any
/// fixed window, for `fixed_window`), counted exactly over every
/// admission of every instance.
#[test]
fn instances_together_never_admit_more_than_the_limit() {
    static KEYS: AtomicU64 = AtomicU64::new(0);
    let server = RedisServer::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let strategy = (policies(), 2usize..=4, 20u64..400)
        .prop_flat_map(|(policy, instances, lease_us)| (Just(policy), Just(instances), Just(lease_us), ops(instances)));
    TestRunner::new(config(128))
        .run(&strategy, |(policy, instances, lease_us, ops)| {
            let key = format!("bounded{}", KEYS.fetch_add(1, Ordering::Relaxed));
            rt.block_on(async {
                let clock = ManualClock::new(1_000_000_000);
                let lease = Duration::from_micros(lease_us);
                let mut limiters = Vec::new();
                for _ in 0..instances {
                    limiters.push(Some(leased(&server, policy, &clock, lease).await));
                }
                let mut admitted = ExactLog::default();
                for op in &ops {
                    match *op {
                        Op::Ask(i, cost) => {
                            if let Some(l) = &limiters[i]
                                && l.decide(&key, cost).unwrap().allowed()
                            {
                                admitted.push(clock.now() / 1000, cost);
                            }
                        }
                        Op::Sync(i) => {
                            if let Some(l) = &limiters[i] {
                                l.sync().await.unwrap();
                            }
                        }
                        Op::Wait(us) => clock.advance(Duration::from_micros(us)),
                        Op::Die(i) => limiters[i] = None,
                    }
                }
                let w = policy.window_ns() / 1000;
                let most = if matches!(policy.algorithm(), Algorithm::FixedWindow) {
                    admitted.max_in_any_fixed_window(w)
                } else {
                    admitted.max_in_any_window(w)
                };
                prop_assert!(
                    most <= policy.limit(),
                    "{} admitted in one window of {} ({} instances, lease {} µs)",
                    most,
                    policy,
                    instances,
                    lease_us
                );
                Ok(())
            })
        })
        .unwrap();
}

/// `instances` instances, the first `busy` of them each offered a request
/// every `gap` µs, all syncing every `interval` µs, for `windows` windows
/// of `policy`: each instance's admissions.
async fn steady(
    server: &RedisServer,
    policy: Policy,
    instances: usize,
    busy: usize,
    gap: u64,
    interval: u64,
    windows: u64,
) -> (Vec<ExactLog>, u64) {
    static KEYS: AtomicU64 = AtomicU64::new(0);
    let key = format!("steady{}", KEYS.fetch_add(1, Ordering::Relaxed));
    let clock = ManualClock::new(1_000_000_000);
    let lease = Duration::from_micros(interval * 4);
    let mut limiters = Vec::new();
    for _ in 0..instances {
        limiters.push(leased(server, policy, &clock, lease).await);
    }
    let w = policy.window_ns() / 1000;
    let start = clock.now() / 1000;
    let mut logs = vec![ExactLog::default(); instances];
    let mut next_sync = start + interval;
    let mut t = start;
    while t < start + windows * w {
        if t >= next_sync {
            for l in &limiters {
                l.sync().await.unwrap();
            }
            next_sync += interval;
        }
        clock.set(t * 1000);
        for (l, log) in limiters.iter().zip(&mut logs).take(busy) {
            if l.decide(&key, 1).unwrap().allowed() {
                log.push(t, 1);
            }
        }
        t += gap;
    }
    (logs, start)
}

/// One instance carrying all the traffic (10 times the limit), three idle
/// ones beside it: from its third sync on, it admits at least 95 % of what
/// one limiter of the same policy alone (the core, deciding every request
/// itself) admits of the same requests, and never more than the limit in
/// any window.
#[tokio::test]
async fn one_busy_instance_gets_nearly_the_whole_limit() {
    let server = RedisServer::start();
    let policy = ring(100, Duration::from_secs(1), 8, Weighting::Conservative);
    let (interval, gap) = (50_000u64, 1_000u64);
    let (logs, start) = steady(&server, policy, 4, 1, gap, interval, 6).await;
    let log = &logs[0];
    assert!(log.max_in_any_window(1_000_000) <= 100);
    let micro = slidegate_redis::microsecond_policy(&policy).unwrap();
    let mut core = State::new(&micro);
    let from = start + 3 * interval;
    let (mut alone, mut t) = (0u64, start);
    while t < start + 6_000_000 {
        if core.check(&micro, t, 1).allowed() && t >= from {
            alone += 1;
        }
        t += gap;
    }
    let got: u64 = log.events.iter().filter(|&&(t, _)| t >= from).map(|&(_, c)| c).sum();
    eprintln!("one busy instance of four: {got} admitted from its third sync on, {alone} by one limiter alone");
    assert!(got * 100 >= alone * 95, "{got} of {alone}");
}

/// Two busy instances of four, each offered 10 times the limit: together
/// never past the limit, and together near it.
#[tokio::test]
async fn busy_instances_share_the_limit() {
    let server = RedisServer::start();
    let policy = ring(100, Duration::from_secs(1), 8, Weighting::Conservative);
    let (logs, start) = steady(&server, policy, 4, 2, 1_000, 50_000, 6).await;
    let mut all = ExactLog::default();
    for log in &logs {
        all.events.extend(&log.events);
    }
    all.events.sort_unstable();
    let w = 1_000_000u64;
    let most = all.max_in_any_window(w);
    let late = all.count(start + 6 * w - 1_000, w);
    let each: Vec<u64> = logs.iter().map(|l| l.count(start + 6 * w - 1_000, w)).collect();
    eprintln!("two busy instances of four: at most {most} in a window, {late} in the last ({each:?})");
    assert!(most <= 100);
    assert!(late >= 90, "{late} of 100 in the last window");
}

/// A busy instance that dies holding its lease: the others are refused
/// while it could still spend it, and get the budget back once the lease
/// has expired (counted as spent) and left the window.
#[tokio::test]
async fn a_dead_instance_lease_expires() {
    let server = RedisServer::start();
    let clock = ManualClock::new(1_000_000_000);
    let policy = ring(10, Duration::from_millis(100), 4, Weighting::Conservative);
    let lease = Duration::from_millis(20);
    let a = leased(&server, policy, &clock, lease).await;
    let b = leased(&server, policy, &clock, lease).await;
    // A asks for the limit, syncs (a lease of the whole limit: twice its
    // demand, at most the limit), spends 4, and dies.
    assert!(!a.decide("k", 10).unwrap().allowed(), "no lease before the first sync");
    a.sync().await.unwrap();
    for _ in 0..4 {
        assert!(a.decide("k", 1).unwrap().allowed());
    }
    drop(a);
    // B is refused while A's lease lives.
    assert!(!b.decide("k", 1).unwrap().allowed());
    b.sync().await.unwrap();
    assert!(!b.decide("k", 1).unwrap().allowed(), "A's lease holds the whole limit");
    // After A's lease time, it is counted as spent: still no room.
    clock.advance(Duration::from_millis(25));
    b.sync().await.unwrap();
    assert!(!b.decide("k", 1).unwrap().allowed());
    // Once its bucket has left the ring (4 buckets of a third of the
    // window, the newest partly), B gets the limit.
    clock.advance(Duration::from_millis(150));
    assert!(!b.decide("k", 10).unwrap().allowed(), "B's lease holds 0");
    b.sync().await.unwrap();
    let admitted = (0..20).filter(|_| b.decide("k", 1).unwrap().allowed()).count();
    assert_eq!(admitted, 10);
    let stats = b.stats();
    assert!(stats.lease_refusals >= 3, "{stats:?}");
}

/// An idle instance gives its lease back at its next sync: the busy one
/// then gets the rest.
#[tokio::test]
async fn an_idle_instance_share_flows_back() {
    let server = RedisServer::start();
    let clock = ManualClock::new(1_000_000_000);
    let policy = ring(100, Duration::from_secs(10), 8, Weighting::Conservative);
    let lease = Duration::from_secs(1);
    let a = leased(&server, policy, &clock, lease).await;
    let b = leased(&server, policy, &clock, lease).await;
    // Both ask at once: B syncs first and takes a share of 2 (twice its
    // demand), A then takes half of what is left (49).
    assert!(!b.decide("k", 1).unwrap().allowed());
    assert!(!a.decide("k", 60).unwrap().allowed());
    b.sync().await.unwrap();
    a.sync().await.unwrap();
    let first = (0..100).filter(|_| a.decide("k", 1).unwrap().allowed()).count();
    assert_eq!(first, 49, "half of the 98 left beside B's lease");
    // B asks nothing more: its next sync gives its lease back; A's next
    // sync gets all that is left.
    clock.advance(Duration::from_millis(10));
    b.sync().await.unwrap();
    a.sync().await.unwrap();
    let second = (0..100).filter(|_| a.decide("k", 1).unwrap().allowed()).count();
    assert_eq!(second, 51, "the whole limit, less what A spent");
}

/// 40 keys asked for on two instances, each key's limit of 10 asked 30
/// times on each: a sync sends them all in one call on one server, one
/// per hash slot on a Cluster (after the Cluster has refused the batch
/// across slots once, within the same sync); every key gets its limit,
/// never more.
async fn many_keys_in_one_sync<B: Backend>(backend: &B) -> (u64, u64) {
    let clock = ManualClock::new(1_000_000_000);
    let policy = ring(10, Duration::from_secs(10), 8, Weighting::Conservative);
    let lease = Duration::from_secs(1);
    let a = leased(backend, policy, &clock, lease).await;
    let b = leased(backend, policy, &clock, lease).await;
    let keys: Vec<String> = (0..40).map(|k| format!("user{k}")).collect();
    for key in &keys {
        assert!(!a.decide(key, 10).unwrap().allowed());
        assert!(!b.decide(key, 10).unwrap().allowed());
    }
    a.sync().await.unwrap();
    b.sync().await.unwrap();
    for key in &keys {
        let admitted = (0..30)
            .filter(|_| a.decide(key, 1).unwrap().allowed())
            .chain((0..30).filter(|_| b.decide(key, 1).unwrap().allowed()))
            .count();
        assert_eq!(admitted, 10, "{key}: A's lease is the whole limit, B's nothing");
    }
    (a.stats().commands, a.stats().syncs)
}

#[tokio::test]
async fn one_server_takes_a_batch_in_one_call() {
    let (commands, syncs) = many_keys_in_one_sync(&RedisServer::start()).await;
    assert_eq!((commands, syncs), (1, 1), "40 keys, one call");
}

#[tokio::test]
async fn a_cluster_takes_a_batch_in_one_call_per_slot() {
    let (commands, _) = many_keys_in_one_sync(&RedisCluster::start()).await;
    // One refused call across slots, then one a slot (40 keys, of which
    // hardly two share a slot).
    assert!(commands > 30, "{commands} calls");
}

/// Redis dies under a bounded instance: it spends what its lease holds
/// while the lease lasts (the syncs failing), then refuses; once the syncs
/// have failed for `stale_after`, decisions are an outage, for the failure
/// policy, as in today's mode.
#[tokio::test]
async fn a_dead_redis_leaves_the_lease_then_the_failure_policy() {
    let server = RedisServer::start();
    let url = server.url();
    let clock = ManualClock::new(1_000_000_000);
    let conn = redis::aio::ConnectionManager::new(redis::Client::open(url.as_str()).unwrap())
        .await
        .unwrap();
    let redis = slidegate_redis::RedisStore::new(conn, common::PREFIX, Duration::from_millis(500))
        .unwrap()
        .with_clock(RedisClock::client(clock.clone()));
    let mut options = HybridOptions::leased(Duration::from_millis(50));
    options.stale_after = Duration::from_millis(500);
    let h = HybridLimiter::new(
        redis,
        ring(100, Duration::from_secs(60), 8, Weighting::Conservative),
        options,
    )
    .unwrap();
    assert!(!h.decide("k", 10).unwrap().allowed());
    h.sync().await.unwrap();
    server.kill();
    // A lease of 20 (twice the demand), spent while it lasts.
    let admitted = (0..30).filter(|_| h.decide("k", 1).unwrap().allowed()).count();
    assert_eq!(admitted, 20);
    assert!(h.sync().await.is_err());
    clock.advance(Duration::from_millis(300));
    assert!(h.sync().await.is_err());
    assert!(!h.decide("k", 1).unwrap().allowed(), "the lease has expired");
    clock.advance(Duration::from_millis(300));
    let Err(StoreError::Unavailable(source)) = h.decide("k", 1) else {
        panic!("stale syncs are an outage");
    };
    assert!(source.is::<StaleSyncs>(), "{source}");
}

/// A reset in the bounded mode forgets the key's counts in Redis too (its
/// lease hash): after it, a sync grants the whole limit again.
#[tokio::test]
async fn a_reset_forgets_the_counts_and_the_leases() {
    let server = RedisServer::start();
    let clock = ManualClock::new(1_000_000_000);
    let policy = ring(10, Duration::from_secs(60), 8, Weighting::Conservative);
    let a = leased(&server, policy, &clock, Duration::from_secs(1)).await;
    assert!(!a.decide("k", 10).unwrap().allowed());
    a.sync().await.unwrap();
    let first = (0..20).filter(|_| a.decide("k", 1).unwrap().allowed()).count();
    assert_eq!(first, 10);
    a.sync().await.unwrap();
    assert!(!a.decide("k", 10).unwrap().allowed(), "the limit is spent");
    assert!(a.reset("k").await.unwrap(), "Redis held the key");
    assert!(!a.decide("k", 10).unwrap().allowed(), "no lease before the next sync");
    a.sync().await.unwrap();
    let again = (0..20).filter(|_| a.decide("k", 1).unwrap().allowed()).count();
    assert_eq!(again, 10, "the whole limit after the reset");
}
