//! The service: decides in `call`, answers refusals itself.

use crate::body::Body;
use crate::headers::{self, Fields, Outcome};
use crate::key::{KeyText, MissingKey, RequestKey};
use crate::layer_state::{LayerState, LimitName};
use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode};
use slidegate_core::Decision;
use slidegate_memory::MemoryStore;
use slidegate_store::{Decisions, Quota, Store, StoreError};
use smallvec::SmallVec;
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
pub struct RateLimitService<S, B, St = MemoryStore> {
    inner: S,
    shared: Arc<LayerState<B, St>>,
}

impl<S: Clone, B, St> Clone for RateLimitService<S, B, St> {
    fn clone(&self) -> Self {
        RateLimitService {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S, B, St> RateLimitService<S, B, St> {
    pub(crate) fn new(inner: S, shared: Arc<LayerState<B, St>>) -> Self {
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

/// What a request needs before it is passed on or refused.
// It lives for one call, on the stack, as `Verdict` does.
#[allow(clippy::large_enum_variant)]
enum Step {
    /// Decided without the store.
    Done(Verdict),
    /// To be decided by the store: the key and the cost.
    Decide(RequestKey, u64),
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

impl<B: 'static, St> LayerState<B, St> {
    /// Exemptions, the key and the cost.
    fn step(&self, request: &Request<B>) -> Step {
        if self.exempt.as_ref().is_some_and(|exempt| exempt(request)) {
            return Step::Done(Verdict::Pass(None));
        }
        let key = match self.extractor.extract(request) {
            Some(key) => key,
            None => match &self.missing {
                MissingKey::Allow => return Step::Done(Verdict::Pass(None)),
                MissingKey::Fallback(key) => key.clone(),
                MissingKey::Refuse => {
                    return Step::Done(Verdict::Refuse(Box::new(Refusal {
                        status: StatusCode::TOO_MANY_REQUESTS,
                        problem: QUOTA_EXCEEDED,
                        title: "Request cannot be satisfied as assigned quota has been exceeded",
                        detail: "the request carries no client key to count it under".to_owned(),
                        fields: None,
                        retry_ms: None,
                        grpc_status: GRPC_RESOURCE_EXHAUSTED,
                    })));
                }
            },
        };
        let cost = self.cost.as_ref().map_or(1, |cost| cost(request));
        Step::Decide(key, cost)
    }

    /// The verdict on the store's answer: `decisions`, one per limit, if
    /// it decided.
    fn verdict_of<'a>(&'a self, result: Result<(), StoreError>, decisions: &'a Decisions, cost: u64) -> Verdict {
        if let Err(e) = result {
            return store_error(&e);
        }
        // A failure policy's open decisions count nothing and have no
        // figures to show: admitted, with nothing counted and nothing to
        // wait for, which a charge (cost 1 or more) never is.
        if cost > 0
            && decisions
                .iter()
                .all(|d| d.allowed() && d.remaining() >= d.limit() && d.reset_after().is_zero())
        {
            return Verdict::Pass(None);
        }
        let outcome = |((limit, quota), decision): ((&'a LimitName, &'a Quota), &'a Decision)| Outcome {
            name: &limit.name,
            quoted: &limit.quoted,
            policy: quota.policy(),
            decision,
        };
        // One limit, the common case, needs no list.
        if let ([limit], [quota], [decision]) = (&self.limits[..], &self.quotas[..], &decisions[..]) {
            return self.verdict(&[outcome(((limit, quota), decision))]);
        }
        let outcomes: SmallVec<[Outcome<'_>; 4]> = self
            .limits
            .iter()
            .zip(self.quotas.iter())
            .zip(decisions.iter())
            .map(outcome)
            .collect();
        if outcomes.len() != self.quotas.len() {
            // A store that broke its contract (one decision per quota).
            return store_error(&StoreError::NoQuota);
        }
        self.verdict(&outcomes)
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
}

/// A store that could not decide: `503`, a `temporary-reduced-capacity`
/// problem (with a failure policy, only errors that are not outages get
/// here).
fn store_error(error: &StoreError) -> Verdict {
    Verdict::Refuse(Box::new(Refusal {
        status: StatusCode::SERVICE_UNAVAILABLE,
        problem: REDUCED_CAPACITY,
        title: "The rate limiter cannot count this request",
        detail: format!("the rate limit store cannot decide: {error}"),
        fields: None,
        retry_ms: None,
        grpc_status: GRPC_UNAVAILABLE,
    }))
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

/// # Bounds
///
/// The inner service must be `Clone + Send + 'static` (as axum's routes,
/// tonic's services and `service_fn`s are, and as tower's `Buffer` and
/// axum's `from_fn` ask too): with a store that decides over the network,
/// the ready inner service is taken out of `self` (a clone left in its
/// place) and called once the store has answered.
impl<S, B, St, ResB> tower::Service<Request<B>> for RateLimitService<S, B, St>
where
    S: tower::Service<Request<B>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Send + 'static,
    ResB: Send + 'static,
    St: Store + 'static,
{
    type Response = Response<Body<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResB, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let verdict = match self.shared.step(&request) {
            Step::Done(verdict) => verdict,
            Step::Decide(key, cost) => {
                let key = key.render();
                let shared = &*self.shared;
                let mut decisions = Decisions::new();
                match shared
                    .store
                    .decide_now(key.as_str(), &shared.quotas, cost, &mut decisions)
                {
                    // A store without IO (the in-memory one): decided now,
                    // with nothing boxed or allocated.
                    Some(result) => shared.verdict_of(result, &decisions, cost),
                    None => return self.awaiting(request, key, cost),
                }
            }
        };
        self.answer(request, verdict)
    }
}

impl<S, B, St, ResB> RateLimitService<S, B, St>
where
    S: tower::Service<Request<B>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Send + 'static,
    ResB: Send + 'static,
    St: Store + 'static,
{
    fn answer(&mut self, request: Request<B>, verdict: Verdict) -> ResponseFuture<S::Future, ResB, S::Error> {
        match verdict {
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

    /// The answer of a store that must be awaited: the ready inner service
    /// (a clone takes its place) is called once the store has decided.
    fn awaiting(&mut self, request: Request<B>, key: KeyText, cost: u64) -> ResponseFuture<S::Future, ResB, S::Error> {
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let shared = Arc::clone(&self.shared);
        let future = async move {
            let mut decisions = Decisions::new();
            let result = shared
                .store
                .decide(key.as_str(), &shared.quotas, cost, &mut decisions)
                .await;
            match shared.verdict_of(result, &decisions, cost) {
                Verdict::Pass(fields) => {
                    let mut response = inner.call(request).await?;
                    if let Some(fields) = fields {
                        fields.apply(response.headers_mut());
                    }
                    Ok(response.map(Body::inner))
                }
                Verdict::Refuse(refusal) => Ok(refusal.into_response(is_grpc(&request))),
            }
        };
        ResponseFuture {
            kind: Kind::Awaiting {
                future: Box::pin(future),
            },
        }
    }
}

/// The boxed answer of a store that must be awaited.
type Awaited<ResB, E> = Pin<Box<dyn Future<Output = Result<Response<Body<ResB>>, E>> + Send>>;

pin_project_lite::pin_project! {
    /// The response of a [`RateLimitService`]: the inner service's, with
    /// the rate-limit headers added, or a refusal. With a store that
    /// decides over the network, a boxed future that awaits the store and
    /// then the inner service.
    pub struct ResponseFuture<F, ResB, E> {
        #[pin]
        kind: Kind<F, ResB, E>,
    }
}

pin_project_lite::pin_project! {
    #[project = KindProj]
    enum Kind<F, ResB, E> {
        Inner {
            #[pin]
            future: F,
            fields: Option<Fields>,
        },
        Refused {
            response: Option<Response<Body<ResB>>>,
        },
        Awaiting {
            future: Awaited<ResB, E>,
        },
    }
}

impl<F, ResB, E> Future for ResponseFuture<F, ResB, E>
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
            KindProj::Awaiting { future } => future.as_mut().poll(cx),
        }
    }
}
