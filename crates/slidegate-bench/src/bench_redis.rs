//! `slidegate-bench --redis URL`: slidegate's script path against plain
//! `INCR`, through the same client at the same concurrency, in the same run,
//! at each concurrency of `--redis-concurrency`.
//!
//! At each concurrency, that many tasks share one multiplexed connection (as
//! the store does), each with one call in flight, and every script case is
//! compared with `INCR` at that concurrency. The stores batch as `slidegate
//! serve` does on one server ([`Batching::PerServer`]: the requests that
//! come while a call is in flight go together in the next); two cases
//! repeat the sliding window without batching, one call per request. The cases of one concurrency
//! are measured round-robin, in [`ROUNDS`] slices of `--time / ROUNDS`
//! each (`INCR`, every script, `INCR`, ...), so that a burst of load from
//! elsewhere on the machine falls on `INCR` and the scripts alike instead of
//! on whichever case ran at the time.
//!
//! Every key the run makes starts with a prefix unique to the run
//! (`slidegate-bench:<pid>:`) and is deleted at the end (`SCAN` with `MATCH`
//! on the prefix, `UNLINK`), so the bench leaves nothing behind. Only
//! loopback servers are measured.

use crate::case::{Case, key, percentile};
use crate::redis_conn::{TIMEOUT, clean, connect, loopback_client};
use anyhow::{Context, Result};
use redis::aio::MultiplexedConnection;
use slidegate_core::{Algorithm, Policy, Weighting};
use slidegate_redis::{Batching, RedisStore};
use slidegate_store::{Decisions, Quota, Store};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Distinct keys of the many-key case.
const MANY_KEYS: u64 = 100_000;

/// The slices each case's `--time` is cut into, the cases of one
/// concurrency taking turns.
const ROUNDS: u32 = 10;

/// Steps of the progress bar for `concurrencies` concurrencies: one per
/// round.
pub(crate) fn steps(concurrencies: usize) -> u64 {
    u64::from(ROUNDS) * concurrencies as u64
}

/// Calls answered, their latencies, the time they took, the CPU time the
/// Redis server spent meanwhile, and the script calls that carried them
/// (as the stores counted: calls, requests).
#[derive(Default)]
struct Load {
    count: u64,
    latencies: Vec<Duration>,
    elapsed: Duration,
    redis_cpu: Duration,
    script_calls: (u64, u64),
}

impl Load {
    fn add(&mut self, other: Load) {
        self.count += other.count;
        self.latencies.extend(other.latencies);
        self.elapsed += other.elapsed;
        self.redis_cpu += other.redis_cpu;
        self.script_calls.0 += other.script_calls.0;
        self.script_calls.1 += other.script_calls.1;
    }
}

/// The CPU time the Redis server has used so far, user and system (`INFO
/// cpu`: `used_cpu_user` and `used_cpu_sys`, in seconds to the
/// microsecond), counting every thread of the server.
pub(crate) async fn redis_cpu(conn: &MultiplexedConnection) -> Result<Duration> {
    let mut conn = conn.clone();
    let info: String = tokio::time::timeout(TIMEOUT, redis::cmd("INFO").arg("cpu").query_async(&mut conn))
        .await
        .map_err(|_| anyhow::anyhow!("no answer to INFO cpu within {TIMEOUT:?}"))?
        .context("INFO cpu")?;
    let field = |name: &str| -> Result<f64> {
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .with_context(|| format!("INFO cpu without {name}"))
    };
    Ok(Duration::from_secs_f64(
        field("used_cpu_user")? + field("used_cpu_sys")?,
    ))
}

/// What one case calls.
enum Op {
    /// `INCR` of this key.
    Incr(String),
    /// A decision of one limit by these stores (one per connection: task
    /// `t` uses `t mod len`) on one key, or on keys spread over this many.
    Script(Vec<RedisStore>, Quota, u64),
}

impl Op {
    /// The script calls the stores sent so far, and the requests they
    /// carried; none for `INCR`.
    fn script_calls(&self) -> (u64, u64) {
        match self {
            Op::Incr(_) => (0, 0),
            Op::Script(stores, ..) => stores
                .iter()
                .map(RedisStore::script_calls)
                .fold((0, 0), |(c, r), (c1, r1)| (c + c1, r + r1)),
        }
    }

