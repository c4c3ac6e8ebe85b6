//! [`RedisStore`] as a [`Store`]: one script call decides a request against
//! every limit of its key, all or nothing, figure for figure as the core's
//! states under `decide_all`'s rule; charges after the fact, resets; on one
//! server, a Cluster, a Sentinel-found primary, and under [`FailOver`]
//! through an outage. Every decision runs on a manual client clock.

use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use slidegate_conformance::Figures;
use slidegate_conformance::redis::{RedisCluster, RedisSentinel, RedisServer};
use slidegate_core::{Algorithm, LimitState, ManualClock, Policy, State, Weighting};
use slidegate_redis::{Batching, RedisClock, RedisStore, microsecond_policy};
use slidegate_store::{Decisions, FailOver, FailurePolicy, Quota, Store, StoreError, decide_all};
use std::sync::Arc;
use std::time::Duration;

/// The prefix of every key these tests write.
const PREFIX: &str = "slidegate:test:";

/// A realistic start: 2023-11-14 in µs since the epoch.
const T0_US: u64 = 1_700_000_000_000_000;

const TIMEOUT: Duration = Duration::from_secs(2);

fn policy(limit: u64, window: Duration, algorithm: Algorithm) -> Policy {
    Policy::new(limit, window, algorithm).unwrap()
}

fn quotas(policies: &[Policy]) -> Vec<Quota> {
    policies.iter().copied().map(Quota::new).collect()
}

/// One of each algorithm with a Redis form, both weightings.
fn every_algorithm() -> Vec<Policy> {
    let s = Duration::from_secs;
    vec![
        policy(5, s(1), Algorithm::FixedWindow),
        policy(10, s(1), Algorithm::Gcra { burst: 3 }),
        policy(6, Duration::from_millis(1500), Algorithm::SlidingLog),
        policy(
            7,
            s(2),
            Algorithm::SlidingWindow {
                buckets: 4,
                weighting: Weighting::Interpolated,
            },
        ),
        policy(
            7,
            s(2),
            Algorithm::SlidingWindow {
                buckets: 5,
                weighting: Weighting::Conservative,
            },
        ),
    ]
}

/// The limits of the concurrency tests: 5 per minute and 7 per hour.
fn minute_and_hour() -> Vec<Quota> {
    quotas(&[
        policy(
            5,
            Duration::from_secs(60),
            Algorithm::SlidingWindow {
                buckets: 6,
                weighting: Weighting::Conservative,
            },
        ),
        policy(7, Duration::from_secs(3600), Algorithm::SlidingLog),
    ])
}

/// A store over `server`'s own multiplexed connection on `clock`.
async fn store(server: &RedisServer, clock: &ManualClock) -> RedisStore {
    RedisStore::new(server.conn().await, PREFIX, TIMEOUT)
        .unwrap()
        .with_clock(RedisClock::client(clock.clone()))
}

/// A store over a connection to `cluster` on `clock`, backing off per
/// slot range.
async fn cluster_store(cluster: &RedisCluster, clock: &ManualClock) -> RedisStore<ClusterConnection> {
    let conn = ClusterClient::new(cluster.urls())
        .unwrap()
        .get_async_connection()
        .await
        .unwrap();
    RedisStore::new(conn, PREFIX, TIMEOUT)
        .unwrap()
        .with_clock(RedisClock::client(clock.clone()))
        .with_backoff_per_slot_range()
}

/// The core's states of a key, one per limit, decided by `decide_all`'s
/// rule on each limit's microsecond policy at times in µs: what the store
/// must answer.
struct Oracle {
    micro: Vec<Policy>,
    states: Vec<State>,
}

impl Oracle {
    fn new(policies: &[Policy]) -> Oracle {
        let micro: Vec<Policy> = policies.iter().map(|p| microsecond_policy(p).unwrap()).collect();
        let states = micro.iter().map(State::new).collect();
        Oracle { micro, states }
    }

    fn decide(&mut self, now_us: u64, cost: u64) -> Decisions {
        let mut out = Decisions::new();
        let (micro, states) = (&self.micro, &mut self.states);
        decide_all(micro.len(), cost, &mut out, |j, c| {
            states[j].check(&micro[j], now_us, c).scale_time(1000)
        });
        out
    }

    fn charge(&mut self, now_us: u64, cost: u64) {
        for (state, micro) in self.states.iter_mut().zip(&self.micro) {
            state.record(micro, now_us, cost);
        }
    }
}

/// A small deterministic generator (a 64-bit LCG's high bits).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }
}

