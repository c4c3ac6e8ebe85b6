//! The layer and its builder.

use crate::headers::{LegacyReset, valid_name};
use crate::key::{KeyExtractor, MissingKey};
use crate::layer_state::{CostFn, ExemptFn, LayerState, LimitName};
use crate::service::RateLimitService;
use http::Request;
use slidegate_core::{Clock, Policy};
use slidegate_memory::{Budget, MemoryStore};
use slidegate_store::{FailOver, FailurePolicy, Quota, Store};
use std::sync::Arc;

/// A bad limit given to [`RateLimitLayerBuilder`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LayerError {
    /// A limit's name is empty or not printable ASCII (it goes into the
    /// `RateLimit` headers).
    BadName(String),
    /// Two limits share a name.
    DuplicateName(String),
    /// No limit was given.
    NoLimit,
    /// Two limits have the same policy: a store keeps a key's count per
    /// policy ([`Quota::tag`]), so they would be one count charged twice.
    /// Give one limit, or tell them apart by their figures.
    DuplicatePolicy(String),
    /// The store cannot keep this limit (its message says why).
    Unsupported(String),
}

impl std::fmt::Display for LayerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LayerError::BadName(name) => write!(f, "invalid limit name {name:?}: use printable ASCII"),
            LayerError::DuplicateName(name) => write!(f, "two limits are named {name:?}"),
            LayerError::NoLimit => write!(
                f,
                "a rate limit layer needs at least one limit (and a store: `limit` makes the in-memory one)"
            ),
            LayerError::DuplicatePolicy(name) => write!(
                f,
                "limit {name:?} has the same policy as another limit: a store would count them as one"
            ),
            LayerError::Unsupported(why) => write!(f, "{why}"),
        }
    }
}

impl std::error::Error for LayerError {}

/// Builds a [`RateLimitLayer`] over the store `St`.
pub struct RateLimitLayerBuilder<B, St = MemoryStore> {
    /// `None` until the first [`limit`](RateLimitLayerBuilder::limit)
    /// makes the in-memory store.
    store: Option<St>,
    limits: Vec<(LimitName, Policy)>,
    extractor: Box<dyn KeyExtractor<B>>,
    cost: Option<Box<CostFn<B>>>,
    exempt: Option<Box<ExemptFn<B>>>,
    missing: MissingKey,
    headers_on_admitted: bool,
    legacy_headers: bool,
    legacy_reset: LegacyReset,
    error: Option<LayerError>,
}

impl<B, C: Clock + Send + Sync> RateLimitLayerBuilder<B, MemoryStore<C>> {
    /// Adds a limit named `name` (it names the limit in the `RateLimit`
    /// headers), counted per key in the layer's in-memory store.
    ///
    /// The first call makes that store, on `clock`, with `budget` for the
    /// default algorithm's windows (sliding windows of up to 8 buckets) and
    /// as much again for every other policy
    /// ([`MemoryStore::with_clock`]`(budget, budget, clock)`). Every limit
    /// of the layer lives in that one store, so that a request is decided
    /// on all of them under one lock: **later calls' `clock` and `budget`
    /// are ignored**. Size the first budget for every limit (each limit
    /// holds its own entry per key).
    pub fn limit(mut self, name: &str, policy: Policy, clock: C, budget: Budget) -> Self {
        if self.store.is_none() {
            self.store = Some(MemoryStore::with_clock(budget, budget, clock));
        }
        self.quota(name, policy)
    }
}

impl<B, St: Store> RateLimitLayerBuilder<B, St> {
    /// Adds a limit named `name` (it names the limit in the `RateLimit`
    /// headers), counted per key in the layer's store.
    pub fn quota(mut self, name: &str, policy: Policy) -> Self {
        if !valid_name(name) {
            self.error.get_or_insert(LayerError::BadName(name.to_owned()));
        } else if self.limits.iter().any(|(l, _)| l.name == name) {
            self.error.get_or_insert(LayerError::DuplicateName(name.to_owned()));
        }
        self.limits.push((
            LimitName {
                name: name.to_owned(),
                quoted: crate::headers::sf_string(name),
            },
            policy,
        ));
        self
    }

