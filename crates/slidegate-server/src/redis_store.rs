//! Redis as the engine's shared counter store: several instances of the
//! service on one Redis (or one Redis Cluster) share their limits.
//!
//! Each distinct policy gets one [`RedisLimiter`], made when first needed
//! and kept (they share the connection). A counter's Redis key is
//! `<prefix><policy>:{<counter key>}` where `<policy>` is
//! [`policy_tag`] (`sliding_window:100:60000000:8c`) and the counter key is
//! the readable one of [`Match::counter_key`](crate::config::Match::counter_key)
//! (or `adhoc:<key>` for `/v1/check`'s ad-hoc keys): the same on every
//! instance, so that they count together; a changed limit starts afresh,
//! an unchanged one keeps counting across reloads and restarts.
//!
//! # Concurrency
//!
//! The limiters sit in a map under a read-write lock, held only to look
//! up or insert (never across an await). Every decision is one atomic
//! script in Redis; a descriptor with several limits is asked limit by
//! limit (peek, then charge), so two instances deciding the same
//! descriptor at once may each see room that only one of them gets: each
//! limit still never admits more than its count.

use crate::config::{Config, ConfigError, Rule};
use ::redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use ::redis::cluster::ClusterClientBuilder;
use ::redis::cluster_async::ClusterConnection;
use ::redis::{Cmd, Pipeline, RedisFuture, Value};
use parking_lot::RwLock;
use slidegate_core::{Algorithm, Decision, Policy, Weighting};
use slidegate_redis::{
    FailurePolicy, HybridLimiter, HybridOptions, RedisLimiter, RedisStoreError, Source, SyncTask, microsecond_policy,
};
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The default timeout of each call to Redis: 50 ms. A healthy call (one
/// script, at most about 0.2 ms of Lua, plus a round trip within a data
/// centre) takes well under a millisecond, so 50 ms is only reached when
/// Redis is down, overloaded or failing over; it bounds what a dead Redis
/// adds to one decision, and Redis is then skipped for the limiter's
/// backoff (100 ms). Envoy's rate limit filter waits 20 ms by default: set
/// the timeout below the client's if the service's failure policy, rather
/// than the client's, should answer while Redis hangs.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(50);

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "slidegate:";

/// How long the service waits for Redis at start before giving up.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The most limiters (distinct policies) kept. The config's policies are
/// few; limit overrides and ad-hoc policies come from requests, so the
/// map is bounded: beyond it, a decision uses a limiter of its own (the
/// counts are in Redis all the same; only a `Local` fallback's counts and
/// the backoff are not shared between such decisions).
const MAX_LIMITERS: usize = 4096;

/// The most calls in flight on the connection to one server: beyond it a
/// call waits for room, within its timeout (then the failure policy
/// answers), so a slow Redis meets a bounded queue, not an unbounded one.
const MAX_IN_FLIGHT: usize = 1024;

/// How to reach Redis, and what to do when it fails.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedisOptions {
    /// `redis://` URLs: one server, or the seed nodes of a cluster.
    pub urls: Vec<String>,
    /// Use the cluster client even with one URL (several URLs always do).
    pub cluster: bool,
    /// What a decision does when Redis fails or does not answer in time.
    pub failure: FailurePolicy,
    /// How many instances share the limits: in hybrid mode a key this
    /// instance has not yet synced is decided on the limit divided by it
    /// (see [`HybridOptions::instances`]).
    pub instances: u64,
    /// The timeout of each call.
    pub timeout: Duration,
    /// What every key starts with; no `{` or `}`.
    pub prefix: String,
    /// Hybrid mode: `sliding_window` limits decide locally and send their
    /// counts to Redis every interval (see [`HybridLimiter`]); the other
    /// algorithms stay one script per decision. `None`: every decision is
    /// one script.
    pub sync_interval: Option<Duration>,
}

impl Default for RedisOptions {
    fn default() -> Self {
        RedisOptions {
            urls: Vec::new(),
            cluster: false,
            failure: FailurePolicy::Open,
            instances: 1,
            timeout: DEFAULT_TIMEOUT,
            prefix: DEFAULT_PREFIX.to_owned(),
            sync_interval: None,
        }
    }
}

