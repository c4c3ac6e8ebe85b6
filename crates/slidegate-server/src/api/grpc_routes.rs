//! The service a gRPC connection serves (`crate::net::conn::serve_grpc`, on
//! hyper's HTTP/2 connection): `ShouldRateLimit` answered straight when
//! its request is plain, by tonic's server otherwise; the quota service's
//! streams (`crate::api::rlqs`) and health by tonic's.
//!
//! A plain request is the common one: no `grpc-encoding` (or `identity`),
//! a body that ends without trailers and holds exactly one uncompressed
//! message within `--max-request-bytes` that decodes. Its message is
//! decoded with prost and answered with one data frame and the trailer
//! `grpc-status: 0`, as tonic answers, without tonic's streaming decoder,
//! its encoder body or its boxed handler; such a message that does not
//! decode is answered `INVALID_ARGUMENT` straight, as tonic's path answers
//! it. Any other request (compressed, cut short, too large, several
//! messages, trailers, a body that fails) is handed to tonic's server
//! (`crate::api::grpc::tonic_unary`) with the bytes read so far put back in
//! front, so that it answers it as tonic does: the fast path never decides
//! anything tonic would refuse.
//!
//! A request is the client's fault when it cannot be decoded: a message
//! that is not a `RateLimitRequest`, or a body that ends inside a message
//! (the replayed body, [`Replay`], follows the messages' framing and fails
//! with `INVALID_ARGUMENT` there, where tonic's decoder would answer
//! `INTERNAL`, "Unexpected EOF"), are `INVALID_ARGUMENT` on both paths; a
//! message over the size limit stays `OUT_OF_RANGE`, and the rest as tonic
//! answers it (a compressed flag without `grpc-encoding`, `INTERNAL`, as
//! gRPC's compression spec asks; an encoding not taken, `UNIMPLEMENTED`;
//! no message, `INTERNAL`).

use crate::api::grpc::{Grpc, respond, tonic_unary, undecodable};
use crate::api::rlqs::{RLQS_PATH, Rlqs};
use crate::proto::quota::rate_limit_quota_service_server::RateLimitQuotaServiceServer;
use crate::proto::rls::RateLimitRequest;
use crate::proto::rls::rate_limit_service_server::RateLimitServiceServer;
use crate::quota::Quotas;
use crate::service::Shared;
use bytes::{BufMut, Bytes, BytesMut};
use http::HeaderMap;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use prost::Message;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

/// What the gRPC server answers with.
type Answered = http::Response<AnswerBody>;
/// A call's answer to come; a call never fails at this level (errors are
/// `grpc-status` answers).
type Call = tonic::codegen::BoxFuture<Answered, Infallible>;
/// tonic's answers.
type TonicAnswered = http::Response<tonic::body::Body>;
/// A request body's error, as tonic takes it: hyper's, or the
/// `tonic::Status` of a body that ends inside a message.
type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// The health service, boxed: its type is tonic-health's own, and it is
/// called rarely.
type Health = tower::util::BoxCloneSyncService<http::Request<Replay>, TonicAnswered, Infallible>;

/// The path of `ShouldRateLimit`.
const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
/// The path prefix of `RateLimitService`'s methods.
const RLS_PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/";
/// The path prefix of the gRPC health service's methods.
const HEALTH_PATH: &str = "/grpc.health.v1.Health/";
/// A gRPC message's prefix: the compressed flag and the length.
const PREFIX: usize = 5;

/// The gRPC server's routes: `ShouldRateLimit` (straight when plain, see
/// the module's docs), the rest of `RateLimitService` and the health
/// service by their path prefix, `UNIMPLEMENTED` for any other path, as
/// tonic's router answers it. Each call is bounded by the request timeout,
/// or the client's `grpc-timeout` when shorter, and answered `CANCELLED`
/// ("Timeout expired", as tonic's server answers) beyond it; the timer is
/// armed only when the call first waits (for its body, or for the store),
/// so a call answered at once (the in-memory store's) arms none.
pub(crate) struct GrpcRoutes(Arc<Routes>);

/// What every call of every connection shares: one `Arc` cloned a call.
struct Routes {
    shared: Arc<Shared>,
    rls: RateLimitServiceServer<Grpc>,
    rlqs: RateLimitQuotaServiceServer<Rlqs>,
    health: Health,
    timeout: Duration,
    /// The largest message decoded (`--max-request-bytes`).
    limit: usize,
}

