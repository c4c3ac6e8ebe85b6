//! [`RedisStore`]: Redis (one server, a Sentinel-found primary, or a
//! Cluster) as a [`Store`], every decision on a key one script call for
//! all of its limits.

use crate::batch::{Arg, Batching, Call, Failure, Invocation, Lanes, Turn, invocation, split};
use crate::{
    DEFAULT_BACKOFF, Health, MAX_SPAN_US, MAX_TIME_US, Params, RedisClock, RedisStoreError, SLOT_RANGES, cluster_slot,
    decision_of, microsecond_policy,
};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClient, SentinelServerType};
use redis::{Cmd, ErrorKind, IntoConnectionInfo, Pipeline, RedisError, RedisFuture, Script, ServerErrorKind, Value};
use slidegate_core::Algorithm;
use slidegate_store::{Decisions, Quota, Store, StoreError, StoreStats};
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Redis as a [`Store`]: any number of instances share one count per key
/// and limit, every call one atomic script ([`scripts::MULTI`](crate::scripts::MULTI),
/// or [`scripts::ONE`](crate::scripts::ONE) for a call that is one run
/// under one limit).
///
/// # Keys
///
/// The state of `key` under a [`Quota`] is `<prefix><quota.tag()>:{<key>}`
/// (for `sliding_log` the pair `…:{<key>}:log` and `…:{<key>}:sum`), in
/// the formats of the per-policy scripts (the crate docs' table). Every
/// key of one request shares the hash tag `{<key>}`, so a Redis Cluster
/// keeps them in one slot and accepts the script, and one key's limits
/// never cross slots.
///
/// # Decisions
///
/// [`Store::decide`] is one request in a script call (`FCALL` of the
/// script as a Redis function, or `EVALSHA`:
/// [`RedisStore::uses_functions`]), for all the quotas of the key, alone
/// or with the requests that waited together for a call in flight
/// ([`Batching`], decided in arrival order): the script reads the time
/// once (the server's `TIME`, or the client clock's time sent with the
/// call), peeks every quota and charges them all or
/// none, by the rule of [`slidegate_store::decide_all`], so that it
/// decides figure for figure as the in-memory store does (on
/// [`microsecond_policy`] of each quota, at times in microseconds). A cost
/// above what a quota can ever pass is refused by it without a retry.
///
/// [`Store::charge`] records a cost under every quota in one call even
/// past the limit (as the core's `record`; a cost is kept exact up to
/// 2⁵⁰ units, or 2⁵⁰ µs of `gcra` backlog or of a `sliding_window` bucket
/// count times its width, and clamped beyond). [`Store::reset`] is one
/// `DEL` of every key of every quota.
///
/// # Failures
///
/// Every call is bounded by the timeout ([`StoreError::Timeout`]); a
/// connection or server failure is [`StoreError::Unavailable`]. After
/// either, calls fail at once with [`StoreError::Unavailable`] for the
/// backoff ([`RedisStore::with_backoff`], 100 ms by default; per range of
/// 256 cluster slots with [`RedisStore::with_backoff_per_slot_range`]),
/// then Redis is tried again; wrap the store in a
/// [`FailOver`](slidegate_store::FailOver) for a failure policy. A limit
/// without a Redis form (`exponential_histogram`, or out of the crate's
/// ranges) is [`StoreError::Unsupported`] ([`Store::supports`]).
///
/// # Concurrency
///
/// Cheap to clone: clones share the connection, the backoff, the lanes of
/// the batching and the figures. Calls on the same key are atomic with
/// respect to each other (Redis runs one script at a time); calls in
/// flight share the connection (a multiplexed connection pipelines them).
/// A request waiting for a call in flight waits at most the timeout; one
/// given up before its call is sent is left out of it.
#[derive(Clone)]
pub struct RedisStore<C = MultiplexedConnection> {
    conn: C,
    prefix: Arc<str>,
    timeout: Duration,
    clock: RedisClock,
    backoff: Duration,
    per_slot_range: bool,
    health: Arc<Health>,
    lanes: Arc<Lanes>,
    /// The scripts are called as Redis functions (until the server will
    /// not load one).
    functions: Arc<AtomicBool>,
}

