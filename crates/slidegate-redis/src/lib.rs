//! Redis as the shared store of slidegate limits: every decision is one
//! atomic Lua script, run with `EVALSHA`, so that any number of instances
//! share one count per key.
//!
//! [`RedisLimiter`] has the interface of the in-memory keyed limiter
//! (`check(key, cost) -> Result<Decision, _>`), asynchronous: it limits every
//! key to one [`Policy`] over a multiplexed connection to one server, or
//! over a cluster connection to a Redis Cluster, with a timeout per call.
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use slidegate_core::{Algorithm, Policy};
//! use slidegate_redis::RedisLimiter;
//! use std::time::Duration;
//!
//! let client = redis::Client::open("redis://127.0.0.1:6379/")?;
//! let conn = client.get_multiplexed_async_connection().await?;
//! let policy = Policy::new(100, Duration::from_secs(60), Algorithm::Gcra { burst: 10 })?;
//! let limiter = RedisLimiter::new(conn, policy, "rl:", Duration::from_millis(50))?;
//! let decision = limiter.check("user:42", 1).await?;
//! if !decision.allowed() {
//!     println!("retry after {:?}", decision.retry_after());
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # The store interface
//!
//! [`RedisStore`] is Redis as a [`slidegate_store::Store`]: a request on a
//! key against any number of limits is one `EVALSHA` of
//! [`scripts::MULTI`], which reads the time once and decides every limit
//! all or nothing, by the rule of [`slidegate_store::decide_all`] (so that
//! it answers as the in-memory store does); charges after the fact and
//! resets are one call too. The state of `key` under a limit is
//! `<prefix><tag>:{<key>}` (the tag is [`Policy::tag`]), in the formats
//! below, so every key of one request shares the hash tag `{<key>}` and a
//! Redis Cluster keeps them in one slot. It runs over one server
//! ([`RedisStore::connect`], a reconnecting
//! [`ConnectionManager`](redis::aio::ConnectionManager)), a Cluster
//! ([`RedisStore::connect_cluster`]) or the primary that Redis Sentinel
//! names ([`RedisStore::connect_sentinel`], a [`SentinelConnection`] that
//! asks the Sentinels again after the primary failed or became a
//! replica).
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use slidegate_core::{Algorithm, Policy};
//! use slidegate_redis::RedisStore;
//! use slidegate_store::{Decisions, FailOver, FailurePolicy, Quota, Store};
//! use std::time::Duration;
//!
//! let redis = RedisStore::connect("redis://127.0.0.1:6379/", "rl:", Duration::from_millis(20)).await?;
//! let store = FailOver::new(redis, FailurePolicy::Open);
//! let minute = Policy::new(100, Duration::from_secs(60), Algorithm::FixedWindow)?;
//! let hour = Policy::new(1000, Duration::from_secs(3600), Algorithm::SlidingLog)?;
//! let limits = [Quota::new(minute), Quota::new(hour)];
//! let mut out = Decisions::new();
//! store.decide("user:42", &limits, 1, &mut out).await?;
//! if !out.iter().all(|d| d.allowed()) {
//!     println!("refused");
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # Algorithms
//!
//! | algorithm | Redis state of a key | script |
//! |---|---|---|
//! | `fixed_window` | hash `<prefix>{<key>}`: `w` (window index), `c` (count) | [`scripts::FIXED_WINDOW`] |
//! | `gcra` | hash `<prefix>{<key>}`: `t` (the theoretical arrival time) | [`scripts::GCRA`] |
//! | `sliding_log` | sorted set `<prefix>{<key>}:log`: member `<time>:<cost>`, score `<time>`; string `<prefix>{<key>}:sum`: the sum of the log's costs | [`scripts::SLIDING_LOG`] |
//! | `sliding_window` | hash `<prefix>{<key>}`: `n` (the newest bucket index), and `<i>` (the count of bucket `i`) for each non-empty bucket of the ring | [`scripts::SLIDING_WINDOW`] |
//!
//! `exponential_histogram` has no Redis form: [`RedisLimiter::new`] refuses
//! it with [`RedisStoreError::Unsupported`].
//!
//! The `sliding_window` ring keeps one field per non-empty bucket, named by
//! its absolute index `⌊t / b⌋` rather than its slot: a decision writes one
//! field (the request's bucket) and `HDEL`s the buckets that left the ring,
//! reads only the non-empty buckets (an idle or sparse ring is small), and
//! the state reads plainly in `redis-cli`. There is no stored running total:
//! the script reads the whole ring anyway (the core's retry scan and a
//! late request need any bucket), so the total is summed in the same pass
//! and can never disagree with the buckets. A packed string would make
//! every write rewrite all `n` counts.
//!
//! All the state of a limited key is one Redis key (two for `sliding_log`:
//! its log and the log's sum) whose hash tag is the limited key
//! (`{<key>}`), so that a cluster keeps it in one slot and a
//! hot namespace is not one hot slot. The prefix may not contain `{` or
//! `}`; give each policy its own prefix.
//!
//! # Redis Cluster
//!
//! [`RedisLimiter`] is generic over the connection: give it a
//! [`ClusterConnection`](redis::cluster_async::ClusterConnection) and every
//! decision goes to the master of its key's slot. A script touches only
//! keys whose hash tag is the limited key (`KEYS[1]`, and `sliding_log`'s
//! `<prefix>{<key>}:log` and `:sum`), so no script ever crosses slots.
//! redis-rs's cluster client follows `MOVED` and `ASK` redirections and
//! loads a script on every node on `NOSCRIPT`, so a resharding in the middle
//! of a run is invisible to the caller (tested: slots moved between masters
//! with `redis-cli --cluster reshard` while tasks charge keys in them, every
//! decision answered, every count kept once).
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use slidegate_core::{Algorithm, Policy};
//! use slidegate_redis::RedisLimiter;
//! use std::time::Duration;
//!
//! let nodes = ["redis://10.0.0.1:6379/", "redis://10.0.0.2:6379/", "redis://10.0.0.3:6379/"];
//! let conn = redis::cluster::ClusterClient::new(nodes)?.get_async_connection().await?;
//! let policy = Policy::new(100, Duration::from_secs(60), Algorithm::SlidingLog)?;
//! let limiter = RedisLimiter::new(conn, policy, "rl:", Duration::from_millis(50))?;
//! let decision = limiter.check("user:42", 1).await?;
//! # Ok(())
//! # }
//! ```
//!
//! # The scripts' contract
//!
//! Each script (the `.lua` files in `scripts/`, whose first comment states
//! this in full) takes `KEYS[1]`, the limited key's state, and
//! `ARGV = [now, <the policy's figures>, cost]`:
//!
//! - `now`: the time in **microseconds**, or `-1` to read the server's
//!   `TIME`.
//! - the policy's figures in microseconds and units: `fixed_window`:
//!   `W, limit`; `gcra`: `T = ⌈W / limit⌉, burst, limit`; `sliding_log`:
//!   `W, limit`; `sliding_window`: `b = ⌈W / (n − 1)⌉, n, limit,
//!   weighting` (0 interpolated, 1 conservative).
//! - `cost`, which the client clamps to the largest cost that can pass
//!   plus one (any larger cost is decided alike: refused, never able to
//!   pass).
//!
//! The reply is eight integers: `{allowed (0/1), remaining, reset_at,
//! retry_at or -1, estimate whole, estimate numerator, estimate
//! denominator, now}`, the instants in microseconds on the script's clock:
//! what [`Decision::at`] takes. A script writes only when the state
//! changes (a peek, cost 0, never writes; a refusal writes only when it
//! moves the `sliding_window` ring or the `fixed_window` window forward, as
//! the core's state moves), and sets the key's expiry (`PEXPIRE`, twice the span the state
//! still counts for, at least 1 s) in the same call on every write: no key
//! is ever left without an expiry. A script never moves a state backwards
//! in time (a negative elapsed time is clamped: see [`RedisClock`]).
//!
//! # Exactness and the supported ranges
//!
//! Lua numbers are doubles, exact for integers below 2⁵³, so the scripts
//! count time in microseconds (µs since the epoch are about 1.8·10¹⁵) and
//! keep every figure below 2⁵³. A script decides exactly as the core's
//! [`State`](slidegate_core::State) decides on [`microsecond_policy`] (the
//! policy with its window's microseconds read as nanoseconds) fed the same
//! times in microseconds. When the policy's step (the window, or the `gcra`
//! emission interval `⌈W / limit⌉`) is a whole number of microseconds, this
//! is the core's decision on the policy itself at the same instants in
//! nanoseconds, figure for figure (but for an interpolated
//! `sliding_window`'s retry time: its oldest bucket decays by the
//! microsecond, so the retry is rounded up to the next microsecond);
//! otherwise the step is rounded up to the next microsecond, as the core
//! rounds it up to the next nanosecond.
//!
//! Supported, checked when the limiter is built:
//!
//! - the window is a whole number of microseconds, at most
//!   [`MAX_SPAN_US`] (2⁵⁰ µs, about 35 years);
//! - the limit is at most [`MAX_SPAN_US`];
//! - `gcra`: `(burst + 1)·T` and `limit·T` are at most [`MAX_SPAN_US`]
//!   microseconds;
//! - `sliding_window`: at most [`MAX_BUCKETS`] (256) buckets, and
//!   `limit·b` at most [`MAX_SPAN_US`] (b the bucket width in µs). The
//!   script's products are a bucket's count (at most the limit) times a part
//!   of `b` (the oldest bucket's weight `b − e` or `b`, and the room
//!   `(limit − rest − cost)·b`), so all within `limit·b`; its instants are at
//!   most `now + n·b < 2⁵² + 2⁵¹ + n`, since `(n − 1)·b < W + n`.
//!
//! A `sliding_window` script reads the whole ring (`HGETALL`, at most
//! `n + 1` fields) in one pass and a refusal scans it for the retry time:
//! O(n) Lua on the server per decision. Measured on a full ring (Redis 7.0): about
//! 0.1 ms at 64 buckets and 0.65 ms at 1024, hence the line at 256 (about
//! 0.2 ms).
//!
//! The time is at most [`MAX_TIME_US`] (2⁵² µs: the server's clock until
//! the year 2112; a client clock beyond it gets
//! [`RedisStoreError::TimeOutOfRange`]).
//!
//! # Clock
//!
//! By default ([`RedisClock::Server`]) the scripts read `redis.call('TIME')`:
//! one time source for every instance, safe to replicate since Redis 7.0
//! replicates a script's effects. [`RedisClock::Client`] sends the time of a
//! [`Clock`] instead (for tests and replays, or when the instances' clocks
//! are trusted). When the time goes backwards (a failover to a replica with
//! a slower clock, clients with skewed clocks) a script judges the request
//! at the state's newest time: `fixed_window` in its stored window (where
//! the core's state refuses a late request), `sliding_log` at its newest
//! entry (as the core), `sliding_window` as at the start of its newest
//! bucket, counted in its own bucket while that is in the ring and refused
//! otherwise (as the core), and `gcra` needs no rule (its backlog only
//! grows, as in the core).
//!
//! # Calls
//!
//! A decision is one `EVALSHA`. When the server answers `NOSCRIPT` (its
//! script cache was flushed by a restart or a failover), the script is
//! loaded and the call retried, invisibly to the caller. Many decisions in
//! flight share one multiplexed connection (clone it freely); each call,
//! retry included, is bounded by the limiter's timeout and fails with
//! [`RedisStoreError::Timeout`] beyond it, never hangs. The connection's
//! queue is bounded: redis-rs buffers at most 50 commands waiting to be
//! written by default (`set_pipeline_buffer_size`) and can bound the calls
//! in flight (`set_concurrency_limit`; `slidegate serve` sets 1024); a call
//! that finds them full waits, within its timeout.
//!
//! # Cost on the server
//!
//! Redis runs one command at a time, so what bounds the decisions per
//! second of a busy server is its CPU time per decision. A script's is the
//! `EVALSHA` itself, about twice an `INCR`'s before any Lua runs, plus each
//! `redis.call` (0.3–0.6 µs each), plus its own Lua (arithmetic, `tonumber`
//! of every argument and field read, the eight-integer reply):
//!
//! | script | `redis.call`s of a counted request | server CPU per decision |
//! |---|---|---|
//! | `INCR`, for scale | — | 0.55 µs |
//! | `fixed_window` | `TIME`, `HMGET`, `HSET`, `PEXPIRE` | 5.7 µs |
//! | `gcra` | `TIME`, `HGET`, `HSET`, `PEXPIRE` | 5.5 µs |
//! | `sliding_window` n = 2, 8 | `TIME`, `HGETALL`, `HSET` (`HDEL` as the ring moves), `PEXPIRE` | 7.3 µs, 8.8 µs |
//! | `sliding_log` | `TIME`, `ZRANGE`, `GET`, `ZRANGEBYSCORE` (the entries leaving), `ZREMRANGEBYSCORE`, `ZADD` (`ZREM`), `PEXPIRE`, `SET … PX` | O(log n) and the entries leaving the window (each once) |
//!
//! (Redis 7.0, one hot key, pipelined so that the server's I/O is
//! amortized; `BENCHMARKS.md` has the commands.) Four calls are the least a
//! limiter on a hash needs (the time, the state, the write, the expiry:
//! Redis 7.0 has no command that writes a hash field and its key's expiry
//! at once); they alone cost 3.0 µs, and an `EVALSHA` that calls nothing
//! 1.2 µs. So when the server is the bottleneck (many decisions in flight
//! over multiplexed connections) a decision costs 10–16 `INCR`s, and no
//! one-`EVALSHA`-per-decision design gets closer than about 5. With few
//! calls in flight the round trip and the server's I/O per request (about
//! 6 µs of server CPU per unpipelined command) dominate, and a decision
//! costs little more than an `INCR`.
//!
//! Measured and not kept: `gcra` (and `fixed_window`) in a string written
//! with `SET key value PX ms` instead of a hash and `PEXPIRE` (one call
//! fewer, no faster: `SET` with `PX` costs what `HSET` and `PEXPIRE` cost
//! together); a shorter reply (two integers instead of eight: 0.2 µs);
//! numbers passed straight to `redis.call` instead of formatted (none);
//! `sliding_window` reading only its own ring with `HMGET` (slower: the
//! field names are formatted in Lua on every call).
//!
//! # Failure policy
//!
//! [`RedisLimiter::check`] answers every failure as an error, for callers
//! that decide themselves. [`RedisLimiter::decide`] applies the limiter's
//! [`FailurePolicy`] instead and never fails: on an error or a timeout,
//! [`FailurePolicy::Open`] (the default) admits, [`FailurePolicy::Closed`]
//! refuses, and [`FailurePolicy::Local`] decides in an in-memory
//! [`KeyedLimiter`] on the limit divided by the number of instances. The
//! [`Outcome`] says who decided ([`Source`]); every fallback is counted
//! ([`RedisLimiter::stats`]). After a failure, Redis is skipped for a
//! backoff (100 ms by default; on a cluster, per range of 256 slots with
//! [`RedisLimiter::with_backoff_per_slot_range`], so that a dead master
//! does not send the live masters' keys to the policy), then tried again: recovery is automatic
//! with a connection that reconnects by itself
//! ([`ConnectionManager`](redis::aio::ConnectionManager), or a cluster
//! connection).
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use slidegate_core::{Algorithm, Policy};
//! use slidegate_redis::{FailurePolicy, RedisLimiter, Source};
//! use std::time::Duration;
//!
//! let client = redis::Client::open("redis://127.0.0.1:6379/")?;
//! let conn = client.get_connection_manager().await?;
//! let policy = Policy::new(100, Duration::from_secs(60), Algorithm::FixedWindow)?;
//! let limiter = RedisLimiter::new(conn, policy, "rl:", Duration::from_millis(20))?
//!     .with_failure_policy(FailurePolicy::Local { instances: 4 });
//! let outcome = limiter.decide("user:42", 1).await;
//! if outcome.source != Source::Redis {
//!     eprintln!("decided without Redis: {:?} ({} fallbacks)", outcome.source, limiter.fallbacks());
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # Hybrid mode
//!
//! [`HybridLimiter`] decides `sliding_window` limits in the process, on
//! each key's ring as Redis last answered it plus this instance's counts
//! since, and sends the counts in batches (one `EVALSHA` of
//! [`SLIDING_WINDOW_SYNC`] per key, every interval or when a batch fills),
//! for about 15–20 times the direct mode's decisions per second and one
//! command per key per interval. One instance alone decides exactly as
//! [`RedisLimiter`]; several over-admit by about `(instances − 1) × rate ×
//! interval` (the bound, and the figures, are in [`HybridLimiter`]'s docs).
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use slidegate_core::{Algorithm, Policy, Weighting};
//! use slidegate_redis::{HybridLimiter, HybridOptions, RedisLimiter};
//! use std::time::Duration;
//!
//! let client = redis::Client::open("redis://127.0.0.1:6379/")?;
//! let conn = client.get_connection_manager().await?;
//! let ring = Algorithm::SlidingWindow { buckets: 8, weighting: Weighting::Conservative };
//! let policy = Policy::new(100, Duration::from_secs(60), ring)?;
//! let direct = RedisLimiter::new(conn, policy, "rl:", Duration::from_millis(50))?;
//! let limiter = HybridLimiter::new(direct, HybridOptions::every(Duration::from_millis(50)))?;
//! let _sync = limiter.spawn_sync(); // syncs until dropped
//! let outcome = limiter.decide("user:42", 1); // no round trip
//! # Ok(())
//! # }
//! ```
//!
//! `slidegate serve --redis URL` serves limits from these stores (with
//! `--redis-sync-interval` in hybrid mode), and `slidegate bench --redis
//! URL` measures them (BENCHMARKS.md).

