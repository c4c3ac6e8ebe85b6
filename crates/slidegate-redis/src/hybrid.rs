//! Hybrid mode: decisions made locally from the last global count plus this
//! instance's own counts since, the counts sent to Redis in batches.
//!
//! See [`HybridLimiter`].

use crate::{MAX_TIME_US, RedisClock, RedisStore, RedisStoreError, StaleSyncs};
use parking_lot::Mutex;
use redis::Script;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use slidegate_core::{Algorithm, Decision, FixedWindow, LimitState, Policy, SlidingWindow, State};
use slidegate_memory::Budget;
use slidegate_memory::internals::{KeyState, StateMap};
use slidegate_store::{Quota, Store as _, StoreError};
use std::collections::HashMap;
use std::fmt;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::Notify;

/// `sliding_window_sync.lua`: `KEYS[1]` the ring's hash; `ARGV = [now, b,
/// n, bucket, count, bucket, count, …]`.
pub const SLIDING_WINDOW_SYNC: &str = concat!(
    include_str!("../scripts/prelude.lua"),
    include_str!("../scripts/sliding_window_sync.lua")
);

/// `lease_sync.lua` (the bounded mode): `KEYS[1]` the key's lease hash;
/// `ARGV = [now, b, n, limit, instance, lease µs, carry, want, bucket,
/// count, …]`.
pub const LEASE_SYNC: &str = concat!(
    include_str!("../scripts/prelude.lua"),
    include_str!("../scripts/lease_sync.lua")
);

/// `fixed_window_sync.lua`: `KEYS[1]` the counter's hash; `ARGV = [now,
/// W, window, count, window, count, …]`.
pub const FIXED_WINDOW_SYNC: &str = concat!(
    include_str!("../scripts/prelude.lua"),
    include_str!("../scripts/fixed_window_sync.lua")
);

static SYNC: LazyLock<Script> = LazyLock::new(|| Script::new(SLIDING_WINDOW_SYNC));
static FIXED_SYNC: LazyLock<Script> = LazyLock::new(|| Script::new(FIXED_WINDOW_SYNC));
static LEASE: LazyLock<Script> = LazyLock::new(|| Script::new(LEASE_SYNC));

/// How many locks [`Stripes`] holds.
const STRIPES: usize = 1024;

/// A fixed array of locks, one taken per key (by a hash of the key): what
/// makes a decision over several limiters of one key atomic with respect
/// to the syncs' replies and to other decisions on the key.
pub(crate) struct Stripes {
    locks: [Mutex<()>; STRIPES],
    hasher: foldhash::fast::FixedState,
}

impl Stripes {
    pub(crate) fn new() -> Self {
        Stripes {
            locks: std::array::from_fn(|_| Mutex::new(())),
            hasher: foldhash::fast::FixedState::default(),
        }
    }

    /// The lock of `key`'s stripe.
    pub(crate) fn of(&self, key: &str) -> &Mutex<()> {
        // The remainder is below the stripe count, so `get` always finds
        // the lock; the first one only satisfies the type.
        let [first, ..] = &self.locks;
        let stripe = (self.hasher.hash_one(key) % STRIPES as u64) as usize;
        self.locks.get(stripe).unwrap_or(first)
    }
}

/// Why a [`HybridLimiter`] cannot decide a key locally, answered as a
/// [`StoreError`].
#[derive(Debug)]
pub(crate) enum NotLocal {
    /// The clock is beyond [`MAX_TIME_US`].
    TimeOutOfRange(u64),
    /// The syncs have failed for longer than `stale_after`.
    Stale(Duration),
    /// The key is new and the outbox holds `max_pending_keys` keys.
    NoRoom(usize),
    /// The key's view is larger than the budget's share.
    TooLarge(slidegate_memory::MemoryError),
}

impl From<NotLocal> for StoreError {
    fn from(e: NotLocal) -> Self {
        match e {
            NotLocal::TimeOutOfRange(now_us) => StoreError::unavailable(RedisStoreError::TimeOutOfRange { now_us }),
            NotLocal::Stale(after) => StoreError::unavailable(StaleSyncs(after)),
            NotLocal::NoRoom(held) => StoreError::KeyRefused(format!(
                "{held} keys already wait for the next sync to Redis (max_pending_keys)"
            )),
            NotLocal::TooLarge(e) => StoreError::KeyRefused(e.to_string()),
        }
    }
}

/// Shards of the outbox (the counts not yet sent), so that concurrent
/// decisions rarely wait for each other.
const OUTBOX_SHARDS: usize = 16;

/// How a [`HybridLimiter`] counts and syncs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HybridOptions {
    /// How often the counts go to Redis: the `interval` of
    /// [`HybridLimiter::spawn_sync`]. The over-admission grows with it.
    pub interval: Duration,
    /// The most keys one batch sends; a batch that fills before the
    /// interval is sent at once.
    pub batch: usize,
    /// The most keys with counts not yet in Redis. A new key beyond it
    /// (Redis failing for long, or a flood of keys faster than the syncs
    /// drain them) is refused ([`StoreError::KeyRefused`]), so that memory
    /// stays bounded and no count is dropped.
    pub max_pending_keys: usize,
    /// How long syncs may fail (counted from the first failure) before
    /// decisions answer [`StoreError::Unavailable`] (for a
    /// [`FailOver`](slidegate_store::FailOver) to decide); until then they
    /// go on locally, on the last global count.
    pub stale_after: Duration,
    /// The bound of one batch: a sync is not on any request's path, so it
    /// may wait longer than a decision of the direct mode.
    pub sync_timeout: Duration,
    /// How many instances share the limit: a key new to this instance (or
    /// whose view was dropped for room) is decided on the limit divided by
    /// this (rounded up) until Redis has answered twice for it — by its
    /// second sync the other instances' first counts are in its view — so
    /// that a flood of a new key on every instance at once admits about the
    /// limit, not the limit on each. 1 (the default): the whole limit.
    pub instances: u64,
    /// The budget of the local views (the last global count of each key
    /// plus its own counts since). A view dropped for room costs only
    /// accuracy: the key starts again from its own counts until its next
    /// sync.
    pub budget: Budget,
    /// The bounded mode, and how long a lease lasts: `None` (the default)
    /// decides on the last global count plus this instance's own, which
    /// over-admits by up to `(instances − 1) × rate × interval`; `Some(t)`
    /// decides on leases instead, shares of what the key has left that
    /// Redis grants at each sync and that this instance spends without
    /// asking, so that no window ever holds more than the limit whatever
    /// the traffic and however many instances (see
    /// `scripts/lease_sync.lua`). A lease not renewed within `t` (an
    /// instance that died, or cannot reach Redis) is counted as spent
    /// whole; the instance itself stops spending it after `t`. Must be more
    /// than the interval.
    pub lease: Option<Duration>,
}