/// Runs 400 requests (peeks, decisions, an over-large cost now and then,
/// charges after the fact) on `key` against `policies`, in the store and
/// in the oracle, and compares every decision's figures (what a caller
/// sees: two decisions built differently can show the same figures).
///
/// Answers how many requests with a cost passed, were refused, and were
/// refused by some limits while others would have passed.
async fn same_as_core(
    store: &RedisStore,
    clock: &ManualClock,
    key: &str,
    policies: &[Policy],
    seed: u64,
) -> (u32, u32, u32) {
    let mut seen = (0, 0, 0);
    let limits = quotas(policies);
    let mut oracle = Oracle::new(policies);
    let mut rng = Lcg(seed);
    let mut now_us = T0_US;
    let mut out = Decisions::new();
    for step in 0..400 {
        let r = rng.next();
        now_us += match r % 4 {
            0 => 0,
            1 => rng.next() % 1_000,
            2 => rng.next() % 300_000,
            _ => rng.next() % 2_500_000,
        };
        clock.set(now_us * 1000);
        let cost = match rng.next() % 10 {
            0 => 0,
            1 => 20,
            n => n % 3 + 1,
        };
        if rng.next().is_multiple_of(8) {
            store.charge(key, &limits, cost).await.unwrap();
            oracle.charge(now_us, cost);
            continue;
        }
        store.decide(key, &limits, cost, &mut out).await.unwrap();
        let got: Vec<Figures> = out.iter().map(Figures::of).collect();
        let want: Vec<Figures> = oracle.decide(now_us, cost).iter().map(Figures::of).collect();
        assert_eq!(got, want, "step {step}: {cost} at {now_us} µs on {policies:?}");
        if cost > 0 {
            let passed = got.iter().filter(|f| f.allowed).count();
            match passed {
                p if p == got.len() => seen.0 += 1,
                0 => seen.1 += 1,
                _ => seen.2 += 1,
            }
        }
    }
    seen
}

#[tokio::test]
async fn decisions_are_the_cores_for_one_limit_and_several() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0_US * 1000);
    let store = store(&server, &clock).await;
    let all = every_algorithm();
    for (i, p) in all.iter().enumerate() {
        let (passed, refused, _) = same_as_core(
            &store,
            &clock,
            &format!("one:{i}"),
            std::slice::from_ref(p),
            7 + i as u64,
        )
        .await;
        assert!(passed > 20 && refused > 20, "{p}: {passed} passed, {refused} refused");
    }
    for (key, limits, seed) in [("all", &all[..], 42), ("two", &all[1..3], 43)] {
        let (passed, refused, mixed) = same_as_core(&store, &clock, key, limits, seed).await;
        assert!(
            passed > 10 && mixed > 10,
            "{key}: {passed} passed, {refused} refused, {mixed} mixed"
        );
    }
}

/// 16 tasks, one request each, at one instant on one key limited to 5 per
/// minute and 7 per hour: exactly 5 pass, and the hour's limit holds
/// exactly those 5.
async fn exactly_five_of_sixteen<C>(store: RedisStore<C>, key: &str)
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    let limits = Arc::new(minute_and_hour());
    let barrier = Arc::new(tokio::sync::Barrier::new(16));
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let (store, limits, barrier, key) = (store.clone(), limits.clone(), barrier.clone(), key.to_owned());
            tokio::spawn(async move {
                let mut out = Decisions::new();
                barrier.wait().await;
                store.decide(&key, &limits, 1, &mut out).await.unwrap();
                assert_eq!(out.len(), 2);
                out.iter().all(|d| d.allowed())
            })
        })
        .collect();
    let mut admitted = 0;
    for task in tasks {
        admitted += usize::from(task.await.unwrap());
    }
    assert_eq!(admitted, 5);
    let mut out = Decisions::new();
    store.decide(key, &limits, 0, &mut out).await.unwrap();
    assert_eq!(out[0].remaining(), 0, "the minute's limit is spent");
    assert_eq!(out[1].limit(), 7);
    assert_eq!(out[1].remaining(), 2, "the hour's limit holds exactly 5");
    // A refused request charged neither limit.
    store.decide(key, &limits, 1, &mut out).await.unwrap();
    assert!(!out[0].allowed() && out[0].retry_after().is_some());
    assert!(out[1].allowed(), "the hour's limit shows its peek");
    assert_eq!(out[1].remaining(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_tasks_two_limits_admit_exactly_five() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0_US * 1000);
    exactly_five_of_sixteen(store(&server, &clock).await, "user:16").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_tasks_two_limits_admit_exactly_five_on_a_cluster() {
    let cluster = RedisCluster::start();
    let clock = ManualClock::new(T0_US * 1000);
    let store = cluster_store(&cluster, &clock).await;
    exactly_five_of_sixteen(store.clone(), "user:cluster").await;
    // Every key of the request in one slot, on one master.
    let keys: Vec<String> = minute_and_hour()
        .iter()
        .flat_map(|q| store.redis_keys("user:cluster", q))
        .collect();
    assert_eq!(keys.len(), 3);
    let slot = cluster.slot(&keys[0]);
    for k in &keys {
        assert_eq!(cluster.slot(k), slot, "{k}");
        assert_eq!(cluster.holders(k).len(), 1, "{k}");
    }
    assert_eq!(cluster.holders(&keys[0]), cluster.holders(&keys[2]));
}

#[tokio::test]
async fn a_charge_after_the_fact_goes_past_the_limit_and_refuses_the_next() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0_US * 1000);
    let store = store(&server, &clock).await;
    let minute = Duration::from_secs(60);
    for (i, p) in [
        policy(10, minute, Algorithm::FixedWindow),
        policy(10, minute, Algorithm::Gcra { burst: 10 }),
        policy(10, minute, Algorithm::SlidingLog),
        policy(
            10,
            minute,
            Algorithm::SlidingWindow {
                buckets: 6,
                weighting: Weighting::Interpolated,
            },
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let limits = quotas(&[p]);
        let key = format!("charged:{i}");
        let mut out = Decisions::new();
        store.decide(&key, &limits, 3, &mut out).await.unwrap();
        assert!(out[0].allowed(), "{p}");
        store.charge(&key, &limits, 20).await.unwrap();
        store.decide(&key, &limits, 0, &mut out).await.unwrap();
        assert_eq!(out[0].remaining(), 0, "{p}");
        assert!(out[0].estimate() >= 23.0, "{p}: {}", out[0].estimate());
        store.decide(&key, &limits, 1, &mut out).await.unwrap();
        assert!(!out[0].allowed(), "{p}");
        assert!(out[0].retry_after().is_some(), "{p}");
    }
}

