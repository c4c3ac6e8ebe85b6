//! Redis as the shared store of slidegate limits: every decision on a key,
//! against all of its limits, is one atomic Lua script (a Redis function
//! called with `FCALL`, or by `EVALSHA` where the server will not load
//! one: [`Function`]), so that any number of instances share one count per
//! key and limit.
//!
//! # The stores
//!
//! - [`RedisStore`] is Redis as a [`slidegate_store::Store`]: a request on
//!   a key against any number of limits is one call of
//!   [`scripts::MULTI`] (or, for a call that is one run of decisions under
//!   one `fixed_window`, `gcra` or `sliding_window` limit, of the leaner
//!   [`scripts::ONE`]), which reads the time once and decides every limit
//!   all or nothing, by the rule of [`slidegate_store::decide_all`] (so
//!   that it answers as the in-memory store does); charges after the fact
//!   and resets are one call too. It runs over one server
//!   ([`RedisStore::connect`], a reconnecting
//!   [`ConnectionManager`](redis::aio::ConnectionManager)), a Redis Cluster
//!   ([`RedisStore::connect_cluster`]), or the primary that Redis Sentinel
//!   names ([`RedisStore::connect_sentinel`], over a
//!   [`SentinelConnection`], which asks the Sentinels again after the
//!   primary failed or became a replica); [`RedisStore::new`] takes any
//!   asynchronous redis-rs connection.
//! - [`HybridStore`] is the hybrid mode as a store: `sliding_window` and
//!   `fixed_window` limits decided in the process (one [`HybridLimiter`]
//!   per limit), the counts sent to Redis in batches (below).
//! - [`RedisOptions`] builds any of them as a service runs them, on one
//!   connect path ([`RedisOptions::connect_probed`]): one server, the
//!   Sentinels' primary or a Cluster, each call one script or (with a
//!   sync interval) the hybrid mode, bounded by leases or not, its calls
//!   without a hybrid form sent to a [`RedisStore`] on the same keys;
//!   behind the failure policy, as an `Arc<dyn DynStore>`, with a
//!   [`RedisProbe`] for readiness on the same connection. The key prefix
//!   is checked once, before any connection.
//!
//! # Failure policy
//!
//! The stores answer a failure as an error, and never decide one
//! themselves: the failure policy is [`slidegate_store::FailOver`]'s
//! (open, closed, or a local store of this process on the limit's share),
//! which wraps either store and counts every decision by source and
//! outcome. A [`RedisStore`] bounds every call by its timeout
//! ([`StoreError::Timeout`]) and answers a connection or server failure as
//! [`StoreError::Unavailable`]; after either it answers
//! [`StoreError::Unavailable`] at once for a backoff
//! ([`DEFAULT_BACKOFF`], 100 ms; per range of 256 slots on a cluster, so
//! that a dead master does not fail the live masters' keys), then tries
//! Redis again: recovery is automatic over a connection that reconnects by
//! itself. A [`HybridStore`] answers [`StoreError::Unavailable`] once its
//! syncs have failed for [`stale_after`](HybridOptions::stale_after).
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
//! # Keys
//!
//! The state of `key` under a limit is `<prefix><tag>:{<key>}` (the tag is
//! [`Quota::tag`](slidegate_store::Quota::tag), [`Policy::tag`]), for
//! `sliding_log` the pair `<prefix><tag>:{<key>}:log` and `…:sum`
//! ([`RedisStore::redis_keys`]). Every key of one request shares the hash
//! tag `{<key>}`, so a Redis Cluster keeps all of a key's limits in one
//! slot and accepts the script, while a hot namespace is not one hot slot.
//! The prefix may not contain `{` or `}` ([`RedisStoreError::Prefix`]).
//! A [`HybridStore`] keeps the same keys, so direct and hybrid instances of
//! one limit share its counts.
//!
//! | algorithm | Redis state of a key |
//! |---|---|
//! | `fixed_window` | hash `<prefix><tag>:{<key>}`: `w` (window index), `c` (count) |
//! | `gcra` | hash `<prefix><tag>:{<key>}`: `t` (the theoretical arrival time) |
//! | `sliding_log` | sorted set `…:{<key>}:log`: member `<time>:<cost>`, score `<time>`; string `…:{<key>}:sum`: the sum of the log's costs |
//! | `sliding_window` | hash `<prefix><tag>:{<key>}`: `n` (the newest bucket index), and `<i>` (the count of bucket `i`) for each non-empty bucket of the ring |
//!
//! `exponential_histogram` has no Redis form: the stores refuse it with
//! [`StoreError::Unsupported`] ([`Store::supports`](slidegate_store::Store::supports)).
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
//! # Redis Cluster
//!
//! Over a [`ClusterConnection`](redis::cluster_async::ClusterConnection)
//! every call goes to the master of its key's slot, and no script crosses
//! slots (every key it touches has the hash tag `{<key>}`). redis-rs's
//! cluster client follows `MOVED` and `ASK` redirections, and when a master
//! has no function by the script's name the store loads it (`FUNCTION
//! LOAD`, which redis-rs sends to every master; by `EVALSHA`, on
//! `NOSCRIPT`, `SCRIPT LOAD`, sent to every node) and sends the call again, so a resharding in the middle of a
//! run is invisible to the caller (tested: slots moved between masters with
//! `redis-cli --cluster reshard` while tasks charge keys in them, every
//! decision answered, every count kept once).
//!
//! # The scripts' contract
//!
//! Each algorithm's script (the `.lua` files in `scripts/`, whose first
//! comment states this in full), a function of [`scripts::MULTI`] and
//! [`scripts::ONE`], takes
//! `KEYS[1]`, the limited key's state, and `ARGV = [now, <the policy's
//! figures>, cost]`:
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
//! It answers eight integers (as values, which the calling script copies
//! into its reply): `allowed (0/1), remaining, reset_at, retry_at or -1,
//! estimate whole, estimate numerator, estimate denominator, now`, the
//! instants in microseconds on the script's clock:
//! what [`Decision::at`] takes. The calling script sends its call's
//! replies, every integer of them, as one string of little-endian 64-bit
//! integers (`packed` in `scripts/decide.lua`). A script writes only when the state
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
//! Supported, checked by [`Store::supports`](slidegate_store::Store::supports)
//! (and by [`microsecond_policy`]):
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
//! the year 2112; a client clock beyond it is [`StoreError::Unavailable`],
//! its source [`RedisStoreError::TimeOutOfRange`]).
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
//! A decision is one request in a script call, for all of the key's limits.
//! A request that finds no call in flight on its lane is sent at once; the
//! requests that come while one is in flight wait for it and go together in
//! the next call (at most [`MAX_BATCH`]), one script run that decides each
//! in arrival order, exactly and atomically as if alone; a call that is one
//! run of decisions under one limit other than `sliding_log` (a request
//! alone, or a hot key's requests that came together) goes to
//! [`scripts::ONE`], the same reply for 0.68–0.85 of the instructions (a run of requests
//! alike, on one key's `fixed_window`, `sliding_window` or `gcra` limit at
//! one time and cost, as a hot key's are on the server's clock, is decided
//! at once: the first in full, the passes counted, the first refusal in
//! full, and answered as the first's reply plus a step per pass;
//! [`Batching`]: per
//! server for [`RedisStore::connect`] and [`RedisStore::connect_sentinel`],
//! per Cluster hash slot for [`RedisStore::new`] and
//! [`RedisStore::connect_cluster`], or off). [`RedisStore::script_calls`]
//! counts the calls and the requests they carried. A call is an `FCALL` of
//! the script as a Redis function ([`Function`]: the script's files run
//! once, when its library is loaded, not on every call); when the server
//! has no function by that name (a restart without persistence, a
//! `FUNCTION FLUSH`, a new Cluster master) the library is loaded and the
//! call retried, invisibly to the caller. A server that will not load it
//! (before Redis 7.0, an ACL without `FUNCTION`, a proxy that refuses it)
//! gets the same script by `EVALSHA` from then on
//! ([`RedisStore::uses_functions`]), and when that server answers
//! `NOSCRIPT` (its script cache was flushed by a restart or a failover) the
//! script is loaded and the call retried in the same way. A library's name
//! carries its script's hash, so instances of different versions sharing a
//! Redis each call their own; the libraries of versions no longer running
//! stay loaded (a few tens of kilobytes each) until `FUNCTION DELETE`. Many decisions in
//! flight share one multiplexed connection (clone it freely); each call,
//! retry included, is bounded by the store's timeout and fails with
//! [`StoreError::Timeout`] beyond it, never hangs. The connection's
//! queue is bounded: redis-rs buffers at most 50 commands waiting to be
//! written by default (`set_pipeline_buffer_size`) and can bound the calls
//! in flight (`set_concurrency_limit`; `slidegate serve` sets 1024); a call
//! that finds them full waits, within its timeout.
//!
//! # Cost on the server
//!
//! Redis runs one command at a time, so what bounds the decisions per
//! second of a busy server is its CPU time per decision. Batching shares a
//! call's fixed cost (the call, the time, the script's own definitions)
//! among its requests, and a hot key's state is read and written once per
//! call: `BENCHMARKS.md` ("Redis batching") has the instructions per
//! request. The figures below are of one request per call. An algorithm's
//! script, measured on its own (the `.lua` file after the prelude, one
//! limit: [`scripts::MULTI`] runs it as a function, once per limit), costs the
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
//! # Hybrid mode
//!
//! [`HybridStore`] decides `sliding_window` and `fixed_window` limits in
//! the process, on each key's count as Redis last answered it plus this
//! instance's counts since, and sends the counts in batches (one
//! `EVALSHA` of [`SLIDING_WINDOW_SYNC`] or [`FIXED_WINDOW_SYNC`] per key,
//! every interval or when a batch fills): no round trip per decision, one
//! command per key per interval. Those two algorithms only, whose states
//! merge by adding; it refuses `gcra` and `sliding_log` (why: its docs),
//! which a consumer sends to the [`RedisStore`]. One instance alone decides
//! exactly as the [`RedisStore`]; several over-admit by at most
//! `(instances − 1) × min(limit, rate × (2 × interval + round trip))` in
//! a window, about `(instances − 1) × rate × interval` when their syncs
//! tick together (the bound, and the figures, are in [`HybridLimiter`]'s
//! docs).
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use slidegate_core::{Algorithm, Policy, Weighting};
//! use slidegate_redis::{HybridOptions, HybridStore};
//! use slidegate_store::{Decisions, FailOver, FailurePolicy, Quota, Store};
//! use std::time::Duration;
//!
//! let client = redis::Client::open("redis://127.0.0.1:6379/")?;
//! let conn = client.get_connection_manager().await?;
//! let options = HybridOptions::every(Duration::from_millis(50));
//! let hybrid = HybridStore::new(conn, "rl:", Duration::from_millis(50), options)?;
//! let _sync = hybrid.spawn_sync(); // syncs until dropped
//! let store = FailOver::new(hybrid, FailurePolicy::Closed);
//! let ring = Algorithm::SlidingWindow { buckets: 8, weighting: Weighting::Conservative };
//! let limits = [Quota::new(Policy::new(100, Duration::from_secs(60), ring)?)];
//! let mut out = Decisions::new();
//! store.decide("user:42", &limits, 1, &mut out).await?; // no round trip
//! # Ok(())
//! # }
//! ```
//!
//! `slidegate serve --redis URL` serves limits from these stores (with
//! `--redis-sync-interval` in hybrid mode), and `slidegate-bench --redis
//! URL` measures them (BENCHMARKS.md).
//!
//! [`StoreError::Timeout`]: slidegate_store::StoreError::Timeout
//! [`StoreError::Unavailable`]: slidegate_store::StoreError::Unavailable
//! [`StoreError::Unsupported`]: slidegate_store::StoreError::Unsupported

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

