//! Redis as the shared store of slidegate limits: every decision is one
//! atomic Lua script, run with `EVALSHA`, so that any number of instances
//! share one count per key.
//!
//! [`RedisLimiter`] has the interface of the in-memory keyed limiter
//! (`check(key, cost) -> Result<Decision, _>`), asynchronous: it limits every
//! key to one [`Policy`] over a multiplexed connection, with a timeout per
//! call.
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
//! # Algorithms
//!
//! | algorithm | Redis state of a key | script |
//! |---|---|---|
//! | `fixed_window` | hash `<prefix>{<key>}`: `w` (window index), `c` (count) | [`scripts::FIXED_WINDOW`] |
//! | `gcra` | hash `<prefix>{<key>}`: `t` (the theoretical arrival time) | [`scripts::GCRA`] |
//! | `sliding_log` | sorted set `<prefix>{<key>}:log`: member `<time>:<cost>`, score `<time>` | [`scripts::SLIDING_LOG`] |
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
//! All the state of a limited key is one Redis key whose hash tag is the
//! limited key (`{<key>}`), so that a cluster keeps it in one slot and a
//! hot namespace is not one hot slot. The prefix may not contain `{` or
//! `}`; give each policy its own prefix.
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
//! `n + 1` fields) and a refusal scans it for the retry time: O(n) Lua on
//! the server per decision. Measured on a full ring (Redis 7.0): about
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
//! [`RedisStoreError::Timeout`] beyond it, never hangs.
//!
//! # Not there yet
//!
//! Redis Cluster (the keys
//! already carry their hash tags, but no cluster connection is taken);
//! a failure policy (fail open, fail closed, fall back to a local limit:
//! today every failure is an error for the caller to decide on); the hybrid
//! mode (local counting with periodic sync); and serving a Redis store from
//! `slidegate serve`. These are later slices.

#![forbid(unsafe_code)]

use redis::Script;
use redis::aio::MultiplexedConnection;
use slidegate_core::{Algorithm, Clock, Decision, Policy, Weighting};
use std::fmt;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

/// The Lua sources of the scripts, each starting with its contract.
pub mod scripts {
    /// `fixed_window`: `KEYS[1]` a hash; `ARGV = [now, W, limit, cost]`.
    pub const FIXED_WINDOW: &str = include_str!("../scripts/fixed_window.lua");
    /// `gcra`: `KEYS[1]` a hash; `ARGV = [now, T, burst, limit, cost]`.
    pub const GCRA: &str = include_str!("../scripts/gcra.lua");
    /// `sliding_log`: `KEYS[1]` a sorted set; `ARGV = [now, W, limit, cost]`.
    pub const SLIDING_LOG: &str = include_str!("../scripts/sliding_log.lua");
    /// `sliding_window`: `KEYS[1]` a hash; `ARGV = [now, b, n, limit,
    /// weighting, cost]`.
    pub const SLIDING_WINDOW: &str = include_str!("../scripts/sliding_window.lua");
}

static FIXED_WINDOW: LazyLock<Script> = LazyLock::new(|| Script::new(scripts::FIXED_WINDOW));
static GCRA: LazyLock<Script> = LazyLock::new(|| Script::new(scripts::GCRA));
static SLIDING_LOG: LazyLock<Script> = LazyLock::new(|| Script::new(scripts::SLIDING_LOG));
static SLIDING_WINDOW: LazyLock<Script> = LazyLock::new(|| Script::new(scripts::SLIDING_WINDOW));

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
    /// The script answered something that is not a decision.
    #[error("unexpected reply from the script: {0:?}")]
    Reply(Vec<i64>),
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
/// Cheap to clone: clones share the multiplexed connection.
#[derive(Clone)]
pub struct RedisLimiter {
    conn: MultiplexedConnection,
    policy: Policy,
    params: Params,
    prefix: String,
    timeout: Duration,
    clock: RedisClock,
}

impl fmt::Debug for RedisLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisLimiter")
            .field("policy", &self.policy)
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}

impl RedisLimiter {
    /// A limiter of `policy` per key over `conn`, its keys starting with
    /// `prefix`, each call bounded by `timeout`, on the server's clock.
    ///
    /// # Errors
    ///
    /// [`RedisStoreError::Unsupported`] for a policy outside the supported
    /// ranges or without a script, [`RedisStoreError::Prefix`] for a prefix
    /// with `{` or `}`.
    pub fn new(
        conn: MultiplexedConnection,
        policy: Policy,
        prefix: impl Into<String>,
        timeout: Duration,
    ) -> Result<Self, RedisStoreError> {
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
        })
    }

    /// The same limiter on `clock`.
    pub fn with_clock(mut self, clock: RedisClock) -> Self {
        self.clock = clock;
        self
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The timeout of each call.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The Redis key holding the state of `key`: `<prefix>{<key>}`, with
    /// `:log` after it for `sliding_log`.
    pub fn redis_key(&self, key: &str) -> String {
        let suffix = match self.params {
            Params::SlidingLog { .. } => ":log",
            _ => "",
        };
        format!("{}{{{key}}}{suffix}", self.prefix)
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
        let mut invocation = script.key(self.redis_key(key));
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

    /// The decision of a script's reply, its instants turned into ns.
    fn decision(&self, reply: Vec<i64>) -> Result<Decision, RedisStoreError> {
        let &[allowed, remaining, reset_at, retry_at, whole, num, den, now] = reply.as_slice() else {
            return Err(RedisStoreError::Reply(reply));
        };
        let plain = [allowed, remaining, reset_at, whole, num, den, now];
        if plain.iter().any(|&x| x < 0) || allowed > 1 || retry_at < -1 {
            return Err(RedisStoreError::Reply(reply));
        }
        let ns = |us: i64| (us as u64).saturating_mul(1000);
        let retry_at = (retry_at >= 0).then(|| ns(retry_at));
        Ok(Decision::at(
            &self.policy,
            ns(now),
            allowed == 1,
            remaining as u64,
            ns(reset_at),
            retry_at,
            (whole as u64, num as u64, den as u64),
        ))
    }
}
