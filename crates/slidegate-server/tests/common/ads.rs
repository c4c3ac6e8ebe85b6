//! An ADS server (envoy.service.discovery.v3, state of the world) written
//! with tonic for the tests: it hands each stream and each request to the
//! test, which pushes `RateLimitConfig` snapshots as a control plane (Envoy
//! Gateway's) does. Shared by this crate's xDS tests and, through
//! `#[path]`, the process test of the command line under Envoy Gateway's
//! environment.
#![allow(dead_code)]

use prost::Message;
use slidegate_server::proto::discovery::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use slidegate_server::proto::discovery::{DiscoveryRequest, DiscoveryResponse};
use slidegate_server::proto::rls_conf::{RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit};
use slidegate_server::xds::RATE_LIMIT_CONFIG_TYPE;
use std::net::SocketAddr;
use std::pin::Pin;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tokio_stream::wrappers::{TcpListenerStream, UnboundedReceiverStream};
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};
use tonic::{Request, Response, Status, Streaming};

/// Waits at most this long for anything.
pub(crate) const PATIENCE: Duration = Duration::from_secs(20);

pub(crate) async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(PATIENCE, future)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

/// A request as the server got it, with the stream's request headers and
/// whether the client showed a certificate.
pub(crate) struct Got {
    pub(crate) request: DiscoveryRequest,
    pub(crate) headers: tonic::metadata::MetadataMap,
    pub(crate) client_certificate: bool,
}

/// The sending side of one stream.
pub(crate) type Pusher = mpsc::UnboundedSender<Result<DiscoveryResponse, Status>>;

/// The service: each stream opened is handed to the test, and each request
/// read is too.
struct Ads {
    streams: mpsc::UnboundedSender<Pusher>,
    requests: mpsc::UnboundedSender<Got>,
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for Ads {
    type StreamAggregatedResourcesStream = Pin<Box<dyn Stream<Item = Result<DiscoveryResponse, Status>> + Send>>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        let headers = request.metadata().clone();
        let client_certificate = request.peer_certs().is_some_and(|certs| !certs.is_empty());
        let mut incoming = request.into_inner();
        let requests = self.requests.clone();
        tokio::spawn(async move {
            while let Ok(Some(request)) = incoming.message().await {
                let got = Got {
                    request,
                    headers: headers.clone(),
                    client_certificate,
                };
                if requests.send(got).is_err() {
                    return;
                }
            }
        });
        let (push, responses) = mpsc::unbounded_channel();
        let _ = self.streams.send(push);
        Ok(Response::new(Box::pin(UnboundedReceiverStream::new(responses))))
    }
}

/// A running ADS server.
pub(crate) struct AdsServer {
    pub(crate) addr: SocketAddr,
    pub(crate) streams: mpsc::UnboundedReceiver<Pusher>,
    pub(crate) requests: mpsc::UnboundedReceiver<Got>,
    /// The open streams' senders: dropped, each stream ends.
    pub(crate) open: Vec<Pusher>,
    task: tokio::task::JoinHandle<()>,
    nonce: u64,
}

/// Certificates for TLS: the server's, and the CA that signs them.
pub(crate) struct Tls {
    pub(crate) server: Identity,
    pub(crate) client_ca: Certificate,
}

impl AdsServer {
    pub(crate) async fn start(addr: SocketAddr, tls: Option<Tls>) -> AdsServer {
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (streams_tx, streams) = mpsc::unbounded_channel();
        let (requests_tx, requests) = mpsc::unbounded_channel();
        let service = AggregatedDiscoveryServiceServer::new(Ads {
            streams: streams_tx,
            requests: requests_tx,
        });
        let mut builder = Server::builder();
        if let Some(tls) = tls {
            builder = builder
                .tls_config(
                    ServerTlsConfig::new()
                        .identity(tls.server)
                        .client_ca_root(tls.client_ca),
                )
                .unwrap();
        }
        let task = tokio::spawn(async move {
            let _ = builder
                .add_service(service)
                .serve_with_incoming(TcpListenerStream::new(listener))
                .await;
        });
        AdsServer {
            addr,
            streams,
            requests,
            open: Vec::new(),
            task,
            nonce: 0,
        }
    }

    /// Waits for a stream and its first request.
    pub(crate) async fn accept(&mut self) -> DiscoveryRequest {
        let push = within("a stream", self.streams.recv()).await.unwrap();
        self.open.push(push);
        self.next().await.request
    }

    /// The next request.
    pub(crate) async fn next(&mut self) -> Got {
        within("a request", self.requests.recv()).await.unwrap()
    }

    /// Sends a snapshot on the newest stream; its nonce.
    pub(crate) fn push(&mut self, version: &str, configs: &[RateLimitConfig]) -> String {
        self.nonce += 1;
        let nonce = format!("nonce-{}", self.nonce);
        let response = DiscoveryResponse {
            version_info: version.to_owned(),
            resources: configs
                .iter()
                .map(|c| pbjson_types::Any {
                    type_url: RATE_LIMIT_CONFIG_TYPE.to_owned(),
                    value: c.encode_to_vec().into(),
                })
                .collect(),
            type_url: RATE_LIMIT_CONFIG_TYPE.to_owned(),
            nonce: nonce.clone(),
            ..DiscoveryResponse::default()
        };
        self.open.last().unwrap().send(Ok(response)).unwrap();
        nonce
    }

    /// Sends a snapshot and returns the client's answer to it.
    pub(crate) async fn push_and_answer(
        &mut self,
        version: &str,
        configs: &[RateLimitConfig],
    ) -> (String, DiscoveryRequest) {
        let nonce = self.push(version, configs);
        let answer = self.next().await.request;
        assert_eq!(answer.response_nonce, nonce);
        (nonce, answer)
    }

    /// Stops serving: the listener closes and every stream ends.
    pub(crate) async fn stop(self) {
        self.task.abort();
        let _ = self.task.await;
        drop(self.open);
    }
}

/// A loaded rule as the proto says it: what Envoy Gateway's control plane
/// would send for the YAML the rule was read from.
pub(crate) fn descriptor_of(rule: &slidegate_server::config::Rule) -> RateLimitDescriptor {
    use slidegate_server::proto::rls_conf::RateLimitReplace;
    assert!(rule.limits.len() <= 1, "one rate_limit a descriptor in the proto");
    let rate_limit = if rule.unlimited {
        Some(RateLimitPolicy {
            unlimited: true,
            ..RateLimitPolicy::default()
        })
    } else {
        rule.limits.first().map(|limit| RateLimitPolicy {
            unit: RateLimitUnit::from_str_name(&limit.unit.unwrap().name().to_ascii_uppercase())
                .unwrap()
                .into(),
            requests_per_unit: u32::try_from(limit.requests_per_unit).unwrap(),
            name: limit.name.clone().unwrap_or_default(),
            replaces: limit
                .replaces
                .iter()
                .map(|name| RateLimitReplace { name: name.clone() })
                .collect(),
            ..RateLimitPolicy::default()
        })
    };
    assert!(!rule.share_threshold && !rule.value_to_metric, "not in the proto");
    RateLimitDescriptor {
        key: rule.key.clone(),
        value: rule.value.as_ref().map(|v| v.as_str().to_owned()).unwrap_or_default(),
        rate_limit,
        descriptors: rule.children.iter().map(descriptor_of).collect(),
        shadow_mode: rule.shadow_mode,
        detailed_metric: rule.detailed_metric,
        quota_mode: rule.quota_mode,
        metadata: rule.metadata.clone().map(|json| serde_json::from_value(json).unwrap()),
    }
}