impl<C> fmt::Debug for RedisStore<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .field("clock", &self.clock)
            .field("backoff", &self.backoff)
            .field("per_slot_range", &self.per_slot_range)
            .field("batching", &self.lanes.batching())
            .field("errors", &self.health.failures)
            .finish_non_exhaustive()
    }
}

/// `prefix` as a store's key prefix: one without `{` or `}`, which would
/// change the keys' hash tags. Every store is made through it, checked
/// once, before any connection.
pub(crate) fn checked_prefix(prefix: String) -> Result<Arc<str>, RedisStoreError> {
    if prefix.contains(['{', '}']) {
        return Err(RedisStoreError::Prefix(prefix));
    }
    Ok(prefix.into())
}

/// What a script call does.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Decide,
    Charge,
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> RedisStore<C> {
    /// A store over `conn`, its keys starting with `prefix`, each call
    /// bounded by `timeout`, on the server's clock.
    ///
    /// # Errors
    ///
    /// [`RedisStoreError::Prefix`] for a prefix with `{` or `}`.
    pub fn new(conn: C, prefix: impl Into<String>, timeout: Duration) -> Result<Self, RedisStoreError> {
        Ok(RedisStore::with_prefix(conn, checked_prefix(prefix.into())?, timeout))
    }

    /// [`RedisStore::new`] with a prefix [`checked_prefix`] let through.
    pub(crate) fn with_prefix(conn: C, prefix: Arc<str>, timeout: Duration) -> Self {
        RedisStore {
            conn,
            prefix,
            timeout,
            clock: RedisClock::Server,
            backoff: DEFAULT_BACKOFF,
            per_slot_range: false,
            health: Arc::new(Health::new()),
            lanes: Arc::new(Lanes::new(Batching::default())),
            functions: Arc::new(AtomicBool::new(true)),
        }
    }

    /// The same store on `clock` (by default [`RedisClock::Server`]).
    #[must_use]
    pub fn with_clock(mut self, clock: RedisClock) -> Self {
        self.clock = clock;
        self
    }

    /// The same store failing at once for `backoff` after a failure (by
    /// default [`DEFAULT_BACKOFF`], 100 ms).
    #[must_use]
    pub fn with_backoff(mut self, backoff: Duration) -> Self {
        self.backoff = backoff;
        self
    }

    /// The same store backing off per range of Redis Cluster slots (64
    /// ranges of 256) instead of as a whole, so that a dead master does not
    /// fail the keys of the live ones. For a cluster connection.
    #[must_use]
    pub fn with_backoff_per_slot_range(mut self) -> Self {
        self.per_slot_range = true;
        self
    }

    /// The same store grouping requests into script calls by `batching`
    /// (by default [`Batching::PerSlot`]); see [`Batching`]. Clones made
    /// before share the old grouping.
    #[must_use]
    pub fn with_batching(mut self, batching: Batching) -> Self {
        self.lanes = Arc::new(Lanes::new(batching));
        self
    }

    /// How requests are grouped into script calls.
    pub fn batching(&self) -> Batching {
        self.lanes.batching()
    }

    /// The script calls sent for decisions and charges, and the requests
    /// they carried (their ratio is the requests per call).
    pub fn script_calls(&self) -> (u64, u64) {
        self.lanes.figures()
    }

    /// Whether the scripts are called as Redis functions (`FCALL`, see
    /// [`Function`](crate::Function)): true until the server will not load
    /// one (no functions before Redis 7.0, an ACL without `FUNCTION`, a
    /// proxy that refuses it), then false for good: the scripts go by
    /// `EVALSHA`, deciding the same.
    pub fn uses_functions(&self) -> bool {
        self.functions.load(Ordering::Relaxed)
    }

    /// The connection (clones share it).
    pub fn connection(&self) -> &C {
        &self.conn
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The timeout of each call.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Where the time comes from.
    pub fn clock(&self) -> &RedisClock {
        &self.clock
    }

    /// The Redis key of the state of `key` under `quota`,
    /// `<prefix><tag>:{<key>}`: its identity's
    /// ([`Identity::redis_key`](slidegate_core::Identity::redis_key); for
    /// `sliding_log`, the stem of its two).
    pub(crate) fn redis_key(&self, key: &str, quota: &Quota) -> String {
        quota.identity().redis_key(&self.prefix, key)
    }

    /// Every Redis key of the state of `key` under `quota`:
    /// `<prefix><tag>:{<key>}`, or for `sliding_log` its `:log` and `:sum`.
    pub fn redis_keys(&self, key: &str, quota: &Quota) -> Vec<String> {
        let base = self.redis_key(key, quota);
        match quota.policy().algorithm() {
            Algorithm::SlidingLog => vec![format!("{base}:log"), format!("{base}:sum")],
            _ => vec![base],
        }
    }

    /// The range of slots whose backoff `key` follows (0 for the whole),
    /// and the lane its requests wait on: both of its cluster slot, read
    /// only when one needs it.
    fn range_and_lane(&self, key: &str) -> (usize, usize) {
        let per_slot_lane = self.lanes.batching() == Batching::PerSlot;
        if !self.per_slot_range && !per_slot_lane {
            return (0, 0);
        }
        // Every key of the request has the hash tag `{<key>}`.
        let slot = usize::from(cluster_slot(format!("{{{key}}}").as_bytes()));
        let range = if self.per_slot_range {
            slot * SLOT_RANGES / 16384
        } else {
            0
        };
        (range, if per_slot_lane { slot } else { 0 })
    }

    /// The time sent to the script: the client clock's microseconds, or
    /// -1 for the server's `TIME`.
    fn now(&self) -> Result<i64, StoreError> {
        match &self.clock {
            RedisClock::Server => Ok(-1),
            RedisClock::Client(clock) => {
                let now_us = clock.now() / 1000;
                if now_us > MAX_TIME_US {
                    return Err(StoreError::unavailable(RedisStoreError::TimeOutOfRange { now_us }));
                }
                Ok(now_us as i64)
            }
        }
    }

    /// The part of a script call that is `mode` at `cost` on `key` under
    /// every quota.
    fn request(&self, key: &str, quotas: &[Quota], mode: Mode, cost: u64) -> Result<Call, StoreError> {
        let mut keys = Vec::with_capacity(quotas.len());
        let mut shape = Vec::with_capacity(2 + 5 * quotas.len());
        let mut costs = Vec::with_capacity(quotas.len());
        shape.push(Arg::Str(if mode == Mode::Decide { "d" } else { "c" }));
        shape.push(Arg::Int(quotas.len() as i64));
        for quota in quotas {
            let params = params(quota)?;
            keys.extend(self.redis_keys(key, quota));
            let (kind, figures, step) = match params {
                Params::FixedWindow { w, limit } => ("f", [w, limit, 0, 0], 1),
                Params::Gcra { t, burst, limit } => ("g", [t, burst, limit, 0], t),
                Params::SlidingLog { w, limit } => ("l", [w, limit, 0, 0], 1),
                Params::SlidingWindow {
                    b,
                    n,
                    limit,
                    conservative,
                } => ("w", [b, n, limit, conservative], b),
            };
            let cost = match mode {
                // Any cost above what can pass is decided alike.
                Mode::Decide => cost.min(params.capacity() + 1),
                // Kept exact: at most 2^50 (of µs for gcra and a bucket).
                Mode::Charge => cost.min(MAX_SPAN_US / step.max(1)),
            };
            shape.push(Arg::Str(kind));
            // Every figure and cost is at most 2^52 (the crate's ranges).
            shape.extend(figures.map(|f| Arg::Int(f as i64)));
            costs.push(cost as i64);
        }
        let (range, lane) = self.range_and_lane(key);
        Ok(Call {
            keys,
            shape,
            now: self.now()?,
            costs,
            reply_len: if mode == Mode::Decide { 8 * quotas.len() } else { 1 },
            range,
            lane,
        })
    }

    /// Runs `call` within the timeout, unless `range` backs off; a failure
    /// is counted and starts a backoff.
    async fn run<T>(&self, range: usize, call: impl Future<Output = redis::RedisResult<T>>) -> Result<T, Failure> {
        if self.health.in_backoff(range) {
            return Err(Failure::Backoff(self.backoff));
        }
        let failed = |e| {
            self.health.failures.fetch_add(1, Ordering::Relaxed);
            self.health.back_off(range, self.backoff);
            e
        };
        match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(failed(Failure::Redis(e))),
            Err(_) => Err(failed(Failure::Timeout(self.timeout))),
        }
    }

    /// One script call of `calls`, in order: the replies of all, one after
    /// the other.
    async fn send(&self, calls: &[Call]) -> Result<Vec<i64>, Failure> {
        let range = calls.first().map_or(0, |c| c.range);
        let invocation = invocation(calls, self.functions.load(Ordering::Relaxed));
        self.lanes.count(calls.len());
        let mut conn = self.conn.clone();
        let Packed(reply) = self
            .run(range, call_script(&invocation, &mut conn, &self.functions))
            .await?;
        Ok(reply)
    }

    /// The reply to `call`: sent at once when its lane is free (then the
    /// lane is handed on to the requests that came meanwhile), else in the
    /// lane's next call.
    async fn call(&self, call: Call) -> Result<Vec<i64>, StoreError> {
        if self.health.in_backoff(call.range) {
            return Err(Failure::Backoff(self.backoff).into());
        }
        if self.lanes.batching() == Batching::Off {
            return Ok(self.send_one(call).await?);
        }
        let lane = call.lane;
        match self.lanes.turn(lane, call) {
            Turn::Lead(call) => {
                let _hand_on = HandOn { store: self, lane };
                Ok(self.send_one(call).await?)
            }
            Turn::Wait(rx) => match tokio::time::timeout(self.timeout, rx).await {
                Ok(Ok(reply)) => Ok(reply?),
                Ok(Err(_)) => Err(Failure::Abandoned.into()),
                Err(_) => Err(StoreError::Timeout(self.timeout)),
            },
        }
    }

    /// One script call of `call` alone: its reply.
    async fn send_one(&self, call: Call) -> Result<Vec<i64>, Failure> {
        let reply_len = call.reply_len;
        let reply = self.send(&[call]).await?;
        if reply.len() != reply_len {
            return Err(Failure::Reply(reply));
        }
        Ok(reply)
    }

    async fn decide_all(&self, key: &str, quotas: &[Quota], cost: u64, out: &mut Decisions) -> Result<(), StoreError> {
        out.clear();
        if quotas.is_empty() {
            return Err(StoreError::NoQuota);
        }
        let call = self.request(key, quotas, Mode::Decide, cost)?;
        let reply = self.call(call).await?;
        for (quota, one) in quotas.iter().zip(reply.chunks_exact(8)) {
            match decision_of(quota.policy(), one) {
                Ok(decision) => out.push(decision),
                Err(e) => {
                    out.clear();
                    return Err(StoreError::unavailable(e));
                }
            }
        }
        Ok(())
    }

    async fn charge_all(&self, key: &str, quotas: &[Quota], cost: u64) -> Result<(), StoreError> {
        if quotas.is_empty() || cost == 0 {
            // Nothing to record: no call.
            return Ok(());
        }
        let call = self.request(key, quotas, Mode::Charge, cost)?;
        self.call(call).await?;
        Ok(())
    }

    async fn reset_all(&self, key: &str, quotas: &[Quota]) -> Result<bool, StoreError> {
        if quotas.is_empty() {
            return Ok(false);
        }
        let mut del = redis::cmd("DEL");
        for quota in quotas {
            del.arg(self.redis_keys(key, quota));
        }
        let mut conn = self.conn.clone();
        let deleted: i64 = self.run(self.range_and_lane(key).0, del.query_async(&mut conn)).await?;
        Ok(deleted > 0)
    }
}