impl HybridOptions {
    /// Options syncing every `interval`, in batches of 2048 keys, with at
    /// most 100 000 keys pending, stale after `max(4 × interval, 200 ms)`,
    /// each batch bounded by 1 s, one instance, views for 100 000 keys.
    pub fn every(interval: Duration) -> Self {
        HybridOptions {
            interval,
            batch: 2048,
            max_pending_keys: 100_000,
            stale_after: (interval * 4).max(Duration::from_millis(200)),
            sync_timeout: Duration::from_secs(1),
            instances: 1,
            budget: Budget::keys(100_000),
            lease: None,
        }
    }

    /// [`HybridOptions::every`] in the bounded mode, leases lasting
    /// `max(4 × interval, 200 ms)`.
    pub fn leased(interval: Duration) -> Self {
        HybridOptions {
            lease: Some((interval * 4).max(Duration::from_millis(200))),
            ..Self::every(interval)
        }
    }
}

impl HybridOptions {
    /// Refuses options that cannot work.
    pub(crate) fn check(&self) -> Result<(), RedisStoreError> {
        if self.interval.is_zero() || self.sync_timeout.is_zero() {
            return Err(RedisStoreError::Options(
                "the sync interval and timeout must be more than zero",
            ));
        }
        if self.batch == 0 || self.max_pending_keys == 0 {
            return Err(RedisStoreError::Options(
                "the batch and the pending keys must be at least 1",
            ));
        }
        if self.lease.is_some_and(|t| t <= self.interval) {
            return Err(RedisStoreError::Options(
                "a lease must last longer than the sync interval",
            ));
        }
        Ok(())
    }
}

/// What a [`HybridLimiter`] has done so far, over all its clones.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HybridStats {
    /// Decisions made locally.
    pub decisions: u64,
    /// Batches sent.
    pub syncs: u64,
    /// Redis commands sent: one `EVALSHA` per key of a batch.
    pub commands: u64,
    /// Keys whose counts are waiting to be sent.
    pub pending_keys: usize,
    /// Keys whose sync failed (their counts are kept and sent again).
    pub failures: u64,
    /// The bounded mode: requests refused because this instance's lease
    /// of the key was spent (another instance may hold unused share).
    pub lease_refusals: u64,
    /// The bounded mode: syncs started before the interval because a
    /// lease was nearly spent.
    pub early_syncs: u64,
}

/// What one [`HybridLimiter::sync`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyncReport {
    /// Keys sent.
    pub keys: usize,
    /// Batches sent.
    pub batches: usize,
}

/// A key's counts not yet in Redis: `(bucket index, count)`, at most `n`.
type Pending = Vec<(u64, u64)>;

/// A key of a bounded sync: the key, its lease hash, its pending counts,
/// the carry and the units wanted.
type LeaseEntry = (String, String, Pending, u64, u64);

/// `sliding_window` (and `fixed_window`) limits shared through Redis with local counting and
/// periodic sync (Kong's `sync_rate`, gubernator's `GLOBAL` behaviour):
/// each instance decides on its own view of a key — the key's ring as
/// Redis last answered it, plus the requests this instance admitted since —
/// and sends its new counts to Redis in batches, one `EVALSHA` of
/// [`SLIDING_WINDOW_SYNC`] per key, every
/// [`interval`](HybridOptions::interval) or as soon as a batch fills. Each
/// reply is the key's whole ring, which becomes the new view.
///
/// A decision costs no round trip. Redis sees one command per key per
/// interval, however many decisions the key had.
///
/// # Accuracy
///
/// One instance alone decides exactly as the direct [`RedisStore`] (and
/// the core) does: its view holds every count (tested figure for figure,
/// with syncs at random points). Several instances each miss what the
/// others admitted and had not yet sent when it last synced, and what they
/// admitted since: at most two sync intervals of each other instance's
/// admissions, plus a round trip. So in any window they admit together at
/// most
///
/// ```text
/// limit + (instances − 1) × min(limit, rate × (2 × interval + round trip))
/// ```
///
/// where `rate` is one instance's admission rate for the key. When the
/// instances sync at about the same moments, as their background syncs on
/// one interval do, the over-admission is close to `(instances − 1) × rate
/// × interval`: four instances each offered 100 requests/s under a limit of
/// 100/s (8 buckets, conservative) admitted at most 103, 115 and 130 in a
/// window with syncs every 10, 50 and 100 ms (`tests/hybrid.rs`), against
/// bounds of 106, 130 and 160.
///
/// A flood of a key that no instance has synced yet is the worst case:
/// with [`instances`](HybridOptions::instances) left at 1 each instance may
/// admit the whole limit before its first sync of the key; set it to the
/// number of instances and each decides such a key on its share of the
/// limit until its second sync (when the others' first counts are in), so
/// that together they admit about the limit.
///
/// The bounded mode ([`HybridOptions::lease`]) has no such term: a
/// decision spends a lease that Redis granted at a sync against
/// everything the key's ring and the other instances' leases hold, so in
/// any window the instances together admit at most the limit (a charge
/// after the fact aside), whatever their rate (`tests/lease.rs`: a
/// property test of 2 to 4 instances under arbitrary requests, syncs,
/// waits and deaths). Its price is refusals while another instance holds
/// unused share, and nothing admitted on an instance before its first sync
/// of a key.
///
/// A refusal is never wrong by this: a view never holds more than Redis
/// does, so an instance refuses only a key whose global count is at the
/// limit (up to the clocks' skew). The ring is the one
/// `sliding_window.lua` keeps, so direct and hybrid instances can share
/// keys.
///
/// # Clock
///
/// On [`RedisClock::Server`] (the default) the syncs read Redis's `TIME`,
/// and each reply sets the instance's offset from it, so that local
/// decisions run on the server's time within half a round trip (the wall
/// clock until the first reply). On [`RedisClock::Client`] every time is
/// the client clock's.
///
/// # Failure
///
/// A failed sync keeps its counts and sends them again with the next one
/// (a sync whose reply was lost may be counted twice: an error towards
/// refusing). Decisions go on locally on the last global count until syncs
/// have failed for [`stale_after`](HybridOptions::stale_after), then they
/// answer [`StoreError::Unavailable`] until a sync succeeds again: the
/// failure policy is a [`FailOver`](slidegate_store::FailOver)'s, around
/// the [`HybridStore`](crate::HybridStore).
///
/// # Algorithms
///
/// `sliding_window`, both weightings, and (made with
/// [`HybridLimiter::any_window`]) `fixed_window`: their states merge by
/// adding, a ring's buckets and a window's count being sums of what each
/// instance admitted. A fixed window is synced as a ring of one bucket,
/// one `EVALSHA` of [`FIXED_WINDOW_SYNC`] per key on the hash
/// `fixed_window.lua` keeps (`w`, `c`), its view the core's
/// [`FixedWindow`] rebuilt from the reply plus the counts made since; the
/// accuracy above holds for it window by window. The exact algorithms
/// (`sliding_log`, `gcra`) are decided by the [`RedisStore`] directly (why:
/// [`crate::HybridStore`]).
///
/// # Concurrency
///
/// Cheap to clone: clones share the views, the counts and the connection.
/// A decision takes the lock of its key's view shard and then of its
/// outbox shard; a reply takes the same two in the same order.
#[derive(Clone)]
pub struct HybridLimiter<C = MultiplexedConnection> {
    inner: Arc<Inner<C>>,
}

