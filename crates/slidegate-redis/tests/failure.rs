//! The failure policy against real processes: the server killed in the
//! middle of a run (every call answered within the timeout by the policy),
//! then started again on the same port (decisions come back from Redis by
//! themselves).

mod common;

use common::{PREFIX, RedisServer};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use slidegate_core::{Algorithm, Policy};
use slidegate_redis::{FailurePolicy, FailureStats, RedisLimiter, Source};
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

/// Runs the kill-and-restart scenario under `failure`; `during(i, outcome)`
/// checks the i-th decision while the server is down.
async fn kill_and_restart(failure: FailurePolicy, during: impl Fn(u64, bool, Source)) {
    let server = RedisServer::start();
    let policy = Policy::new(LIMIT, Duration::from_secs(3600), Algorithm::FixedWindow).unwrap();
    let limiter = RedisLimiter::new(manager(&server).await, policy, PREFIX, TIMEOUT)
        .unwrap()
        .with_failure_policy(failure)
        .with_backoff(BACKOFF);
    for _ in 0..3 {
        let outcome = limiter.decide("up", 1).await;
        assert_eq!(outcome.source, Source::Redis);
        assert!(outcome.allowed());
    }
    assert_eq!(limiter.stats(), FailureStats::default());

    let port = server.kill();
    const CHECKS: u64 = 30;
    let start = Instant::now();
    for i in 0..CHECKS {
        let call = Instant::now();
        let outcome = limiter.decide("down", 1).await;
        let took = call.elapsed();
        assert!(took < TIMEOUT + Duration::from_millis(100), "check {i} took {took:?}");
        assert_ne!(outcome.source, Source::Redis, "check {i}");
        during(i, outcome.allowed(), outcome.source);
    }
    let stats = limiter.stats();
    assert_eq!(stats.fallbacks, CHECKS, "every decision while down is a fallback");
    // The backoff spares most calls the attempt: at most one failure per
    // backoff (plus one).
    let most = start.elapsed().as_millis() / BACKOFF.as_millis() + 1;
    assert!(
        stats.failures >= 1 && u128::from(stats.failures) <= most,
        "{stats:?} in {:?}",
        start.elapsed()
    );

    let server = RedisServer::start_on(port, &[]).expect("the port is free again");
    let back = Instant::now();
    let outcome = loop {
        let outcome = limiter.decide("again", 1).await;
        if outcome.source == Source::Redis {
            break outcome;
        }
        assert!(back.elapsed() < Duration::from_secs(10), "Redis never came back");
        // Inside the backoff a call answers at once; let the runtime breathe.
        tokio::task::yield_now().await;
    };
    assert!(outcome.allowed());
    assert_eq!(outcome.decision.remaining(), LIMIT - 1, "counted in Redis again");
    let d = limiter.check("again", 1).await.unwrap();
    assert_eq!(d.remaining(), LIMIT - 2);
    assert_eq!(limiter.decide("again", 1).await.source, Source::Redis);
    drop(server);
}

#[tokio::test]
async fn fail_open_admits_while_redis_is_down() {
    kill_and_restart(FailurePolicy::Open, |i, allowed, source| {
        assert_eq!(source, Source::FailOpen, "check {i}");
        assert!(allowed, "check {i}");
    })
    .await;
}

#[tokio::test]
async fn fail_closed_refuses_while_redis_is_down() {
    kill_and_restart(FailurePolicy::Closed, |i, allowed, source| {
        assert_eq!(source, Source::FailClosed, "check {i}");
        assert!(!allowed, "check {i}");
    })
    .await;
}

/// Two instances share the limit of 10: each admits 5 locally.
#[tokio::test]
async fn local_fallback_counts_its_share_while_redis_is_down() {
    kill_and_restart(FailurePolicy::Local { instances: 2 }, |i, allowed, source| {
        assert_eq!(source, Source::Local, "check {i}");
        assert_eq!(allowed, i < LIMIT.div_ceil(2), "check {i}");
    })
    .await;
}

/// `check` keeps answering errors for callers that decide themselves, and
/// a paused server (no answer at all) is decided within the timeout too.
#[tokio::test]
async fn a_paused_server_is_decided_by_the_policy_within_the_timeout() {
    let server = RedisServer::start();
    let policy = Policy::new(LIMIT, Duration::from_secs(3600), Algorithm::Gcra { burst: 10 }).unwrap();
    let limiter = RedisLimiter::new(server.conn().await, policy, PREFIX, TIMEOUT)
        .unwrap()
        .with_failure_policy(FailurePolicy::Local { instances: 3 })
        .with_backoff(Duration::from_secs(5));
    assert_eq!(limiter.decide("p", 1).await.source, Source::Redis);
    let mut conn = server.sync_conn().unwrap();
    let _: () = redis::cmd("CLIENT").arg("PAUSE").arg(1000).query(&mut conn).unwrap();
    let start = Instant::now();
    let first = limiter.decide("p", 1).await;
    assert!(start.elapsed() >= TIMEOUT && start.elapsed() < TIMEOUT + Duration::from_millis(300));
    assert_eq!(first.source, Source::Local);
    // During the backoff, Redis is not tried: no wait at all. The local
    // share is ⌈10 / 3⌉ = 4 (burst 4).
    let start = Instant::now();
    let admitted: Vec<bool> = local_decisions(&limiter, 5).await;
    assert!(start.elapsed() < Duration::from_millis(50), "{:?}", start.elapsed());
    assert_eq!(admitted, [true, true, true, false, false]);
    assert_eq!(
        limiter.stats(),
        FailureStats {
            failures: 1,
            fallbacks: 6
        }
    );
    let _: () = redis::cmd("CLIENT").arg("UNPAUSE").query(&mut conn).unwrap();
}

/// `n` more decisions for "p", in order.
async fn local_decisions(limiter: &RedisLimiter, n: usize) -> Vec<bool> {
    let mut out = Vec::new();
    for _ in 0..n {
        let outcome = limiter.decide("p", 1).await;
        assert_eq!(outcome.source, Source::Local);
        out.push(outcome.allowed());
    }
    out
}
