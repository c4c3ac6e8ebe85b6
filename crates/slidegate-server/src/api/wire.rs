//! The wire conversions, both ways, between the front ends' messages and
//! the service's request and answer: Envoy's protobuf messages (which
//! `POST /json` carries as proto3 JSON) and the JSON bodies of
//! `POST /v1/check` and `POST /v1/reset`, and the rate-limit headers of an
//! answer.

use crate::api::problem::Problem;
use crate::config::Unit;
use crate::engine::{Answer, Code, Descriptor, Override, Request, Status};
use crate::headers::{HeaderOptions, ResponseHeaderNames};
use crate::proto::descriptor::RateLimitDescriptor;
use crate::proto::envoy::config::core::v3::HeaderValue as WireHeader;
use crate::proto::envoy::r#type::v3::RateLimitUnit;
use crate::proto::rls::rate_limit_response::{self, DescriptorStatus, RateLimit, rate_limit};
use crate::proto::rls::{RateLimitRequest, RateLimitResponse};
use http::HeaderMap;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use slidegate_core::duration::parse_positive_duration;
use slidegate_core::{AlgorithmSpec, Decision, Policy, Weighting};
use slidegate_tower::LimitOutcome;
use std::time::Duration;

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

/// The body of `/v1/check` and `/v1/reset`, read in one pass: either a
/// domain with descriptors (the descriptors in proto3 JSON), or an ad-hoc
/// key with its own policy.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckFields {
    #[serde(default)]
    domain: Option<String>,
    #[serde(default)]
    descriptors: Option<Vec<RateLimitDescriptor>>,
    #[serde(default, alias = "hitsAddend")]
    hits_addend: Option<u32>,
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    limit: Option<u64>,
    #[serde(default)]
    window: Option<String>,
    #[serde(default)]
    algorithm: Option<String>,
    #[serde(default)]
    buckets: Option<u32>,
    #[serde(default)]
    weighting: Option<String>,
    #[serde(default)]
    burst: Option<u64>,
    #[serde(default)]
    epsilon: Option<f64>,
    #[serde(default)]
    pub(crate) cost: Option<u64>,
}

/// An ad-hoc key with its own policy.
pub(crate) struct AdHocBody {
    pub(crate) key: String,
    limit: u64,
    window: String,
    algorithm: Option<String>,
    buckets: Option<u32>,
    weighting: Option<String>,
    burst: Option<u64>,
    epsilon: Option<f64>,
    pub(crate) cost: Option<u64>,
}

impl AdHocBody {
    pub(crate) fn policy(&self) -> Result<Policy, Problem> {
        let window = parse_positive_duration(&self.window)
            .map_err(|e| Problem::bad_request(format!("window: {:?}: {e}", self.window)))?;
        let weighting = match &self.weighting {
            Some(w) => Some(
                w.parse::<Weighting>()
                    .map_err(|e| Problem::bad_request(e.to_string()))?,
            ),
            None => None,
        };
        let spec = AlgorithmSpec {
            name: self.algorithm.as_deref(),
            buckets: self.buckets,
            weighting,
            burst: self.burst,
            epsilon: self.epsilon,
        };
        let algorithm = spec
            .algorithm(self.limit)
            .map_err(|e| Problem::bad_request(e.to_string()))?;
        Policy::new(self.limit, window, algorithm).map_err(|e| Problem::bad_request(e.to_string()))
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
}

/// The answer to an ad-hoc check.
#[derive(Serialize)]
pub(crate) struct DecisionBody<'a> {
    allowed: bool,
    key: &'a str,
    limit: u64,
    remaining: u64,
    reset_after_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    retry_after_ms: Option<u64>,
}

impl<'a> DecisionBody<'a> {
    pub(crate) fn new(key: &'a str, decision: &Decision) -> Self {
        DecisionBody {
            allowed: decision.allowed(),
            key,
            limit: decision.limit(),
            remaining: decision.remaining(),
            reset_after_ms: millis(decision.reset_after()),
            retry_after_ms: decision.retry_after().map(millis),
        }
    }
}

