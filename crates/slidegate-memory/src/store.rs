//! The sharded store.

use crate::key::Key;
use crate::state::KeyState;
use crate::summary;
use crate::table::{Entry, Evicted, MAX_SLOTS, Probe, Table, tag};
use parking_lot::Mutex;
use slidegate_core::{Decision, Policy};
use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicUsize, Ordering};

/// How much a [`StateMap`] may hold, fixed when it is built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    keys: usize,
    bytes: usize,
    forget: bool,
}

impl Budget {
    /// At most `keys` keys (heap-holding keys such as `String` are then
    /// bounded in number only). The table gets slots for them at 3/4 load,
    /// so that shards filling unevenly still hold them all.
    pub fn keys(keys: usize) -> Self {
        Budget {
            keys,
            bytes: usize::MAX,
            forget: false,
        }
    }

    /// At most `bytes` bytes: the table and, for keys and states that hold
    /// heap memory, what they hold (half of the budget is then set aside
    /// for it).
    pub fn bytes(bytes: usize) -> Self {
        Budget {
            keys: usize::MAX,
            bytes,
            forget: false,
        }
    }

    /// Both bounds.
    pub fn keys_and_bytes(keys: usize, bytes: usize) -> Self {
        Budget {
            keys,
            bytes,
            forget: false,
        }
    }

    /// This budget, with evicted keys forgotten: a live key evicted to make
    /// room starts afresh when it comes back, as in stores without a
    /// summary of evicted counts (moka's LRU in Limitador, for one). New
    /// keys are never refused early then, but a flood of new keys can
    /// evict a client at its limit and so let it through again; the
    /// default keeps the summary, which never does. For comparison, and
    /// for users who would rather admit new clients than hold that line.
    pub fn forgetting(self) -> Self {
        Budget { forget: true, ..self }
    }
}

/// Why a store could not decide.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MemoryError {
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
    /// Bytes in use: the table and the summaries (allocated whole when the
    /// store is built) plus what keys and states hold on the heap.
    pub bytes: usize,
    /// New keys that started from the summary of evicted keys' counts
    /// instead of from nothing, since the store was built: evicted keys
    /// coming back, and keys whose cells all collide with evicted ones.
    pub seeded: u64,
    /// Of those, keys not stored: refused (or peeked at) with nothing more
    /// to count, or kept in the summary alone because their shard was full
    /// (a key vouched for by the summary never evicts a live key).
    pub summarised: u64,
    /// Cells in the summaries of evicted keys' counts (4 rows per shard).
    pub summary_cells: usize,
    /// Of those, cells still holding counts, at each shard's latest time.
    pub summary_live: usize,
    /// [`Stats::false_seed_rate`] in parts per million: the mean over the
    /// shards (which new keys land on evenly) of each one's fill to the
    /// power of its rows; of two stores' figures, the larger.
    pub false_seed_ppm: u64,
}

impl Stats {
    /// The share of the summaries' cells that still hold counts.
    pub fn summary_fill(&self) -> f64 {
        if self.summary_cells == 0 {
            0.0
        } else {
            self.summary_live as f64 / self.summary_cells as f64
        }
    }

    /// About the chance that a key never evicted starts from a non-zero
    /// estimate (all of its cells taken): in each shard, its summary's fill
    /// to the power of its rows (if cells fill independently), averaged
    /// over the shards. Such a key may be refused early, by at most what the
    /// keys sharing its cells held: this bounds the share of new keys
    /// refused early. A key that was evicted starts from at least its own
    /// counts, as it should.
    pub fn false_seed_rate(&self) -> f64 {
        self.false_seed_ppm as f64 / 1e6
    }
}

/// Fewest shards when the budget allows: enough that two threads seldom
/// meet on one lock.
const MIN_SHARDS: usize = 16;
/// Fewest slots in a table, whatever the budget.
const MIN_SLOTS: usize = 8;
/// Fewest slots in a shard when the budget pays for them: shards of a few
/// slots would need much more room for keys spreading unevenly.
const SHARD_SLOTS: usize = 64;