struct Inner<C> {
    /// The store the syncs and resets go through (its connection, prefix,
    /// timeout and clock).
    redis: RedisStore<C>,
    /// The limit.
    quota: Quota,
    options: HybridOptions,
    /// The policy in microseconds read as nanoseconds: what the views run.
    micro: Policy,
    /// `micro` with the limit divided by the instances: what a view runs
    /// until its key's first sync.
    share: Policy,
    /// The bucket width in µs and the number of buckets (`fixed_window`:
    /// the window and 1).
    b: u64,
    n: u64,
    /// `fixed_window` (synced by [`FIXED_WINDOW_SYNC`]), else
    /// `sliding_window`.
    fixed: bool,
    /// The locks of a [`crate::HybridStore`]'s keys, which a reply takes
    /// too; none for a limiter of its own.
    stripes: Option<Arc<Stripes>>,
    views: StateMap<String, View>,
    outbox: [Mutex<HashMap<String, Pending>>; OUTBOX_SHARDS],
    hasher: foldhash::fast::FixedState,
    pending_keys: AtomicUsize,
    clock: LocalClock,
    /// Since when syncs have failed (the health clock's ns + 1), 0 while
    /// they succeed.
    failing_since: AtomicU64,
    failing: AtomicBool,
    wake: Arc<Notify>,
    decisions: AtomicU64,
    syncs: AtomicU64,
    commands: AtomicU64,
    failures: AtomicU64,
    /// The bounded mode: this instance's id in the lease hashes, the
    /// lease time in ns of the health clock (0: not bounded).
    instance: u64,
    lease_ns: u64,
    lease_refusals: AtomicU64,
    early_syncs: AtomicU64,
    /// When the last early sync was asked for (health ns).
    last_early: AtomicU64,
    /// One sync at a time: in the bounded mode, two syncs of a key in
    /// flight at once would each replace the other's lease. A reset holds
    /// it too, so that no sync of counts made before it lands after it.
    syncing: tokio::sync::Mutex<()>,
    /// The bounded mode's batches go one per hash slot (the server is a
    /// Cluster: it refused a batch across slots).
    per_slot: AtomicBool,
}

impl<C> fmt::Debug for HybridLimiter<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HybridLimiter")
            .field("redis", &self.inner.redis)
            .field("policy", self.inner.quota.policy())
            .field("options", &self.inner.options)
            .finish_non_exhaustive()
    }
}

/// The time of local decisions, in µs.
enum LocalClock {
    /// The client's clock.
    Client(Arc<dyn slidegate_core::Clock + Send + Sync>),
    /// A monotonic clock set to the server's time by each sync reply.
    Server {
        origin: Instant,
        /// Server µs minus µs since `origin`.
        offset_us: AtomicI64,
    },
}

impl LocalClock {
    fn of(clock: &RedisClock) -> Self {
        match clock {
            RedisClock::Client(clock) => LocalClock::Client(Arc::clone(clock)),
            RedisClock::Server => {
                let wall = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
                LocalClock::Server {
                    origin: Instant::now(),
                    offset_us: AtomicI64::new(wall),
                }
            }
        }
    }

    fn elapsed_us(origin: &Instant) -> i64 {
        i64::try_from(origin.elapsed().as_micros()).unwrap_or(i64::MAX)
    }

    /// Now, in µs.
    fn now_us(&self) -> u64 {
        match self {
            LocalClock::Client(clock) => clock.now() / 1000,
            LocalClock::Server { origin, offset_us } => {
                let t = Self::elapsed_us(origin).saturating_add(offset_us.load(Ordering::Relaxed));
                u64::try_from(t).unwrap_or(0)
            }
        }
    }

    /// A monotonic time in ns for the health of the syncs.
    fn health_ns(&self) -> u64 {
        match self {
            LocalClock::Client(clock) => clock.now(),
            LocalClock::Server { origin, .. } => u64::try_from(origin.elapsed().as_nanos()).unwrap_or(u64::MAX),
        }
    }

    /// What a sync sends as its time: the client's, or -1 for the server's.
    fn script_now(&self, now_us: u64) -> i64 {
        match self {
            LocalClock::Client(_) => i64::try_from(now_us).unwrap_or(i64::MAX),
            LocalClock::Server { .. } => -1,
        }
    }

    /// A reply's server time `server_us`, for a sync sent `sent_us` µs
    /// after the origin: the offset that makes now the reply's time plus
    /// half the round trip.
    fn learn(&self, server_us: u64, sent_us: i64) {
        if let LocalClock::Server { origin, offset_us } = self {
            let back = Self::elapsed_us(origin);
            let mid = sent_us.saturating_add(back.saturating_sub(sent_us) / 2);
            let server = i64::try_from(server_us).unwrap_or(i64::MAX);
            offset_us.store(server.saturating_sub(mid), Ordering::Relaxed);
        }
    }

