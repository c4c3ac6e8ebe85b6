//! One shard's table: open addressing with linear probing over a fixed
//! array, deletion by backward shift (no tombstones), a sweep cursor, and
//! the summary of what evicted keys held.

use crate::key::Key;
use crate::state::KeyState;
use crate::summary::{Summary, width_for};
use slidegate_core::{Algorithm, Policy};
use std::borrow::Borrow;
use std::hash::BuildHasher;
use std::num::NonZeroU16;

/// The most slots a shard has: a slot's home is the low 15 bits of its
/// key's hash, kept in the entry's tag, so entries move without rehashing.
pub(crate) const MAX_SLOTS: usize = 1 << 15;

/// Slots looked at for an idle key, per insertion, and before evicting.
const SWEEP_STEP: usize = 4;
const SWEEP_WHEN_FULL: usize = 32;
/// Slots from a new key's home among which the victim of an eviction is
/// chosen.
const EVICTION_SAMPLE: usize = 8;

/// One key and its state. `tag` is `0x8000 | (hash & 0x7fff)`: never zero
/// (so `Option<Entry>` needs no extra byte), and it holds the home slot.
#[derive(Debug)]
pub(crate) struct Entry<K, St: KeyState> {
    tag: NonZeroU16,
    pub(crate) key: K,
    pub(crate) state: St,
    /// The entry's alignment: a whole cache line for the states that ask
    /// for one ([`KeyState::Align`]).
    _line: St::Align,
}

/// The tag of a hash.
pub(crate) fn tag(hash: u64) -> NonZeroU16 {
    NonZeroU16::MIN.saturating_add(0x7fff) | ((hash & 0x7fff) as u16)
}

/// What one shard holds, and its share of the budget.
#[derive(Debug)]
pub(crate) struct Table<K, St: KeyState> {
    slots: Box<[Option<Entry<K, St>>]>,
    mask: usize,
    len: usize,
    /// Most keys held at once: at most 7/8 of the slots.
    max_len: usize,
    /// Heap bytes of the keys and states held.
    heap: usize,
    max_heap: usize,
    cursor: usize,
    pub(crate) evictions: u64,
    pub(crate) reclaimed: u64,
    /// The summary of evicted keys and its figures, off the table's own
    /// cache lines (only new keys and evictions reach it).
    pub(crate) evicted: Box<Evicted>,
}

/// A shard's summary of evicted keys, and what it has done.
#[derive(Debug)]
pub(crate) struct Evicted {
    /// What the live keys evicted from here still held.
    pub(crate) summary: Summary,
    /// The store's hasher, to find an evicted key's cells.
    hasher: foldhash::fast::RandomState,
    /// New keys that started from the summary's estimate.
    pub(crate) seeded: u64,
    /// Seeded keys not stored (see `Stats::summarised`).
    pub(crate) summarised: u64,
    /// The latest time this shard was told of (for the summary's fill).
    pub(crate) now: u64,
    /// Nothing is folded or seeded: evicted keys are forgotten
    /// ([`Budget::forgetting`](crate::Budget::forgetting)).
    forget: bool,
}

impl Evicted {
    /// Bytes taken: the sketch and this.
    pub(crate) fn bytes(&self) -> usize {
        self.summary.bytes() + size_of::<Self>()
    }
}

/// Where a key is, or the empty slot where it would go.
pub(crate) enum Probe {
    Found(usize),
    Vacant,
}

impl<K: Key, St: KeyState> Table<K, St> {
    /// A table of `slots` slots (a power of two, at most [`MAX_SLOTS`])
    /// holding at most `max_len` keys and `max_heap` heap bytes, whose
    /// keys are hashed with `hasher`.
    pub(crate) fn new(
        slots: usize,
        max_len: usize,
        max_heap: usize,
        hasher: foldhash::fast::RandomState,
        forget: bool,
    ) -> Self {
        Table {
            slots: std::iter::repeat_with(|| None).take(slots).collect(),
            mask: slots - 1,
            len: 0,
            max_len: max_len.min(slots - slots / 8).max(1),
            heap: 0,
            max_heap,
            cursor: 0,
            evictions: 0,
            reclaimed: 0,
            evicted: Box::new(Evicted {
                summary: Summary::new(width_for(slots)),
                hasher,
                seeded: 0,
                summarised: 0,
                now: 0,
                forget,
            }),
        }
    }