#![forbid(unsafe_code)]
// No panics on the request path: the lints are off in unit tests only.
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::indexing_slicing,
        clippy::panic,
        clippy::unreachable,
        clippy::todo,
        clippy::unimplemented
    )
)]

mod admin;
mod hybrid;
mod hybrid_store;
mod store;

pub use hybrid::{
    FIXED_WINDOW_SYNC, HybridLimiter, HybridOptions, HybridStats, SLIDING_WINDOW_SYNC, SyncReport, SyncTask,
};
pub use hybrid_store::{HybridStore, MAX_HYBRID_LIMITS, StaleSyncs};
pub use store::{RedisStore, SentinelConnection};

use redis::Script;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use slidegate_core::{Algorithm, Clock, Decision, MonotonicClock, Policy, Weighting};
use slidegate_memory::{Budget, KeyedLimiter};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

/// The Lua sources of the scripts as sent to Redis: the shared prelude
/// (`scripts/prelude.lua`: the clock, an exact `divmod`, integer writing),
/// then the script, which opens with its contract.
pub mod scripts {
    /// `fixed_window`: `KEYS[1]` a hash; `ARGV = [now, W, limit, cost]`.
    pub const FIXED_WINDOW: &str = concat!(
        include_str!("../scripts/prelude.lua"),
        include_str!("../scripts/fixed_window.lua")
    );
    /// `gcra`: `KEYS[1]` a hash; `ARGV = [now, T, burst, limit, cost]`.
    pub const GCRA: &str = concat!(
        include_str!("../scripts/prelude.lua"),
        include_str!("../scripts/gcra.lua")
    );
    /// `sliding_log`: `KEYS[1]` a sorted set, `KEYS[2]` its sum; `ARGV =
    /// [now, W, limit, cost]`.
    pub const SLIDING_LOG: &str = concat!(
        include_str!("../scripts/prelude.lua"),
        include_str!("../scripts/sliding_log.lua")
    );
    /// `sliding_window`: `KEYS[1]` a hash; `ARGV = [now, b, n, limit,
    /// weighting, cost]`.
    pub const SLIDING_WINDOW: &str = concat!(
        include_str!("../scripts/prelude.lua"),
        include_str!("../scripts/sliding_window.lua")
    );
    /// Several limits of one key in one call (the [`RedisStore`](crate::RedisStore)'s
    /// script): the prelude, each algorithm's script above wrapped as a
    /// function `<name>(KEYS, ARGV)` of its own keys and arguments, then
    /// `scripts/multi.lua`, which reads the time once and decides (or
    /// charges) every limit. `KEYS` every limit's keys in order; `ARGV =
    /// [now, mode, k, then six fields per limit]` (the file's first comment).
    pub const MULTI: &str = concat!(
        include_str!("../scripts/prelude.lua"),
        "local function fixed_window(KEYS, ARGV)\n",
        include_str!("../scripts/fixed_window.lua"),
        "\nend\nlocal function gcra(KEYS, ARGV)\n",
        include_str!("../scripts/gcra.lua"),
        "\nend\nlocal function sliding_log(KEYS, ARGV)\n",
        include_str!("../scripts/sliding_log.lua"),
        "\nend\nlocal function sliding_window(KEYS, ARGV)\n",
        include_str!("../scripts/sliding_window.lua"),
        "\nend\n",
        include_str!("../scripts/multi.lua")
    );
}

