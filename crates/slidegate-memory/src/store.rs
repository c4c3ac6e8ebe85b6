//! The sharded store.

use crate::key::Key;
use crate::state::KeyState;
use crate::table::{Entry, MAX_SLOTS, Probe, Table, tag};
use parking_lot::Mutex;
use slidegate_core::{Decision, Policy};
use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};

/// How much a [`Store`] may hold, fixed when it is built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    keys: usize,
    bytes: usize,
}

impl Budget {
    /// At most `keys` keys (heap-holding keys such as `String` are then
    /// bounded in number only).
    pub fn keys(keys: usize) -> Self {
        Budget {
            keys,
            bytes: usize::MAX,
        }
    }

    /// At most `bytes` bytes: the table and, for keys and states that hold
    /// heap memory, what they hold (half of the budget is then set aside
    /// for it).
    pub fn bytes(bytes: usize) -> Self {
        Budget {
            keys: usize::MAX,
            bytes,
        }
    }

    /// Both bounds.
    pub fn keys_and_bytes(keys: usize, bytes: usize) -> Self {
        Budget { keys, bytes }
    }
}

/// Why a store could not decide.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The key (with its fresh state) holds more heap memory than one shard
    /// of the budget allows.
    #[error("key of {bytes} bytes exceeds the store's per-shard allowance of {max} bytes")]
    KeyTooLarge {
        /// The key's heap bytes.
        bytes: usize,
        /// The allowance.
        max: usize,
    },
    /// The store's state type cannot serve this policy.
    #[error("this store's states cannot serve a {algorithm} policy with limit {limit}")]
    Unsuited {
        /// The policy's algorithm name.
        algorithm: &'static str,
        /// Its limit.
        limit: u64,
    },
}

/// What a store holds, summed over its shards.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Keys held.
    pub keys: usize,
    /// Most keys the store holds at once.
    pub capacity: usize,
    /// Live keys evicted to make room, since the store was built.
    pub evictions: u64,
    /// Idle keys dropped, since the store was built.
    pub reclaimed: u64,
    /// Bytes in use: the table (allocated whole when the store is built)
    /// plus what keys and states hold on the heap.
    pub bytes: usize,
}

/// Fewest shards when the budget allows: enough that two threads seldom
/// meet on one lock.
const MIN_SHARDS: usize = 16;
/// Fewest slots in a shard.
const MIN_SLOTS: usize = 8;

/// One shard on its own cache line: its lock, and where its slots are.
#[repr(align(64))]
struct Shard<K, St> {
    table: Mutex<Table<K, St>>,
    /// The address of the first slot and the slot count, which never
    /// change: the table is allocated once.
    base: usize,
    mask: usize,
}

/// A concurrent map from keys to limit states, in a memory budget fixed at
/// construction. See the [crate documentation](crate) for its rules.
pub struct Store<K, St> {
    shards: Box<[Shard<K, St>]>,
    hasher: foldhash::fast::RandomState,
    slot_bytes: usize,
}

impl<K: Key, St: KeyState> std::fmt::Debug for Store<K, St> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("shards", &self.shards.len())
            .field("stats", &self.stats())
            .finish()
    }
}

/// `⌊x·n / 2⁶⁴⌋`: a shard index from the hash's high bits.
fn reduce(hash: u64, n: usize) -> usize {
    ((u128::from(hash) * n as u128) >> 64) as usize
}

impl<K: Key, St: KeyState> Store<K, St> {
    /// A store within `budget`. Its whole table is allocated now; keys and
    /// states that hold heap memory add to it, up to the budget.
    pub fn new(budget: Budget) -> Self {
        let slot_bytes = size_of::<Option<Entry<K, St>>>();
        let heap_share = if K::HEAP || St::HEAP { budget.bytes / 2 } else { 0 };
        // The shards' locks and bookkeeping come out of the budget too.
        let most_shards = budget.bytes / (MAX_SLOTS * slot_bytes) + MIN_SHARDS + 1;
        let overhead = most_shards * size_of::<Shard<K, St>>() + size_of::<Self>();
        let table_bytes = budget.bytes.saturating_sub(heap_share).saturating_sub(overhead);
        let keys = budget.keys.min(table_bytes / slot_bytes / 8 * 7).max(1);
        // Slots for `keys` keys at 7/8 load, cut into power-of-two shards,
        // rounded down so the table never exceeds the budget.
        let total = keys.saturating_add(keys / 7).max(MIN_SLOTS);
        let per_shard = (total / MIN_SHARDS).clamp(MIN_SLOTS, MAX_SLOTS);
        let per_shard = 1usize << per_shard.ilog2();
        let shards = (total / per_shard).max(1);
        let max_len = (keys / shards).max(1);
        let max_heap = if heap_share == 0 {
            usize::MAX
        } else {
            heap_share / shards
        };
        let shards = (0..shards)
            .map(|_| {
                let table = Table::new(per_shard, max_len, max_heap);
                Shard {
                    base: table.base(),
                    mask: table.slot_count() - 1,
                    table: Mutex::new(table),
                }
            })
            .collect();
        Store {
            shards,
            hasher: foldhash::fast::RandomState::default(),
            slot_bytes,
        }
    }

    fn locate<Q: Hash + ?Sized>(&self, key: &Q) -> (u64, &Shard<K, St>) {
        let hash = self.hasher.hash_one(key);
        (hash, &self.shards[reduce(hash, self.shards.len())])
    }

