//! Envoy's `RateLimitService` over gRPC, and the conversions between the
//! wire types and the engine's, which `POST /json` shares.

use crate::config::Unit;
use crate::engine::{Answer, Code, Descriptor, EngineError, Override, Request, Status};
use crate::metrics::{Api, Outcome};
use crate::proto::envoy::config::core::v3::HeaderValue as WireHeader;
use crate::proto::envoy::r#type::v3::RateLimitUnit;
use crate::proto::rls::rate_limit_response::{self, DescriptorStatus, RateLimit, rate_limit};
use crate::proto::rls::rate_limit_service_server::{RateLimitService, RateLimitServiceServer};
use crate::proto::rls::{RateLimitRequest, RateLimitResponse};
use crate::server::Shared;
use http::HeaderMap;
use slidegate_core::Clock;
use slidegate_tower::{LegacyReset, LimitOutcome};
use std::sync::Arc;
use std::time::Instant;

/// Which rate-limit headers an answer carries.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeaderOptions {
    /// `RateLimit-Policy` and `RateLimit` (draft 10).
    pub draft: bool,
    /// `X-RateLimit-*`, with this flavour of `-Reset`.
    pub legacy: Option<LegacyReset>,
}

/// The engine's request from the wire's.
pub fn request_from_wire(wire: RateLimitRequest) -> Request {
    Request {
        domain: wire.domain,
        hits_addend: wire.hits_addend,
        descriptors: wire
            .descriptors
            .into_iter()
            .map(|d| Descriptor {
                entries: d.entries.into_iter().map(|e| (e.key, e.value)).collect(),
                limit: d.limit.map(|o| Override {
                    requests_per_unit: o.requests_per_unit,
                    unit: unit_from_wire(o.unit),
                }),
                hits_addend: d.hits_addend.map(|h| h.value),
            })
            .collect(),
    }
}

fn unit_from_wire(unit: i32) -> Option<Unit> {
    Some(match RateLimitUnit::try_from(unit).ok()? {
        RateLimitUnit::Second => Unit::Second,
        RateLimitUnit::Minute => Unit::Minute,
        RateLimitUnit::Hour => Unit::Hour,
        RateLimitUnit::Day => Unit::Day,
        RateLimitUnit::Week => Unit::Week,
        RateLimitUnit::Month => Unit::Month,
        RateLimitUnit::Year => Unit::Year,
        RateLimitUnit::Unknown => return None,
    })
}

fn unit_to_wire(unit: Option<Unit>) -> rate_limit::Unit {
    match unit {
        Some(Unit::Second) => rate_limit::Unit::Second,
        Some(Unit::Minute) => rate_limit::Unit::Minute,
        Some(Unit::Hour) => rate_limit::Unit::Hour,
        Some(Unit::Day) => rate_limit::Unit::Day,
        Some(Unit::Week) => rate_limit::Unit::Week,
        Some(Unit::Month) => rate_limit::Unit::Month,
        Some(Unit::Year) => rate_limit::Unit::Year,
        // A window that is not one unit (`window: 30s`) has no unit.
        None => rate_limit::Unit::Unknown,
    }
}

fn code_to_wire(code: Code) -> rate_limit_response::Code {
    match code {
        Code::Ok => rate_limit_response::Code::Ok,
        Code::OverLimit => rate_limit_response::Code::OverLimit,
    }
}