/// The most bytes a slot's share of its shard's summary takes (a row of
/// 12-byte cells for every 16 slots, 4 rows).
const SUMMARY_PER_SLOT: usize = 3;

/// One shard on its own cache line: its lock, and where its slots are.
#[repr(align(64))]
struct Shard<K, St: KeyState> {
    table: Mutex<Table<K, St>>,
    /// The address of the first slot and the slot count, which never
    /// change: the table is allocated once.
    base: usize,
    mask: usize,
}

/// A concurrent map from keys to limit states, in a memory budget fixed at
/// construction. See the [crate documentation](crate) for its rules.
pub struct StateMap<K, St: KeyState> {
    shards: Box<[Shard<K, St>]>,
    hasher: foldhash::fast::RandomState,
    slot_bytes: usize,
    /// Keys held, over all shards: updated under each shard's lock when
    /// its count changes, read to keep the total within `max_keys`.
    keys: AtomicUsize,
    max_keys: usize,
}

impl<K: Key, St: KeyState> std::fmt::Debug for StateMap<K, St> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateMap")
            .field("shards", &self.shards.len())
            .field("stats", &self.stats())
            .finish()
    }
}

/// A shard index in `0..n` from a hash: `⌊x·n / 2⁶⁴⌋` of the hash
/// multiplied by an odd constant. foldhash's fast hash varies its high bits
/// slowly over small consecutive integers under some seeds (about one in a
/// hundred: 64 keys all in one of three shards was seen), so the high bits
/// alone would crowd such keys into one shard; the multiplication carries
/// the well-mixed low bits up.
fn reduce(hash: u64, n: usize) -> usize {
    let mixed = hash.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    ((u128::from(mixed) * n as u128) >> 64) as usize
}

impl<K: Key, St: KeyState> StateMap<K, St> {
    /// A store within `budget`. Its whole table is allocated now; keys and
    /// states that hold heap memory add to it, up to the budget.
    pub fn new(budget: Budget) -> Self {
        let slot_bytes = size_of::<Option<Entry<K, St>>>();
        let heap_share = if K::HEAP || St::HEAP { budget.bytes / 2 } else { 0 };
        // The shards' locks and bookkeeping come out of the budget too, and
        // so do the summaries: at most 3 bytes a slot, or the smallest one
        // (8 cells a row) per shard.
        let most_shards = budget.bytes / (MAX_SLOTS * slot_bytes) + MIN_SHARDS + 1;
        let smallest_summary = summary::bytes_for(summary::width_for(0)) + size_of::<Evicted>();
        let overhead = most_shards * (size_of::<Shard<K, St>>() + smallest_summary) + size_of::<Self>();
        let table_bytes = budget.bytes.saturating_sub(heap_share).saturating_sub(overhead);
        let slots_by_bytes = (table_bytes / (slot_bytes + SUMMARY_PER_SLOT)).max(MIN_SLOTS);
        // A key budget gets slots for its keys at 3/4 load, so that shards
        // filling unevenly still hold all of them (each shard may fill to
        // 7/8); a byte budget gets as many slots as it pays for.
        let wanted = budget.keys.saturating_add(budget.keys / 3).min(slots_by_bytes);
        let per_shard = (wanted / MIN_SHARDS).clamp(SHARD_SLOTS, MAX_SLOTS).next_power_of_two();
        let per_shard = per_shard.min(1usize << slots_by_bytes.ilog2());
        let max_len = per_shard - per_shard / 8;
        // Keys spread over shards binomially: a shard expecting `m` keys
        // stays below its cap unless it is six standard deviations (√m)
        // over, which small shards need more room for than 3/4 load gives.
        let root = (-6.0 + (36.0 + 4.0 * max_len as f64).sqrt()) / 2.0;
        let expected = ((root * root) as usize).min(per_shard / 4 * 3).max(1);
        let shards = budget.keys.div_ceil(expected);
        // Never more slots than the bytes pay for.
        let shards = shards.min(slots_by_bytes / per_shard).max(1);
        let max_keys = budget.keys.min(shards * max_len);
        let max_heap = if heap_share == 0 {
            usize::MAX
        } else {
            heap_share / shards
        };
        let hasher = foldhash::fast::RandomState::default();
        let shards = (0..shards)
            .map(|_| {
                let table = Table::new(per_shard, max_len, max_heap, hasher.clone(), budget.forget);
                Shard {
                    base: table.base(),
                    mask: table.slot_count() - 1,
                    table: Mutex::new(table),
                }
            })
            .collect();
        StateMap {
            shards,
            hasher,
            slot_bytes,
            keys: AtomicUsize::new(0),
            max_keys,
        }
    }

