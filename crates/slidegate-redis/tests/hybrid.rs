//! Hybrid mode: one instance decides exactly as the core whenever it syncs;
//! several instances over-admit within the documented bound; counts are
//! never lost to a failed sync; once the syncs are stale, decisions are
//! errors (for a `FailOver` to decide).

mod common;

use common::{Backend, PREFIX, RedisCluster, RedisServer};
use proptest::prelude::*;
use proptest::test_runner::TestRunner;
use redis::aio::{ConnectionLike, ConnectionManager, MultiplexedConnection};
use redis::{Cmd, Pipeline, RedisFuture, Value};
use slidegate_conformance::Figures;
use slidegate_conformance::oracle::ExactLog;
use slidegate_conformance::strategy::{config, requests, times};
use slidegate_core::{Algorithm, LimitState, ManualClock, Policy, State, Weighting};
use slidegate_redis::{
    HybridLimiter, HybridOptions, RedisClock, RedisStore, RedisStoreError, StaleSyncs, microsecond_policy,
};
use slidegate_store::{Quota, StoreError};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::Notify;

const CASES: u32 = 32;

fn sliding_window(limit: u64, window: Duration, buckets: u32, weighting: Weighting) -> Policy {
    Policy::new(limit, window, Algorithm::SlidingWindow { buckets, weighting }).unwrap()
}

/// A hybrid limiter of `policy` over `store` on `clock`, syncing only when
/// the test says so.
async fn hybrid<B: Backend>(
    backend: &B,
    policy: Policy,
    clock: &ManualClock,
    options: HybridOptions,
) -> HybridLimiter<B::Conn> {
    let redis = backend.store(RedisClock::client(clock.clone())).await;
    HybridLimiter::new(redis, policy, options).unwrap()
}

fn options() -> HybridOptions {
    HybridOptions::every(Duration::from_millis(50))
}

/// Small rings, windows below 200 µs, limits below 12, either weighting.
fn small_ring() -> BoxedStrategy<Policy> {
    let weighting = prop_oneof![Just(Weighting::Interpolated), Just(Weighting::Conservative)];
    (
        1u64..12,
        2u64..200,
        prop::sample::select(&[2u32, 3, 8, 17][..]),
        weighting,
    )
        .prop_filter_map("valid", |(limit, window_us, buckets, weighting)| {
            Policy::new(
                limit,
                Duration::from_micros(window_us),
                Algorithm::SlidingWindow { buckets, weighting },
            )
            .ok()
        })
        .boxed()
}

/// In-order requests in µs, each with whether a sync follows it.
fn requests_and_syncs() -> BoxedStrategy<Vec<(u64, u64, bool)>> {
    (requests(40, 14), prop::collection::vec(prop::bool::weighted(0.3), 120))
        .prop_map(|(r, syncs)| {
            times(&r, 1_000)
                .into_iter()
                .zip(syncs)
                .map(|((t, cost), sync)| (t, cost, sync))
                .collect()
        })
        .boxed()
}

/// One instance alone decides figure for figure as the core (on the
/// policy in microseconds), whenever its syncs come.
fn alone_decides_like_the_core<B: Backend>(store: &B) {
    static KEYS: AtomicU64 = AtomicU64::new(0);
    let rt = tokio::runtime::Runtime::new().unwrap();
    TestRunner::new(config(CASES))
        .run(&(small_ring(), requests_and_syncs()), |(policy, reqs)| {
            let key = format!("alone{}", KEYS.fetch_add(1, Ordering::Relaxed));
            rt.block_on(async {
                let micro = microsecond_policy(&policy).unwrap();
                let clock = ManualClock::new(0);
                let limiter = hybrid(store, policy, &clock, options()).await;
                let mut core = State::new(&micro);
                for (t, cost, sync) in reqs {
                    clock.set(t * 1000);
                    let got = limiter.decide(&key, cost);
                    prop_assert!(got.is_ok(), "{:?}", got);
                    let want = Figures::of(&core.check(&micro, t, cost)).scaled(1000);
                    prop_assert_eq!(
                        Figures::of(&got.unwrap()),
                        want,
                        "{} at {} µs, cost {}",
                        policy,
                        t,
                        cost
                    );
                    if sync {
                        limiter.sync().await.unwrap();
                    }
                }
                Ok(())
            })
        })
        .unwrap();
}

