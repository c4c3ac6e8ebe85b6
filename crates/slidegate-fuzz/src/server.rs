//! The service's inputs: the YAML config, the HTTP bodies, the protobuf
//! requests.

use axum::body::Body;
use http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use prost::Message;
use slidegate_core::ManualClock;
use slidegate_memory::Budget;
use slidegate_server::api::wire::{answer_to_wire, request_from_wire};
use slidegate_server::config::{Config, ConfigError, Domain};
use slidegate_server::engine::{Engine, InputLimits, Request as EngineRequest};
use slidegate_server::proto::rls::{RateLimitRequest, RateLimitResponse};
use slidegate_server::server::HeaderOptions;
use slidegate_server::server::{Options, http_router};
use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;
use tower::ServiceExt;

/// The file name the config target parses under.
const FILE: &str = "fuzz.yaml";

/// The config the HTTP and gRPC targets decide against.
fn config() -> &'static Config {
    static CONFIG: OnceLock<Config> = OnceLock::new();
    CONFIG.get_or_init(|| {
        let text = include_str!("../data/fuzz.yaml");
        let domain = Config::parse_domain("data/fuzz.yaml", text).unwrap_or_else(|e| panic!("{e}"));
        Config::from_domains(vec![domain]).unwrap_or_else(|e| panic!("{e}"))
    })
}

/// Small input limits, so that the fuzzer reaches them.
const LIMITS: InputLimits = InputLimits {
    descriptors: 8,
    entries: 4,
    text: 64,
};

/// A small budget of counters.
fn budget() -> Budget {
    Budget::keys(256)
}

/// A fresh engine on the fuzz config (small budgets: a fresh one per input
/// keeps inputs independent, so that a crash replays alone).
fn engine(clock: ManualClock) -> Engine {
    Engine::new(config().clone(), clock, budget(), budget(), LIMITS)
}

/// Runs `future` to the end on this thread's current-thread runtime.
fn block_on<F: Future>(future: F) -> F::Output {
    thread_local! {
        static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap_or_else(|e| panic!("no runtime: {e}"));
    }
    RUNTIME.with(|rt| rt.block_on(future))
}

/// Checks that a config error says where: the file it was given, a line
/// and column inside the text (from 1; the line after the last one is the
/// end of the input, where the YAML parser reports an unclosed
/// collection), and a message.
fn assert_positioned(e: &ConfigError, file: &str, text: &str) {
    assert_eq!(e.file, file, "{e}");
    // YAML's line breaks: `\r\n`, `\n` and a lone `\r`.
    let lines = 1 + text.replace("\r\n", "\n").matches(['\n', '\r']).count();
    assert!(e.line >= 1 && e.line <= lines + 1, "line {} of {lines}: {e}", e.line);
    assert!(e.column >= 1, "column {}: {e}", e.column);
    assert!(!e.message.is_empty(), "{e:?}");
    let shown = e.to_string();
    assert!(
        shown.starts_with(&format!("{file}:{}:{}: ", e.line, e.column)),
        "{shown}"
    );
}

/// Parses one domain, checking its error if it has one.
fn parse(file: &str, text: &str) -> Option<Domain> {
    match Config::parse_domain(file, text) {
        Ok(domain) => Some(domain),
        Err(e) => {
            assert_positioned(&e, file, text);
            None
        }
    }
}

/// Matches a few descriptors against `domain`: the first rule's own key
/// and value (which must match, unless an earlier rule of the same key
/// takes it), and entries made of the input's words.
fn match_some(domain: &Domain, words: &[&str]) {
    let mut lists: Vec<Vec<(&str, &str)>> = Vec::new();
    if let Some(rule) = domain.rules.first() {
        let value = rule.value.as_ref().map_or("v", |v| v.as_str());
        lists.push(vec![(rule.key.as_str(), value)]);
        if let Some(child) = rule.children.first() {
            let child_value = child.value.as_ref().map_or("w", |v| v.as_str());
            lists.push(vec![(rule.key.as_str(), value), (child.key.as_str(), child_value)]);
        }
    }
    for pair in words.chunks(2).take(8) {
        let (key, value) = (pair[0], pair.get(1).copied().unwrap_or(""));
        let mut entries = lists.last().cloned().unwrap_or_default();
        entries.push((key, value));
        lists.push(vec![(key, value)]);
        lists.push(entries);
    }
    for entries in &lists {
        if let Some(m) = domain.find(entries) {
            let key = m.counter_key(&domain.name, entries);
            assert!(key.len() >= domain.name.len(), "{key:?}");
            let _ = m.metric_key(entries);
        }
    }
}

/// The YAML config: the input (as lossy UTF-8) is one domain's file, or
/// two, split at the first NUL byte.
///
/// # Panics
///
/// When parsing panics, an error does not name the file, a line inside
/// the text and a column, or two domains of the same name make a config
/// (or two of different names do not).
pub fn config_yaml(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let (first, second) = match text.split_once('\0') {
        Some((a, b)) => (a, Some(b)),
        None => (&*text, None),
    };
    let words: Vec<&str> = text.split_whitespace().take(16).collect();
    let a = parse(FILE, first);
    if let Some(domain) = &a {
        match_some(domain, &words);
    }
    let Some(second) = second else { return };
    let b = parse("second.yaml", second);
    if let (Some(a), Some(b)) = (a, b) {
        let same = a.name == b.name;
        match Config::from_domains(vec![a, b]) {
            Ok(config) => {
                assert!(!same, "one domain twice made a config");
                assert_eq!(config.domains().count(), 2);
            }
            Err(e) => {
                assert!(same, "{e}");
                assert_eq!(e.file, "<config>");
            }
        }
    }
}

