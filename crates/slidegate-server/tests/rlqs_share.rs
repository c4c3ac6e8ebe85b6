//! The quota service's sharing against simulated Envoys, on a manual
//! clock: each Envoy is the model of Envoy's `rate_limit_quota` filter
//! (`common::envoy_quota`: its token bucket, its reports every 5 s, its
//! TTLs), talking to the engine in process, one engine per replica (in
//! memory, or two on one throw-away Redis). Every Envoy's
//! `no_assignment_behavior` is `DENY_ALL` and it has no expired-assignment
//! fallback, so that everything admitted was admitted on slidegate's
//! assignments: what the bound is about.
//!
//! - In every window of length `W`, the Envoys together admit at most `L`,
//!   whatever they ask, however they join, leave or die.
//! - An Envoy alone, asking for more than `L`, admits at least 95 % of `L`
//!   in every window once its first report is answered.
//! - Two Envoys asking 10 % and 200 % of `L`: from the third report of the
//!   later one on, the first is never refused and the second admits the
//!   rest of the rate pool (what the first's share leaves).
//!
//! Each holds with one replica in memory and with two replicas on one
//! throw-away Redis.

mod common;

use common::envoy_quota::{Behaviours, Blanket, EnvoyQuotaClient};
use proptest::prelude::*;
use slidegate_conformance::redis::RedisServer;
use slidegate_core::ManualClock;
use slidegate_server::metrics::Metrics;
use slidegate_server::quota::ledgers::{MemoryLedgers, RedisLedgers};
use slidegate_server::quota::share::Pools;
use slidegate_server::quota::{QuotaMatch, QuotaOptions, QuotaPolicy, QuotaRules, QuotaStream, Quotas};
use slidegate_server::redis_store::RedisOptions;
use std::collections::HashMap;
use std::sync::Arc;

const S: u64 = 1_000_000_000;
const DOMAIN: &str = "edge";
const BUCKET: &[(&str, &str)] = &[("route", "checkout")];

/// One rule for every bucket of `edge`.
struct OneRule {
    limit: u64,
    window_ns: u64,
}

impl QuotaRules for OneRule {
    fn quota_rule(&self, domain: &str, _: &[(&str, &str)]) -> Option<QuotaMatch<'_>> {
        (domain == DOMAIN).then_some(QuotaMatch {
            rule: "checkout",
            policy: QuotaPolicy::Limited {
                limit: self.limit,
                window_ns: self.window_ns,
            },
        })
    }
}

/// What becomes of an Envoy.
#[derive(Debug, Clone, Copy)]
enum Fate {
    /// It runs to the end.
    Stays,
    /// Its requests stop and its stream is closed then.
    Leaves(u64),
    /// It stops then, its stream never closed.
    Dies(u64),
}

/// One Envoy's life: when it starts, its demand over time (until when,
/// requests a second), and its end.
#[derive(Debug, Clone)]
struct Plan {
    join: u64,
    phases: Vec<(u64, f64)>,
    fate: Fate,
    replica: usize,
}

struct Envoy {
    plan: Plan,
    model: EnvoyQuotaClient,
    streams: HashMap<usize, QuotaStream>,
    next_request: u64,
    gone: bool,
    admitted: Vec<u64>,
    denied: Vec<u64>,
}

impl Envoy {
    fn rate_at(&self, t: u64) -> f64 {
        self.plan
            .phases
            .iter()
            .find(|(until, _)| t < *until)
            .map_or(0.0, |(_, rate)| *rate)
    }

    /// The time of its next request at or after `t`, within its phases.
    fn schedule_from(&mut self, t: u64) {
        let mut t = t;
        loop {
            let Some(&(until, rate)) = self.plan.phases.iter().find(|(until, _)| t < *until) else {
                self.next_request = u64::MAX;
                return;
            };
            if rate > 0.0 {
                self.next_request = t;
                return;
            }
            t = until;
        }
    }

    fn end(&self) -> u64 {
        match self.plan.fate {
            Fate::Stays => u64::MAX,
            Fate::Leaves(at) | Fate::Dies(at) => at,
        }
    }
}

/// A run: Envoys on replicas sharing one clock.
struct Sim {
    clock: ManualClock,
    replicas: Vec<Quotas>,
    rules: OneRule,
    metrics: Metrics,
    envoys: Vec<Envoy>,
    runtime: tokio::runtime::Runtime,
}

