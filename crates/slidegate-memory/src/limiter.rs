//! A keyed limiter: one policy, one clock, the most compact state.

use crate::key::Key;
use crate::state::{KeyState, Ring2, Ring8};
use crate::store::{Budget, MemoryError, StateMap, Stats};
use slidegate_core::{Algorithm, Clock, Decision, FixedWindow, Gcra, Policy, State};
use std::borrow::Borrow;
use std::hash::Hash;

/// The store of a [`KeyedLimiter`], with the smallest state that serves
/// its policy.
enum Table<K> {
    Ring2Small(StateMap<K, Ring2<u16>>),
    Ring2(StateMap<K, Ring2<u32>>),
    Ring8Small(StateMap<K, Ring8<u16>>),
    Ring8(StateMap<K, Ring8<u32>>),
    Fixed(StateMap<K, FixedWindow>),
    Gcra(StateMap<K, Gcra>),
    Any(StateMap<K, State>),
}

/// Calls `$call` on the store inside any variant.
macro_rules! each {
    ($table:expr, $store:ident => $call:expr) => {
        match $table {
            Table::Ring2Small($store) => $call,
            Table::Ring2($store) => $call,
            Table::Ring8Small($store) => $call,
            Table::Ring8($store) => $call,
            Table::Fixed($store) => $call,
            Table::Gcra($store) => $call,
            Table::Any($store) => $call,
        }
    };
}

/// Limits every key to one [`Policy`], reading time from a [`Clock`].
///
/// It keeps each key in the smallest state that serves the policy:
/// `sliding_window` with 2 buckets in 12 bytes (limits up to 65 535) or
/// 16, with 3 to 8 buckets in 28 or 44 bytes, `fixed_window` in 16 and
/// `gcra` in 8, all inline beside the key; other policies in the core's
/// [`State`], on the heap.
///
/// ```
/// use slidegate_core::{Algorithm, ManualClock, Policy, Weighting};
/// use slidegate_memory::{Budget, KeyedLimiter};
/// use std::time::Duration;
///
/// let algorithm = Algorithm::SlidingWindow { buckets: 2, weighting: Weighting::Interpolated };
/// let policy = Policy::new(2, Duration::from_secs(1), algorithm).unwrap();
/// let clock = ManualClock::new(0);
/// let limiter: KeyedLimiter<String, _> = KeyedLimiter::new(policy, clock.clone(), Budget::keys(1_000_000));
/// assert!(limiter.check("alice", 1).unwrap().allowed());
/// assert!(limiter.check("alice", 1).unwrap().allowed());
/// assert!(!limiter.check("alice", 1).unwrap().allowed());
/// assert!(limiter.check("bob", 1).unwrap().allowed());
/// ```
pub struct KeyedLimiter<K, C> {
    policy: Policy,
    clock: C,
    table: Table<K>,
}

impl<K: Key, C: std::fmt::Debug> std::fmt::Debug for KeyedLimiter<K, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let stats = each!(&self.table, s => s.stats());
        f.debug_struct("KeyedLimiter")
            .field("policy", &self.policy)
            .field("clock", &self.clock)
            .field("stats", &stats)
            .finish()
    }
}

impl<K: Key, C: Clock> KeyedLimiter<K, C> {
    /// A limiter of `policy` per key, within `budget`.
    pub fn new(policy: Policy, clock: C, budget: Budget) -> Self {
        let small = policy.limit() <= u64::from(u16::MAX);
        let wide = policy.limit() > u64::from(u32::MAX);
        let table = match policy.algorithm() {
            Algorithm::SlidingWindow { buckets: 2, .. } if small => Table::Ring2Small(StateMap::new(budget)),
            Algorithm::SlidingWindow { buckets: 2, .. } if !wide => Table::Ring2(StateMap::new(budget)),
            Algorithm::SlidingWindow { buckets: 3..=8, .. } if small => Table::Ring8Small(StateMap::new(budget)),
            Algorithm::SlidingWindow { buckets: 3..=8, .. } if !wide => Table::Ring8(StateMap::new(budget)),
            Algorithm::FixedWindow => Table::Fixed(StateMap::new(budget)),
            Algorithm::Gcra { .. } => Table::Gcra(StateMap::new(budget)),
            _ => Table::Any(StateMap::new(budget)),
        };
        KeyedLimiter { policy, clock, table }
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Decides `cost` units for `key` now.
    ///
    /// # Errors
    ///
    /// [`MemoryError::KeyTooLarge`] for a key larger than a shard's share of
    /// the byte budget.
    pub fn check<Q>(&self, key: &Q, cost: u64) -> Result<Decision, MemoryError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let policy = &self.policy;
        each!(&self.table, s => s.update_clocked(policy, key, || self.clock.now(), |state, now| state.check(policy, now, cost)))
    }

    /// [`KeyedLimiter::check`] without the headers.
    ///
    /// # Errors
    ///
    /// As [`KeyedLimiter::check`].
    pub fn admit<Q>(&self, key: &Q, cost: u64) -> Result<bool, MemoryError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let policy = &self.policy;
        each!(&self.table, s => s.update_clocked(policy, key, || self.clock.now(), |state, now| state.admit(policy, now, cost)))
    }

    /// Decides many requests at one reading of the clock, overlapping their
    /// memory misses; see the crate's [batches](crate#batches).
    pub fn check_many<Q>(&self, requests: &[(&Q, u64)], out: &mut Vec<Result<Decision, MemoryError>>)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let now = self.clock.now();
        each!(&self.table, s => s.check_many(&self.policy, now, requests, out))
    }

    /// [`KeyedLimiter::check_many`] answering only admitted or not.
    pub fn admit_many<Q>(&self, requests: &[(&Q, u64)], out: &mut Vec<Result<bool, MemoryError>>)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let now = self.clock.now();
        each!(&self.table, s => s.admit_many(&self.policy, now, requests, out))
    }

    /// Forgets `key`: its next request starts from a fresh state (or, if
    /// the key was evicted while live before, from what the summary of
    /// evicted keys still holds for it). Returns whether the key was held.
    pub fn reset<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        each!(&self.table, s => s.reset(key))
    }

    /// Keys held, evictions and bytes in use.
    pub fn stats(&self) -> Stats {
        each!(&self.table, s => s.stats())
    }
}