/// Hands a lane on when its leader's own call is over, answered or
/// dropped: the lane is free when nobody waits, else the requests that came
/// meanwhile go in the next call, sent by a task of their own.
struct HandOn<'a, C: ConnectionLike + Clone + Send + Sync + 'static> {
    store: &'a RedisStore<C>,
    lane: usize,
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> Drop for HandOn<'_, C> {
    fn drop(&mut self) {
        if self.store.lanes.free_if_idle(self.lane) {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let drain = Drain {
                    store: self.store.clone(),
                    lane: self.lane,
                    done: false,
                };
                runtime.spawn(drain.run());
            }
            // No runtime to send them on: the waiting requests fail now.
            Err(_) => self.store.lanes.abandon(self.lane, &Failure::Abandoned),
        }
    }
}

/// The most times a lane's task yields before a call, waiting for as many
/// requests as the last call carried.
const YIELDS: usize = 4;

/// The task that sends a lane's calls until nobody waits. Before taking
/// the requests of each call it yields to the runtime (at most [`YIELDS`]
/// times, until as many wait as the last call carried), so that the tasks
/// the last reply woke (and the sockets ready meanwhile) run first: those
/// that come back at once with their next request join this call instead
/// of waiting for the one after, and a busy lane's calls carry all its
/// callers instead of alternating halves. No timer: a yield is one pass of
/// the scheduler, microseconds when nothing else is ready. Dropped before
/// it is done (its runtime shut down), it frees the lane and fails the
/// requests still waiting, so that none waits for a call that will never
/// be sent.
struct Drain<C: ConnectionLike + Clone + Send + Sync + 'static> {
    store: RedisStore<C>,
    lane: usize,
    done: bool,
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> Drain<C> {
    async fn run(mut self) {
        // The requests the last call carried.
        let mut carried = 0;
        loop {
            for _ in 0..YIELDS {
                tokio::task::yield_now().await;
                if self.store.lanes.waiting(self.lane) >= carried {
                    break;
                }
            }
            let Some((calls, replies)) = self.store.lanes.hand_on(self.lane) else {
                break;
            };
            carried = calls.len();
            match self.store.send(&calls).await.and_then(|reply| split(&calls, reply)) {
                Ok(out) => {
                    for (reply, one) in replies.into_iter().zip(out) {
                        let _ = reply.send(Ok(one));
                    }
                }
                Err(failure) => {
                    for reply in replies {
                        let _ = reply.send(Err(failure.clone()));
                    }
                }
            }
        }
        self.done = true;
    }
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> Drop for Drain<C> {
    fn drop(&mut self) {
        if !self.done {
            self.store.lanes.abandon(self.lane, &Failure::Abandoned);
        }
    }
}

/// The script's figures of `quota`, or why it has no Redis form.
/// Whether a [`RedisStore`] can keep `quota`, without a connection: the
/// answer of its [`Store::supports`](slidegate_store::Store::supports).
///
/// # Errors
///
/// [`StoreError::Unsupported`] with the reason.
pub fn supports_quota(quota: &Quota) -> Result<(), StoreError> {
    params(quota).map(drop)
}

fn params(quota: &Quota) -> Result<Params, StoreError> {
    match microsecond_policy(quota.policy()) {
        Ok(micro) => Ok(Params::of(&micro)),
        Err(RedisStoreError::Unsupported { policy, reason }) => Err(StoreError::Unsupported {
            policy,
            reason: reason.to_owned(),
        }),
        Err(e) => Err(StoreError::Unsupported {
            policy: quota.policy().to_string(),
            reason: e.to_string(),
        }),
    }
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> Store for RedisStore<C> {
    fn decide<'a>(
        &'a self,
        key: &'a str,
        quotas: &'a [Quota],
        cost: u64,
        out: &'a mut Decisions,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a {
        self.decide_all(key, quotas, cost, out)
    }

    fn charge<'a>(
        &'a self,
        key: &'a str,
        quotas: &'a [Quota],
        cost: u64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a {
        self.charge_all(key, quotas, cost)
    }

    fn reset<'a>(
        &'a self,
        key: &'a str,
        quotas: &'a [Quota],
    ) -> impl Future<Output = Result<bool, StoreError>> + Send + 'a {
        self.reset_all(key, quotas)
    }

    fn stats(&self) -> StoreStats {
        let mut stats = StoreStats::default();
        stats.errors = self.health.failures.load(Ordering::Relaxed);
        (stats.script_calls, stats.script_requests) = self.lanes.figures();
        stats
    }

    fn supports(&self, quota: &Quota) -> Result<(), StoreError> {
        params(quota).map(drop)
    }
}