/// Why the service could not reach Redis at start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RedisConnectError {
    /// No URL was given.
    #[error("no Redis URL")]
    NoUrl,
    /// A URL does not parse.
    #[error("bad Redis URL `{url}`: {source}")]
    Url {
        /// The URL.
        url: String,
        /// Why.
        source: ::redis::RedisError,
    },
    /// The key prefix has `{` or `}`.
    #[error("bad Redis key prefix `{0}`: it must not contain `{{` or `}}`")]
    Prefix(String),
    /// Redis did not answer.
    #[error("cannot reach Redis at {urls}: {source}")]
    Connect {
        /// The URLs, comma-separated.
        urls: String,
        /// Why.
        source: ::redis::RedisError,
    },
    /// Redis did not answer within [`CONNECT_TIMEOUT`].
    #[error("cannot reach Redis at {0}: no answer within {CONNECT_TIMEOUT:?}")]
    Timeout(String),
}

/// The connection to Redis: a [`ConnectionManager`] to one server (it
/// reconnects by itself) or a [`ClusterConnection`] to a cluster (which
/// follows `MOVED`/`ASK` and reconnects to its nodes). Cheap to clone.
#[derive(Clone)]
pub enum RedisConn {
    /// One server.
    Single(ConnectionManager),
    /// A Redis Cluster.
    Cluster(ClusterConnection),
}

impl ConnectionLike for RedisConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            RedisConn::Single(c) => c.req_packed_command(cmd),
            RedisConn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            RedisConn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            RedisConn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            RedisConn::Single(c) => c.get_db(),
            RedisConn::Cluster(c) => c.get_db(),
        }
    }
}

/// What identifies a policy's limiter (every figure of the policy).
type PolicyId = (u64, u64, u8, u64, u64);

fn policy_id(policy: &Policy) -> PolicyId {
    let (tag, a, b) = match policy.algorithm() {
        Algorithm::SlidingWindow { buckets, weighting } => {
            (1, u64::from(buckets), u64::from(weighting == Weighting::Conservative))
        }
        Algorithm::FixedWindow => (2, 0, 0),
        Algorithm::SlidingLog => (3, 0, 0),
        Algorithm::Gcra { burst } => (4, burst, 0),
        Algorithm::ExponentialHistogram { epsilon } => (5, epsilon.to_bits(), 0),
        // Algorithms added later: told apart by name in the tag.
        #[allow(unreachable_patterns)]
        _ => (6, 0, 0),
    };
    (policy.limit(), policy.window_ns(), tag, a, b)
}

/// The policy's part of its keys' prefix:
/// `<algorithm>:<limit>:<window in µs>`, then `:<buckets><i|c>` for a
/// sliding window (interpolated or conservative) or `:<burst>` for GCRA,
/// then `:`. Two policies that decide differently never share it.
pub fn policy_tag(policy: &Policy) -> String {
    let algorithm = policy.algorithm();
    let mut out = format!("{}:{}:{}", algorithm.name(), policy.limit(), policy.window_ns() / 1000);
    match algorithm {
        Algorithm::SlidingWindow { buckets, weighting } => {
            let w = if weighting == Weighting::Conservative { 'c' } else { 'i' };
            out.push_str(&format!(":{buckets}{w}"));
        }
        Algorithm::Gcra { burst } => out.push_str(&format!(":{burst}")),
        _ => {}
    }
    out.push(':');
    out
}

/// The failures and fallbacks of the Redis store so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RedisStats {
    /// Calls to Redis that failed (an error or a timeout).
    pub errors: u64,
    /// Decisions admitted without Redis ([`FailurePolicy::Open`]).
    pub fail_open: u64,
    /// Decisions refused without Redis ([`FailurePolicy::Closed`], or a
    /// key the `Local` fallback could not hold).
    pub fail_closed: u64,
    /// Decisions of the `Local` fallback.
    pub local: u64,
    /// Hybrid mode: commands the syncs sent (one per key per sync).
    pub sync_commands: u64,
    /// Hybrid mode: keys whose counts wait for the next sync.
    pub pending_keys: u64,
}

