//! The decision's span, `ratelimit.decide`, continued from the trace
//! context a request carries: W3C `traceparent` (and `tracestate`), or B3,
//! in its multi-header form (`x-b3-traceid`, `x-b3-spanid`,
//! `x-b3-sampled`, `x-b3-flags`, which Envoy's Zipkin tracer sends) or its
//! single `b3` header.
//!
//! The span is a `tracing` span of target [`DECISION_TARGET`], of kind
//! SERVER for `tracing-opentelemetry`, with the attributes
//! `ratelimit.domain`, `ratelimit.descriptors`, `ratelimit.store`,
//! `ratelimit.api` and, once decided, `ratelimit.outcome`. It is made only
//! when a subscriber is interested in that target (the binary's OTLP layer,
//! with `--otlp-endpoint`): otherwise the span is disabled by the callsite's
//! cached interest, and no header is read and nothing allocated.

use crate::metrics::{Api, Outcome};
use http::HeaderMap;
use opentelemetry::Context;
use opentelemetry::propagation::text_map_propagator::FieldIter;
use opentelemetry::propagation::{Extractor, Injector, TextMapCompositePropagator, TextMapPropagator};
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use std::sync::LazyLock;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The `tracing` target of the decision spans: a subscriber that wants
/// them enables it (and a log that does not want requests in it filters it
/// out: the span's fields are the request's).
pub const DECISION_TARGET: &str = "slidegate::decision";

/// W3C trace context, then B3: where a request carries both, W3C's wins
/// (a later propagator's context replaces an earlier one's).
static PROPAGATOR: LazyLock<TextMapCompositePropagator> = LazyLock::new(|| {
    TextMapCompositePropagator::new(vec![
        Box::new(B3Propagator::new()),
        Box::new(TraceContextPropagator::new()),
    ])
});

/// The trace context `headers` carry (W3C or B3), as the parent of a span
/// made here; an empty context when they carry none, or only malformed
/// ones.
pub fn extract(headers: &HeaderMap) -> Context {
    PROPAGATOR.extract(&Headers(headers))
}

/// Reads trace context from HTTP headers (gRPC metadata is HTTP headers).
struct Headers<'a>(&'a HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

/// The span of one decision; disabled (and free: no header read, nothing
/// allocated) when no subscriber wants [`DECISION_TARGET`].
#[derive(Debug)]
pub struct DecisionSpan(tracing::Span);

impl DecisionSpan {
    /// Opens the span of a decision of `api` on `descriptors` descriptors
    /// of `domain` (none for an ad-hoc key) in the store named `store`,
    /// its parent the trace context of `headers`.
    pub fn start(headers: &HeaderMap, api: Api, domain: Option<&str>, descriptors: usize, store: &'static str) -> Self {
        let span = tracing::info_span!(
            target: DECISION_TARGET,
            "ratelimit.decide",
            otel.kind = "server",
            otel.status_code = tracing::field::Empty,
            ratelimit.api = api.as_str(),
            ratelimit.domain = domain,
            ratelimit.descriptors = descriptors,
            ratelimit.store = store,
            ratelimit.outcome = tracing::field::Empty,
        );
        if !span.is_disabled() {
            // Fails only if no OpenTelemetry layer is installed: then the
            // span goes nowhere anyway.
            let _ = span.set_parent(extract(headers));
        }
        DecisionSpan(span)
    }

    /// Whether no subscriber wants the span (so it records nothing).
    pub fn is_disabled(&self) -> bool {
        self.0.is_disabled()
    }

    /// Records the decision's outcome and closes the span.
    pub fn finish(self, outcome: Outcome) {
        if self.0.is_disabled() {
            return;
        }
        self.0.record("ratelimit.outcome", outcome_name(outcome));
        if outcome == Outcome::Unavailable {
            self.0.record("otel.status_code", "error");
        }
    }
}

/// The outcome as the span says it: Envoy's codes for a decision, gRPC's
/// status for a request that was not decided.
fn outcome_name(outcome: Outcome) -> &'static str {
    match outcome {
        Outcome::Ok => "OK",
        Outcome::OverLimit => "OVER_LIMIT",
        Outcome::Invalid => "INVALID_ARGUMENT",
        Outcome::Unavailable => "UNAVAILABLE",
    }
}