static FIXED_WINDOW: LazyLock<Script> = LazyLock::new(|| Script::new(scripts::FIXED_WINDOW));
static GCRA: LazyLock<Script> = LazyLock::new(|| Script::new(scripts::GCRA));
static SLIDING_LOG: LazyLock<Script> = LazyLock::new(|| Script::new(scripts::SLIDING_LOG));
static SLIDING_WINDOW: LazyLock<Script> = LazyLock::new(|| Script::new(scripts::SLIDING_WINDOW));
static MULTI: LazyLock<Script> = LazyLock::new(|| Script::new(scripts::MULTI));

/// The largest window, limit, and `gcra` span (`(burst + 1)·T`, `limit·T`)
/// the scripts take, in microseconds or units: 2⁵⁰.
pub const MAX_SPAN_US: u64 = 1 << 50;

/// The latest time the scripts take, in microseconds: 2⁵² (the year 2112
/// counted from the epoch). With a span of at most [`MAX_SPAN_US`], every
/// figure stays below 2⁵³, where doubles stop being exact.
pub const MAX_TIME_US: u64 = 1 << 52;

/// The most buckets of a `sliding_window` the script takes: it reads the
/// whole ring on every call and scans it on a refusal, O(n) in Lua while
/// the server waits.
pub const MAX_BUCKETS: u32 = 256;