#[tokio::test]
async fn reset_forgets_every_limit_of_the_key() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0_US * 1000);
    let store = store(&server, &clock).await;
    let limits = quotas(&every_algorithm());
    let mut out = Decisions::new();
    assert!(!store.reset("fresh", &limits).await.unwrap(), "nothing held");
    for _ in 0..3 {
        store.decide("spent", &limits, 1, &mut out).await.unwrap();
    }
    store.decide("spent", &limits, 3, &mut out).await.unwrap();
    assert!(!out.iter().all(|d| d.allowed()));
    assert!(store.reset("spent", &limits).await.unwrap());
    assert!(server.keys_and_ttls().is_empty(), "{:?}", server.keys_and_ttls());
    store.decide("spent", &limits, 3, &mut out).await.unwrap();
    assert!(out.iter().all(|d| d.allowed()), "{out:?}");
}

#[tokio::test]
async fn limits_without_a_redis_form_are_unsupported() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0_US * 1000);
    let store = store(&server, &clock).await;
    let histogram = Quota::new(policy(
        10,
        Duration::from_secs(1),
        Algorithm::ExponentialHistogram { epsilon: 0.1 },
    ));
    let err = store.supports(&histogram).unwrap_err();
    assert!(
        matches!(err, StoreError::Unsupported { ref policy, .. } if policy.contains("exponential_histogram")),
        "{err}"
    );
    let mut out = Decisions::new();
    let err = store.decide("k", &[histogram], 1, &mut out).await.unwrap_err();
    assert!(matches!(err, StoreError::Unsupported { .. }), "{err}");
    assert!(store.supports(&Quota::new(every_algorithm()[0])).is_ok());
    let err = store.decide("k", &[], 1, &mut out).await.unwrap_err();
    assert!(matches!(err, StoreError::NoQuota), "{err}");
    assert_eq!(store.stats().errors, 0);
}

#[tokio::test]
async fn a_decision_through_the_primary_a_sentinel_names() {
    let sentinel = RedisSentinel::start();
    let clock = ManualClock::new(T0_US * 1000);
    let store = RedisStore::connect_sentinel(vec![sentinel.url()], RedisSentinel::MASTER, PREFIX, TIMEOUT)
        .await
        .unwrap()
        .with_clock(RedisClock::client(clock.clone()));
    let limits = minute_and_hour();
    let mut out = Decisions::new();
    store.decide("user:sentinel", &limits, 2, &mut out).await.unwrap();
    assert!(out.iter().all(|d| d.allowed()));
    assert_eq!(out[1].remaining(), 5);
    let keys = sentinel.primary.keys_and_ttls();
    assert_eq!(keys.len(), 3, "{keys:?}");
    assert!(keys.iter().all(|(k, _)| k.contains("{user:sentinel}")), "{keys:?}");
}

#[tokio::test]
async fn fail_closed_through_an_outage_then_back_to_redis() {
    const BACKOFF: Duration = Duration::from_millis(50);
    let server = RedisServer::start();
    let clock = ManualClock::new(T0_US * 1000);
    let redis = RedisStore::connect(&server.url(), PREFIX, Duration::from_millis(200))
        .await
        .unwrap()
        .with_clock(RedisClock::client(clock.clone()))
        .with_backoff(BACKOFF);
    let store = FailOver::new(redis, FailurePolicy::Closed);
    let limits = minute_and_hour();
    let mut out = Decisions::new();
    store.decide("user:outage", &limits, 1, &mut out).await.unwrap();
    assert!(out.iter().all(|d| d.allowed()));
    assert_eq!(store.stats().failover.store_admitted, 1);

    let port = server.kill();
    for _ in 0..5 {
        store.decide("user:outage", &limits, 1, &mut out).await.unwrap();
        assert!(out.iter().all(|d| !d.allowed() && d.retry_after().is_some()), "{out:?}");
    }
    let stats = store.stats();
    assert_eq!(stats.failover.fail_closed, 5, "{stats:?}");
    assert_eq!(stats.failover.outages, 5, "{stats:?}");
    assert!(stats.errors >= 1, "{stats:?}");

    // Back on the same port: the connection manager reconnects by itself.
    let server = RedisServer::start_on(port, &[]).unwrap();
    let start = std::time::Instant::now();
    loop {
        store.decide("user:outage", &limits, 1, &mut out).await.unwrap();
        if store.stats().failover.store_admitted == 2 {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "Redis never came back");
        tokio::time::sleep(BACKOFF).await;
    }
    assert!(out.iter().all(|d| d.allowed()));
    // The restarted server holds only what was decided after the restart.
    store.decide("user:outage", &limits, 0, &mut out).await.unwrap();
    assert_eq!(out[1].remaining(), 6);
    drop(server);
}

