//! Envoy's `RateLimitService` over gRPC, and the conversions between the
//! wire types and the engine's, which `POST /json` shares.

use crate::config::Unit;
use crate::engine::{Answer, Code, Descriptor, EngineError, Override, Request, Status};
pub use crate::headers::{HeaderOptions, ResponseHeaderNames};
use crate::metrics::{Api, Outcome};
use crate::proto::envoy::config::core::v3::HeaderValue as WireHeader;
use crate::proto::envoy::r#type::v3::RateLimitUnit;
use crate::proto::rls::rate_limit_response::{self, DescriptorStatus, RateLimit, rate_limit};
use crate::proto::rls::rate_limit_service_server::{RateLimitService, RateLimitServiceServer};
use crate::proto::rls::{RateLimitRequest, RateLimitResponse};
use crate::shared::Shared;
use crate::trace::DecisionSpan;
use http::HeaderMap;
use prost::Message;
use slidegate_tower::LimitOutcome;
use std::sync::Arc;
use std::time::Instant;

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
            name: a.config_name.clone(),
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
pub(crate) fn answer_headers(answer: &Answer, options: &HeaderOptions) -> HeaderMap {
    let mut headers = HeaderMap::new();
    if let Some(names) = &options.envoy {
        envoy_headers(answer, names, &mut headers);
    }
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
                decision: a.shown()?,
            })
        })
        .collect();
    let mut fields = HeaderMap::new();
    slidegate_tower::write_headers(&limits, options.legacy, &mut fields);
    if !options.draft {
        fields.remove(slidegate_tower::RATELIMIT_POLICY);
        fields.remove(slidegate_tower::RATELIMIT);
    }
    if answer.overall == Code::Ok {
        // Passed (a limit in shadow mode or quota mode refused): nothing
        // to wait for.
        fields.remove(http::header::RETRY_AFTER);
    }
    if headers.is_empty() {
        // No envoy headers: the fields are the answer's, not copied.
        return fields;
    }
    headers.extend(fields);
    headers
}

/// envoyproxy/ratelimit's three headers, for the descriptor closest to its
/// limit: the one with the least remaining among those with a current
/// limit, or the last over its limit that is not in quota mode.
fn envoy_headers(answer: &Answer, names: &ResponseHeaderNames, headers: &mut HeaderMap) {
    let mut closest: Option<&Status> = None;
    let mut least = u64::from(u32::MAX);
    for status in &answer.statuses {
        if !status.limited() {
            continue;
        }
        let remaining = status.remaining.min(u64::from(u32::MAX));
        if status.code == Code::OverLimit && !status.quota_mode {
            closest = Some(status);
            least = 0;
        } else if remaining < least || closest.is_none() && remaining == least {
            closest = Some(status);
            least = remaining;
        }
    }
    let Some(status) = closest else { return };
    let Some(limit) = status.tightest.and_then(|j| status.applied.get(j)) else {
        return;
    };
    let reset = status
        .until_reset
        .map_or(0, |d| d.as_secs() + u64::from(d.subsec_nanos() > 0));
    headers.insert(
        names.limit.clone(),
        http::HeaderValue::from(clamp_u32(limit.requests_per_unit)),
    );
    headers.insert(
        names.remaining.clone(),
        http::HeaderValue::from(clamp_u32(status.remaining)),
    );
    headers.insert(names.reset.clone(), http::HeaderValue::from(reset));
}

/// The answer's dynamic metadata (`RESPONSE_DYNAMIC_METADATA`), as
/// envoyproxy/ratelimit writes it: the domain, each descriptor (its
/// entries as `key=value`, its own limit and hits), the request's hits,
/// and the `metadata` of the rules of the descriptors that passed, merged
/// (the first descriptor's value wins; maps are merged key by key).
pub fn dynamic_metadata(request: &Request, answer: &Answer) -> Option<pbjson_types::Struct> {
    use serde_json::{Map, Value, json};
    let descriptors: Vec<Value> = request
        .descriptors
        .iter()
        .map(|d| {
            let mut out = Map::new();
            let entries: Vec<Value> = d
                .entries
                .iter()
                .map(|(k, v)| Value::String(format!("{k}={v}")))
                .collect();
            out.insert("entries".into(), Value::Array(entries));
            if let Some(o) = d.limit {
                let unit = unit_to_wire(o.unit).as_str_name();
                out.insert(
                    "limit".into(),
                    Value::String(format!("requests_per_unit:{} unit:{unit}", o.requests_per_unit)),
                );
            }
            if let Some(h) = d.hits_addend {
                out.insert("hitsAddend".into(), json!(h));
            }
            Value::Object(out)
        })
        .collect();
    let mut fields = Map::new();
    fields.insert("domain".into(), Value::String(request.domain.clone()));
    fields.insert("descriptors".into(), Value::Array(descriptors));
    if request.hits_addend != 0 {
        fields.insert("hitsAddend".into(), json!(request.hits_addend));
    }
    let mut merged = Map::new();
    for status in answer.statuses.iter().filter(|s| s.code == Code::Ok) {
        if let Some(Value::Object(metadata)) = &status.metadata {
            merge_metadata(&mut merged, metadata);
        }
    }
    if !merged.is_empty() {
        fields.insert("metadata".into(), Value::Object(merged));
    }
    serde_json::from_value(Value::Object(fields)).ok()
}

/// Adds `src`'s keys that `dest` lacks; where both hold a map, merges them.
fn merge_metadata(
    dest: &mut serde_json::Map<String, serde_json::Value>,
    src: &serde_json::Map<String, serde_json::Value>,
) {
    use serde_json::Value;
    for (key, value) in src {
        match (dest.get_mut(key), value) {
            (Some(Value::Object(d)), Value::Object(s)) => merge_metadata(d, s),
            (Some(_), _) => {}
            (None, v) => {
                dest.insert(key.clone(), v.clone());
            }
        }
    }
}

