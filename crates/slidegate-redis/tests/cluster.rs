//! The Redis store over a three-master Redis Cluster: every key's state in one
//! slot, keys on every master decided and counted once, atomicity, and a
//! slot move in the middle of a run.

mod common;

use common::{Backend, One, PREFIX, RedisCluster, exactly_limit_admitted};
use slidegate_core::{Algorithm, ManualClock, Policy, Weighting};
use slidegate_redis::RedisClock;
use std::collections::HashMap;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

fn policy(limit: u64, window: Duration, algorithm: Algorithm) -> Policy {
    Policy::new(limit, window, algorithm).unwrap()
}

const CONSERVATIVE_8: Algorithm = Algorithm::SlidingWindow {
    buckets: 8,
    weighting: Weighting::Conservative,
};

/// The algorithms with a script, over a window no test outlives.
fn algorithms() -> [Algorithm; 4] {
    [
        Algorithm::FixedWindow,
        Algorithm::SlidingLog,
        Algorithm::Gcra { burst: 5 },
        CONSERVATIVE_8,
    ]
}

/// The node (0, 1, 2) whose slots hold `slot` right after
/// `--cluster create`.
fn master_of(slot: u16) -> usize {
    match slot {
        0..=5460 => 0,
        5461..=10922 => 1,
        _ => 2,
    }
}

#[tokio::test]
async fn every_key_of_a_limit_is_in_one_slot() {
    let cluster = RedisCluster::start();
    for algorithm in algorithms() {
        let limiter = cluster
            .limiter(policy(5, Duration::from_secs(60), algorithm), RedisClock::Server)
            .await;
        for key in ["user:42", "a", "10.0.0.1", "x:y:z"] {
            let redis_key = limiter.redis_key(key);
            assert_eq!(cluster.slot(&redis_key), cluster.slot(key), "{redis_key}");
        }
    }
    // sliding_log's keys are the only ones with a suffix: `…{k}:log`, `…{k}:sum`.
    let log = cluster
        .limiter(
            policy(5, Duration::from_secs(60), Algorithm::SlidingLog),
            RedisClock::Server,
        )
        .await;
    let tag = log.quota.tag().to_owned();
    assert_eq!(
        log.redis_keys("user:42"),
        [
            format!("{PREFIX}{tag}:{{user:42}}:log"),
            format!("{PREFIX}{tag}:{{user:42}}:sum")
        ]
    );
    for key in log.redis_keys("user:42") {
        assert_eq!(cluster.slot(&key), cluster.slot(&format!("{PREFIX}{{user:42}}")));
    }
}

