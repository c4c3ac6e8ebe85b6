//! Helpers shared by the store's test binaries (`it` and `flood`).

use slidegate_memory::Stats;

/// Every new key ever decided is held, was evicted, was reclaimed, or was
/// kept in the summary of evicted keys alone (`Stats::summarised`).
pub(crate) fn accounts_for(stats: Stats, stored: u64) {
    assert_eq!(
        stats.keys as u64 + stats.evictions + stats.reclaimed + stats.summarised,
        stored,
        "{stats:?}"
    );
    assert!(stats.keys <= stats.capacity, "{stats:?}");
}