/// A policy's limiter: one script per decision, or hybrid with its
/// background sync.
#[derive(Clone)]
enum Limiter {
    Direct(Arc<RedisLimiter<RedisConn>>),
    Hybrid {
        limiter: HybridLimiter<RedisConn>,
        /// Stops the sync when the last clone goes.
        _sync: Arc<SyncTask>,
    },
}

impl Limiter {
    fn errors(&self) -> u64 {
        match self {
            Limiter::Direct(l) => l.stats().failures,
            Limiter::Hybrid { limiter: h, .. } => h.stats().failures,
        }
    }
}

/// The hybrid mode's figures, over all its limiters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HybridFigures {
    /// Decisions made locally.
    pub decisions: u64,
    /// Redis commands sent by the syncs.
    pub commands: u64,
    /// Keys whose counts wait for the next sync.
    pub pending_keys: usize,
}

/// The limiters of one Redis (or cluster), one per policy.
pub struct RedisStore {
    conn: RedisConn,
    options: RedisOptions,
    limiters: RwLock<HashMap<PolicyId, Limiter>>,
    /// The failures of limiters that were not kept.
    unkept_errors: AtomicU64,
    fail_open: AtomicU64,
    fail_closed: AtomicU64,
    local: AtomicU64,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("options", &self.options)
            .field("limiters", &self.limiters.read().len())
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Connects (waiting at most [`CONNECT_TIMEOUT`]) and checks that Redis
    /// answers: a [`ConnectionManager`] for one URL, a cluster connection
    /// for several or with [`RedisOptions::cluster`].
    ///
    /// # Errors
    ///
    /// [`RedisConnectError`]: no URL, a bad URL or prefix, or Redis does
    /// not answer.
    pub async fn connect(options: RedisOptions) -> Result<RedisStore, RedisConnectError> {
        if options.prefix.contains(['{', '}']) {
            return Err(RedisConnectError::Prefix(options.prefix));
        }
        let [first, ..] = options.urls.as_slice() else {
            return Err(RedisConnectError::NoUrl);
        };
        let urls = options.urls.join(", ");
        let conn = if options.cluster || options.urls.len() > 1 {
            for url in &options.urls {
                check_url(url)?;
            }
            let client = ClusterClientBuilder::new(options.urls.clone())
                .connection_timeout(Duration::from_secs(1))
                .build()
                .map_err(|source| RedisConnectError::Url {
                    url: urls.clone(),
                    source,
                })?;
            let mut conn = bounded(&urls, async move { client.get_async_connection().await }).await?;
            let ping = ::redis::cmd("PING");
            bounded(&urls, async move {
                ping.query_async::<String>(&mut conn).await?;
                Ok(conn)
            })
            .await
            .map(RedisConn::Cluster)?
        } else {
            let client = check_url(first)?;
            // A plain connection first, for the reason when Redis is not
            // there (the manager would retry it for seconds).
            let probe = client.clone();
            bounded(&urls, async move {
                let mut conn = probe.get_multiplexed_async_connection().await?;
                ::redis::cmd("PING").query_async::<String>(&mut conn).await?;
                Ok(())
            })
            .await?;
            // Reconnects quickly and keeps trying: a request that finds the
            // connection broken starts another round of attempts.
            let config = ConnectionManagerConfig::new()
                .set_concurrency_limit(MAX_IN_FLIGHT)
                .set_number_of_retries(2)
                .set_min_delay(Duration::from_millis(20))
                .set_max_delay(Duration::from_millis(500))
                .set_connection_timeout(Some(Duration::from_secs(1)));
            bounded(
                &urls,
                async move { client.get_connection_manager_with_config(config).await },
            )
            .await
            .map(RedisConn::Single)?
        };
        Ok(RedisStore {
            conn,
            options,
            limiters: RwLock::default(),
            unkept_errors: AtomicU64::new(0),
            fail_open: AtomicU64::new(0),
            fail_closed: AtomicU64::new(0),
            local: AtomicU64::new(0),
        })
    }

    /// The options.
    pub fn options(&self) -> &RedisOptions {
        &self.options
    }

    /// Refuses a config with a limit that has no Redis form, naming the
    /// file, line and column of its descriptor, the domain, the
    /// descriptor's path and the limit.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] for the first such limit.
    pub fn check_config(config: &Config) -> Result<(), ConfigError> {
        for domain in config.domains() {
            let file = config.file_of(&domain.name).unwrap_or("<config>");
            let mut path = Vec::new();
            check_rules(file, &domain.name, &domain.rules, &mut path)?;
        }
        Ok(())
    }