/// The statuses an HTTP answer may have: 200 and 429 (decided), 400 (the
/// body is wrong), 413 (it is too large); never a 500 (the memory store
/// never fails, so never a 503 either).
fn assert_documented(status: StatusCode, path: &str, body: &[u8]) {
    let expected: &[u16] = if path == "/v1/reset" {
        &[200, 400, 413]
    } else {
        &[200, 400, 413, 429]
    };
    assert!(
        expected.contains(&status.as_u16()),
        "{path} answered {status} to {:?}",
        String::from_utf8_lossy(body)
    );
}

/// The admin token the HTTP target's service takes, and its resets send.
const ADMIN_TOKEN: &str = "fuzz-token";

/// The body size the HTTP target allows, small enough for the fuzzer to
/// pass it.
const BODY_LIMIT: usize = 1024;

/// `POST /json`, `/v1/check` and `/v1/reset` through the service's real
/// router, in-process, on a fresh engine with a manual clock. The first
/// byte picks the path (bits 0–1), whether `Content-Length` is sent (bit
/// 2) and how many seconds pass between the two sends (bits 4–7); the rest
/// is the body, sent twice so that counts build up.
///
/// # Panics
///
/// When the service panics, answers a status other than 200, 400, 413 or
/// 429 (no 429 from a reset), or answers a body that is not JSON.
pub fn json_request(data: &[u8]) {
    let Some((&head, body)) = data.split_first() else {
        return;
    };
    let path = match head & 3 {
        0 => "/json",
        1 | 3 => "/v1/check",
        _ => "/v1/reset",
    };
    let clock = ManualClock::new(1_000_000_000);
    let options = Options {
        body_limit: BODY_LIMIT,
        admin_token: Some(ADMIN_TOKEN.to_owned()),
        ..Options::default()
    };
    let router = http_router(engine(clock.clone()), &options);
    block_on(async {
        for _ in 0..2 {
            let mut request = Request::builder().method(Method::POST).uri(path);
            if head & 4 != 0 {
                request = request.header(http::header::CONTENT_LENGTH, body.len());
            }
            if path == "/v1/reset" {
                request = request.header(http::header::AUTHORIZATION, format!("Bearer {ADMIN_TOKEN}"));
            }
            let request = request
                .body(Body::from(body.to_vec()))
                .unwrap_or_else(|e| panic!("a request: {e}"));
            let response = router.clone().oneshot(request).await.unwrap_or_else(|e| match e {});
            let status = response.status();
            assert_documented(status, path, body);
            let answer = response
                .into_body()
                .collect()
                .await
                .unwrap_or_else(|e| panic!("the answer's body: {e}"))
                .to_bytes();
            if let Err(e) = serde_json::from_slice::<serde_json::Value>(&answer) {
                panic!("{path} answered {status} with a body that is not JSON ({e}): {answer:?}");
            }
            clock.advance(Duration::from_secs(u64::from(head >> 4)));
        }
    });
}

/// Whether the engine must refuse `request` as invalid: the rules of
/// [`Engine::decide`]'s documentation, written out again.
fn malformed(request: &EngineRequest) -> bool {
    let text = |s: &str| s.len() > LIMITS.text;
    request.domain.is_empty()
        || text(&request.domain)
        || request.descriptors.is_empty()
        || request.descriptors.len() > LIMITS.descriptors
        || request.descriptors.iter().any(|d| {
            d.entries.is_empty()
                || d.entries.len() > LIMITS.entries
                || d.entries.iter().any(|(k, v)| k.is_empty() || text(k) || text(v))
                || d.limit.is_some_and(|o| o.unit.is_none())
        })
}

/// A protobuf `RateLimitRequest` (the whole input) through the wire
/// conversion and [`Engine::decide`] on a fresh memory engine, three
/// times (twice at once, once a second later), and the answer back to the
/// wire.
///
/// # Panics
///
/// When anything panics, a malformed request is not refused as
/// [`EngineError::is_invalid`](slidegate_server::engine::EngineError::is_invalid) (or a well-formed one is), the memory store
/// fails, or an answer does not have one status per descriptor or does
/// not go back through protobuf.
pub fn grpc_request(data: &[u8]) {
    let Ok(wire) = RateLimitRequest::decode(data) else {
        return;
    };
    let request = request_from_wire(wire);
    let invalid = malformed(&request);
    let clock = ManualClock::new(1_000_000_000);
    let engine = engine(clock.clone());
    let options = HeaderOptions {
        draft: true,
        legacy: Some(slidegate_tower::LegacyReset::DelaySeconds),
        envoy: Some(slidegate_server::server::ResponseHeaderNames::default()),
    };
    block_on(async {
        for round in 0..3 {
            if round == 2 {
                clock.advance(Duration::from_secs(1));
            }
            match engine.decide(&request).await {
                Ok(answer) => {
                    assert!(!invalid, "decided a malformed request: {request:?}");
                    assert_eq!(answer.statuses.len(), request.descriptors.len());
                    let back = answer_to_wire(&request, &answer, &options, true);
                    let again = RateLimitResponse::decode(&*back.encode_to_vec())
                        .unwrap_or_else(|e| panic!("the answer does not decode: {e}"));
                    assert_eq!(again, back);
                }
                Err(e) if e.is_invalid() => {
                    let why = e.detail();
                    assert!(invalid, "refused a well-formed request ({why}): {request:?}");
                }
                Err(e) => panic!("the memory store failed: {e}"),
            }
        }
    });
}