impl Sim {
    fn new(rules: OneRule, replicas: usize, plans: Vec<Plan>, redis: Option<&RedisServer>) -> Sim {
        let clock = ManualClock::new(0);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let replicas = (0..replicas)
            .map(|_| {
                let ledgers: Box<dyn slidegate_server::quota::ledgers::Ledgers> = match redis {
                    None => Box::new(MemoryLedgers::new(1000)),
                    Some(redis) => {
                        let options = RedisOptions {
                            urls: vec![redis.url()],
                            ..RedisOptions::default()
                        };
                        let (_, probe) = runtime.block_on(options.connect_probed()).unwrap();
                        Box::new(RedisLedgers::new(probe.connection(), options.prefix.clone()))
                    }
                };
                Quotas::new(ledgers, Arc::new(clock.clone()), QuotaOptions::default())
            })
            .collect();
        let envoys = plans
            .into_iter()
            .map(|plan| {
                let mut envoy = Envoy {
                    model: EnvoyQuotaClient::new(
                        DOMAIN,
                        Behaviours {
                            no_assignment: Blanket::DenyAll,
                            expired: None,
                        },
                    ),
                    streams: HashMap::new(),
                    next_request: 0,
                    gone: false,
                    admitted: Vec::new(),
                    denied: Vec::new(),
                    plan,
                };
                envoy.schedule_from(envoy.plan.join);
                envoy
            })
            .collect();
        Sim {
            clock,
            replicas,
            rules,
            metrics: Metrics::new(),
            envoys,
            runtime,
        }
    }

    /// Runs until `end` (ns).
    fn run(&mut self, end: u64) {
        loop {
            let next = self
                .envoys
                .iter()
                .filter(|e| !e.gone)
                .map(|e| {
                    let timers = if e.model.buckets().is_empty() {
                        u64::MAX
                    } else {
                        e.model.next_deadline().unwrap_or(u64::MAX)
                    };
                    e.next_request.min(timers).min(e.end())
                })
                .min()
                .unwrap_or(u64::MAX);
            if next > end {
                return;
            }
            self.clock.set(next);
            for i in 0..self.envoys.len() {
                self.step(i, next);
            }
        }
    }

    fn step(&mut self, i: usize, t: u64) {
        let envoy = &mut self.envoys[i];
        if envoy.gone {
            return;
        }
        if t >= envoy.end() {
            envoy.gone = true;
            if let Fate::Leaves(_) = envoy.plan.fate {
                let replica = &self.replicas[envoy.plan.replica];
                for (_, stream) in envoy.streams.drain() {
                    self.runtime.block_on(replica.close(stream, &self.metrics)).unwrap();
                }
            }
            return;
        }
        if envoy.next_request == t {
            if envoy.model.request(BUCKET, t) {
                envoy.admitted.push(t);
            } else {
                envoy.denied.push(t);
            }
            let rate = envoy.rate_at(t);
            let gap = (1e9 / rate).max(1.0) as u64;
            envoy.schedule_from(t + gap);
        } else {
            envoy.model.tick(t);
        }
        let replica = &self.replicas[envoy.plan.replica];
        for out in envoy.model.outbox() {
            let stream = envoy.streams.entry(out.stream).or_insert_with(|| replica.open());
            let response = self
                .runtime
                .block_on(replica.report(stream, &self.rules, out.reports, &self.metrics))
                .unwrap();
            envoy.model.receive(&response, t);
        }
    }

    /// Every time anything was admitted, in order.
    fn admitted(&self) -> Vec<u64> {
        let mut all: Vec<u64> = self.envoys.iter().flat_map(|e| e.admitted.iter().copied()).collect();
        all.sort_unstable();
        all
    }
}

/// The most admitted in any window of `window_ns` (windows starting at
/// each admission: the most any window holds).
fn most_in_a_window(admitted: &[u64], window_ns: u64) -> u64 {
    let mut most = 0;
    let mut end = 0;
    for (start, t) in admitted.iter().enumerate() {
        while end < admitted.len() && admitted[end] < t + window_ns {
            end += 1;
        }
        most = most.max(end - start);
    }
    most as u64
}

