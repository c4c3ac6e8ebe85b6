#![doc = include_str!("../../../README.md")]
#![forbid(unsafe_code)]

pub use slidegate_core::{
    Algorithm, AlgorithmSpec, Clock, Decision, Limiter, ManualClock, MonotonicClock, Policy, PolicyError, SpecError,
    Weighting,
};
pub use slidegate_memory::{Budget, KeyedLimiter, MemoryStore};
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

/// The tower/axum/tonic middleware (feature `tower`, on by default), in
/// full; the layer, its builder and the key extractors are also at the
/// crate's root.
#[cfg(feature = "tower")]
pub mod tower {
    pub use slidegate_tower::*;
}

#[cfg(feature = "tower")]
pub use slidegate_tower::{
    ForwardedFor, GlobalKey, HeaderKey, KeyExtractor, LayerError, MissingKey, Network, NetworkError, PeerIp,
    RateLimitLayer, RateLimitLayerBuilder, RequestKey,
};

/// Redis, Redis Cluster, Sentinel and the hybrid mode as stores (feature
/// `redis`), in full; the stores and the options that build them are also
/// at the crate's root.
#[cfg(feature = "redis")]
pub mod redis {
    pub use slidegate_redis::*;
}

#[cfg(feature = "redis")]
pub use slidegate_redis::{HybridOptions, HybridStore, RedisConnectError, RedisOptions, RedisStore};

/// The guides of the repository's `docs/` folder, as pages of these docs.
/// Every Rust block in them (and in the README, the crate's front page) is
/// a doctest of this crate, compiled against `slidegate` alone
/// (`tests/doc_blocks.rs` holds every guide to it).
pub mod guide {
    #[doc = include_str!("../../../docs/algorithms.md")]
    pub mod algorithms {}

    #[doc = include_str!("../../../docs/library.md")]
    pub mod library {}

    #[doc = include_str!("../../../docs/service.md")]
    pub mod service {}

    #[doc = include_str!("../../../docs/operating.md")]
    pub mod operating {}

    #[doc = include_str!("../../../docs/from-envoyproxy-ratelimit.md")]
    pub mod from_envoyproxy_ratelimit {}

    #[doc = include_str!("../../../docs/envoy-gateway.md")]
    pub mod envoy_gateway {}

    #[doc = include_str!("../../../docs/rate-limit-quota.md")]
    pub mod rate_limit_quota {}

    #[doc = include_str!("../../../docs/deploying.md")]
    pub mod deploying {}

    #[doc = include_str!("../../../docs/simulator.md")]
    pub mod simulator {}

    #[doc = include_str!("../../../docs/benchmarks.md")]
    pub mod benchmarks {}
}