    /// The `i`-th call of `task` in `round`.
    async fn call(&self, conn: &MultiplexedConnection, round: u64, task: u64, i: u64) -> Result<()> {
        match self {
            Op::Incr(key) => {
                let mut conn = conn.clone();
                let _: i64 = tokio::time::timeout(TIMEOUT, redis::cmd("INCR").arg(key).query_async(&mut conn))
                    .await
                    .map_err(|_| anyhow::anyhow!("no answer to INCR within {TIMEOUT:?}"))?
                    .context("INCR")?;
            }
            Op::Script(stores, quota, spread) => {
                let store = &stores[task as usize % stores.len()];
                let k = if *spread == 1 {
                    "bench".to_owned()
                } else {
                    key(round << 56 | task << 40 | i, *spread).to_string()
                };
                let mut out = Decisions::new();
                store
                    .decide(&k, std::slice::from_ref(quota), 1, &mut out)
                    .await
                    .context("a script call")?;
            }
        }
        Ok(())
    }
}

/// `concurrency` tasks calling `op` one call at a time until `time` has
/// passed, each at least once.
async fn load(
    conns: &[MultiplexedConnection],
    op: &Arc<Op>,
    round: u64,
    time: Duration,
    concurrency: usize,
) -> Result<Load> {
    let cpu_before = redis_cpu(&conns[0]).await?;
    let calls_before = op.script_calls();
    let start = Instant::now();
    let (all, shared) = (conns.to_vec(), Arc::clone(op));
    let latencies = crate::case::drive(time, concurrency, 1, move |task, i| {
        let (op, conn) = (Arc::clone(&shared), all[task as usize % all.len()].clone());
        async move { op.call(&conn, round, task, i).await }
    })
    .await?;
    let mut load = Load {
        count: latencies.len() as u64,
        latencies,
        ..Load::default()
    };
    // Until the last call in flight at the deadline was answered.
    load.elapsed = start.elapsed();
    load.redis_cpu = redis_cpu(&conns[0]).await?.saturating_sub(cpu_before);
    let calls_after = op.script_calls();
    load.script_calls = (calls_after.0 - calls_before.0, calls_after.1 - calls_before.1);
    Ok(load)
}

/// A case of the `redis` group from its load: calls answered per second of
/// the time its slices took.
fn case(name: String, concurrency: usize, mut load: Load) -> Case {
    load.latencies.sort_unstable();
    let seconds = load.elapsed.as_secs_f64();
    let per_second = if seconds > 0.0 {
        load.count as f64 / seconds
    } else {
        0.0
    };
    let mut case = Case::new("redis", name, per_second);
    case.concurrency = Some(concurrency);
    case.p50_us = percentile(&load.latencies, 0.50);
    case.p99_us = percentile(&load.latencies, 0.99);
    if load.count > 0 {
        case.redis_cpu_us = Some(load.redis_cpu.as_secs_f64() * 1e6 / load.count as f64);
    }
    let (calls, requests) = load.script_calls;
    if calls > 0 {
        case.requests_per_call = Some(requests as f64 / calls as f64);
    }
    case
}

/// The script cases on one hot key: a tag for the keys, the name, the
/// policy. No run reaches the limits, but sliding_log's, 1000 per second,
/// which keeps its log at most 1000 entries long (most of its decisions
/// are refusals).
fn policies() -> Result<Vec<(&'static str, &'static str, Policy)>> {
    let second = Duration::from_secs(1);
    let limit = 1_000_000;
    let sliding = |buckets, weighting| Algorithm::SlidingWindow { buckets, weighting };
    Ok(vec![
        (
            "sw8c",
            "sliding_window n=8 conservative",
            Policy::new(limit, second, sliding(8, Weighting::Conservative))?,
        ),
        (
            "sw2i",
            "sliding_window n=2 interpolated",
            Policy::new(limit, second, sliding(2, Weighting::Interpolated))?,
        ),
        (
            "fw",
            "fixed_window",
            Policy::new(limit, second, Algorithm::FixedWindow)?,
        ),
        (
            "gcra",
            "gcra",
            Policy::new(limit, second, Algorithm::Gcra { burst: 1_000 })?,
        ),
        (
            "log",
            "sliding_log (limit 1000/s)",
            Policy::new(1_000, second, Algorithm::SlidingLog)?,
        ),
    ])
}