const B3_SINGLE: &str = "b3";
const B3_TRACE_ID: &str = "x-b3-traceid";
const B3_SPAN_ID: &str = "x-b3-spanid";
const B3_PARENT_SPAN_ID: &str = "x-b3-parentspanid";
const B3_SAMPLED: &str = "x-b3-sampled";
const B3_FLAGS: &str = "x-b3-flags";

/// B3 propagation (openzipkin/b3-propagation), both encodings.
///
/// Extraction reads the single `b3` header first, then the multi-header
/// form. Trace ids are 32 or 16 lower-hex characters (a 64-bit id is
/// padded to 128 bits with zeros), span ids 16, neither all zeros; the
/// sampling state is `1`, `0` or `d` (debug, taken as sampled), or absent
/// (deferred: the decision is ours, and the default sampler samples), with
/// `true`/`false` also taken in `x-b3-sampled`, and `x-b3-flags: 1` meaning
/// debug. `b3: 0` alone denies: the context says "not sampled", so no span
/// of the request is recorded. Anything malformed is ignored, as if absent.
///
/// Injection writes the single `b3` header.
#[derive(Debug)]
pub struct B3Propagator {
    fields: [String; 6],
}

impl Default for B3Propagator {
    fn default() -> Self {
        B3Propagator::new()
    }
}

/// A sampling state of B3.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sampling {
    Accept,
    Deny,
    Deferred,
}

impl B3Propagator {
    /// The propagator.
    pub fn new() -> Self {
        B3Propagator {
            fields: [
                B3_SINGLE,
                B3_TRACE_ID,
                B3_SPAN_ID,
                B3_PARENT_SPAN_ID,
                B3_SAMPLED,
                B3_FLAGS,
            ]
            .map(str::to_owned),
        }
    }

    /// The span context of the `b3` header, `Err` if it is malformed and
    /// `Ok(None)` if absent.
    fn single(extractor: &dyn Extractor) -> Result<Option<SpanContext>, ()> {
        let Some(value) = extractor.get(B3_SINGLE) else {
            return Ok(None);
        };
        let mut parts = value.trim().split('-');
        let first = parts.next().ok_or(())?;
        let Some(span) = parts.next() else {
            // The sampling state alone: `0` denies; `1` or `d` asks for a
            // sampled trace of which there is no id yet (ours, then).
            return match sampling(first, false)? {
                Sampling::Deny => Ok(Some(denied())),
                _ => Ok(None),
            };
        };
        let trace = trace_id(first)?;
        let span = span_id(span)?;
        let state = match parts.next() {
            Some(state) => sampling(state, false)?,
            None => Sampling::Deferred,
        };
        if let Some(parent) = parts.next() {
            span_id(parent)?;
        }
        if parts.next().is_some() {
            return Err(());
        }
        Ok(Some(remote(trace, span, state)))
    }

    /// The span context of the `x-b3-*` headers, `Err` if malformed and
    /// `Ok(None)` if absent.
    fn multi(extractor: &dyn Extractor) -> Result<Option<SpanContext>, ()> {
        let trace = extractor.get(B3_TRACE_ID);
        let span = extractor.get(B3_SPAN_ID);
        let debug = match extractor.get(B3_FLAGS).map(str::trim) {
            Some("1") => true,
            None | Some("0") => false,
            Some(_) => return Err(()),
        };
        let state = match extractor.get(B3_SAMPLED) {
            _ if debug => Sampling::Accept,
            Some(state) => sampling(state, true)?,
            None => Sampling::Deferred,
        };
        let (Some(trace), Some(span)) = (trace, span) else {
            // No ids: only a denial means something.
            return Ok((trace.is_none() && span.is_none() && state == Sampling::Deny).then(denied));
        };
        let (trace, span) = (trace_id(trace)?, span_id(span)?);
        if let Some(parent) = extractor.get(B3_PARENT_SPAN_ID) {
            span_id(parent)?;
        }
        Ok(Some(remote(trace, span, state)))
    }
}