impl RedisStore<ConnectionManager> {
    /// A store over one server at `url`, through a
    /// [`ConnectionManager`] (which reconnects by itself after the server
    /// went away), each connection attempt and call bounded by `timeout`.
    ///
    /// # Errors
    ///
    /// [`RedisStoreError::Redis`] for a bad URL or a server that does not
    /// answer; [`RedisStoreError::Prefix`] as [`RedisStore::new`].
    pub async fn connect(url: &str, prefix: impl Into<String>, timeout: Duration) -> Result<Self, RedisStoreError> {
        let prefix = checked_prefix(prefix.into())?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout));
        let conn = redis::Client::open(url)?
            .get_connection_manager_with_config(config)
            .await?;
        Ok(RedisStore::with_prefix(conn, prefix, timeout).with_batching(Batching::PerServer))
    }
}

impl RedisStore<ClusterConnection> {
    /// A store over the Redis Cluster that `seeds` (some of its nodes'
    /// URLs) belong to, backing off per range of slots.
    ///
    /// # Errors
    ///
    /// [`RedisStoreError::Redis`] when no seed answers;
    /// [`RedisStoreError::Prefix`] as [`RedisStore::new`].
    pub async fn connect_cluster<T: IntoConnectionInfo>(
        seeds: impl IntoIterator<Item = T>,
        prefix: impl Into<String>,
        timeout: Duration,
    ) -> Result<Self, RedisStoreError> {
        let prefix = checked_prefix(prefix.into())?;
        let conn = redis::cluster::ClusterClient::new(seeds)?
            .get_async_connection()
            .await?;
        Ok(RedisStore::with_prefix(conn, prefix, timeout).with_backoff_per_slot_range())
    }
}

