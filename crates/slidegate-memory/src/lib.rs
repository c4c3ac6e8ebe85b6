//! A concurrent keyed store of slidegate limits: millions of keys in a
//! memory budget fixed when the store is built.
//!
//! [`KeyedLimiter`] limits every key to one policy with a clock;
//! [`Store`] is the map underneath, which takes the policy and the time on
//! every call. Keys are any [`Key`] (integers, addresses, `String`,
//! `Vec<u8>`, ...), looked up by borrowed forms (`&str`, `&[u8]`) that
//! allocate only when a new key is stored.
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
//!   the one whose counts expire soonest among the 8 keys from the new
//!   key's home slot on (the one holding the least of the future). Every
//!   eviction is counted in [`Stats::evictions`]; a key dropped this way
//!   that was idle after all (the sweep had not reached it) is counted in
//!   [`Stats::reclaimed`] instead. An evicted key starts
//!   afresh on its next request; size the budget so that this is rare.
//! - One shard holds `1/shards` of the budget, so a shard can fill (and
//!   evict) a little before the whole store does.
//!
//! # Concurrency
//!
//! Any number of threads may share a store (`&Store` is `Sync`). Each
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
//! [`Store::check_many`] decides many independent keys at once: it
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
pub use state::{KeyState, Ring2, Ring8, Timed};
pub use store::{Budget, Group, Stats, Store, StoreError};