    /// The state a key that is not held starts from at `now` (`hash` being
    /// the key's), and whether it was seeded: fresh, unless the summary
    /// says the key may still hold counts from before an eviction.
    ///
    /// A seeded state has counted the summary's whole estimate at once, at
    /// the latest instant the key's own counts can have been made (a count's
    /// lifetime before the estimate's expiry, and never after `now`): every
    /// unit it held is then moved later, or kept, and never dropped, so it
    /// refuses whatever the key's evicted state would have refused. A
    /// `gcra` state gets its `TAT` at (or just past) the estimate's expiry,
    /// which is at least the evicted `TAT`.
    pub(crate) fn start(&mut self, hash: u64, policy: &Policy, now: u64) -> (St, bool) {
        let mut state = St::fresh(policy);
        if self.evicted.forget {
            return (state, false);
        }
        self.evicted.now = self.evicted.now.max(now);
        let seed = self.evicted.summary.estimate(hash, now);
        let (at, cost) = match policy.algorithm() {
            Algorithm::Gcra { .. } => (now, seed.until.saturating_sub(now).div_ceil(policy.step_ns().max(1))),
            // A count lasts `n` buckets in a ring (from its bucket's start),
            // one window in a log or a histogram, and to the end of its
            // window in a fixed one: so no own count is later than this.
            Algorithm::SlidingWindow { buckets, .. } => (
                seed.until
                    .saturating_sub(policy.step_ns().saturating_mul(u64::from(buckets)))
                    .min(now),
                seed.count,
            ),
            _ => (seed.until.saturating_sub(policy.window_ns()).min(now), seed.count),
        };
        if cost == 0 {
            return (state, false);
        }
        state.record(policy, at, cost);
        self.evicted.seeded += 1;
        (state, true)
    }

    /// The address of the first slot, for prefetching.
    pub(crate) fn base(&self) -> usize {
        self.slots.as_ptr() as usize
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn heap(&self) -> usize {
        self.heap
    }

    pub(crate) fn max_heap(&self) -> usize {
        self.max_heap
    }

    pub(crate) fn max_len(&self) -> usize {
        self.max_len
    }

    pub(crate) fn slot_count(&self) -> usize {
        self.slots.len()
    }

    fn home(&self, tag: NonZeroU16) -> usize {
        usize::from(tag.get()) & self.mask
    }

    fn next(&self, i: usize) -> usize {
        (i + 1) & self.mask
    }

    /// Finds `key`. The table always has an empty slot, so the probe ends.
    pub(crate) fn find<Q>(&self, tag: NonZeroU16, key: &Q) -> Probe
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        let mut i = self.home(tag);
        loop {
            match &self.slots[i] {
                None => return Probe::Vacant,
                Some(e) if e.tag == tag && e.key.borrow() == key => return Probe::Found(i),
                Some(_) => i = self.next(i),
            }
        }
    }

    pub(crate) fn entry_mut(&mut self, i: usize) -> Option<&mut Entry<K, St>> {
        self.slots[i].as_mut()
    }

    /// Adjusts the heap count after a state at slot `i` changed size, and
    /// evicts others if the shard went over its heap budget.
    pub(crate) fn state_resized(&mut self, before: usize, after: usize, i: usize, policy: &Policy, now: u64) {
        self.heap = self.heap.saturating_sub(before).saturating_add(after);
        let mut keep = i;
        while self.heap > self.max_heap && self.len > 1 {
            match self.evict_near(self.next(keep), Some(keep), policy, now) {
                Some(moved_to) => keep = moved_to,
                None => break,
            }
        }
    }

    /// Makes room for one more key holding `need` heap bytes, whose home
    /// is that of `tag`: sweeps for idle keys, then evicts; with `force`,
    /// frees at least one slot even if the shard is not full. `false` if
    /// `need` alone is more than the shard's heap allowance.
    pub(crate) fn make_room(&mut self, tag: NonZeroU16, need: usize, policy: &Policy, now: u64, force: bool) -> bool {
        if need > self.max_heap {
            return false;
        }
        let (held, mut force) = (self.len, force);
        self.sweep(SWEEP_STEP, policy, now);
        if force || self.len >= self.max_len || self.heap + need > self.max_heap {
            self.sweep(SWEEP_WHEN_FULL, policy, now);
        }
        // `force`: the whole store is full, so one key must go from here.
        force &= self.len == held;
        while force || self.len >= self.max_len || self.heap + need > self.max_heap {
            if self.evict_near(self.home(tag), None, policy, now).is_none() {
                break;
            }
            force = false;
        }
        true
    }

