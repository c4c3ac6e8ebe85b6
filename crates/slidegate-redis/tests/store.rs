//! The store around the scripts: atomicity, expiry, NOSCRIPT, the server's
//! clock, timeouts, and the policies it refuses.

mod common;

use common::{PREFIX, RedisServer};
use slidegate_core::{Algorithm, ManualClock, Policy, Weighting};
use slidegate_redis::{RedisClock, RedisLimiter, RedisStoreError, microsecond_policy};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Barrier;

fn policy(limit: u64, window: Duration, algorithm: Algorithm) -> Policy {
    Policy::new(limit, window, algorithm).unwrap()
}

/// 64 tasks, each with its own connection, hit one key at once: exactly
/// `limit` are admitted.
async fn exactly_limit_admitted(policy: Policy, clock: RedisClock) {
    const TASKS: usize = 64;
    let server = RedisServer::start();
    let mut limiters = Vec::new();
    for _ in 0..TASKS {
        limiters.push(server.limiter(policy, clock.clone()).await);
    }
    let barrier = Arc::new(Barrier::new(TASKS));
    let tasks: Vec<_> = limiters
        .into_iter()
        .map(|limiter| {
            let barrier = barrier.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                limiter.check("hot", 1).await.unwrap().allowed()
            })
        })
        .collect();
    let mut admitted = 0;
    for task in tasks {
        admitted += u64::from(task.await.unwrap());
    }
    assert_eq!(admitted, policy.limit(), "{policy}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fixed_window_admits_exactly_the_limit_at_once() {
    // The client's clock, stopped: no window boundary falls in the test.
    let clock = RedisClock::client(ManualClock::new(1_000_000_000));
    exactly_limit_admitted(policy(50, Duration::from_secs(3600), Algorithm::FixedWindow), clock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sliding_log_admits_exactly_the_limit_at_once() {
    let policy = policy(50, Duration::from_secs(3600), Algorithm::SlidingLog);
    exactly_limit_admitted(policy, RedisClock::Server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn gcra_admits_exactly_the_limit_at_once() {
    // One more every 72 s: none during the test.
    let policy = policy(50, Duration::from_secs(3600), Algorithm::Gcra { burst: 50 });
    exactly_limit_admitted(policy, RedisClock::Server).await;
}

#[tokio::test]
async fn keys_expire() {
    let server = RedisServer::start();
    let window = Duration::from_millis(200);
    for algorithm in [
        Algorithm::FixedWindow,
        Algorithm::SlidingLog,
        Algorithm::Gcra { burst: 3 },
    ] {
        let limiter = server.limiter(policy(3, window, algorithm), RedisClock::Server).await;
        let key = limiter.redis_key("short");
        assert!(limiter.check("short", 1).await.unwrap().allowed());
        let ttls = server.keys_and_ttls();
        let ttl = ttls.iter().find(|(k, _)| *k == key).unwrap().1;
        // Twice the window, at least 1 s.
        assert!((1..=1000).contains(&ttl), "{algorithm}: {key} has PTTL {ttl}");
        assert!(
            server.wait_gone(&key, Duration::from_secs(5)),
            "{algorithm}: {key} never expired"
        );
        // A fresh start afterwards.
        let d = limiter.check("short", 3).await.unwrap();
        assert!(d.allowed(), "{algorithm}");
        assert_eq!(d.remaining(), 0);
    }
}

#[tokio::test]
async fn refusals_and_peeks_write_nothing() {
    let server = RedisServer::start();
    let policy = policy(1, Duration::from_secs(60), Algorithm::SlidingLog);
    let limiter = server.limiter(policy, RedisClock::Server).await;
    assert!(limiter.check("peek", 0).await.unwrap().allowed());
    assert!(!limiter.check("big", 2).await.unwrap().allowed());
    assert!(
        server.keys_and_ttls().is_empty(),
        "peeks and refusals of a fresh key leave no key"
    );
}

#[tokio::test]
async fn noscript_is_answered_by_loading_and_retrying() {
    let server = RedisServer::start();
    let policy = policy(5, Duration::from_secs(60), Algorithm::FixedWindow);
    let limiter = server.limiter(policy, RedisClock::Server).await;
    assert!(limiter.check("k", 2).await.unwrap().allowed());
    let mut conn = server.sync_conn().unwrap();
    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut conn).unwrap();
    let sha = redis::Script::new(slidegate_redis::scripts::FIXED_WINDOW)
        .get_hash()
        .to_string();
    let cached: Vec<bool> = redis::cmd("SCRIPT").arg("EXISTS").arg(&sha).query(&mut conn).unwrap();
    assert_eq!(cached, [false]);
    let d = limiter.check("k", 2).await.unwrap();
    assert!(d.allowed());
    assert_eq!(d.remaining(), 1, "the count survived the flush");
    let cached: Vec<bool> = redis::cmd("SCRIPT").arg("EXISTS").arg(&sha).query(&mut conn).unwrap();
    assert_eq!(cached, [true], "loaded again");
}

#[tokio::test]
async fn the_server_clock_gives_sane_decisions() {
    let server = RedisServer::start();
    let window = Duration::from_secs(10);
    for algorithm in [
        Algorithm::FixedWindow,
        Algorithm::SlidingLog,
        Algorithm::Gcra { burst: 2 },
    ] {
        let limiter = server.limiter(policy(2, window, algorithm), RedisClock::Server).await;
        let first = limiter.check("s", 1).await.unwrap();
        assert!(first.allowed());
        assert_eq!(first.remaining(), 1, "{algorithm}");
        assert!(
            first.reset_after() > Duration::ZERO && first.reset_after() <= window,
            "{algorithm}"
        );
        assert!(limiter.check("s", 1).await.unwrap().allowed());
        let refused = limiter.check("s", 1).await.unwrap();
        assert!(!refused.allowed(), "{algorithm}");
        assert_eq!(refused.remaining(), 0);
        let retry = refused.retry_after().unwrap();
        assert!(
            retry > Duration::ZERO && retry <= window,
            "{algorithm}: retry after {retry:?}"
        );
        // The count before the refused request: 2 (gcra: a little less).
        assert!(refused.estimate() > 1.0 && refused.estimate() <= 2.0, "{algorithm}");
    }
}

#[tokio::test]
async fn a_paused_server_times_out() {
    let server = RedisServer::start();
    let policy = policy(5, Duration::from_secs(60), Algorithm::Gcra { burst: 5 });
    let timeout = Duration::from_millis(200);
    let limiter = RedisLimiter::new(server.conn().await, policy, PREFIX, timeout).unwrap();
    assert!(limiter.check("p", 1).await.unwrap().allowed());
    let mut conn = server.sync_conn().unwrap();
    let _: () = redis::cmd("CLIENT").arg("PAUSE").arg(2000).query(&mut conn).unwrap();
    let start = Instant::now();
    let err = limiter.check("p", 1).await.unwrap_err();
    let took = start.elapsed();
    assert!(matches!(err, RedisStoreError::Timeout(t) if t == timeout), "{err}");
    assert!(took >= timeout && took < Duration::from_millis(1500), "took {took:?}");
    let _: () = redis::cmd("CLIENT").arg("UNPAUSE").query(&mut conn).unwrap();
    // The connection still serves afterwards.
    assert!(limiter.check("p", 1).await.unwrap().allowed());
}

#[tokio::test]
async fn fixed_window_clamps_a_time_that_goes_back() {
    let server = RedisServer::start();
    let clock = ManualClock::new(0);
    let policy = policy(3, Duration::from_secs(1), Algorithm::FixedWindow);
    let limiter = server.limiter(policy, RedisClock::client(clock.clone())).await;
    clock.set(5_500_000_000);
    assert!(limiter.check("c", 2).await.unwrap().allowed());
    // Back into window 4: judged in window 5, where it is counted.
    clock.set(4_900_000_000);
    let d = limiter.check("c", 1).await.unwrap();
    assert!(d.allowed());
    assert_eq!(d.remaining(), 0);
    assert_eq!(d.estimate(), 2.0);
    assert_eq!(d.reset_after(), Duration::from_millis(1100));
    clock.set(5_600_000_000);
    let d = limiter.check("c", 1).await.unwrap();
    assert!(!d.allowed());
    assert_eq!(d.retry_after(), Some(Duration::from_millis(400)));
}

#[tokio::test]
async fn policies_outside_the_ranges_are_refused() {
    let server = RedisServer::start();
    let unsupported = |p: Policy| matches!(microsecond_policy(&p), Err(RedisStoreError::Unsupported { .. }));
    let secs = Duration::from_secs;
    let ring = Algorithm::SlidingWindow {
        buckets: 2,
        weighting: Weighting::Conservative,
    };
    assert!(unsupported(policy(5, secs(1), ring)));
    assert!(unsupported(policy(
        5,
        secs(1),
        Algorithm::ExponentialHistogram { epsilon: 0.1 }
    )));
    assert!(unsupported(policy(
        5,
        Duration::from_nanos(1500),
        Algorithm::FixedWindow
    )));
    assert!(unsupported(policy(
        5,
        Duration::from_micros((1 << 50) + 1),
        Algorithm::SlidingLog
    )));
    assert!(unsupported(policy((1 << 50) + 1, secs(1), Algorithm::FixedWindow)));
    assert!(!unsupported(policy(
        1 << 50,
        Duration::from_micros(1 << 50),
        Algorithm::FixedWindow
    )));
    // T = 1 µs: (burst + 1)·T must stay within 2⁵⁰.
    assert!(unsupported(policy(
        1 << 20,
        secs(1),
        Algorithm::Gcra { burst: 1 << 50 }
    )));
    assert!(!unsupported(policy(
        1 << 20,
        secs(1),
        Algorithm::Gcra { burst: (1 << 50) - 1 }
    )));
    let err = RedisLimiter::new(server.conn().await, policy(1, secs(1), ring), PREFIX, secs(1)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "no Redis form for `1 per 1s by sliding_window(buckets=2, weighting=conservative)`: sliding_window has no Redis script yet"
    );
    let err = RedisLimiter::new(
        server.conn().await,
        policy(1, secs(1), Algorithm::SlidingLog),
        "a{b}:",
        secs(1),
    );
    assert!(matches!(err, Err(RedisStoreError::Prefix(_))));
    // A client clock beyond 2⁵² µs.
    let limiter = server
        .limiter(
            policy(1, secs(1), Algorithm::SlidingLog),
            RedisClock::client(ManualClock::new(u64::MAX)),
        )
        .await;
    assert!(matches!(
        limiter.check("late", 1).await,
        Err(RedisStoreError::TimeOutOfRange { .. })
    ));
}

#[tokio::test]
async fn keys_carry_the_limited_key_as_their_hash_tag() {
    let server = RedisServer::start();
    let limiter = server
        .limiter(
            policy(1, Duration::from_secs(1), Algorithm::SlidingLog),
            RedisClock::Server,
        )
        .await;
    assert_eq!(limiter.redis_key("user:42"), "slidegate:test:{user:42}:log");
    let limiter = server
        .limiter(
            policy(1, Duration::from_secs(1), Algorithm::Gcra { burst: 1 }),
            RedisClock::Server,
        )
        .await;
    assert_eq!(limiter.redis_key("user:42"), "slidegate:test:{user:42}");
}
