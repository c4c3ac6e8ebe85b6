//! Where the metrics listener listens: envoyproxy/ratelimit's Prometheus
//! endpoint (`USE_PROMETHEUS`, `PROMETHEUS_ADDR`, `PROMETHEUS_PATH`), as
//! Envoy Gateway scrapes it, on an HTTP listener of its own. Its answer is
//! [`crate::api`]'s.

use crate::net::listen::Endpoint;

/// The metrics listener: an HTTP listener of its own whose `GET <path>`
/// answers slidegate's metrics and envoyproxy/ratelimit's stats as Envoy
/// Gateway's default statsd mapping names them
/// (`ratelimit_service_rate_limit_{total_hits,over_limit,near_limit,within_limit,shadow_mode}`
/// with the labels `domain`, `key1` and, for a key of two levels or more,
/// `key2`; `ratelimit_service_config_load_success`,
/// `ratelimit_service_config_load_error`,
/// `ratelimit_service_total_requests{grpc_method}`,
/// `ratelimit_service_should_rate_limit_error{err_type}`), in the
/// Prometheus text format 0.0.4, counters without `_total`, as the statsd
/// exporter that envoyproxy/ratelimit embeds serves them. Every figure is
/// read when scraped, nothing is added to a request's work. Only that
/// built-in mapping is served: a mapper file of one's own
/// (`PROMETHEUS_MAPPER_YAML`) is not read. Served in the clear, over HTTP/1.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetricsListener {
    /// Where it listens (`PROMETHEUS_ADDR`: `:9090` by default in
    /// envoyproxy/ratelimit, `:19001` under Envoy Gateway, where `:PORT`
    /// means every address, `0.0.0.0:PORT`).
    pub addr: Endpoint,
    /// The path that answers (`PROMETHEUS_PATH`; default `/metrics`),
    /// starting with `/`.
    pub path: String,
}

impl MetricsListener {
    /// A listener on `addr` answering `/metrics`.
    pub fn new(addr: impl Into<Endpoint>) -> Self {
        MetricsListener {
            addr: addr.into(),
            path: "/metrics".to_owned(),
        }
    }

    /// The same listener answering `path` instead.
    #[must_use]
    pub fn path(mut self, path: impl Into<String>) -> Self {
        self.path = path.into();
        self
    }
}

/// A metrics path that does not start with `/`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the metrics path {path:?} must start with /")]
#[non_exhaustive]
pub struct MetricsPathError {
    /// The path refused.
    pub path: String,
}

impl MetricsPathError {
    pub(crate) fn new(path: &str) -> Self {
        MetricsPathError { path: path.to_owned() }
    }
}