    /// Inserts a key that is not in the table, making room first; `false`
    /// if the key and state alone are larger than the shard's heap budget.
    pub(crate) fn insert(
        &mut self,
        tag: NonZeroU16,
        key: K,
        state: St,
        policy: &Policy,
        now: u64,
        force: bool,
    ) -> bool {
        let need = key.heap_bytes() + state.heap_bytes();
        if !self.make_room(tag, need, policy, now, force) {
            return false;
        }
        let mut i = self.home(tag);
        while self.slots[i].is_some() {
            i = self.next(i);
        }
        self.slots[i] = Some(Entry {
            tag,
            key,
            state,
            _line: St::Align::default(),
        });
        self.len += 1;
        self.heap += need;
        true
    }

    /// Removes the key at slot `i`.
    pub(crate) fn remove(&mut self, i: usize) {
        self.remove_tracking(i, None);
    }

    /// Removes the entry at `hole` and shifts the entries after it back
    /// (no tombstones). Returns where the entry that was at `track` now is.
    fn remove_tracking(&mut self, hole: usize, track: Option<usize>) -> Option<usize> {
        let Some(gone) = self.slots[hole].take() else {
            return track;
        };
        self.len -= 1;
        self.heap = self
            .heap
            .saturating_sub(gone.key.heap_bytes() + gone.state.heap_bytes());
        let mut track = track;
        let mut hole = hole;
        let mut j = self.next(hole);
        while let Some(e) = &self.slots[j] {
            // The entry at `j` may fill the hole unless its home lies
            // cyclically in (hole, j].
            let home = self.home(e.tag);
            let dist_home = j.wrapping_sub(home) & self.mask;
            let dist_hole = j.wrapping_sub(hole) & self.mask;
            if dist_home >= dist_hole {
                self.slots[hole] = self.slots[j].take();
                if track == Some(j) {
                    track = Some(hole);
                }
                hole = j;
            }
            j = self.next(j);
        }
        track
    }

    /// Looks at `steps` slots from the cursor and drops the idle keys.
    pub(crate) fn sweep(&mut self, steps: usize, policy: &Policy, now: u64) {
        for _ in 0..steps {
            let i = self.cursor;
            match &self.slots[i] {
                Some(e) if e.state.expires(policy) <= now => {
                    // An entry may shift into slot `i`: look at it next.
                    self.remove(i);
                    self.reclaimed += 1;
                }
                _ => self.cursor = self.next(i),
            }
        }
    }

    /// Counts a new key that is not stored as evicted, folding what it
    /// holds into the summary (unless evicted keys are forgotten), as
    /// [`Table::evict_near`] does for a held one.
    pub(crate) fn evict_new(&mut self, hash: u64, state: &St, policy: &Policy, now: u64) {
        self.count_eviction(hash, state.held(), state.expires(policy), now);
    }

    /// Counts a live key dropped (its hash `hash`, holding `held` units
    /// until `until`), folding it into the summary unless evicted keys are
    /// forgotten.
    fn count_eviction(&mut self, hash: u64, held: u64, until: u64, now: u64) {
        self.evictions += 1;
        self.evicted.now = self.evicted.now.max(now);
        if !self.evicted.forget {
            self.evicted.summary.fold(hash, held, until, now);
        }
    }

    /// The entry [`Table::evict_near`] evicts, and its rank.
    fn victim(&self, from: usize, keep: Option<usize>, policy: &Policy, now: u64) -> Option<(usize, (bool, u64, u64))> {
        // (live, held, expiry): the least is evicted.
        let mut victim: Option<(usize, (bool, u64, u64))> = None;
        let (mut i, mut seen) = (from, 0);
        for _ in 0..self.slots.len() {
            if seen == EVICTION_SAMPLE {
                break;
            }
            if let Some(e) = &self.slots[i]
                && Some(i) != keep
            {
                seen += 1;
                let when = e.state.expires(policy);
                let live = when > now;
                let rank = (live, if live { e.state.held() } else { 0 }, when);
                if victim.is_none_or(|(_, r)| rank < r) {
                    victim = Some((i, rank));
                }
            }
            i = self.next(i);
        }
        victim
    }

