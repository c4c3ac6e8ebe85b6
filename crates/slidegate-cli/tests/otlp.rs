//! `slidegate serve --otlp-endpoint` as a process, against an OTLP
//! receiver of the test's own on loopback: each decision is a span in the
//! trace the request carried (W3C `traceparent`, B3 multi-header, B3
//! single header), sent at shutdown at the latest; a collector that is not
//! there costs no decision, is logged once, and does not hold up the exit.

#![cfg(unix)]

mod common;

use common::{listening_on, next_line, request, request_with, serve_fails, serve_logging_with, terminate};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use slidegate_server::proto::descriptor::RateLimitDescriptor;
use slidegate_server::proto::descriptor::rate_limit_descriptor::Entry;
use slidegate_server::proto::rls::RateLimitRequest;
use slidegate_server::proto::rls::rate_limit_response::Code;
use slidegate_server::proto::rls::rate_limit_service_client::RateLimitServiceClient;
use std::collections::HashMap;
use std::sync::mpsc;
use std::time::Duration;

/// A span as received, with the service name of its resource.
struct Received {
    service: Option<String>,
    span: Span,
}

/// The receiver: every span of every export, down a channel.
struct Receiver(mpsc::Sender<Received>);

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        for resource_spans in request.into_inner().resource_spans {
            let service = resource_spans
                .resource
                .as_ref()
                .and_then(|r| r.attributes.iter().find(|a| a.key == "service.name"))
                .and_then(|a| text(a.value.as_ref()?.value.as_ref()?));
            for scope in resource_spans.scope_spans {
                for span in scope.spans {
                    let _ = self.0.send(Received {
                        service: service.clone(),
                        span,
                    });
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

/// An attribute's value as text (strings as they are, integers in decimal).
fn text(value: &Value) -> Option<String> {
    match value {
        Value::StringValue(s) => Some(s.clone()),
        Value::IntValue(n) => Some(n.to_string()),
        _ => None,
    }
}

fn attribute(span: &Span, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|a| a.key == key)
        .and_then(|a| text(a.value.as_ref()?.value.as_ref()?))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Starts the receiver on a free loopback port, on `runtime`; its address
/// and the spans it receives.
fn collector(runtime: &tokio::runtime::Runtime) -> (std::net::SocketAddr, mpsc::Receiver<Received>) {
    let (tx, spans) = mpsc::channel();
    let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let addr = listener.local_addr().unwrap();
    runtime.spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(Receiver(tx)))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );
    (addr, spans)
}

/// A config directory with domain `traced`: one request an hour per value
/// of `user`.
fn config(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("slidegate-otlp-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("traced.yaml"),
        "domain: traced\ndescriptors:\n  - key: user\n    rate_limit: { unit: hour, requests_per_unit: 1 }\n",
    )
    .unwrap();
    dir
}

fn json_body(user: &str) -> String {
    format!(r#"{{"domain":"traced","descriptors":[{{"entries":[{{"key":"user","value":"{user}"}}]}}]}}"#)
}

#[test]
fn decisions_are_spans_in_the_callers_trace() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (collector, spans) = collector(&runtime);
    let dir = config("spans");
    let endpoint = format!("http://{collector}");
    // A schedule far beyond the test: the spans can only come with the
    // flush at shutdown.
    let (child, lines) = serve_logging_with(
        &["--reload-every", "0s", "--config", dir.to_str().unwrap()],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_SERVICE_NAME", "slidegate-under-test"),
            ("OTEL_BSP_SCHEDULE_DELAY", "600000"),
        ],
    );
    let mut log = Vec::new();
    let (http, grpc) = next_line(&lines, &mut log, listening_on);

    // (a) gRPC with W3C trace context: admitted.
    let w3c_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let w3c_parent = "00f067aa0ba902b7";
    let code = runtime.block_on(async {
        let channel = common::channel(&grpc).await;
        let mut client = RateLimitServiceClient::new(channel);
        let mut call = tonic::Request::new(RateLimitRequest {
            domain: "traced".to_owned(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "user".to_owned(),
                    value: "ann-9f2".to_owned(),
                }],
                ..Default::default()
            }],
            hits_addend: 1,
        });
        let metadata = call.metadata_mut();
        metadata.insert(
            "traceparent",
            format!("00-{w3c_trace}-{w3c_parent}-01").parse().unwrap(),
        );
        metadata.insert("tracestate", "vendor=x".parse().unwrap());
        client.should_rate_limit(call).await.unwrap().into_inner().overall_code
    });
    assert_eq!(code, Code::Ok as i32);

    // (b) HTTP /json with Envoy's Zipkin headers (a 64-bit trace id):
    // admitted.
    let b3_trace = "a3ce929d0e0e4736";
    let b3_parent = "0102030405060708";
    let answer = request_with(
        &http,
        "POST",
        "/json",
        &format!(
            "x-b3-traceid: {b3_trace}\r\nx-b3-spanid: {b3_parent}\r\nx-b3-parentspanid: 1111111111111111\r\nx-b3-sampled: 1\r\n"
        ),
        &json_body("bob"),
    );
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");

    // (c) HTTP /json with the single `b3` header, ann again: over the limit.
    let single_trace = "80f198ee56343ba864fe8b2a57d3eff7";
    let single_parent = "e457b5a2e4d86bd1";
    let answer = request_with(
        &http,
        "POST",
        "/json",
        &format!("b3: {single_trace}-{single_parent}-1\r\n"),
        &json_body("ann-9f2"),
    );
    assert!(answer.starts_with("HTTP/1.1 429"), "{answer}");

    // (d) denied by B3, and (e) carrying no trace context: answered, the
    // first never recorded, the second a trace of its own.
    assert!(request_with(&http, "POST", "/json", "b3: 0\r\n", &json_body("cy")).starts_with("HTTP/1.1 200"));
    assert!(request(&http, "POST", "/v1/check", &json_body("dee")).starts_with("HTTP/1.1 200"));

    terminate(child);
    log.extend(lines.try_iter());
    let mut by_trace: HashMap<String, Received> = HashMap::new();
    while by_trace.len() < 4 {
        let received = spans
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("spans of {:?} only; log: {log:#?}", by_trace.keys()));
        by_trace.insert(hex(&received.span.trace_id), received);
    }
    for (trace, parent, outcome, user_api) in [
        (w3c_trace.to_owned(), w3c_parent, "OK", "grpc"),
        (format!("{:0>32}", b3_trace), b3_parent, "OK", "json"),
        (single_trace.to_owned(), single_parent, "OVER_LIMIT", "json"),
    ] {
        let received = by_trace
            .remove(&trace)
            .unwrap_or_else(|| panic!("no span in trace {trace}"));
        let span = &received.span;
        assert_eq!(hex(&span.parent_span_id), parent, "trace {trace}");
        assert_eq!(span.name, "ratelimit.decide");
        assert_eq!(span.kind, SpanKind::Server as i32);
        assert_eq!(received.service.as_deref(), Some("slidegate-under-test"));
        assert_eq!(attribute(span, "ratelimit.domain").as_deref(), Some("traced"));
        assert_eq!(
            attribute(span, "ratelimit.outcome").as_deref(),
            Some(outcome),
            "trace {trace}"
        );
        assert_eq!(attribute(span, "ratelimit.store").as_deref(), Some("memory"));
        assert_eq!(attribute(span, "ratelimit.descriptors").as_deref(), Some("1"));
        assert_eq!(attribute(span, "ratelimit.api").as_deref(), Some(user_api));
        if trace == w3c_trace {
            assert_eq!(span.trace_state, "vendor=x");
        }
    }
    // What is left is the request without context: a root span.
    let rest: Vec<&Received> = by_trace.values().collect();
    assert_eq!(rest.len(), 1);
    assert!(rest[0].span.parent_span_id.is_empty());
    assert_eq!(attribute(&rest[0].span, "ratelimit.api").as_deref(), Some("check"));
    // The denied request left nothing: no fifth span came with the flush.
    assert!(spans.try_recv().is_err());
    // And the log holds no span of a request.
    let rest_of_log: Vec<String> = lines.iter().collect();
    for line in log.iter().chain(&rest_of_log) {
        assert!(
            !line.contains("ratelimit.decide") && !line.contains("ann-9f2"),
            "{line}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_absent_collector_costs_no_decision_and_is_logged_once() {
    // A loopback port reserved and closed: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let endpoint = format!("http://127.0.0.1:{port}");
    let dir = config("absent");
    // Batches every 20 ms; every failed export said at debug, so that the
    // test can wait for several.
    let (child, lines) = serve_logging_with(
        &[
            "--reload-every",
            "0s",
            "--config",
            dir.to_str().unwrap(),
            "--otlp-endpoint",
            &endpoint,
        ],
        &[
            ("OTEL_BSP_SCHEDULE_DELAY", "20"),
            ("RUST_LOG", "info,slidegate::otlp=debug"),
        ],
    );
    let mut log = Vec::new();
    let (http, _) = next_line(&lines, &mut log, listening_on);
    let traced = |i: usize| {
        let answer = request_with(
            &http,
            "POST",
            "/json",
            &format!("traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-{:016x}-01\r\n", i + 1),
            &json_body(&format!("user-{i}")),
        );
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    };
    // Until three exports have failed: every decision answered meanwhile.
    let mut failed = 0;
    let mut sent = 0;
    while failed < 3 {
        traced(sent);
        sent += 1;
        assert!(sent < 10_000, "exports never failed: {log:#?}");
        log.extend(lines.try_iter());
        failed = log.iter().filter(|l| l.contains("span export failed")).count();
        if failed < 3 {
            // Wait for the next export's line, bounded; the requests go on
            // either way.
            if let Ok(line) = lines.recv_timeout(Duration::from_millis(200)) {
                log.push(line);
            }
            failed = log.iter().filter(|l| l.contains("span export failed")).count();
        }
    }
    // Decisions still answer; then SIGTERM ends it cleanly, the last flush
    // failing too.
    for i in 0..20 {
        traced(sent + i);
    }
    terminate(child);
    log.extend(lines.iter());
    let warnings: Vec<&String> = log
        .iter()
        .filter(|l| l.contains("cannot export spans to the OTLP collector"))
        .collect();
    assert_eq!(warnings.len(), 1, "{log:#?}");
    assert!(warnings[0].contains(&endpoint), "{}", warnings[0]);
    assert!(warnings[0].contains("WARN"), "{}", warnings[0]);
    assert!(!log.iter().any(|l| l.contains("panicked")), "{log:#?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_endpoint_that_cannot_work_stops_it_with_the_reason() {
    for (endpoint, reason) in [
        ("collector:4317", "must be http://HOST:PORT"),
        ("https://127.0.0.1:4317", "TLS is not built in"),
        ("http://[::1", "not a URL"),
    ] {
        let (code, stderr) = serve_fails(&["--otlp-endpoint", endpoint]);
        assert_eq!(code, Some(1), "{endpoint}: {stderr}");
        assert!(stderr.contains(reason), "{endpoint}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    }
}
