//! What the layer builds and every clone of its service shares: the
//! [`LayerState`], and the names of its limits.

use crate::headers::LegacyReset;
use crate::key::{KeyExtractor, MissingKey};
use http::{HeaderValue, Request};
use slidegate_store::Quota;

/// One named limit, as the headers name it.
pub(crate) struct LimitName {
    pub(crate) name: String,
    /// `name` quoted for the headers.
    pub(crate) quoted: String,
}

pub(crate) type CostFn<B> = dyn Fn(&Request<B>) -> u64 + Send + Sync;
pub(crate) type ExemptFn<B> = dyn Fn(&Request<B>) -> bool + Send + Sync;

/// Everything the clones of a service share.
pub(crate) struct LayerState<B, St> {
    pub(crate) store: St,
    /// The limits' names, in the order of `quotas`.
    pub(crate) limits: Box<[LimitName]>,
    /// Made once, in `build`: a decision neither formats nor hashes them.
    pub(crate) quotas: Box<[Quota]>,
    pub(crate) extractor: Box<dyn KeyExtractor<B>>,
    pub(crate) cost: Option<Box<CostFn<B>>>,
    pub(crate) exempt: Option<Box<ExemptFn<B>>>,
    pub(crate) missing: MissingKey,
    pub(crate) headers_on_admitted: bool,
    /// `X-RateLimit-*`, with the flavour of `-Reset`; `None` for none.
    pub(crate) legacy_headers: Option<LegacyReset>,
    /// `RateLimit-Policy`, the same on every answer.
    pub(crate) policy_value: HeaderValue,
}