/// How long [`RedisLimiter::decide`] skips Redis after a failure, unless
/// [`RedisLimiter::with_backoff`] says otherwise: 100 ms.
pub const DEFAULT_BACKOFF: Duration = Duration::from_millis(100);

/// The keys the [`FailurePolicy::Local`] fallback holds, unless
/// [`RedisLimiter::with_local_budget`] says otherwise: 100 000.
pub const DEFAULT_LOCAL_KEYS: usize = 100_000;

/// What [`RedisLimiter::decide`] does when Redis fails: an error, or no
/// answer within the timeout.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FailurePolicy {
    /// Admit, counting nothing (as Envoy, Kong and Stripe do by default):
    /// the service stays up, unlimited while Redis is down.
    #[default]
    Open,
    /// Refuse, with a retry after the backoff: nothing passes unlimited,
    /// nothing passes at all while Redis is down.
    Closed,
    /// Decide in an in-memory [`KeyedLimiter`] of this process, on the
    /// policy with its limit (and a `gcra` burst) divided by `instances`,
    /// the number of instances sharing the limit, rounded up and at least 1:
    /// the instances together admit about the limit while Redis is down.
    /// `instances` 0 counts as 1.
    Local {
        /// How many instances share the limit.
        instances: u64,
    },
}

/// Who decided an [`Outcome`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// Redis, by its script: the shared count.
    Redis,
    /// [`FailurePolicy::Open`]: admitted without counting.
    FailOpen,
    /// [`FailurePolicy::Closed`]: refused (also the `Local` fallback's
    /// answer for a key its budget cannot hold).
    FailClosed,
    /// [`FailurePolicy::Local`]: the local limiter.
    Local,
}