#[tokio::test]
async fn after_a_sentinel_failover_decisions_go_to_the_new_primary() {
    let mut sentinel = RedisSentinel::start_with_replica();
    let clock = ManualClock::new(T0_US * 1000);
    let store = RedisStore::connect_sentinel(vec![sentinel.url()], RedisSentinel::MASTER, PREFIX, TIMEOUT)
        .await
        .unwrap()
        .with_clock(RedisClock::client(clock.clone()))
        .with_backoff(Duration::from_millis(20));
    let limits = minute_and_hour();
    let mut out = Decisions::new();
    store.decide("user:failover", &limits, 1, &mut out).await.unwrap();
    assert!(out.iter().all(|d| d.allowed()));

    sentinel.failover();
    // The old primary still takes writes until the sentinel makes it a
    // replica (they are lost in its resync); the connection asks the
    // sentinel again within a second, and the next decisions reach the
    // new primary.
    let promoted = sentinel.replica.as_ref().unwrap();
    let sum = store.redis_keys("user:failover", &limits[1]).pop().unwrap();
    assert!(sum.ends_with(":sum"), "{sum}");
    let start = std::time::Instant::now();
    loop {
        let decided = store.decide("user:failover", &limits, 1, &mut out).await;
        if decided.is_ok() && promoted.cli(&["GET", &sum]).parse::<u64>().unwrap_or(0) >= 2 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no decision on the new primary: {decided:?}; old primary {}, new {}",
            sentinel.primary.cli(&["ROLE"]),
            promoted.cli(&["ROLE"])
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(out.iter().all(|d| d.allowed()), "{out:?}");
    assert!(promoted.cli(&["ROLE"]).starts_with("master"));
}

/// One request of a wave: a decision at `cost`, or a charge after the fact.
#[derive(Clone, Copy, Debug)]
enum Ask {
    Decide(u64),
    Charge(u64),
}

/// Waves of concurrent requests on three keys under `batching`: every
/// request of a wave starts at one instant (a task each, spawned in order,
/// on this test's one thread), so all but the first on each lane wait for
/// the call in flight and go together in the next. Each decision must be
/// the oracle's for the requests on its key taken one by one in the order
/// they were spawned, figure for figure; and the calls must be at most two
/// a wave on each lane (the first alone, then the rest together; fewer when
/// the lane's task, still waiting for more after the last wave's call,
/// takes the first too). Answers (calls, requests) as the store counted
/// them.
async fn waves_decide_in_order(batching: Batching, seed: u64) -> (u64, u64) {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0_US * 1000);
    let store = store(&server, &clock).await.with_batching(batching);
    let all = every_algorithm();
    // Each key its own limits: several at once, one alone, and two.
    let limits: Vec<(&str, Vec<Policy>)> = vec![("a", all.clone()), ("b", vec![all[2]]), ("c", vec![all[0], all[4]])];
    let mut oracles: Vec<Oracle> = limits.iter().map(|(_, p)| Oracle::new(p)).collect();
    let mut rng = Lcg(seed);
    let mut now_us = T0_US;
    // The most calls the lanes allow.
    let (mut want_calls, mut sent) = (0, 0);
    for wave in 0..30 {
        now_us += rng.next() % 700_000;
        clock.set(now_us * 1000);
        let asks: Vec<(usize, Ask)> = (0..1 + rng.next() % 40)
            .map(|_| {
                let key = (rng.next() % 3) as usize;
                let cost = match rng.next() % 10 {
                    0 => 0,
                    1 => 9,
                    n => n % 3 + 1,
                };
                let ask = if rng.next().is_multiple_of(6) {
                    Ask::Charge(cost)
                } else {
                    Ask::Decide(cost)
                };
                (key, ask)
            })
            .collect();
        let tasks: Vec<_> = asks
            .iter()
            .map(|&(key, ask)| {
                let (store, name) = (store.clone(), limits[key].0);
                let quotas = quotas(&limits[key].1);
                tokio::spawn(async move {
                    let mut out = Decisions::new();
                    match ask {
                        Ask::Decide(cost) => store.decide(name, &quotas, cost, &mut out).await.unwrap(),
                        Ask::Charge(cost) => store.charge(name, &quotas, cost).await.unwrap(),
                    }
                    out.iter().map(Figures::of).collect::<Vec<_>>()
                })
            })
            .collect();
        for (i, (task, &(key, ask))) in tasks.into_iter().zip(&asks).enumerate() {
            let got = task.await.unwrap();
            let want: Vec<Figures> = match ask {
                Ask::Decide(cost) => oracles[key].decide(now_us, cost).iter().map(Figures::of).collect(),
                Ask::Charge(cost) => {
                    oracles[key].charge(now_us, cost);
                    Vec::new()
                }
            };
            assert_eq!(got, want, "wave {wave}, request {i}: {ask:?} on {}", limits[key].0);
        }
        // The requests that make a call (a charge of 0 makes none), by lane.
        let mut per_lane = [0u64; 3];
        for &(key, ask) in &asks {
            if !matches!(ask, Ask::Charge(0)) {
                let lane = if batching == Batching::PerServer { 0 } else { key };
                per_lane[lane] += 1;
            }
        }
        sent += per_lane.iter().sum::<u64>();
        want_calls += match batching {
            Batching::Off => per_lane.iter().sum::<u64>(),
            // The first alone, then the rest together (at most 64 a call).
            _ => per_lane
                .iter()
                .map(|&n| u64::from(n > 0) + (n.saturating_sub(1)).div_ceil(64))
                .sum(),
        };
    }
    let (calls, requests) = store.script_calls();
    assert_eq!(requests, sent, "every request made once");
    if batching == Batching::Off {
        assert_eq!(calls, want_calls, "{requests} requests in {calls} calls");
    } else {
        assert!(
            calls <= want_calls,
            "{batching:?}: {requests} requests in {calls} calls"
        );
    }
    (calls, requests)
}