mod batch;
mod connect;
mod hybrid;
mod hybrid_store;
mod stale;
mod store;
mod tls;

pub use batch::{Batching, MAX_BATCH};
pub use connect::{
    CONNECT_TIMEOUT, DEFAULT_PREFIX, DEFAULT_TIMEOUT, RedisConn, RedisConnectError, RedisOptions, RedisProbe,
};
pub use hybrid::{
    FIXED_WINDOW_SYNC, HybridLimiter, HybridOptions, HybridStats, LEASE_SYNC, SLIDING_WINDOW_SYNC, SyncReport, SyncTask,
};
pub use hybrid_store::{HybridStore, MAX_HYBRID_LIMITS};
pub use stale::StaleSyncs;
pub use store::{RedisStore, SentinelConnection, supports_quota};
pub use tls::{RedisTls, RedisTlsError};

use redis::Script;
use slidegate_core::{Algorithm, Clock, Decision, Policy, Weighting};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

/// `scripts/<name>.lua` wrapped as a Lua function `<name>(KEYS, ARGV)`.
macro_rules! algorithm {
    ($name:literal) => {
        concat!(
            "local function ",
            $name,
            "(KEYS, ARGV)\n",
            include_str!(concat!("../scripts/", $name, ".lua")),
            "\nend\n"
        )
    };
}