fn clamp_u32(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn status_to_wire(status: &Status) -> DescriptorStatus {
    let tightest = status.tightest.and_then(|j| status.applied.get(j));
    DescriptorStatus {
        code: code_to_wire(status.code).into(),
        current_limit: tightest.map(|a| RateLimit {
            name: a.name.clone(),
            requests_per_unit: clamp_u32(a.requests_per_unit),
            unit: unit_to_wire(a.unit).into(),
        }),
        limit_remaining: clamp_u32(status.remaining),
        duration_until_reset: status.until_reset.map(|d| pbjson_types::Duration {
            seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
            // Below 10⁹, so it fits.
            nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
        }),
        quota: None,
    }
}

/// The rate-limit headers of an answer: every limit that applied to any
/// descriptor.
pub(crate) fn answer_headers(answer: &Answer, options: HeaderOptions) -> HeaderMap {
    let mut headers = HeaderMap::new();
    if !options.draft && options.legacy.is_none() {
        return headers;
    }
    let limits: Vec<LimitOutcome<'_>> = answer
        .statuses
        .iter()
        .flat_map(|s| s.applied.iter())
        .filter_map(|a| {
            Some(LimitOutcome {
                name: &a.name,
                policy: a.policy.as_ref()?,
                decision: a.decision.as_ref()?,
            })
        })
        .collect();
    slidegate_tower::write_headers(&limits, options.legacy, &mut headers);
    if !options.draft {
        headers.remove(slidegate_tower::RATELIMIT_POLICY);
        headers.remove(slidegate_tower::RATELIMIT);
    }
    headers
}

/// The wire's response from the engine's answer.
pub fn answer_to_wire(answer: &Answer, options: HeaderOptions) -> RateLimitResponse {
    let response_headers_to_add = answer_headers(answer, options)
        .iter()
        .map(|(name, value)| WireHeader {
            key: name.as_str().to_owned(),
            value: String::from_utf8_lossy(value.as_bytes()).into_owned(),
            raw_value: Vec::new(),
        })
        .collect();
    RateLimitResponse {
        overall_code: code_to_wire(answer.overall).into(),
        statuses: answer.statuses.iter().map(status_to_wire).collect(),
        response_headers_to_add,
        ..Default::default()
    }
}

/// The outcome of a request for the metrics.
pub(crate) fn outcome(result: &Result<Answer, EngineError>) -> Outcome {
    match result {
        Ok(answer) if answer.overall == Code::OverLimit => Outcome::OverLimit,
        Ok(_) => Outcome::Ok,
        Err(EngineError::Invalid(_)) => Outcome::Invalid,
        Err(_) => Outcome::Unavailable,
    }
}

/// Decides a wire request, counting it in the metrics.
pub(crate) async fn decide<C: Clock>(shared: &Shared<C>, api: Api, request: &Request) -> Result<Answer, EngineError> {
    let start = Instant::now();
    let result = shared.engine.decide(request).await;
    shared.metrics.request(api, outcome(&result), start.elapsed());
    if let Ok(answer) = &result {
        let config = shared.engine.config();
        let domain = if config.domain(&request.domain).is_some() {
            request.domain.as_str()
        } else {
            "unknown"
        };
        shared.metrics.answer(domain, answer);
    }
    result
}

/// The gRPC service.
pub struct Grpc<C> {
    shared: Arc<Shared<C>>,
}

impl<C: Clock + Send + Sync + 'static> Grpc<C> {
    /// The tonic service for `shared`.
    pub(crate) fn service(shared: Arc<Shared<C>>) -> RateLimitServiceServer<Grpc<C>> {
        RateLimitServiceServer::new(Grpc { shared })
    }
}

#[tonic::async_trait]
impl<C: Clock + Send + Sync + 'static> RateLimitService for Grpc<C> {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        let request = request_from_wire(request.into_inner());
        match decide(&self.shared, Api::Grpc, &request).await {
            Ok(answer) => Ok(tonic::Response::new(answer_to_wire(&answer, self.shared.grpc_headers))),
            Err(e) => Err(grpc_status(e)),
        }
    }
}

/// A request that could not be decided, as gRPC says it: a bad request is
/// `INVALID_ARGUMENT`; a store that cannot count is `UNAVAILABLE`, never a
/// silent OK, so that Envoy's `failure_mode_deny` decides.
fn grpc_status(e: EngineError) -> tonic::Status {
    match e {
        EngineError::Invalid(message) => tonic::Status::invalid_argument(message),
        e @ EngineError::Unavailable(_) => tonic::Status::unavailable(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_map_to_grpc_codes() {
        let invalid = grpc_status(EngineError::Invalid("the domain is empty".to_owned()));
        assert_eq!(invalid.code(), tonic::Code::InvalidArgument);
        assert_eq!(invalid.message(), "the domain is empty");
        let down = grpc_status(EngineError::Unavailable("the store is full".to_owned()));
        assert_eq!(down.code(), tonic::Code::Unavailable);
        assert!(down.message().contains("the store is full"));
    }

    #[test]
    fn units_go_both_ways() {
        for (wire, unit) in [
            (RateLimitUnit::Second, Unit::Second),
            (RateLimitUnit::Minute, Unit::Minute),
            (RateLimitUnit::Hour, Unit::Hour),
            (RateLimitUnit::Day, Unit::Day),
            (RateLimitUnit::Week, Unit::Week),
            (RateLimitUnit::Month, Unit::Month),
            (RateLimitUnit::Year, Unit::Year),
        ] {
            assert_eq!(unit_from_wire(wire as i32), Some(unit));
            assert_eq!(unit_to_wire(Some(unit)).as_str_name(), wire.as_str_name());
        }
        assert_eq!(unit_from_wire(0), None);
        assert_eq!(unit_from_wire(99), None);
        assert_eq!(unit_to_wire(None), rate_limit::Unit::Unknown);
    }
}
