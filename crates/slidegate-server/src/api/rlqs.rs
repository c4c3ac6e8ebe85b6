//! Envoy's Rate Limit Quota Service over gRPC:
//! `envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas`.
//! Each stream is served by a task of its own: every usage report is
//! answered by [`Quotas::report`] with one response holding an action per
//! bucket that gets one (none, if none does).
//!
//! A stream costs its client, not the others: its answers wait in a queue
//! of [`QUEUED`] responses, and a client that lets it fill (it does not
//! read) has its stream ended; a stream that sends nothing for the idle
//! time ([`crate::quota::QuotaOptions::idle_stream`]) is ended with
//! `DEADLINE_EXCEEDED`; a report without a domain, or naming another
//! domain than the first, ends it with `INVALID_ARGUMENT`; a server that
//! stops ends every stream with `UNAVAILABLE`, for its Envoy to open one
//! elsewhere. While a stream lasts its connection is not idle
//! ([`StreamHold`]). What a stream
//! held stays held until its TTL passes, as Envoy keeps its assignments
//! that long: ending a stream never frees tokens early.

use crate::metrics::QuotaEnd;
use crate::proto::quota::rate_limit_quota_service_server::{RateLimitQuotaService, RateLimitQuotaServiceServer};
use crate::proto::quota::{RateLimitQuotaResponse, RateLimitQuotaUsageReports};
use crate::quota::{QuotaError, QuotaStream, Quotas};
use crate::service::Shared;
use std::sync::Arc;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;

/// The largest usage report taken, in bytes: an Envoy reports all its
/// buckets in one message, about 50 bytes each (10,000 buckets, the
/// default most a stream may have, in half a MiB).
pub const MAX_REPORT_BYTES: usize = 4 << 20;

/// The most responses queued for a client that is not reading.
pub const QUEUED: usize = 8;

/// The path prefix of the service's methods.
pub(crate) const RLQS_PATH: &str = "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/";

/// The quota service: what the server shares, and the engine.
pub struct Rlqs {
    shared: Arc<Shared>,
    quotas: Arc<Quotas>,
    /// Turns true when the server stops: every stream then ends.
    stopped: watch::Receiver<bool>,
}

impl Rlqs {
    /// The tonic service, decoding reports of at most
    /// [`MAX_REPORT_BYTES`].
    /// Its streams end when `stopped` turns true.
    pub(crate) fn service(
        shared: Arc<Shared>,
        quotas: Arc<Quotas>,
        stopped: watch::Receiver<bool>,
    ) -> RateLimitQuotaServiceServer<Rlqs> {
        RateLimitQuotaServiceServer::new(Rlqs {
            shared,
            quotas,
            stopped,
        })
        .max_decoding_message_size(MAX_REPORT_BYTES)
    }
}

type Responses = ReceiverStream<Result<RateLimitQuotaResponse, tonic::Status>>;

#[tonic::async_trait]
impl RateLimitQuotaService for Rlqs {
    type StreamRateLimitQuotasStream = Responses;

