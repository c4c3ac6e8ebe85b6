//! The in-memory implementation of the store interface.

use crate::state::{KeyState, Ring8, Timed};
use crate::store::{Budget, Group, MemoryError, StateMap, Stats};
use slidegate_core::{Clock, Decision, MonotonicClock, Policy, State};
use slidegate_store::{Decisions, Quota, StoreError as Error, StoreStats, decide_all};
use std::future::{Future, Ready, ready};

/// The in-memory [`slidegate_store::Store`]: any key, any quotas, in a
/// bounded memory budget, on one clock.
///
/// Each (key, quota) pair is held under a 64-bit digest of the key (the
/// store's randomly seeded hash) and the quota's [`Quota::id`]: two pairs
/// share a digest with a probability of about `pairs² / 2⁶⁵` (one in 17
/// million with a million held), and a client cannot aim for a collision
/// without the seed. Sliding windows of 2 to 8 buckets whose limits fit
/// 32 bits (the default algorithm) sit inline in their slot; every other
/// policy in the core's `State`. Each kind has its own budget.
///
/// # Concurrency
///
/// All of one key's quotas live in the shard that the key picks, so a
/// decision over several quotas takes that shard's lock once (twice when
/// its quotas are of both kinds, always in the same order) and is all or
/// nothing, atomically. Decisions are made when `decide` is called: the
/// future is [`Ready`], with no allocation, boxing or await point.
pub struct MemoryStore<C = MonotonicClock> {
    ring: StateMap<u64, Timed<Ring8<u32>>>,
    other: StateMap<u64, Timed<State>>,
    clock: C,
}

impl<C> std::fmt::Debug for MemoryStore<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("ring", &self.ring.stats())
            .field("other", &self.other.stats())
            .finish_non_exhaustive()
    }
}

impl MemoryStore<MonotonicClock> {
    /// A store of `budget` for the default algorithm's windows and as much
    /// again for every other policy, on the monotonic clock.
    pub fn new(budget: Budget) -> Self {
        MemoryStore::with_clock(budget, budget, MonotonicClock::new())
    }
}

impl<C: Clock> MemoryStore<C> {
    /// A store counting sliding windows of up to 8 buckets within `budget`
    /// and every other policy within `other_budget`, on `clock`.
    pub fn with_clock(budget: Budget, other_budget: Budget, clock: C) -> Self {
        MemoryStore {
            ring: StateMap::new(budget),
            other: StateMap::new(other_budget),
            clock,
        }
    }

    /// The clock.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// Both budgets' figures, added.
    pub fn memory_stats(&self) -> Stats {
        let (a, b) = (self.ring.stats(), self.other.stats());
        Stats {
            keys: a.keys + b.keys,
            capacity: a.capacity + b.capacity,
            evictions: a.evictions + b.evictions,
            reclaimed: a.reclaimed + b.reclaimed,
            bytes: a.bytes + b.bytes,
            seeded: a.seeded + b.seeded,
            summarised: a.summarised + b.summarised,
            summary_cells: a.summary_cells + b.summary_cells,
            summary_live: a.summary_live + b.summary_live,
            false_seed_ppm: a.false_seed_ppm.max(b.false_seed_ppm),
        }
    }

    /// Runs `f` with the key's groups locked (the inline store's first),
    /// and the digest of each quota's slot.
    fn locked<T>(&self, key: &str, quotas: &[Quota], f: impl FnOnce(&mut Locked<'_>) -> T) -> T {
        let group = self.ring.hash(key.as_bytes());
        let inline = |q: &Quota| Timed::<Ring8<u32>>::suits(q.policy());
        let mut locked = Locked {
            ring: quotas.iter().any(inline).then(|| self.ring.group(group)),
            other: quotas.iter().any(|q| !inline(q)).then(|| self.other.group(group)),
            group,
            error: None,
        };
        f(&mut locked)
    }

    fn decide_sync(&self, key: &str, quotas: &[Quota], cost: u64, out: &mut Decisions) -> Result<(), Error> {
        if quotas.is_empty() {
            return Err(Error::NoQuota);
        }
        let now = self.clock.now();
        self.locked(key, quotas, |locked| {
            decide_all(quotas.len(), cost, out, |j, cost| {
                let q = &quotas[j];
                locked.update(q, now, |s| s.check(q.policy(), now, cost), cost)
            });
            locked.error.take().map_or(Ok(()), Err)
        })
    }
}

/// A key's locked groups during one call.
struct Locked<'a> {
    ring: Option<Group<'a, u64, Timed<Ring8<u32>>>>,
    other: Option<Group<'a, u64, Timed<State>>>,
    group: u64,
    /// The first error, if any slot could not be decided.
    error: Option<Error>,
}

