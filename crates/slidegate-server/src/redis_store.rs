//! Redis as the engine's shared counter store: several instances of the
//! service on one Redis (or one Redis Cluster) share their limits.
//!
//! The store is [`RedisStore`] behind the failure policy. A counter's
//! Redis key is `<prefix><policy tag>:{<counter key>}` where the tag is
//! [`Policy::tag`](slidegate_core::Policy::tag)
//! (`v1:sliding_window:100:60000000000:8c`) and the counter key is
//! the readable one of [`Match::counter_key`](crate::config::Match::counter_key)
//! (or `adhoc:<key>` for `/v1/check`'s ad-hoc keys): the same on every
//! instance, so that they count together; a changed limit starts afresh,
//! an unchanged one keeps counting across reloads and restarts.
//!
//! # Concurrency
//!
//! Every decision is one atomic script in Redis for all of a descriptor's
//! limits (every key under the counter key's hash tag), so two instances
//! deciding the same descriptor at once never both get the last room.

use ::redis::AsyncConnectionConfig;
use ::redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use ::redis::cluster::ClusterClientBuilder;
use ::redis::cluster_async::ClusterConnection;
use ::redis::{Cmd, Pipeline, RedisFuture, Value};
use slidegate_memory::{Budget, MemoryStore};
use slidegate_redis::{Batching, DEFAULT_LOCAL_KEYS, HybridOptions, HybridStore, RedisStore, SyncTask};
use slidegate_store::{Decisions, DynStore, FailOver, FailurePolicy, Quota, Store, StoreError, StoreStats};
use std::future::Future;
use std::sync::Arc;
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

/// The least the Redis client waits for an answer or a connection (its
/// own bounds, under the store's): the hybrid mode's sync bound.
const MIN_CLIENT_TIMEOUT: Duration = Duration::from_secs(1);

/// The Redis client's own bounds for `--redis-timeout` `timeout`: its
/// response timeout and the bound of each connection attempt, the timeout
/// but at least [`MIN_CLIENT_TIMEOUT`]. The store bounds each decision by
/// `timeout` itself, the hybrid mode each sync by
/// `max(1 s, timeout)` and readiness each `PING` by `max(100 ms,
/// timeout)`; the client's bounds are a backstop that must never cut a
/// call before its caller's own bound does (redis-rs's default, 500 ms,
/// answered every call of a paused Redis at 0.5 s whatever the timeout).
/// A connection attempt runs apart from the decisions, which wait for it
/// within their own timeout.
fn client_timeout(timeout: Duration) -> Duration {
    timeout.max(MIN_CLIENT_TIMEOUT)
}

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
    /// The timeout of each call: a decision waits at most this for Redis
    /// (then the failure policy answers), whatever its value; the Redis
    /// client's own bounds follow it (at least 1 s, so that they never cut
    /// a call first).
    pub timeout: Duration,
    /// What every key starts with; no `{` or `}`.
    pub prefix: String,
    /// Hybrid mode: a descriptor whose limits are all `sliding_window` or
    /// `fixed_window` is decided locally and its counts sent to Redis every
    /// interval (see [`HybridStore`]); any other stays one script per
    /// decision. `None`: every decision is one script.
    pub sync_interval: Option<Duration>,
    /// With a sync interval, the bounded mode: decide on leased shares of
    /// each key's budget (see [`HybridOptions::lease`]), leases lasting
    /// `max(4 × interval, 200 ms)`, so that instances together never admit
    /// more than the limit in any window.
    pub bounded: bool,
    /// Requests that come while a script call is in flight go together in
    /// the next (on one server whatever their keys, on a cluster per hash
    /// slot; see [`Batching`]); `false`: one call per request.
    pub batching: bool,
}

impl RedisOptions {
    /// What the decision spans call the store: `hybrid` with a sync
    /// interval, else `redis`.
    pub fn store_name(&self) -> &'static str {
        if self.sync_interval.is_some() {
            "hybrid"
        } else {
            "redis"
        }
    }
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
            bounded: false,
            batching: true,
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
    /// The hybrid mode's options cannot work.
    #[error("bad hybrid mode options: {0}")]
    Hybrid(String),
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

/// Connects (waiting at most [`CONNECT_TIMEOUT`]) and checks that Redis
/// answers: a [`ConnectionManager`] for one URL, a cluster connection for
/// several or with [`RedisOptions::cluster`]. The store is the Redis
/// store ([`RedisStore`]: one script call per decision for all of a key's
/// limits, or per batch of the decisions that waited together for a call
/// in flight) wrapped in the failure policy ([`FailOver`]).
///
/// # Errors
///
/// [`RedisConnectError`]: no URL, a bad URL or prefix, or Redis does not
/// answer.
pub async fn connect(options: &RedisOptions) -> Result<Arc<dyn DynStore>, RedisConnectError> {
    connect_probed(options).await.map(|(store, _)| store)
}

