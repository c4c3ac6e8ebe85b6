//! What every group of the bench uses: a measured [`Case`], the spread of
//! keys, the load of concurrent calls ([`drive`]) and its percentiles.

use anyhow::{Context, Result};
use serde::Serialize;
use std::time::{Duration, Instant};

/// One measured case.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Case {
    /// `algorithms`, `store`, `service`, `redis` or `hybrid`.
    pub(crate) group: &'static str,
    /// What was measured.
    pub(crate) name: String,
    /// Decisions per second.
    pub(crate) per_second: f64,
    /// The case of the same run this one compares with.
    pub(crate) baseline: Option<String>,
    /// `per_second / baseline's per_second`.
    pub(crate) ratio: Option<f64>,
    /// Median latency in microseconds (service and Redis cases).
    pub(crate) p50_us: Option<f64>,
    /// 99th percentile latency in microseconds (service and Redis cases).
    pub(crate) p99_us: Option<f64>,
    /// Requests in flight (service and Redis cases).
    pub(crate) concurrency: Option<usize>,
    /// Redis commands the server processed per 1000 decisions (hybrid
    /// cases).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) commands_per_1000: Option<f64>,
    /// The Redis server's CPU time (user and system) per decision, in
    /// microseconds (redis cases).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) redis_cpu_us: Option<f64>,
    /// The requests a script call carried, on average (redis cases of the
    /// script).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) requests_per_call: Option<f64>,
    /// The service's CPU time (user and system, its threads only) per
    /// decision, in microseconds (service cases).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) server_cpu_us: Option<f64>,
    /// The most admitted in any window over the limit (the hybrid
    /// over-admission case).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) admitted_over_limit: Option<f64>,
}

impl Case {
    pub(crate) fn new(group: &'static str, name: impl Into<String>, per_second: f64) -> Case {
        Case {
            group,
            name: name.into(),
            per_second,
            baseline: None,
            ratio: None,
            p50_us: None,
            p99_us: None,
            concurrency: None,
            commands_per_1000: None,
            redis_cpu_us: None,
            requests_per_call: None,
            server_cpu_us: None,
            admitted_over_limit: None,
        }
    }
}

/// A spread of keys: a fixed, cheap permutation of `0..keys`.
pub(crate) fn key(i: u64, keys: u64) -> u64 {
    i.wrapping_mul(0x9E37_79B9_7F4A_7C15) % keys.max(1)
}

/// `concurrency` tasks on the current runtime, each calling `op(task, i)`
/// one call at a time until `time` has passed and it has made at least
/// `min_calls`: every call's latency. The floor keeps a case measurable
/// when the machine stalls past a short deadline (a task first polled
/// after it would otherwise make no call at all).
pub(crate) async fn drive<F, Fut>(time: Duration, concurrency: usize, min_calls: u64, op: F) -> Result<Vec<Duration>>
where
    F: Fn(u64, u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<()>> + Send,
{
    let op = std::sync::Arc::new(op);
    let deadline = Instant::now() + time;
    let mut tasks = Vec::new();
    for task in 0..concurrency as u64 {
        let op = std::sync::Arc::clone(&op);
        tasks.push(tokio::spawn(async move {
            let (mut latencies, mut i) = (Vec::new(), 0);
            while i < min_calls || Instant::now() < deadline {
                let call = Instant::now();
                op(task, i).await?;
                latencies.push(call.elapsed());
                i += 1;
            }
            anyhow::Ok(latencies)
        }));
    }
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await.context("a load task")??);
    }
    Ok(latencies)
}

pub(crate) fn percentile(sorted: &[Duration], p: f64) -> Option<f64> {
    let last = sorted.len().checked_sub(1)?;
    let i = ((sorted.len() as f64 * p) as usize).min(last);
    Some(sorted[i].as_secs_f64() * 1e6)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deadline already passed still leaves each task its floor of
    /// calls, numbered from 0, and then no more: a stall cannot empty a case.
    #[tokio::test]
    async fn a_passed_deadline_still_leaves_each_task_its_floor() {
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let record = std::sync::Arc::clone(&seen);
        let latencies = drive(Duration::ZERO, 3, 5, move |task, i| {
            record.lock().unwrap().push((task, i));
            async { Ok(()) }
        })
        .await
        .unwrap();
        assert_eq!(latencies.len(), 15);
        let mut calls = seen.lock().unwrap().clone();
        calls.sort_unstable();
        let expected: Vec<(u64, u64)> = (0..3).flat_map(|t| (0..5).map(move |i| (t, i))).collect();
        assert_eq!(calls, expected);
    }
}
