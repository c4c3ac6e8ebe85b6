//! The hybrid mode behind the one store interface: [`HybridStore`].

use crate::hybrid::{NotLocal, Stripes};
use crate::{HybridLimiter, HybridOptions, RedisClock, RedisStore, RedisStoreError, SyncTask};
use parking_lot::RwLock;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use slidegate_core::{Algorithm, Decision};
use slidegate_store::{Decisions, Quota, Store, StoreError, StoreStats, decide_all};
use smallvec::SmallVec;
use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::sync::Notify;

/// The most distinct limits (policies) one [`HybridStore`] keeps.
pub const MAX_HYBRID_LIMITS: usize = 4096;

/// The limiters of a store, by the tag of their quota.
type Limiters<C> = RwLock<HashMap<Arc<str>, HybridLimiter<C>>>;

/// The limiters of one call's quotas, each with its time now in µs.
type Held<C> = SmallVec<[(HybridLimiter<C>, u64); 4]>;

/// The hybrid mode as a [`slidegate_store::Store`]: every limit decided in
/// the process, on each key's count as Redis last answered it plus this
/// instance's counts since, the counts sent to Redis in batches (see
/// [`HybridLimiter`] for the sync, its accuracy and its bound).
///
/// The store keeps one [`HybridLimiter`] per distinct limit (by
/// [`Quota::tag`]), made on the limit's first use, at most
/// [`MAX_HYBRID_LIMITS`]; they share the connection, the prefix, the
/// timeout, the clock and the [`HybridOptions`] (which bound each limit's
/// pending keys and views on their own). A key's state under a limit is
/// the Redis key `<prefix><tag>:{<key>}`, the key a [`RedisStore`] with
/// the same prefix keeps for the limit, so that direct and hybrid
/// instances of one limit share its counts.
///
/// A decision does no IO: [`Store::decide_now`] answers it, and
/// [`Store::decide`]'s future is ready at once.
///
/// # Algorithms
///
/// `sliding_window` and `fixed_window`, whose states merge by adding: a
/// ring's buckets, or a window's count, are sums of what each instance
/// admitted, so a sync adds one instance's counts and answers the total.
/// [`Store::supports`] refuses the others, for a consumer to route them
/// to the direct store:
///
/// - `gcra` keeps one theoretical arrival time, moved to `max(tat, now) +
///   cost·T` by each admission. The `max` forgets idle time, so the TAT
///   after two instances' requests depends on how their arrivals
///   interleave: two instances' TATs (or their sums of increments) do not
///   give it, only every request's arrival time would, which is a round
///   trip per request (the direct mode).
/// - `sliding_log` logs could be merged (a union), but a sync would carry
///   every entry (up to the limit per key per interval, not `n` counts),
///   and the algorithm's point is to be exact, which local decisions
///   between syncs give up.
///
/// # Failure
///
/// While the syncs fail, decisions go on locally on the last global
/// counts; once they have failed for [`stale_after`](HybridOptions::stale_after)
/// every decision is [`StoreError::Unavailable`] (its source
/// [`StaleSyncs`](crate::StaleSyncs)), so that a
/// [`slidegate_store::FailOver`] around the store applies its failure policy, until a sync succeeds again (the background
/// sync goes on trying). A [`Store::charge`] is counted locally even then
/// and reaches Redis once it is back. A key new to a limit whose outbox
/// holds [`max_pending_keys`](HybridOptions::max_pending_keys) keys is
/// [`StoreError::KeyRefused`].
///
/// No count is lost while the process lives: counts leave the outbox only
/// into a sync, a failed sync puts them back, and [`Store::flush`] (at
/// shutdown) sends what waits. A process that dies without it (SIGKILL, a
/// crash) loses the counts it admitted since its last successful sync —
/// about one [`interval`](HybridOptions::interval)'s admissions while
/// Redis answers; while the syncs fail, up to an interval's and
/// [`stale_after`](HybridOptions::stale_after)'s — and the instances may
/// admit them again in the window: an instance killed after admitting a
/// key's limit of 50 before its next sync, then another, admitted 100 in
/// one window of 50.
///
/// # Concurrency
///
/// A decision takes the lock of its key's stripe (one of 1024, by a hash
/// of the key) around the peek-then-charge of [`decide_all`] over its
/// limits' views, and each sync reply takes the same lock around the view
/// it replaces, so a decision over several limits is all or nothing and no
/// reply lands between its peeks and its charges. Under the stripe, each
/// view takes its shard's lock and then its outbox shard's, as
/// [`HybridLimiter`] does. The map of limiters is read-locked per decision
/// and write-locked only to add a limit.
pub struct HybridStore<C = MultiplexedConnection> {
    /// The direct store the limiters sync and reset through.
    redis: RedisStore<C>,
    options: HybridOptions,
    limiters: Arc<Limiters<C>>,
    stripes: Arc<Stripes>,
    wake: Arc<Notify>,
}

