//! Every Redis-backed store built from one [`RedisOptions`] on one connect
//! path: one server, the primary Redis Sentinel names, or a Redis Cluster;
//! each call one script ([`RedisStore`]) or, in hybrid mode, decided in the
//! process and synced ([`HybridStore`], bounded by leases or not); always
//! behind the failure policy ([`FailOver`]). The connection is probed
//! before the store is made, and the key prefix is checked once, before
//! any connection.
//!
//! # Concurrency
//!
//! Every decision is one atomic script in Redis for all of a descriptor's
//! limits (every key under the counter key's hash tag), so two instances
//! deciding the same descriptor at once never both get the last room.

use crate::store::checked_prefix;
use crate::{
    Batching, DEFAULT_LOCAL_KEYS, HybridOptions, HybridStore, RedisClock, RedisStore, RedisTls, RedisTlsError,
    SentinelConnection, SyncTask,
};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, ConnectionAddr, IntoConnectionInfo, TlsCertificates};
use redis::{Cmd, Pipeline, RedisFuture, Value};
use slidegate_memory::{Budget, MemoryStore};
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

/// How long [`RedisOptions::connect`] waits for Redis before giving up.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The least the Redis client waits for an answer or a connection (its
/// own bounds, under the store's): the hybrid mode's sync bound.
const MIN_CLIENT_TIMEOUT: Duration = Duration::from_secs(1);

/// The Redis client's own bounds for the store's timeout `timeout`: its
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

/// How to reach Redis, and what to do when it fails: everything a
/// Redis-backed store is built from ([`RedisOptions::connect`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedisOptions {
    /// `redis://` URLs (`rediss://` for TLS, all or none of them): one
    /// server, the seed nodes of a cluster, or (with
    /// [`RedisOptions::sentinel`]) the Sentinels.
    pub urls: Vec<String>,
    /// Use the cluster client even with one URL (several URLs always do,
    /// but with [`RedisOptions::sentinel`]).
    pub cluster: bool,
    /// The name of the master whose primary the Sentinels at
    /// [`RedisOptions::urls`] name (over a [`SentinelConnection`], which
    /// follows a failover); `None`: the URLs are Redis itself.
    pub sentinel: Option<String>,
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
    /// The CA, client certificate and host name check of `rediss://`
    /// URLs (one server or a cluster); by default none, the system's
    /// roots, the host name checked.
    pub tls: RedisTls,
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
            sentinel: None,
            failure: FailurePolicy::Open,
            instances: 1,
            timeout: DEFAULT_TIMEOUT,
            prefix: DEFAULT_PREFIX.to_owned(),
            sync_interval: None,
            bounded: false,
            batching: true,
            tls: RedisTls::default(),
        }
    }
}

