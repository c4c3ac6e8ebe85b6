//! Starting, reloading and stopping the service.

use crate::config::{Config, ConfigError, LoadOptions};
pub use crate::conn::Timeouts;
use crate::conn::{Guarded, HTTP2_PREFACE_LEN};
use crate::engine::Settings;
use crate::engine::{Engine, InputLimits};
use crate::grpc::{Grpc, HeaderOptions, ResponseHeaderNames};
use crate::metrics::Metrics;
use crate::redis_store::{RedisConnectError, RedisOptions};
use slidegate_core::Clock;
use slidegate_memory::Budget;
use slidegate_tower::LegacyReset;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How to run the service.
#[derive(Clone, Debug)]
pub struct Options {
    /// Config files or directories of them; none serves only the ad-hoc
    /// API.
    pub config: Vec<PathBuf>,
    /// The HTTP address.
    pub http: SocketAddr,
    /// The gRPC address.
    pub grpc: SocketAddr,
    /// The budget of the counters of sliding windows of up to 8 buckets
    /// (the default algorithm).
    pub budget: Budget,
    /// The budget of the counters of every other algorithm.
    pub other_budget: Budget,
    /// Limits on what a request may carry.
    pub input: InputLimits,
    /// Largest HTTP body, in bytes.
    pub body_limit: usize,
    /// How often the config files are checked for changes; `None` never.
    pub reload_every: Option<Duration>,
    /// Whether gRPC answers carry the rate-limit headers in
    /// `response_headers_to_add` (off by default, as in envoyproxy/ratelimit).
    pub grpc_headers: bool,
    /// `X-RateLimit-*` on HTTP answers (and gRPC ones, when on), with this
    /// flavour of `-Reset`.
    pub legacy_headers: Option<LegacyReset>,
    /// Count in Redis, shared with every instance on it, instead of in
    /// memory (the budgets then do not apply).
    pub redis: Option<RedisOptions>,
    /// The bearer token `POST /v1/reset` requires; `None` (the default)
    /// turns the endpoint off (404).
    pub admin_token: Option<String>,
    /// How long connections may take and stay silent.
    pub timeouts: Timeouts,
    /// How requests are decided (envoyproxy/ratelimit's
    /// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`, `SHADOW_MODE`,
    /// `QUOTA_MODE`, `RESPONSE_DYNAMIC_METADATA`).
    pub settings: Settings,
    /// envoyproxy/ratelimit's `RateLimit-Limit`, `-Remaining` and `-Reset`
    /// in gRPC (and `/json`) answers (`LIMIT_RESPONSE_HEADERS_ENABLED`),
    /// under these names.
    pub response_headers: Option<ResponseHeaderNames>,
    /// envoyproxy/ratelimit's `NEAR_LIMIT_RATIO`: the share of a limit
    /// above which admitted hits count as near the limit, from 0 to 1.
    pub near_limit_ratio: f64,
    /// envoyproxy/ratelimit's `MERGE_DOMAIN_CONFIG`: files of one domain
    /// are merged into one (a top-level descriptor defined twice is an
    /// error); without it, a domain in two files is an error.
    pub merge_domains: bool,
    /// How long a stopping server keeps serving after its health turns
    /// NOT_SERVING, for load balancers to notice.
    pub drain_delay: Duration,
    /// The largest config file read, in bytes.
    pub max_config_bytes: u64,
    /// With Redis: not ready (`/readyz` 503, gRPC health NOT_SERVING)
    /// while Redis does not answer a `PING`, looked at every second.
    pub ready_requires_redis: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            config: Vec::new(),
            http: SocketAddr::from(([127, 0, 0, 1], 8080)),
            grpc: SocketAddr::from(([127, 0, 0, 1], 8081)),
            budget: Budget::bytes(256 << 20),
            other_budget: Budget::bytes(32 << 20),
            input: InputLimits::default(),
            body_limit: 64 << 10,
            reload_every: Some(Duration::from_secs(1)),
            grpc_headers: false,
            legacy_headers: None,
            redis: None,
            admin_token: None,
            timeouts: Timeouts::default(),
            settings: Settings::default(),
            response_headers: None,
            near_limit_ratio: crate::metrics::DEFAULT_NEAR_LIMIT_RATIO,
            merge_domains: false,
            drain_delay: Duration::ZERO,
            max_config_bytes: crate::config::DEFAULT_MAX_FILE_BYTES,
            ready_requires_redis: false,
        }
    }
}

