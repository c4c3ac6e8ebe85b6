//! The keyed store's tests: the shared conformance suite through the store
//! for every kind of state, threads on a manual clock, batches, idle
//! reclamation and errors. (The memory budget under a flood of keys is in
//! `tests/flood.rs`, its own binary with a counting allocator.)
//!
//! No test reads the wall clock: time is a `ManualClock` or the `now`
//! passed to the store.

#[path = "../common/mod.rs"]
mod common;

mod adversary;
mod batches;
mod budget;
mod conformance;
mod errors;
mod failover;
mod interface;
mod reclaim;
mod subjects;
mod threads;