/// The fewest admitted in a window of `window_ns` starting at
/// `from`, `from + 1 s`, … up to `to - window_ns`.
fn fewest_in_a_window(admitted: &[u64], window_ns: u64, from: u64, to: u64) -> u64 {
    let mut fewest = u64::MAX;
    let mut start = from;
    while start + window_ns <= to {
        let n = admitted
            .iter()
            .filter(|t| **t >= start && **t < start + window_ns)
            .count();
        fewest = fewest.min(n as u64);
        start += S;
    }
    fewest
}

/// 1 to 8 Envoys: each joins in the first minute, asks a demand that
/// changes (none, a little, a share, the whole limit, three times it),
/// and stays, leaves or dies.
fn plans(limit: u64, window_s: u64, replicas: usize) -> impl Strategy<Value = Vec<Plan>> {
    let per_s = limit as f64 / window_s as f64;
    let phase = (1u64..30, prop::sample::select(vec![0.0, 0.05, 0.3, 1.0, 3.0]));
    let plan = (
        0u64..60,
        prop::collection::vec(phase, 1..5),
        0u8..3,
        20u64..90,
        0..replicas,
    )
        .prop_map(move |(join, phases, fate, end, replica)| {
            let join = join * S + 317_000_000;
            let mut until = join;
            let phases = phases
                .into_iter()
                .map(|(secs, factor)| {
                    until += secs * S;
                    (until, factor * per_s)
                })
                .collect();
            let at = join + end * S;
            let fate = match fate {
                0 => Fate::Stays,
                1 => Fate::Leaves(at),
                _ => Fate::Dies(at),
            };
            Plan {
                join,
                phases,
                fate,
                replica,
            }
        });
    prop::collection::vec(plan, 1..=8)
}

