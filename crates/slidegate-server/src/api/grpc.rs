//! Envoy's `RateLimitService` over gRPC, and the conversions between the
//! wire types and the engine's, which `POST /json` shares.

use crate::api::wire::{answer_to_wire, request_from_wire};
use crate::engine::EngineError;
pub use crate::headers::{HeaderOptions, ResponseHeaderNames};
use crate::metrics::Api;
use crate::proto::rls::rate_limit_service_server::{RateLimitService, RateLimitServiceServer};
use crate::proto::rls::{RateLimitRequest, RateLimitResponse};
use crate::service::Shared;
use http::HeaderMap;
use prost::Message;
use std::sync::Arc;

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
/// The one path of both the tonic service and `crate::api::grpc_routes`'s
/// unary calls.
pub(crate) async fn respond(
    shared: &Shared,
    message: RateLimitRequest,
    headers: &HeaderMap,
) -> Result<RateLimitResponse, tonic::Status> {
    let _timer = shared.service.metrics().time(Api::Grpc);
    let request = request_from_wire(message);
    match shared.service.decide(Api::Grpc, &request, headers).await {
        Ok(answer) => Ok(answer_to_wire(
            &request,
            &answer,
            &shared.grpc_headers,
            shared.engine().settings().dynamic_metadata,
        )),
        Err(e) => Err(grpc_status(e)),
    }
}

/// `ShouldRateLimit` answered by tonic's server (`tonic::server::Grpc`,
/// as the generated [`RateLimitServiceServer`] serves it, messages of at
/// most `limit` bytes, no compression taken) but with [`RequestCodec`]:
/// a request whose message does not decode, or whose body ends inside a
/// message (the error of `crate::api::grpc_routes`'s replayed body), is
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
        e if e.is_invalid() => tonic::Status::invalid_argument(e.detail()),
        e => tonic::Status::unavailable(e.detail()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use slidegate_store::StoreError;

    #[test]
    fn errors_map_to_grpc_codes() {
        let invalid = grpc_status(EngineError::Invalid("the domain is empty".to_owned()));
        assert_eq!(invalid.code(), tonic::Code::InvalidArgument);
        assert_eq!(invalid.message(), "the domain is empty");
        let down = grpc_status(EngineError::Unavailable(StoreError::KeyRefused(
            "the store is full".to_owned(),
        )));
        assert_eq!(down.code(), tonic::Code::Unavailable);
        assert!(down.message().contains("the store is full"));
    }
}