/// Why a store could not be built: Redis could not be reached, or the
/// options cannot work.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RedisConnectError {
    /// No URL was given.
    #[error("no Redis URL")]
    NoUrl,
    /// A URL does not parse.
    #[error("bad Redis URL `{url}`: {error}")]
    Url {
        /// The URL.
        url: String,
        /// Why (in the message, not as the error's source, so that a
        /// chain of causes says it once).
        error: redis::RedisError,
    },
    /// The key prefix has `{` or `}`.
    #[error("bad Redis key prefix `{0}`: it must not contain `{{` or `}}`")]
    Prefix(String),
    /// Redis did not answer.
    #[error("cannot reach Redis at {urls}: {error}")]
    Connect {
        /// The URLs, comma-separated.
        urls: String,
        /// Why (in the message, not as the error's source).
        error: redis::RedisError,
    },
    /// The hybrid mode's options cannot work.
    #[error("bad hybrid mode options: {0}")]
    Hybrid(String),
    /// Redis did not answer within [`CONNECT_TIMEOUT`].
    #[error("cannot reach Redis at {0}: no answer within {CONNECT_TIMEOUT:?}")]
    Timeout(String),
    /// Options that contradict each other.
    #[error("bad Redis options: {0}")]
    Options(&'static str),
    /// A TLS file cannot be used, or the TLS options contradict each other.
    #[error(transparent)]
    Tls(#[from] RedisTlsError),
}

/// The connection to Redis: a [`ConnectionManager`] to one server (it
/// reconnects by itself), a [`SentinelConnection`] to the primary the
/// Sentinels name, or a [`ClusterConnection`] to a cluster (which follows
/// `MOVED`/`ASK` and reconnects to its nodes). Cheap to clone.
#[derive(Clone)]
pub enum RedisConn {
    /// One server.
    Single(ConnectionManager),
    /// The primary Redis Sentinel names.
    Sentinel(SentinelConnection),
    /// A Redis Cluster.
    Cluster(ClusterConnection),
}

impl ConnectionLike for RedisConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            RedisConn::Single(c) => c.req_packed_command(cmd),
            RedisConn::Sentinel(c) => c.req_packed_command(cmd),
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
            RedisConn::Sentinel(c) => c.req_packed_commands(pipeline, offset, count),
            RedisConn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            RedisConn::Single(c) => c.get_db(),
            RedisConn::Sentinel(c) => c.get_db(),
            RedisConn::Cluster(c) => c.get_db(),
        }
    }
}

/// Asks Redis whether it answers, on the store's own connection, apart
/// from any decision: what readiness looks at.
#[derive(Clone)]
pub struct RedisProbe {
    conn: RedisConn,
    timeout: Duration,
}

impl RedisProbe {
    /// The store's connection, for other data kept beside the counters
    /// (the quota service's ledgers).
    pub fn connection(&self) -> RedisConn {
        self.conn.clone()
    }

    /// Whether Redis answers `PING` within the store's timeout (at least
    /// 100 ms). On a cluster, the node the client picks answers.
    pub async fn answers(&self) -> bool {
        let mut conn = self.conn.clone();
        let ping = redis::cmd("PING");
        let answer = tokio::time::timeout(self.timeout, ping.query_async::<String>(&mut conn)).await;
        matches!(answer, Ok(Ok(_)))
    }
}

/// The topology [`RedisOptions`] name.
enum Topology<'a> {
    Single,
    Sentinel(&'a str),
    Cluster,
}

impl RedisOptions {
    /// Connects (waiting at most [`CONNECT_TIMEOUT`]) and checks that Redis
    /// answers: a [`ConnectionManager`] for one URL, a
    /// [`SentinelConnection`] with [`RedisOptions::sentinel`], a cluster
    /// connection for several URLs or with [`RedisOptions::cluster`]. The
    /// store is the Redis store ([`RedisStore`]: one script call per
    /// decision for all of a key's limits, or per batch of the decisions
    /// that waited together for a call in flight), or with a sync interval
    /// the hybrid mode (a [`HybridStore`] for the calls whose limits all
    /// have a hybrid form, the [`RedisStore`] for the others, on the same
    /// keys), wrapped in the failure policy ([`FailOver`]; the local
    /// fallback counts in a bounded in-memory store of
    /// [`DEFAULT_LOCAL_KEYS`] keys).
    ///
    /// # Errors
    ///
    /// [`RedisConnectError`]: no URL, a bad URL or prefix, options that
    /// contradict each other, or Redis does not answer.
    pub async fn connect(&self) -> Result<Arc<dyn DynStore>, RedisConnectError> {
        self.connect_probed().await.map(|(store, _)| store)
    }

    /// [`RedisOptions::connect`], with a [`RedisProbe`] on the same
    /// connection.
    ///
    /// # Errors
    ///
    /// Those of [`RedisOptions::connect`].
    pub async fn connect_probed(&self) -> Result<(Arc<dyn DynStore>, RedisProbe), RedisConnectError> {
        self.connect_on(RedisClock::Server).await
    }