/// A sampling state; with `lenient`, also `true` and `false` (which some
/// old tracers send in `x-b3-sampled`).
fn sampling(text: &str, lenient: bool) -> Result<Sampling, ()> {
    match text.trim() {
        "1" | "d" => Ok(Sampling::Accept),
        "0" => Ok(Sampling::Deny),
        "true" if lenient => Ok(Sampling::Accept),
        "false" if lenient => Ok(Sampling::Deny),
        _ => Err(()),
    }
}

/// Lower-case hexadecimal of `digits` characters exactly, as a number.
fn lower_hex(text: &str, digits: &[usize]) -> Result<u128, ()> {
    let text = text.trim();
    if !digits.contains(&text.len()) || !text.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return Err(());
    }
    u128::from_str_radix(text, 16).map_err(|_| ())
}

/// A trace id of 32 or 16 characters (padded to 128 bits), not all zeros.
fn trace_id(text: &str) -> Result<TraceId, ()> {
    match lower_hex(text, &[16, 32])? {
        0 => Err(()),
        n => Ok(TraceId::from(n)),
    }
}

/// A span id of 16 characters, not all zeros.
fn span_id(text: &str) -> Result<SpanId, ()> {
    match lower_hex(text, &[16])? {
        0 => Err(()),
        n => u64::try_from(n).map(SpanId::from).map_err(|_| ()),
    }
}

/// The context of a remote span; sampled unless denied (a deferred
/// decision is ours to make, and the default sampler samples).
fn remote(trace_id: TraceId, span_id: SpanId, state: Sampling) -> SpanContext {
    let flags = match state {
        Sampling::Deny => TraceFlags::default(),
        Sampling::Accept | Sampling::Deferred => TraceFlags::SAMPLED,
    };
    SpanContext::new(trace_id, span_id, flags, true, TraceState::default())
}

/// A denial without ids: a remote parent that is not sampled (and not
/// valid, so that a span under it starts a trace of its own, unrecorded).
fn denied() -> SpanContext {
    SpanContext::new(
        TraceId::INVALID,
        SpanId::INVALID,
        TraceFlags::default(),
        true,
        TraceState::default(),
    )
}

impl TextMapPropagator for B3Propagator {
    fn inject_context(&self, cx: &Context, injector: &mut dyn Injector) {
        let span = cx.span();
        let context = span.span_context();
        if context.is_valid() {
            let sampled = if context.is_sampled() { '1' } else { '0' };
            injector.set(
                B3_SINGLE,
                format!("{}-{}-{sampled}", context.trace_id(), context.span_id()),
            );
        } else if context.is_remote() && !context.is_sampled() {
            injector.set(B3_SINGLE, "0".to_owned());
        }
    }

    fn extract_with_context(&self, cx: &Context, extractor: &dyn Extractor) -> Context {
        // The single header first; a malformed one gives way to the
        // multi-header form.
        let found = match B3Propagator::single(extractor) {
            Ok(Some(context)) => Some(context),
            Ok(None) | Err(()) => B3Propagator::multi(extractor).ok().flatten(),
        };
        match found {
            Some(context) => cx.with_remote_span_context(context),
            None => cx.clone(),
        }
    }