    fn sent_us(&self) -> i64 {
        match self {
            LocalClock::Client(_) => 0,
            LocalClock::Server { origin, .. } => Self::elapsed_us(origin),
        }
    }
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> HybridLimiter<C> {
    /// A hybrid limiter of `policy` over `redis`: its connection, prefix,
    /// timeout and clock, the key of `key` being the one `redis` keeps for
    /// `policy` ([`RedisStore::redis_keys`]), so that direct and hybrid
    /// instances share their counts; `sliding_window` only (see
    /// [`HybridLimiter::any_window`] for `fixed_window`).
    ///
    /// # Errors
    ///
    /// [`RedisStoreError::Unsupported`] for a policy other than
    /// `sliding_window`; [`RedisStoreError::Options`] for a zero interval,
    /// batch or pending-key bound.
    pub fn new(redis: RedisStore<C>, policy: Policy, options: HybridOptions) -> Result<Self, RedisStoreError> {
        if !matches!(policy.algorithm(), Algorithm::SlidingWindow { .. }) {
            return Err(RedisStoreError::Unsupported {
                policy: policy.to_string(),
                reason: "HybridLimiter::new counts sliding_window only; HybridLimiter::any_window takes fixed_window too",
            });
        }
        Self::build(redis, Quota::new(policy), options, None)
    }

    /// A hybrid limiter of `policy` over `redis` as [`HybridLimiter::new`],
    /// for a `sliding_window` or a `fixed_window` policy: a fixed window is
    /// synced as a ring of one bucket, by [`FIXED_WINDOW_SYNC`] on the hash
    /// `fixed_window.lua` keeps.
    ///
    /// # Errors
    ///
    /// [`RedisStoreError::Unsupported`] for `gcra`, `sliding_log` and
    /// `exponential_histogram`; [`RedisStoreError::Options`] as
    /// [`HybridLimiter::new`].
    pub fn any_window(redis: RedisStore<C>, policy: Policy, options: HybridOptions) -> Result<Self, RedisStoreError> {
        Self::build(redis, Quota::new(policy), options, None)
    }

    /// The limiter of `quota` (its Redis keys named by its identity), its
    /// decisions and replies taking `stripes` when given, its batches waking
    /// `wake` (a store's shared sync) when given.
    pub(crate) fn build(
        redis: RedisStore<C>,
        quota: Quota,
        options: HybridOptions,
        shared: Option<(Arc<Stripes>, Arc<Notify>)>,
    ) -> Result<Self, RedisStoreError> {
        let policy = *quota.policy();
        let (n, fixed) = match policy.algorithm() {
            Algorithm::SlidingWindow { buckets, .. } => (u64::from(buckets), false),
            Algorithm::FixedWindow => (1, true),
            _ => {
                return Err(RedisStoreError::Unsupported {
                    policy: policy.to_string(),
                    reason: "hybrid mode counts sliding_window and fixed_window only; gcra and sliding_log are decided by the direct scripts",
                });
            }
        };
        options.check()?;
        let micro = crate::microsecond_policy(&policy)?;
        let clock = LocalClock::of(redis.clock());
        let (stripes, wake) = match shared {
            Some((stripes, wake)) => (Some(stripes), wake),
            None => (None, Arc::new(Notify::new())),
        };
        Ok(HybridLimiter {
            inner: Arc::new(Inner {
                b: micro.step_ns(),
                n,
                fixed,
                stripes,
                share: slidegate_store::share_of(&micro, options.instances),
                micro,
                views: StateMap::new(options.budget),
                outbox: std::array::from_fn(|_| Mutex::new(HashMap::new())),
                hasher: foldhash::fast::FixedState::default(),
                pending_keys: AtomicUsize::new(0),
                clock,
                failing_since: AtomicU64::new(0),
                failing: AtomicBool::new(false),
                wake,
                decisions: AtomicU64::new(0),
                syncs: AtomicU64::new(0),
                commands: AtomicU64::new(0),
                failures: AtomicU64::new(0),
                instance: std::hash::RandomState::new().hash_one(std::process::id()),
                lease_ns: options
                    .lease
                    .map_or(0, |t| u64::try_from(t.as_nanos()).unwrap_or(u64::MAX).max(1)),
                lease_refusals: AtomicU64::new(0),
                early_syncs: AtomicU64::new(0),
                last_early: AtomicU64::new(0),
                syncing: tokio::sync::Mutex::new(()),
                per_slot: AtomicBool::new(false),
                redis,
                quota,
                options,
            }),
        })
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        self.inner.quota.policy()
    }

    /// The options.
    pub fn options(&self) -> &HybridOptions {
        &self.inner.options
    }

    /// The counts so far, shared by all the clones.
    pub fn stats(&self) -> HybridStats {
        let i = &self.inner;
        HybridStats {
            decisions: i.decisions.load(Ordering::Relaxed),
            syncs: i.syncs.load(Ordering::Relaxed),
            commands: i.commands.load(Ordering::Relaxed),
            pending_keys: i.pending_keys.load(Ordering::Relaxed),
            failures: i.failures.load(Ordering::Relaxed),
            lease_refusals: i.lease_refusals.load(Ordering::Relaxed),
            early_syncs: i.early_syncs.load(Ordering::Relaxed),
        }
    }

    fn outbox(&self, key: &str) -> &Mutex<HashMap<String, Pending>> {
        let i = &self.inner;
        // The remainder is below the shard count, so `get` always finds
        // the shard; the first one only satisfies the type.
        let [first, ..] = &i.outbox;
        let shard = (i.hasher.hash_one(key) % OUTBOX_SHARDS as u64) as usize;
        i.outbox.get(shard).unwrap_or(first)
    }

    /// Whether syncs have failed for longer than `stale_after`.
    fn stale(&self) -> bool {
        let i = &self.inner;
        if !i.failing.load(Ordering::Relaxed) {
            return false;
        }
        let since = i.failing_since.load(Ordering::Relaxed);
        let stale_ns = u64::try_from(i.options.stale_after.as_nanos()).unwrap_or(u64::MAX);
        since != 0 && i.clock.health_ns().saturating_sub(since - 1) >= stale_ns
    }

    /// Decides whether `cost` units for `key` fit the policy now, on this
    /// instance's view; if they do and `cost > 0`, counts them (sent to
    /// Redis with the next sync). A `cost` of 0 peeks: it changes no count
    /// and adds no key to the views or the outbox. Never waits for Redis.
    ///
    /// # Errors
    ///
    /// The errors a [`HybridStore`](crate::HybridStore) answers:
    /// [`StoreError::Unavailable`] once the syncs have failed for
    /// [`stale_after`](HybridOptions::stale_after) (or for a clock beyond
    /// [`MAX_TIME_US`]), [`StoreError::KeyRefused`] for a new key beyond
    /// [`max_pending_keys`](HybridOptions::max_pending_keys) or a view
    /// larger than the budget's share; nothing is counted then.
    pub fn decide(&self, key: &str, cost: u64) -> Result<Decision, StoreError> {
        let now_us = self.now_us();
        self.ready(key, now_us, cost)?;
        Ok(self.decide_at(key, now_us, cost)?)
    }

    /// Now on the limiter's clock, in µs: what one decision reads once.
    pub(crate) fn now_us(&self) -> u64 {
        self.inner.clock.now_us()
    }

    /// Whether `key` can be decided locally at `now_us` at `cost`: the
    /// time in range, the syncs not stale, room in the outbox for a new key
    /// that `cost` would count in.
    pub(crate) fn ready(&self, key: &str, now_us: u64, cost: u64) -> Result<(), NotLocal> {
        let i = &self.inner;
        if now_us > MAX_TIME_US {
            return Err(NotLocal::TimeOutOfRange(now_us));
        }
        if self.stale() {
            return Err(NotLocal::Stale(i.options.stale_after));
        }
        let held = i.pending_keys.load(Ordering::Relaxed);
        if cost > 0 && held >= i.options.max_pending_keys && !self.outbox(key).lock().contains_key(key) {
            return Err(NotLocal::NoRoom(held));
        }
        Ok(())
    }

    /// The local decision at `now_us` (µs on the limiter's clock), its
    /// instants in ns, without the checks of [`HybridLimiter::ready`].
    pub(crate) fn decide_at(&self, key: &str, now_us: u64, cost: u64) -> Result<Decision, NotLocal> {
        let i = &self.inner;
        if i.lease_ns > 0 {
            return self.decide_leased(key, now_us, cost);
        }
        let own = now_us / i.b;
        let decided = i.views.update(&i.micro, key, now_us, |view| {
            let policy = if view.syncs >= 2 { &i.micro } else { &i.share };
            let d = KeyState::check(&mut view.ring, policy, now_us, cost);
            if cost > 0 {
                // A refusal counts nothing, but the key is synced too, so
                // that a refusing view learns what the others admit.
                self.record(key, own, if d.allowed() { cost } else { 0 });
            }
            d
        });
        let d = decided.map_err(NotLocal::TooLarge)?;
        i.decisions.fetch_add(1, Ordering::Relaxed);
        Ok(d.scale_time(1000))
    }

    /// The bounded mode's decision: admitted only if the key's lease has
    /// `cost` units left and has not expired, and the view admits too; a
    /// request refused for want of lease asks for an early sync (at most
    /// one every quarter interval), and so does a lease nearly spent.
    fn decide_leased(&self, key: &str, now_us: u64, cost: u64) -> Result<Decision, NotLocal> {
        let i = &self.inner;
        let own = now_us / i.b;
        let health = i.clock.health_ns();
        let lease_us = i.lease_ns / 1000;
        let decided = i.views.update(&i.micro, key, now_us, |view| {
            view.asked = view.asked.saturating_add(cost);
            if cost > 0 {
                view.keep_until = view.keep_until.max(now_us.saturating_add(lease_us));
            }
            let left = if health < view.lease_until { view.lease } else { 0 };
            if cost > left {
                let peek = KeyState::check(&mut view.ring, &i.micro, now_us, 0);
                self.record(key, own, 0);
                i.lease_refusals.fetch_add(1, Ordering::Relaxed);
                return (refused_for_lease(&i.micro, &peek, now_us, i.options.interval), true);
            }
            let d = KeyState::check(&mut view.ring, &i.micro, now_us, cost);
            let spent = if d.allowed() { cost } else { 0 };
            if cost > 0 {
                view.lease -= spent;
                self.record(key, own, spent);
            }
            // What the lease still allows is what remains here: a peek then
            // says exactly what a charge would decide (`decide_all`).
            let d = capped(&i.micro, d, now_us, left - spent);
            (d, cost > 0 && view.lease.saturating_mul(4) < view.granted)
        });
        let (d, early) = decided.map_err(NotLocal::TooLarge)?;
        if early {
            self.sync_early(health);
        }
        i.decisions.fetch_add(1, Ordering::Relaxed);
        Ok(d.scale_time(1000))
    }

    /// Wakes the sync before its interval, unless it was woken so less
    /// than a quarter interval ago.
    fn sync_early(&self, health: u64) {
        let i = &self.inner;
        let gap = u64::try_from((i.options.interval / 4).as_nanos()).unwrap_or(u64::MAX);
        let last = i.last_early.load(Ordering::Relaxed);
        if (last == 0 || health.saturating_sub(last) >= gap)
            && i.last_early
                .compare_exchange(last, health.max(1), Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            i.early_syncs.fetch_add(1, Ordering::Relaxed);
            i.wake.notify_one();
        }
    }

    /// Counts `cost` on `key` at `now_us` even past the limit, in the view
    /// and in the outbox (so the next sync sends it): a cost known only
    /// after the response. Counted while the syncs are stale too (it waits
    /// in the outbox for Redis to come back).
    pub(crate) fn charge_at(&self, key: &str, now_us: u64, cost: u64) -> Result<(), NotLocal> {
        let i = &self.inner;
        if cost == 0 {
            return Ok(());
        }
        if now_us > MAX_TIME_US {
            return Err(NotLocal::TimeOutOfRange(now_us));
        }
        let held = i.pending_keys.load(Ordering::Relaxed);
        if held >= i.options.max_pending_keys && !self.outbox(key).lock().contains_key(key) {
            return Err(NotLocal::NoRoom(held));
        }
        let own = now_us / i.b;
        let recorded = i.views.update(&i.micro, key, now_us, |view| {
            LimitState::record(&mut view.ring, &i.micro, now_us, cost);
        });
        // The count reaches Redis even when the view cannot be kept.
        self.record(key, own, cost);
        recorded.map_err(NotLocal::TooLarge)
    }

    /// Forgets this instance's view and pending counts of `key`; true if
    /// either was held.
    pub(crate) fn forget(&self, key: &str) -> bool {
        let i = &self.inner;
        let viewed = i.views.reset(key);
        let pending = self.outbox(key).lock().remove(key).is_some();
        if pending {
            i.pending_keys.fetch_sub(1, Ordering::Relaxed);
        }
        viewed || pending
    }

    /// The local views' figures: keys held, evictions, keys started from
    /// the summary of evicted views.
    pub fn view_stats(&self) -> slidegate_memory::Stats {
        self.inner.views.stats()
    }

    /// Adds `cost` in bucket `own` to `key`'s pending counts; with a cost
    /// of 0, only marks the key for the next sync (if there is room).
    fn record(&self, key: &str, own: u64, cost: u64) {
        let i = &self.inner;
        let mut outbox = self.outbox(key).lock();
        let pending = match outbox.get_mut(key) {
            Some(p) => p,
            None if cost == 0 && i.pending_keys.load(Ordering::Relaxed) >= i.options.max_pending_keys => return,
            None => {
                let held = i.pending_keys.fetch_add(1, Ordering::Relaxed) + 1;
                if held.is_multiple_of(i.options.batch) {
                    i.wake.notify_one();
                }
                outbox.entry(key.to_owned()).or_default()
            }
        };
        add(pending, own, cost, i.n);
    }

    /// Sends every count pending now to Redis, in batches of at most
    /// [`batch`](HybridOptions::batch) keys, each batch one `EVALSHA` per
    /// key issued together on the connection (pipelined) and bounded by
    /// [`sync_timeout`](HybridOptions::sync_timeout); each reply becomes its key's view. Counts made while
    /// the batches are on their way wait for the next sync. A key whose
    /// sync fails keeps its counts for the next sync.
    ///
    /// # Errors
    ///
    /// The first failure ([`RedisStoreError::Timeout`] for a batch without
    /// an answer within the timeout); the batches before it are applied,
    /// the ones after it not sent.
    pub async fn sync(&self) -> Result<SyncReport, RedisStoreError> {
        let _one = self.inner.syncing.lock().await;
        let mut pending = self.take_all();
        let mut report = SyncReport::default();
        while !pending.is_empty() {
            let batch = pending.split_off(pending.len().saturating_sub(self.inner.options.batch));
            report.keys += batch.len();
            report.batches += 1;
            if let Err(e) = self.send(batch).await {
                for (key, counts) in pending {
                    self.put_back(key, counts);
                }
                return Err(e);
            }
        }
        Ok(report)
    }

    /// Takes every key out of the outbox.
    fn take_all(&self) -> Vec<(String, Pending)> {
        let i = &self.inner;
        let mut all = Vec::new();
        for shard in &i.outbox {
            all.extend(shard.lock().drain());
        }
        i.pending_keys.fetch_sub(all.len(), Ordering::Relaxed);
        all
    }

    async fn send(&self, batch: Vec<(String, Pending)>) -> Result<(), RedisStoreError> {
        let i = &self.inner;
        if i.lease_ns > 0 {
            return self.send_leased(batch).await;
        }
        let now_arg = i.clock.script_now(i.clock.now_us());
        let sent_us = i.clock.sent_us();
        let calls = batch.iter().map(|(key, pending)| {
            let mut invocation = if i.fixed {
                let mut invocation = FIXED_SYNC.key(i.redis.redis_key(key, &i.quota));
                invocation.arg(now_arg).arg(i.b);
                invocation
            } else {
                let mut invocation = SYNC.key(i.redis.redis_key(key, &i.quota));
                invocation.arg(now_arg).arg(i.b).arg(i.n);
                invocation
            };
            for &(bucket, count) in pending {
                invocation.arg(bucket).arg(count);
            }
            let mut conn = i.redis.connection().clone();
            async move { invocation.invoke_async::<Vec<i64>>(&mut conn).await }
        });
        i.syncs.fetch_add(1, Ordering::Relaxed);
        i.commands.fetch_add(batch.len() as u64, Ordering::Relaxed);
        let timeout = i.options.sync_timeout;
        let replies = match tokio::time::timeout(timeout, futures_util::future::join_all(calls)).await {
            Ok(replies) => replies,
            Err(_) => {
                let keys = batch.len();
                for (key, pending) in batch {
                    self.put_back(key, pending);
                }
                self.failed(keys);
                return Err(RedisStoreError::Timeout(timeout));
            }
        };
        let mut first_error = None;
        let mut failed = 0;
        for ((key, pending), reply) in batch.into_iter().zip(replies) {
            let applied = reply
                .map_err(RedisStoreError::from)
                .and_then(|r| self.apply(&key, &r, sent_us, 0));
            if let Err(e) = applied {
                self.put_back(key, pending);
                failed += 1;
                first_error.get_or_insert(e);
            }
        }
        self.outcome(first_error, failed)
    }

    /// The bounded mode's [`HybridLimiter::send`]: the whole batch in one
    /// `EVALSHA` of [`LEASE_SYNC`] (on a Cluster, one per hash slot: a
    /// batch spanning slots is refused once with `CROSSSLOT`, and from then
    /// on split by slot), each key's reply applied as it comes.
    async fn send_leased(&self, batch: Vec<(String, Pending)>) -> Result<(), RedisStoreError> {
        let i = &self.inner;
        let now_us = i.clock.now_us();
        let now_arg = i.clock.script_now(now_us);
        let sent_us = i.clock.sent_us();
        let sent_health = i.clock.health_ns();
        let keyed: Vec<LeaseEntry> = batch
            .into_iter()
            .map(|(key, pending)| {
                let (carry, want) = self.lease_terms(&key, now_us, sent_health);
                let redis_key = format!("{}:lease", i.redis.redis_key(&key, &i.quota));
                (key, redis_key, pending, carry, want)
            })
            .collect();
        let mut first_error = None;
        let mut failed = 0;
        let mut todo = keyed;
        // A second round only for a batch a Cluster refused across slots.
        for _round in 0..2 {
            if todo.is_empty() {
                break;
            }
            let groups = self.lease_groups(std::mem::take(&mut todo));
            let calls = groups.iter().map(|group| {
                let mut invocation = LEASE.prepare_invoke();
                invocation
                    .arg(now_arg)
                    .arg(i.b)
                    .arg(i.n)
                    .arg(i.micro.limit())
                    .arg(i.instance)
                    .arg(i.lease_ns / 1000);
                for (_, redis_key, pending, carry, want) in group {
                    invocation.key(redis_key.as_str());
                    invocation.arg(*carry).arg(*want).arg(pending.len());
                    for &(bucket, count) in pending {
                        invocation.arg(bucket).arg(count);
                    }
                }
                let mut conn = i.redis.connection().clone();
                async move { invocation.invoke_async::<Vec<i64>>(&mut conn).await }
            });
            let keys: usize = groups.iter().map(Vec::len).sum();
            i.syncs.fetch_add(1, Ordering::Relaxed);
            i.commands.fetch_add(groups.len() as u64, Ordering::Relaxed);
            let timeout = i.options.sync_timeout;
            let Ok(replies) = tokio::time::timeout(timeout, futures_util::future::join_all(calls)).await else {
                for (key, _, pending, _, _) in groups.into_iter().flatten() {
                    self.put_back(key, pending);
                }
                self.failed(keys + failed);
                return Err(RedisStoreError::Timeout(timeout));
            };
            for (group, reply) in groups.into_iter().zip(replies) {
                let reply = match reply {
                    Ok(reply) => reply,
                    Err(e)
                        if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::CrossSlot)
                            && !i.per_slot.swap(true, Ordering::Relaxed) =>
                    {
                        todo.extend(group);
                        continue;
                    }
                    Err(e) => {
                        failed += group.len();
                        for (key, _, pending, _, _) in group {
                            self.put_back(key, pending);
                        }
                        first_error.get_or_insert(RedisStoreError::from(e));
                        continue;
                    }
                };
                let mut rest = &reply[..];
                for (key, _, pending, _, _) in group {
                    let applied = match rest.split_first() {
                        Some((&len, tail)) if len >= 0 && tail.len() >= len as usize => {
                            let (one, tail) = tail.split_at(len as usize);
                            rest = tail;
                            self.apply(&key, one, sent_us, sent_health)
                        }
                        _ => Err(RedisStoreError::Reply(reply.clone())),
                    };
                    if let Err(e) = applied {
                        self.put_back(key, pending);
                        failed += 1;
                        first_error.get_or_insert(e);
                    }
                }
            }
        }
        for (key, _, pending, _, _) in todo {
            self.put_back(key, pending);
        }
        self.outcome(first_error, failed)
    }