    /// [`RedisOptions::connect_probed`], the scripts on `clock` (by
    /// default the server's) and the local fallback of
    /// [`FailurePolicy::Local`] on a client clock's own clock: for tests
    /// and replays.
    ///
    /// # Errors
    ///
    /// Those of [`RedisOptions::connect`].
    pub async fn connect_on(&self, clock: RedisClock) -> Result<(Arc<dyn DynStore>, RedisProbe), RedisConnectError> {
        let options = self;
        let prefix =
            checked_prefix(options.prefix.clone()).map_err(|_| RedisConnectError::Prefix(options.prefix.clone()))?;
        let [first, ..] = options.urls.as_slice() else {
            return Err(RedisConnectError::NoUrl);
        };
        let topology = match (&options.sentinel, options.cluster) {
            (Some(_), true) => return Err(RedisConnectError::Options("a Sentinel's primary is not a cluster")),
            (Some(master), false) => Topology::Sentinel(master),
            (None, cluster) if cluster || options.urls.len() > 1 => Topology::Cluster,
            (None, _) => Topology::Single,
        };
        let urls = options.urls.join(", ");
        let tls = tls_certificates(options, &topology)?;
        let client_timeout = client_timeout(options.timeout);
        let conn = match topology {
            Topology::Cluster => {
                for url in &options.urls {
                    check_url(url)?;
                }
                // The response timeout bounds each attempt and, by default, the
                // whole call with its redirections and retries.
                let mut builder = ClusterClientBuilder::new(options.urls.clone())
                    .connection_timeout(client_timeout)
                    .response_timeout(client_timeout);
                if let Some(certs) = tls {
                    builder = builder
                        .certs(certs)
                        .danger_accept_invalid_hostnames(options.tls.skip_hostname_verification);
                }
                let client = builder.build().map_err(|error| RedisConnectError::Url {
                    url: urls.clone(),
                    error,
                })?;
                let mut conn = bounded(&urls, async move { client.get_async_connection().await }).await?;
                let ping = redis::cmd("PING");
                bounded(&urls, async move {
                    ping.query_async::<String>(&mut conn).await?;
                    Ok(conn)
                })
                .await
                .map(RedisConn::Cluster)?
            }
            Topology::Sentinel(master) => {
                for url in &options.urls {
                    check_url(url)?;
                }
                let sentinels = options.urls.clone();
                let master = master.to_owned();
                bounded(&urls, async move {
                    let mut conn = SentinelConnection::connect(sentinels, &master).await?;
                    redis::cmd("PING").query_async::<String>(&mut conn).await?;
                    Ok(conn)
                })
                .await
                .map(RedisConn::Sentinel)?
            }
            Topology::Single => {
                let client = match tls {
                    Some(certs) => tls_client(first, certs, options.tls.skip_hostname_verification)?,
                    None => check_url(first)?,
                };
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
                    redis::cmd("PING").query_async::<String>(&mut conn).await?;
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
            }
        };
        let cluster = matches!(topology, Topology::Cluster);
        let probe = RedisProbe {
            conn: conn.clone(),
            timeout: options.timeout.max(Duration::from_millis(100)),
        };
        let mut store = RedisStore::with_prefix(conn, Arc::clone(&prefix), options.timeout).with_clock(clock.clone());
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
            None => Ok((with_failure_policy(store, options.failure, &clock), probe)),
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
                let redis = RedisStore::with_prefix(store.connection().clone(), prefix, options.timeout);
                let hybrid = HybridStore::over(redis, hybrid_options)
                    .map_err(|e| RedisConnectError::Hybrid(e.to_string()))?
                    .with_clock(clock.clone());
                let sync = hybrid.spawn_sync();
                let both = Hybrid {
                    hybrid,
                    direct: store,
                    _sync: sync,
                };
                Ok((with_failure_policy(both, options.failure, &clock), probe))
            }
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
/// in-memory store of [`DEFAULT_LOCAL_KEYS`] keys, on the monotonic clock
/// (on a client clock's own clock).
fn with_failure_policy<S: Store + 'static>(store: S, failure: FailurePolicy, clock: &RedisClock) -> Arc<dyn DynStore> {
    let budget = Budget::keys(DEFAULT_LOCAL_KEYS);
    match (failure, clock) {
        (FailurePolicy::Local { instances }, RedisClock::Server) => {
            Arc::new(FailOver::local(store, instances, MemoryStore::new(budget)))
        }
        (FailurePolicy::Local { instances }, RedisClock::Client(clock)) => Arc::new(FailOver::local(
            store,
            instances,
            MemoryStore::with_clock(budget, budget, Arc::clone(clock)),
        )),
        (policy, _) => Arc::new(FailOver::new(store, policy)),
    }
}

