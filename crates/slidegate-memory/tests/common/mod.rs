//! Helpers shared by the store's test binaries (`it` and `flood`).

use slidegate_memory::Stats;

/// Every key ever stored is held, was evicted, or was reclaimed.
pub(crate) fn accounts_for(stats: Stats, stored: u64) {
    assert_eq!(
        stats.keys as u64 + stats.evictions + stats.reclaimed,
        stored,
        "{stats:?}"
    );
    assert!(stats.keys <= stats.capacity, "{stats:?}");
}