    /// A bounded batch as calls: all of it in one, or one per hash slot
    /// once the server has shown itself a Cluster.
    fn lease_groups(&self, batch: Vec<LeaseEntry>) -> Vec<Vec<LeaseEntry>> {
        if !self.inner.per_slot.load(Ordering::Relaxed) {
            return vec![batch];
        }
        let mut by_slot: HashMap<u16, Vec<LeaseEntry>> = HashMap::new();
        for entry in batch {
            by_slot
                .entry(crate::cluster_slot(entry.1.as_bytes()))
                .or_default()
                .push(entry);
        }
        by_slot.into_values().collect()
    }

    /// A batch's end: its first error, with `failed` keys counted as
    /// failed, or the syncs healthy again.
    fn outcome(&self, first_error: Option<RedisStoreError>, failed: usize) -> Result<(), RedisStoreError> {
        let i = &self.inner;
        match first_error {
            Some(e) => {
                self.failed(failed);
                Err(e)
            }
            None => {
                i.failing.store(false, Ordering::Relaxed);
                i.failing_since.store(0, Ordering::Relaxed);
                Ok(())
            }
        }
    }

    fn failed(&self, keys: usize) {
        let i = &self.inner;
        i.failures.fetch_add(keys as u64, Ordering::Relaxed);
        if !i.failing.swap(true, Ordering::Relaxed) {
            i.failing_since.store(i.clock.health_ns() + 1, Ordering::Relaxed);
        }
    }