#[test]
fn alone_it_decides_like_the_core() {
    alone_decides_like_the_core(&RedisServer::start());
}

#[test]
fn alone_it_decides_like_the_core_on_a_cluster() {
    alone_decides_like_the_core(&RedisCluster::start());
}

/// `instances` instances, each sent one request every `gap` µs on one key
/// (staggered), syncing every `interval` µs, for `windows` windows: the
/// most admitted in any window, across all of them.
async fn most_in_a_window(
    server: &RedisServer,
    policy: Policy,
    instances: u64,
    gap: u64,
    interval: u64,
    windows: u64,
) -> u64 {
    let clock = ManualClock::new(0);
    let mut limiters = Vec::new();
    for _ in 0..instances {
        limiters.push(hybrid(server, policy, &clock, options()).await);
    }
    let w = policy.window_ns() / 1000;
    let start = 1_000_000;
    let mut admitted = ExactLog::default();
    let mut next_sync = start + interval;
    let step = gap / instances;
    let mut t = start;
    while t < start + windows * w {
        if t >= next_sync {
            for l in &limiters {
                l.sync().await.unwrap();
            }
            next_sync += interval;
        }
        let i = ((t - start) / step % instances) as usize;
        clock.set(t * 1000);
        if limiters[i].decide(&format!("shared{interval}"), 1).unwrap().allowed() {
            admitted.push(t, 1);
        }
        t += step;
    }
    for l in &limiters {
        l.sync().await.unwrap();
    }
    admitted.max_in_any_window(w)
}

/// The documented bound: together the instances admit at most the limit
/// plus what the others admit in one sync interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_instances_over_admit_within_the_bound() {
    let server = RedisServer::start();
    // 100 per second over 8 buckets, conservative (alone it never
    // over-admits); each instance offered 100 requests per second.
    let policy = sliding_window(100, Duration::from_secs(1), 8, Weighting::Conservative);
    let (instances, gap) = (4u64, 10_000u64);
    for interval in [10_000u64, 50_000, 100_000] {
        let most = most_in_a_window(&server, policy, instances, gap, interval, 6).await;
        // An instance's view misses what each other instance admitted
        // since that one's last sync before its own: two intervals at most,
        // interval / gap requests each.
        let bound = 100 + (instances - 1) * 2 * interval.div_ceil(gap);
        eprintln!("{instances} instances, sync every {interval} µs: at most {most} in a window (bound {bound})");
        assert!(most <= bound, "{most} admitted in one window, over the bound {bound}");
        assert!(most >= 80, "{most}: the instances together should come near the limit");
    }
}

/// What one instance counted reaches Redis, where a direct limiter on the
/// same key sees it, and the other way round.
#[tokio::test]
async fn direct_and_hybrid_instances_share_a_key() {
    let server = RedisServer::start();
    let policy = sliding_window(10, Duration::from_secs(60), 4, Weighting::Conservative);
    let clock = ManualClock::new(1_700_000_000_000_000_000);
    let h = hybrid(&server, policy, &clock, options()).await;
    let direct = server.limiter(policy, RedisClock::client(clock.clone())).await;
    for _ in 0..4 {
        assert!(h.decide("k", 1).unwrap().allowed());
    }
    assert_eq!(
        direct.check("k", 0).await.unwrap().remaining(),
        10,
        "nothing synced yet"
    );
    let report = h.sync().await.unwrap();
    assert_eq!((report.keys, report.batches), (1, 1));
    assert_eq!(direct.check("k", 0).await.unwrap().remaining(), 6);
    assert!(direct.check("k", 3).await.unwrap().allowed());
    // The hybrid view learns the direct counts with its next sync.
    assert_eq!(h.decide("k", 0).unwrap().remaining(), 6);
    assert!(h.decide("k", 1).unwrap().allowed());
    h.sync().await.unwrap();
    assert_eq!(h.decide("k", 0).unwrap().remaining(), 2);
    assert_eq!(direct.check("k", 0).await.unwrap().remaining(), 2);
}

