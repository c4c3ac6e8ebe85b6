//! The real server on ephemeral loopback ports for the integration tests:
//! gRPC through the client generated from the project's proto files, HTTP
//! through hyper's client, time on a manual clock.
#![allow(dead_code, unreachable_pub)]

use super::TempDir;
use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use slidegate_core::ManualClock;
use slidegate_server::proto::descriptor::RateLimitDescriptor;
use slidegate_server::proto::descriptor::rate_limit_descriptor::Entry;
use slidegate_server::proto::rls::rate_limit_response::Code;
use slidegate_server::proto::rls::rate_limit_service_client::RateLimitServiceClient;
use slidegate_server::proto::rls::{RateLimitRequest, RateLimitResponse};
use slidegate_server::server::{self, Options, Running};
use std::net::SocketAddr;
use tokio::net::TcpStream;
use tonic::transport::Channel;

/// The admin token of the harness's servers.
pub const ADMIN: &str = "test-admin-token";

pub struct Harness {
    pub running: Running,
    pub clock: ManualClock,
    pub grpc: RateLimitServiceClient<Channel>,
    pub dir: TempDir,
}

/// A new plain HTTP/2 connection to `running`'s gRPC listener.
pub async fn channel_to(running: &Running) -> Channel {
    Channel::from_shared(format!("http://{}", running.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

impl Harness {
    pub async fn start(yaml: &str) -> Harness {
        Harness::start_with(yaml, |_| {}).await
    }

    /// Serves `yaml` (one domain file in a fresh folder, unless empty) with
    /// the options changed by `tweak`.
    pub async fn start_with(yaml: &str, tweak: impl FnOnce(&mut Options)) -> Harness {
        let dir = TempDir::new("server");
        let mut options = Options {
            http: "127.0.0.1:0".parse().unwrap(),
            grpc: "127.0.0.1:0".parse().unwrap(),
            reload_every: None,
            admin_token: Some(ADMIN.to_owned()),
            ..Options::default()
        };
        if !yaml.is_empty() {
            dir.write("domain.yaml", yaml);
            options.config = vec![dir.0.clone()];
        }
        tweak(&mut options);
        let clock = ManualClock::new(1_000_000_000_000);
        let running = server::start(options, clock.clone()).await.unwrap();
        let channel = channel_to(&running).await;
        Harness {
            running,
            clock,
            grpc: RateLimitServiceClient::new(channel),
            dir,
        }
    }

    /// A new connection to the gRPC listener.
    pub async fn channel(&self) -> Channel {
        channel_to(&self.running).await
    }

    /// The HTTP address.
    pub fn http_addr(&self) -> SocketAddr {
        self.running.http_addr().unwrap()
    }

    pub async fn rls(&mut self, request: RateLimitRequest) -> Result<RateLimitResponse, tonic::Status> {
        self.grpc
            .should_rate_limit(request)
            .await
            .map(tonic::Response::into_inner)
    }

    pub async fn post(&self, path: &str, body: &str) -> (StatusCode, HeaderMap, String) {
        http_post(self.http_addr(), path, body).await
    }

    /// `POST /v1/reset` with the admin token of [`ADMIN`].
    pub async fn reset(&self, body: &str) -> (StatusCode, HeaderMap, String) {
        let bearer = format!("Bearer {ADMIN}");
        http_post_with(self.http_addr(), "/v1/reset", body, &[("authorization", &bearer)]).await
    }

    pub async fn get(&self, path: &str) -> (StatusCode, String) {
        http_get(self.http_addr(), path).await
    }

    /// The value of one metric line, as written in /metrics.
    pub async fn metric(&self, line_start: &str) -> Option<f64> {
        let (_, text) = self.get("/metrics").await;
        text.lines()
            .find(|l| l.starts_with(line_start))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    }
}

pub async fn http_post(addr: SocketAddr, path: &str, body: &str) -> (StatusCode, HeaderMap, String) {
    http_post_with(addr, path, body, &[]).await
}

pub async fn http_post_with(
    addr: SocketAddr,
    path: &str,
    body: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, HeaderMap, String) {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    let mut request = Request::post(path)
        .header("host", "localhost")
        .header("content-type", "application/json");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request.body(Full::new(Bytes::from(body.to_owned()))).unwrap();
    let response = sender.send_request(request).await.unwrap();
    let (parts, body) = response.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    (parts.status, parts.headers, String::from_utf8(bytes.to_vec()).unwrap())
}

pub fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).to_owned(),
                value: (*v).to_owned(),
            })
            .collect(),
        ..Default::default()
    }
}

pub fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors,
        hits_addend: 0,
    }
}

pub fn one(domain: &str, entries: &[(&str, &str)]) -> RateLimitRequest {
    request(domain, vec![descriptor(entries)])
}

pub fn codes(response: &RateLimitResponse) -> Vec<Code> {
    response.statuses.iter().map(|s| s.code()).collect()
}

/// `GET path` on the server at `addr`, on a connection of its own.
pub async fn http_get(addr: SocketAddr, path: &str) -> (StatusCode, String) {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    let request = Request::get(path)
        .header("host", "localhost")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(body.to_vec()).unwrap())
}