#[tokio::test]
async fn coalesced_requests_are_decided_in_order_as_if_alone() {
    let (off, requests) = waves_decide_in_order(Batching::Off, 5).await;
    assert_eq!(off, requests);
    let (per_slot, _) = waves_decide_in_order(Batching::PerSlot, 5).await;
    let (per_server, _) = waves_decide_in_order(Batching::PerServer, 5).await;
    assert!(
        per_server < per_slot && per_slot * 3 < requests,
        "{requests} requests: {per_slot} calls per slot, {per_server} per server"
    );
}

/// Callers in a closed loop on one hot key, each sending its next request
/// as soon as its last is answered (as a busy service's handlers do): once
/// the lane is busy, every call carries every caller, those just answered
/// included, instead of alternating between the callers that waited and
/// those answered by the last call. Every decision is still the oracle's.
#[tokio::test]
async fn callers_answered_by_a_call_join_the_next() {
    const CALLERS: u64 = 16;
    const ROUNDS: u64 = 10;
    let server = RedisServer::start();
    let clock = ManualClock::new(T0_US * 1000);
    let store = store(&server, &clock).await;
    let limit = policy(100, Duration::from_secs(60), Algorithm::FixedWindow);
    let tasks: Vec<_> = (0..CALLERS)
        .map(|_| {
            let (store, limits) = (store.clone(), quotas(&[limit]));
            tokio::spawn(async move {
                let mut admitted = 0;
                for _ in 0..ROUNDS {
                    let mut out = Decisions::new();
                    store.decide("hot", &limits, 1, &mut out).await.unwrap();
                    admitted += u64::from(out[0].allowed());
                }
                admitted
            })
        })
        .collect();
    let mut admitted = 0;
    for task in tasks {
        admitted += task.await.unwrap();
    }
    assert_eq!(admitted, 100, "the limit, exactly, of {} requests", CALLERS * ROUNDS);
    let (calls, requests) = store.script_calls();
    assert_eq!(requests, CALLERS * ROUNDS);
    // The first request alone, then every caller in each call.
    assert_eq!(calls, 1 + ROUNDS, "{requests} requests in {calls} calls");
}