    /// The limiter of `policy`, and whether it is kept. In hybrid mode a
    /// `sliding_window` policy gets a hybrid limiter, syncing in the
    /// background, if it can be kept (one that is not kept would never
    /// sync), a direct one otherwise.
    fn limiter(&self, policy: &Policy) -> Result<(Limiter, bool), RedisStoreError> {
        let id = policy_id(policy);
        if let Some(limiter) = self.limiters.read().get(&id) {
            return Ok((limiter.clone(), true));
        }
        let prefix = format!("{}{}", self.options.prefix, policy_tag(policy));
        let mut direct = RedisLimiter::new(self.conn.clone(), *policy, prefix, self.options.timeout)?
            .with_failure_policy(self.options.failure);
        if let RedisConn::Cluster(_) = self.conn {
            // A dead master backs off its own slots, not the live masters'.
            direct = direct.with_backoff_per_slot_range();
        }
        let mut limiters = self.limiters.write();
        if let Some(limiter) = limiters.get(&id) {
            return Ok((limiter.clone(), true));
        }
        if limiters.len() >= MAX_LIMITERS {
            return Ok((Limiter::Direct(Arc::new(direct)), false));
        }
        let hybrid = match (self.options.sync_interval, policy.algorithm()) {
            (Some(interval), Algorithm::SlidingWindow { .. }) => Some(HybridOptions {
                instances: self.options.instances,
                ..HybridOptions::every(interval)
            }),
            _ => None,
        };
        let limiter = match hybrid {
            Some(options) => {
                let hybrid = HybridLimiter::new(direct, options)?;
                let task = Arc::new(hybrid.spawn_sync());
                Limiter::Hybrid {
                    limiter: hybrid,
                    _sync: task,
                }
            }
            None => Limiter::Direct(Arc::new(direct)),
        };
        limiters.insert(id, limiter.clone());
        Ok((limiter, true))
    }

    /// Decides `cost` for `key` under `policy`, the failure policy applied
    /// when Redis fails: never an error for Redis's sake.
    ///
    /// # Errors
    ///
    /// [`RedisStoreError::Unsupported`] for a policy without a Redis form
    /// (a limit override or an ad-hoc policy out of range).
    pub(crate) async fn decide(&self, policy: &Policy, key: &str, cost: u64) -> Result<Decision, RedisStoreError> {
        let (limiter, kept) = self.limiter(policy)?;
        let outcome = match &limiter {
            Limiter::Direct(l) => l.decide(key, cost).await,
            Limiter::Hybrid { limiter: h, .. } => h.decide(key, cost),
        };
        let counter = match outcome.source {
            Source::Redis => None,
            Source::FailOpen => Some(&self.fail_open),
            Source::FailClosed => Some(&self.fail_closed),
            Source::Local => Some(&self.local),
        };
        if let Some(counter) = counter {
            counter.fetch_add(1, Ordering::Relaxed);
        }
        if !kept {
            self.unkept_errors.fetch_add(limiter.errors(), Ordering::Relaxed);
        }
        Ok(outcome.decision)
    }

    /// Deletes the counts of `key` under `policy`; true if they were held.
    ///
    /// # Errors
    ///
    /// [`RedisStoreError`] when Redis fails or the policy has no Redis form.
    pub(crate) async fn reset(&self, policy: &Policy, key: &str) -> Result<bool, RedisStoreError> {
        match self.limiter(policy)?.0 {
            Limiter::Direct(l) => l.reset(key).await,
            Limiter::Hybrid { limiter: h, .. } => h.reset(key).await,
        }
    }

    /// Sends the hybrid limiters' pending counts to Redis now (at
    /// shutdown, so that no count is lost).
    ///
    /// # Errors
    ///
    /// The first limiter's sync that failed; the others are tried all the
    /// same.
    pub async fn flush(&self) -> Result<(), RedisStoreError> {
        let hybrids: Vec<HybridLimiter<RedisConn>> = self
            .limiters
            .read()
            .values()
            .filter_map(|l| match l {
                Limiter::Hybrid { limiter: h, .. } => Some(h.clone()),
                Limiter::Direct(_) => None,
            })
            .collect();
        let mut first = Ok(());
        for h in hybrids {
            if let Err(e) = h.sync().await
                && first.is_ok()
            {
                first = Err(e);
            }
        }
        first
    }