    /// Puts counts that could not be sent back into the outbox.
    fn put_back(&self, key: String, pending: Pending) {
        let i = &self.inner;
        let mut outbox = self.outbox(&key).lock();
        let slot = outbox.entry(key).or_insert_with(|| {
            i.pending_keys.fetch_add(1, Ordering::Relaxed);
            Vec::new()
        });
        for (bucket, count) in pending {
            add(slot, bucket, count, i.n);
        }
    }

    /// The bounded mode's terms for a sync of `key` sent at `health`: the
    /// carry (the lease's units left, which may still be spent before the
    /// reply; none once the lease has expired, or given back when the key
    /// was not asked for since the last sync) and the units wanted (twice
    /// the demand since the last sync, at most the limit).
    fn lease_terms(&self, key: &str, now_us: u64, health: u64) -> (u64, u64) {
        let i = &self.inner;
        let limit = i.micro.limit();
        let terms = i.views.update(&i.micro, key, now_us, |view| {
            if view.asked == 0 || health >= view.lease_until {
                view.lease = 0;
            }
            let want = if view.asked == 0 {
                0
            } else {
                view.asked.saturating_mul(2).clamp(1, limit)
            };
            view.asked = 0;
            (view.lease, want)
        });
        // A view that cannot be kept holds no lease, and asks for none.
        terms.unwrap_or((0, 0))
    }