/// `future`, bounded by [`CONNECT_TIMEOUT`], its error naming `urls`.
async fn bounded<T>(urls: &str, future: impl Future<Output = redis::RedisResult<T>>) -> Result<T, RedisConnectError> {
    tokio::time::timeout(CONNECT_TIMEOUT, future)
        .await
        .map_err(|_| RedisConnectError::Timeout(urls.to_owned()))?
        .map_err(|error| RedisConnectError::Connect {
            urls: urls.to_owned(),
            error,
        })
}

fn check_url(url: &str) -> Result<redis::Client, RedisConnectError> {
    redis::Client::open(url).map_err(|error| RedisConnectError::Url {
        url: url.to_owned(),
        error,
    })
}

/// Whether `url` is a `rediss://` URL (TLS), refusing redis-rs's
/// `#insecure`, which would check no certificate at all.
fn is_tls(url: &str) -> Result<bool, RedisConnectError> {
    let info = url.into_connection_info().map_err(|error| RedisConnectError::Url {
        url: url.to_owned(),
        error,
    })?;
    match info.addr() {
        ConnectionAddr::TcpTls { insecure: true, .. } => Err(RedisConnectError::Url {
            url: url.to_owned(),
            error: redis::RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "`#insecure` would check no certificate; skip only the host name check instead",
            )),
        }),
        ConnectionAddr::TcpTls { .. } => Ok(true),
        _ => Ok(false),
    }
}

/// The certificates of `options`' TLS, read and checked, when its URLs are
/// `rediss://`; `None` when they are not (and no TLS option is set).
fn tls_certificates(
    options: &RedisOptions,
    topology: &Topology<'_>,
) -> Result<Option<TlsCertificates>, RedisConnectError> {
    let mut tls = None;
    for url in &options.urls {
        let this = is_tls(url)?;
        if tls.is_some_and(|before| before != this) {
            return Err(RedisConnectError::Options(
                "some URLs are `rediss://` (TLS) and some are not: all or none",
            ));
        }
        tls = Some(this);
    }
    match (tls == Some(true), topology) {
        (false, _) if options.tls.is_set() => Err(RedisConnectError::Options(
            "TLS files or options are set but the URLs are not `rediss://`",
        )),
        (false, _) => Ok(None),
        (true, Topology::Sentinel(_)) => Err(RedisConnectError::Options(
            "slidegate does not reach Redis Sentinel over TLS (`rediss://`) yet",
        )),
        (true, _) => Ok(Some(options.tls.certificates()?)),
    }
}

/// A client of the `rediss://` URL `url` with `certs`, checking the host
/// name unless `skip_hostname`.
fn tls_client(url: &str, certs: TlsCertificates, skip_hostname: bool) -> Result<redis::Client, RedisConnectError> {
    let bad_url = |error| RedisConnectError::Url {
        url: url.to_owned(),
        error,
    };
    let client = redis::Client::build_with_tls(url, certs).map_err(bad_url)?;
    if !skip_hostname {
        return Ok(client);
    }
    let info = client.get_connection_info().clone();
    let mut addr = info.addr().clone();
    addr.set_danger_accept_invalid_hostnames(true);
    redis::Client::open(info.set_addr(addr)).map_err(bad_url)
}