/// The cases at one concurrency, on `conn`, every key under `prefix`,
/// round-robin.
async fn cases(
    conns: &[MultiplexedConnection],
    prefix: &str,
    time: Duration,
    concurrency: usize,
    progress: &dyn Fn(&str),
) -> Result<Vec<Case>> {
    let baseline = format!("INCR, one hot key, {concurrency} in flight{}", suffix(conns));
    let mut ops = vec![(
        baseline.clone(),
        Op::Incr(format!("{prefix}{{bench}}:incr:{concurrency}")),
    )];
    let mut scripts = Vec::new();
    for (tag, name, policy) in policies()? {
        scripts.push((
            tag,
            format!("{name} script, one hot key, {concurrency} in flight{}", suffix(conns)),
            policy,
            1,
            Batching::PerServer,
        ));
    }
    let sw8 = Algorithm::SlidingWindow {
        buckets: 8,
        weighting: Weighting::Conservative,
    };
    let policy = Policy::new(1_000_000, Duration::from_secs(1), sw8)?;
    let name = "sliding_window n=8 conservative script";
    scripts.push((
        "many",
        format!("{name}, {MANY_KEYS} keys, {concurrency} in flight{}", suffix(conns)),
        policy,
        MANY_KEYS,
        Batching::PerServer,
    ));
    // The same two without batching: one call per request.
    for (tag, keys, spread) in [
        ("sw8c-off", "one hot key".to_owned(), 1),
        ("many-off", format!("{MANY_KEYS} keys"), MANY_KEYS),
    ] {
        scripts.push((
            tag,
            format!("{name} unbatched, {keys}, {concurrency} in flight{}", suffix(conns)),
            policy,
            spread,
            Batching::Off,
        ));
    }
    for (tag, name, policy, spread, batching) in scripts {
        let stores = conns
            .iter()
            .map(|conn| {
                RedisStore::new(conn.clone(), format!("{prefix}{tag}:{concurrency}:"), TIMEOUT)
                    .map(|store| store.with_batching(batching))
            })
            .collect::<Result<Vec<_>, _>>()
            .with_context(|| format!("the {name} store"))?;
        ops.push((name, Op::Script(stores, Quota::new(policy), spread)));
    }
    let ops: Vec<(String, Arc<Op>)> = ops.into_iter().map(|(name, op)| (name, Arc::new(op))).collect();
    let mut loads: Vec<Load> = ops.iter().map(|_| Load::default()).collect();
    let slice = time / ROUNDS;
    for round in 0..ROUNDS {
        progress(&format!("redis, {concurrency} in flight, round {}/{ROUNDS}", round + 1));
        for ((_, op), total) in ops.iter().zip(&mut loads) {
            total.add(load(conns, op, u64::from(round), slice, concurrency).await?);
        }
    }
    let mut cases: Vec<Case> = ops
        .into_iter()
        .zip(loads)
        .map(|((name, _), load)| case(name, concurrency, load))
        .collect();
    let base_rate = cases[0].per_second;
    for case in &mut cases[1..] {
        case.ratio = Some(case.per_second / base_rate);
        case.baseline = Some(baseline.clone());
    }
    Ok(cases)
}

/// The `redis` group against the server at `url`, at each of
/// `concurrencies` in turn.
/// The name's mark of a run with a connection per call.
fn suffix(conns: &[MultiplexedConnection]) -> &'static str {
    if conns.len() > 1 {
        " on their own connections"
    } else {
        ""
    }
}

/// The `redis` group against the server at `url`: at each concurrency, the
/// tasks share one multiplexed connection (pipelined, as the store does),
/// or with `per_call` each has its own (no pipelining: a pool).
pub(crate) fn bench(
    url: &str,
    time: Duration,
    concurrencies: &[usize],
    per_call: bool,
    progress: &dyn Fn(&str),
) -> Result<Vec<Case>> {
    // Refused before any runtime starts.
    loopback_client(url)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async {
        let conn = connect(url).await?;
        // The pid is digits, no glob character: `MATCH` on the prefix is exact.
        let prefix = format!("slidegate-bench:{}:", std::process::id());
        let measured = async {
            let mut all = Vec::new();
            for &concurrency in concurrencies {
                let mut conns = vec![conn.clone()];
                if per_call {
                    for _ in 1..concurrency {
                        conns.push(connect(url).await?);
                    }
                }
                all.extend(cases(&conns, &prefix, time, concurrency, progress).await?);
            }
            anyhow::Ok(all)
        }
        .await;
        let cleaned = clean(&conn, &prefix)
            .await
            .with_context(|| format!("deleting the run's keys ({prefix}*)"));
        let cases = measured?;
        cleaned?;
        Ok(cases)
    })
}
