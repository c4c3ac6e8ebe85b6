//! A concurrent keyed store of slidegate limits: millions of keys in a
//! memory budget fixed when the store is built.
//!
//! [`KeyedLimiter`] limits every key to one policy with a clock, and
//! [`MemoryStore`] is the store of any limits behind the store interface;
//! the map underneath takes the policy and the time on every call. Keys are
//! any [`Key`] (integers, addresses, `String`, `Vec<u8>`, ...), looked up
//! by borrowed forms (`&str`, `&[u8]`) that allocate only when a new key is
//! stored.
//!
//! # Layout
//!
//! The store is cut into shards, each a fixed array of slots under its own
//! lock, on its own cache line. A slot holds a 2-byte tag (15 bits of the
//! key's hash), the key and its state, inline: with a `u64` key a
//! two-bucket `sliding_window` takes 24 bytes per slot, eight buckets of
//! `u32` 56, so a key and its state are one cache line. Slots are found by
//! linear probing from the key's home slot, and removed by backward shift,
//! so there are no tombstones and the table never rehashes. Keys are hashed
//! with foldhash seeded at random for each store, so that clients cannot
//! choose keys that collide.
//!
//! # Memory
//!
//! The whole table is allocated when the store is built, sized from the
//! [`Budget`]: a budget of `n` keys gets slots for them at 3/4 load, or
//! less for small budgets, so that shards filling unevenly still hold all
//! `n` (each shard has room for six standard deviations of the spread); a
//! budget of bytes gets as many slots as it pays for. A shard holds keys in at most 7/8 of its
//! slots, and the store at most `n` keys in all (a new key in a full store
//! makes room in its own shard; threads inserting at the same instant may
//! pass `n` by one key each, briefly, within the same table). Keys and states that
//! hold heap memory (`String` keys, `sliding_log` states) are counted
//! against the byte budget too, each shard against its share. The store
//! never grows past the budget: a new key in a full shard first sweeps for
//! idle keys, then evicts one. (The one exception: a single state larger
//! than its shard's share of the heap, such as the log of a `sliding_log`
//! with a huge limit, is kept alone rather than lose its counts. Size the
//! budget for the largest state; the compact states hold no heap at all.)
//! The smallest table has 8 slots, whatever the budget says.
//!
//! - **Idle keys** (every count expired: [`LimitState::expires_at`] has
//!   passed) are dropped in small steps on ordinary calls: every new key
//!   looks at the next 4 slots of its shard's sweep cursor, a new key in a
//!   full shard at 32 more. No background thread is needed. Under a
//!   stream of new keys that each go idle, about a quarter of the slots
//!   hold idle keys not yet swept (the keys stored since the cursor last
//!   passed); they are dropped before any live key is evicted.
//! - **Eviction**: when a shard is full of live keys, the key evicted is
//!   the one whose loss costs least among the 8 keys from the new key's
//!   home slot on: an idle one if there is one, else the one holding fewest
//!   units (`KeyState::held`), the soonest-expiring of those. Every
//!   eviction is counted in [`Stats::evictions`]; a key dropped this way
//!   that was idle after all (the sweep had not reached it) is counted in
//!   [`Stats::reclaimed`] instead.
//! - **The summary of evicted keys**: an evicted live key does not start
//!   afresh (a flood of new keys would otherwise reset a key at its limit).
//!   What it held and until when are folded into its shard's summary, a
//!   count-min sketch of 4 rows of up to 256 cells (one per 16 slots), each
//!   cell the most units still held by the keys folded into it and the
//!   latest instant they count until; a key that is not held starts from
//!   the least of its cells, an expired cell reading as empty. The estimate
//!   is never below what the key held while that still counts: collisions
//!   only over-count. The key starts as if it had counted the whole
//!   estimate at once, at the latest instant its own counts can be from
//!   (`gcra`: its `TAT` at the estimate's expiry), so it refuses whatever
//!   its evicted state would have refused:
//!   - `sliding_log`, conservative `sliding_window` (any `n`) and
//!     `fixed_window` (per fixed window) are never over their limit in any
//!     window because of eviction; `gcra` never past `burst + elapsed / T`;
//!   - interpolated `sliding_window` and `exponential_histogram` keep their
//!     own stated bounds (within the oldest bucket's count, within ε): the
//!     seeded state's estimate is never below the evicted one's.
//!
//!   The price is refusals of keys under their limits: a key whose cells
//!   are all taken by keys that held more (about [`Stats::false_seed_rate`]
//!   of new keys), and an evicted key coming back with all it held in one
//!   instant. A key started from the summary is not stored when it counted
//!   nothing more, nor when its shard is full (its new count is folded
//!   into the summary instead): keys the summary vouches for never evict
//!   live keys. Under a flood of new keys many times the capacity per
//!   window, the summary fills, and new keys start from high estimates
//!   (each seeded key's counts fold back in, so the level climbs towards
//!   the limits); keys held keep their counts. [`Stats::seeded`],
//!   [`Stats::summarised`] and [`Stats::summary_fill`] show it; size the
//!   budget so that live evictions are rare. [`KeyedLimiter::reset`]
//!   forgets a held key, but not what the summary holds for it.
//! - One shard holds `1/shards` of the budget, so a shard can fill (and
//!   evict) a little before the whole store does.
//!
//! # Concurrency
//!
//! Any number of threads may share a store (`&KeyedLimiter` is `Sync`). Each
//! decision holds its shard's lock from reading the key's state to writing
//! it back, so decisions on one key are linearizable: no update is lost and
//! no two requests are admitted on the same budget. Calls on keys of
//! different shards never wait for each other; there are at least 16 shards
//! when the budget allows. No part of the store is lock-free: the locks are
//! `parking_lot` mutexes, and statistics are read shard by shard under the
//! same locks (so they are exact per shard and a near snapshot overall).
//!
//! With a clock shared by threads, two threads may read times a few
//! nanoseconds apart and reach the lock in the other order; the states
//! treat such late requests by the seed's rules (their own bucket, or the
//! newest time), so nothing is lost and no limit is exceeded.
//!
//! # Batches
//!
//! [`KeyedLimiter::check_many`] decides many independent keys at once: it
//! prefetches each key's home slot a few requests ahead, so that on a
//! table larger than the caches the memory misses of a batch overlap
//! instead of costing one DRAM round trip each in sequence.
//!
//! [`LimitState::expires_at`]: slidegate_core::LimitState::expires_at

mod key;
mod limiter;
mod memory_store;
mod prefetch;
mod state;
mod store;
mod summary;
mod table;

pub use key::Key;
pub use limiter::KeyedLimiter;
pub use memory_store::MemoryStore;
pub use store::{Budget, MemoryError, Stats};

/// The parts of the store that other slidegate crates build on (the Redis
/// crate's hybrid mode keeps its local views in a [`StateMap`] of its own
/// [`KeyState`]), and this crate's tests and benchmarks: not a stable
/// interface.
///
/// [`StateMap`]: internals::StateMap
/// [`KeyState`]: internals::KeyState
#[doc(hidden)]
pub mod internals {
    pub use crate::state::{CacheLine, KeyState, Ring2, Ring8, Timed};
    pub use crate::store::{Group, StateMap};
}
