//! The Redis store around the scripts, one limit at a time: atomicity, expiry, NOSCRIPT, the server's
//! clock, timeouts, and the policies it refuses.

mod common;

use common::{Backend, One, PREFIX, RedisServer};
use slidegate_core::{Algorithm, ManualClock, Policy, Weighting};
use slidegate_redis::{RedisClock, RedisStore, RedisStoreError, microsecond_policy};
use slidegate_store::{Quota, Store, StoreError};
use std::time::{Duration, Instant};

fn policy(limit: u64, window: Duration, algorithm: Algorithm) -> Policy {
    Policy::new(limit, window, algorithm).unwrap()
}

/// 64 tasks, each with its own connection, hit one key at once: exactly
/// `limit` are admitted.
async fn exactly_limit_admitted(policy: Policy, clock: RedisClock) {
    common::exactly_limit_admitted(&RedisServer::start(), policy, clock).await;
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

/// The conservative ring never admits more than the limit in a window: all
/// 64 at one instant (a stopped client clock), exactly the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conservative_sliding_window_admits_exactly_the_limit_at_once() {
    let clock = RedisClock::client(ManualClock::new(1_780_000_000_000_000_000));
    exactly_limit_admitted(policy(50, Duration::from_secs(3600), CONSERVATIVE_8), clock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conservative_sliding_window_admits_exactly_the_limit_on_the_server_clock() {
    // Buckets of about 8.6 minutes: a boundary in the test changes nothing,
    // the oldest bucket counting whole.
    exactly_limit_admitted(
        policy(50, Duration::from_secs(3600), CONSERVATIVE_8),
        RedisClock::Server,
    )
    .await;
}

const CONSERVATIVE_8: Algorithm = Algorithm::SlidingWindow {
    buckets: 8,
    weighting: Weighting::Conservative,
};

/// The ring's hash: `n`, the newest bucket index, and one field per
/// non-empty bucket, named by its index. A peek writes nothing, nor does a
/// refusal that does not move the ring forward.
#[tokio::test]
async fn sliding_window_peeks_and_refusals_write_nothing() {
    let server = RedisServer::start();
    let clock = ManualClock::new(0);
    // Two buckets of 60 s.
    let ring = Algorithm::SlidingWindow {
        buckets: 2,
        weighting: Weighting::Interpolated,
    };
    let limiter = server
        .limiter(
            policy(5, Duration::from_secs(60), ring),
            RedisClock::client(clock.clone()),
        )
        .await;
    let key = limiter.redis_key("r");
    assert_eq!(key, format!("slidegate:test:{}:{{r}}", limiter.quota.tag()));
    clock.set(1_000_000_000);
    assert!(limiter.check("r", 0).await.unwrap().allowed());
    assert!(!limiter.check("r", 6).await.unwrap().allowed());
    assert!(server.keys_and_ttls().is_empty(), "no key for a peek or a refusal");

    // Bucket 2 (120 s to 180 s): 5 counted.
    clock.set(150_000_000_000);
    assert!(limiter.check("r", 5).await.unwrap().allowed());
    let mut conn = server.sync_conn().unwrap();
    let hash = |conn: &mut redis::Connection| -> Vec<(String, String)> {
        let mut h: Vec<(String, String)> = redis::cmd("HGETALL").arg(&key).query(conn).unwrap();
        h.sort();
        h
    };
    let before = hash(&mut conn);
    assert_eq!(before, [("2".into(), "5".into()), ("n".into(), "2".into())]);
    let ttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut conn).unwrap();
    // Twice max((n − 1)·b, (newest + n)·b − now) = 2·(240 − 150) s.
    assert!(ttl > 179_000 && ttl <= 180_000, "PTTL {ttl}");

    // Ten seconds later, still in the newest bucket: a renewed expiry would
    // now be 2·(240 − 160) s = 160 s, so an unchanged one is told apart
    // without waiting.
    clock.set(160_000_000_000);
    let refused = limiter.check("r", 1).await.unwrap();
    assert!(!refused.allowed());
    // The oldest bucket (2) decays from 180 s: 1 fits at 192 s.
    assert_eq!(refused.retry_after(), Some(Duration::from_secs(32)));
    for at in [150_000_000_000, 170_000_000_000, 500_000_000_000, 100_000_000_000] {
        clock.set(at);
        limiter.check("r", 0).await.unwrap();
    }
    assert_eq!(hash(&mut conn), before, "peeks and a refusal in the newest bucket");
    let later: i64 = redis::cmd("PTTL").arg(&key).query(&mut conn).unwrap();
    assert!(later > 170_000 && later <= ttl, "the expiry was renewed: {later} ms");
}

#[tokio::test]
async fn keys_expire() {
    let server = RedisServer::start();
    let window = Duration::from_millis(200);
    for algorithm in [
        Algorithm::FixedWindow,
        Algorithm::SlidingLog,
        Algorithm::Gcra { burst: 3 },
        Algorithm::SlidingWindow {
            buckets: 3,
            weighting: Weighting::Interpolated,
        },
        CONSERVATIVE_8,
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

/// The Redis functions the store has loaded (`FUNCTION LIST`'s library
/// names).
fn libraries(conn: &mut redis::Connection) -> Vec<String> {
    let list: Vec<redis::Value> = redis::cmd("FUNCTION").arg("LIST").query(conn).unwrap();
    let mut names = Vec::new();
    for library in list {
        let fields: Vec<(String, redis::Value)> = redis::FromRedisValue::from_redis_value(library).unwrap();
        for (field, value) in fields {
            if field == "library_name" {
                names.push(redis::FromRedisValue::from_redis_value(value).unwrap());
            }
        }
    }
    names
}

#[tokio::test]
async fn a_flushed_function_is_loaded_again() {
    let server = RedisServer::start();
    let policy = policy(5, Duration::from_secs(60), Algorithm::FixedWindow);
    let limiter = server.limiter(policy, RedisClock::Server).await;
    assert!(limiter.check("k", 2).await.unwrap().allowed());
    let mut conn = server.sync_conn().unwrap();
    // A request alone under one limit: `scripts::ONE`, as its function.
    let one = slidegate_redis::ONE_FUNCTION.name.clone();
    assert_eq!(libraries(&mut conn), std::slice::from_ref(&one));
    assert!(limiter.store.uses_functions());
    let _: () = redis::cmd("FUNCTION").arg("FLUSH").query(&mut conn).unwrap();
    assert!(libraries(&mut conn).is_empty());
    let d = limiter.check("k", 2).await.unwrap();
    assert!(d.allowed());
    assert_eq!(d.remaining(), 1, "the count survived the flush");
    assert_eq!(libraries(&mut conn), [one], "loaded again");
    assert!(limiter.store.uses_functions());
    // No script was sent by EVALSHA.
    let sha = redis::Script::new(slidegate_redis::scripts::ONE).get_hash().to_string();
    let cached: Vec<bool> = redis::cmd("SCRIPT").arg("EXISTS").arg(&sha).query(&mut conn).unwrap();
    assert_eq!(cached, [false]);
}

/// A user whose ACL refuses `FUNCTION` (as some managed servers and
/// proxies do): the store goes by `EVALSHA` from the first call on,
/// deciding the same, and loads its scripts again after `SCRIPT FLUSH`.
#[tokio::test]
async fn without_functions_the_scripts_go_by_evalsha() {
    let server = RedisServer::start();
    let mut conn = server.sync_conn().unwrap();
    let _: () = redis::cmd("ACL")
        .arg(&[
            "SETUSER",
            "nofunctions",
            "on",
            ">secret",
            "~*",
            "&*",
            "+@all",
            "-function",
        ])
        .query(&mut conn)
        .unwrap();
    let url = server.url().replacen("redis://", "redis://nofunctions:secret@", 1);
    let client = redis::Client::open(url).unwrap();
    let store = RedisStore::new(
        client.get_multiplexed_async_connection().await.unwrap(),
        PREFIX,
        Duration::from_secs(5),
    )
    .unwrap();
    let limiter = One::new(store, policy(5, Duration::from_secs(60), Algorithm::FixedWindow));
    assert!(limiter.store.uses_functions(), "until a call finds otherwise");
    assert!(limiter.check("k", 2).await.unwrap().allowed());
    assert!(!limiter.store.uses_functions());
    assert!(libraries(&mut conn).is_empty(), "no library loaded");
    let sha = redis::Script::new(slidegate_redis::scripts::ONE).get_hash().to_string();
    let cached = |conn: &mut redis::Connection| -> Vec<bool> {
        redis::cmd("SCRIPT").arg("EXISTS").arg(&sha).query(conn).unwrap()
    };
    assert_eq!(cached(&mut conn), [true]);
    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut conn).unwrap();
    assert_eq!(cached(&mut conn), [false]);
    let d = limiter.check("k", 2).await.unwrap();
    assert!(d.allowed());
    assert_eq!(d.remaining(), 1, "the count survived the flush");
    assert_eq!(cached(&mut conn), [true], "loaded again");
    let d = limiter.check("k", 2).await.unwrap();
    assert!(!d.allowed(), "the sixth unit is refused");
    assert!(libraries(&mut conn).is_empty());
}

#[tokio::test]
async fn the_server_clock_gives_sane_decisions() {
    let server = RedisServer::start();
    let window = Duration::from_secs(10);
    for algorithm in [
        Algorithm::FixedWindow,
        Algorithm::SlidingLog,
        Algorithm::Gcra { burst: 2 },
        CONSERVATIVE_8,
    ] {
        let policy = policy(2, window, algorithm);
        // Everything counted has left once its bucket leaves the ring: up to
        // one bucket beyond the window.
        let window = Duration::from_nanos(policy.effective_window_ns() + policy.step_ns());
        let limiter = server.limiter(policy, RedisClock::Server).await;
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
    // No backoff: the call after the pause goes to Redis again.
    let store = RedisStore::new(server.conn().await, PREFIX, timeout)
        .unwrap()
        .with_backoff(Duration::ZERO);
    let limiter = One::new(store, policy);
    assert!(limiter.check("p", 1).await.unwrap().allowed());
    let mut conn = server.sync_conn().unwrap();
    let _: () = redis::cmd("CLIENT").arg("PAUSE").arg(2000).query(&mut conn).unwrap();
    let start = Instant::now();
    let err = limiter.check("p", 1).await.unwrap_err();
    let took = start.elapsed();
    assert!(matches!(err, StoreError::Timeout(t) if t == timeout), "{err}");
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
    let ring = |buckets| Algorithm::SlidingWindow {
        buckets,
        weighting: Weighting::Conservative,
    };
    assert!(!unsupported(policy(5, secs(1), ring(2))));
    assert!(!unsupported(policy(5, secs(1), ring(256))));
    assert!(unsupported(policy(5, secs(1), ring(257))));
    // limit·b at most 2⁵⁰: b = 2³⁰ µs (n = 3), limit 2²⁰ and one more.
    assert!(!unsupported(policy(1 << 20, Duration::from_micros(1 << 31), ring(3))));
    assert!(unsupported(policy(
        (1 << 20) + 1,
        Duration::from_micros(1 << 31),
        ring(3)
    )));
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
    let store = server.store(RedisClock::Server).await;
    let err = store.supports(&Quota::new(policy(1, secs(1), ring(2048)))).unwrap_err();
    assert_eq!(
        err.to_string(),
        "the limit `1 per 1s by sliding_window(buckets=2048, weighting=conservative)` cannot be kept in this store: sliding_window takes at most 256 buckets in Redis"
    );
    let limiter = One::new(store, policy(1, secs(1), ring(2048)));
    assert!(matches!(
        limiter.check("k", 1).await,
        Err(StoreError::Unsupported { .. })
    ));
    let err = RedisStore::new(server.conn().await, "a{b}:", secs(1));
    assert!(matches!(err, Err(RedisStoreError::Prefix(_))));
    // A client clock beyond 2⁵² µs.
    let limiter = server
        .limiter(
            policy(1, secs(1), Algorithm::SlidingLog),
            RedisClock::client(ManualClock::new(u64::MAX)),
        )
        .await;
    let Err(StoreError::Unavailable(source)) = limiter.check("late", 1).await else {
        panic!("a clock beyond 2^52 µs is an outage of the store");
    };
    assert!(matches!(
        source.downcast_ref::<RedisStoreError>(),
        Some(RedisStoreError::TimeOutOfRange { .. })
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
    let tag = limiter.quota.tag().to_owned();
    assert_eq!(
        limiter.redis_key("user:42"),
        format!("slidegate:test:{tag}:{{user:42}}:log")
    );
    let limiter = server
        .limiter(
            policy(1, Duration::from_secs(1), Algorithm::Gcra { burst: 1 }),
            RedisClock::Server,
        )
        .await;
    let tag = limiter.quota.tag().to_owned();
    assert_eq!(
        limiter.redis_key("user:42"),
        format!("slidegate:test:{tag}:{{user:42}}")
    );
}

/// `reset` deletes the key's state (the `:log` and `:sum` keys of a
/// sliding log):
/// true if it was held, and the next decision starts afresh.
#[tokio::test]
async fn reset_deletes_the_state_of_a_key() {
    let server = RedisServer::start();
    for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingLog, CONSERVATIVE_8] {
        let limiter = server
            .limiter(policy(2, Duration::from_secs(3600), algorithm), RedisClock::Server)
            .await;
        assert!(limiter.check("k", 2).await.unwrap().allowed());
        assert!(!limiter.check("k", 1).await.unwrap().allowed());
        let mut keys: Vec<String> = server.keys_and_ttls().into_iter().map(|(k, _)| k).collect();
        keys.sort();
        assert_eq!(keys, limiter.redis_keys("k"), "{algorithm}");
        assert!(limiter.reset("k").await.unwrap());
        assert!(server.keys_and_ttls().is_empty());
        assert!(!limiter.reset("k").await.unwrap());
        assert_eq!(limiter.check("k", 1).await.unwrap().remaining(), 1, "{algorithm}");
        assert!(limiter.reset("k").await.unwrap());
    }
}

/// A sliding log whose sum is missing (a log written by an earlier
/// version, or a sum lost on its own) is summed once from the log, then
/// kept beside it; a stray sum without a log counts nothing.
#[tokio::test]
async fn a_sliding_log_without_its_sum_is_summed_from_the_log() {
    let server = RedisServer::start();
    let clock = ManualClock::new(10_000_000_000);
    let limiter = server
        .limiter(
            policy(10, Duration::from_secs(60), Algorithm::SlidingLog),
            RedisClock::client(clock.clone()),
        )
        .await;
    let [log, sum] = <[String; 2]>::try_from(limiter.redis_keys("k")).unwrap();
    let mut conn = server.sync_conn().unwrap();
    // Entries at 9 s (cost 3) and 9.5 s (cost 2), written by hand, no sum.
    redis::cmd("ZADD")
        .arg(&log)
        .arg(9_000_000)
        .arg("9000000:3")
        .arg(9_500_000)
        .arg("9500000:2")
        .query::<()>(&mut conn)
        .unwrap();
    redis::cmd("PEXPIRE")
        .arg(&log)
        .arg(60_000)
        .query::<()>(&mut conn)
        .unwrap();
    let d = limiter.check("k", 1).await.unwrap();
    assert!(d.allowed());
    assert_eq!(d.remaining(), 4, "5 in the log, 1 more");
    let kept: u64 = redis::cmd("GET").arg(&sum).query(&mut conn).unwrap();
    assert_eq!(kept, 6);
    // A stray sum with no log: nothing counts.
    redis::cmd("DEL").arg(&log).query::<()>(&mut conn).unwrap();
    assert_eq!(limiter.check("k", 0).await.unwrap().remaining(), 10);
    assert!(limiter.check("k", 10).await.unwrap().allowed());
    let kept: u64 = redis::cmd("GET").arg(&sum).query(&mut conn).unwrap();
    assert_eq!(kept, 10);
}