    /// The hybrid mode's figures (all 0 without it).
    pub fn hybrid(&self) -> HybridFigures {
        let mut figures = HybridFigures::default();
        for l in self.limiters.read().values() {
            if let Limiter::Hybrid { limiter: h, .. } = l {
                let s = h.stats();
                figures.decisions += s.decisions;
                figures.commands += s.commands;
                figures.pending_keys += s.pending_keys;
            }
        }
        figures
    }

    /// The failures and fallbacks so far.
    pub fn stats(&self) -> RedisStats {
        let kept: u64 = self.limiters.read().values().map(Limiter::errors).sum();
        let hybrid = self.hybrid();
        RedisStats {
            errors: kept + self.unkept_errors.load(Ordering::Relaxed),
            fail_open: self.fail_open.load(Ordering::Relaxed),
            fail_closed: self.fail_closed.load(Ordering::Relaxed),
            local: self.local.load(Ordering::Relaxed),
            sync_commands: hybrid.commands,
            pending_keys: hybrid.pending_keys as u64,
        }
    }
}

/// `future`, bounded by [`CONNECT_TIMEOUT`], its error naming `urls`.
async fn bounded<T>(urls: &str, future: impl Future<Output = ::redis::RedisResult<T>>) -> Result<T, RedisConnectError> {
    tokio::time::timeout(CONNECT_TIMEOUT, future)
        .await
        .map_err(|_| RedisConnectError::Timeout(urls.to_owned()))?
        .map_err(|source| RedisConnectError::Connect {
            urls: urls.to_owned(),
            source,
        })
}

fn check_url(url: &str) -> Result<::redis::Client, RedisConnectError> {
    ::redis::Client::open(url).map_err(|source| RedisConnectError::Url {
        url: url.to_owned(),
        source,
    })
}

/// Checks the limits of `rules` and their children; `path` is the
/// descriptor's entries so far (`key` or `key=value`).
fn check_rules(file: &str, domain: &str, rules: &[Rule], path: &mut Vec<String>) -> Result<(), ConfigError> {
    for rule in rules {
        path.push(match &rule.value {
            Some(value) => format!("{}={}", rule.key, value.as_str()),
            None => rule.key.clone(),
        });
        for (i, limit) in rule.limits.iter().enumerate() {
            let Some(policy) = &limit.policy else { continue };
            if let Err(e) = microsecond_policy(policy) {
                let name = match &limit.name {
                    Some(name) => format!("limit `{name}`"),
                    None => format!("limit {}", i + 1),
                };
                return Err(ConfigError {
                    file: file.to_owned(),
                    line: rule.line,
                    column: rule.column,
                    key: Some("rate_limit".to_owned()),
                    message: format!(
                        "domain `{domain}`, descriptor `{}`, {name}: {e} (with --redis every limit needs a Redis form)",
                        path.join(" > ")
                    ),
                });
            }
        }
        check_rules(file, domain, &rule.children, path)?;
        path.pop();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_tags_tell_policies_apart() {
        let p = |limit, algorithm| Policy::new(limit, Duration::from_secs(60), algorithm).unwrap();
        let window = |buckets, weighting| Algorithm::SlidingWindow { buckets, weighting };
        assert_eq!(
            policy_tag(&p(100, window(8, Weighting::Conservative))),
            "sliding_window:100:60000000:8c:"
        );
        assert_eq!(
            policy_tag(&p(100, window(8, Weighting::Interpolated))),
            "sliding_window:100:60000000:8i:"
        );
        assert_eq!(policy_tag(&p(5, Algorithm::Gcra { burst: 2 })), "gcra:5:60000000:2:");
        assert_eq!(policy_tag(&p(5, Algorithm::FixedWindow)), "fixed_window:5:60000000:");
        assert_eq!(policy_tag(&p(5, Algorithm::SlidingLog)), "sliding_log:5:60000000:");
    }
}
