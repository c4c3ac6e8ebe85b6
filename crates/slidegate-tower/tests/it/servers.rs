//! The layer in real servers on loopback sockets: a bare hyper HTTP/1.1
//! server, and a tonic gRPC server whose refusals a generated tonic client
//! reads as `RESOURCE_EXHAUSTED` with the retry delay.

use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::body::{Bytes, Incoming};
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use slidegate_core::{Algorithm, ManualClock, Policy};
use slidegate_memory::{Budget, MemoryStore};
use slidegate_tower::{ForwardedFor, GlobalKey, PeerIp, RateLimitLayer};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tonic::transport::server::TcpConnectInfo;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;
use tower::{Layer, Service, ServiceBuilder, ServiceExt};

fn log(limit: u64, window: Duration) -> Policy {
    Policy::new(limit, window, Algorithm::SlidingLog).unwrap()
}

/// Serves `layer` in front of a hello handler with hyper alone, one task
/// per connection; the peer address goes into the request's extensions,
/// where [`PeerIp`] finds it.
async fn hyper_server(layer: RateLimitLayer<Incoming, MemoryStore<ManualClock>>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, peer)) = listener.accept().await {
            let service = ServiceBuilder::new()
                .map_request(move |mut request: Request<Incoming>| {
                    request.extensions_mut().insert(peer);
                    request
                })
                .layer(layer.clone())
                .service_fn(|_request| async { Ok::<_, Infallible>(Response::new(String::from("hello"))) });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), TowerToHyperService::new(service)),
            );
        }
    });
    addr
}

/// Sends a GET on one keep-alive connection and reads the whole answer.
async fn get(
    sender: &mut hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
) -> (StatusCode, http::HeaderMap, String) {
    let request = Request::builder()
        .uri("/")
        .header("host", "localhost")
        .body(Empty::new())
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    let (parts, body) = response.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    (parts.status, parts.headers, String::from_utf8(bytes.to_vec()).unwrap())
}