    fn fields(&self) -> FieldIter<'_> {
        FieldIter::new(&self.fields)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
    const SPAN: &str = "00f067aa0ba902b7";

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.append(http::HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap());
        }
        map
    }

    /// The remote span context B3 finds in `pairs`, if any.
    fn b3(pairs: &[(&str, &str)]) -> Option<SpanContext> {
        let cx = B3Propagator::new().extract(&Headers(&headers(pairs)));
        cx.has_active_span().then(|| cx.span().span_context().clone())
    }

    fn sampled(trace: u128, span: u64) -> Option<SpanContext> {
        Some(SpanContext::new(
            TraceId::from(trace),
            SpanId::from(span),
            TraceFlags::SAMPLED,
            true,
            TraceState::default(),
        ))
    }

    const T: u128 = 0x4bf9_2f35_77b3_4da6_a3ce_929d_0e0e_4736;
    const S: u64 = 0x00f0_67aa_0ba9_02b7;

    #[test]
    fn multi_headers() {
        let ids = [("x-b3-traceid", TRACE), ("x-b3-spanid", SPAN)];
        for (extra, expect) in [
            (&[("x-b3-sampled", "1")][..], sampled(T, S)),
            (&[("x-b3-sampled", "true")], sampled(T, S)),
            (
                &[("x-b3-sampled", "1"), ("x-b3-parentspanid", "0000000000000001")],
                sampled(T, S),
            ),
            (&[("x-b3-flags", "1"), ("x-b3-sampled", "0")], sampled(T, S)),
            // Deferred: ours to decide, and we sample.
            (&[], sampled(T, S)),
        ] {
            let pairs: Vec<_> = ids.iter().chain(extra).copied().collect();
            assert_eq!(b3(&pairs), expect, "{pairs:?}");
        }
        let denied = b3(&[("x-b3-traceid", TRACE), ("x-b3-spanid", SPAN), ("x-b3-sampled", "0")]).unwrap();
        assert!(denied.is_valid() && !denied.is_sampled() && denied.is_remote());
        assert_eq!(denied.trace_id(), TraceId::from(T));
    }

    #[test]
    fn sixty_four_bit_trace_ids_are_padded() {
        assert_eq!(
            b3(&[
                ("x-b3-traceid", "a3ce929d0e0e4736"),
                ("x-b3-spanid", SPAN),
                ("x-b3-sampled", "1")
            ]),
            sampled(0xa3ce_929d_0e0e_4736, S)
        );
        assert_eq!(
            b3(&[("b3", &format!("a3ce929d0e0e4736-{SPAN}-1"))]),
            sampled(0xa3ce_929d_0e0e_4736, S)
        );
    }

    #[test]
    fn single_header() {
        for (value, expect) in [
            (format!("{TRACE}-{SPAN}-1"), sampled(T, S)),
            (format!("{TRACE}-{SPAN}-d"), sampled(T, S)),
            (format!("{TRACE}-{SPAN}"), sampled(T, S)),
            (format!("{TRACE}-{SPAN}-1-0000000000000001"), sampled(T, S)),
            ("1".to_owned(), None),
            ("d".to_owned(), None),
        ] {
            assert_eq!(b3(&[("b3", &value)]), expect, "{value}");
        }
        let not_sampled = b3(&[("b3", &format!("{TRACE}-{SPAN}-0"))]).unwrap();
        assert!(not_sampled.is_valid() && !not_sampled.is_sampled());
    }

    #[test]
    fn b3_zero_denies() {
        for pairs in [&[("b3", "0")][..], &[("x-b3-sampled", "0")]] {
            let denied = b3(pairs).unwrap();
            assert!(!denied.is_sampled() && denied.is_remote(), "{pairs:?}");
            assert!(!denied.is_valid(), "{pairs:?}");
        }
    }

    #[test]
    fn malformed_headers_are_ignored() {
        let zeros = "0".repeat(32);
        let long = format!("{TRACE}0");
        for value in [
            "",
            "-",
            "x",
            "2",
            &format!("{}-{SPAN}-1", TRACE.to_uppercase()),
            &format!("{TRACE}-{}-1", "0".repeat(16)),
            &format!("{zeros}-{SPAN}-1"),
            &format!("{long}-{SPAN}-1"),
            &format!("{TRACE}-{SPAN}-2"),
            &format!("{TRACE}-{SPAN}-true"),
            &format!("{TRACE}-{SPAN}-1-xyz"),
            &format!("{TRACE}-{SPAN}-1-{SPAN}-extra"),
            &format!("+{}-{SPAN}-1", &TRACE[1..]),
            &format!("{TRACE}-{SPAN}-1-"),
        ] {
            assert_eq!(b3(&[("b3", value)]), None, "b3: {value}");
        }
        for pairs in [
            &[("x-b3-traceid", TRACE)][..],
            &[("x-b3-spanid", SPAN)],
            &[("x-b3-traceid", "xyz"), ("x-b3-spanid", SPAN)],
            &[("x-b3-traceid", TRACE), ("x-b3-spanid", "00f067aa0ba902b")],
            &[("x-b3-traceid", TRACE), ("x-b3-spanid", SPAN), ("x-b3-sampled", "yes")],
            &[("x-b3-traceid", TRACE), ("x-b3-spanid", SPAN), ("x-b3-flags", "2")],
            &[
                ("x-b3-traceid", TRACE),
                ("x-b3-spanid", SPAN),
                ("x-b3-parentspanid", "nope"),
            ],
        ] {
            assert_eq!(b3(pairs), None, "{pairs:?}");
        }
    }

    #[test]
    fn the_single_header_comes_first_and_a_bad_one_gives_way() {
        let other = "11111111111111112222222222222222";
        let both = [
            ("b3", format!("{TRACE}-{SPAN}-1")),
            ("x-b3-traceid", other.to_owned()),
            ("x-b3-spanid", SPAN.to_owned()),
        ];
        let pairs: Vec<(&str, &str)> = both.iter().map(|(k, v)| (*k, v.as_str())).collect();
        assert_eq!(b3(&pairs), sampled(T, S));
        assert_eq!(
            b3(&[
                ("b3", "garbage"),
                ("x-b3-traceid", other),
                ("x-b3-spanid", SPAN),
                ("x-b3-sampled", "1")
            ]),
            sampled(0x1111_1111_1111_1111_2222_2222_2222_2222, S)
        );
    }

    #[test]
    fn injects_what_it_extracts() {
        let cx = Context::new().with_remote_span_context(sampled(T, S).unwrap());
        let mut out: HashMap<String, String> = HashMap::new();
        B3Propagator::new().inject_context(&cx, &mut out);
        assert_eq!(
            out.get("b3").map(String::as_str),
            Some(format!("{TRACE}-{SPAN}-1").as_str())
        );
        assert_eq!(b3(&[("b3", &out["b3"])]), sampled(T, S));
        let mut out: HashMap<String, String> = HashMap::new();
        B3Propagator::new().inject_context(&Context::new().with_remote_span_context(denied()), &mut out);
        assert_eq!(out.get("b3").map(String::as_str), Some("0"));
        assert!(B3Propagator::new().fields().any(|f| f == "x-b3-sampled"));
    }

    /// Under an OpenTelemetry layer the span is made, its parent the
    /// request's span (`tests/trace_off.rs` has the case without one).
    #[test]
    fn the_span_continues_the_requests_trace() {
        use opentelemetry::trace::TracerProvider as _;
        use tracing_subscriber::layer::SubscriberExt as _;
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
        let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("test"));
        let traced = headers(&[("x-b3-traceid", TRACE), ("x-b3-spanid", SPAN), ("x-b3-sampled", "1")]);
        tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), || {
            let span = DecisionSpan::start(&traced, Api::Grpc, Some("d"), 2, "redis");
            assert!(!span.is_disabled());
            let cx = span.0.context();
            let context = cx.span().span_context().clone();
            assert_eq!(context.trace_id(), TraceId::from(T));
            assert_ne!(context.span_id(), SpanId::from(S));
            assert!(context.is_sampled());
            span.finish(Outcome::OverLimit);
        });
    }

    #[test]
    fn w3c_wins_over_b3_and_either_alone_is_read() {
        let other = "11111111111111112222222222222222";
        let traceparent = format!("00-{TRACE}-{SPAN}-01");
        let b3_value = format!("{other}-{SPAN}-1");
        let cx = extract(&headers(&[("traceparent", &traceparent), ("b3", &b3_value)]));
        assert_eq!(cx.span().span_context().trace_id(), TraceId::from(T));
        let cx = extract(&headers(&[("traceparent", &traceparent), ("tracestate", "k=v")]));
        assert_eq!(cx.span().span_context().span_id(), SpanId::from(S));
        assert_eq!(cx.span().span_context().trace_state().get("k"), Some("v"));
        let cx = extract(&headers(&[("b3", &b3_value)]));
        assert_eq!(
            cx.span().span_context().trace_id(),
            TraceId::from(0x1111_1111_1111_1111_2222_2222_2222_2222)
        );
        assert!(!extract(&HeaderMap::new()).has_active_span());
    }
}
