//! The config from an xDS control plane, as envoyproxy/ratelimit's
//! `CONFIG_TYPE=GRPC_XDS_SOTW` takes it (Envoy Gateway serves its rate
//! limit service that way): one aggregated discovery service (ADS) stream,
//! state of the world, subscribed to every
//! `ratelimit.config.ratelimit.v3.RateLimitConfig` resource
//! ([`RATE_LIMIT_CONFIG_TYPE`]). Beside `crate::reload`, the other way a
//! running server's config changes, whose rule it follows.
//!
//! Each response is a whole snapshot: its resources, one domain each, are
//! loaded as one config ([`config_from_resources`]: the checks and the
//! messages of the YAML loader) and applied as a reload of the files is
//! (counters kept where only limits change, the reload rule of
//! [`Config::check_reload`](crate::config::Config::check_reload), counted
//! in `slidegate_config_reloads_total`). A snapshot applied is ACKed (the
//! next request carries its version and nonce); one refused is NACKed (the
//! last version applied, its nonce, and a `google.rpc.Status` with code 3,
//! INVALID_ARGUMENT, and the errors), and the config in force keeps
//! serving. A failed connection or a lost stream is retried after a wait
//! ([`XdsBackoff`]), the config in force serving meanwhile; the new stream
//! asks with the last version applied.

mod backoff;
mod convert;

pub use backoff::XdsBackoff;
pub use convert::{config_from_configs, config_from_resources, yaml_of};

use crate::config::{ConfigError, LoadOptions};
use crate::log_limit::LogLimit;
use crate::proto::discovery::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use crate::proto::discovery::{DiscoveryRequest, DiscoveryResponse};
use crate::proto::envoy::config::core::v3::Node;
use crate::proto::envoy::config::core::v3::node::UserAgentVersionType;
use crate::proto::google::rpc::Status;
use crate::service::Shared;
use rand::{Rng, SeedableRng};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tonic::metadata::{AsciiMetadataKey, AsciiMetadataValue};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// The type of the resources the client subscribes to.
pub const RATE_LIMIT_CONFIG_TYPE: &str = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

/// `google.rpc.Code` INVALID_ARGUMENT: the code of a NACK's error.
const INVALID_ARGUMENT: i32 = 3;

/// How a log line about a repeated event (a failed connection, a lost
/// stream, a connection made) is limited: one a minute, with the count of
/// those held back.
const LOG_EVERY: Duration = Duration::from_secs(60);

/// Where the config comes from when it comes from an xDS control plane:
/// envoyproxy/ratelimit's `CONFIG_GRPC_XDS_*`, `XDS_CLIENT_*` and
/// `FORCE_START_WITHOUT_INITIAL_CONFIG` settings.
#[derive(Clone, Debug, PartialEq)]
pub struct XdsOptions {
    /// The control plane's address (`CONFIG_GRPC_XDS_SERVER_URL`):
    /// `host:port` as envoyproxy/ratelimit takes it, or with `http://` or
    /// `https://` (which must agree with [`XdsOptions::tls`]). By default
    /// `localhost:18000`, upstream's.
    pub server: String,
    /// The node id the control plane keeps a snapshot for
    /// (`CONFIG_GRPC_XDS_NODE_ID`; `default` by default, as upstream;
    /// Envoy Gateway serves `envoy-ratelimit`).
    pub node_id: String,
    /// The node's metadata, string values (`CONFIG_GRPC_XDS_NODE_METADATA`,
    /// `key=value` pairs); none by default.
    pub node_metadata: Vec<(String, String)>,
    /// TLS to the control plane (`CONFIG_GRPC_XDS_SERVER_USE_TLS` and its
    /// files); `None` (the default) speaks in the clear.
    pub tls: Option<XdsTls>,
    /// Request headers (gRPC metadata) sent on the stream
    /// (`CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS`); none by default.
    pub headers: Vec<(String, String)>,
    /// The waits between reconnections.
    pub backoff: XdsBackoff,
    /// The largest response taken, in bytes
    /// (`XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES`); `None` (the default) is
    /// gRPC's usual 4 MiB.
    pub max_message_bytes: Option<usize>,
    /// Not ready (`/readyz` and `/healthcheck` 503, gRPC health
    /// NOT_SERVING) until the first snapshot is applied: on by default, as
    /// envoyproxy/ratelimit waits unless
    /// `FORCE_START_WITHOUT_INITIAL_CONFIG` is true. Off, the server is
    /// ready at once, with no domain until a snapshot comes.
    pub wait_for_first_snapshot: bool,
}