/// Counts wait in the outbox while Redis is down and all reach it once it
/// is back; after `stale_after` of failed syncs the failure policy
/// decides, and local decisions resume with the first good sync.
#[tokio::test]
async fn counts_survive_a_dead_redis_and_the_policy_takes_over_when_stale() {
    let server = RedisServer::start();
    let port = server.port();
    let url = server.url();
    let policy = sliding_window(1000, Duration::from_secs(60), 8, Weighting::Conservative);
    let clock = ManualClock::new(1_700_000_000_000_000_000);
    let conn = ConnectionManager::new(redis::Client::open(url.as_str()).unwrap())
        .await
        .unwrap();
    let redis = RedisStore::new(conn, PREFIX, Duration::from_millis(500))
        .unwrap()
        .with_clock(RedisClock::client(clock.clone()));
    let mut opts = options();
    opts.stale_after = Duration::from_secs(1);
    let h = HybridLimiter::new(redis, policy, opts).unwrap();
    for i in 0..30 {
        assert!(h.decide(&format!("k{}", i % 3), 1).unwrap().allowed());
    }
    h.sync().await.unwrap();
    for i in 0..30 {
        assert!(h.decide(&format!("k{}", i % 3), 1).unwrap().allowed());
    }
    server.kill();
    assert!(h.sync().await.is_err());
    assert_eq!(h.stats().pending_keys, 3, "the counts wait for the next sync");
    // Still local within stale_after.
    clock.advance(Duration::from_millis(900));
    assert!(h.decide("k0", 1).unwrap().allowed());
    assert!(h.sync().await.is_err());
    clock.advance(Duration::from_millis(200));
    let Err(StoreError::Unavailable(source)) = h.decide("k0", 1) else {
        panic!("stale syncs are an outage");
    };
    assert!(source.is::<StaleSyncs>(), "{source}");
    let decided = h.stats().decisions;

    let server = RedisServer::start_on(port, &[]).unwrap();
    // The connection manager reconnects; a sync may meet the broken
    // connection once first.
    let back = std::time::Instant::now();
    while h.sync().await.is_err() {
        assert!(back.elapsed() < Duration::from_secs(10), "syncs never resumed");
        tokio::task::yield_now().await;
    }
    assert!(h.decide("k0", 0).is_ok());
    assert_eq!(h.stats().decisions, decided + 1, "the stale decision counted nothing");
    // Everything admitted before the restart that was not synced reached
    // the new server: 10 per key (the first 10 per key died with the old
    // server, whose data was not persisted), plus the one local decision.
    let mut conn = server.sync_conn().unwrap();
    let direct_counts: Vec<u64> = (0..3)
        .map(|i| {
            let fields: Vec<(String, u64)> = redis::cmd("HGETALL")
                .arg(format!("{PREFIX}{}:{{k{i}}}", Quota::new(policy).tag()))
                .query(&mut conn)
                .unwrap();
            fields.iter().filter(|(f, _)| f != "n").map(|(_, c)| c).sum()
        })
        .collect();
    assert_eq!(direct_counts, vec![11, 10, 10]);
}