fn check_bound(limit: u64, window_s: u64, plans: Vec<Plan>, replicas: usize, redis: Option<&RedisServer>) {
    let rules = OneRule {
        limit,
        window_ns: window_s * S,
    };
    let mut sim = Sim::new(rules, replicas, plans, redis);
    sim.run(150 * S);
    if let Some(redis) = redis {
        // The ledgers were Redis's: those still held are there.
        let keys = redis.cli(&["KEYS", "slidegate:rlqs:*"]);
        let held = sim.envoys.iter().any(|e| !e.gone && !e.admitted.is_empty());
        assert!(
            !held || keys.contains("slidegate:rlqs:"),
            "no ledger in Redis: {keys:?}"
        );
    }
    let admitted = sim.admitted();
    let most = most_in_a_window(&admitted, window_s * S);
    assert!(
        most <= limit,
        "{most} admitted in a window of {window_s} s, over the limit {limit}"
    );
    if std::env::var_os("RLQS_SHARE_TRACE").is_some() {
        let asked: usize = sim.envoys.iter().map(|e| e.admitted.len() + e.denied.len()).sum();
        eprintln!(
            "limit {limit}/{window_s}s: {} admitted of {asked}, at most {most} in a window",
            admitted.len()
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn envoys_together_never_pass_the_limit_in_any_window(
        (limit, window_s, plans) in (100u64..600, prop::sample::select(vec![5u64, 10, 20]))
            .prop_flat_map(|(limit, window_s)| (Just(limit), Just(window_s), plans(limit, window_s, 1)))
    ) {
        check_bound(limit, window_s, plans, 1, None);
    }

    #[test]
    fn an_envoy_alone_gets_at_least_95_percent(
        limit in 800u64..3000,
        window_s in prop::sample::select(vec![5u64, 10, 30, 60]),
        factor in 1.05f64..4.0,
        join_ms in 0u64..5000,
    ) {
        alone(limit, window_s, factor, join_ms, None)?;
    }

    #[test]
    fn ten_percent_is_met_and_the_rest_goes_to_the_busy_one(
        limit in 800u64..3000,
        window_s in prop::sample::select(vec![5u64, 10, 30]),
        offset_ms in 0u64..5000,
    ) {
        ten_and_two_hundred(limit, window_s, offset_ms, None)?;
    }
}

/// An Envoy alone asking `factor` times the limit, joining at `join_ms`:
/// at least 95 % of the limit in every window once its first report is
/// answered, never more than the limit. With `redis`, on one replica of
/// two sharing it.
fn alone(
    limit: u64,
    window_s: u64,
    factor: f64,
    join_ms: u64,
    redis: Option<&RedisServer>,
) -> Result<(), TestCaseError> {
    let rules = OneRule {
        limit,
        window_ns: window_s * S,
    };
    let join = join_ms * 1_000_000;
    let end = join + (3 * window_s + 30) * S;
    let plan = Plan {
        join,
        phases: vec![(end, factor * limit as f64 / window_s as f64)],
        fate: Fate::Stays,
        replica: usize::from(redis.is_some()),
    };
    let replicas = if redis.is_some() { 2 } else { 1 };
    let mut sim = Sim::new(rules, replicas, vec![plan], redis);
    sim.run(end);
    let admitted = sim.admitted();
    // From its first request's answer on (the first request meets
    // DENY_ALL, before any assignment).
    let fewest = fewest_in_a_window(&admitted, window_s * S, join + 1_000_000, end);
    prop_assert!(
        fewest * 100 >= limit * 95,
        "{fewest} of {limit} in the worst window of {window_s} s"
    );
    prop_assert!(most_in_a_window(&admitted, window_s * S) <= limit);
    Ok(())
}

/// Two Envoys asking 10 % and 200 % of the limit, the second joining
/// `offset_ms` later: from the later one's third report on, the first is
/// never refused and the second admits the rest of the rate pool. With
/// `redis`, each on its own replica of two sharing it.
fn ten_and_two_hundred(
    limit: u64,
    window_s: u64,
    offset_ms: u64,
    redis: Option<&RedisServer>,
) -> Result<(), TestCaseError> {
    let rules = OneRule {
        limit,
        window_ns: window_s * S,
    };
    let per_s = limit as f64 / window_s as f64;
    let later = offset_ms * 1_000_000;
    let end = later + (15 + 3 * window_s) * S;
    let (replicas, other) = if redis.is_some() { (2, 1) } else { (1, 0) };
    let small = Plan {
        join: 0,
        phases: vec![(end, 0.1 * per_s)],
        fate: Fate::Stays,
        replica: 0,
    };
    let busy = Plan {
        join: later,
        phases: vec![(end, 2.0 * per_s)],
        fate: Fate::Stays,
        replica: other,
    };
    let mut sim = Sim::new(rules, replicas, vec![small, busy], redis);
    sim.run(end);
    // The later one's third report, 15 s after its first.
    let settled = later + 15 * S + 1;
    let small = &sim.envoys[0];
    let refused = small.denied.iter().filter(|t| **t >= settled).count();
    prop_assert_eq!(refused, 0, "the 10 % Envoy was refused after its shares settled");
    let pools = Pools::new(limit, window_s * S);
    let small_demand = limit / 10;
    let small_share = small_demand + small_demand / 8 + 1;
    let rest = pools.rate - small_share;
    let busy = fewest_in_a_window(&sim.envoys[1].admitted, window_s * S, settled, end);
    // Reports count whole requests over whole seconds: the small one's
    // share moves by a few tokens from report to report.
    prop_assert!(
        busy + 3 + limit / 100 >= rest,
        "the busy Envoy admitted {busy} in a window, the rest is {rest}"
    );
    prop_assert!(most_in_a_window(&sim.admitted(), window_s * S) <= limit);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 6, ..ProptestConfig::default() })]

    /// The same bound with the Envoys spread over two replicas sharing one
    /// Redis.
    #[test]
    fn two_replicas_on_one_redis_never_pass_the_limit(
        (limit, window_s, plans) in (100u64..400, prop::sample::select(vec![5u64, 10]))
            .prop_flat_map(|(limit, window_s)| (Just(limit), Just(window_s), plans(limit, window_s, 2)))
    ) {
        let redis = RedisServer::start();
        check_bound(limit, window_s, plans, 2, Some(&redis));
    }

    /// A lone Envoy's 95 % with its replica's ledgers in Redis.
    #[test]
    fn an_envoy_alone_on_a_replica_gets_at_least_95_percent(
        limit in 800u64..3000,
        window_s in prop::sample::select(vec![5u64, 10, 30]),
        factor in 1.05f64..4.0,
        join_ms in 0u64..5000,
    ) {
        let redis = RedisServer::start();
        alone(limit, window_s, factor, join_ms, Some(&redis))?;
    }

    /// The 10 %/200 % split with each Envoy on its own replica.
    #[test]
    fn ten_percent_and_the_rest_across_two_replicas(
        limit in 800u64..3000,
        window_s in prop::sample::select(vec![5u64, 10, 30]),
        offset_ms in 0u64..5000,
    ) {
        let redis = RedisServer::start();
        ten_and_two_hundred(limit, window_s, offset_ms, Some(&redis))?;
    }
}