    /// Starts bringing in the home slot of the key of `hash` in `shard`,
    /// and the slot after it.
    fn prefetch_home(&self, hash: u64, shard: &Shard<K, St>) {
        let home = usize::from(tag(hash).get()) & shard.mask;
        crate::prefetch::prefetch(shard.base.wrapping_add(home * self.slot_bytes));
        // And the next slot: a key displaced by linear probing sits there,
        // on the next cache line when slots are lines (a dependent miss
        // otherwise; about 4 % of a decision at 1,000,000 keys).
        let next = (home + 1) & shard.mask;
        crate::prefetch::prefetch(shard.base.wrapping_add(next * self.slot_bytes));
    }

    fn locate<Q: Hash + ?Sized>(&self, key: &Q) -> (u64, &Shard<K, St>) {
        let hash = self.hasher.hash_one(key);
        (hash, &self.shards[reduce(hash, self.shards.len())])
    }

    /// Runs `f` on the state of `key` (a fresh one if the key is new or its
    /// state does not fit `policy`), keeping a new key only if it now
    /// counts something: for callers that change a state other than by
    /// deciding (a store that learns counts from elsewhere). `f` runs under
    /// the lock of the key's shard.
    ///
    /// # Errors
    ///
    /// As [`StateMap::check`].
    pub fn update<Q, T>(
        &self,
        policy: &Policy,
        key: &Q,
        now: u64,
        f: impl FnOnce(&mut St) -> T,
    ) -> Result<T, MemoryError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.update_clocked(policy, key, || now, |state, _| f(state))
    }

    /// [`StateMap::update`] reading the time from `now` once the key's slot
    /// is on its way: a clock read (a few dozen cycles, and on some CPUs a
    /// stall for loads in flight) then overlaps the memory miss instead of
    /// delaying it. `f` gets the time read.
    pub(crate) fn update_clocked<Q, T>(
        &self,
        policy: &Policy,
        key: &Q,
        now: impl FnOnce() -> u64,
        f: impl FnOnce(&mut St, u64) -> T,
    ) -> Result<T, MemoryError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let (hash, shard) = self.locate(key);
        // The key's home slot is most likely a memory miss: start it before
        // reading the clock and taking the lock, so that it overlaps both
        // and the lock is held for less of it.
        self.prefetch_home(hash, shard);
        let now = now();
        let mut table = shard.table.lock();
        self.update_in(&mut table, hash, policy, key, now, |state| f(state, now))
    }

    /// [`StateMap::update`] in a table already locked, `hash` being the key's.
    fn update_in<Q, T>(
        &self,
        table: &mut Table<K, St>,
        hash: u64,
        policy: &Policy,
        key: &Q,
        now: u64,
        f: impl FnOnce(&mut St) -> T,
    ) -> Result<T, MemoryError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if !St::suits(policy) {
            return Err(MemoryError::Unsuited {
                algorithm: policy.algorithm().name(),
                limit: policy.limit(),
            });
        }
        let tag = tag(hash);
        // One call of `f` for a held key and a new one alike, so that the
        // decision inlines here.
        let found = match table.find(tag, key) {
            Probe::Found(i) => table.entry_mut(i).map(|entry| (i, &mut entry.state)),
            Probe::Vacant => None,
        };
        let mut new = None;
        let (state, held) = match found {
            Some((i, state)) => {
                let before = state.heap_bytes();
                if !state.fits(policy) {
                    *state = St::fresh(policy);
                }
                (state, Some((i, before)))
            }
            None => {
                let (state, seeded) = table.start(hash, policy, now);
                let seed = seeded.then(|| (state.held(), state.expires(policy)));
                (&mut new.insert((state, seed)).0, None)
            }
        };
        let out = f(state);
        if let Some((i, before)) = held {
            let after = state.heap_bytes();
            if before != after {
                let held = table.len();
                table.state_resized(before, after, i, policy, now);
                self.keys.fetch_sub(held - table.len(), Ordering::Relaxed);
            }
        }
        match new {
            Some((state, seed)) => self.keep_new(table, hash, key, state, seed, policy, now).map(|()| out),
            None => Ok(out),
        }
    }

    /// Keeps a key that was not held, after its first decision, if it
    /// counts something more than the summary's seed (`seed`: the seeded
    /// state's units and expiry): out of line, as new keys are the rarer
    /// path.
    #[cold]
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn keep_new<Q>(
        &self,
        table: &mut Table<K, St>,
        hash: u64,
        key: &Q,
        state: St,
        seed: Option<(u64, u64)>,
        policy: &Policy,
        now: u64,
    ) -> Result<(), MemoryError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if let Some(seed) = seed {
            // A seeded key that counted nothing more (a refusal, a peek) is
            // not stored: the summary still holds what it was seeded with.
            let now_holds = (state.held(), state.expires(policy));
            if seed == now_holds {
                table.evicted.summarised += 1;
                return Ok(());
            }
            // Nor does one that counted more evict a live key to come back
            // in: it stays in the summary, which now holds all it counted.
            // (Keys held are never pushed out by keys the summary vouches
            // for, such as a flood of keys whose cells are all taken; a
            // flood can evict only with keys it has not yet filled.)
            if table.len() >= table.max_len() || self.keys.load(Ordering::Relaxed) >= self.max_keys {
                table.evicted.summary.fold(hash, now_holds.0, now_holds.1, now);
                table.evicted.summarised += 1;
                return Ok(());
            }
        }
        let before = table.len();
        let inserted = self.insert(table, hash, key, state, policy, now);
        let after = table.len();
        if after > before {
            self.keys.fetch_add(after - before, Ordering::Relaxed);
        } else if before > after {
            self.keys.fetch_sub(before - after, Ordering::Relaxed);
        }
        inserted
    }

    /// Stores a new key's state if it counts something.
    fn insert<Q>(
        &self,
        table: &mut Table<K, St>,
        hash: u64,
        key: &Q,
        state: St,
        policy: &Policy,
        now: u64,
    ) -> Result<(), MemoryError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        // A full store makes room in this key's shard even if the shard
        // itself is not full.
        let full = self.keys.load(Ordering::Relaxed) >= self.max_keys;
        let tag = tag(hash);
        // A peek, or a refusal of a new key, leaves nothing to keep.
        if state.expires(policy) > now {
            // A full store whose shard here holds no key to make room with
            // (the other shards hold them all) drops the new key at once,
            // as an eviction, keeping what it counted in the summary: the
            // store never holds more keys than its bound.
            if full && table.len() == 0 {
                table.evict_new(hash, &state, policy, now);
                return Ok(());
            }
            // Room for the key before it is copied, so that the copy itself
            // fits the budget: a borrowed `str` or `[u8]` is as long as its
            // owned copy's heap part.
            if K::HEAP {
                let estimate = size_of_val(key) + state.heap_bytes();
                if !table.make_room(tag, estimate, policy, now, full) {
                    return Err(MemoryError::KeyTooLarge {
                        bytes: estimate,
                        max: table.max_heap(),
                    });
                }
            }
            let key = key.to_owned();
            let bytes = key.heap_bytes() + state.heap_bytes();
            if !table.insert(tag, key, state, policy, now, full && !K::HEAP) {
                return Err(MemoryError::KeyTooLarge {
                    bytes,
                    max: table.max_heap(),
                });
            }
        }
        Ok(())
    }

    /// Decides `cost` units for `key` at `now` under `policy`.
    ///
    /// # Errors
    ///
    /// [`MemoryError::Unsuited`] if this store's states cannot serve
    /// `policy`; [`MemoryError::KeyTooLarge`] for a key larger than a
    /// shard's share of the byte budget (nothing is counted).
    pub fn check<Q>(&self, policy: &Policy, key: &Q, now: u64, cost: u64) -> Result<Decision, MemoryError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.update(policy, key, now, |s| s.check(policy, now, cost))
    }

    /// [`StateMap::check`] without the headers: only whether it was admitted.
    ///
    /// # Errors
    ///
    /// As [`StateMap::check`].
    pub fn admit<Q>(&self, policy: &Policy, key: &Q, now: u64, cost: u64) -> Result<bool, MemoryError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.update(policy, key, now, |s| s.admit(policy, now, cost))
    }

    /// Decides many independent requests at `now`, as [`StateMap::check`] one
    /// after another would, appending one result per request to `out`.
    ///
    /// Each key's slot is prefetched a few requests ahead, so that the
    /// memory misses of a batch overlap instead of following one another.
    pub fn check_many<Q>(
        &self,
        policy: &Policy,
        now: u64,
        requests: &[(&Q, u64)],
        out: &mut Vec<Result<Decision, MemoryError>>,
    ) where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.many(requests, out, |(key, cost)| self.check(policy, key, now, *cost));
    }

    /// [`StateMap::check_many`] answering only admitted or not.
    pub fn admit_many<Q>(
        &self,
        policy: &Policy,
        now: u64,
        requests: &[(&Q, u64)],
        out: &mut Vec<Result<bool, MemoryError>>,
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
            self.prefetch_home(hash, shard);
        };
        requests.iter().take(AHEAD).for_each(touch);
        for (i, request) in requests.iter().enumerate() {
            if let Some(ahead) = requests.get(i + AHEAD) {
                touch(ahead);
            }
            out.push(decide(request));
        }
    }

    /// Forgets `key`: its next request starts from a fresh state (or, if
    /// the key was evicted while live before, from what the summary of
    /// evicted keys still holds for it). Returns whether the key was held.
    pub fn reset<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let (hash, shard) = self.locate(key);
        let mut table = shard.table.lock();
        self.remove_in(&mut table, hash, key)
    }

    /// Removes `key` (whose hash is `hash`) from a table already locked;
    /// whether it was held.
    fn remove_in<Q>(&self, table: &mut Table<K, St>, hash: u64, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        match table.find(tag(hash), key) {
            Probe::Found(i) => {
                table.remove(i);
                self.keys.fetch_sub(1, Ordering::Relaxed);
                true
            }
            Probe::Vacant => false,
        }
    }

    /// Locks the shard of the key group `group` (a hash of the group's
    /// name, from [`StateMap::hash`]), so that several keys of the group are
    /// decided under one lock: every key used through a [`Group`] lives in
    /// the shard its group picks. Keys must be used either only through
    /// groups or never: a key's place depends on it.
    pub fn group(&self, group: u64) -> Group<'_, K, St> {
        let shard = &self.shards[reduce(group, self.shards.len())];
        Group {
            store: self,
            table: shard.table.lock(),
        }
    }

    /// The store's (randomly seeded) hash of `value`.
    pub fn hash<Q: Hash + ?Sized>(&self, value: &Q) -> u64 {
        self.hasher.hash_one(value)
    }

    /// Keys held, capacity, evictions and bytes in use.
    pub fn stats(&self) -> Stats {
        let mut stats = Stats::default();
        let mut false_seeds = 0.0;
        for shard in &self.shards {
            let table = shard.table.lock();
            stats.keys += table.len();
            stats.capacity += table.max_len();
            stats.evictions += table.evictions;
            stats.reclaimed += table.reclaimed;
            stats.bytes += table.slot_count() * self.slot_bytes + table.heap() + table.evicted.bytes();
            stats.seeded += table.evicted.seeded;
            stats.summarised += table.evicted.summarised;
            stats.summary_cells += table.evicted.summary.cells();
            let (cells, live) = (
                table.evicted.summary.cells(),
                table.evicted.summary.live(table.evicted.now),
            );
            stats.summary_live += live;
            false_seeds += (live as f64 / cells.max(1) as f64).powi(crate::summary::ROWS as i32);
        }
        stats.false_seed_ppm = (1e6 * false_seeds / self.shards.len().max(1) as f64).round() as u64;
        stats.capacity = stats.capacity.min(self.max_keys);
        stats.bytes += size_of_val(&*self.shards) + size_of::<Self>();
        stats
    }
}