/// How many times Redis ran `command` (scripts' calls included), from
/// `INFO commandstats`.
fn command_calls(server: &RedisServer, command: &str) -> u64 {
    let info = server.cli(&["INFO", "commandstats"]);
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

/// A task per key, spawned in order, each deciding a cost of 1 on its key
/// under `limits`.
fn spawn_decisions(
    store: &RedisStore,
    limits: &[Quota],
    keys: &[&'static str],
) -> Vec<tokio::task::JoinHandle<Result<Decisions, StoreError>>> {
    spawn_decisions_at(store, limits, keys, 1)
}

/// A task per key, spawned in order, each deciding `cost` on its key under
/// `limits`.
fn spawn_decisions_at(
    store: &RedisStore,
    limits: &[Quota],
    keys: &[&'static str],
    cost: u64,
) -> Vec<tokio::task::JoinHandle<Result<Decisions, StoreError>>> {
    keys.iter()
        .map(|&key| {
            let (store, limits) = (store.clone(), limits.to_vec());
            tokio::spawn(async move {
                let mut out = Decisions::new();
                store.decide(key, &limits, cost, &mut out).await.map(|()| out)
            })
        })
        .collect()
}

/// What the requests at `cost` on `keys` ran inside Redis: the calls of
/// `commands`; and how many were admitted.
async fn commands_run(
    server: &RedisServer,
    store: &RedisStore,
    (limits, cost): (&[Quota], u64),
    keys: &[&'static str],
    commands: &[&str],
) -> (u32, Vec<u64>) {
    let before: Vec<u64> = commands.iter().map(|c| command_calls(server, c)).collect();
    let mut admitted = 0;
    for task in spawn_decisions_at(store, limits, keys, cost) {
        admitted += u32::from(task.await.unwrap().unwrap()[0].allowed());
    }
    let ran = commands
        .iter()
        .zip(before)
        .map(|(command, before)| command_calls(server, command) - before)
        .collect();
    (admitted, ran)
}

#[tokio::test]
async fn a_call_of_many_requests_on_one_key_reads_and_writes_its_state_once() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0_US * 1000);
    let store = store(&server, &clock).await;
    let limits = quotas(&[policy(30, Duration::from_secs(60), Algorithm::FixedWindow)]);
    let two = quotas(&[
        policy(30, Duration::from_secs(60), Algorithm::FixedWindow),
        policy(40, Duration::from_secs(60), Algorithm::FixedWindow),
    ]);
    // The scripts loaded, and the figures from here on.
    let mut out = Decisions::new();
    store.decide("warm", &limits, 1, &mut out).await.unwrap();
    store.decide("warm", &two, 1, &mut out).await.unwrap();
    let commands = ["fcall", "hmget", "hgetall", "hset", "hincrby", "pexpire"];
    let calls = store.script_calls();

    // One run of 40 alike (`scripts::ONE`, no cache): its first decision
    // read and written, the 29 passes after it counted in one HINCRBY, the
    // first refusal read; five commands whatever the run's length.
    let (admitted, ran) = commands_run(&server, &store, (&limits, 1), &["hot"; 41], &commands).await;
    let after = store.script_calls();
    assert_eq!(admitted, 30);
    assert_eq!(
        (after.0 - calls.0, after.1 - calls.1),
        (2, 41),
        "the first alone, the other 40 in one call"
    );
    assert_eq!(ran, [2, 3, 0, 2, 1, 2], "{commands:?}");

    // A key under two limits (`scripts::MULTI`): the first alone (each
    // limit peeked, then charged: four reads, two writes, two expiries),
    // then the other 40 in one call, cached: each hash read once (whole),
    // written once, its expiry set once, for all 40.
    let (admitted, ran) = commands_run(&server, &store, (&two, 1), &["both"; 41], &commands).await;
    assert_eq!(admitted, 30);
    let last = store.script_calls();
    assert_eq!((last.0 - after.0, last.1 - after.1), (2, 41));
    assert_eq!(ran, [2, 4, 2, 4, 0, 4], "{commands:?}");

    // Runs that ONE would decide request by request go to MULTI, on its
    // cache: 40 peeks (the first alone, ONE: one read), each reading the
    // hash from the cache, nothing written; and 40 decisions of a `gcra`
    // whose burst exceeds its limit (its remaining is cut to the limit, so
    // no closed form), one read and one write for all 40.
    let (admitted, ran) = commands_run(&server, &store, (&limits, 0), &["peeked"; 41], &commands).await;
    assert_eq!(admitted, 41);
    let peeked = store.script_calls();
    assert_eq!((peeked.0 - last.0, peeked.1 - last.1), (2, 41));
    assert_eq!(ran, [2, 1, 1, 0, 0, 0], "{commands:?}");
    let burst = quotas(&[policy(6, Duration::from_secs(1), Algorithm::Gcra { burst: 15 })]);
    let gcra_commands = ["fcall", "hget", "hgetall", "hset", "hincrby", "pexpire"];
    let (_, ran) = commands_run(&server, &store, (&burst, 1), &["burst"; 41], &gcra_commands).await;
    let after_burst = store.script_calls();
    assert_eq!((after_burst.0 - peeked.0, after_burst.1 - peeked.1), (2, 41));
    // The first alone (ONE: read, write, expiry), then the 40 (MULTI).
    assert_eq!(ran, [2, 1, 1, 2, 0, 2], "{gcra_commands:?}");
    server.assert_every_key_expires();
}

#[tokio::test]
async fn a_failed_call_fails_every_request_in_it_and_writes_nothing() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0_US * 1000);
    let store = store(&server, &clock)
        .await
        .with_batching(Batching::PerServer)
        .with_backoff(Duration::ZERO);
    let limits = quotas(&[policy(30, Duration::from_secs(60), Algorithm::FixedWindow)]);
    // The state of `broken` is not a hash: its script fails.
    let broken = store.redis_keys("broken", &limits[0]).remove(0);
    server.cli(&["SET", &broken, "x", "PX", "60000"]);
    let keys = ["first", "good", "broken", "good"];
    let mut results = Vec::new();
    for task in spawn_decisions(&store, &limits, &keys) {
        results.push(task.await.unwrap());
    }
    assert!(results[0].is_ok(), "the first went alone");
    for (key, result) in keys.iter().zip(&results).skip(1) {
        let err = result.as_ref().unwrap_err();
        assert!(matches!(err, StoreError::Unavailable(_)), "{key}: {err:?}");
        assert!(format!("{:?}", err).contains("WRONGTYPE"), "{key}: {err:?}");
    }
    let good = store.redis_keys("good", &limits[0]).remove(0);
    assert_eq!(
        server.cli(&["EXISTS", &good]),
        "0",
        "nothing of the failed call was written"
    );
    let mut out = Decisions::new();
    store.decide("good", &limits, 1, &mut out).await.unwrap();
    assert_eq!(out[0].remaining(), 29, "the next call counts from nothing");
}