/// Why the service could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The config did not load.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Redis could not be reached (or its URL or prefix is bad).
    #[error(transparent)]
    Redis(#[from] RedisConnectError),
    /// The near-limit ratio is out of range.
    #[error(transparent)]
    NearLimitRatio(#[from] crate::metrics::NearLimitRatioError),
    /// The admin token is empty.
    #[error("the admin token is empty: give a token, or none to turn `POST /v1/reset` off")]
    EmptyAdminToken,
    /// An address could not be bound.
    #[error("cannot listen on {addr}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
}

/// What the HTTP and gRPC front ends share.
pub struct Shared<C> {
    pub(crate) engine: Engine<C>,
    pub(crate) metrics: Metrics,
    pub(crate) grpc_headers: HeaderOptions,
    pub(crate) http_headers: HeaderOptions,
    pub(crate) body_limit: usize,
    pub(crate) body_timeout: Duration,
    pub(crate) admin_token: Option<Box<[u8]>>,
    paths: Vec<PathBuf>,
    load_options: LoadOptions,
    /// The server is draining: `/readyz` answers 503.
    pub(crate) draining: std::sync::atomic::AtomicBool,
    /// Redis does not answer and readiness requires it: `/readyz` answers
    /// 503.
    pub(crate) redis_down: std::sync::atomic::AtomicBool,
    /// Reloads tried so far, good or bad.
    reloads: watch::Sender<u64>,
}

impl<C: Clock> Shared<C> {
    /// What the front ends share, serving `engine` as `options` say (its
    /// addresses, budgets, Redis and reload interval are not read here).
    fn new(engine: Engine<C>, options: &Options) -> Self {
        Shared {
            engine: engine.with_settings(options.settings),
            // `start` checks the ratio; a bad one given to `http_router`
            // falls back to the default.
            metrics: Metrics::with_near_limit_ratio(options.near_limit_ratio).unwrap_or_default(),
            grpc_headers: HeaderOptions {
                draft: options.grpc_headers,
                legacy: options.legacy_headers.filter(|_| options.grpc_headers),
                envoy: options.response_headers.clone(),
            },
            http_headers: HeaderOptions {
                draft: true,
                legacy: options.legacy_headers,
                envoy: None,
            },
            body_limit: options.body_limit,
            body_timeout: options.timeouts.request,
            admin_token: options.admin_token.as_deref().map(|t| t.trim().as_bytes().into()),
            paths: options.config.clone(),
            load_options: load_options(options),
            draining: std::sync::atomic::AtomicBool::new(false),
            redis_down: std::sync::atomic::AtomicBool::new(false),
            reloads: watch::Sender::new(0),
        }
    }

    /// Loads the config files again and, if they are valid, serves them
    /// from now on; if not, the old config keeps serving. Either way the
    /// reload is counted.
    ///
    /// # Errors
    ///
    /// The [`ConfigError`] of the new files.
    pub fn reload(&self) -> Result<(), ConfigError> {
        let result = self.load_again();
        self.reloads.send_modify(|n| *n += 1);
        result
    }

    /// Readiness follows Redis: NOT_SERVING (and `/readyz` 503) when it
    /// stops answering, SERVING again when it answers (unless draining);
    /// each change logged once.
    async fn redis_readiness(&self, answers: bool, health: &tonic_health::server::HealthReporter) {
        use std::sync::atomic::Ordering::Relaxed;
        let was_down = self.redis_down.swap(!answers, Relaxed);
        if was_down != answers {
            // No change.
            return;
        }
        let status = if answers && !self.draining() {
            tracing::info!("Redis answers: ready again");
            tonic_health::ServingStatus::Serving
        } else {
            if !answers {
                tracing::warn!("Redis does not answer: not ready (--ready-requires-redis)");
            }
            tonic_health::ServingStatus::NotServing
        };
        for name in HEALTH_NAMES {
            health.set_service_status(name, status).await;
        }
    }

    /// Whether the server is draining (stopping: health NOT_SERVING).
    pub fn draining(&self) -> bool {
        self.draining.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Reloads tried so far (good or bad), to wait on.
    pub fn reloads(&self) -> watch::Receiver<u64> {
        self.reloads.subscribe()
    }

    fn load_again(&self) -> Result<(), ConfigError> {
        let loaded = Config::load_with(&self.paths, &self.load_options).inspect(log_warnings);
        let before = self.engine.config();
        match loaded.and_then(|config| self.engine.replace_config(config)) {
            Ok(()) => {
                self.metrics.reload(true);
                let after = self.engine.config();
                let changes = crate::config::ConfigChanges::between(&before, &after);
                tracing::info!(domains = after.domains().count(), changes = %changes, "config reloaded");
                Ok(())
            }
            Err(e) => {
                self.metrics.reload(false);
                tracing::error!(error = %e, "config reload failed; the previous config stays in force");
                Err(e)
            }
        }
    }

    /// The engine.
    pub fn engine(&self) -> &Engine<C> {
        &self.engine
    }

    /// The metrics in text form.
    pub fn metrics_text(&self) -> String {
        self.metrics.render(&self.engine.stats(), self.engine.shared_store())
    }
}

/// A running service.
pub struct Running<C> {
    /// Where HTTP listens.
    pub http: SocketAddr,
    /// Where gRPC listens.
    pub grpc: SocketAddr,
    shared: Arc<Shared<C>>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    health: tonic_health::server::HealthReporter,
    drain_delay: Duration,
}

/// The names the gRPC health service answers for: the whole server (`""`)
/// and envoyproxy/ratelimit's service name.
const HEALTH_NAMES: [&str; 2] = ["", "ratelimit"];

impl<C: Clock> Running<C> {
    /// What the front ends share (the engine, the metrics, `reload`).
    pub fn shared(&self) -> &Arc<Shared<C>> {
        &self.shared
    }

    /// Drains: the gRPC health service answers NOT_SERVING and `/readyz`
    /// 503 at once, new connections are still served for the drain delay
    /// (so that load balancers notice), then the listeners close, the
    /// requests in flight finish, and this returns when both servers have
    /// stopped.
    pub async fn shutdown(self) {
        self.shared.draining.store(true, std::sync::atomic::Ordering::Relaxed);
        for name in HEALTH_NAMES {
            self.health
                .set_service_status(name, tonic_health::ServingStatus::NotServing)
                .await;
        }
        if !self.drain_delay.is_zero() {
            tracing::info!(delay = ?self.drain_delay, "draining: health says NOT_SERVING; still serving");
            tokio::time::sleep(self.drain_delay).await;
        }
        let _ = self.stop.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
        // The hybrid mode's last counts go to Redis before the process ends.
        self.shared.engine.flush().await;
    }

    /// Runs until `signal` resolves, then shuts down gracefully.
    pub async fn run_until(self, signal: impl Future<Output = ()>) {
        signal.await;
        tracing::info!("shutting down: finishing the requests in flight");
        self.shutdown().await;
    }
}

/// A fingerprint of the config files: their names, lengths and
/// modification times, to notice a change.
fn fingerprint(paths: &[PathBuf]) -> Vec<(PathBuf, u64, Option<SystemTime>)> {
    let mut out = Vec::new();
    for path in paths {
        let mut files = vec![path.clone()];
        if let Ok(dir) = std::fs::read_dir(path) {
            files = dir.filter_map(|e| e.ok().map(|e| e.path())).collect();
            files.sort();
        }
        for file in files {
            let meta = std::fs::metadata(&file).ok();
            let len = meta.as_ref().map_or(0, std::fs::Metadata::len);
            let modified = meta.and_then(|m| m.modified().ok());
            out.push((file, len, modified));
        }
    }
    out
}

/// Starts the service: loads the config, binds both addresses, serves, and
/// watches the config files.
///
/// # Errors
///
/// [`StartError`] if the config does not load (or, with Redis, has a
/// limit without a Redis form), Redis cannot be reached, or an address
/// cannot be bound.
pub async fn start<C: Clock + Send + Sync + 'static>(options: Options, clock: C) -> Result<Running<C>, StartError> {
    if options.admin_token.as_deref().is_some_and(|t| t.trim().is_empty()) {
        return Err(StartError::EmptyAdminToken);
    }
    Metrics::with_near_limit_ratio(options.near_limit_ratio)?;
    let config = Config::load_with(&options.config, &load_options(&options))?;
    log_warnings(&config);
    let (engine, probe) = match options.redis.clone() {
        None => (
            Engine::new(config, clock, options.budget, options.other_budget, options.input),
            None,
        ),
        Some(redis) => {
            let (store, probe) = crate::redis_store::connect_probed(&redis).await?;
            let engine = Engine::with_store(config, store, true, options.input)?.with_store_name(redis.store_name());
            (engine, Some(probe))
        }
    };
    let http_listener = TcpListener::bind(options.http)
        .await
        .map_err(|source| StartError::Bind {
            addr: options.http,
            source,
        })?;
    let grpc_listener = TcpListener::bind(options.grpc)
        .await
        .map_err(|source| StartError::Bind {
            addr: options.grpc,
            source,
        })?;
    let http = http_listener.local_addr().unwrap_or(options.http);
    let grpc = grpc_listener.local_addr().unwrap_or(options.grpc);
    let shared = Arc::new(Shared::new(engine, &options));
    let (stop, stopped) = watch::channel(false);
    let until_stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|&s| s).await;
    };

    let mut tasks = Vec::new();
    let timeouts = options.timeouts;
    let router = crate::http::router(Arc::clone(&shared));
    tasks.push(tokio::spawn(crate::conn::serve_http(
        http_listener,
        router,
        timeouts,
        stopped.clone(),
    )));

    let grpc_service = Grpc::service(Arc::clone(&shared)).max_decoding_message_size(options.body_limit);
    let (health, health_service) = tonic_health::server::health_reporter();
    for name in HEALTH_NAMES {
        health
            .set_service_status(name, tonic_health::ServingStatus::Serving)
            .await;
    }
    let grpc_stop = until_stopped(stopped.clone());
    tasks.push(tokio::spawn(async move {
        // Every connection must send the HTTP/2 preface within the header
        // timeout and is closed after the idle timeout without a byte.
        let incoming = tokio_stream::StreamExt::map(
            tokio_stream::wrappers::TcpListenerStream::new(grpc_listener),
            move |accepted| accepted.map(|stream| Guarded::new(stream, HTTP2_PREFACE_LEN, timeouts)),
        );
        let served = tonic::transport::Server::builder()
            .timeout(timeouts.request)
            .add_service(health_service)
            .add_service(grpc_service)
            .serve_with_incoming_shutdown(incoming, grpc_stop)
            .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "the gRPC server stopped");
        }
    }));

    if let Some(redis) = &options.redis {
        // The store's health in the log: a warning when Redis starts
        // failing, a line when it is back; never one per request.
        let watched = Arc::clone(&shared);
        let policy = crate::redis_store::policy_name(redis.failure);
        let mut stopped = stopped.clone();
        let readiness = probe.filter(|_| options.ready_requires_redis);
        let health = health.clone();
        tasks.push(tokio::spawn(async move {
            let mut log = crate::redis_store::OutageLog::default();
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = stopped.wait_for(|&s| s) => return,
                }
                if let Some(probe) = &readiness {
                    watched.redis_readiness(probe.answers().await, &health).await;
                }
                match log.observe(&watched.engine.stats().failover) {
                    Some(crate::redis_store::Transition::Failing(calls)) => tracing::warn!(
                        calls,
                        policy = %policy,
                        "Redis is failing: decisions follow the failure policy until it answers again"
                    ),
                    Some(crate::redis_store::Transition::Recovered) => {
                        tracing::info!("Redis answers again: decisions come from Redis");
                    }
                    None => {}
                }
            }
        }));
    }

    if let Some(every) = options.reload_every.filter(|_| !options.config.is_empty()) {
        let watched = Arc::clone(&shared);
        let mut stopped = stopped.clone();
        tasks.push(tokio::spawn(async move {
            let mut seen = fingerprint(&watched.paths);
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = stopped.wait_for(|&s| s) => return,
                }
                let now = fingerprint(&watched.paths);
                if now != seen {
                    seen = now;
                    // Parsing a large config takes time: off the runtime's
                    // threads, the old config serving meanwhile.
                    let shared = Arc::clone(&watched);
                    let _ = tokio::task::spawn_blocking(move || shared.reload()).await;
                }
            }
        }));
    }
    tracing::info!(%http, %grpc, "serving");
    Ok(Running {
        http,
        grpc,
        shared,
        stop,
        tasks,
        health,
        drain_delay: options.drain_delay,
    })
}