/// The locked shard of a key group ([`StateMap::group`]): its keys are
/// decided under the one lock until the group is dropped.
pub struct Group<'a, K, St: KeyState> {
    store: &'a StateMap<K, St>,
    table: parking_lot::MutexGuard<'a, Table<K, St>>,
}

impl<K: Key, St: KeyState> Group<'_, K, St> {
    /// [`StateMap::update`] for a key of the group.
    ///
    /// # Errors
    ///
    /// As [`StateMap::check`].
    pub fn update<Q, T>(
        &mut self,
        policy: &Policy,
        key: &Q,
        now: u64,
        f: impl FnOnce(&mut St) -> T,
    ) -> Result<T, MemoryError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let hash = self.store.hasher.hash_one(key);
        self.store.update_in(&mut self.table, hash, policy, key, now, f)
    }

    /// [`StateMap::reset`] for a key of the group.
    pub fn reset<Q>(&mut self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = self.store.hasher.hash_one(key);
        self.store.remove_in(&mut self.table, hash, key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Ring2;
    use slidegate_core::{Algorithm, Weighting};
    use std::time::Duration;

    /// Hashes alike in their high bits (as foldhash's fast hash gives small
    /// consecutive integers under some seeds) still spread over the shards.
    #[test]
    fn hashes_differing_in_low_bits_spread_over_the_shards() {
        for n in [2usize, 3, 16, 95] {
            let mut count = vec![0u32; n];
            for k in 0..64 * n as u64 {
                count[reduce(0xC7E3_EC30_0000_0000 | (k * 0x9_7F4A), n)] += 1;
            }
            assert!(count.iter().all(|&c| (32..=96).contains(&c)), "{n} shards: {count:?}");
        }
    }

    /// A full store whose new key falls in a shard holding no key (the
    /// other shards hold them all) does not go past its bound: the key is
    /// dropped at once as an eviction, its counts kept in the summary, so
    /// it is refused when it comes back.
    #[test]
    fn a_full_store_never_holds_more_keys_than_its_bound() {
        let algorithm = Algorithm::SlidingWindow {
            buckets: 2,
            weighting: Weighting::Interpolated,
        };
        let policy = Policy::new(3, Duration::from_secs(1), algorithm).unwrap();
        let store: StateMap<u64, Ring2<u16>> = StateMap::new(Budget::keys(64));
        assert!(store.shards.len() > 1, "{store:?}");
        let shard_of = |key: u64| std::ptr::from_ref(store.locate(&key).1);
        let empty = shard_of(0);
        let mut keys = (1u64..).filter(|&k| shard_of(k) != empty);
        while store.stats().keys < store.max_keys {
            let key = keys.next().unwrap();
            assert!(store.admit(&policy, &key, 0, 3).unwrap());
        }
        let before = store.stats();
        assert_eq!(before.keys, store.max_keys);
        assert!(store.admit(&policy, &0, 0, 3).unwrap());
        let after = store.stats();
        assert_eq!(after.keys, before.keys, "{after:?}");
        assert_eq!(after.evictions, before.evictions + 1, "{after:?}");
        assert!(
            !store.admit(&policy, &0, 0, 1).unwrap(),
            "key 0 gained from being dropped"
        );
    }
}