impl RedisStore<SentinelConnection> {
    /// A store over the primary that the Redis Sentinels at
    /// `sentinels` name for `master`; see [`SentinelConnection`].
    ///
    /// # Errors
    ///
    /// [`RedisStoreError::Redis`] when no Sentinel names a primary that
    /// answers; [`RedisStoreError::Prefix`] as [`RedisStore::new`].
    pub async fn connect_sentinel<T: IntoConnectionInfo>(
        sentinels: Vec<T>,
        master: &str,
        prefix: impl Into<String>,
        timeout: Duration,
    ) -> Result<Self, RedisStoreError> {
        let prefix = checked_prefix(prefix.into())?;
        let conn = tokio::time::timeout(timeout, SentinelConnection::connect(sentinels, master))
            .await
            .map_err(|_| RedisStoreError::Timeout(timeout))??;
        Ok(RedisStore::with_prefix(conn, prefix, timeout).with_batching(Batching::PerServer))
    }
}

/// A connection to the primary that Redis Sentinel names for a master,
/// found again after a failover.
///
/// The primary is asked of the Sentinels (redis-rs's [`SentinelClient`])
/// when the connection is made, again by the first call a second or more
/// after the last answer (so that a failover is followed within about a
/// second even while the old primary still takes writes, which are lost
/// when it is made a replica), and by the first call after a call failed
/// with a connection error or `READONLY` (the primary became a replica;
/// that call fails, and the store's backoff answers the next ones at
/// once). While no Sentinel answers, the primary there is is kept.
///
/// # Concurrency
///
/// Cheap to clone: clones share one multiplexed connection to the
/// primary, and one lookup of a new primary at a time (the others wait
/// for it, each within its own call's timeout).
#[derive(Clone)]
pub struct SentinelConnection {
    shared: Arc<SentinelShared>,
}