/// Keys on every master: each is decided exactly (`limit` admitted, then
/// refused) and its state lives on exactly one node, the slot's master.
#[tokio::test]
async fn keys_on_every_master_are_decided_and_counted_once() {
    let cluster = RedisCluster::start();
    // Four keys per master.
    let mut keys: Vec<Vec<String>> = vec![Vec::new(); 3];
    for i in 0.. {
        let key = format!("k{i}");
        let master = master_of(cluster.slot(&key));
        if keys[master].len() < 4 {
            keys[master].push(key);
        }
        if keys.iter().all(|k| k.len() == 4) {
            break;
        }
    }
    let clock = ManualClock::new(1_780_000_000_000_000_000);
    for algorithm in algorithms() {
        let limit = 5;
        let limiter = cluster
            .limiter(
                policy(limit, Duration::from_secs(3600), algorithm),
                RedisClock::client(clock.clone()),
            )
            .await;
        for (master, keys) in keys.iter().enumerate() {
            for key in keys {
                for n in 1..=limit {
                    let d = limiter.check(key, 1).await.unwrap();
                    assert!(d.allowed(), "{algorithm}: {key}, request {n}");
                    assert_eq!(d.remaining(), limit - n, "{algorithm}: {key}");
                }
                assert!(!limiter.check(key, 1).await.unwrap().allowed(), "{algorithm}: {key}");
                assert_eq!(
                    cluster.holders(&limiter.redis_key(key)),
                    [master],
                    "{algorithm}: {key} lives on its slot's master only"
                );
            }
        }
    }
    for node in &cluster.nodes {
        assert!(
            node.keys_and_ttls().len() >= 16,
            "every master holds its keys of each algorithm"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fixed_window_admits_exactly_the_limit_at_once_on_a_cluster() {
    let clock = RedisClock::client(ManualClock::new(1_000_000_000));
    let policy = policy(50, Duration::from_secs(3600), Algorithm::FixedWindow);
    exactly_limit_admitted(&RedisCluster::start(), policy, clock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_algorithm_admits_exactly_the_limit_at_once_on_a_cluster() {
    let cluster = RedisCluster::start();
    let algorithms = [Algorithm::SlidingLog, Algorithm::Gcra { burst: 50 }, CONSERVATIVE_8];
    for (i, algorithm) in algorithms.into_iter().enumerate() {
        // A fresh "hot" key per algorithm: its own prefix.
        let clock = RedisClock::client(ManualClock::new(1_780_000_000_000_000_000 + i as u64));
        let policy = policy(50, Duration::from_secs(3600), algorithm);
        exactly_limit_admitted(&Prefixed(&cluster, i), policy, clock).await;
    }
}

/// A cluster whose stores use their own prefix.
struct Prefixed<'a>(&'a RedisCluster, usize);

impl Backend for Prefixed<'_> {
    type Conn = <RedisCluster as Backend>::Conn;

    async fn conn(&self) -> Self::Conn {
        self.0.conn().await
    }

    fn prefix(&self) -> String {
        format!("{PREFIX}{}:", self.1)
    }
}

/// `redis-cli --cluster reshard` moves 300 slots (0 to 299, with their
/// keys) from the first master to the second while eight tasks keep
/// charging keys in those slots: every decision succeeds (redis-rs follows
/// the `MOVED` and `ASK` redirections), and no count is lost or doubled —
/// each key's count in Redis is what was admitted, and it lives on the
/// second master alone afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slot_move_in_the_middle_of_a_run_keeps_decisions_and_counts() {
    const MOVED: u16 = 300;
    const LIMIT: u64 = 1_000_000;
    let cluster = RedisCluster::start();
    // 40 keys in the slots that move.
    let keys: Vec<String> = (0..)
        .map(|i| format!("m{i}"))
        .filter(|k| cluster.slot(k) < MOVED)
        .take(40)
        .collect();
    let clock = RedisClock::client(ManualClock::new(1_780_000_000_000_000_000));
    let policy = policy(LIMIT, Duration::from_secs(3600), Algorithm::FixedWindow);
    let stop = Arc::new(AtomicBool::new(false));
    let admitted: Arc<Vec<AtomicU64>> = Arc::new(keys.iter().map(|_| AtomicU64::new(0)).collect());
    let decided = Arc::new(AtomicU64::new(0));
    // Woken after every decision (a stored permit: no wake-up is lost).
    let progress = Arc::new(tokio::sync::Notify::new());
    let mut tasks = Vec::new();
    for t in 0..8 {
        let limiter = cluster.limiter(policy, clock.clone()).await;
        let (keys, stop, admitted, decided) = (keys.clone(), stop.clone(), admitted.clone(), decided.clone());
        let progress = progress.clone();
        tasks.push(tokio::spawn(async move {
            let mut i = t;
            while !stop.load(Ordering::Relaxed) {
                let k = i % keys.len();
                let d = limiter.check(&keys[k], 1).await.unwrap();
                assert!(d.allowed());
                admitted[k].fetch_add(1, Ordering::Relaxed);
                decided.fetch_add(1, Ordering::Relaxed);
                progress.notify_one();
                i += 7;
            }
        }));
    }
    // Some keys exist before the move starts. Every wait is bounded: a
    // task that failed makes no progress.
    let until = |n: u64| {
        let (decided, progress) = (decided.clone(), progress.clone());
        async move {
            let reached = async {
                while decided.load(Ordering::Relaxed) < n {
                    progress.notified().await;
                }
            };
            tokio::time::timeout(Duration::from_secs(60), reached)
                .await
                .unwrap_or_else(|_| panic!("fewer than {n} decisions within 60 s"));
        }
    };
    until(200).await;
    let (from, to) = (cluster.node_id(0), cluster.node_id(1));
    let address = format!("127.0.0.1:{}", cluster.nodes[0].port());
    let before = decided.load(Ordering::Relaxed);
    let out = tokio::task::spawn_blocking(move || {
        Command::new("redis-cli")
            .args([
                "--cluster",
                "reshard",
                &address,
                "--cluster-from",
                &from,
                "--cluster-to",
                &to,
            ])
            .args(["--cluster-slots", &MOVED.to_string(), "--cluster-yes"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "reshard failed: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let during = decided.load(Ordering::Relaxed) - before;
    cluster.wait_ok(Duration::from_secs(10));
    // A few more after the move, on the new owner.
    let after = decided.load(Ordering::Relaxed);
    until(after + 200).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.unwrap();
    }
    assert!(during > 0, "no decision while the slots moved");
    let mut by_node: HashMap<usize, usize> = HashMap::new();
    let mut conn = cluster.conn().await;
    let counted = One::new(cluster.store(RedisClock::Server).await, policy);
    for (k, key) in keys.iter().enumerate() {
        let redis_key = counted.redis_key(key);
        for holder in cluster.holders(&redis_key) {
            *by_node.entry(holder).or_default() += 1;
        }
        let count: u64 = redis::cmd("HGET")
            .arg(&redis_key)
            .arg("c")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(count, admitted[k].load(Ordering::Relaxed), "{key}: counted once");
    }
    assert_eq!(
        by_node,
        HashMap::from([(1, keys.len())]),
        "every key moved to the second master"
    );
}