impl Clone for GrpcRoutes {
    fn clone(&self) -> Self {
        GrpcRoutes(Arc::clone(&self.0))
    }
}

impl GrpcRoutes {
    /// The routes of `shared`'s service, with tonic-health's `health`,
    /// under the request timeout `timeout`, decoding messages of at most
    /// `limit` bytes.
    pub(crate) fn new<H>(
        shared: Arc<Shared>,
        health: H,
        quotas: Arc<Quotas>,
        stopped: tokio::sync::watch::Receiver<bool>,
        timeout: Duration,
        limit: usize,
    ) -> Self
    where
        H: tower::Service<http::Request<Replay>, Response = TonicAnswered, Error = Infallible>
            + Clone
            + Send
            + Sync
            + 'static,
        H::Future: Send + 'static,
    {
        GrpcRoutes(Arc::new(Routes {
            rls: Grpc::service(Arc::clone(&shared)).max_decoding_message_size(limit),
            rlqs: Rlqs::service(Arc::clone(&shared), quotas, stopped),
            shared,
            health: Health::new(health),
            timeout,
            limit,
        }))
    }
}

impl hyper::service::Service<http::Request<Incoming>> for GrpcRoutes {
    type Response = Answered;
    type Error = Infallible;
    type Future = Deadline;

    fn call(&self, request: http::Request<Incoming>) -> Deadline {
        let routes = &self.0;
        let limit = client_timeout(request.headers()).map_or(routes.timeout, |t| t.min(routes.timeout));
        let path = request.uri().path();
        let call: Call = if path == SHOULD_RATE_LIMIT {
            if identity(request.headers()) {
                Box::pin(unary(Arc::clone(routes), request))
            } else {
                Box::pin(tonic_should_rate_limit(Arc::clone(routes), request.map(Replay::from)))
            }
        } else if path.starts_with(RLS_PATH) {
            Box::pin(tonic_call(routes.rls.clone(), request.map(Replay::from)))
        } else if path.starts_with(RLQS_PATH) {
            // A stream: answered at once (its headers), served by its own
            // task after (`crate::api::rlqs`).
            Box::pin(tonic_call(routes.rlqs.clone(), request.map(Replay::from)))
        } else if path.starts_with(HEALTH_PATH) {
            Box::pin(tonic_call(routes.health.clone(), request.map(Replay::from)))
        } else {
            Box::pin(std::future::ready(Ok(tonic::Status::unimplemented("")
                .into_http::<tonic::body::Body>()
                .map(AnswerBody::Tonic))))
        };
        Deadline {
            call,
            limit,
            timer: None,
        }
    }
}

/// The answer to a call that comes when the in-flight budget is spent
/// (`--max-in-flight`, [`crate::net::admission`]): `RESOURCE_EXHAUSTED`, as
/// gRPC servers answer an overload.
pub(crate) fn overloaded() -> Answered {
    tonic::Status::resource_exhausted("the service has as many calls in flight as it takes (--max-in-flight)")
        .into_http::<tonic::body::Body>()
        .map(AnswerBody::Tonic)
}

/// A tonic service's answer to `request`, as the routes answer.
fn tonic_call<S>(
    mut service: S,
    request: http::Request<Replay>,
) -> impl Future<Output = Result<Answered, Infallible>> + Send + 'static
where
    S: tower::Service<http::Request<Replay>, Response = TonicAnswered, Error = Infallible>,
    S::Future: Send + 'static,
{
    let answer = service.call(request);
    async move { answer.await.map(|answer| answer.map(AnswerBody::Tonic)) }
}

/// `ShouldRateLimit` answered by tonic's server ([`tonic_unary`]).
async fn tonic_should_rate_limit(routes: Arc<Routes>, request: http::Request<Replay>) -> Result<Answered, Infallible> {
    let answer = tonic_unary(Arc::clone(&routes.shared), routes.limit, request).await;
    Ok(answer.map(AnswerBody::Tonic))
}

/// Whether a request's messages are uncompressed: no `grpc-encoding`, or
/// `identity`.
fn identity(headers: &HeaderMap) -> bool {
    headers.get("grpc-encoding").is_none_or(|e| e.as_bytes() == b"identity")
}