#[tokio::test]
async fn a_request_given_up_while_it_waits_is_left_out_of_the_call() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0_US * 1000);
    let store = store(&server, &clock).await;
    let limits = quotas(&[policy(100, Duration::from_secs(60), Algorithm::FixedWindow)]);
    let tasks = spawn_decisions(&store, &limits, &["hot"; 10]);
    // Every task is queued behind the first's call before this one runs
    // again.
    tokio::task::yield_now().await;
    tasks[4].abort();
    tasks[7].abort();
    let mut finished = 0;
    for task in tasks {
        finished += u32::from(matches!(task.await, Ok(Ok(_))));
    }
    assert_eq!(finished, 8);
    let mut out = Decisions::new();
    store.decide("hot", &limits, 0, &mut out).await.unwrap();
    assert_eq!(out[0].remaining(), 92, "the two given up were never counted");
    assert_eq!(
        store.script_calls(),
        (3, 9),
        "the first, the seven still waiting, the peek"
    );
}

/// Long runs of requests alike (the same key, cost and instant, as the
/// script decides them at once) on keys of one limit (each algorithm with
/// a run path: fixed_window, sliding_window, gcra) and of several:
/// across window and bucket boundaries, through refusals, with peeks,
/// charges and late requests (a second store whose clock lags, on the
/// sliding windows) among them. Every reply must be the oracle's for the requests on its key taken
/// one by one in the order they were spawned, figure for figure.
async fn long_runs(seed: u64) {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0_US * 1000);
    let late_clock = ManualClock::new(T0_US * 1000);
    let store = store(&server, &clock).await.with_batching(Batching::PerServer);
    let late = store.clone().with_clock(RedisClock::client(late_clock.clone()));
    let s = Duration::from_secs;
    let fixed = policy(23, s(1), Algorithm::FixedWindow);
    let interpolated = policy(
        29,
        s(2),
        Algorithm::SlidingWindow {
            buckets: 4,
            weighting: Weighting::Interpolated,
        },
    );
    let conservative = policy(
        31,
        s(3),
        Algorithm::SlidingWindow {
            buckets: 7,
            weighting: Weighting::Conservative,
        },
    );
    let two = policy(
        17,
        s(2),
        Algorithm::SlidingWindow {
            buckets: 2,
            weighting: Weighting::Interpolated,
        },
    );
    let limits: Vec<(&str, Vec<Policy>)> = vec![
        ("fixed", vec![fixed]),
        ("interpolated", vec![interpolated]),
        ("conservative", vec![conservative]),
        ("two", vec![two]),
        ("gcra", vec![policy(20, s(1), Algorithm::Gcra { burst: 12 })]),
        // Its remaining is cut to the limit while the backlog is short.
        ("gcra-burst", vec![policy(6, s(1), Algorithm::Gcra { burst: 15 })]),
        ("several", vec![fixed, interpolated, conservative]),
        (
            "with-gcra",
            vec![two, policy(9, s(1), Algorithm::Gcra { burst: 7 }), fixed],
        ),
    ];
    let mut oracles: Vec<Oracle> = limits.iter().map(|(_, p)| Oracle::new(p)).collect();
    let mut rng = Lcg(seed);
    let mut now_us = T0_US;
    // Runs that passed and then refused, and requests sent late.
    let (mut turned, mut lates) = (0, 0);
    for wave in 0..120 {
        now_us += match rng.next() % 4 {
            0 => 0,
            1 => rng.next() % 5_000,
            2 => rng.next() % 400_000,
            _ => rng.next() % 1_500_000,
        };
        clock.set(now_us * 1000);
        // The late store: up to 1.5 s behind.
        let late_us = now_us - (rng.next() % 1_500_000).min(now_us - T0_US);
        late_clock.set(late_us * 1000);
        // A few runs a wave, each of requests alike: (key, ask, late, length).
        let mut asks: Vec<(usize, Ask, bool)> = Vec::new();
        for _ in 0..1 + rng.next() % 5 {
            let key = (rng.next() % limits.len() as u64) as usize;
            let cost = match rng.next() % 12 {
                0 => 0,
                1 => 40,
                2 => 5,
                n => n % 3 + 1,
            };
            let ask = if rng.next().is_multiple_of(10) {
                Ask::Charge(cost)
            } else {
                Ask::Decide(cost)
            };
            // Late on the sliding windows only: a late fixed_window request
            // is judged in the stored window, where the core refuses it
            // (the crate docs, "Clock").
            let is_late =
                rng.next().is_multiple_of(7) && limits[key].1.iter().all(|p| p.algorithm() != Algorithm::FixedWindow);
            let length = 1 + rng.next() % 30;
            asks.extend((0..length).map(|_| (key, ask, is_late)));
        }
        let tasks: Vec<_> = asks
            .iter()
            .map(|&(key, ask, is_late)| {
                let store = if is_late { late.clone() } else { store.clone() };
                let (name, quotas) = (limits[key].0, quotas(&limits[key].1));
                tokio::spawn(async move {
                    let mut out = Decisions::new();
                    match ask {
                        Ask::Decide(cost) => store.decide(name, &quotas, cost, &mut out).await.unwrap(),
                        Ask::Charge(cost) => store.charge(name, &quotas, cost).await.unwrap(),
                    }
                    out.iter().map(Figures::of).collect::<Vec<_>>()
                })
            })
            .collect();
        let mut previous: Option<(usize, bool)> = None;
        for (i, (task, &(key, ask, is_late))) in tasks.into_iter().zip(&asks).enumerate() {
            let got = task.await.unwrap();
            let at = if is_late { late_us } else { now_us };
            lates += u32::from(is_late && late_us < now_us);
            let want: Vec<Figures> = match ask {
                Ask::Decide(cost) => oracles[key].decide(at, cost).iter().map(Figures::of).collect(),
                Ask::Charge(cost) => {
                    oracles[key].charge(at, cost);
                    Vec::new()
                }
            };
            assert_eq!(
                got, want,
                "wave {wave}, request {i}: {ask:?} at {at} µs on {}",
                limits[key].0
            );
            let passed = !got.is_empty() && got.iter().all(|f| f.allowed);
            if let Some((k, true)) = previous
                && k == key
                && !passed
                && matches!(ask, Ask::Decide(c) if c > 0)
            {
                turned += 1;
            }
            previous = Some((key, passed));
        }
    }
    assert!(
        turned > 10 && lates > 20,
        "{turned} runs turned to refusals, {lates} late requests"
    );
    server.assert_every_key_expires();
}

