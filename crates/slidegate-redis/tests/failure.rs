//! The failure policy (`slidegate_store::FailOver`) over a `RedisStore`
//! against real processes: the server killed in the middle of a run (every
//! call answered within the timeout by the policy, and counted by source),
//! then started again on the same port (decisions come back from Redis by
//! themselves).

mod common;

use common::{PREFIX, RedisServer};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use slidegate_core::{Algorithm, Decision, ManualClock, Policy};
use slidegate_memory::{Budget, MemoryStore};
use slidegate_redis::{RedisClock, RedisStore};
use slidegate_store::{Decisions, FailOver, FailOverStats, FailurePolicy, Quota, Source, Store, StoreError};
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_millis(200);
const BACKOFF: Duration = Duration::from_millis(50);
const LIMIT: u64 = 10;

/// A connection that reconnects by itself, quickly.
async fn manager(server: &RedisServer) -> ConnectionManager {
    let config = ConnectionManagerConfig::new()
        .set_number_of_retries(1)
        .set_max_delay(Duration::from_millis(50))
        .set_connection_timeout(Some(TIMEOUT))
        .set_response_timeout(Some(TIMEOUT));
    redis::Client::open(server.url())
        .unwrap()
        .get_connection_manager_with_config(config)
        .await
        .unwrap()
}

/// A local store on `clock`, for [`FailurePolicy::Local`].
fn local(clock: &ManualClock) -> MemoryStore<ManualClock> {
    MemoryStore::with_clock(Budget::keys(1000), Budget::keys(1000), clock.clone())
}

/// Who made the one decision between `before` and `after`.
fn source(before: FailOverStats, after: FailOverStats) -> Source {
    let moved = |f: fn(&FailOverStats) -> u64| f(&after) > f(&before);
    let sources = [
        (moved(|s| s.store_admitted + s.store_refused), Source::Store),
        (moved(|s| s.fail_open), Source::FailOpen),
        (moved(|s| s.fail_closed), Source::FailClosed),
        (moved(|s| s.local_admitted + s.local_refused), Source::Local),
    ];
    let [(true, source)] = sources.iter().filter(|(m, _)| *m).copied().collect::<Vec<_>>()[..] else {
        panic!("one decision, one source: {before:?} then {after:?}");
    };
    source
}

/// `store`'s decision of 1 on `key` under `quota`, and who made it.
async fn decide<C, L>(store: &FailOver<RedisStore<C>, L>, key: &str, quota: &Quota) -> (Decision, Source)
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
    L: Store,
{
    let before = store.failover_stats();
    let mut out = Decisions::new();
    store
        .decide(key, std::slice::from_ref(quota), 1, &mut out)
        .await
        .unwrap();
    (out[0], source(before, store.failover_stats()))
}

/// Runs the kill-and-restart scenario on `guarded` (a `FailOver` over a
/// store made by [`store`] on `server`); `during(i, allowed, source)`
/// checks the i-th decision while the server is down.
async fn kill_and_restart<L: Store>(
    server: RedisServer,
    guarded: FailOver<RedisStore<ConnectionManager>, L>,
    during: impl Fn(u64, bool, Source),
) {
    let quota = Quota::new(Policy::new(LIMIT, Duration::from_secs(3600), Algorithm::FixedWindow).unwrap());
    for _ in 0..3 {
        let (d, source) = decide(&guarded, "up", &quota).await;
        assert_eq!(source, Source::Store);
        assert!(d.allowed());
    }
    let mut want = FailOverStats::default();
    want.store_admitted = 3;
    assert_eq!(guarded.failover_stats(), want);
    assert_eq!(guarded.stats().errors, 0);

    let port = server.kill();
    const CHECKS: u64 = 30;
    let start = Instant::now();
    for i in 0..CHECKS {
        let call = Instant::now();
        let (d, source) = decide(&guarded, "down", &quota).await;
        let took = call.elapsed();
        assert!(took < TIMEOUT + Duration::from_millis(100), "check {i} took {took:?}");
        assert_ne!(source, Source::Store, "check {i}");
        during(i, d.allowed(), source);
    }
    let stats = guarded.stats();
    assert_eq!(
        stats.failover.fallbacks(),
        CHECKS,
        "every decision while down is a fallback"
    );
    assert_eq!(stats.failover.outages, CHECKS);
    // The backoff spares most calls the attempt: at most one failure per
    // backoff (plus one).
    let most = start.elapsed().as_millis() / BACKOFF.as_millis() + 1;
    assert!(
        stats.errors >= 1 && u128::from(stats.errors) <= most,
        "{stats:?} in {:?}",
        start.elapsed()
    );

    let server = RedisServer::start_on(port, &[]).expect("the port is free again");
    let back = Instant::now();
    let d = loop {
        let (d, source) = decide(&guarded, "again", &quota).await;
        if source == Source::Store {
            break d;
        }
        assert!(back.elapsed() < Duration::from_secs(10), "Redis never came back");
        // Inside the backoff a call answers at once; let the runtime breathe.
        tokio::task::yield_now().await;
    };
    assert!(d.allowed());
    assert_eq!(d.remaining(), LIMIT - 1, "counted in Redis again");
    // The wrapped store answers its own decisions, errors included, for
    // callers that decide themselves.
    let mut out = Decisions::new();
    guarded
        .inner()
        .decide("again", std::slice::from_ref(&quota), 1, &mut out)
        .await
        .unwrap();
    assert_eq!(out[0].remaining(), LIMIT - 2);
    assert_eq!(decide(&guarded, "again", &quota).await.1, Source::Store);
    drop(server);
}