/// A decision and who made it: [`RedisLimiter::decide`]'s answer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Outcome {
    /// The decision.
    pub decision: Decision,
    /// Who decided it.
    pub source: Source,
}

impl Outcome {
    /// Whether the request passes.
    pub fn allowed(&self) -> bool {
        self.decision.allowed()
    }
}

/// A limiter's failures and fallbacks, shared by its clones.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FailureStats {
    /// Calls to Redis that failed (an error or a timeout).
    pub failures: u64,
    /// Decisions made by the failure policy: one per failed call, and one
    /// per call during a backoff, which skips Redis.
    pub fallbacks: u64,
}

/// The policy of the `Local` fallback: the limit (and a `gcra` burst)
/// divided by `instances`, rounded up, at least 1.
pub(crate) fn local_policy(policy: &Policy, instances: u64) -> Policy {
    let share = |n: u64| n.div_ceil(instances.max(1)).max(1);
    let algorithm = match policy.algorithm() {
        Algorithm::Gcra { burst } => Algorithm::Gcra { burst: share(burst) },
        other => other,
    };
    Policy::new(
        share(policy.limit()),
        Duration::from_nanos(policy.window_ns()),
        algorithm,
    )
    .unwrap_or(*policy)
}

/// The ranges of Redis Cluster slots a limiter with
/// [`RedisLimiter::with_backoff_per_slot_range`] backs off apart: 64 ranges
/// of 256 slots.
const SLOT_RANGES: usize = 64;

/// The Redis Cluster slot of `key`: the CRC16 (XMODEM) of its hash tag (the
/// text between its first `{` and the next `}`, when not empty; else the
/// whole key), mod 16384, as Redis computes it.
fn cluster_slot(key: &[u8]) -> u16 {
    let tag = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| key.get(open + 1..))
        .and_then(|rest| {
            rest.iter()
                .position(|&b| b == b'}')
                .filter(|&close| close > 0)
                .and_then(|close| rest.get(..close))
        })
        .unwrap_or(key);
    let mut crc: u16 = 0;
    for &b in tag {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

/// The failure state shared by a limiter's clones.
struct Health {
    /// The origin of `skip_until` (and of the fallbacks' time on the
    /// server's clock).
    origin: Instant,
    /// Nanoseconds after `origin` until which Redis is skipped: for the
    /// whole limiter (the first), or for each range of cluster slots.
    skip_until: [AtomicU64; SLOT_RANGES],
    failures: AtomicU64,
    fallbacks: AtomicU64,
    local: Option<KeyedLimiter<String, Arc<dyn Clock + Send + Sync>>>,
}

impl Health {
    fn new(local: Option<KeyedLimiter<String, Arc<dyn Clock + Send + Sync>>>) -> Self {
        Health {
            origin: Instant::now(),
            skip_until: std::array::from_fn(|_| AtomicU64::new(0)),
            failures: AtomicU64::new(0),
            fallbacks: AtomicU64::new(0),
            local,
        }
    }

    fn elapsed_ns(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    fn in_backoff(&self, range: usize) -> bool {
        self.skip_until
            .get(range)
            .is_some_and(|until| self.elapsed_ns() < until.load(Ordering::Relaxed))
    }

    fn back_off(&self, range: usize, backoff: Duration) {
        let until = self
            .elapsed_ns()
            .saturating_add(u64::try_from(backoff.as_nanos()).unwrap_or(u64::MAX));
        if let Some(skip) = self.skip_until.get(range) {
            skip.fetch_max(until, Ordering::Relaxed);
        }
    }
}

/// Where the scripts' time comes from.
#[derive(Clone, Default)]
pub enum RedisClock {
    /// The Redis server's `TIME`: one source for every instance.
    #[default]
    Server,
    /// The client's clock, read once per decision and sent in microseconds
    /// (its nanoseconds divided by 1000, rounded down).
    Client(Arc<dyn Clock + Send + Sync>),
}

impl RedisClock {
    /// The client's `clock`.
    pub fn client(clock: impl Clock + Send + Sync + 'static) -> Self {
        RedisClock::Client(Arc::new(clock))
    }
}

impl fmt::Debug for RedisClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RedisClock::Server => f.write_str("Server"),
            RedisClock::Client(_) => f.write_str("Client"),
        }
    }
}

/// What can go wrong with a Redis store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RedisStoreError {
    /// The policy has no Redis form, or not one that decides exactly.
    #[error("no Redis form for `{policy}`: {reason}")]
    Unsupported {
        /// The policy, as displayed.
        policy: String,
        /// Why.
        reason: &'static str,
    },
    /// The key prefix contains `{` or `}`, which would change the keys'
    /// hash tags.
    #[error("the key prefix `{0}` must not contain `{{` or `}}`")]
    Prefix(String),
    /// The client clock is beyond [`MAX_TIME_US`].
    #[error("the client clock is at {now_us} µs, beyond the {MAX_TIME_US} µs the scripts decide exactly")]
    TimeOutOfRange {
        /// The clock's time in microseconds.
        now_us: u64,
    },
    /// No answer within the limiter's timeout.
    #[error("no answer from Redis within {0:?}")]
    Timeout(Duration),
    /// Redis or the connection failed.
    #[error("Redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// Options that cannot work (a zero sync interval).
    #[error("invalid options: {0}")]
    Options(&'static str),
    /// The script answered something that is not a decision.
    #[error("unexpected reply from the script: {0:?}")]
    Reply(Vec<i64>),
    /// Redis is skipped for a backoff after a failure.
    #[error("Redis is skipped for {0:?} after a failure")]
    Backoff(Duration),
}

