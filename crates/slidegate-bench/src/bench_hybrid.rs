//! `slidegate-bench --redis URL`, the `hybrid` group: the hybrid mode
//! (local decisions, batched syncs) and its bounded form (leases) against
//! the direct script path on the same server in the same run, the Redis
//! commands each sends per 1000 decisions (read from the server's own
//! `INFO commandstats`), and the over-admission of each with several
//! instances sharing one key.
//!
//! Keys live under the run's prefix and are deleted at the end, as in
//! `crate::bench_redis`.

use crate::case::{Case, key, percentile};
use crate::redis_conn::{TIMEOUT, clean, connect, loopback_client};
use anyhow::{Context, Result};
use redis::aio::MultiplexedConnection;
use slidegate_core::{Algorithm, Policy, Weighting};
use slidegate_redis::{HybridOptions, HybridStore, RedisStore};
use slidegate_store::{Decisions, Quota, Store};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Steps of the progress bar: direct; for each mode (today's, bounded),
/// one key, many keys and the over-admission run.
pub(crate) const STEPS: u64 = 7;

/// The sync interval measured.
const INTERVAL: Duration = Duration::from_millis(50);

/// Keys of the many-key case.
const KEYS: u64 = 1_000;

/// Instances of the over-admission run, and their shared limit per second.
const INSTANCES: usize = 4;
const SHARED_LIMIT: u64 = 10_000;
/// Decisions per second offered to each instance: twice the limit in all.
const OFFERED: u64 = 2 * SHARED_LIMIT / INSTANCES as u64;

/// Calls each task makes at least, however long they take: on a stalled
/// machine a short run still decides enough (several times the many-key
/// case's keys in all) for its percentiles and its commands per decision
/// to mean something.
const MIN_CALLS: u64 = 1_000;

/// `concurrency` tasks calling `op(task, i)` one call at a time for `time`
/// (and at least `MIN_CALLS` each): a case of the `hybrid` group, with p50
/// and p99, and the calls made.
async fn drive<F, Fut>(name: String, time: Duration, concurrency: usize, op: F) -> Result<(Case, u64)>
where
    F: Fn(u64, u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<()>> + Send,
{
    let start = Instant::now();
    let mut latencies = crate::case::drive(time, concurrency, MIN_CALLS, op).await?;
    let calls = latencies.len() as u64;
    latencies.sort_unstable();
    let mut case = Case::new("hybrid", name, calls as f64 / start.elapsed().as_secs_f64());
    case.concurrency = Some(concurrency);
    case.p50_us = percentile(&latencies, 0.50);
    case.p99_us = percentile(&latencies, 0.99);
    Ok((case, calls))
}

fn ring(limit: u64) -> Result<Policy> {
    let sw8 = Algorithm::SlidingWindow {
        buckets: 8,
        weighting: Weighting::Conservative,
    };
    Ok(Policy::new(limit, Duration::from_secs(1), sw8)?)
}

/// The script calls (`EVALSHA` and `FCALL`) the server has processed so
/// far (`INFO commandstats`): the commands a limiter sends, without the
/// ones its scripts run inside.
async fn script_calls(conn: &MultiplexedConnection) -> Result<u64> {
    let mut conn = conn.clone();
    let info: String = tokio::time::timeout(TIMEOUT, redis::cmd("INFO").arg("commandstats").query_async(&mut conn))
        .await
        .map_err(|_| anyhow::anyhow!("no answer to INFO within {TIMEOUT:?}"))?
        .context("INFO commandstats")?;
    // `cmdstat_evalsha:calls=12,usec=…`; absent before the first call.
    let calls = |command: &str| -> u64 {
        info.lines()
            .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:calls=")))
            .and_then(|v| v.split(',').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    Ok(calls("evalsha") + calls("fcall"))
}

/// A hybrid store under `prefix` on a connection of its own, bounded
/// (leases) or not.
async fn hybrid(url: &str, prefix: &str, bounded: bool) -> Result<HybridStore> {
    let options = if bounded {
        HybridOptions::leased(INTERVAL)
    } else {
        HybridOptions::every(INTERVAL)
    };
    Ok(HybridStore::new(connect(url).await?, prefix, TIMEOUT, options)?)
}

/// A mode's name in the cases.
fn mode(bounded: bool) -> &'static str {
    if bounded { "bounded hybrid" } else { "hybrid" }
}

/// One decision of cost 1 on `key` under the one limit `quota`: whether it
/// was admitted. An error (Redis failing for longer than the store's
/// `stale_after`) ends the run.
fn decide(store: &HybridStore, key: &str, quota: &[Quota; 1]) -> Result<bool> {
    let mut out = Decisions::new();
    store
        .decide_now(key, quota, 1, &mut out)
        .context("a hybrid decision is made at once")?
        .context("a hybrid decision failed: Redis failed during the run")?;
    Ok(out.iter().all(|d| d.allowed()))
}

/// Hybrid decisions on `spread` keys at `concurrency`, syncing in the
/// background: the case, with the commands the server saw per 1000
/// decisions (the final flush included).
async fn hybrid_case(
    url: &str,
    conn: &MultiplexedConnection,
    prefix: &str,
    time: Duration,
    concurrency: usize,
    (spread, bounded): (u64, bool),
    name: String,
) -> Result<Case> {
    let store = Arc::new(hybrid(url, prefix, bounded).await?);
    let quota = [Quota::new(ring(1_000_000_000)?)];
    let before = script_calls(conn).await?;
    let task = store.spawn_sync();
    let s = Arc::clone(&store);
    let (mut case, decisions) = drive(name, time, concurrency, move |task, i| {
        let (store, quota) = (Arc::clone(&s), quota.clone());
        async move {
            let k = if spread == 1 {
                "bench".to_owned()
            } else {
                key(task << 40 | i, spread).to_string()
            };
            decide(&store, &k, &quota)?;
            // Let the sync and the other tasks run: a decision never waits.
            tokio::task::yield_now().await;
            Ok(())
        }
    })
    .await?;
    drop(task);
    store.flush().await.context("the last sync")?;
    let sent = script_calls(conn).await?.saturating_sub(before);
    case.commands_per_1000 = Some(sent as f64 * 1000.0 / decisions.max(1) as f64);
    Ok(case)
}

/// `INSTANCES` hybrid instances, each with its own connection and
/// background sync, each offered `OFFERED` decisions per second on one key
/// of a shared limit (twice the limit in all) for `time` (at least 3 s):
/// the most admitted in any window of 1 s, over the limit.
async fn over_admission(url: &str, prefix: &str, time: Duration, bounded: bool) -> Result<Case> {
    let quota = [Quota::new(ring(SHARED_LIMIT)?)];
    let start = Instant::now();
    let deadline = start + time.max(Duration::from_secs(3));
    let mut runs = Vec::new();
    for _ in 0..INSTANCES {
        let store = hybrid(url, prefix, bounded).await?;
        let quota = quota.clone();
        runs.push(tokio::spawn(async move {
            let _task = store.spawn_sync();
            let mut tick = tokio::time::interval(Duration::from_millis(1));
            let (mut admitted, mut decisions) = (Vec::new(), 0u64);
            while Instant::now() < deadline {
                tick.tick().await;
                // Catch up with the ticks the runtime could not keep.
                let due = start.elapsed().as_micros() as u64 * OFFERED / 1_000_000;
                while decisions < due {
                    decisions += 1;
                    if decide(&store, "shared", &quota)? {
                        admitted.push(start.elapsed().as_micros() as u64);
                    }
                }
            }
            anyhow::Ok((admitted, decisions))
        }));
    }
    let (mut admitted, mut decisions) = (Vec::new(), 0);
    for run in runs {
        let (a, d) = run.await.context("an instance")??;
        admitted.extend(a);
        decisions += d;
    }
    admitted.sort_unstable();
    // The most admitted in any window (t − 1 s, t].
    let (mut most, mut from) = (0, 0);
    for (to, &t) in admitted.iter().enumerate() {
        while admitted[from] + 1_000_000 <= t {
            from += 1;
        }
        most = most.max(to + 1 - from);
    }
    let elapsed = start.elapsed();
    let name = format!(
        "{}, {INSTANCES} instances × {OFFERED}/s offered on one key, limit {SHARED_LIMIT}/s: most admitted in 1 s",
        mode(bounded)
    );
    let mut case = Case::new("hybrid", name, decisions as f64 / elapsed.as_secs_f64());
    case.admitted_over_limit = Some(most as f64 / SHARED_LIMIT as f64);
    Ok(case)
}

async fn cases(
    url: &str,
    conn: &MultiplexedConnection,
    prefix: &str,
    time: Duration,
    concurrency: usize,
    progress: &dyn Fn(&str),
) -> Result<Vec<Case>> {
    progress("hybrid: direct script");
    let direct = Arc::new(RedisStore::new(conn.clone(), format!("{prefix}direct:"), TIMEOUT)?);
    let quota = [Quota::new(ring(1_000_000_000)?)];
    let baseline = format!("sliding_window n=8 conservative, direct script, one hot key, {concurrency} in flight");
    let (base, _) = drive(baseline.clone(), time, concurrency, move |_, _| {
        let (direct, quota) = (Arc::clone(&direct), quota.clone());
        async move {
            let mut out = Decisions::new();
            direct
                .decide("bench", &quota, 1, &mut out)
                .await
                .context("a script call")?;
            Ok(())
        }
    })
    .await?;
    let base_rate = base.per_second;
    let mut cases = vec![base];
    let ms = INTERVAL.as_millis();
    for bounded in [false, true] {
        let m = mode(bounded);
        for (spread, what) in [(1, "one hot key".to_owned()), (KEYS, format!("{KEYS} keys"))] {
            progress(&format!("{m}: {what}"));
            let name = format!("{m}, sync every {ms} ms, {what}, {concurrency} in flight");
            let mut case = hybrid_case(
                url,
                conn,
                &format!("{prefix}h{spread}{bounded}:"),
                time,
                concurrency,
                (spread, bounded),
                name,
            )
            .await?;
            case.ratio = Some(case.per_second / base_rate);
            case.baseline = Some(baseline.clone());
            cases.push(case);
        }
        progress(&format!("{m}: over-admission"));
        cases.push(over_admission(url, &format!("{prefix}shared{bounded}:"), time, bounded).await?);
    }
    Ok(cases)
}

/// The `hybrid` group against the server at `url`.
pub(crate) fn bench(url: &str, time: Duration, concurrency: usize, progress: &dyn Fn(&str)) -> Result<Vec<Case>> {
    loopback_client(url)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async {
        let conn = connect(url).await?;
        let prefix = format!("slidegate-bench:{}:hybrid:", std::process::id());
        let measured = cases(url, &conn, &prefix, time, concurrency, progress).await;
        let cleaned = clean(&conn, &prefix)
            .await
            .with_context(|| format!("deleting the run's keys ({prefix}*)"));
        let cases = measured?;
        cleaned?;
        Ok(cases)
    })
}