    /// Evicts the entry whose loss costs least among the
    /// [`EVICTION_SAMPLE`] occupied slots from `from` on, never the one at
    /// `keep`: an idle one if any (nothing is lost), else the one holding
    /// fewest units ([`KeyState::held`]: it raises the summary least), the
    /// soonest-expiring of those. A live entry evicted is folded into the
    /// summary. Returns where the entry at `keep` is afterwards, or `None`
    /// if nothing was evicted.
    ///
    /// The sweep looks at slots from its cursor, so it can miss idle keys
    /// stored behind the cursor (most often in a sparse shard, where the
    /// slots swept hold few keys). If the entry chosen here is idle, it is
    /// counted as reclaimed: only a live key dropped is an eviction.
    fn evict_near(&mut self, from: usize, keep: Option<usize>, policy: &Policy, now: u64) -> Option<usize> {
        let (v, (live, held, when)) = self.victim(from, keep, policy, now)?;
        if live {
            let hash = self.slots[v]
                .as_ref()
                .map_or(0, |e| self.evicted.hasher.hash_one(&e.key));
            self.count_eviction(hash, held, when, now);
        } else {
            self.evicted.now = self.evicted.now.max(now);
            self.reclaimed += 1;
        }
        Some(self.remove_tracking(v, keep).unwrap_or(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{Ring2, Ring8};
    use slidegate_core::{Algorithm, FixedWindow, Gcra, Weighting};
    use std::time::Duration;

    fn hasher() -> foldhash::fast::RandomState {
        foldhash::fast::RandomState::default()
    }

    fn two_buckets(limit: u64) -> Policy {
        let algorithm = Algorithm::SlidingWindow {
            buckets: 2,
            weighting: Weighting::Interpolated,
        };
        Policy::new(limit, Duration::from_nanos(100), algorithm).unwrap()
    }

    #[test]
    fn slots_are_compact() {
        assert_eq!(size_of::<Option<Entry<u64, Ring2<u16>>>>(), 24);
        assert_eq!(size_of::<Option<Entry<u64, Ring2<u32>>>>(), 32);
        assert_eq!(size_of::<Option<Entry<u64, Ring8<u16>>>>(), 40);
        assert_eq!(size_of::<Option<Entry<u64, Ring8<u32>>>>(), 64);
        assert_eq!(align_of::<Option<Entry<u64, Ring8<u32>>>>(), 64);
        assert_eq!(size_of::<Option<Entry<u64, crate::state::Timed<Ring8<u32>>>>>(), 64);
        assert_eq!(size_of::<Option<Entry<u64, Gcra>>>(), 24);
        assert_eq!(size_of::<Option<Entry<u64, FixedWindow>>>(), 32);
    }

    /// Keys whose homes collide, removed in every order: every other key
    /// stays findable (backward shift keeps probe runs whole).
    #[test]
    fn removal_keeps_probe_runs_whole() {
        let p = two_buckets(10);
        for victim in 0..6u64 {
            let mut t: Table<u64, Ring2<u16>> = Table::new(8, 7, usize::MAX, hasher(), false);
            // Homes 6, 6, 7, 7, 0, 6: runs wrap around the end.
            let homes = [6u64, 6, 7, 7, 0, 6];
            for (k, &h) in homes.iter().enumerate() {
                let mut s = Ring2::fresh(&p);
                s.check(&p, 0, 1);
                assert!(t.insert(tag(h), k as u64, s, &p, 0, false));
            }
            let Probe::Found(i) = t.find(tag(homes[victim as usize]), &victim) else {
                panic!("held")
            };
            t.remove(i);
            assert_eq!(t.len(), 5);
            for (k, &h) in homes.iter().enumerate() {
                let found = matches!(t.find(tag(h), &(k as u64)), Probe::Found(_));
                assert_eq!(found, k as u64 != victim, "key {k} after removing {victim}");
            }
        }
    }

    /// A full table of live keys evicts one (counted) per new key and never
    /// holds more than its share.
    #[test]
    fn full_of_live_keys_evicts_and_counts() {
        let p = two_buckets(10);
        let mut t: Table<u64, Ring2<u16>> = Table::new(16, 14, usize::MAX, hasher(), false);
        for k in 0..100u64 {
            let mut s = Ring2::fresh(&p);
            s.check(&p, k, 1);
            assert!(t.insert(tag(k.wrapping_mul(0x9e37_79b9_7f4a_7c15)), k, s, &p, k, false));
            assert!(t.len() <= 14);
        }
        assert_eq!(t.len(), 14);
        assert_eq!(t.evictions, 100 - 14);
    }

    /// Idle keys are reclaimed by the sweep before anything is evicted.
    #[test]
    fn idle_keys_are_swept_before_evicting() {
        let p = two_buckets(10);
        let mut t: Table<u64, Ring2<u16>> = Table::new(16, 14, usize::MAX, hasher(), false);
        for k in 0..14u64 {
            let mut s = Ring2::fresh(&p);
            s.check(&p, 0, 1);
            assert!(t.insert(tag(k), k, s, &p, 0, false));
        }
        // Two windows later every key is idle.
        let later = 1_000;
        let mut s = Ring2::fresh(&p);
        s.check(&p, later, 1);
        assert!(t.insert(tag(99), 99, s, &p, later, false));
        assert_eq!(t.evictions, 0);
        assert!(t.reclaimed > 0);
    }

    /// The failure `reclaim::a_reclaimed_key_starts_afresh` met about once
    /// in a hundred runs, with the placement fixed: a sparse shard (7 keys
    /// allowed in 64 slots, as `Budget::keys(7)` builds) whose keys each
    /// landed behind the sweep cursor, so that the 4 + 32 slots swept when
    /// the store is full hold none of them. Every key is idle by then; the
    /// one the eviction step drops is idle too, and is counted as
    /// reclaimed, not as a live key evicted.
    #[test]
    fn an_idle_key_dropped_by_the_eviction_step_is_reclaimed() {
        let p = two_buckets(3);
        let mut t: Table<u64, Ring2<u16>> = Table::new(64, 56, usize::MAX, hasher(), false);
        // Key k at time 300·k (three windows apart) and home slot k: the
        // cursor is at 4·(k + 1) when key k is stored, past its slot.
        let at = |k: u64| 300 * k;
        for k in 0..7u64 {
            let mut s = Ring2::fresh(&p);
            s.check(&p, at(k), 1);
            assert!(t.insert(tag(k), k, s, &p, at(k), false));
        }
        assert_eq!((t.len(), t.cursor, t.reclaimed), (7, 28, 0));
        // The store is full: the sweep looks at slots 28..64 and finds
        // nothing, so one key must go from the new key's home on.
        let mut s = Ring2::fresh(&p);
        s.check(&p, at(7), 1);
        assert!(t.insert(tag(40), 7, s, &p, at(7), true));
        assert_eq!(t.cursor, 0, "the sweep went round the table");
        assert_eq!(t.len(), 7);
        assert_eq!(t.evictions, 0, "no live key was evicted");
        assert_eq!(t.reclaimed, 1, "the key dropped was idle");
        // It was the soonest-expiring: key 0.
        assert!(matches!(t.find(tag(0), &0), Probe::Vacant));
    }

    /// A full table evicts the live key holding least, folds it into the
    /// summary, and the key comes back seeded with what it held.
    #[test]
    fn an_evicted_live_key_is_folded_and_seeded() {
        let p = two_buckets(3);
        let h = hasher();
        let mut t: Table<u64, Ring2<u16>> = Table::new(8, 2, usize::MAX, h.clone(), false);
        // Key 0 holds 3, key 1 holds 2; key 2 (holding 1) takes key 1's room.
        for k in 0..3u64 {
            let mut s = Ring2::fresh(&p);
            s.check(&p, 0, 3 - k);
            assert!(t.insert(tag(h.hash_one(k)), k, s, &p, 0, false));
        }
        assert_eq!((t.len(), t.evictions), (2, 1));
        assert!(matches!(t.find(tag(h.hash_one(1u64)), &1), Probe::Vacant));
        assert!(matches!(t.find(tag(h.hash_one(0u64)), &0), Probe::Found(_)));
        let (mut s, seeded) = t.start(h.hash_one(1u64), &p, 5);
        assert!(seeded && t.evicted.seeded == 1);
        assert!(!s.check(&p, 5, 2).allowed(), "it held 2 of 3");
        assert!(s.check(&p, 5, 1).allowed());
        // Two windows later the summary holds nothing for it.
        let (_, seeded) = t.start(h.hash_one(1u64), &p, 300);
        assert!(!seeded);
    }

    /// Keys larger than the heap allowance are refused; the allowance is
    /// never exceeded.
    #[test]
    fn heap_allowance_holds() {
        let p = two_buckets(10);
        let mut t: Table<String, Ring2<u16>> = Table::new(64, 56, 100, hasher(), false);
        let mut s = Ring2::fresh(&p);
        s.check(&p, 0, 1);
        assert!(!t.insert(tag(1), "x".repeat(101), s, &p, 0, false));
        for k in 0..50u64 {
            let mut s = Ring2::fresh(&p);
            s.check(&p, 0, 1);
            assert!(t.insert(tag(k), format!("key-{k:05}"), s, &p, 0, false));
            assert!(t.heap() <= 100, "{} bytes", t.heap());
        }
    }
}