    /// The cost of a request (1 if not set).
    pub fn cost(mut self, cost: impl Fn(&Request<B>) -> u64 + Send + Sync + 'static) -> Self {
        self.cost = Some(Box::new(cost));
        self
    }

    /// Requests for which `exempt` is true pass unlimited and uncounted.
    pub fn exempt(mut self, exempt: impl Fn(&Request<B>) -> bool + Send + Sync + 'static) -> Self {
        self.exempt = Some(Box::new(exempt));
        self
    }

    /// What to do with a request that yields no key ([`MissingKey::Refuse`]
    /// by default).
    pub fn missing_key(mut self, rule: MissingKey) -> Self {
        self.missing = rule;
        self
    }

    /// Whether admitted responses carry the `RateLimit` headers too (yes
    /// by default).
    pub fn headers_on_admitted(mut self, on: bool) -> Self {
        self.headers_on_admitted = on;
        self
    }

    /// Whether responses also carry `X-RateLimit-Limit`, `-Remaining` and
    /// `-Reset` for the limit with the least remaining (no by default).
    pub fn legacy_headers(mut self, on: bool) -> Self {
        self.legacy_headers = on;
        self
    }

    /// How `X-RateLimit-Reset` is written: a delay in seconds
    /// ([`LegacyReset::DelaySeconds`], the default) or a Unix time.
    pub fn legacy_reset(mut self, flavour: LegacyReset) -> Self {
        self.legacy_reset = flavour;
        self
    }

    /// What the layer does when its store cannot answer (an outage: a
    /// timeout or a connection failure), by wrapping the store in a
    /// [`FailOver`]:
    ///
    /// - [`FailurePolicy::Open`]: the request passes, counted nowhere and
    ///   **without** `RateLimit` headers (there are no figures to show).
    /// - [`FailurePolicy::Closed`]: the request is refused as over the limit:
    ///   `429` (gRPC: `RESOURCE_EXHAUSTED`) with `Retry-After: 1` (the
    ///   [`FailOver`]'s retry of 100 ms, rounded up) and the `RateLimit`
    ///   headers at `r=0`.
    /// - [`FailurePolicy::Local`]: needs a local store; use
    ///   [`local_failover`](Self::local_failover). Given here it refuses
    ///   as `Closed` does.
    ///
    /// Without a failure policy (the default) any store error is answered
    /// `503 Service Unavailable` with a `temporary-reduced-capacity`
    /// problem (gRPC: `UNAVAILABLE`); so are, with one, the errors that are
    /// not outages (a key the store refuses to hold, a limit it cannot
    /// keep). The wrapper counts its decisions by source
    /// ([`FailOver::failover_stats`], through [`RateLimitLayer::store`]).
    pub fn failure_policy(self, policy: FailurePolicy) -> RateLimitLayerBuilder<B, FailOver<St>> {
        self.map_store(|store| FailOver::new(store, policy))
    }

    /// [`FailurePolicy::Local`]: on an outage of the store, decide in
    /// `local` (an in-memory store of this process, such as
    /// `MemoryStore::new(Budget::bytes(16 << 20))`) on each limit divided
    /// by `instances`, the number of replicas sharing the limit. Answers
    /// are then as the local store decides, headers included.
    pub fn local_failover<L: Store>(self, instances: u64, local: L) -> RateLimitLayerBuilder<B, FailOver<St, L>> {
        self.map_store(|store| FailOver::local(store, instances, local))
    }

    fn map_store<T>(self, f: impl FnOnce(St) -> T) -> RateLimitLayerBuilder<B, T> {
        RateLimitLayerBuilder {
            store: self.store.map(f),
            limits: self.limits,
            extractor: self.extractor,
            cost: self.cost,
            exempt: self.exempt,
            missing: self.missing,
            headers_on_admitted: self.headers_on_admitted,
            legacy_headers: self.legacy_headers,
            legacy_reset: self.legacy_reset,
            error: self.error,
        }
    }