/// `ShouldRateLimit` on hyper's request: read the body; answered here when
/// plain, by tonic's server otherwise (the bytes read put back).
async fn unary(routes: Arc<Routes>, request: http::Request<Incoming>) -> Result<Answered, Infallible> {
    let (parts, mut body) = request.into_parts();
    let mut read = BytesMut::new();
    let mut stop = None;
    loop {
        let frame = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await;
        match frame {
            None => break,
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => {
                    read.extend_from_slice(&data);
                    if read.len() > PREFIX + routes.limit {
                        stop = Some(Stop::Rest);
                        break;
                    }
                }
                Err(trailers) => {
                    stop = Some(Stop::Frame(trailers));
                    break;
                }
            },
            Some(Err(e)) => {
                stop = Some(Stop::Failed(e));
                break;
            }
        }
    }
    let message = match stop {
        None => plain(&read, routes.limit),
        Some(_) => None,
    };
    let Some(message) = message else {
        // A body read to its end has nothing more to give.
        let rest = stop.is_some().then_some(body);
        let replay = Replay {
            read: Some(read.freeze()).filter(|r| !r.is_empty()),
            stop,
            rest,
            framing: Framing::default(),
            ended: false,
        };
        return tonic_should_rate_limit(routes, http::Request::from_parts(parts, replay)).await;
    };
    let message = match message {
        Ok(message) => message,
        Err(e) => return Ok(undecodable(e).into_http::<tonic::body::Body>().map(AnswerBody::Tonic)),
    };
    let answer = match respond(&routes.shared, message, &parts.headers).await {
        Ok(answer) => answer,
        Err(status) => return Ok(status.into_http::<tonic::body::Body>().map(AnswerBody::Tonic)),
    };
    let len = answer.encoded_len();
    let mut data = BytesMut::with_capacity(PREFIX + len);
    data.put_u8(0);
    data.put_u32(u32::try_from(len).unwrap_or(u32::MAX));
    // A `BytesMut` grows, and an answer (a few descriptors' statuses) is
    // far below 4 GiB; an answer that could not be framed fails the call.
    if len > u32::MAX as usize || answer.encode(&mut data).is_err() {
        let status = tonic::Status::internal(format!("an answer of {len} bytes could not be encoded"));
        return Ok(status.into_http::<tonic::body::Body>().map(AnswerBody::Tonic));
    }
    let mut response = http::Response::new(AnswerBody::Unary(Some(data.freeze()), true));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    Ok(response)
}

/// The one message of a whole body `read`, when it is exactly one
/// uncompressed message of at most `limit` bytes: decoded, or why it does
/// not decode (answered `INVALID_ARGUMENT`, as tonic's path answers it);
/// none for any other body (tonic then answers).
fn plain(read: &[u8], limit: usize) -> Option<Result<RateLimitRequest, prost::DecodeError>> {
    let (prefix, message) = read.split_first_chunk::<PREFIX>()?;
    let [flag, len @ ..] = *prefix;
    let len = usize::try_from(u32::from_be_bytes(len)).ok()?;
    if flag != 0 || len != message.len() || len > limit {
        return None;
    }
    Some(RateLimitRequest::decode(message))
}

/// Where reading a body stopped short of its end.
enum Stop {
    /// Past the largest message: the rest is not read.
    Rest,
    /// A frame that is not data (the request's trailers).
    Frame(Frame<Bytes>),
    /// The body failed.
    Failed(hyper::Error),
}

/// A request body for tonic: what was read already, then where reading
/// stopped (a frame, an error), then the rest of the body. It follows the
/// gRPC messages' framing as it goes, and a body that ends (or sends its
/// trailers) inside a message fails with `INVALID_ARGUMENT`
/// ([`Framing::cut`]) instead, which tonic answers as it is.
pub(crate) struct Replay {
    read: Option<Bytes>,
    stop: Option<Stop>,
    rest: Option<Incoming>,
    framing: Framing,
    /// The body has failed or ended: nothing more comes.
    ended: bool,
}

impl From<Incoming> for Replay {
    fn from(body: Incoming) -> Self {
        Replay {
            read: None,
            stop: None,
            rest: Some(body),
            framing: Framing::default(),
            ended: false,
        }
    }
}

impl Replay {
    /// `frame` as it goes to tonic: a data frame counted in the framing;
    /// the trailers, or the end (`None`), when the bytes so far end
    /// between messages, else the error of a body cut short (once: then
    /// the body has ended).
    fn pass(&mut self, frame: Option<Frame<Bytes>>) -> Option<Result<Frame<Bytes>, BoxError>> {
        if let Some(data) = frame.as_ref().and_then(Frame::data_ref) {
            self.framing.feed(data);
            return frame.map(Ok);
        }
        self.ended = true;
        self.rest = None;
        match self.framing.cut() {
            Some(status) => Some(Err(Box::new(status))),
            None => frame.map(Ok),
        }
    }
}