/// The HTTP routes [`start`] serves (`/json`, `/v1/check`, `/v1/reset`,
/// `/healthz`, `/metrics`), over `engine`, without a listener, the gRPC
/// side or the config watch: to drive the service in-process, one request
/// at a time (`tower::ServiceExt::oneshot`), as the tests and fuzz targets
/// do. `options` gives the body limit and the headers; its addresses,
/// budgets, Redis options and reload interval are not read.
pub fn http_router<C: Clock + Send + Sync + 'static>(engine: Engine<C>, options: &Options) -> axum::Router {
    crate::http::router(Arc::new(Shared::new(engine, options)))
}

/// A future that resolves on SIGTERM or SIGINT (Ctrl-C). The handlers are
/// installed when this is called (inside the runtime), so a signal that
/// arrives before the future is first polled is not lost.
///
/// # Errors
///
/// The operating system's error if a handler cannot be installed.
#[cfg(unix)]
pub fn shutdown_signal() -> std::io::Result<impl Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = terminate.recv() => {}
            _ = interrupt.recv() => {}
        }
    })
}

/// A future that resolves on Ctrl-C.
///
/// # Errors
///
/// None on this platform; the signature matches Unix's.
#[cfg(not(unix))]
pub fn shutdown_signal() -> std::io::Result<impl Future<Output = ()>> {
    Ok(async {
        let _ = tokio::signal::ctrl_c().await;
    })
}

/// How the config files are read.
fn load_options(options: &Options) -> LoadOptions {
    LoadOptions::default()
        .merge_domains(options.merge_domains)
        .max_file_bytes(options.max_config_bytes)
}

/// Logs each of a loaded config's warnings once (at start and at each
/// reload that loads it).
fn log_warnings(config: &Config) {
    for warning in config.warnings() {
        tracing::warn!("{warning}");
    }
}