/// `MULTI`'s files but its last (`scripts/batch.lua`).
macro_rules! multi_defs {
    () => {
        concat!(
            include_str!("../scripts/prelude.lua"),
            include_str!("../scripts/cache.lua"),
            algorithm!("fixed_window"),
            algorithm!("gcra"),
            algorithm!("sliding_log"),
            algorithm!("sliding_window"),
            include_str!("../scripts/decide.lua"),
            include_str!("../scripts/charge.lua"),
            include_str!("../scripts/run.lua")
        )
    };
}

/// `ONE`'s files but its last (`scripts/one.lua`).
macro_rules! one_defs {
    () => {
        concat!(
            include_str!("../scripts/prelude.lua"),
            algorithm!("fixed_window"),
            algorithm!("gcra"),
            "local sliding_log = nil\n",
            algorithm!("sliding_window"),
            include_str!("../scripts/decide.lua"),
            include_str!("../scripts/run.lua")
        )
    };
}

/// The Lua sources of the store's two scripts as sent to Redis (the hybrid
/// mode's syncs are [`SLIDING_WINDOW_SYNC`] and [`FIXED_WINDOW_SYNC`]).
pub mod scripts {
    /// Every limit of one or more requests in one call: the prelude
    /// (`scripts/prelude.lua`: the clock, an exact `divmod`, integer
    /// writing), the hash cache (`scripts/cache.lua`: each hash read once
    /// and written once per call), each algorithm's script
    /// (`scripts/<algorithm>.lua`, which opens with its contract) wrapped
    /// as a function `<name>(KEYS, ARGV)` of its own keys and arguments,
    /// `scripts/decide.lua` (one request against all of its limits, all or
    /// nothing), `scripts/charge.lua` (a charge after the fact),
    /// `scripts/run.lua` (a run of requests alike), then
    /// `scripts/batch.lua`, which runs them for each request in order.
    /// `KEYS` the keys of each distinct shape (a key's limits); `ARGV =
    /// [caching, s, the shapes, the number of runs, then per run of
    /// requests alike: its shape (negated and followed by the run's length
    /// when more than one), its time, its cost under each limit]`
    /// (batch.lua's first comment).
    pub const MULTI: &str = concat!(multi_defs!(), include_str!("../scripts/batch.lua"));