impl Body for Replay {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if this.ended {
            return Poll::Ready(None);
        }
        if let Some(read) = this.read.take() {
            return Poll::Ready(this.pass(Some(Frame::data(read))));
        }
        match this.stop.take() {
            Some(Stop::Frame(frame)) => return Poll::Ready(this.pass(Some(frame))),
            Some(Stop::Failed(e)) => {
                this.ended = true;
                this.rest = None;
                return Poll::Ready(Some(Err(Box::new(e))));
            }
            Some(Stop::Rest) | None => {}
        }
        let frame = match &mut this.rest {
            Some(rest) => match std::task::ready!(Pin::new(rest).poll_frame(cx)) {
                Some(Err(e)) => {
                    this.ended = true;
                    this.rest = None;
                    return Poll::Ready(Some(Err(Box::new(e))));
                }
                Some(Ok(frame)) => Some(frame),
                None => None,
            },
            None => None,
        };
        Poll::Ready(this.pass(frame))
    }

    fn is_end_stream(&self) -> bool {
        self.ended
            || self.read.is_none()
                && self.stop.is_none()
                && self.framing.between()
                && self.rest.as_ref().is_none_or(Body::is_end_stream)
    }
}

/// Where a body's bytes are in its gRPC messages (each a 5-byte prefix,
/// the compressed flag and the length, then that many bytes).
#[derive(Default)]
struct Framing {
    /// The bytes of the next message's prefix seen so far.
    prefix: [u8; PREFIX],
    /// How many of them.
    filled: usize,
    /// The current message's length.
    len: u64,
    /// Its bytes still to come.
    left: u64,
}

impl Framing {
    /// Follows `data`, the body's next bytes.
    fn feed(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            if self.left > 0 {
                let n = usize::try_from(self.left).map_or(data.len(), |left| left.min(data.len()));
                self.left -= n as u64;
                data = data.get(n..).unwrap_or_default();
                continue;
            }
            let n = (PREFIX - self.filled).min(data.len());
            if let (Some(to), Some(from)) = (self.prefix.get_mut(self.filled..self.filled + n), data.get(..n)) {
                to.copy_from_slice(from);
            }
            self.filled += n;
            data = data.get(n..).unwrap_or_default();
            if self.filled == PREFIX {
                let [_, len @ ..] = self.prefix;
                self.len = u64::from(u32::from_be_bytes(len));
                self.left = self.len;
                self.filled = 0;
            }
        }
    }

    /// Whether the bytes so far end between two messages.
    fn between(&self) -> bool {
        self.filled == 0 && self.left == 0
    }

    /// If the body ended here, inside a message: the client's fault,
    /// `INVALID_ARGUMENT`, saying how much of the message came (tonic's
    /// decoder would answer `INTERNAL`, "Unexpected EOF"). None when the
    /// bytes so far end between messages.
    fn cut(&self) -> Option<tonic::Status> {
        let message = if self.filled > 0 {
            format!(
                "the request body ends inside a message's prefix: {} of its {PREFIX} bytes came",
                self.filled
            )
        } else if self.left > 0 {
            format!(
                "the request body ends inside a message: {} of the {} bytes its prefix gives came",
                self.len - self.left,
                self.len
            )
        } else {
            return None;
        };
        Some(tonic::Status::invalid_argument(message))
    }
}

/// An answer's body: tonic's, or a unary answer's one data frame (if not
/// sent yet) and then, if not sent yet, the trailer `grpc-status: 0`.
pub(crate) enum AnswerBody {
    Tonic(tonic::body::Body),
    Unary(Option<Bytes>, bool),
}

impl Body for AnswerBody {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        match &mut *self {
            AnswerBody::Tonic(body) => Pin::new(body).poll_frame(cx),
            AnswerBody::Unary(data, trailers) => Poll::Ready(if let Some(data) = data.take() {
                Some(Ok(Frame::data(data)))
            } else if std::mem::take(trailers) {
                let mut ok = HeaderMap::with_capacity(1);
                ok.insert("grpc-status", http::HeaderValue::from_static("0"));
                Some(Ok(Frame::trailers(ok)))
            } else {
                None
            }),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            AnswerBody::Tonic(body) => body.is_end_stream(),
            AnswerBody::Unary(data, trailers) => data.is_none() && !trailers,
        }
    }

    /// tonic's hint; none for a unary answer, as tonic gives none (an
    /// exact one would add a `content-length` tonic's answers lack).
    fn size_hint(&self) -> SizeHint {
        match self {
            AnswerBody::Tonic(body) => body.size_hint(),
            AnswerBody::Unary(..) => SizeHint::default(),
        }
    }
}