impl Default for XdsOptions {
    fn default() -> Self {
        XdsOptions {
            server: "localhost:18000".to_owned(),
            node_id: "default".to_owned(),
            node_metadata: Vec::new(),
            tls: None,
            headers: Vec::new(),
            backoff: XdsBackoff::default(),
            max_message_bytes: None,
            wait_for_first_snapshot: true,
        }
    }
}

/// TLS to the control plane (PEM files).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct XdsTls {
    /// The CA certificates the control plane's certificate must be signed
    /// by (`CONFIG_GRPC_XDS_SERVER_TLS_CACERT`). Required: slidegate does
    /// not read the system's roots.
    pub ca: Option<PathBuf>,
    /// The client certificate chain for mutual TLS
    /// (`CONFIG_GRPC_XDS_CLIENT_TLS_CERT`), with [`XdsTls::key`].
    pub cert: Option<PathBuf>,
    /// Its private key (`CONFIG_GRPC_XDS_CLIENT_TLS_KEY`).
    pub key: Option<PathBuf>,
    /// The name the control plane's certificate must carry, sent as SNI
    /// (`CONFIG_GRPC_XDS_SERVER_TLS_SAN`); `None` takes the host of
    /// [`XdsOptions::server`].
    pub server_name: Option<String>,
}

/// Why the xDS client cannot start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum XdsError {
    /// Config files were given too.
    #[error(
        "config files ({0}) and an xDS config source were both given: the config comes from one of them (CONFIG_TYPE is FILE or GRPC_XDS_SOTW)"
    )]
    FilesToo(String),
    /// The control plane's address cannot be used.
    #[error("the xDS server address `{server}` cannot be used: {reason}")]
    Address {
        /// The address as given.
        server: String,
        /// Why.
        reason: String,
    },
    /// A TLS setting or file cannot be used.
    #[error("xDS TLS: {0}")]
    Tls(String),
    /// A request header cannot be sent as gRPC metadata.
    #[error("the xDS request header `{name}` cannot be sent: {reason}")]
    Header {
        /// The header's name.
        name: String,
        /// Why.
        reason: String,
    },
    /// The backoff settings cannot be used.
    #[error("xDS backoff: {0}")]
    Backoff(String),
    /// The largest message is 0.
    #[error("the xDS client's largest message size must be more than 0 bytes")]
    MaxMessageBytes,
}

/// The client, ready to connect: built at start from [`XdsOptions`], its
/// TLS files read.
pub(crate) struct XdsClient {
    server: String,
    endpoint: Endpoint,
    node: Node,
    headers: Vec<(AsciiMetadataKey, AsciiMetadataValue)>,
    backoff: XdsBackoff,
    max_message_bytes: Option<usize>,
}