/// A store on `server` over a reconnecting connection, on `clock`, backing
/// off for [`BACKOFF`].
async fn store(server: &RedisServer, clock: &ManualClock) -> RedisStore<ConnectionManager> {
    RedisStore::new(manager(server).await, PREFIX, TIMEOUT)
        .unwrap()
        .with_clock(RedisClock::client(clock.clone()))
        .with_backoff(BACKOFF)
}

fn clock() -> ManualClock {
    ManualClock::new(1_780_000_000_000_000_000)
}

#[tokio::test]
async fn fail_open_admits_while_redis_is_down() {
    let server = RedisServer::start();
    let guarded = FailOver::new(store(&server, &clock()).await, FailurePolicy::Open);
    kill_and_restart(server, guarded, |i, allowed, source| {
        assert_eq!(source, Source::FailOpen, "check {i}");
        assert!(allowed, "check {i}");
    })
    .await;
}

#[tokio::test]
async fn fail_closed_refuses_while_redis_is_down() {
    let server = RedisServer::start();
    let guarded = FailOver::new(store(&server, &clock()).await, FailurePolicy::Closed);
    kill_and_restart(server, guarded, |i, allowed, source| {
        assert_eq!(source, Source::FailClosed, "check {i}");
        assert!(!allowed, "check {i}");
    })
    .await;
}

/// Two instances share the limit of 10: each admits 5 locally.
#[tokio::test]
async fn local_fallback_counts_its_share_while_redis_is_down() {
    let server = RedisServer::start();
    let clock = clock();
    let guarded = FailOver::local(store(&server, &clock).await, 2, local(&clock));
    kill_and_restart(server, guarded, |i, allowed, source| {
        assert_eq!(source, Source::Local, "check {i}");
        assert_eq!(allowed, i < LIMIT.div_ceil(2), "check {i}");
    })
    .await;
}

/// A paused server (no answer at all) is decided by the policy within the
/// timeout, and the backoff answers the calls after it at once; the
/// wrapped store answers the pause as an error.
#[tokio::test]
async fn a_paused_server_is_decided_by_the_policy_within_the_timeout() {
    let server = RedisServer::start();
    let clock = clock();
    let redis = RedisStore::new(server.conn().await, PREFIX, TIMEOUT)
        .unwrap()
        .with_clock(RedisClock::client(clock.clone()))
        .with_backoff(Duration::from_secs(5));
    let guarded = FailOver::local(redis, 3, local(&clock));
    let quota = Quota::new(Policy::new(LIMIT, Duration::from_secs(3600), Algorithm::Gcra { burst: 10 }).unwrap());
    assert_eq!(decide(&guarded, "p", &quota).await.1, Source::Store);
    let mut conn = server.sync_conn().unwrap();
    let _: () = redis::cmd("CLIENT").arg("PAUSE").arg(1000).query(&mut conn).unwrap();
    let start = Instant::now();
    let first = decide(&guarded, "p", &quota).await;
    assert!(start.elapsed() >= TIMEOUT && start.elapsed() < TIMEOUT + Duration::from_millis(300));
    assert_eq!(first.1, Source::Local);
    // During the backoff, Redis is not tried: no wait at all. The local
    // share is ⌈10 / 3⌉ = 4 (burst 4), from this instance's share of the
    // one unit Redis had counted, ⌈1 / 3⌉ = 1: 3 more in all.
    let start = Instant::now();
    let mut admitted = Vec::new();
    for _ in 0..5 {
        let (d, source) = decide(&guarded, "p", &quota).await;
        assert_eq!(source, Source::Local);
        admitted.push(d.allowed());
    }
    assert!(start.elapsed() < Duration::from_millis(50), "{:?}", start.elapsed());
    assert_eq!(admitted, [true, true, false, false, false]);
    let stats = guarded.stats();
    assert_eq!(stats.errors, 1, "one call met the pause");
    let mut want = FailOverStats::default();
    want.store_admitted = 1;
    want.local_admitted = 3;
    want.local_refused = 3;
    want.outages = 6;
    assert_eq!(stats.failover, want);
    // Alone, the store answers the backoff as an outage.
    let mut out = Decisions::new();
    let err = guarded
        .inner()
        .decide("p", std::slice::from_ref(&quota), 1, &mut out)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Unavailable(_)), "{err}");
    let _: () = redis::cmd("CLIENT").arg("UNPAUSE").query(&mut conn).unwrap();
}