    /// A call that is one run of decisions alike under one `fixed_window`,
    /// `gcra` or `sliding_window` limit (a request alone, or a hot key's
    /// requests that came together): [`MULTI`]'s reply for the same call,
    /// from the same files less the cache, `sliding_log`, the charges and
    /// the shape tables, so 0.68–0.85 of its instructions (`BENCHMARKS.md`).
    /// `KEYS = [the limit's key]`, `ARGV = [the algorithm and its four
    /// figures, the time, the cost, the run's length]` (`scripts/one.lua`).
    pub const ONE: &str = concat!(one_defs!(), include_str!("../scripts/one.lua"));
}

/// One of the store's two scripts as a Redis function (Redis 7.0's
/// `FUNCTION LOAD`, called by `FCALL` with the script's keys and
/// arguments): a library of its own whose code is the script's files, run
/// once when the library is loaded, and whose one function's body is the
/// script's last file. So a call no longer runs the files' definitions
/// (about a dozen closures: 15,000–29,000 of a call's instructions inside
/// Redis, `BENCHMARKS.md`). The library and its function are both named
/// `slidegate_<one|multi>_<the first 20 hex digits of the SHA-1 of the
/// script>`: instances of other versions, whose scripts differ, load and
/// call their own, side by side on one Redis.
pub struct Function {
    /// The library's and the function's name.
    pub name: String,
    /// The library's code, as `FUNCTION LOAD` takes it.
    pub library: String,
}

impl Function {
    /// `script` (whose text is `defs` then `body`) as the library `kind`.
    fn new(kind: &str, script: &Script, defs: &str, body: &str) -> Function {
        let name = format!("slidegate_{kind}_{}", &script.get_hash()[..20]);
        // `redis` is the loader's while the library loads (it registers
        // the function), and the call's while the function runs.
        let library = format!(
            "#!lua name={name}\nlocal loader = redis\n{defs}loader.register_function('{name}', function(KEYS, ARGV)\n{body}\nend)\n"
        );
        Function { name, library }
    }
}