/// Asks Redis whether it answers, on the store's own connection, apart
/// from any decision: what readiness looks at.
#[derive(Clone)]
pub struct RedisProbe {
    conn: RedisConn,
    timeout: Duration,
}

impl RedisProbe {
    /// Whether Redis answers `PING` within the store's timeout (at least
    /// 100 ms). On a cluster, the node the client picks answers.
    pub async fn answers(&self) -> bool {
        let mut conn = self.conn.clone();
        let ping = ::redis::cmd("PING");
        let answer = tokio::time::timeout(self.timeout, ping.query_async::<String>(&mut conn)).await;
        matches!(answer, Ok(Ok(_)))
    }
}

/// [`connect`], with a [`RedisProbe`] on the same connection.
///
/// # Errors
///
/// Those of [`connect`].
pub async fn connect_probed(options: &RedisOptions) -> Result<(Arc<dyn DynStore>, RedisProbe), RedisConnectError> {
    if options.prefix.contains(['{', '}']) {
        return Err(RedisConnectError::Prefix(options.prefix.clone()));
    }
    let [first, ..] = options.urls.as_slice() else {
        return Err(RedisConnectError::NoUrl);
    };
    let urls = options.urls.join(", ");
    let cluster = options.cluster || options.urls.len() > 1;
    let client_timeout = client_timeout(options.timeout);
    let conn = if cluster {
        for url in &options.urls {
            check_url(url)?;
        }
        // The response timeout bounds each attempt and, by default, the
        // whole call with its redirections and retries.
        let client = ClusterClientBuilder::new(options.urls.clone())
            .connection_timeout(client_timeout)
            .response_timeout(client_timeout)
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
        let probe_config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(client_timeout))
            .set_response_timeout(Some(client_timeout));
        bounded(&urls, async move {
            let mut conn = probe
                .get_multiplexed_async_connection_with_config(&probe_config)
                .await?;
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
            .set_connection_timeout(Some(client_timeout))
            .set_response_timeout(Some(client_timeout));
        bounded(
            &urls,
            async move { client.get_connection_manager_with_config(config).await },
        )
        .await
        .map(RedisConn::Single)?
    };
    let probe = RedisProbe {
        conn: conn.clone(),
        timeout: options.timeout.max(Duration::from_millis(100)),
    };
    let mut store = RedisStore::new(conn, options.prefix.clone(), options.timeout)
        .map_err(|_| RedisConnectError::Prefix(options.prefix.clone()))?;
    if cluster {
        // A dead master backs off its own slots, not the live masters'.
        store = store.with_backoff_per_slot_range();
    }
    store = store.with_batching(match (options.batching, cluster) {
        (false, _) => Batching::Off,
        (true, true) => Batching::PerSlot,
        // One server: requests on any keys share script calls.
        (true, false) => Batching::PerServer,
    });
    match options.sync_interval {
        None => Ok((with_failure_policy(store, options.failure), probe)),
        Some(interval) => {
            let base = if options.bounded {
                HybridOptions::leased(interval)
            } else {
                HybridOptions::every(interval)
            };
            // A sync is on no request's path: it keeps its own bound (1 s)
            // unless the timeout is longer (a Redis that slow answers
            // decisions, so it must answer syncs too).
            let hybrid_options = HybridOptions {
                instances: options.instances,
                sync_timeout: base.sync_timeout.max(options.timeout),
                ..base
            };
            let hybrid = HybridStore::new(
                store.connection().clone(),
                options.prefix.clone(),
                options.timeout,
                hybrid_options,
            )
            .map_err(|e| RedisConnectError::Hybrid(e.to_string()))?;
            let sync = hybrid.spawn_sync();
            let both = Hybrid {
                hybrid,
                direct: store,
                _sync: sync,
            };
            Ok((with_failure_policy(both, options.failure), probe))
        }
    }
}

/// The hybrid mode: a call whose limits all have a hybrid form
/// (`sliding_window`, `fixed_window`) is decided locally by the
/// [`HybridStore`] and synced every interval; any other call (a `gcra` or
/// `sliding_log` among its limits) by the direct [`RedisStore`], in one
/// script. Both name their keys alike, so they count together.
struct Hybrid {
    hybrid: HybridStore<RedisConn>,
    direct: RedisStore<RedisConn>,
    /// Stops the background sync when the store goes.
    _sync: SyncTask,
}

impl Hybrid {
    fn local(&self, quotas: &[Quota]) -> bool {
        quotas.iter().all(|q| self.hybrid.supports(q).is_ok())
    }
}

impl Store for Hybrid {
    async fn decide(&self, key: &str, quotas: &[Quota], cost: u64, out: &mut Decisions) -> Result<(), StoreError> {
        if self.local(quotas) {
            self.hybrid.decide(key, quotas, cost, out).await
        } else {
            self.direct.decide(key, quotas, cost, out).await
        }
    }

    async fn charge(&self, key: &str, quotas: &[Quota], cost: u64) -> Result<(), StoreError> {
        if self.local(quotas) {
            self.hybrid.charge(key, quotas, cost).await
        } else {
            self.direct.charge(key, quotas, cost).await
        }
    }

    async fn reset(&self, key: &str, quotas: &[Quota]) -> Result<bool, StoreError> {
        if self.local(quotas) {
            self.hybrid.reset(key, quotas).await
        } else {
            self.direct.reset(key, quotas).await
        }
    }

    fn stats(&self) -> StoreStats {
        self.hybrid.stats() + self.direct.stats()
    }

    fn decide_now(
        &self,
        key: &str,
        quotas: &[Quota],
        cost: u64,
        out: &mut Decisions,
    ) -> Option<Result<(), StoreError>> {
        if self.local(quotas) {
            self.hybrid.decide_now(key, quotas, cost, out)
        } else {
            None
        }
    }

    fn supports(&self, quota: &Quota) -> Result<(), StoreError> {
        self.direct.supports(quota)
    }

    fn flush(&self) -> impl Future<Output = Result<(), StoreError>> + Send + '_ {
        self.hybrid.flush()
    }
}