pub(crate) fn answer_json(answer: &Answer) -> Value {
    let statuses: Vec<Value> = answer
        .statuses
        .iter()
        .map(|s| {
            let limits: Vec<Value> = s
                .applied
                .iter()
                .map(|a| {
                    let mut limit = serde_json::Map::new();
                    limit.insert("name".into(), json!(a.name));
                    limit.insert("requests_per_unit".into(), json!(a.requests_per_unit));
                    limit.insert("unit".into(), json!(a.unit.map(crate::config::Unit::name)));
                    limit.insert(
                        "allowed".into(),
                        json!(a.decision.as_ref().is_some_and(Decision::allowed)),
                    );
                    if let Some(p) = &a.policy {
                        limit.insert("window_ms".into(), json!(millis(p.window())));
                        limit.insert("algorithm".into(), json!(p.algorithm().to_string()));
                    }
                    if let Some(d) = a.shown() {
                        limit.insert("remaining".into(), json!(d.remaining()));
                        limit.insert("reset_after_ms".into(), json!(millis(d.reset_after())));
                        if let Some(retry) = d.retry_after() {
                            limit.insert("retry_after_ms".into(), json!(millis(retry)));
                        }
                    }
                    Value::Object(limit)
                })
                .collect();
            json!({
                "code": if s.code == Code::Ok { "OK" } else { "OVER_LIMIT" },
                "remaining": s.remaining,
                "until_reset_ms": s.until_reset.map(millis),
                "limits": limits,
            })
        })
        .collect();
    json!({
        "allowed": answer.overall == Code::Ok,
        "overall_code": if answer.overall == Code::Ok { "OK" } else { "OVER_LIMIT" },
        "statuses": statuses,
    })
}

/// Which form a `/v1/check` or `/v1/reset` body has.
pub(crate) enum CheckBody {
    Descriptors(Request),
    AdHoc(AdHocBody),
}

pub(crate) fn parse_check_body(bytes: &[u8]) -> Result<CheckBody, Problem> {
    if bytes
        .iter()
        .find(|b| !b.is_ascii_whitespace())
        .is_some_and(|&b| b != b'{')
    {
        return Err(Problem::bad_request("the body must be a JSON object"));
    }
    // The fast path; on an error, parse again to name the field at fault.
    let fields: CheckFields = match serde_json::from_slice(bytes) {
        Ok(fields) => fields,
        Err(_) => return Err(check_body_error(bytes)),
    };

    let ad_hoc = [
        fields.key.is_some(),
        fields.limit.is_some(),
        fields.window.is_some(),
        fields.algorithm.is_some(),
        fields.buckets.is_some(),
        fields.weighting.is_some(),
        fields.burst.is_some(),
        fields.epsilon.is_some(),
        fields.cost.is_some(),
    ];
    match (fields.domain, fields.descriptors) {
        (Some(domain), descriptors) => {
            if ad_hoc.iter().any(|&given| given) {
                return Err(Problem::bad_request(
                    "a body with `domain` takes `descriptors` and `hits_addend`, not the ad-hoc `key`, `limit`, `window`, `algorithm`, `buckets`, `weighting`, `burst`, `epsilon` or `cost`",
                ));
            }
            Ok(CheckBody::Descriptors(request_from_wire(RateLimitRequest {
                domain,
                descriptors: descriptors.unwrap_or_default(),
                hits_addend: fields.hits_addend.unwrap_or(0),
            })))
        }
        (None, Some(_)) => Err(Problem::bad_request("`descriptors` needs a `domain`")),
        (None, None) => {
            if fields.hits_addend.is_some() {
                return Err(Problem::bad_request(
                    "`hits_addend` needs a `domain`; an ad-hoc key takes `cost`",
                ));
            }
            let missing = |name: &str| {
                Problem::bad_request(format!(
                    "the body must have `domain` and `descriptors`, or `key`, `limit` and `window`: `{name}` is missing"
                ))
            };
            Ok(CheckBody::AdHoc(AdHocBody {
                key: fields.key.ok_or_else(|| missing("key"))?,
                limit: fields.limit.ok_or_else(|| missing("limit"))?,
                window: fields.window.ok_or_else(|| missing("window"))?,
                algorithm: fields.algorithm,
                buckets: fields.buckets,
                weighting: fields.weighting,
                burst: fields.burst,
                epsilon: fields.epsilon,
                cost: fields.cost,
            }))
        }
    }
}

/// Why a `/v1/check` or `/v1/reset` body does not parse, naming the field.
fn check_body_error(bytes: &[u8]) -> Problem {
    let mut json = serde_json::Deserializer::from_slice(bytes);
    match serde_path_to_error::deserialize::<_, CheckFields>(&mut json) {
        Ok(_) => Problem::bad_request("the body is not JSON: characters follow the object"),
        Err(e) => {
            let path = e.path().to_string();
            let inner = e.into_inner();
            if inner.is_syntax() || inner.is_eof() {
                Problem::bad_request(format!("the body is not JSON: {inner}"))
            } else if path == "." {
                Problem::bad_request(format!("the body is not a check: {inner}"))
            } else {
                Problem::bad_request(format!("the body is not a check: `{path}`: {inner}"))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
