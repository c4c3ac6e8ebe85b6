//! The layer and its builder.

use crate::headers::{LegacyReset, valid_name};
use crate::key::{KeyExtractor, MissingKey, RequestKey};
use crate::service::RateLimitService;
use http::{HeaderValue, Request};
use slidegate_core::{Clock, Policy};
use slidegate_memory::{Budget, KeyedLimiter};
use std::sync::Arc;

/// One named limit: a policy per key, in a keyed in-memory store.
pub(crate) struct Limit<C> {
    pub(crate) name: String,
    /// `name` quoted for the headers.
    pub(crate) quoted: String,
    pub(crate) limiter: KeyedLimiter<RequestKey, C>,
}

/// What to do when the store cannot answer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnStoreError {
    /// Refuse the request (`503`, a `temporary-reduced-capacity` problem).
    #[default]
    Refuse,
    /// Let the request through uncounted.
    Allow,
}

type CostFn<B> = dyn Fn(&Request<B>) -> u64 + Send + Sync;
type ExemptFn<B> = dyn Fn(&Request<B>) -> bool + Send + Sync;

/// Everything the clones of a service share.
pub(crate) struct Shared<B, C> {
    pub(crate) limits: Vec<Limit<C>>,
    pub(crate) extractor: Box<dyn KeyExtractor<B>>,
    pub(crate) cost: Option<Box<CostFn<B>>>,
    pub(crate) exempt: Option<Box<ExemptFn<B>>>,
    pub(crate) missing: MissingKey,
    pub(crate) on_error: OnStoreError,
    pub(crate) headers_on_admitted: bool,
    /// `X-RateLimit-*`, with the flavour of `-Reset`; `None` for none.
    pub(crate) legacy_headers: Option<LegacyReset>,
    /// `RateLimit-Policy`, the same on every answer.
    pub(crate) policy_value: HeaderValue,
}

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
}

impl std::fmt::Display for LayerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LayerError::BadName(name) => write!(f, "invalid limit name {name:?}: use printable ASCII"),
            LayerError::DuplicateName(name) => write!(f, "two limits are named {name:?}"),
            LayerError::NoLimit => write!(f, "a rate limit layer needs at least one limit"),
        }
    }
}

impl std::error::Error for LayerError {}

/// Builds a [`RateLimitLayer`].
pub struct RateLimitLayerBuilder<B, C> {
    limits: Vec<Limit<C>>,
    extractor: Box<dyn KeyExtractor<B>>,
    cost: Option<Box<CostFn<B>>>,
    exempt: Option<Box<ExemptFn<B>>>,
    missing: MissingKey,
    on_error: OnStoreError,
    headers_on_admitted: bool,
    legacy_headers: bool,
    legacy_reset: LegacyReset,
    error: Option<LayerError>,
}

impl<B, C: Clock> RateLimitLayerBuilder<B, C> {
    /// Adds a limit named `name` (it names the limit in the `RateLimit`
    /// headers), counted per key in its own store of `budget`.
    pub fn limit(mut self, name: &str, policy: Policy, clock: C, budget: Budget) -> Self {
        if !valid_name(name) {
            self.error.get_or_insert(LayerError::BadName(name.to_owned()));
        } else if self.limits.iter().any(|l| l.name == name) {
            self.error.get_or_insert(LayerError::DuplicateName(name.to_owned()));
        }
        self.limits.push(Limit {
            name: name.to_owned(),
            quoted: crate::headers::sf_string(name),
            limiter: KeyedLimiter::new(policy, clock, budget),
        });
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

    /// What to do when the store cannot answer ([`OnStoreError::Refuse`]
    /// by default).
    pub fn on_store_error(mut self, rule: OnStoreError) -> Self {
        self.on_error = rule;
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

    /// The layer.
    ///
    /// # Errors
    ///
    /// [`LayerError`] for a bad or repeated limit name, or no limit.
    pub fn build(self) -> Result<RateLimitLayer<B, C>, LayerError> {
        if let Some(error) = self.error {
            return Err(error);
        }
        if self.limits.is_empty() {
            return Err(LayerError::NoLimit);
        }
        let names = self.limits.iter().map(|l| (l.quoted.as_str(), l.limiter.policy()));
        let policy_value = crate::headers::policy_value(names).ok_or_else(|| LayerError::BadName(String::new()))?;
        Ok(RateLimitLayer {
            shared: Arc::new(Shared {
                limits: self.limits,
                extractor: self.extractor,
                cost: self.cost,
                exempt: self.exempt,
                missing: self.missing,
                on_error: self.on_error,
                headers_on_admitted: self.headers_on_admitted,
                legacy_headers: self.legacy_headers.then_some(self.legacy_reset),
                policy_value,
            }),
        })
    }
}

/// A tower [`Layer`](tower::Layer) that rate-limits requests per key.
///
/// Every service it makes, and every clone of them, shares the same limits
/// through an `Arc`: with axum, where the router clones the service for
/// each request, all requests count against one budget. The decision is
/// made in `call`, never in `poll_ready`.
pub struct RateLimitLayer<B, C> {
    shared: Arc<Shared<B, C>>,
}

impl<B, C> Clone for RateLimitLayer<B, C> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<B: 'static, C: Clock> RateLimitLayer<B, C> {
    /// A builder whose requests are keyed by `extractor`.
    pub fn builder(extractor: impl KeyExtractor<B>) -> RateLimitLayerBuilder<B, C> {
        RateLimitLayerBuilder {
            limits: Vec::new(),
            extractor: Box::new(extractor),
            cost: None,
            exempt: None,
            missing: MissingKey::Refuse,
            on_error: OnStoreError::Refuse,
            headers_on_admitted: true,
            legacy_headers: false,
            legacy_reset: LegacyReset::DelaySeconds,
            error: None,
        }
    }
}

impl<S, B, C> tower::Layer<S> for RateLimitLayer<B, C> {
    type Service = RateLimitService<S, B, C>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimitService::new(inner, Arc::clone(&self.shared))
    }
}