impl XdsClient {
    /// Checks `options` and reads their TLS files (blocking).
    pub(crate) fn new(options: &XdsOptions) -> Result<XdsClient, XdsError> {
        options.backoff.check().map_err(XdsError::Backoff)?;
        if options.max_message_bytes == Some(0) {
            return Err(XdsError::MaxMessageBytes);
        }
        let address = |reason: String| XdsError::Address {
            server: options.server.clone(),
            reason,
        };
        let server = options.server.trim();
        let (tls_scheme, rest) = if let Some(rest) = server.strip_prefix("https://") {
            (Some(true), rest)
        } else if let Some(rest) = server.strip_prefix("http://") {
            (Some(false), rest)
        } else {
            (None, server)
        };
        if rest.is_empty() {
            return Err(address("no host".to_owned()));
        }
        if rest.contains("://") {
            return Err(address("the scheme must be http:// or https://, or none".to_owned()));
        }
        match (tls_scheme, &options.tls) {
            (Some(true), None) => {
                return Err(address(
                    "https:// needs the xDS TLS settings (a CA at least)".to_owned(),
                ));
            }
            (Some(false), Some(_)) => {
                return Err(address("http:// speaks in the clear, but xDS TLS is on".to_owned()));
            }
            _ => {}
        }
        let scheme = if options.tls.is_some() { "https" } else { "http" };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{rest}"))
            .map_err(|e| address(e.to_string()))?
            .connect_timeout(Duration::from_secs(10))
            // A control plane gone without a word is noticed.
            .http2_keep_alive_interval(Duration::from_secs(30))
            .keep_alive_timeout(Duration::from_secs(10))
            .user_agent(concat!("slidegate/", env!("CARGO_PKG_VERSION")))
            .map_err(|e| address(e.to_string()))?;
        if let Some(tls) = &options.tls {
            endpoint = endpoint
                .tls_config(tls_config(tls)?)
                .map_err(|e| XdsError::Tls(error_chain(&e)))?;
        }
        let mut headers = Vec::with_capacity(options.headers.len());
        for (name, value) in &options.headers {
            let header = |reason: String| XdsError::Header {
                name: name.clone(),
                reason,
            };
            let key = AsciiMetadataKey::from_bytes(name.trim().to_ascii_lowercase().as_bytes())
                .map_err(|e| header(format!("not a header name: {e}")))?;
            let value =
                AsciiMetadataValue::try_from(value.trim()).map_err(|e| header(format!("not a header value: {e}")))?;
            headers.push((key, value));
        }
        let metadata = options
            .node_metadata
            .iter()
            .map(|(k, v)| {
                let value = pbjson_types::Value {
                    kind: Some(pbjson_types::value::Kind::StringValue(v.clone())),
                };
                (k.clone(), value)
            })
            .collect();
        let node = Node {
            id: options.node_id.clone(),
            metadata: Some(pbjson_types::Struct { fields: metadata }),
            user_agent_name: "slidegate".to_owned(),
            user_agent_version_type: Some(UserAgentVersionType::UserAgentVersion(
                env!("CARGO_PKG_VERSION").to_owned(),
            )),
            ..Node::default()
        };
        Ok(XdsClient {
            server: options.server.clone(),
            endpoint,
            node,
            headers,
            backoff: options.backoff,
            max_message_bytes: options.max_message_bytes,
        })
    }
}

/// The TLS settings of `tls`, its files read.
fn tls_config(tls: &XdsTls) -> Result<ClientTlsConfig, XdsError> {
    let read = |what: &str, path: &PathBuf| {
        std::fs::read(path).map_err(|e| XdsError::Tls(format!("cannot read the {what} {}: {e}", path.display())))
    };
    let Some(ca) = &tls.ca else {
        return Err(XdsError::Tls(
            "give the CA of the xDS server's certificate (CONFIG_GRPC_XDS_SERVER_TLS_CACERT): the system's roots are not read"
                .to_owned(),
        ));
    };
    let mut config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read("CA", ca)?));
    match (&tls.cert, &tls.key) {
        (Some(cert), Some(key)) => {
            config = config.identity(Identity::from_pem(
                read("client certificate", cert)?,
                read("client key", key)?,
            ));
        }
        (None, None) => {}
        (Some(_), None) => return Err(XdsError::Tls("a client certificate without its key".to_owned())),
        (None, Some(_)) => return Err(XdsError::Tls("a client key without its certificate".to_owned())),
    }
    if let Some(name) = &tls.server_name {
        config = config.domain_name(name.clone());
    }
    Ok(config)
}

/// What applying a snapshot needs besides the engine.
#[derive(Clone)]
pub(crate) struct ApplyOptions {
    /// How resources are loaded (`Options::merge_domains`).
    pub(crate) load: LoadOptions,
    /// `Options::give_back_memory`.
    pub(crate) give_back_memory: fn(),
}