/// `store` behind `failure`: the local fallback counts in a bounded
/// in-memory store of [`DEFAULT_LOCAL_KEYS`] keys.
fn with_failure_policy<S: slidegate_store::Store + 'static>(store: S, failure: FailurePolicy) -> Arc<dyn DynStore> {
    match failure {
        FailurePolicy::Local { instances } => Arc::new(FailOver::local(
            store,
            instances,
            MemoryStore::new(Budget::keys(DEFAULT_LOCAL_KEYS)),
        )),
        policy => Arc::new(FailOver::new(store, policy)),
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

/// What the log says about the store's health: one warning when Redis
/// starts failing and one line when it answers again, never one per
/// request. Fed the failure policy's figures at each look (every second).
#[derive(Debug, Default)]
pub struct OutageLog {
    /// The figures at the last look: outages met, decisions of Redis.
    seen: (u64, u64),
    failing: bool,
}

/// A change the log reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transition {
    /// Redis started failing: this many calls met an outage since the
    /// last look.
    Failing(u64),
    /// Redis answers again.
    Recovered,
}

impl OutageLog {
    /// The change since the last look, given the failure policy's figures
    /// now: calls that met an outage, and decisions Redis made.
    pub fn observe(&mut self, stats: &slidegate_store::FailOverStats) -> Option<Transition> {
        let now = (stats.outages, stats.store_admitted + stats.store_refused);
        let (outages, decided) = (now.0.saturating_sub(self.seen.0), now.1.saturating_sub(self.seen.1));
        self.seen = now;
        match (self.failing, outages > 0, decided > 0) {
            (false, true, _) => {
                self.failing = true;
                Some(Transition::Failing(outages))
            }
            (true, false, true) => {
                self.failing = false;
                Some(Transition::Recovered)
            }
            _ => None,
        }
    }
}

/// The failure policy as the log names it.
pub fn policy_name(policy: FailurePolicy) -> String {
    match policy {
        FailurePolicy::Open => "open (admit)".to_owned(),
        FailurePolicy::Closed => "closed (refuse)".to_owned(),
        FailurePolicy::Local { instances } => format!("local (count in memory on the limit / {instances})"),
        _ => "unknown".to_owned(),
    }
}

#[cfg(test)]
mod outage_tests {
    use super::*;
    use slidegate_store::FailOverStats;

    fn stats(outages: u64, decided: u64) -> FailOverStats {
        let mut stats = FailOverStats::default();
        stats.outages = outages;
        stats.store_admitted = decided;
        stats
    }

    #[test]
    fn one_line_when_redis_fails_and_one_when_it_is_back() {
        let mut log = OutageLog::default();
        assert_eq!(log.observe(&stats(0, 10)), None);
        // Failing: one warning, however long it lasts.
        assert_eq!(log.observe(&stats(5, 10)), Some(Transition::Failing(5)));
        assert_eq!(log.observe(&stats(900, 10)), None);
        assert_eq!(log.observe(&stats(1800, 12)), None);
        // No outage and Redis decides again: recovered, once.
        assert_eq!(log.observe(&stats(1800, 20)), Some(Transition::Recovered));
        assert_eq!(log.observe(&stats(1800, 30)), None);
        // Idle (nothing asked): no line either way.
        assert_eq!(log.observe(&stats(1800, 30)), None);
        assert_eq!(log.observe(&stats(1801, 30)), Some(Transition::Failing(1)));
        // A quiet second alone is not a recovery.
        assert_eq!(log.observe(&stats(1801, 30)), None);
        assert_eq!(log.observe(&stats(1801, 31)), Some(Transition::Recovered));
    }
}