/// A new key beyond the pending-key bound is refused (not an outage: the
/// store cannot hold it), so that the outbox stays bounded; a key already
/// pending is not.
#[tokio::test]
async fn a_full_outbox_refuses_new_keys() {
    let server = RedisServer::start();
    let policy = sliding_window(10, Duration::from_secs(1), 4, Weighting::Conservative);
    let clock = ManualClock::new(1_700_000_000_000_000_000);
    let redis = server.store(RedisClock::client(clock.clone())).await;
    let mut opts = options();
    opts.max_pending_keys = 2;
    let h = HybridLimiter::new(redis, policy, opts).unwrap();
    assert!(h.decide("a", 1).unwrap().allowed());
    assert!(h.decide("b", 1).unwrap().allowed());
    let c = h.decide("c", 1);
    assert!(matches!(c, Err(StoreError::KeyRefused(_))), "{c:?}");
    assert!(h.decide("a", 1).is_ok());
    assert!(h.decide("c", 0).is_ok(), "a peek counts nothing");
    h.sync().await.unwrap();
    assert!(h.decide("c", 1).unwrap().allowed());
}

/// Issue [flood]: a flood of new keys that evicts a key's view does not
/// let the key past its limit before the next sync. The views are bounded
/// (4 keys here); an evicted view is folded into their summary and made
/// again from its estimate, so the victim, at its limit, stays refused
/// whatever the flood evicted; the sync then brings the global count.
#[tokio::test]
async fn a_flood_of_new_keys_does_not_reset_an_evicted_view() {
    let server = RedisServer::start();
    let policy = sliding_window(5, Duration::from_secs(3600), 8, Weighting::Conservative);
    let clock = ManualClock::new(1_700_000_000_000_000_000);
    let mut opts = options();
    opts.budget = slidegate_memory::Budget::keys(4);
    let h = hybrid(&server, policy, &clock, opts).await;
    let admitted = (0..5).filter(|_| h.decide("victim", 1).unwrap().allowed()).count();
    assert_eq!(admitted, 5);
    for round in 0..50u64 {
        clock.advance(Duration::from_secs(1));
        for k in 0..20u64 {
            // Each flood key takes the whole limit, so that it holds as
            // much as the victim and the victim is the oldest.
            for _ in 0..5 {
                h.decide(&format!("flood-{round}-{k}"), 1).unwrap();
            }
        }
        let d = h.decide("victim", 1).unwrap();
        assert!(!d.allowed(), "round {round}: the victim admitted past its limit");
    }
    let views = h.view_stats();
    assert!(views.evictions > 0, "the flood evicted views: {views:?}");
    assert!(views.seeded > 0, "the victim started from the summary: {views:?}");
    h.sync().await.unwrap();
    h.sync().await.unwrap();
    let d = h.decide("victim", 1).unwrap();
    assert!(!d.allowed());
    assert_eq!(d.estimate(), 5.0, "after the syncs the view holds the global count");
}

/// The background sync sends a batch as soon as it fills, and Redis gets
/// one command per key per sync however many decisions there were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_background_sync_sends_full_batches_at_once() {
    let server = RedisServer::start();
    let policy = sliding_window(1000, Duration::from_secs(60), 8, Weighting::Conservative);
    let redis = server.store(RedisClock::Server).await;
    let mut opts = HybridOptions::every(Duration::from_secs(3600));
    opts.batch = 4;
    let h = HybridLimiter::new(redis, policy, opts).unwrap();
    let _task = h.spawn_sync();
    for round in 0..50 {
        for k in 0..4 {
            assert!(h.decide(&format!("k{k}"), 1).unwrap().allowed(), "round {round}");
        }
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while h.stats().commands < 4 && std::time::Instant::now() < deadline {
        tokio::task::yield_now().await;
    }
    let stats = h.stats();
    assert_eq!(stats.decisions, 200);
    assert!(stats.commands >= 4, "{stats:?}");
    assert!(stats.commands <= 8, "{stats:?}: one command per key per sync");
}