/// A call bounded by `limit`, its timer armed when it first waits.
pub(crate) struct Deadline {
    call: Call,
    limit: Duration,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Future for Deadline {
    type Output = Result<Answered, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if let Poll::Ready(answer) = this.call.as_mut().poll(cx) {
            return Poll::Ready(answer);
        }
        let limit = this.limit;
        let timer = this.timer.get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        timer.as_mut().poll(cx).map(|()| {
            Ok(tonic::Status::cancelled("Timeout expired")
                .into_http::<tonic::body::Body>()
                .map(AnswerBody::Tonic))
        })
    }
}

/// The client's `grpc-timeout` (at most 8 digits and a unit: `H`, `M`,
/// `S`, `m`, `u` or `n`); none when absent or malformed (then ignored, as
/// tonic ignores it).
fn client_timeout(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get("grpc-timeout")?.as_bytes();
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n = digits.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
    Some(match unit {
        b"H" => Duration::from_secs(n * 3600),
        b"M" => Duration::from_secs(n * 60),
        b"S" => Duration::from_secs(n),
        b"m" => Duration::from_millis(n),
        b"u" => Duration::from_micros(n),
        b"n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `grpc-timeout` in each unit; absent, empty, unit-less, nine digits,
    /// signed or of an unknown unit, it is ignored.
    #[test]
    fn client_timeouts_are_read_in_every_unit_and_ignored_when_malformed() {
        let read = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert("grpc-timeout", value.parse().unwrap());
            client_timeout(&headers)
        };
        assert_eq!(read("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(read("3M"), Some(Duration::from_secs(180)));
        assert_eq!(read("4S"), Some(Duration::from_secs(4)));
        assert_eq!(read("50m"), Some(Duration::from_millis(50)));
        assert_eq!(read("60u"), Some(Duration::from_micros(60)));
        assert_eq!(read("70n"), Some(Duration::from_nanos(70)));
        assert_eq!(read("99999999H"), Some(Duration::from_secs(99_999_999 * 3600)));
        assert_eq!(read("0m"), Some(Duration::ZERO));
        for bad in ["", "m", "5", "123456789m", "-5m", "5x", "5 m", "5mm", "\u{0663}m"] {
            assert_eq!(read(bad), None, "{bad:?}");
        }
        assert_eq!(client_timeout(&HeaderMap::new()), None);
    }

    /// The framing follows messages however the body is split: between
    /// messages after each whole one (an empty one too), inside a prefix
    /// or a message otherwise, saying how much came.
    #[test]
    fn framing_follows_messages_in_any_pieces() {
        let body = [
            &[0u8, 0, 0, 0, 3, 7, 8, 9][..],
            &[0, 0, 0, 0, 0],
            &[1, 0, 0, 0, 2, 5, 5],
        ]
        .concat();
        for split in 0..=body.len() {
            let mut framing = Framing::default();
            let (a, b) = body.split_at(split);
            framing.feed(a);
            framing.feed(b);
            assert!(framing.between(), "split at {split}");
            assert!(framing.cut().is_none());
        }
        let cut = |bytes: &[u8]| {
            let mut framing = Framing::default();
            for byte in bytes {
                framing.feed(std::slice::from_ref(byte));
            }
            framing.cut().map(|s| (s.code(), s.message().to_owned()))
        };
        assert_eq!(cut(&[]), None);
        let prefix = cut(&body[..2]).unwrap();
        assert_eq!(prefix.0, tonic::Code::InvalidArgument);
        assert!(prefix.1.contains("prefix: 2 of its 5 bytes came"), "{prefix:?}");
        let message = cut(&body[..6]).unwrap();
        assert!(message.1.contains("1 of the 3 bytes"), "{message:?}");
        let next = cut(&body[..9]).unwrap();
        assert!(next.1.contains("prefix: 1 of its 5 bytes"), "{next:?}");
        // A length of 2³² − 1: counted, not allocated.
        let mut framing = Framing::default();
        framing.feed(&[0, 0xff, 0xff, 0xff, 0xff, 1, 2]);
        assert!(framing.cut().unwrap().message().contains("2 of the 4294967295 bytes"));
    }
}