    /// Makes a sync's reply `{now, newest, bucket, count, …}` (the bounded
    /// mode: `{now, newest, grant, bucket, count, …}`) the view of `key`,
    /// with the counts admitted since the sync was sent on top; the bounded
    /// mode adds the grant to the lease, valid for the lease time from
    /// `sent_health`, and keeps a key holding a lease in the outbox (so
    /// that the next sync renews it or gives it back).
    fn apply(&self, key: &str, reply: &[i64], sent_us: i64, sent_health: u64) -> Result<(), RedisStoreError> {
        let i = &self.inner;
        let bad = || RedisStoreError::Reply(reply.to_vec());
        let (now, newest, grant, buckets) = match (i.lease_ns > 0, reply) {
            (true, &[now, newest, grant, ref buckets @ ..]) if grant >= 0 => (now, newest, grant as u64, buckets),
            (false, &[now, newest, ref buckets @ ..]) => (now, newest, 0, buckets),
            _ => return Err(bad()),
        };
        let (pairs, odd) = buckets.as_chunks::<2>();
        if now < 0 || newest < 0 || !odd.is_empty() || buckets.iter().any(|&x| x < 0) {
            return Err(bad());
        }
        i.clock.learn(now as u64, sent_us);
        let global = pairs.iter().map(|&[bucket, count]| (bucket as u64, count as u64));
        let (n, micro) = (i.n, &i.micro);
        // A store's decision over several limits of the key sees either
        // the view before this reply or after it, never one in between.
        let _stripe = i.stripes.as_ref().map(|s| s.of(key).lock());
        let local_now = i.clock.now_us();
        // A view that cannot be kept (the budget) only costs accuracy (and
        // in the bounded mode, the grant: never spent, it expires).
        let leased = i.views.update(micro, key, local_now, |view| {
            let since = self.outbox(key).lock().get(key).cloned().unwrap_or_default();
            let top = (newest as u64)
                .max(view_newest(micro, &view.ring))
                .max(since.iter().map(|&(b, _)| b).max().unwrap_or(0));
            let mut slots = vec![0u64; n as usize];
            for (bucket, count) in global.chain(since) {
                if bucket + n > top
                    && bucket <= top
                    && let Some(s) = slots.get_mut((bucket % n) as usize)
                {
                    *s = s.saturating_add(count);
                }
            }
            view.ring = if i.fixed {
                fixed_state(micro, top, slots.iter().sum())
            } else {
                ring_state(micro, top, slots)
            };
            view.syncs = view.syncs.saturating_add(1);
            if i.lease_ns > 0 {
                view.lease = view.lease.saturating_add(grant);
                view.granted = view.lease;
                view.lease_until = sent_health.saturating_add(i.lease_ns);
                if view.lease > 0 {
                    view.keep_until = view.keep_until.max(local_now.saturating_add(i.lease_ns / 1000));
                }
            }
            view.lease
        });
        if matches!(leased, Ok(l) if l > 0) {
            self.record(key, local_now / i.b, 0);
        }
        Ok(())
    }

    /// Forgets the counts of `key`: this instance's view and pending
    /// counts, and its Redis key (one `DEL` through the [`RedisStore`]).
    /// Other instances' views keep what they last heard until their next
    /// sync of the key. True if Redis held the key.
    ///
    /// A sync of this instance on its way when the reset comes finishes
    /// first (the reset waits for it, at most its
    /// [`sync_timeout`](HybridOptions::sync_timeout)): the counts it carries
    /// were made before the reset, and neither they nor its reply may
    /// reach Redis or the view after the key is forgotten.
    ///
    /// # Errors
    ///
    /// As the store's [`reset`](slidegate_store::Store::reset); the local
    /// counts are forgotten anyway.
    ///
    /// In the bounded mode the key's lease hash goes too (its counts and
    /// every instance's lease): the other instances spend what their leases
    /// still hold and register what they carry at their next sync, so until
    /// then a grant does not see their leases.
    pub async fn reset(&self, key: &str) -> Result<bool, StoreError> {
        let i = &self.inner;
        let _no_sync = i.syncing.lock().await;
        self.forget(key);
        if i.lease_ns > 0 {
            let mut conn = i.redis.connection().clone();
            let timeout = i.redis.timeout();
            let mut del = redis::cmd("DEL");
            del.arg(format!("{}:lease", i.redis.redis_key(key, &i.quota)));
            let del = del.query_async::<i64>(&mut conn);
            let deleted = tokio::time::timeout(timeout, del)
                .await
                .map_err(|_| StoreError::Timeout(timeout))?
                .map_err(StoreError::unavailable)?;
            return Ok(deleted > 0);
        }
        i.redis.reset(key, std::slice::from_ref(&i.quota)).await
    }

    /// Starts syncing every [`interval`](HybridOptions::interval) (and as
    /// soon as a batch fills) on the current Tokio runtime, until the
    /// returned task is dropped or every clone of the limiter is. Sync
    /// errors are counted ([`HybridLimiter::stats`]) and retried with the
    /// next sync.
    pub fn spawn_sync(&self) -> SyncTask {
        let weak: Weak<Inner<C>> = Arc::downgrade(&self.inner);
        let wake = Arc::clone(&self.inner.wake);
        let interval = self.inner.options.interval;
        let handle = tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    () = wake.notified() => {}
                }
                let Some(inner) = weak.upgrade() else { break };
                // Failures are counted in the stats; the counts wait for the next sync.
                let _ = HybridLimiter { inner }.sync().await;
            }
        });
        SyncTask(handle)
    }
}