#[tokio::test]
async fn a_hyper_server_limits_per_peer() {
    let clock = ManualClock::new(0);
    let layer = RateLimitLayer::builder(PeerIp::new())
        .limit(
            "per-ip",
            log(2, Duration::from_secs(10)),
            clock.clone(),
            Budget::keys(100),
        )
        .build()
        .unwrap();
    let addr = hyper_server(layer).await;
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);

    let (status, headers, body) = get(&mut sender).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "hello"));
    assert_eq!(headers["ratelimit-policy"], r#""per-ip";q=2;w=10"#);
    assert_eq!(headers["ratelimit"], r#""per-ip";r=1;t=10"#);
    clock.advance(Duration::from_secs(4));
    assert_eq!(get(&mut sender).await.0, StatusCode::OK);

    let (status, headers, body) = get(&mut sender).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(headers["content-type"], "application/problem+json");
    assert_eq!(headers["retry-after"], "6");
    assert_eq!(headers["content-length"], body.len().to_string().as_str());
    assert!(body.contains("quota-exceeded"), "{body}");
    // The connection survives the refusal, and the announced wait is enough.
    clock.advance(Duration::from_secs(6));
    assert_eq!(get(&mut sender).await.0, StatusCode::OK);
}

/// A tonic server with the layer, on a real socket, keyed by the peer
/// address tonic records; the health service stands in for any generated
/// service. Returns a client of it.
async fn tonic_server(
    layer: RateLimitLayer<tonic::body::Body, MemoryStore<ManualClock>>,
) -> HealthClient<tonic::transport::Channel> {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    tokio::spawn(
        tonic::transport::Server::builder()
            .layer(layer)
            .add_service(health)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    HealthClient::new(channel)
}

#[tokio::test]
async fn a_tonic_client_sees_resource_exhausted_with_the_delay() {
    let clock = ManualClock::new(0);
    // tonic's own connect info, read by a closure (as a TLS listener's
    // `TlsConnectInfo` would be).
    let peer = |request: &Request<tonic::body::Body>| {
        let info = request.extensions().get::<TcpConnectInfo>()?;
        Some(PeerIp::new().key_of(info.remote_addr()?.ip()))
    };
    let layer = RateLimitLayer::builder(peer)
        .limit(
            "grpc",
            log(1, Duration::from_millis(2_500)),
            clock.clone(),
            Budget::keys(100),
        )
        .build()
        .unwrap();
    let mut client = tonic_server(layer).await;
    let check = || tonic::Request::new(HealthCheckRequest { service: String::new() });

    let served = client.check(check()).await.unwrap();
    assert_eq!(served.metadata().get("ratelimit").unwrap(), r#""grpc";r=0;t=3"#);
    clock.advance(Duration::from_millis(500));
    let status = client.check(check()).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted);
    assert!(status.message().contains("retry in 2 s"), "{status:?}");
    assert_eq!(status.metadata().get("grpc-retry-pushback-ms").unwrap(), "2000");
    clock.advance(Duration::from_secs(2));
    assert!(client.check(check()).await.is_ok());
}

/// With the `tonic` feature the ready-made extractors read tonic's
/// `TcpConnectInfo` themselves: the peer is a trusted proxy (loopback), so
/// the client is the address it forwards in `x-forwarded-for`.
#[tokio::test]
async fn a_tonic_server_keys_by_the_forwarded_client_behind_a_trusted_proxy() {
    let clock = ManualClock::new(0);
    let layer = RateLimitLayer::builder(ForwardedFor::new(["127.0.0.0/8".parse().unwrap()]))
        .limit(
            "grpc",
            log(1, Duration::from_secs(10)),
            clock.clone(),
            Budget::keys(100),
        )
        .build()
        .unwrap();
    let mut client = tonic_server(layer).await;
    let check = |client_ip: &str| {
        let mut request = tonic::Request::new(HealthCheckRequest { service: String::new() });
        request
            .metadata_mut()
            .insert("x-forwarded-for", format!("203.0.113.66, {client_ip}").parse().unwrap());
        request
    };
    assert!(client.check(check("198.51.100.1")).await.is_ok());
    let refused = client.check(check("198.51.100.1")).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
    // Another client behind the same proxy has its own budget.
    assert!(client.check(check("198.51.100.2")).await.is_ok());
    // So has the proxy itself, keyed by its own (loopback) address.
    let direct = tonic::Request::new(HealthCheckRequest { service: String::new() });
    assert!(client.check(direct).await.is_ok());
}

/// `PeerIp` alone keys a tonic server by the peer address.
#[tokio::test]
async fn a_tonic_server_keys_by_peer_ip() {
    let clock = ManualClock::new(0);
    let layer = RateLimitLayer::builder(PeerIp::new())
        .limit(
            "grpc",
            log(2, Duration::from_secs(10)),
            clock.clone(),
            Budget::keys(100),
        )
        .build()
        .unwrap();
    let mut client = tonic_server(layer).await;
    let check = || tonic::Request::new(HealthCheckRequest { service: String::new() });
    let served = client.check(check()).await.unwrap();
    assert_eq!(served.metadata().get("ratelimit").unwrap(), r#""grpc";r=1;t=10"#);
    assert!(client.check(check()).await.is_ok());
    let refused = client.check(check()).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
    clock.advance(Duration::from_secs(10));
    assert!(client.check(check()).await.is_ok());
}

/// A layer keyed globally works on any body type: the refusal needs no
/// conversion from the inner service's body.
#[tokio::test]
async fn refusals_need_nothing_of_the_inner_body() {
    let clock = ManualClock::new(0);
    let layer = RateLimitLayer::builder(GlobalKey)
        .limit("all", log(1, Duration::from_secs(1)), clock, Budget::keys(1))
        .build()
        .unwrap();
    let inner =
        tower::service_fn(|_request: Request<()>| async { Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new())) });
    let mut service = layer.layer(inner);
    let first = service.ready().await.unwrap().call(Request::new(())).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    let second = service.ready().await.unwrap().call(Request::new(())).await.unwrap();
    assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
    let body = second.into_body().collect().await.unwrap().to_bytes();
    assert!(body.starts_with(b"{\"type\":"), "{body:?}");
}