/// [`scripts::MULTI`] as a Redis function.
pub static MULTI_FUNCTION: LazyLock<Function> =
    LazyLock::new(|| Function::new("multi", &MULTI, multi_defs!(), include_str!("../scripts/batch.lua")));
/// [`scripts::ONE`] as a Redis function.
pub static ONE_FUNCTION: LazyLock<Function> =
    LazyLock::new(|| Function::new("one", &ONE, one_defs!(), include_str!("../scripts/one.lua")));

static MULTI: LazyLock<Script> = LazyLock::new(|| Script::new(scripts::MULTI));
static ONE: LazyLock<Script> = LazyLock::new(|| Script::new(scripts::ONE));

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

/// How long a [`RedisStore`] answers [`StoreError::Unavailable`] at once
/// after a failure, unless [`RedisStore::with_backoff`] says otherwise:
/// 100 ms.
///
/// [`StoreError::Unavailable`]: slidegate_store::StoreError::Unavailable
pub const DEFAULT_BACKOFF: Duration = Duration::from_millis(100);

/// The keys the in-memory store of a [`FailurePolicy::Local`] fallback
/// holds in `slidegate serve`: 100 000.
///
/// [`FailurePolicy::Local`]: slidegate_store::FailurePolicy::Local
pub const DEFAULT_LOCAL_KEYS: usize = 100_000;

/// The ranges of Redis Cluster slots a store with
/// [`RedisStore::with_backoff_per_slot_range`] backs off apart: 64 ranges
/// of 256 slots.
const SLOT_RANGES: usize = 64;

/// The Redis Cluster slot of `key`: the CRC16 (XMODEM) of its hash tag (the
/// text between its first `{` and the next `}`, when not empty; else the
/// whole key), mod 16384, as Redis computes it.
pub(crate) fn cluster_slot(key: &[u8]) -> u16 {
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

/// The backoff and the failures shared by a store's clones.
struct Health {
    /// The origin of `skip_until`.
    origin: Instant,
    /// Nanoseconds after `origin` until which Redis is skipped: for the
    /// whole store (the first), or for each range of cluster slots.
    skip_until: [AtomicU64; SLOT_RANGES],
    failures: AtomicU64,
}

impl Health {
    fn new() -> Self {
        Health {
            origin: Instant::now(),
            skip_until: std::array::from_fn(|_| AtomicU64::new(0)),
            failures: AtomicU64::new(0),
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
    /// No answer within the timeout.
    #[error("no answer from Redis within {0:?}")]
    Timeout(Duration),
    /// Redis or the connection failed. Its message says the cause, which
    /// is therefore not also its [`source`](std::error::Error::source): a
    /// printer of error chains says it once.
    #[error("Redis: {0}")]
    Redis(redis::RedisError),
    /// Options that cannot work (a zero sync interval).
    #[error("invalid options: {0}")]
    Options(&'static str),
    /// The script answered something that is not a decision.
    #[error("unexpected reply from the script: {0:?}")]
    Reply(Vec<i64>),
    /// Redis is skipped for a backoff after a failure.
    #[error("Redis is skipped for {0:?} after a failure")]
    Backoff(Duration),
    /// The script call a request waited for was never sent (its runtime
    /// shut down).
    #[error("the call this request waited for was dropped")]
    Abandoned,
}

impl From<redis::RedisError> for RedisStoreError {
    fn from(e: redis::RedisError) -> Self {
        RedisStoreError::Redis(e)
    }
}

/// The policy a script runs for `policy`: the same limit and algorithm, with
/// the window's microseconds read as nanoseconds. The core's
/// [`State`](slidegate_core::State) on it, fed times in microseconds,
/// decides exactly as a [`RedisStore`] decides `policy`.
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
    use super::{RedisStoreError, cluster_slot};

    /// A Redis failure printed with its sources says its cause once.
    #[test]
    fn a_redis_failure_says_its_cause_once() {
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused by 127.0.0.1:1");
        let e = RedisStoreError::from(redis::RedisError::from(refused));
        let mut said = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            said.push_str(": ");
            said.push_str(&s.to_string());
            source = s.source();
        }
        assert!(said.starts_with("Redis: "), "{said}");
        assert_eq!(said.matches("refused by 127.0.0.1:1").count(), 1, "{said}");
    }

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