struct SentinelShared {
    client: tokio::sync::Mutex<SentinelClient>,
    primary: parking_lot::Mutex<Option<Primary>>,
}

/// The primary a [`SentinelConnection`] talks to, and when the Sentinels
/// last confirmed it.
#[derive(Clone)]
struct Primary {
    conn: MultiplexedConnection,
    addr: String,
    checked: Instant,
}

/// How often a [`SentinelConnection`] asks the Sentinels again whether its
/// primary is still the primary.
const SENTINEL_RECHECK: Duration = Duration::from_secs(1);

impl fmt::Debug for SentinelConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let primary = self.shared.primary.lock().as_ref().map(|p| p.addr.clone());
        f.debug_struct("SentinelConnection")
            .field("primary", &primary)
            .finish_non_exhaustive()
    }
}

impl SentinelConnection {
    /// A connection to the primary that the Sentinels at `sentinels` name
    /// for `master`, made now.
    ///
    /// # Errors
    ///
    /// When no Sentinel names a primary, or the primary does not answer.
    pub async fn connect<T: IntoConnectionInfo>(sentinels: Vec<T>, master: &str) -> redis::RedisResult<Self> {
        let client = SentinelClient::build(sentinels, master, None, SentinelServerType::Master)?;
        let conn = SentinelConnection {
            shared: Arc::new(SentinelShared {
                client: tokio::sync::Mutex::new(client),
                primary: parking_lot::Mutex::new(None),
            }),
        };
        conn.primary().await?;
        Ok(conn)
    }