/// The policy a script runs for `policy`: the same limit and algorithm, with
/// the window's microseconds read as nanoseconds. The core's
/// [`State`](slidegate_core::State) on it, fed times in microseconds,
/// decides exactly as a [`RedisLimiter`] of `policy` does.
///
/// # Errors
///
/// [`RedisStoreError::Unsupported`] outside the supported ranges (see the
/// crate docs) and for the algorithms without a script.
pub fn microsecond_policy(policy: &Policy) -> Result<Policy, RedisStoreError> {
    let unsupported = |reason| RedisStoreError::Unsupported {
        policy: policy.to_string(),
        reason,
    };
    match policy.algorithm() {
        Algorithm::FixedWindow | Algorithm::Gcra { .. } | Algorithm::SlidingLog => {}
        Algorithm::SlidingWindow { buckets, .. } => {
            if buckets > MAX_BUCKETS {
                return Err(unsupported("sliding_window takes at most 256 buckets in Redis"));
            }
        }
        Algorithm::ExponentialHistogram { .. } => return Err(unsupported("exponential_histogram has no Redis form")),
    }
    if !policy.window_ns().is_multiple_of(1000) {
        return Err(unsupported("the window must be a whole number of microseconds"));
    }
    let window_us = policy.window_ns() / 1000;
    if window_us > MAX_SPAN_US {
        return Err(unsupported("the window must be at most 2^50 microseconds"));
    }
    if policy.limit() > MAX_SPAN_US {
        return Err(unsupported("the limit must be at most 2^50"));
    }
    let micro = Policy::new(policy.limit(), Duration::from_nanos(window_us), policy.algorithm())
        .map_err(|_| unsupported("the window must be at least one microsecond"))?;
    if let Algorithm::Gcra { burst } = policy.algorithm() {
        let t = micro.step_ns();
        let within = |n: u64| n.checked_mul(t).is_some_and(|span| span <= MAX_SPAN_US);
        if !burst.checked_add(1).is_some_and(within) || !within(policy.limit()) {
            return Err(unsupported(
                "gcra needs (burst + 1)·T and limit·T of at most 2^50 microseconds",
            ));
        }
    }
    if let Algorithm::SlidingWindow { .. } = policy.algorithm()
        && policy
            .limit()
            .checked_mul(micro.step_ns())
            .is_none_or(|x| x > MAX_SPAN_US)
    {
        return Err(unsupported(
            "sliding_window needs limit·b (b the bucket width) of at most 2^50 microseconds",
        ));
    }
    Ok(micro)
}

/// What a script needs of the policy, after `now` and before `cost`, and
/// the largest cost that could pass.
#[derive(Clone, Copy, Debug)]
enum Params {
    FixedWindow {
        w: u64,
        limit: u64,
    },
    Gcra {
        t: u64,
        burst: u64,
        limit: u64,
    },
    SlidingLog {
        w: u64,
        limit: u64,
    },
    SlidingWindow {
        b: u64,
        n: u64,
        limit: u64,
        conservative: u64,
    },
}

impl Params {
    fn of(micro: &Policy) -> Params {
        let limit = micro.limit();
        match micro.algorithm() {
            Algorithm::Gcra { burst } => Params::Gcra {
                t: micro.step_ns(),
                burst,
                limit,
            },
            Algorithm::SlidingLog => Params::SlidingLog {
                w: micro.window_ns(),
                limit,
            },
            Algorithm::SlidingWindow { buckets, weighting } => Params::SlidingWindow {
                b: micro.step_ns(),
                n: u64::from(buckets),
                limit,
                conservative: u64::from(weighting == Weighting::Conservative),
            },
            _ => Params::FixedWindow {
                w: micro.window_ns(),
                limit,
            },
        }
    }

    /// The largest cost that can ever pass.
    fn capacity(self) -> u64 {
        match self {
            Params::FixedWindow { limit, .. }
            | Params::SlidingLog { limit, .. }
            | Params::SlidingWindow { limit, .. } => limit,
            Params::Gcra { burst, limit, .. } => burst.min(limit),
        }
    }
}

/// Limits every key to one [`Policy`] in Redis, one atomic script per
/// decision (see the crate docs for the scripts, ranges and clock).
///
/// Generic over the connection `C`: any of redis-rs's asynchronous
/// [`ConnectionLike`] connections that is cheap to clone, such as a
/// [`MultiplexedConnection`] (the default) or a
/// [`ClusterConnection`](redis::cluster_async::ClusterConnection) of a
/// Redis Cluster. Cheap to clone: clones share the connection.
#[derive(Clone)]
pub struct RedisLimiter<C = MultiplexedConnection> {
    conn: C,
    policy: Policy,
    params: Params,
    prefix: String,
    timeout: Duration,
    clock: RedisClock,
    failure: FailurePolicy,
    backoff: Duration,
    backoff_per_slot_range: bool,
    local_budget: Budget,
    health: Arc<Health>,
}

impl<C> fmt::Debug for RedisLimiter<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisLimiter")
            .field("policy", &self.policy)
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .field("clock", &self.clock)
            .field("failure", &self.failure)
            .field("backoff", &self.backoff)
            .field("failures", &self.health.failures)
            .field("fallbacks", &self.health.fallbacks)
            .finish_non_exhaustive()
    }
}