    /// The layer.
    ///
    /// # Errors
    ///
    /// [`LayerError`] for a bad or repeated limit name, no limit, or a
    /// limit the store cannot keep ([`Store::supports`]).
    pub fn build(self) -> Result<RateLimitLayer<B, St>, LayerError> {
        if let Some(error) = self.error {
            return Err(error);
        }
        let Some(store) = self.store.filter(|_| !self.limits.is_empty()) else {
            return Err(LayerError::NoLimit);
        };
        let (limits, policies): (Vec<LimitName>, Vec<Policy>) = self.limits.into_iter().unzip();
        let quotas: Box<[Quota]> = policies.into_iter().map(Quota::new).collect();
        for (i, quota) in quotas.iter().enumerate() {
            if quotas.iter().take(i).any(|q| q.tag() == quota.tag()) {
                let name = limits.get(i).map(|l| l.name.clone()).unwrap_or_default();
                return Err(LayerError::DuplicatePolicy(name));
            }
            store
                .supports(quota)
                .map_err(|e| LayerError::Unsupported(e.to_string()))?;
        }
        let names = limits
            .iter()
            .zip(quotas.iter())
            .map(|(l, q)| (l.quoted.as_str(), q.policy()));
        let policy_value = crate::headers::policy_value(names).ok_or_else(|| LayerError::BadName(String::new()))?;
        Ok(RateLimitLayer {
            shared: Arc::new(LayerState {
                store,
                limits: limits.into(),
                quotas,
                extractor: self.extractor,
                cost: self.cost,
                exempt: self.exempt,
                missing: self.missing,
                headers_on_admitted: self.headers_on_admitted,
                legacy_headers: self.legacy_headers.then_some(self.legacy_reset),
                policy_value,
            }),
        })
    }
}

/// A tower [`Layer`](tower::Layer) that rate-limits requests per key, in
/// the store `St` ([`MemoryStore`] by default; any
/// [`slidegate_store::Store`], such as Redis, through
/// [`RateLimitLayer::builder_with_store`]).
///
/// Every service it makes, and every clone of them, shares the same store
/// and limits through an `Arc`: with axum, where the router clones the
/// service for each request, all requests count against one budget. The
/// decision is made in `call`, never in `poll_ready`: one
/// [`Store::decide`] per request for all of the layer's limits, all or
/// nothing.
pub struct RateLimitLayer<B, St = MemoryStore> {
    shared: Arc<LayerState<B, St>>,
}

impl<B, St> Clone for RateLimitLayer<B, St> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<B: 'static, C: Clock + Send + Sync> RateLimitLayer<B, MemoryStore<C>> {
    /// A builder whose requests are keyed by `extractor`, counted in an
    /// in-memory store that the first
    /// [`limit`](RateLimitLayerBuilder::limit) makes.
    pub fn builder(extractor: impl KeyExtractor<B>) -> RateLimitLayerBuilder<B, MemoryStore<C>> {
        RateLimitLayerBuilder::new(extractor, None)
    }
}

impl<B: 'static, St: Store> RateLimitLayer<B, St> {
    /// A builder whose requests are keyed by `extractor`, counted in
    /// `store` (add limits with [`quota`](RateLimitLayerBuilder::quota)).
    pub fn builder_with_store(extractor: impl KeyExtractor<B>, store: St) -> RateLimitLayerBuilder<B, St> {
        RateLimitLayerBuilder::new(extractor, Some(store))
    }

    /// The store, for its figures ([`Store::stats`], or a [`FailOver`]'s
    /// [`failover_stats`](FailOver::failover_stats)).
    pub fn store(&self) -> &St {
        &self.shared.store
    }
}

impl<B: 'static, St> RateLimitLayerBuilder<B, St> {
    fn new(extractor: impl KeyExtractor<B>, store: Option<St>) -> Self {
        RateLimitLayerBuilder {
            store,
            limits: Vec::new(),
            extractor: Box::new(extractor),
            cost: None,
            exempt: None,
            missing: MissingKey::Refuse,
            headers_on_admitted: true,
            legacy_headers: false,
            legacy_reset: LegacyReset::DelaySeconds,
            error: None,
        }
    }
}

impl<S, B, St> tower::Layer<S> for RateLimitLayer<B, St> {
    type Service = RateLimitService<S, B, St>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimitService::new(inner, Arc::clone(&self.shared))
    }
}
