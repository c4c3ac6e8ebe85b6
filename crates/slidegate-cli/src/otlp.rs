//! `serve --otlp-endpoint`: the decision spans (`slidegate_server::trace`)
//! exported over OTLP/gRPC, in batches.
//!
//! A request only hands its finished span to the SDK's batch processor (a
//! bounded queue: when full, spans are dropped, never waited for); the
//! processor's own thread sends a batch every `OTEL_BSP_SCHEDULE_DELAY`
//! (5 s) or when 512 are queued, over a lazily connected tonic channel on
//! the service's tokio runtime. A collector that does not answer costs the
//! decisions nothing, and its failure is logged once until an export
//! succeeds again.

use anyhow::Context as _;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::{Layer, filter::LevelFilter};

/// The longest the last spans are waited for at shutdown.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// The tracer provider exporting to one collector.
pub(crate) struct Otlp {
    provider: SdkTracerProvider,
}

impl Otlp {
    /// Exports to the collector at `endpoint` (`http://host:4317`) as
    /// service `service_name`. Must run inside the tokio runtime that will
    /// carry the exports (the channel's connection lives there); connects
    /// only when the first batch goes out.
    ///
    /// # Errors
    ///
    /// If `endpoint` is not an `http://` URL with a host (TLS is not built
    /// in).
    pub(crate) fn start(endpoint: &str, service_name: &str) -> anyhow::Result<Self> {
        let uri: http::Uri = endpoint
            .parse()
            .with_context(|| format!("--otlp-endpoint {endpoint}: not a URL"))?;
        anyhow::ensure!(
            uri.scheme_str() == Some("http") && uri.host().is_some(),
            "--otlp-endpoint {endpoint}: must be http://HOST:PORT (TLS is not built in)"
        );
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint)
            .build()
            .with_context(|| format!("--otlp-endpoint {endpoint}: cannot export there"))?;
        let exporter = LoggedExporter {
            inner: exporter,
            endpoint: endpoint.to_owned(),
            failing: AtomicBool::new(false),
        };
        let resource = Resource::builder().with_service_name(service_name.to_owned()).build();
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource)
            .build();
        Ok(Otlp { provider })
    }

    /// The layer that turns the decision spans (and only those) into
    /// OpenTelemetry spans.
    pub(crate) fn layer<S>(&self) -> impl Layer<S> + use<S>
    where
        S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    {
        tracing_opentelemetry::layer()
            .with_tracer(self.provider.tracer("slidegate"))
            .with_location(false)
            .with_threads(false)
            .with_tracked_inactivity(false)
            .with_filter(
                Targets::new()
                    .with_default(LevelFilter::OFF)
                    .with_target(slidegate_server::trace::DECISION_TARGET, LevelFilter::INFO),
            )
    }

    /// Sends the spans still queued and stops the exporter, waiting at
    /// most [`FLUSH_TIMEOUT`]. Call it from outside the runtime's tasks
    /// (it blocks), while the runtime still runs (it carries the export).
    pub(crate) fn shutdown(self) {
        if let Err(e) = self.provider.shutdown_with_timeout(FLUSH_TIMEOUT) {
            tracing::warn!("the last spans may be lost: {e}");
        }
    }
}

/// The OTLP exporter, logging a failure once when exports start failing
/// and once when they succeed again, however many batches fail between.
#[derive(Debug)]
struct LoggedExporter {
    inner: opentelemetry_otlp::SpanExporter,
    endpoint: String,
    failing: AtomicBool,
}

impl SpanExporter for LoggedExporter {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let spans = batch.len();
        let result = self.inner.export(batch).await;
        if let Err(e) = &result {
            tracing::debug!("span export failed: {e}");
        }
        match &result {
            Err(e) if !self.failing.swap(true, Ordering::Relaxed) => tracing::warn!(
                "cannot export spans to the OTLP collector at {}: {e}; {spans} spans dropped, and until an export succeeds, \
                 spans are dropped without another word",
                self.endpoint
            ),
            Ok(()) if self.failing.swap(false, Ordering::Relaxed) => {
                tracing::info!("exporting spans to the OTLP collector at {} again", self.endpoint);
            }
            _ => {}
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}