/// Runs the client until `stopped` turns true: connects, applies each
/// snapshot to `shared`'s engine, reconnects. `applied` counts the
/// snapshots applied (for the server to look at readiness again).
pub(crate) fn spawn(
    client: XdsClient,
    shared: Arc<Shared>,
    apply: ApplyOptions,
    applied: watch::Sender<u64>,
    mut stopped: watch::Receiver<bool>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut session = Session {
            client,
            shared,
            apply,
            applied,
            acked: String::new(),
            failures: LogLimit::new(LOG_EVERY),
            connections: LogLimit::new(LOG_EVERY),
        };
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed());
        let mut attempt = 0u32;
        tracing::info!(server = %session.client.server, node = %session.client.node.id, "xDS: connecting to the control plane");
        loop {
            let end = tokio::select! {
                end = session.stream() => end,
                _ = stopped.wait_for(|&s| s) => return,
            };
            if end.received {
                attempt = 0;
            }
            let delay = session.client.backoff.delay(attempt, rng.random::<f64>());
            attempt = attempt.saturating_add(1);
            if let Some(held) = session.failures.hit(tokio::time::Instant::now().into_std()) {
                tracing::warn!(
                    server = %session.client.server,
                    error = %end.why,
                    delay = ?delay,
                    failures_since_last_line = held,
                    "xDS: {}; reconnecting after the delay, the config in force still serving",
                    if end.received { "the stream to the control plane ended" } else { "cannot reach the control plane" },
                );
            }
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                _ = stopped.wait_for(|&s| s) => return,
            }
        }
    })
}

/// A random seed, different in each process.
fn seed() -> u64 {
    use std::hash::BuildHasher;
    std::collections::hash_map::RandomState::new().hash_one(std::process::id())
}

/// The client's state across streams.
struct Session {
    client: XdsClient,
    shared: Arc<Shared>,
    apply: ApplyOptions,
    applied: watch::Sender<u64>,
    /// The version of the last snapshot applied (empty before any).
    acked: String,
    failures: LogLimit,
    connections: LogLimit,
}

/// How a stream ended.
struct StreamEnd {
    /// Whether it brought a response.
    received: bool,
    why: String,
}