impl<C> fmt::Debug for HybridStore<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HybridStore")
            .field("redis", &self.redis)
            .field("options", &self.options)
            .field("limits", &self.limiters.read().len())
            .finish_non_exhaustive()
    }
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> HybridStore<C> {
    /// A hybrid store over `conn`, its Redis keys starting with `prefix`
    /// (then each limit's tag), each reset bounded by `timeout` (each sync
    /// by the options' `sync_timeout`), on the server's clock.
    ///
    /// # Errors
    ///
    /// [`RedisStoreError::Prefix`] for a prefix with `{` or `}`;
    /// [`RedisStoreError::Options`] for options that cannot work (a zero
    /// interval, batch or pending-key bound).
    pub fn new(
        conn: C,
        prefix: impl Into<String>,
        timeout: Duration,
        options: HybridOptions,
    ) -> Result<Self, RedisStoreError> {
        HybridStore::over(RedisStore::new(conn, prefix, timeout)?, options)
    }

    /// A hybrid store syncing and resetting through `redis` (its
    /// connection, prefix, timeout and clock).
    ///
    /// # Errors
    ///
    /// [`RedisStoreError::Options`] as [`HybridStore::new`].
    pub(crate) fn over(redis: RedisStore<C>, options: HybridOptions) -> Result<Self, RedisStoreError> {
        options.check()?;
        Ok(HybridStore {
            redis,
            options,
            limiters: Arc::default(),
            stripes: Arc::new(Stripes::new()),
            wake: Arc::new(Notify::new()),
        })
    }

    /// The same store on `clock`: a builder, called before the first
    /// decision and before [`HybridStore::spawn_sync`] (the limits already
    /// made are dropped, with their counts, and a sync already spawned
    /// stops).
    #[must_use]
    pub fn with_clock(mut self, clock: RedisClock) -> Self {
        self.redis = self.redis.with_clock(clock);
        self.limiters = Arc::default();
        self
    }

    /// The options every limit's limiter runs on.
    pub fn options(&self) -> &HybridOptions {
        &self.options
    }

    /// The Redis key holding `key`'s state under `quota`:
    /// `<prefix><tag>:{<key>}`.
    pub fn redis_key(&self, key: &str, quota: &Quota) -> String {
        self.redis.redis_key(key, quota)
    }

    /// Starts syncing every limit, those made later included, every
    /// [`interval`](HybridOptions::interval) (and as soon as one limit's
    /// batch fills) on the current Tokio runtime, until the returned task
    /// is dropped or the store is. Sync errors are counted
    /// ([`StoreStats::errors`]) and the counts retried with the next sync.
    pub fn spawn_sync(&self) -> SyncTask {
        let weak: Weak<Limiters<C>> = Arc::downgrade(&self.limiters);
        let wake = Arc::clone(&self.wake);
        let interval = self.options.interval;
        let handle = tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    () = wake.notified() => {}
                }
                let Some(limiters) = weak.upgrade() else { break };
                let all = snapshot(&limiters);
                drop(limiters);
                // Failures are counted in the stats; the counts wait for the next sync.
                let _ = sync_all(&all).await;
            }
        });
        SyncTask(handle)
    }

    /// The limiter of `quota`, made on its first use.
    fn limiter(&self, quota: &Quota) -> Result<HybridLimiter<C>, StoreError> {
        // A quota's identity may outlive its policy (a limit changed by a
        // reload): a limiter serves only the policy it was made for.
        if let Some(limiter) = self.limiters.read().get(quota.tag())
            && limiter.policy() == quota.policy()
        {
            return Ok(limiter.clone());
        }
        self.supports(quota)?;
        let mut limiters = self.limiters.write();
        if let Some(limiter) = limiters.get(quota.tag())
            && limiter.policy() == quota.policy()
        {
            return Ok(limiter.clone());
        }
        if limiters.len() >= MAX_HYBRID_LIMITS && !limiters.contains_key(quota.tag()) {
            return Err(StoreError::Unsupported {
                policy: quota.policy().to_string(),
                reason: format!("this hybrid store already keeps {MAX_HYBRID_LIMITS} distinct limits, its most"),
            });
        }
        let unsupported = |e: RedisStoreError| StoreError::Unsupported {
            policy: quota.policy().to_string(),
            reason: e.to_string(),
        };
        let shared = (Arc::clone(&self.stripes), Arc::clone(&self.wake));
        let limiter =
            HybridLimiter::build(self.redis.clone(), quota.clone(), self.options, Some(shared)).map_err(unsupported)?;
        limiters.insert(quota.tag().into(), limiter.clone());
        Ok(limiter)
    }

    /// Each quota's limiter and its time now.
    fn limiters_of(&self, quotas: &[Quota]) -> Result<Held<C>, StoreError> {
        if quotas.is_empty() {
            return Err(StoreError::NoQuota);
        }
        quotas
            .iter()
            .map(|q| {
                let limiter = self.limiter(q)?;
                let now_us = limiter.now_us();
                Ok((limiter, now_us))
            })
            .collect()
    }

    /// [`Store::decide`], made now.
    fn decide_local(&self, key: &str, quotas: &[Quota], cost: u64, out: &mut Decisions) -> Result<(), StoreError> {
        out.clear();
        let limiters = self.limiters_of(quotas)?;
        let Some(first) = quotas.first() else {
            return Err(StoreError::NoQuota);
        };
        // An outage or a full outbox refuses the call before anything is charged.
        for (limiter, now_us) in &limiters {
            limiter.ready(key, *now_us, cost).map_err(StoreError::from)?;
        }
        let mut failed = None;
        {
            let _stripe = self.stripes.of(key).lock();
            decide_all(limiters.len(), cost, out, |j, cost| {
                // `j` is below the number of quotas, one limiter each.
                let decided = limiters
                    .get(j)
                    .map(|(limiter, now_us)| limiter.decide_at(key, *now_us, cost));
                match decided {
                    Some(Ok(d)) => d,
                    Some(Err(e)) => {
                        failed.get_or_insert(e);
                        // Refused, so that nothing is charged after it.
                        let policy = quotas.get(j).unwrap_or(first).policy();
                        Decision::at(policy, 0, false, 0, 0, None, (0, 0, 1))
                    }
                    None => Decision::at(first.policy(), 0, false, 0, 0, None, (0, 0, 1)),
                }
            });
        }
        match failed {
            Some(e) => {
                out.clear();
                Err(e.into())
            }
            None => Ok(()),
        }
    }

    /// [`Store::charge`], made now.
    fn charge_local(&self, key: &str, quotas: &[Quota], cost: u64) -> Result<(), StoreError> {
        let limiters = self.limiters_of(quotas)?;
        // A full outbox refuses the charge before anything is counted; a
        // stale one counts it (it waits for Redis to come back).
        for (limiter, now_us) in &limiters {
            match limiter.ready(key, *now_us, cost) {
                Ok(()) | Err(NotLocal::Stale(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let _stripe = self.stripes.of(key).lock();
        let mut first = Ok(());
        for (limiter, now_us) in &limiters {
            if let Err(e) = limiter.charge_at(key, *now_us, cost)
                && first.is_ok()
            {
                first = Err(e.into());
            }
        }
        first
    }

    async fn reset_all(&self, key: &str, quotas: &[Quota]) -> Result<bool, StoreError> {
        let limiters = self.limiters_of(quotas)?;
        let mut held = false;
        {
            let _stripe = self.stripes.of(key).lock();
            for (limiter, _) in &limiters {
                held |= limiter.forget(key);
            }
        }
        let mut first = Ok(());
        for (limiter, _) in &limiters {
            match limiter.reset(key).await {
                Ok(in_redis) => held |= in_redis,
                Err(e) if first.is_ok() => first = Err(e),
                Err(_) => {}
            }
        }
        first.map(|()| held)
    }
}

/// Every limiter held now.
fn snapshot<C: Clone>(limiters: &Limiters<C>) -> Vec<HybridLimiter<C>> {
    limiters.read().values().cloned().collect()
}

/// One sync of every limiter in `all`, all tried; the first error.
async fn sync_all<C: ConnectionLike + Clone + Send + Sync + 'static>(
    all: &[HybridLimiter<C>],
) -> Result<(), StoreError> {
    let mut first = Ok(());
    for limiter in all {
        if let Err(e) = limiter.sync().await
            && first.is_ok()
        {
            first = Err(redis_error(e));
        }
    }
    first
}

/// The store's error for a failed call to Redis.
fn redis_error(e: RedisStoreError) -> StoreError {
    match e {
        RedisStoreError::Timeout(after) => StoreError::Timeout(after),
        e => StoreError::unavailable(e),
    }
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> Store for HybridStore<C> {
    fn decide<'a>(
        &'a self,
        key: &'a str,
        quotas: &'a [Quota],
        cost: u64,
        out: &'a mut Decisions,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a {
        std::future::ready(self.decide_local(key, quotas, cost, out))
    }

    fn charge<'a>(
        &'a self,
        key: &'a str,
        quotas: &'a [Quota],
        cost: u64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a {
        std::future::ready(self.charge_local(key, quotas, cost))
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
        for limiter in snapshot(&self.limiters) {
            let h = limiter.stats();
            let v = limiter.view_stats();
            let mut one = StoreStats::memory(v.keys, v.capacity, v.evictions, v.reclaimed, v.bytes).with_summary(
                v.seeded,
                v.summarised,
                v.summary_cells as u64,
                v.summary_live as u64,
                v.false_seed_ppm,
            );
            one.errors = h.failures;
            one.sync_commands = h.commands;
            one.pending_keys = h.pending_keys as u64;
            one.lease_refusals = h.lease_refusals;
            stats = stats + one;
        }
        stats
    }

    fn decide_now(
        &self,
        key: &str,
        quotas: &[Quota],
        cost: u64,
        out: &mut Decisions,
    ) -> Option<Result<(), StoreError>> {
        Some(self.decide_local(key, quotas, cost, out))
    }

    fn supports(&self, quota: &Quota) -> Result<(), StoreError> {
        let policy = quota.policy();
        let refuse = |reason: &str| StoreError::Unsupported {
            policy: policy.to_string(),
            reason: reason.to_owned(),
        };
        match policy.algorithm() {
            Algorithm::SlidingWindow { .. } | Algorithm::FixedWindow => {}
            Algorithm::Gcra { .. } => {
                return Err(refuse(
                    "the hybrid mode cannot merge two instances' gcra arrival times; use the direct store",
                ));
            }
            Algorithm::SlidingLog => {
                return Err(refuse(
                    "sliding_log is exact, which local decisions are not; use the direct store",
                ));
            }
            _ => return Err(refuse("the hybrid mode keeps sliding_window and fixed_window only")),
        }
        crate::microsecond_policy(policy)
            .map(|_| ())
            .map_err(|e| refuse(&e.to_string()))
    }

    fn flush(&self) -> impl Future<Output = Result<(), StoreError>> + Send + '_ {
        let all = snapshot(&self.limiters);
        async move { sync_all(&all).await }
    }
}
