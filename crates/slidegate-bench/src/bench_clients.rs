//! The load of `slidegate-bench`'s service cases: bounded HTTP/1.1 and gRPC
//! clients on loopback, in this process.

use anyhow::{Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use slidegate_server::proto::descriptor::RateLimitDescriptor;
use slidegate_server::proto::descriptor::rate_limit_descriptor::Entry;
use slidegate_server::proto::rls::RateLimitRequest;
use slidegate_server::proto::rls::rate_limit_service_client::RateLimitServiceClient;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// Decisions answered and their latencies.
pub(crate) type Load = (u64, Vec<Duration>);

/// Gathers the tasks' results.
async fn gather(tasks: Vec<tokio::task::JoinHandle<Result<Load>>>) -> Result<Load> {
    let (mut count, mut latencies) = (0, Vec::new());
    for task in tasks {
        let (n, l) = task.await.context("a load task")??;
        count += n;
        latencies.extend(l);
    }
    Ok((count, latencies))
}

/// `concurrency` keep-alive connections, each sending `POST /v1/check` on
/// one hot ad-hoc key, one at a time, for `time`.
pub(crate) async fn http(addr: SocketAddr, time: Duration, concurrency: usize) -> Result<Load> {
    let deadline = Instant::now() + time;
    let body = Bytes::from_static(br#"{"key":"hot","limit":1000000000,"window":"1m"}"#);
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let body = body.clone();
        tasks.push(tokio::spawn(async move {
            let stream = tokio::net::TcpStream::connect(addr)
                .await
                .context("connecting over HTTP")?;
            let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .context("an HTTP/1.1 handshake")?;
            tokio::spawn(connection);
            let mut latencies = Vec::new();
            while Instant::now() < deadline {
                let request = http::Request::post("/v1/check")
                    .header("host", "127.0.0.1")
                    .header("content-type", "application/json")
                    .body(Full::new(body.clone()))
                    .context("a request")?;
                let start = Instant::now();
                let response = sender.send_request(request).await.context("an HTTP answer")?;
                anyhow::ensure!(
                    response.status().is_success(),
                    "the service answered {}",
                    response.status()
                );
                response.into_body().collect().await.context("an HTTP body")?;
                latencies.push(start.elapsed());
            }
            Ok((latencies.len() as u64, latencies))
        }));
    }
    gather(tasks).await
}

/// `concurrency` gRPC calls in flight over up to 4 HTTP/2 connections, each task
/// calling `ShouldRateLimit` on one hot descriptor, for `time`.
pub(crate) async fn grpc(addr: SocketAddr, time: Duration, concurrency: usize) -> Result<Load> {
    let deadline = Instant::now() + time;
    // Calls spread over a few HTTP/2 connections, as a proxy fleet would.
    let mut channels = Vec::new();
    for _ in 0..concurrency.clamp(1, 4) {
        let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
            .context("a gRPC address")?
            .connect()
            .await
            .context("connecting over gRPC")?;
        channels.push(channel);
    }
    let request = RateLimitRequest {
        domain: "bench".to_owned(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "k".to_owned(),
                value: "hot".to_owned(),
            }],
            ..Default::default()
        }],
        hits_addend: 0,
    };
    let mut tasks = Vec::new();
    for task in 0..concurrency {
        let mut client = RateLimitServiceClient::new(channels[task % channels.len()].clone());
        let request = request.clone();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            while Instant::now() < deadline {
                let start = Instant::now();
                client
                    .should_rate_limit(request.clone())
                    .await
                    .context("a gRPC answer")?;
                latencies.push(start.elapsed());
            }
            Ok((latencies.len() as u64, latencies))
        }));
    }
    gather(tasks).await
}
