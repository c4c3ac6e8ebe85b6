//! Test support shared by slidegate's crates: the exact oracles, request
//! strategies and the conformance suite that every store passes, and a
//! counting allocator for memory budgets.

pub mod alloc;