impl Locked<'_> {
    /// The digest of the key's slot for `quota`.
    fn slot(&self, quota: &Quota) -> u64 {
        // A multiply-xorshift mix of the key's seeded hash and the quota's
        // id: the pair's digest.
        let x = (self.group ^ quota.id().rotate_left(32)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        x ^ (x >> 29) ^ quota.id()
    }

    fn update<T>(&mut self, quota: &Quota, now: u64, f: impl FnOnce(&mut dyn KeyStateMut) -> T, cost: u64) -> T
    where
        T: Refusal,
    {
        let slot = self.slot(quota);
        let policy = quota.policy();
        let result = if Timed::<Ring8<u32>>::suits(policy) {
            self.ring.as_mut().map(|g| g.update(policy, &slot, now, |s| f(s)))
        } else {
            self.other.as_mut().map(|g| g.update(policy, &slot, now, |s| f(s)))
        };
        match result {
            Some(Ok(out)) => out,
            Some(Err(e)) => {
                self.error.get_or_insert(memory_error(&e));
                T::refusal(policy, now, cost)
            }
            None => T::refusal(policy, now, cost),
        }
    }
}

/// What a slot's closure returns when the slot could not be reached.
trait Refusal {
    fn refusal(policy: &Policy, now: u64, cost: u64) -> Self;
}

impl Refusal for Decision {
    fn refusal(policy: &Policy, now: u64, _cost: u64) -> Self {
        Decision::at(policy, now, false, 0, now, None, (0, 0, 1))
    }
}

impl Refusal for () {
    fn refusal(_policy: &Policy, _now: u64, _cost: u64) -> Self {}
}

impl Refusal for bool {
    fn refusal(_policy: &Policy, _now: u64, _cost: u64) -> Self {
        false
    }
}

/// The [`KeyState`] operations a slot's closure uses, object-safe so that
/// one closure serves both kinds of state.
trait KeyStateMut {
    fn check(&mut self, policy: &Policy, now: u64, cost: u64) -> Decision;
    fn record(&mut self, policy: &Policy, now: u64, cost: u64);
}

impl<St: KeyState> KeyStateMut for St {
    fn check(&mut self, policy: &Policy, now: u64, cost: u64) -> Decision {
        KeyState::check(self, policy, now, cost)
    }

    fn record(&mut self, policy: &Policy, now: u64, cost: u64) {
        KeyState::record(self, policy, now, cost);
    }
}

fn memory_error(e: &MemoryError) -> Error {
    match e {
        MemoryError::Unsuited { .. } => Error::Unsupported {
            policy: String::new(),
            reason: e.to_string(),
        },
        _ => Error::KeyRefused(e.to_string()),
    }
}

impl<C: Clock + Send + Sync> slidegate_store::Store for MemoryStore<C> {
    fn decide<'a>(
        &'a self,
        key: &'a str,
        quotas: &'a [Quota],
        cost: u64,
        out: &'a mut Decisions,
    ) -> impl Future<Output = Result<(), Error>> + Send + 'a {
        let done: Ready<_> = ready(self.decide_sync(key, quotas, cost, out));
        done
    }

    fn charge<'a>(
        &'a self,
        key: &'a str,
        quotas: &'a [Quota],
        cost: u64,
    ) -> impl Future<Output = Result<(), Error>> + Send + 'a {
        let now = self.clock.now();
        ready(self.locked(key, quotas, |locked| {
            for q in quotas {
                locked.update(q, now, |s| s.record(q.policy(), now, cost), cost);
            }
            locked.error.take().map_or(Ok(()), Err)
        }))
    }

    fn reset<'a>(&'a self, key: &'a str, quotas: &'a [Quota]) -> impl Future<Output = Result<bool, Error>> + Send + 'a {
        ready(Ok(self.locked(key, quotas, |locked| {
            let mut held = false;
            for q in quotas {
                let slot = locked.slot(q);
                let done = if Timed::<Ring8<u32>>::suits(q.policy()) {
                    locked.ring.as_mut().map(|g| g.reset(&slot))
                } else {
                    locked.other.as_mut().map(|g| g.reset(&slot))
                };
                held |= done.unwrap_or(false);
            }
            held
        })))
    }

    fn stats(&self) -> StoreStats {
        let s = self.memory_stats();
        StoreStats::memory(s.keys, s.capacity, s.evictions, s.reclaimed, s.bytes).with_summary(
            s.seeded,
            s.summarised,
            s.summary_cells as u64,
            s.summary_live as u64,
            s.false_seed_ppm,
        )
    }

    fn decide_now(&self, key: &str, quotas: &[Quota], cost: u64, out: &mut Decisions) -> Option<Result<(), Error>> {
        Some(self.decide_sync(key, quotas, cost, out))
    }
}