#[tokio::test]
async fn other_algorithms_and_zero_intervals_are_refused() {
    let server = RedisServer::start();
    let fixed = Policy::new(10, Duration::from_secs(1), Algorithm::FixedWindow).unwrap();
    let redis = server.store(RedisClock::Server).await;
    assert!(matches!(
        HybridLimiter::new(redis.clone(), fixed, options()),
        Err(RedisStoreError::Unsupported { .. })
    ));
    let ring = sliding_window(10, Duration::from_secs(1), 4, Weighting::Interpolated);
    let err = HybridLimiter::new(redis, ring, HybridOptions::every(Duration::ZERO)).unwrap_err();
    assert!(err.to_string().contains("sync interval"), "{err}");
}

/// On the server's clock, what one instance synced is in the other's view
/// after its next sync.
#[tokio::test]
async fn on_the_server_clock_instances_see_each_other() {
    let server = RedisServer::start();
    let policy = sliding_window(100, Duration::from_secs(60), 8, Weighting::Conservative);
    let a = HybridLimiter::new(server.store(RedisClock::Server).await, policy, options()).unwrap();
    let b = HybridLimiter::new(server.store(RedisClock::Server).await, policy, options()).unwrap();
    for _ in 0..5 {
        assert!(a.decide("k", 1).unwrap().allowed());
    }
    a.sync().await.unwrap();
    assert!(b.decide("k", 1).unwrap().allowed());
    b.sync().await.unwrap();
    assert_eq!(b.decide("k", 0).unwrap().remaining(), 94);
    // A learns of B's count with its next sync, which a refusal asks for
    // too (a view that only refuses would otherwise never learn).
    let full = sliding_window(5, Duration::from_secs(60), 8, Weighting::Conservative);
    let c = HybridLimiter::new(server.store(RedisClock::Server).await, full, options()).unwrap();
    let d = HybridLimiter::new(server.store(RedisClock::Server).await, full, options()).unwrap();
    for _ in 0..5 {
        assert!(c.decide("f", 1).unwrap().allowed());
    }
    assert!(!c.decide("f", 1).unwrap().allowed());
    c.sync().await.unwrap();
    assert!(!c.decide("f", 1).unwrap().allowed());
    assert!(d.decide("f", 1).unwrap().allowed(), "d has not synced yet");
    d.sync().await.unwrap();
    assert!(!d.decide("f", 1).unwrap().allowed());
    c.sync().await.unwrap();
    assert_eq!(c.decide("f", 0).unwrap().estimate(), 6.0, "c learned of d's count");
}

/// With `instances` set, a new key is decided on each instance's share of
/// the limit until its second sync: a flood of a new key on four instances
/// at once admits the limit in all, not four times it; then every instance
/// sees the whole count.
#[tokio::test]
async fn a_new_key_is_decided_on_the_instance_share_until_its_second_sync() {
    let server = RedisServer::start();
    let policy = sliding_window(100, Duration::from_secs(60), 8, Weighting::Conservative);
    let clock = ManualClock::new(1_700_000_000_000_000_000);
    let mut opts = options();
    opts.instances = 4;
    let mut instances = Vec::new();
    for _ in 0..4 {
        instances.push(hybrid(&server, policy, &clock, opts).await);
    }
    let mut admitted = 0;
    for h in &instances {
        for _ in 0..100 {
            admitted += u64::from(h.decide("new", 1).unwrap().allowed());
        }
    }
    assert_eq!(admitted, 100, "25 each");
    // First syncs, one after the other: the first instance hears only its
    // own 25, but still decides on its share, used up.
    for h in &instances {
        h.sync().await.unwrap();
    }
    for h in &instances {
        let d = h.decide("new", 1).unwrap();
        assert!(!d.allowed());
        assert_eq!(d.limit(), 25, "the share until the second sync");
    }
    // The refusals ask for a refresh: after the second sync every view
    // holds the whole count, on the whole limit.
    for h in &instances {
        h.sync().await.unwrap();
    }
    for h in &instances {
        let d = h.decide("new", 1).unwrap();
        assert!(!d.allowed());
        assert_eq!(d.limit(), 100);
        assert_eq!(d.estimate(), 100.0);
    }
    // Alone (instances 1), a new key gets the whole limit at once.
    let alone = hybrid(&server, policy, &clock, options()).await;
    let first: u64 = (0..100)
        .map(|_| u64::from(alone.decide("other", 1).unwrap().allowed()))
        .sum();
    assert_eq!(first, 100);
}

