//! The service seam: a request in the service's own terms (no wire type)
//! in, an answer out, counted in the metrics and traced ([`Service`]); and
//! what the front ends share around it ([`Shared`]). The front ends in
//! [`crate::api`] decide only through here; this is the one place a
//! request's domain is looked up (by the engine, whose answer says whether
//! the domain has a config).

use crate::engine::{AdHoc, Answer, Code, Engine, EngineError, Request};
use crate::headers::HeaderOptions;
use crate::metrics::{Api, ConnectionStats, Metrics, Outcome};
use crate::trace::DecisionSpan;
use http::HeaderMap;
use slidegate_core::Decision;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Decides requests: the engine, and the metrics and spans of each
/// decision.
pub struct Service {
    engine: Engine,
    metrics: Metrics,
}

impl Service {
    /// A service deciding with `engine`, counting in `metrics`.
    pub(crate) fn new(engine: Engine, metrics: Metrics) -> Self {
        Service { engine, metrics }
    }

    /// The engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The metrics.
    pub(crate) fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Decides `request` (called through `api`), counting it in the
    /// metrics, in a decision span continued from the trace context of
    /// `headers`.
    ///
    /// # Errors
    ///
    /// The engine's [`EngineError`].
    pub(crate) async fn decide(&self, api: Api, request: &Request, headers: &HeaderMap) -> Result<Answer, EngineError> {
        let span = DecisionSpan::start(
            headers,
            api,
            Some(&request.domain),
            request.descriptors.len(),
            self.engine.store_name(),
        );
        let start = Instant::now();
        let result = self.engine.decide(request).await;
        let outcome = outcome(&result);
        self.metrics.request(api, outcome, start.elapsed());
        span.finish(outcome);
        if let Ok(answer) = &result {
            let domain = if answer.configured {
                request.domain.as_str()
            } else {
                "unknown"
            };
            self.metrics.answer_request(domain, request, answer);
        }
        result
    }

    /// Decides an ad-hoc check (`POST /v1/check` with a key and a policy),
    /// counting it in the metrics, in a decision span continued from the
    /// trace context of `headers`; `start` is when the request was read.
    ///
    /// # Errors
    ///
    /// The engine's [`EngineError`].
    pub(crate) async fn decide_ad_hoc(
        &self,
        ad_hoc: &AdHoc,
        headers: &HeaderMap,
        start: Instant,
    ) -> Result<Decision, EngineError> {
        let span = DecisionSpan::start(headers, Api::AdHoc, None, 1, self.engine.store_name());
        let result = self.engine.decide_ad_hoc(ad_hoc).await;
        let outcome = match &result {
            Ok(d) if d.allowed() => Outcome::Ok,
            Ok(_) => Outcome::OverLimit,
            Err(e) if e.is_invalid() => Outcome::Invalid,
            Err(_) => Outcome::Unavailable,
        };
        self.metrics.request(Api::AdHoc, outcome, start.elapsed());
        span.finish(outcome);
        result
    }

    /// Counts a request refused before it reached the engine (its body
    /// did not parse).
    pub(crate) fn invalid(&self, api: Api) {
        self.metrics.request(api, Outcome::Invalid, Duration::ZERO);
    }
}

/// The outcome of a request for the metrics.
pub(crate) fn outcome(result: &Result<Answer, EngineError>) -> Outcome {
    match result {
        Ok(answer) if answer.overall == Code::OverLimit => Outcome::OverLimit,
        Ok(_) => Outcome::Ok,
        Err(e) if e.is_invalid() => Outcome::Invalid,
        Err(_) => Outcome::Unavailable,
    }
}

/// What the HTTP and gRPC front ends share: the service, the answers'
/// header options, the bodies' limits, the admin token, the health flags,
/// and the connection layer's counts for `/metrics`. Built by
/// `crate::server`, which starts the front ends around it.
pub struct Shared {
    pub(crate) service: Service,
    pub(crate) grpc_headers: HeaderOptions,
    pub(crate) http_headers: HeaderOptions,
    pub(crate) body_limit: usize,
    pub(crate) body_timeout: Duration,
    pub(crate) admin_token: Option<Box<[u8]>>,
    /// The server is draining: `/readyz` answers 503.
    pub(crate) draining: AtomicBool,
    /// Redis does not answer and readiness requires it: `/readyz` answers
    /// 503.
    pub(crate) redis_down: AtomicBool,
    /// Not ready while the config in force has no domain
    /// (`Options::ready_requires_config`).
    pub(crate) requires_config: bool,
    /// Not ready until the xDS client has applied its first snapshot
    /// (`XdsOptions::wait_for_first_snapshot`).
    pub(crate) awaiting_xds: AtomicBool,
    /// The open connections and calls in flight of both front ends.
    pub(crate) connections: Arc<dyn ConnectionStats>,
}

impl Shared {
    /// The engine.
    pub fn engine(&self) -> &Engine {
        self.service.engine()
    }

    /// Whether the server is draining (stopping: health NOT_SERVING).
    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// Why the server is not ready to take traffic (`/readyz` 503, gRPC
    /// health NOT_SERVING), `None` when it is: it is draining, Redis does
    /// not answer (with `Options::ready_requires_redis`), or no config
    /// with a domain has loaded (with `Options::ready_requires_config`), or
    /// the xDS client waits for its first snapshot.
    pub fn not_ready(&self) -> Option<&'static str> {
        if self.draining() {
            Some("the server is draining: it stops soon")
        } else if self.redis_down.load(Ordering::Relaxed) {
            Some("Redis does not answer: decisions follow the failure policy until it does")
        } else {
            self.config_pending()
        }
    }

    /// Why the config is not there yet (`/healthcheck` 503), `None` when
    /// it is: the xDS client waits for its first snapshot, or no config
    /// with a domain has loaded (with `Options::ready_requires_config`).
    pub(crate) fn config_pending(&self) -> Option<&'static str> {
        if self.awaiting_xds.load(Ordering::Relaxed) {
            Some(NO_XDS_SNAPSHOT_YET)
        } else if self.lacks_config() {
            Some(NO_CONFIG_YET)
        } else {
            None
        }
    }

    /// Whether readiness waits for a config and none with a domain is in
    /// force.
    pub(crate) fn lacks_config(&self) -> bool {
        self.requires_config && self.engine().config().domains().next().is_none()
    }

    /// The metrics in text form.
    pub fn metrics_text(&self) -> String {
        let metrics = self.service.metrics();
        metrics.connections(&self.connections.connection_stats());
        metrics.render(&self.engine().stats(), self.engine().shared_store())
    }
}

/// Why a server that waits for a config is not ready.
pub(crate) const NO_CONFIG_YET: &str =
    "no config with a domain has loaded yet (--ready-requires-config, HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED)";

/// Why a server whose xDS client waits for its first snapshot is not
/// ready.
pub(crate) const NO_XDS_SNAPSHOT_YET: &str =
    "no config snapshot has come from the xDS server yet (FORCE_START_WITHOUT_INITIAL_CONFIG is off)";