    async fn stream_rate_limit_quotas(
        &self,
        mut request: tonic::Request<tonic::Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<tonic::Response<Responses>, tonic::Status> {
        // Kept while the stream lasts: its connection is not idle.
        let hold = request.extensions_mut().remove::<StreamHold>();
        let (answers, queue) = mpsc::channel(QUEUED);
        let stream = match envoy_id(request.metadata()) {
            Some(envoy) => self.quotas.open_as(envoy),
            None => self.quotas.open(),
        };
        let (shared, quotas, stopped) = (Arc::clone(&self.shared), Arc::clone(&self.quotas), self.stopped.clone());
        tokio::spawn(async move {
            serve(shared, quotas, stream, request.into_inner(), answers, stopped).await;
            drop(hold);
        });
        Ok(tonic::Response::new(ReceiverStream::new(queue)))
    }
}

/// How a stream ended, for its log line.
enum End {
    /// The client closed its side.
    Closed,
    /// The client's side failed (reset, a bad message).
    Failed(tonic::Status),
    /// Nothing came within the idle time.
    Idle,
    /// Its answers were not read.
    NotReading,
    /// A report the stream cannot go on after.
    Refused(QuotaError),
    /// The server is stopping.
    Stopping,
}

/// What keeps a stream's connection from being idle while the stream
/// lasts: the connection layer puts one in each stream's request
/// (`crate::net::admission`), and the stream's task keeps it until the
/// stream ends.
#[derive(Clone)]
pub struct StreamHold {
    _held: Arc<dyn std::any::Any + Send + Sync>,
}

impl StreamHold {
    /// A hold that lasts as long as `held` does.
    pub(crate) fn new(held: Arc<dyn std::any::Any + Send + Sync>) -> StreamHold {
        StreamHold { _held: held }
    }
}

/// The header naming a stream's Envoy, set in the filter's `rlqs_server`
/// (`initial_metadata`): see [`Quotas::open_as`].
pub const ENVOY_ID: &str = "x-slidegate-envoy-id";

/// The longest Envoy id taken; a longer one is ignored.
const MAX_ENVOY_ID: usize = 256;

/// The stream's Envoy id, if it has a usable one.
fn envoy_id(metadata: &tonic::metadata::MetadataMap) -> Option<&str> {
    metadata
        .get(ENVOY_ID)
        .and_then(|v| v.to_str().ok())
        .filter(|id| !id.is_empty() && id.len() <= MAX_ENVOY_ID)
}

/// Serves one stream until it ends, then leaves its buckets' ledgers.
async fn serve(
    shared: Arc<Shared>,
    quotas: Arc<Quotas>,
    mut stream: QuotaStream,
    mut reports: tonic::Streaming<RateLimitQuotaUsageReports>,
    answers: mpsc::Sender<Result<RateLimitQuotaResponse, tonic::Status>>,
    mut stopped: watch::Receiver<bool>,
) {
    let metrics = shared.service.metrics();
    metrics.quota_stream(true);
    let started = tokio::time::Instant::now();
    let idle = quotas.options().idle_stream;
    let end = loop {
        let next = tokio::select! {
            next = tokio::time::timeout(idle, reports.message()) => next,
            _ = stopped.wait_for(|&s| s) => break End::Stopping,
        };
        let report = match next {
            Err(_) => break End::Idle,
            Ok(Err(status)) => break End::Failed(status),
            Ok(Ok(None)) => break End::Closed,
            Ok(Ok(Some(report))) => report,
        };
        let first = stream.domain().is_none();
        let config = shared.engine().config();
        let answer = quotas.report(&mut stream, config.as_ref(), report, metrics).await;
        if first && let Some(domain) = stream.domain() {
            // The domain as configured: a client's own is not logged.
            let domain = if config.domain(domain).is_some() {
                domain
            } else {
                "(not configured)"
            };
            tracing::info!(domain, "rate limit quota stream started");
        }
        match answer {
            // Every report is answered, with no action if none is due, so
            // that a client can tell its report was read.
            Ok(response) => {
                if answers.try_send(Ok(response)).is_err() {
                    break End::NotReading;
                }
            }
            Err(e) => break End::Refused(e),
        }
    };
    let config = shared.engine().config();
    let domain = stream
        .domain()
        .filter(|d| config.domain(d).is_some())
        .unwrap_or("(not configured)")
        .to_owned();
    let buckets = stream.buckets();
    let secs = started.elapsed().as_secs();
    let (reason, status) = match &end {
        End::Closed => {
            tracing::info!(domain, buckets, secs, "rate limit quota stream ended by the client");
            (QuotaEnd::Closed, None)
        }
        End::Failed(status) => {
            tracing::info!(domain, buckets, secs, error = %status.message(), "rate limit quota stream failed");
            (QuotaEnd::Failed, None)
        }
        End::Idle => {
            tracing::info!(
                domain,
                buckets,
                secs,
                "rate limit quota stream ended: no report within {idle:?}"
            );
            let status = tonic::Status::deadline_exceeded(format!("no usage report in {idle:?}: stream closed"));
            (QuotaEnd::Idle, Some(status))
        }
        End::NotReading => {
            tracing::warn!(
                domain,
                buckets,
                secs,
                "rate limit quota stream ended: the client left {QUEUED} responses unread"
            );
            (QuotaEnd::NotReading, None)
        }
        End::Stopping => {
            tracing::info!(
                domain,
                buckets,
                secs,
                "rate limit quota stream ended: slidegate is stopping"
            );
            let status = tonic::Status::unavailable("slidegate is stopping: open a new stream");
            (QuotaEnd::Stopping, Some(status))
        }
        End::Refused(e) => {
            tracing::warn!(domain, buckets, secs, error = %e, "rate limit quota stream ended");
            (QuotaEnd::Refused, Some(tonic::Status::invalid_argument(e.to_string())))
        }
    };
    if let Err(e) = quotas.close(stream, metrics).await {
        tracing::warn!(error = %e, "rate limit quota stream's ledgers not updated: its holds end with their TTL");
    }
    metrics.quota_stream_ended(reason);
    metrics.quota_stream(false);
    // Last, so that a client that reads the status sees the stream's end
    // counted.
    if let Some(status) = status {
        let _ = answers.try_send(Err(status));
    }
}
