//! The in-memory store through the store interface: the conformance
//! suite every store passes.

use slidegate_memory::{Budget, MemoryStore};

slidegate_conformance::store_suite! {
    new: |clock| async move { MemoryStore::with_clock(Budget::keys(10_000), Budget::keys(10_000), clock) },
    cases: 256,
}