    /// The connection to the primary; the Sentinels are asked again when
    /// there is none or it was confirmed more than a second ago.
    async fn primary(&self) -> redis::RedisResult<MultiplexedConnection> {
        let fresh = || {
            self.shared
                .primary
                .lock()
                .as_ref()
                .filter(|p| p.checked.elapsed() < SENTINEL_RECHECK)
                .map(|p| p.conn.clone())
        };
        if let Some(conn) = fresh() {
            return Ok(conn);
        }
        let mut client = self.shared.client.lock().await;
        // Another call may have asked while this one waited.
        if let Some(conn) = fresh() {
            return Ok(conn);
        }
        let current = self.shared.primary.lock().clone();
        let named = match client.async_get_client().await {
            Ok(named) => named,
            // The Sentinels do not answer: keep the primary there is.
            Err(e) => {
                return match current {
                    Some(p) => Ok(p.conn),
                    None => Err(e),
                };
            }
        };
        let addr = named.get_connection_info().addr().to_string();
        let conn = match current {
            Some(p) if p.addr == addr => p.conn,
            _ => named.get_multiplexed_async_connection().await?,
        };
        *self.shared.primary.lock() = Some(Primary {
            conn: conn.clone(),
            addr,
            checked: Instant::now(),
        });
        Ok(conn)
    }

    /// Forgets the primary after `e` if `e` says it is gone or no longer
    /// the primary.
    fn forget_after(&self, e: &RedisError) {
        let gone = e.is_io_error()
            || e.is_connection_dropped()
            || e.is_connection_refusal()
            || e.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly);
        if gone {
            *self.shared.primary.lock() = None;
        }
    }
}

impl ConnectionLike for SentinelConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let mut conn = self.primary().await?;
            let answer = conn.req_packed_command(cmd).await;
            if let Err(e) = &answer {
                self.forget_after(e);
            }
            answer
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let mut conn = self.primary().await?;
            let answer = conn.req_packed_commands(pipeline, offset, count).await;
            if let Err(e) = &answer {
                self.forget_after(e);
            }
            answer
        })
    }

    fn get_db(&self) -> i64 {
        self.shared.primary.lock().as_ref().map_or(0, |p| p.conn.get_db())
    }
}

/// `cmd`, an `EVALSHA` of `script`, answered; on `NOSCRIPT` (a server
/// restarted, flushed, or new to the cluster) the script is loaded (on
/// every master of a Cluster) and `cmd` sent again, once.
async fn eval<T: redis::FromRedisValue>(
    script: &Script,
    cmd: &Cmd,
    conn: &mut impl ConnectionLike,
) -> redis::RedisResult<T> {
    match cmd.query_async(conn).await {
        Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            script.load_async(conn).await?;
            cmd.query_async(conn).await
        }
        answered => answered,
    }
}

/// `invocation`'s reply. By `FCALL`, its function is loaded (`FUNCTION LOAD
/// REPLACE`, on every primary of a Cluster) when the server has none by its
/// name, and the call sent again. A server without functions (`FCALL`
/// unknown) or that refuses the load for good ([`refuses`]: an ACL without
/// `FUNCTION`, a proxy that does not know it) gets the call by `EVALSHA`,
/// and so does every later call of the store (`functions` cleared); a load
/// that fails for a while fails the call, as any other failure.
async fn call_script<T: redis::FromRedisValue>(
    invocation: &Invocation,
    conn: &mut impl ConnectionLike,
    functions: &AtomicBool,
) -> redis::RedisResult<T> {
    let Some(function) = invocation.function else {
        return eval(invocation.script, &invocation.cmd, conn).await;
    };
    match invocation.cmd.query_async(conn).await {
        Err(e) if says(&e, "Function not found") => {
            let mut load = redis::cmd("FUNCTION");
            load.arg("LOAD").arg("REPLACE").arg(function.library.as_str());
            match load.query_async::<()>(conn).await {
                Ok(()) => return invocation.cmd.query_async(conn).await,
                Err(e) if refuses(&e) => {}
                Err(e) => return Err(e),
            }
        }
        Err(e) if says(&e, "unknown command") => {}
        answered => return answered,
    }
    functions.store(false, Ordering::Relaxed);
    eval(invocation.script, &invocation.by_evalsha(), conn).await
}