    /// Runs `f` on the state of `key` (a fresh one if the key is new or its
    /// state does not fit `policy`), keeping a new key only if it now
    /// counts something.
    fn with_state<Q, T>(
        &self,
        policy: &Policy,
        key: &Q,
        now: u64,
        f: impl FnOnce(&mut St) -> T,
    ) -> Result<T, StoreError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if !St::suits(policy) {
            return Err(StoreError::Unsuited {
                algorithm: policy.algorithm().name(),
                limit: policy.limit(),
            });
        }
        let (hash, shard) = self.locate(key);
        let tag = tag(hash);
        let mut table = shard.table.lock();
        if let Probe::Found(i) = table.find(tag, key)
            && let Some(entry) = table.entry_mut(i)
        {
            let before = entry.state.heap_bytes();
            if !entry.state.fits(policy) {
                entry.state = St::fresh(policy);
            }
            let out = f(&mut entry.state);
            let after = entry.state.heap_bytes();
            if before != after {
                table.state_resized(before, after, i, policy);
            }
            return Ok(out);
        }
        let mut state = St::fresh(policy);
        let out = f(&mut state);
        // A peek, or a refusal of a new key, leaves nothing to keep.
        if state.expires(policy) > now {
            // Room for the key before it is copied, so that the copy itself
            // fits the budget: a borrowed `str` or `[u8]` is as long as its
            // owned copy's heap part.
            if K::HEAP {
                let estimate = size_of_val(key) + state.heap_bytes();
                if !table.make_room(tag, estimate, policy, now) {
                    return Err(StoreError::KeyTooLarge {
                        bytes: estimate,
                        max: table_heap_allowance(&table),
                    });
                }
            }
            let key = key.to_owned();
            let bytes = key.heap_bytes() + state.heap_bytes();
            if !table.insert(tag, key, state, policy, now) {
                return Err(StoreError::KeyTooLarge {
                    bytes,
                    max: table_heap_allowance(&table),
                });
            }
        }
        Ok(out)
    }

    /// Decides `cost` units for `key` at `now` under `policy`.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unsuited`] if this store's states cannot serve
    /// `policy`; [`StoreError::KeyTooLarge`] for a key larger than a
    /// shard's share of the byte budget (nothing is counted).
    pub fn check<Q>(&self, policy: &Policy, key: &Q, now: u64, cost: u64) -> Result<Decision, StoreError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.with_state(policy, key, now, |s| s.check(policy, now, cost))
    }

    /// [`Store::check`] without the headers: only whether it was admitted.
    ///
    /// # Errors
    ///
    /// As [`Store::check`].
    pub fn admit<Q>(&self, policy: &Policy, key: &Q, now: u64, cost: u64) -> Result<bool, StoreError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.with_state(policy, key, now, |s| s.admit(policy, now, cost))
    }

    /// Decides many independent requests at `now`, as [`Store::check`] one
    /// after another would, appending one result per request to `out`.
    ///
    /// Each key's slot is prefetched a few requests ahead, so that the
    /// memory misses of a batch overlap instead of following one another.
    pub fn check_many<Q>(
        &self,
        policy: &Policy,
        now: u64,
        requests: &[(&Q, u64)],
        out: &mut Vec<Result<Decision, StoreError>>,
    ) where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.many(requests, out, |(key, cost)| self.check(policy, key, now, *cost));
    }

    /// [`Store::check_many`] answering only admitted or not.
    pub fn admit_many<Q>(
        &self,
        policy: &Policy,
        now: u64,
        requests: &[(&Q, u64)],
        out: &mut Vec<Result<bool, StoreError>>,
    ) where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.many(requests, out, |(key, cost)| self.admit(policy, key, now, *cost));
    }

    fn many<Q, T>(&self, requests: &[(&Q, u64)], out: &mut Vec<T>, mut decide: impl FnMut(&(&Q, u64)) -> T)
    where
        Q: Hash + ?Sized,
    {
        /// How many requests ahead the prefetches run.
        const AHEAD: usize = 8;
        out.reserve(requests.len());
        let touch = |(key, _): &(&Q, u64)| {
            let (hash, shard) = self.locate(*key);
            let home = usize::from(tag(hash).get()) & shard.mask;
            crate::prefetch::prefetch(shard.base.wrapping_add(home * self.slot_bytes));
        };
        requests.iter().take(AHEAD).for_each(touch);
        for (i, request) in requests.iter().enumerate() {
            if let Some(ahead) = requests.get(i + AHEAD) {
                touch(ahead);
            }
            out.push(decide(request));
        }
    }

    /// Forgets `key`: its next request starts from a fresh state. Returns
    /// whether the key was held.
    pub fn reset<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let (hash, shard) = self.locate(key);
        let mut table = shard.table.lock();
        match table.find(tag(hash), key) {
            Probe::Found(i) => {
                table.remove(i);
                true
            }
            Probe::Vacant => false,
        }
    }

    /// Keys held, capacity, evictions and bytes in use.
    pub fn stats(&self) -> Stats {
        let mut stats = Stats::default();
        for shard in &self.shards {
            let table = shard.table.lock();
            stats.keys += table.len();
            stats.capacity += table.max_len();
            stats.evictions += table.evictions;
            stats.reclaimed += table.reclaimed;
            stats.bytes += table.slot_count() * self.slot_bytes + table.heap();
        }
        stats.bytes += size_of_val(&*self.shards) + size_of::<Self>();
        stats
    }
}

fn table_heap_allowance<K: Key, St: KeyState>(table: &Table<K, St>) -> usize {
    table.max_heap()
}