#[tokio::test]
async fn long_runs_on_one_key_are_decided_as_one_by_one() {
    for seed in [11, 12, 13] {
        long_runs(seed).await;
    }
}

/// On a Cluster (requests grouped per hash slot), a run of 40 requests
/// alike on a hot key under three limits, and one under a single limit,
/// each decided as the core decides them one by one: the passes, then the
/// refusals, figure for figure.
#[tokio::test]
async fn runs_on_a_cluster_are_decided_as_one_by_one() {
    let cluster = RedisCluster::start();
    let clock = ManualClock::new(T0_US * 1000);
    let store = cluster_store(&cluster, &clock).await;
    let minute = Duration::from_secs(60);
    let ring = Algorithm::SlidingWindow {
        buckets: 6,
        weighting: Weighting::Interpolated,
    };
    let three = vec![
        policy(30, minute, Algorithm::FixedWindow),
        policy(25, minute, ring),
        policy(40, minute, Algorithm::Gcra { burst: 20 }),
    ];
    for (key, policies) in [("hot:three", three.clone()), ("hot:one", vec![three[1]])] {
        let mut oracle = Oracle::new(&policies);
        for wave in 0..3u64 {
            let now_us = T0_US + wave * 31_000_000;
            clock.set(now_us * 1000);
            let limits = quotas(&policies);
            let tasks: Vec<_> = (0..40)
                .map(|_| {
                    let (store, limits) = (store.clone(), limits.clone());
                    tokio::spawn(async move {
                        let mut out = Decisions::new();
                        store.decide(key, &limits, 1, &mut out).await.unwrap();
                        out.iter().map(Figures::of).collect::<Vec<_>>()
                    })
                })
                .collect();
            let mut passed = 0;
            for (i, task) in tasks.into_iter().enumerate() {
                let got = task.await.unwrap();
                let want: Vec<Figures> = oracle.decide(now_us, 1).iter().map(Figures::of).collect();
                assert_eq!(got, want, "{key}, wave {wave}, request {i}");
                passed += u32::from(got.iter().all(|f| f.allowed));
            }
            if wave == 0 {
                assert!(passed > 0 && passed < 40, "{key}: {passed} passed");
            }
        }
    }
    // Each wave: the other 39 in one call, the first alone or with them
    // (when the lane's task, still waiting for more after the last wave's
    // call, takes it).
    let (calls, requests) = store.script_calls();
    assert_eq!(requests, 240);
    assert!((6..=12).contains(&calls), "{calls} calls");
}