/// Whether the server refused a `FUNCTION LOAD` for good (an unknown
/// command or subcommand, an ACL), not for a while (loading, a Cluster
/// down or moving, a connection lost).
fn refuses(e: &redis::RedisError) -> bool {
    matches!(
        e.kind(),
        ErrorKind::Server(ServerErrorKind::ResponseError | ServerErrorKind::NoPerm)
    )
}

/// Whether a server's error says `words`.
fn says(e: &redis::RedisError, words: &str) -> bool {
    matches!(e.kind(), ErrorKind::Server(_))
        && (e.detail().is_some_and(|d| d.contains(words)) || e.to_string().contains(words))
}

/// A script's reply: its integers, sent as one string of little-endian
/// 64-bit integers (`packed` in `scripts/decide.lua`): read with no parser
/// per integer, a decision's reply costs the client about 9,000 fewer
/// instructions than as an array, and Redis about the same (BENCHMARKS.md).
struct Packed(Vec<i64>);

impl redis::FromRedisValue for Packed {
    fn from_redis_value(v: redis::Value) -> Result<Self, redis::ParsingError> {
        match v {
            redis::Value::BulkString(bytes) if bytes.len() % 8 == 0 => Ok(Packed(
                bytes
                    .chunks_exact(8)
                    .map(|b| i64::from_le_bytes(b.try_into().unwrap_or_default()))
                    .collect(),
            )),
            other => Err(format!("a script answered {other:?}, not its integers packed in a string").into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Packed;
    use redis::{FromRedisValue, Value};

    #[test]
    fn a_packed_reply_reads_as_its_integers() {
        let mut bytes = Vec::new();
        for x in [0_i64, 1, -1, i64::MAX, i64::MIN, 1_700_000_000_000_000] {
            bytes.extend_from_slice(&x.to_le_bytes());
        }
        let Packed(got) = Packed::from_redis_value(Value::BulkString(bytes)).unwrap();
        assert_eq!(got, [0, 1, -1, i64::MAX, i64::MIN, 1_700_000_000_000_000]);
        let Packed(empty) = Packed::from_redis_value(Value::BulkString(Vec::new())).unwrap();
        assert!(empty.is_empty());
    }

    #[test]
    fn only_a_lasting_refusal_of_functions_turns_to_evalsha() {
        use super::{refuses, says};
        use redis::{ErrorKind, RedisError, ServerErrorKind};
        let server = |kind, detail: &str| RedisError::from((ErrorKind::Server(kind), "server", detail.to_owned()));
        let unknown = server(
            ServerErrorKind::ResponseError,
            "unknown command 'FCALL', with args beginning with: ",
        );
        assert!(says(&unknown, "unknown command"));
        assert!(!says(&unknown, "Function not found"));
        assert!(says(
            &server(ServerErrorKind::ResponseError, "Function not found"),
            "Function not found"
        ));
        assert!(refuses(&server(
            ServerErrorKind::NoPerm,
            "no permissions to run 'function|load'"
        )));
        assert!(refuses(&unknown));
        for passing in [
            ServerErrorKind::BusyLoading,
            ServerErrorKind::ClusterDown,
            ServerErrorKind::TryAgain,
            ServerErrorKind::MasterDown,
            ServerErrorKind::ReadOnly,
        ] {
            assert!(!refuses(&server(passing, "for a while")), "{passing:?}");
        }
        let lost = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert!(!refuses(&lost) && !says(&lost, "unknown command"));
    }

    #[test]
    fn anything_else_is_an_error_that_shows_it() {
        let torn = Packed::from_redis_value(Value::BulkString(vec![1; 7])).err().unwrap();
        assert!(torn.to_string().contains("not its integers packed"), "{torn}");
        let array = Packed::from_redis_value(Value::Array(vec![Value::Int(1)]))
            .err()
            .unwrap();
        assert!(array.to_string().contains("int(1)"), "{array}");
    }
}