/// A key's view: its ring, and how many times Redis has answered for the
/// key since the view was made (until twice, it decides on the instance's
/// share of the limit).
struct View {
    ring: State,
    syncs: u8,
    /// The bounded mode: units of the lease left to spend, and until when
    /// (health ns; after it nothing is spent).
    lease: u64,
    lease_until: u64,
    /// Units asked for since the last sync (admitted or not): the demand
    /// the next sync asks a lease for.
    asked: u64,
    /// The last lease granted (with its carry): "nearly spent" is a
    /// quarter of it left.
    granted: u64,
    /// The bounded mode: until when (the views' time) the view is kept
    /// though its ring is empty, so that a lease or a demand outlives it.
    keep_until: u64,
}

impl KeyState for View {
    const HEAP: bool = true;
    type Align = ();

    fn suits(policy: &Policy) -> bool {
        <State as KeyState>::suits(policy)
    }

    fn fresh(policy: &Policy) -> Self {
        View {
            ring: <State as KeyState>::fresh(policy),
            syncs: 0,
            lease: 0,
            lease_until: 0,
            asked: 0,
            granted: 0,
            keep_until: 0,
        }
    }

    fn fits(&self, policy: &Policy) -> bool {
        self.ring.fits(policy)
    }

    fn check(&mut self, policy: &Policy, now: u64, cost: u64) -> slidegate_core::Decision {
        KeyState::check(&mut self.ring, policy, now, cost)
    }

    fn admit(&mut self, policy: &Policy, now: u64, cost: u64) -> bool {
        KeyState::admit(&mut self.ring, policy, now, cost)
    }

    fn record(&mut self, policy: &Policy, now: u64, cost: u64) {
        KeyState::record(&mut self.ring, policy, now, cost);
    }

    fn expires(&self, policy: &Policy) -> u64 {
        self.ring.expires(policy).max(self.keep_until)
    }

    /// What the view holds (the global count it last heard and what this
    /// instance admitted since): an evicted view is folded into the views'
    /// summary, and a view made again for its key starts from the summary's
    /// estimate, so eviction never lets a key past what the view refused.
    fn held(&self) -> u64 {
        self.ring.held()
    }

    fn heap_bytes(&self) -> usize {
        self.ring.heap_bytes()
    }
}

/// `d` (at `now`, µs read as ns) with at most `most` remaining.
fn capped(micro: &Policy, d: Decision, now: u64, most: u64) -> Decision {
    if d.remaining() <= most {
        return d;
    }
    let retry = d.retry_after().map(|r| now.saturating_add(nanos(r)));
    rebuilt(micro, &d, now, d.allowed(), most, retry)
}

/// A refusal for want of lease at `now` (µs read as ns, as the views'
/// decisions): nothing remaining here, the view's estimate and reset, a
/// retry after the next sync.
fn refused_for_lease(micro: &Policy, peek: &Decision, now: u64, interval: Duration) -> Decision {
    // The views' instants are µs read as ns: a duration's µs.
    let retry = now.saturating_add((nanos(interval) / 1000).max(1));
    rebuilt(micro, peek, now, false, 0, Some(retry))
}

/// `d`'s reset and estimate at `now`, with this outcome, remaining and
/// retry instant.
fn rebuilt(micro: &Policy, d: &Decision, now: u64, allowed: bool, remaining: u64, retry: Option<u64>) -> Decision {
    let estimate = d.estimate();
    let whole = estimate.floor();
    Decision::at(
        micro,
        now,
        allowed,
        remaining,
        now.saturating_add(nanos(d.reset_after())),
        retry,
        (whole as u64, ((estimate - whole) * 1e6) as u64, 1_000_000),
    )
}

/// A duration's ns, saturating.
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The background sync of a [`HybridLimiter`]: stops when dropped.
#[derive(Debug)]
#[must_use = "the sync stops when this is dropped"]
pub struct SyncTask(pub(crate) tokio::task::JoinHandle<()>);

impl Drop for SyncTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}
/// Adds `count` in `bucket` to `pending`, dropping the buckets that left
/// the ring of the newest one (they count in no window any more).
fn add(pending: &mut Pending, bucket: u64, count: u64, n: u64) {
    if count == 0 {
        return;
    }
    match pending.iter_mut().find(|(b, _)| *b == bucket) {
        Some((_, c)) => *c = c.saturating_add(count),
        None => pending.push((bucket, count)),
    }
    if let Some(top) = pending.iter().map(|&(b, _)| b).max() {
        pending.retain(|&(b, _)| b + n > top);
    }
}

/// The newest bucket of a view's ring, or the window of its fixed
/// counter (0 for a fresh one, or a counter at 0, which decides as any
/// earlier window would).
fn view_newest(micro: &Policy, state: &State) -> u64 {
    match state {
        State::SlidingWindow(r) => r.newest(),
        State::SlidingWindowWide(r) => r.newest(),
        // Counting something, the counter expires at the end of its window.
        State::FixedWindow(f) => (f.expires_at(micro) / micro.step_ns()).saturating_sub(1),
        _ => 0,
    }
}

/// A view's fixed counter: `count` in window `window`.
fn fixed_state(micro: &Policy, window: u64, count: u64) -> State {
    let mut counter = FixedWindow::new();
    // Recorded at the window's start: the counter moves to the window and
    // holds the count.
    LimitState::record(&mut counter, micro, window.saturating_mul(micro.step_ns()), count);
    State::FixedWindow(counter)
}

/// A view's ring from its newest bucket and its slots (slot `i mod n` for
/// bucket `i`).
fn ring_state(micro: &Policy, newest: u64, slots: Vec<u64>) -> State {
    let ring = if micro.limit() <= u64::from(u32::MAX) {
        let narrow: Box<[u32]> = slots.iter().map(|&c| u32::try_from(c).unwrap_or(u32::MAX)).collect();
        SlidingWindow::from_parts(newest, narrow).map(State::SlidingWindow)
    } else {
        SlidingWindow::from_parts(newest, slots.into_boxed_slice()).map(State::SlidingWindowWide)
    };
    ring.unwrap_or_else(|| State::new(micro))
}

#[cfg(test)]
mod tests {
    use super::*;
    use slidegate_core::LimitState;

    #[test]
    fn pending_counts_merge_by_bucket_and_drop_what_left_the_ring() {
        let mut p = Pending::new();
        add(&mut p, 10, 1, 4);
        add(&mut p, 10, 2, 4);
        add(&mut p, 12, 5, 4);
        assert_eq!(p, vec![(10, 3), (12, 5)]);
        add(&mut p, 14, 1, 4);
        assert_eq!(p, vec![(12, 5), (14, 1)], "bucket 10 left the ring of 14");
    }

    #[test]
    fn a_rebuilt_ring_holds_its_slots() {
        let micro = Policy::new(
            100,
            Duration::from_nanos(30),
            Algorithm::SlidingWindow {
                buckets: 4,
                weighting: slidegate_core::Weighting::Conservative,
            },
        )
        .unwrap();
        let mut state = ring_state(&micro, 7, vec![0, 5, 0, 2]);
        // Buckets 7 (slot 3) and 5 (slot 1): 7 counted, 93 left.
        assert_eq!(view_newest(&micro, &state), 7);
        let d = LimitState::check(&mut state, &micro, 7 * 10, 0);
        assert_eq!(d.remaining(), 93);
    }
}