impl Session {
    /// One stream: connects, subscribes, and applies and answers each
    /// response until the stream ends.
    async fn stream(&mut self) -> StreamEnd {
        let end = |received: bool, why: String| StreamEnd { received, why };
        let channel: Channel = match self.client.endpoint.connect().await {
            Ok(channel) => channel,
            Err(e) => return end(false, format!("cannot connect: {}", error_chain(&e))),
        };
        let mut ads = AggregatedDiscoveryServiceClient::new(channel);
        if let Some(max) = self.client.max_message_bytes {
            ads = ads.max_decoding_message_size(max);
        }
        let (requests, outgoing) = mpsc::channel(4);
        // The receiver is alive: this cannot fail.
        let _ = requests.send(self.request(String::new(), None)).await;
        let mut request = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(outgoing));
        for (key, value) in &self.client.headers {
            request.metadata_mut().insert(key.clone(), value.clone());
        }
        let mut responses = match ads.stream_aggregated_resources(request).await {
            Ok(response) => response.into_inner(),
            Err(status) => return end(false, status_text(&status)),
        };
        let shared = Arc::clone(&self.shared);
        shared.service.metrics().xds_connected(true);
        let end = |received: bool, why: String| {
            shared.service.metrics().xds_connected(false);
            StreamEnd { received, why }
        };
        if let Some(held) = self.connections.hit(tokio::time::Instant::now().into_std()) {
            tracing::info!(
                server = %self.client.server,
                version = %self.acked,
                connections_since_last_line = held,
                "xDS: connected to the control plane; subscribed to RateLimitConfig"
            );
        }
        let mut received = false;
        loop {
            match responses.message().await {
                Ok(Some(response)) => {
                    received = true;
                    if let Some(answer) = self.answer(response).await {
                        // A failed send means the stream is gone: the
                        // next read says why.
                        let _ = requests.send(answer).await;
                    }
                }
                Ok(None) => return end(received, "the control plane closed the stream".to_owned()),
                Err(status) => return end(received, status_text(&status)),
            }
        }
    }

    /// A request of the subscription: the last version applied, the nonce
    /// of the response answered, and for a NACK the error.
    fn request(&self, nonce: String, error: Option<String>) -> DiscoveryRequest {
        DiscoveryRequest {
            version_info: self.acked.clone(),
            node: Some(self.client.node.clone()),
            resource_names: Vec::new(),
            type_url: RATE_LIMIT_CONFIG_TYPE.to_owned(),
            response_nonce: nonce,
            error_detail: error.map(|message| Status {
                code: INVALID_ARGUMENT,
                message,
                details: Vec::new(),
            }),
        }
    }

    /// Applies a response's snapshot and says how to answer it: an ACK or
    /// a NACK; nothing for a response of another type.
    async fn answer(&mut self, response: DiscoveryResponse) -> Option<DiscoveryRequest> {
        if response.type_url != RATE_LIMIT_CONFIG_TYPE {
            tracing::warn!(type_url = %response.type_url, "xDS: a response of a type not asked for, ignored");
            return None;
        }
        let DiscoveryResponse {
            version_info: version,
            resources,
            nonce,
            ..
        } = response;
        let shared = Arc::clone(&self.shared);
        let apply = self.apply.clone();
        // Off the runtime's threads: loading parses, and the old config is
        // freed where it is replaced.
        let outcome = tokio::task::spawn_blocking(move || {
            let loaded = config_from_resources(&resources, &apply.load);
            let (config, errors) = match loaded {
                Ok(config) => (Ok(config), Vec::new()),
                Err(errors) => {
                    let first = errors
                        .first()
                        .cloned()
                        .unwrap_or_else(|| snapshot_error("invalid snapshot"));
                    (Err(first), errors)
                }
            };
            let resources = resources.len();
            // A snapshot may remove every limit: the control plane says what
            // is limited (Envoy Gateway sends one without any when its last
            // policy is removed); it is no file caught half written.
            crate::reload::apply(&shared, config, true, apply.give_back_memory)
                .map(|applied| (applied, resources))
                .map_err(|e| if errors.is_empty() { vec![e] } else { errors })
        })
        .await
        .unwrap_or_else(|e| Err(vec![snapshot_error(&format!("the snapshot's load failed: {e}"))]));
        match outcome {
            Ok((applied, resources)) => {
                self.acked.clone_from(&version);
                if applied.emptying {
                    tracing::warn!(
                        %version,
                        resources,
                        domains = applied.domains,
                        changes = %applied.changes,
                        "xDS: config applied; it removes every limit the config in force had"
                    );
                } else {
                    tracing::info!(
                        %version,
                        resources,
                        domains = applied.domains,
                        changes = %applied.changes,
                        "xDS: config applied"
                    );
                }
                self.shared.service.metrics().xds_update(true);
                self.shared.awaiting_xds.store(false, Ordering::Relaxed);
                self.applied.send_modify(|n| *n += 1);
                Some(self.request(nonce, None))
            }
            Err(errors) => {
                let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
                let text = text.join("\n");
                tracing::error!(
                    %version,
                    in_force = %self.acked,
                    error = %text,
                    "xDS: config rejected (NACK); the config in force keeps serving"
                );
                self.shared.service.metrics().xds_update(false);
                Some(self.request(nonce, Some(text)))
            }
        }
    }
}

/// An error about a whole snapshot.
fn snapshot_error(message: &str) -> ConfigError {
    ConfigError {
        file: "xds".to_owned(),
        line: 0,
        column: 0,
        key: None,
        message: message.to_owned(),
    }
}

/// A gRPC status in words.
fn status_text(status: &tonic::Status) -> String {
    format!("{:?}: {}", status.code(), status.message())
}

/// An error and its sources, joined by `: `.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}