impl<C: ConnectionLike + Clone> RedisLimiter<C> {
    /// A limiter of `policy` per key over `conn`, its keys starting with
    /// `prefix`, each call bounded by `timeout`, on the server's clock.
    ///
    /// # Errors
    ///
    /// [`RedisStoreError::Unsupported`] for a policy outside the supported
    /// ranges or without a script, [`RedisStoreError::Prefix`] for a prefix
    /// with `{` or `}`.
    pub fn new(conn: C, policy: Policy, prefix: impl Into<String>, timeout: Duration) -> Result<Self, RedisStoreError> {
        let prefix = prefix.into();
        if prefix.contains(['{', '}']) {
            return Err(RedisStoreError::Prefix(prefix));
        }
        let micro = microsecond_policy(&policy)?;
        Ok(RedisLimiter {
            conn,
            policy,
            params: Params::of(&micro),
            prefix,
            timeout,
            clock: RedisClock::Server,
            failure: FailurePolicy::Open,
            backoff: DEFAULT_BACKOFF,
            backoff_per_slot_range: false,
            local_budget: Budget::keys(DEFAULT_LOCAL_KEYS),
            health: Arc::new(Health::new(None)),
        })
    }

    /// The same limiter on `clock` (the `Local` fallback reads it too).
    pub fn with_clock(mut self, clock: RedisClock) -> Self {
        self.clock = clock;
        self.renew_health();
        self
    }

    /// The same limiter deciding by `failure` in [`RedisLimiter::decide`]
    /// when Redis fails (by default [`FailurePolicy::Open`]).
    pub fn with_failure_policy(mut self, failure: FailurePolicy) -> Self {
        self.failure = failure;
        self.renew_health();
        self
    }

    /// The same limiter skipping Redis for `backoff` after a failure (by
    /// default [`DEFAULT_BACKOFF`], 100 ms); see [`RedisLimiter::decide`].
    pub fn with_backoff(mut self, backoff: Duration) -> Self {
        self.backoff = backoff;
        self
    }

    /// The same limiter backing off per range of Redis Cluster slots (64
    /// ranges of 256) instead of as a whole: after a failure, only the keys
    /// whose slots are near the failed key's skip Redis for the backoff, so
    /// that a dead master does not send the keys of the live masters to the
    /// failure policy too. For a cluster connection; with one server a
    /// failure is the whole server's, and the whole limiter backing off
    /// (the default) spares the other keys the timeout.
    pub fn with_backoff_per_slot_range(mut self) -> Self {
        self.backoff_per_slot_range = true;
        self
    }

    /// The same limiter with `budget` for the keys of the
    /// [`FailurePolicy::Local`] fallback (by default
    /// [`DEFAULT_LOCAL_KEYS`] keys).
    pub fn with_local_budget(mut self, budget: Budget) -> Self {
        self.local_budget = budget;
        self.renew_health();
        self
    }

    /// The failure policy.
    pub fn failure_policy(&self) -> FailurePolicy {
        self.failure
    }

    /// The backoff after a failure.
    pub fn backoff(&self) -> Duration {
        self.backoff
    }

    /// The failures and fallbacks so far, shared by all the clones.
    pub fn stats(&self) -> FailureStats {
        FailureStats {
            failures: self.health.failures.load(Ordering::Relaxed),
            fallbacks: self.health.fallbacks.load(Ordering::Relaxed),
        }
    }

    /// The decisions made without Redis so far (by the failure policy),
    /// shared by all the clones: [`FailureStats::fallbacks`].
    pub fn fallbacks(&self) -> u64 {
        self.stats().fallbacks
    }