/// A connection that, once armed, holds the next command it is given until
/// the test opens it: a sync caught on its way to Redis.
#[derive(Clone)]
struct Gated {
    conn: MultiplexedConnection,
    gate: Arc<Gate>,
}

#[derive(Default)]
struct Gate {
    armed: AtomicBool,
    held: Notify,
    open: Notify,
}

impl Gated {
    async fn pass(&self) {
        if self.gate.armed.swap(false, Ordering::SeqCst) {
            self.gate.held.notify_one();
            self.gate.open.notified().await;
        }
    }
}

impl ConnectionLike for Gated {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            self.pass().await;
            self.conn.req_packed_command(cmd).await
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            self.pass().await;
            self.conn.req_packed_commands(pipeline, offset, count).await
        })
    }

    fn get_db(&self) -> i64 {
        self.conn.get_db()
    }
}

/// A reset while a sync is on its way: the sync's counts, made before the
/// reset, reach neither Redis nor the view after it (they did once, when
/// the reset did not wait for the sync: the key came back with its old
/// counts). In both modes, the plain and the bounded.
#[tokio::test]
async fn a_reset_is_not_undone_by_a_sync_on_its_way() {
    let server = RedisServer::start();
    let policy = sliding_window(10, Duration::from_secs(60), 4, Weighting::Conservative);
    for bounded in [false, true] {
        let clock = ManualClock::new(1_700_000_000_000_000_000);
        let gate = Arc::new(Gate::default());
        let conn = Gated {
            conn: server.conn().await,
            gate: Arc::clone(&gate),
        };
        let redis = RedisStore::new(conn, PREFIX, Duration::from_secs(2))
            .unwrap()
            .with_clock(RedisClock::client(clock.clone()));
        let mut options = if bounded {
            HybridOptions::leased(Duration::from_millis(50))
        } else {
            options()
        };
        // The sync is held by the test, not by Redis: no timeout in the way.
        options.sync_timeout = Duration::from_secs(3600);
        let h = HybridLimiter::new(redis, policy, options).unwrap();
        let key = if bounded { "bounded" } else { "plain" };
        if bounded {
            // A first sync, so that the instance holds a lease to spend.
            assert!(!h.decide(key, 10).unwrap().allowed(), "no lease before the first sync");
            h.sync().await.unwrap();
        }
        let spent = (0..6).filter(|_| h.decide(key, 1).unwrap().allowed()).count();
        assert!(spent > 0, "{key}: something admitted before the reset");

        gate.armed.store(true, Ordering::SeqCst);
        let sync = tokio::spawn({
            let h = h.clone();
            async move { h.sync().await }
        });
        gate.held.notified().await;
        let reset = tokio::spawn({
            let h = h.clone();
            let key = key.to_owned();
            async move { h.reset(&key).await }
        });
        // Let the reset go as far as it can while the sync is held.
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        gate.open.notify_one();
        sync.await.unwrap().unwrap();
        reset.await.unwrap().unwrap();

        let left: Vec<String> = server
            .keys_and_ttls()
            .into_iter()
            .map(|(k, _)| k)
            .filter(|k| k.contains(key))
            .collect();
        assert!(
            left.is_empty(),
            "{key}: Redis holds nothing made before the reset: {left:?}"
        );
        if bounded {
            assert!(!h.decide(key, 10).unwrap().allowed(), "no lease before the next sync");
        }
        h.sync().await.unwrap();
        let admitted = (0..20).filter(|_| h.decide(key, 1).unwrap().allowed()).count();
        assert_eq!(admitted, 10, "{key}: the whole limit after the reset");
    }
}