/// The wire's response from the engine's answer to `request`; with
/// `metadata`, the answer's [`dynamic_metadata`].
pub fn answer_to_wire(
    request: &Request,
    answer: &Answer,
    options: &HeaderOptions,
    metadata: bool,
) -> RateLimitResponse {
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
        dynamic_metadata: if metadata {
            dynamic_metadata(request, answer)
        } else {
            None
        },
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

/// Decides a wire request, counting it in the metrics, in a decision span
/// continued from the trace context of `headers`.
pub(crate) async fn decide(
    shared: &Shared,
    api: Api,
    request: &Request,
    headers: &HeaderMap,
) -> Result<Answer, EngineError> {
    let span = DecisionSpan::start(
        headers,
        api,
        Some(&request.domain),
        request.descriptors.len(),
        shared.engine.store_name(),
    );
    let start = Instant::now();
    let result = shared.engine.decide(request).await;
    let outcome = outcome(&result);
    shared.metrics.request(api, outcome, start.elapsed());
    span.finish(outcome);
    if let Ok(answer) = &result {
        let config = shared.engine.config();
        let domain = if config.domain(&request.domain).is_some() {
            request.domain.as_str()
        } else {
            "unknown"
        };
        shared.metrics.answer_request(domain, request, answer);
    }
    result
}

/// The gRPC service.
pub struct Grpc {
    shared: Arc<Shared>,
}

impl Grpc {
    /// The tonic service for `shared`.
    pub(crate) fn service(shared: Arc<Shared>) -> RateLimitServiceServer<Grpc> {
        RateLimitServiceServer::new(Grpc { shared })
    }
}

#[tonic::async_trait]
impl RateLimitService for Grpc {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        let (metadata, _, message) = request.into_parts();
        respond(&self.shared, message, metadata.as_ref())
            .await
            .map(tonic::Response::new)
    }
}

/// `ShouldRateLimit`: the answer to `message`, whose request carried
/// `headers` (read for the trace context), or the status it fails with.
/// The one path of both the tonic service and `crate::grpc_routes`'s
/// unary calls.
pub(crate) async fn respond(
    shared: &Shared,
    message: RateLimitRequest,
    headers: &HeaderMap,
) -> Result<RateLimitResponse, tonic::Status> {
    let request = request_from_wire(message);
    match decide(shared, Api::Grpc, &request, headers).await {
        Ok(answer) => Ok(answer_to_wire(
            &request,
            &answer,
            &shared.grpc_headers,
            shared.engine.settings().dynamic_metadata,
        )),
        Err(e) => Err(grpc_status(e)),
    }
}

/// `ShouldRateLimit` answered by tonic's server (`tonic::server::Grpc`,
/// as the generated [`RateLimitServiceServer`] serves it, messages of at
/// most `limit` bytes, no compression taken) but with [`RequestCodec`]:
/// a request whose message does not decode, or whose body ends inside a
/// message (the error of `crate::grpc_routes`'s replayed body), is
/// `INVALID_ARGUMENT`; anything else tonic refuses is answered as tonic
/// answers it.
pub(crate) async fn tonic_unary<B>(
    shared: Arc<Shared>,
    limit: usize,
    request: http::Request<B>,
) -> http::Response<tonic::body::Body>
where
    B: hyper::body::Body + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send,
{
    let mut grpc = tonic::server::Grpc::new(RequestCodec).apply_max_message_size_config(Some(limit), None);
    grpc.unary(ShouldRateLimit(shared), request).await
}

/// `ShouldRateLimit` as tonic's server calls it: [`respond`].
struct ShouldRateLimit(Arc<Shared>);

impl tonic::server::UnaryService<RateLimitRequest> for ShouldRateLimit {
    type Response = RateLimitResponse;
    type Future = tonic::codegen::BoxFuture<tonic::Response<RateLimitResponse>, tonic::Status>;

    fn call(&mut self, request: tonic::Request<RateLimitRequest>) -> Self::Future {
        let shared = Arc::clone(&self.0);
        Box::pin(async move {
            let (metadata, _, message) = request.into_parts();
            respond(&shared, message, metadata.as_ref())
                .await
                .map(tonic::Response::new)
        })
    }
}

/// `ShouldRateLimit`'s messages as prost encodes and decodes them, but a
/// request that does not decode is the client's fault: `INVALID_ARGUMENT`
/// ([`undecodable`]), where prost's codec answers `INTERNAL`.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RequestCodec;

impl tonic::codec::Codec for RequestCodec {
    type Encode = RateLimitResponse;
    type Decode = RateLimitRequest;
    type Encoder = tonic_prost::ProstEncoder<RateLimitResponse>;
    type Decoder = RequestCodec;

    fn encoder(&mut self) -> Self::Encoder {
        tonic_prost::ProstEncoder::default()
    }

    fn decoder(&mut self) -> Self::Decoder {
        RequestCodec
    }
}

impl tonic::codec::Decoder for RequestCodec {
    type Item = RateLimitRequest;
    type Error = tonic::Status;

    fn decode(&mut self, buf: &mut tonic::codec::DecodeBuf<'_>) -> Result<Option<RateLimitRequest>, tonic::Status> {
        RateLimitRequest::decode(buf).map(Some).map_err(undecodable)
    }
}

/// A request message that does not decode as a `RateLimitRequest`:
/// `INVALID_ARGUMENT`, with prost's reason (which names no byte of the
/// message).
pub(crate) fn undecodable(e: prost::DecodeError) -> tonic::Status {
    tonic::Status::invalid_argument(format!("the request message is not a RateLimitRequest: {e}"))
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
