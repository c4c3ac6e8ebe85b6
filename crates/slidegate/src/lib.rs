//! Sliding-window rate limiting, as one dependency.
//!
//! `cargo add slidegate` gives the policies and their algorithms
//! (`slidegate-core`), the one store interface and its failure policy
//! (`slidegate-store`), the bounded in-memory store (`slidegate-memory`),
//! and with the default `tower` feature the tower/axum middleware
//! (`slidegate-tower`); the `redis` feature adds Redis, Redis Cluster,
//! Sentinel and the hybrid mode as stores (`slidegate-redis`).
//!
//! ```
//! use slidegate::{Algorithm, Budget, Decisions, ManualClock, MemoryStore, Policy, Quota, Store};
//! use std::time::Duration;
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let clock = ManualClock::new(0);
//! let store = MemoryStore::with_clock(Budget::keys(1_000_000), Budget::keys(1_000_000), clock);
//! // 5 per second and 100 per hour, decided together: all or nothing.
//! let quotas = [
//!     Quota::new(Policy::new(5, Duration::from_secs(1), Algorithm::DEFAULT)?),
//!     Quota::new(Policy::new(100, Duration::from_secs(3600), Algorithm::DEFAULT)?),
//! ];
//! let mut out = Decisions::new();
//! store.decide("alice", &quotas, 1, &mut out).await?;
//! assert!(out.iter().all(|d| d.allowed()));
//! assert_eq!(out[1].remaining(), 99);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```
#![forbid(unsafe_code)]

pub use slidegate_core::{
    Algorithm, AlgorithmSpec, Clock, Decision, ManualClock, MonotonicClock, Policy, PolicyError, SpecError, Weighting,
};
pub use slidegate_memory::{Budget, MemoryStore};
pub use slidegate_store::{
    Decisions, DynStore, FailOver, FailOverStats, FailurePolicy, Quota, Source, Store, StoreError, StoreStats,
};

/// The algorithms' states and the rest of the core.
pub mod core {
    pub use slidegate_core::*;
}

/// The store interface, in full.
pub mod store {
    pub use slidegate_store::*;
}

/// The in-memory keyed store, in full.
pub mod memory {
    pub use slidegate_memory::*;
}

/// The tower/axum middleware (feature `tower`, on by default).
#[cfg(feature = "tower")]
pub mod tower {
    pub use slidegate_tower::*;
}

#[cfg(feature = "tower")]
pub use slidegate_tower::RateLimitLayer;

/// Redis, Redis Cluster, Sentinel and the hybrid mode as stores (feature
/// `redis`).
#[cfg(feature = "redis")]
pub mod redis {
    pub use slidegate_redis::*;
}
