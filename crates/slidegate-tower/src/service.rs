//! The service: decides in `call`, answers refusals itself.

use crate::body::Body;
use crate::headers::{self, Fields, Outcome};
use crate::key::{MissingKey, RequestKey};
use crate::layer::{OnStoreError, Shared};
use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode};
use slidegate_core::{Clock, Decision};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

/// The problem type of a refusal (RFC 9457, registered by the rate-limit
/// headers draft).
const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";
/// The problem type of a store that cannot answer.
const REDUCED_CAPACITY: &str = "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity";

/// gRPC's status `RESOURCE_EXHAUSTED`.
const GRPC_RESOURCE_EXHAUSTED: u32 = 8;
/// gRPC's status `UNAVAILABLE`.
const GRPC_UNAVAILABLE: u32 = 14;

/// A service that rate-limits requests per key before passing them on; see
/// [`RateLimitLayer`](crate::RateLimitLayer).
pub struct RateLimitService<S, B, C> {
    inner: S,
    shared: Arc<Shared<B, C>>,
}

impl<S: Clone, B, C> Clone for RateLimitService<S, B, C> {
    fn clone(&self) -> Self {
        RateLimitService {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S, B, C> RateLimitService<S, B, C> {
    pub(crate) fn new(inner: S, shared: Arc<Shared<B, C>>) -> Self {
        RateLimitService { inner, shared }
    }
}

/// What `call` does with a request. It lives for one call, on the stack:
/// boxing the fields would cost an allocation per request.
#[allow(clippy::large_enum_variant)]
enum Verdict {
    /// Pass it on, adding these fields to the response.
    Pass(Option<Fields>),
    /// Answer it with a refusal.
    Refuse(Box<Refusal>),
}

/// A refusal, before it becomes a response of the inner service's body type.
struct Refusal {
    status: StatusCode,
    problem: &'static str,
    title: &'static str,
    detail: String,
    fields: Option<Fields>,
    /// The wait, for gRPC's retry pushback.
    retry_ms: Option<u64>,
    grpc_status: u32,
}

impl<B: 'static, C: Clock> Shared<B, C> {
    fn decide(&self, request: &Request<B>) -> Verdict {
        if self.exempt.as_ref().is_some_and(|exempt| exempt(request)) {
            return Verdict::Pass(None);
        }
        let key = match self.extractor.extract(request) {
            Some(key) => key,
            None => match &self.missing {
                MissingKey::Allow => return Verdict::Pass(None),
                MissingKey::Fallback(key) => key.clone(),
                MissingKey::Refuse => {
                    return Verdict::Refuse(Box::new(Refusal {
                        status: StatusCode::TOO_MANY_REQUESTS,
                        problem: QUOTA_EXCEEDED,
                        title: "Request cannot be satisfied as assigned quota has been exceeded",
                        detail: "the request carries no client key to count it under".to_owned(),
                        fields: None,
                        retry_ms: None,
                        grpc_status: GRPC_RESOURCE_EXHAUSTED,
                    }));
                }
            },
        };
        let cost = self.cost.as_ref().map_or(1, |cost| cost(request));
        // One limit, the common case, needs no list.
        if let [only] = self.limits.as_slice() {
            return match only.limiter.check(&key, cost) {
                Ok(decision) => self.verdict(&[Outcome {
                    name: &only.name,
                    quoted: &only.quoted,
                    policy: only.limiter.policy(),
                    decision,
                }]),
                Err(_) => self.store_error(),
            };
        }
        let Some(decisions) = self.decisions(&key, cost) else {
            return self.store_error();
        };
        let outcomes: Vec<Outcome<'_>> = self
            .limits
            .iter()
            .zip(decisions)
            .map(|(limit, decision)| Outcome {
                name: &limit.name,
                quoted: &limit.quoted,
                policy: limit.limiter.policy(),
                decision,
            })
            .collect();
        self.verdict(&outcomes)
    }

    /// What the store-error rule says.
    fn store_error(&self) -> Verdict {
        match self.on_error {
            OnStoreError::Allow => Verdict::Pass(None),
            OnStoreError::Refuse => Verdict::Refuse(Box::new(Refusal {
                status: StatusCode::SERVICE_UNAVAILABLE,
                problem: REDUCED_CAPACITY,
                title: "The rate limiter cannot count this request",
                detail: "the rate limit store refused the key".to_owned(),
                fields: None,
                retry_ms: None,
                grpc_status: GRPC_UNAVAILABLE,
            })),
        }
    }

    /// Pass or refuse, with the fields, given every limit's decision.
    fn verdict(&self, outcomes: &[Outcome<'_>]) -> Verdict {
        let allowed = outcomes.iter().all(|o| o.decision.allowed());
        if allowed && !self.headers_on_admitted {
            return Verdict::Pass(None);
        }
        let mut fields = Fields::new(&self.policy_value, outcomes, self.legacy_headers);
        if allowed {
            return Verdict::Pass(Some(fields));
        }
        let retry = headers::retry_after(outcomes);
        if let Some(secs) = retry {
            fields.retry_after(secs);
        }
        let retry_ms = outcomes
            .iter()
            .filter_map(|o| o.decision.retry_after())
            .map(|d| u64::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX))
            .max();
        let refused: Vec<&str> = outcomes
            .iter()
            .filter(|o| !o.decision.allowed())
            .map(|o| o.name)
            .collect();
        let detail = match retry {
            Some(secs) => format!("over the limit of {}; retry in {secs} s", refused.join(", ")),
            None => format!("the request costs more than the limit of {} allows", refused.join(", ")),
        };
        Verdict::Refuse(Box::new(Refusal {
            status: StatusCode::TOO_MANY_REQUESTS,
            problem: QUOTA_EXCEEDED,
            title: "Request cannot be satisfied as assigned quota has been exceeded",
            detail,
            fields: Some(fields),
            retry_ms,
            grpc_status: GRPC_RESOURCE_EXHAUSTED,
        }))
    }

    /// One decision per limit of several (one limit is decided directly),
    /// charging `cost` to every limit only if all admit it; `None` if a
    /// store could not answer.
    ///
    /// With several limits each is first asked how much it has left (a
    /// peek), then charged. A request racing another on the same key may
    /// find a limit spent between the two: it is then refused, and the
    /// limits charged before that one keep the charge.
    fn decisions(&self, key: &RequestKey, cost: u64) -> Option<Vec<Decision>> {
        let peeks: Vec<Decision> = self
            .limits
            .iter()
            .map(|l| l.limiter.check(key, 0).ok())
            .collect::<Option<_>>()?;
        let all_fit = peeks.iter().all(|p| cost <= p.remaining());
        let mut decisions = Vec::with_capacity(self.limits.len());
        for (limit, peek) in self.limits.iter().zip(peeks) {
            let refused_before = decisions.iter().any(|d: &Decision| !d.allowed());
            let decision = if all_fit && !refused_before {
                limit.limiter.check(key, cost).ok()?
            } else if cost <= peek.remaining() {
                // Not charged: it would admit, but another limit refuses.
                peek
            } else {
                // Refused, so not charged: its retry delay for this cost.
                limit.limiter.check(key, cost).ok()?
            };
            decisions.push(decision);
        }
        Some(decisions)
    }
}

impl Refusal {
    fn into_response<ResB>(self, grpc: bool) -> Response<Body<ResB>> {
        let mut headers = HeaderMap::new();
        if let Some(fields) = self.fields {
            fields.apply(&mut headers);
        }
        let (status, body) = if grpc {
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
            headers.insert(
                HeaderName::from_static("grpc-status"),
                HeaderValue::from(self.grpc_status),
            );
            if let Ok(message) = HeaderValue::from_str(&percent_encode(&self.detail)) {
                headers.insert(HeaderName::from_static("grpc-message"), message);
            }
            if let Some(ms) = self.retry_ms {
                headers.insert(HeaderName::from_static("grpc-retry-pushback-ms"), HeaderValue::from(ms));
            }
            (StatusCode::OK, String::new())
        } else {
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
            let body = format!(
                "{{\"type\":\"{}\",\"title\":\"{}\",\"status\":{},\"detail\":\"{}\"}}",
                self.problem,
                self.title,
                self.status.as_u16(),
                json_escape(&self.detail)
            );
            (self.status, body)
        };
        let mut response = Response::new(Body::refusal(Bytes::from(body)));
        *response.status_mut() = status;
        *response.headers_mut() = headers;
        response
    }
}

/// gRPC's `grpc-message` encoding: percent-encode what is not printable
/// ASCII, and `%`.
fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if (0x20..0x7f).contains(&b) && b != b'%' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A JSON string's contents.
fn json_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if u32::from(c) < 0x20 => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out
}

/// Whether a request speaks gRPC.
fn is_grpc<B>(request: &Request<B>) -> bool {
    request
        .headers()
        .get(CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

impl<S, B, C, ResB> tower::Service<Request<B>> for RateLimitService<S, B, C>
where
    S: tower::Service<Request<B>, Response = Response<ResB>>,
    B: 'static,
    C: Clock,
{
    type Response = Response<Body<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResB>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        match self.shared.decide(&request) {
            Verdict::Pass(fields) => ResponseFuture {
                kind: Kind::Inner {
                    future: self.inner.call(request),
                    fields,
                },
            },
            Verdict::Refuse(refusal) => ResponseFuture {
                kind: Kind::Refused {
                    response: Some(refusal.into_response(is_grpc(&request))),
                },
            },
        }
    }
}

pin_project_lite::pin_project! {
    /// The response of a [`RateLimitService`]: the inner service's, with
    /// the rate-limit headers added, or a refusal.
    pub struct ResponseFuture<F, ResB> {
        #[pin]
        kind: Kind<F, ResB>,
    }
}

pin_project_lite::pin_project! {
    #[project = KindProj]
    enum Kind<F, ResB> {
        Inner {
            #[pin]
            future: F,
            fields: Option<Fields>,
        },
        Refused {
            response: Option<Response<Body<ResB>>>,
        },
    }
}

impl<F, ResB, E> Future for ResponseFuture<F, ResB>
where
    F: Future<Output = Result<Response<ResB>, E>>,
{
    type Output = Result<Response<Body<ResB>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Inner { future, fields } => {
                let mut response = std::task::ready!(future.poll(cx))?;
                if let Some(fields) = fields.take() {
                    fields.apply(response.headers_mut());
                }
                Poll::Ready(Ok(response.map(Body::inner)))
            }
            KindProj::Refused { response } => match response.take() {
                Some(response) => Poll::Ready(Ok(response)),
                // Polled again after completion: a caller's bug; never
                // resolve rather than panic.
                None => Poll::Pending,
            },
        }
    }
}
