//! The error shared by the hybrid limiter and the hybrid store:
//! [`StaleSyncs`].

use std::time::Duration;

/// The syncs of a [`HybridStore`](crate::HybridStore) have failed for
/// longer than [`stale_after`](crate::HybridOptions::stale_after): the
/// source of its
/// [`StoreError::Unavailable`](slidegate_store::StoreError::Unavailable).
#[derive(Debug, thiserror::Error)]
#[error("the syncs with Redis have failed for longer than {0:?}")]
pub struct StaleSyncs(pub Duration);