    /// Fresh failure state (counters, backoff, the local limiter) for the
    /// current clock, policy and budget.
    fn renew_health(&mut self) {
        let local = match self.failure {
            FailurePolicy::Local { instances } => {
                let clock: Arc<dyn Clock + Send + Sync> = match &self.clock {
                    RedisClock::Server => Arc::new(MonotonicClock::new()),
                    RedisClock::Client(clock) => clock.clone(),
                };
                let policy = local_policy(&self.policy, instances);
                Some(KeyedLimiter::new(policy, clock, self.local_budget))
            }
            _ => None,
        };
        self.health = Arc::new(Health::new(local));
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Where the time comes from.
    pub fn clock(&self) -> &RedisClock {
        &self.clock
    }

    /// The timeout of each call.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The Redis key holding the state of `key`: `<prefix>{<key>}`, with
    /// `:log` after it for `sliding_log` (whose sum is a second key,
    /// [`RedisLimiter::redis_keys`]).
    pub fn redis_key(&self, key: &str) -> String {
        let suffix = match self.params {
            Params::SlidingLog { .. } => ":log",
            _ => "",
        };
        format!("{}{{{key}}}{suffix}", self.prefix)
    }

    /// Every Redis key of the state of `key`, all with the hash tag
    /// `{<key>}`: [`RedisLimiter::redis_key`], and for `sliding_log` the
    /// sum of its log, `<prefix>{<key>}:sum`.
    pub fn redis_keys(&self, key: &str) -> Vec<String> {
        match self.params {
            Params::SlidingLog { .. } => vec![
                format!("{}{{{key}}}:log", self.prefix),
                format!("{}{{{key}}}:sum", self.prefix),
            ],
            _ => vec![self.redis_key(key)],
        }
    }

    /// Decides whether `cost` units for `key` fit the policy now; if they do
    /// and `cost > 0`, counts them. A `cost` of 0 peeks and changes nothing.
    /// Runs in a Tokio runtime with its time driver enabled (for the
    /// timeout).
    ///
    /// # Errors
    ///
    /// [`RedisStoreError::Timeout`] when Redis does not answer within the
    /// timeout, [`RedisStoreError::Redis`] when the connection or the
    /// server fails, [`RedisStoreError::TimeOutOfRange`] for a client clock
    /// beyond [`MAX_TIME_US`].
    pub async fn check(&self, key: &str, cost: u64) -> Result<Decision, RedisStoreError> {
        let now: i64 = match &self.clock {
            RedisClock::Server => -1,
            RedisClock::Client(clock) => {
                let now_us = clock.now() / 1000;
                if now_us > MAX_TIME_US {
                    return Err(RedisStoreError::TimeOutOfRange { now_us });
                }
                now_us as i64
            }
        };
        // Any cost above what can pass is decided alike.
        let cost = cost.min(self.params.capacity() + 1);
        let (script, figures): (&Script, &[u64]) = match &self.params {
            Params::FixedWindow { w, limit } => (&FIXED_WINDOW, &[*w, *limit]),
            Params::Gcra { t, burst, limit } => (&GCRA, &[*t, *burst, *limit]),
            Params::SlidingLog { w, limit } => (&SLIDING_LOG, &[*w, *limit]),
            Params::SlidingWindow {
                b,
                n,
                limit,
                conservative,
            } => (&SLIDING_WINDOW, &[*b, *n, *limit, *conservative]),
        };
        let mut invocation = script.prepare_invoke();
        for k in self.redis_keys(key) {
            invocation.key(k);
        }
        invocation.arg(now);
        for figure in figures {
            invocation.arg(*figure);
        }
        invocation.arg(cost);
        let mut conn = self.conn.clone();
        let reply: Vec<i64> = tokio::time::timeout(self.timeout, invocation.invoke_async(&mut conn))
            .await
            .map_err(|_| RedisStoreError::Timeout(self.timeout))??;
        self.decision(reply)
    }

    /// [`RedisLimiter::check`] with the failure policy applied: when Redis
    /// fails (an error, or no answer within the timeout), the limiter's
    /// [`FailurePolicy`] decides, and the [`Outcome`] says who decided.
    /// Never fails, and returns within the timeout.
    ///
    /// Recovery is automatic: after a failure, every call skips Redis for
    /// the backoff ([`RedisLimiter::with_backoff`], 100 ms by default) and
    /// goes straight to the failure policy, so that a dead Redis does not
    /// cost the timeout on every call; the first call after the backoff
    /// tries Redis again (and, failing, starts another backoff). Give the
    /// limiter a connection that reconnects by itself — a
    /// [`ConnectionManager`](redis::aio::ConnectionManager) for one server,
    /// a [`ClusterConnection`](redis::cluster_async::ClusterConnection) for
    /// a cluster — for decisions to come back from Redis once it is back (a
    /// [`MultiplexedConnection`] stays broken after its server went away).
    /// Every fallback is counted ([`RedisLimiter::stats`]).
    pub async fn decide(&self, key: &str, cost: u64) -> Outcome {
        let health = &self.health;
        let range = if self.backoff_per_slot_range {
            usize::from(cluster_slot(self.redis_key(key).as_bytes())) * SLOT_RANGES / 16384
        } else {
            0
        };
        if !health.in_backoff(range) {
            match self.check(key, cost).await {
                Ok(decision) => {
                    return Outcome {
                        decision,
                        source: Source::Redis,
                    };
                }
                Err(_) => {
                    health.failures.fetch_add(1, Ordering::Relaxed);
                    health.back_off(range, self.backoff);
                }
            }
        }
        health.fallbacks.fetch_add(1, Ordering::Relaxed);
        self.fall_back(key, cost)
    }

    /// The failure policy's decision.
    fn fall_back(&self, key: &str, cost: u64) -> Outcome {
        let now = match &self.clock {
            RedisClock::Server => self.health.origin.elapsed().as_nanos() as u64,
            RedisClock::Client(clock) => clock.now(),
        };
        let refuse = |source| {
            // Refused until Redis is tried again.
            let retry_at = now.saturating_add(self.backoff.as_nanos() as u64);
            Outcome {
                decision: Decision::at(&self.policy, now, false, 0, retry_at, Some(retry_at), (0, 0, 1)),
                source,
            }
        };
        match self.failure {
            FailurePolicy::Open => Outcome {
                // Admitted, nothing counted.
                decision: Decision::at(&self.policy, now, true, self.policy.limit(), now, None, (0, 0, 1)),
                source: Source::FailOpen,
            },
            FailurePolicy::Closed => refuse(Source::FailClosed),
            FailurePolicy::Local { .. } => match self.health.local.as_ref().map(|l| l.check(key, cost)) {
                Some(Ok(decision)) => Outcome {
                    decision,
                    source: Source::Local,
                },
                // A key beyond the local budget's share: refused.
                _ => refuse(Source::FailClosed),
            },
        }
    }

    /// The decision of a script's reply, its instants turned into ns.
    fn decision(&self, reply: Vec<i64>) -> Result<Decision, RedisStoreError> {
        decision_of(&self.policy, &reply)
    }
}

/// The decision on `policy` of a script's eight-integer reply, its
/// instants turned into ns.
pub(crate) fn decision_of(policy: &Policy, reply: &[i64]) -> Result<Decision, RedisStoreError> {
    let &[allowed, remaining, reset_at, retry_at, whole, num, den, now] = reply else {
        return Err(RedisStoreError::Reply(reply.to_vec()));
    };
    let plain = [allowed, remaining, reset_at, whole, num, den, now];
    if plain.iter().any(|&x| x < 0) || allowed > 1 || retry_at < -1 {
        return Err(RedisStoreError::Reply(reply.to_vec()));
    }
    let ns = |us: i64| (us as u64).saturating_mul(1000);
    let retry_at = (retry_at >= 0).then(|| ns(retry_at));
    Ok(Decision::at(
        policy,
        ns(now),
        allowed == 1,
        remaining as u64,
        ns(reset_at),
        retry_at,
        (whole as u64, num as u64, den as u64),
    ))
}

#[cfg(test)]
mod tests {
    use super::cluster_slot;

    /// The slots Redis 7.0's `CLUSTER KEYSLOT` gives.
    #[test]
    fn cluster_slots_as_redis_computes_them() {
        for (key, slot) in [
            ("foo", 12182),
            ("bar", 5061),
            ("somekey", 11058),
            ("foo{hash_tag}", 2515),
            ("slidegate:test:{user:42}:log", 15880),
            ("a{}b", 13694),
            ("{}", 15257),
            ("x{}{y}", 14166),
            ("p{a}b}", 15495),
        ] {
            assert_eq!(cluster_slot(key.as_bytes()), slot, "{key}");
        }
    }
}
