//! Test support shared by slidegate's crates: the exact oracles, request
//! strategies and the conformance suite that every store passes, and a
//! counting allocator for memory budgets.
//!
//! - [`oracle`]: exact references (a log of every event, the seed's
//!   counter, the textbook GCRA).
//! - [`figures`]: what a decision shows, to compare decisions built apart.
//! - [`strategy`]: the proptest configuration (`PROPTEST_CASES` overrides
//!   the number of cases) and the strategies the properties draw from.
//! - [`subject`]: the [`Subject`] trait, anything that decides the
//!   requests of one key, implemented here for the core's
//!   [`State`](slidegate_core::State); a store's crate implements it for a
//!   key of its store.
//! - [`suite`](mod@suite): the properties, written once as functions of a subject
//!   factory, and the [`suite!`] macro that instantiates them as proptests
//!   in the calling module (limitador's `test_with_all_storage_impls!`).
//! - [`stores`]: the suite of the store interface, run for every
//!   [`Store`](slidegate_store::Store) by [`store_suite!`].
//! - [`alloc`]: a counting global allocator.
//! - `redis` (with the `redis` feature): throw-away `redis-server`
//!   processes and clusters on free loopback ports.

pub mod alloc;
pub mod figures;
pub mod oracle;
#[cfg(feature = "redis")]
pub mod redis;
pub mod stores;
pub mod strategy;
pub mod subject;
pub mod suite;

pub use figures::Figures;
pub use subject::Subject;

#[doc(hidden)]
pub use proptest as __proptest;
