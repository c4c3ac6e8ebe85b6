//! Starting, reloading and stopping the service.

use crate::config::{Config, ConfigError, LoadOptions};
use crate::engine::Settings;
use crate::engine::{Engine, InputLimits};
pub use crate::headers::{HeaderOptions, ResponseHeaderNames};
use crate::metrics::ConnectionStats;
use crate::metrics::Metrics;
pub use crate::metrics::{StatsdError, StatsdOptions};
use crate::net::admission::Admission;
pub use crate::net::admission::ConnectionLimits;
pub use crate::net::conn::Timeouts;
pub use crate::net::listen::Endpoint;
use crate::net::listen::Listener;
pub use crate::net::metrics_listener::{MetricsListener, MetricsPathError};
use crate::net::tls::Tls;
pub use crate::net::tls::{TlsError, TlsOptions};
use crate::net::watch::{FileStamp, fingerprint};
use crate::quota::ledgers::{MemoryLedgers, RedisLedgers};
use crate::quota::{EpochClock, QuotaOptions, Quotas};
pub use crate::reload::Reloader;
use crate::reload::{Watched, log_warnings};
use crate::service::Service;
pub use crate::service::Shared;
pub use crate::trim::give_back_free_memory;
use crate::xds::XdsClient;
pub use crate::xds::{XdsBackoff, XdsError, XdsOptions, XdsTls};
use slidegate_core::Clock;
use slidegate_memory::Budget;
use slidegate_redis::{RedisConnectError, RedisOptions};
use slidegate_tower::LegacyReset;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How to run the service.
#[derive(Clone, Debug)]
pub struct Options {
    /// Config files or directories of them; none serves only the ad-hoc
    /// API.
    pub config: Vec<PathBuf>,
    /// Where HTTP listens.
    pub http: Endpoint,
    /// Where gRPC listens.
    pub grpc: Endpoint,
    /// TLS on both front ends (on TCP; a Unix socket is served in the
    /// clear); `None` serves in the clear.
    pub tls: Option<TlsOptions>,
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
    /// Caps on open connections, HTTP/2 streams and calls in flight, and
    /// connections' maximum age.
    pub connections: ConnectionLimits,
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
    /// Not ready (`/readyz` and `/healthcheck` 503, gRPC health
    /// NOT_SERVING) while the config in force has no domain, as
    /// envoyproxy/ratelimit's `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`: a
    /// `config` folder without a config file then starts (as no domain),
    /// and the server turns ready when a reload brings one. Without any
    /// `config` path it is never ready.
    pub ready_requires_config: bool,
    /// Threads that serve connections, each on a single-threaded runtime
    /// of its own, connections given to them in turn; 0 serves them on the
    /// runtime that calls [`start`] (the default, so that a test's paused
    /// clock governs them).
    pub workers: usize,
    /// Hands the allocator's free memory back to the system after each
    /// reload, once the old config is freed: by default
    /// [`give_back_free_memory`] (glibc's `malloc_trim`). A binary that
    /// sets another global allocator gives that allocator's own.
    pub give_back_memory: fn(),
    /// The config from an xDS control plane instead of files
    /// (envoyproxy/ratelimit's `CONFIG_TYPE=GRPC_XDS_SOTW`); `None` (the
    /// default) reads [`Options::config`]. With it, `config` must be empty.
    pub xds: Option<XdsOptions>,
    /// Accept a reload that empties the config: a folder with no config
    /// file left, a domain left with no limit (see
    /// [`Config::check_reload`]). Off by default: such a reload is refused
    /// with one error line and the config in force keeps serving (a file
    /// caught half written, a volume swapped for an empty one). The start
    /// refuses a folder without a config file either way.
    pub allow_empty_reload: bool,
    /// envoyproxy/ratelimit's stats sent to a statsd server (`USE_STATSD`);
    /// `None` (the default) sends none.
    pub statsd: Option<StatsdOptions>,
    /// envoyproxy/ratelimit's Prometheus endpoint (`USE_PROMETHEUS`): an
    /// HTTP listener of its own serving the metrics with its stats as Envoy
    /// Gateway's default mapping names them; `None` (the default) opens
    /// none (`GET /metrics` on the HTTP listener is there either way).
    pub metrics_listener: Option<MetricsListener>,
    /// The Rate Limit Quota Service's TTL and bounds (its ledgers are in
    /// Redis with [`Options::redis`], in memory otherwise).
    pub quota: QuotaOptions,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            config: Vec::new(),
            http: SocketAddr::from(([127, 0, 0, 1], 8080)).into(),
            grpc: SocketAddr::from(([127, 0, 0, 1], 8081)).into(),
            tls: None,
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
            connections: ConnectionLimits::default(),
            settings: Settings::default(),
            response_headers: None,
            near_limit_ratio: crate::metrics::DEFAULT_NEAR_LIMIT_RATIO,
            merge_domains: false,
            drain_delay: Duration::ZERO,
            max_config_bytes: crate::config::DEFAULT_MAX_FILE_BYTES,
            ready_requires_redis: false,
            ready_requires_config: false,
            workers: 0,
            give_back_memory: give_back_free_memory,
            allow_empty_reload: false,
            statsd: None,
            metrics_listener: None,
            xds: None,
            quota: QuotaOptions::default(),
        }
    }
}

/// Why the service could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The config did not load: every error found, in load order (never
    /// empty), one per line.
    #[error("{}", lines(.0))]
    Config(Vec<ConfigError>),
    /// Redis could not be reached (or its URL or prefix is bad).
    #[error(transparent)]
    Redis(#[from] RedisConnectError),
    /// The near-limit ratio is out of range.
    #[error(transparent)]
    NearLimitRatio(#[from] crate::metrics::NearLimitRatioError),
    /// A TLS file cannot be read or used.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The admin token is empty.
    #[error("the admin token is empty: give a token, or none to turn `POST /v1/reset` off")]
    EmptyAdminToken,
    /// The worker threads could not be started.
    #[error("cannot start {workers} worker threads")]
    Workers {
        /// How many were asked for.
        workers: usize,
        /// Why.
        source: std::io::Error,
    },
    /// statsd output could not start.
    #[error(transparent)]
    Statsd(#[from] StatsdError),
    /// The metrics listener's path is not a path.
    #[error(transparent)]
    MetricsPath(#[from] MetricsPathError),
    /// The xDS config source cannot be used.
    #[error(transparent)]
    Xds(#[from] XdsError),
    /// An address could not be bound.
    #[error("cannot listen on {addr}")]
    Bind {
        /// The address.
        addr: Endpoint,
        /// Why.
        source: std::io::Error,
    },
}

impl From<ConfigError> for StartError {
    fn from(e: ConfigError) -> Self {
        StartError::Config(vec![e])
    }
}

/// Errors one per line.
fn lines(errors: &[ConfigError]) -> String {
    let lines: Vec<String> = errors.iter().map(ToString::to_string).collect();
    lines.join("\n")
}

/// What the front ends share, serving `engine` as `options` say (its
/// addresses, budgets, Redis and reload interval are not read here), with
/// the counts of the connection layer's `connections`.
fn shared(engine: Engine, options: &Options, connections: Arc<dyn ConnectionStats>) -> Shared {
    // `start` checks the ratio; a bad one given to `http_router` falls
    // back to the default.
    let metrics = Metrics::with_near_limit_ratio(options.near_limit_ratio).unwrap_or_default();
    Shared {
        service: Service::new(engine.with_settings(options.settings), metrics),
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
        draining: std::sync::atomic::AtomicBool::new(false),
        redis_down: std::sync::atomic::AtomicBool::new(false),
        requires_config: options.ready_requires_config,
        awaiting_xds: std::sync::atomic::AtomicBool::new(
            options.xds.as_ref().is_some_and(|xds| xds.wait_for_first_snapshot),
        ),
        connections,
    }
}

/// The reload of `shared`'s config files (`options.config`, `loaded` when
/// they were read) and of the TLS files of `tls`.
fn reloader(shared: Arc<Shared>, options: &Options, loaded: Vec<FileStamp>, tls: Option<Arc<Tls>>) -> Reloader {
    Reloader {
        shared,
        paths: options.config.clone(),
        load_options: load_options(options).allow_empty_folders(options.allow_empty_reload),
        allow_empty_reload: options.allow_empty_reload,
        watched: parking_lot::Mutex::new(Watched { loaded, changing: None }),
        give_back_memory: options.give_back_memory,
        reloads: watch::Sender::new(0),
        tls,
    }
}

/// A running service.
pub struct Running {
    /// Where HTTP listens (with the port the system chose for port 0).
    pub http: Endpoint,
    /// Where gRPC listens.
    pub grpc: Endpoint,
    /// Where the metrics listener listens, if there is one.
    pub metrics: Option<Endpoint>,
    /// The statsd output, if any.
    statsd: Option<Arc<parking_lot::Mutex<crate::metrics::Statsd>>>,
    shared: Arc<Shared>,
    reloader: Arc<Reloader>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    health: tonic_health::server::HealthReporter,
    drain_delay: Duration,
}

impl Running {
    /// The HTTP address, when HTTP listens on TCP.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http.tcp()
    }

    /// The gRPC address, when gRPC listens on TCP.
    pub fn grpc_addr(&self) -> Option<SocketAddr> {
        self.grpc.tcp()
    }

    /// What the front ends share (the engine, the metrics).
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The reload of the config and TLS files.
    pub fn reloader(&self) -> &Arc<Reloader> {
        &self.reloader
    }

    /// Sends the stats to statsd now, as the flush interval does (nothing
    /// without statsd); the lines sent.
    pub fn flush_stats(&self) -> usize {
        self.statsd
            .as_ref()
            .map_or(0, |statsd| statsd.lock().flush(self.shared.service.metrics()))
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
        self.shared.engine().flush().await;
        // And the last stats to statsd.
        if let Some(statsd) = &self.statsd {
            statsd.lock().flush(self.shared.service.metrics());
        }
    }

    /// Runs until `signal` resolves, then shuts down gracefully.
    pub async fn run_until(self, signal: impl Future<Output = ()>) {
        signal.await;
        tracing::info!("shutting down: finishing the requests in flight");
        self.shutdown().await;
    }
}

/// Starts the service: loads the config, binds both addresses, serves, and
/// watches the config files.
///
/// # Errors
///
/// [`StartError`] if the config does not load (or, with Redis, has a
/// limit without a Redis form), Redis cannot be reached, a TLS file is
/// bad, or an address cannot be bound.
pub async fn start<C: Clock + Send + Sync + 'static>(options: Options, clock: C) -> Result<Running, StartError> {
    if options.admin_token.as_deref().is_some_and(|t| t.trim().is_empty()) {
        return Err(StartError::EmptyAdminToken);
    }
    Metrics::with_near_limit_ratio(options.near_limit_ratio)?;
    let xds = match options.xds.clone() {
        Some(_) if !options.config.is_empty() => {
            let paths: Vec<String> = options.config.iter().map(|p| p.display().to_string()).collect();
            return Err(XdsError::FilesToo(paths.join(", ")).into());
        }
        // The TLS files are read.
        Some(xds) => Some(
            tokio::task::spawn_blocking(move || XdsClient::new(&xds))
                .await
                .map_err(|e| XdsError::Tls(format!("reading the files failed: {e}")))??,
        ),
        None => None,
    };
    // Before the files are read: a change made while they are is a change.
    let loaded = fingerprint(&options.config);
    // Waiting for a config, a folder without one starts as no domain.
    let start_options = load_options(&options).allow_empty_folders(options.ready_requires_config);
    let config = Config::load_all(&options.config, &start_options).map_err(StartError::Config)?;
    log_warnings(&config);
    let clock = Arc::new(clock);
    let (engine, probe, quotas) = match options.redis.clone() {
        None => (
            Engine::new(
                config,
                Arc::clone(&clock),
                options.budget,
                options.other_budget,
                options.input,
            ),
            None,
            // The quota service's ledgers on the engine's clock.
            Quotas::new(
                Box::new(MemoryLedgers::new(options.quota.max_buckets)),
                clock,
                options.quota,
            ),
        ),
        Some(redis) => {
            let (store, probe) = redis.connect_probed().await?;
            let engine = Engine::with_store(config, store, true, options.input)?.with_store_name(redis.store_name());
            // Replicas compare their times in the shared ledgers: the
            // time since the UNIX epoch.
            let quotas = Quotas::new(
                Box::new(RedisLedgers::new(probe.connection(), redis.prefix.clone())),
                Arc::new(EpochClock),
                options.quota,
            );
            (engine, Some(probe), quotas)
        }
    };
    let quotas = Arc::new(quotas);
    let tls = match options.tls.clone() {
        Some(files) => Some(Arc::new(Tls::load_blocking(files).await?)),
        None => None,
    };
    if let Some(listener) = options.metrics_listener.as_ref().filter(|l| !l.path.starts_with('/')) {
        return Err(MetricsPathError::new(&listener.path).into());
    }
    let statsd = match &options.statsd {
        Some(statsd) => Some(crate::metrics::Statsd::connect(statsd).await?),
        None => None,
    };
    let bind = |addr: Endpoint| async move {
        match Listener::bind(&addr).await {
            Ok(listener) => Ok((listener.local(&addr), listener)),
            Err(source) => Err(StartError::Bind { addr, source }),
        }
    };
    let (http, http_listener) = bind(options.http.clone()).await?;
    let (grpc, grpc_listener) = bind(options.grpc.clone()).await?;
    let metrics_listener = match &options.metrics_listener {
        Some(listener) => Some(bind(listener.addr.clone()).await?),
        None => None,
    };
    if tls.is_some() {
        for endpoint in [&http, &grpc].into_iter().filter(|e| e.tcp().is_none()) {
            tracing::warn!(%endpoint, "TLS is on, but a Unix socket is served in the clear");
        }
    }
    let admission = Admission::new(options.connections);
    let shared = Arc::new(shared(
        engine,
        &options,
        Arc::clone(&admission) as Arc<dyn ConnectionStats>,
    ));
    shared.service.metrics().declare_domains(&shared.engine().config());
    shared.service.metrics().config_loaded_at_start();
    let reloader = Arc::new(reloader(Arc::clone(&shared), &options, loaded, tls.clone()));
    let (stop, stopped) = watch::channel(false);

    let mut tasks = Vec::new();
    let timeouts = options.timeouts;
    let workers = match options.workers {
        0 => None,
        n => Some(crate::net::workers::Workers::start(n).map_err(|source| StartError::Workers { workers: n, source })?),
    };
    let routes = crate::api::http::routes(Arc::clone(&shared));
    let http_tls = tls.clone().filter(|_| options.tls.as_ref().is_some_and(|t| t.http));
    tasks.push(tokio::spawn(crate::net::conn::serve_http(
        http_listener,
        http_tls,
        routes,
        timeouts,
        Arc::clone(&admission),
        stopped.clone(),
        workers.clone(),
    )));

    let (health, health_service) = tonic_health::server::health_reporter();
    set_health(&shared, &health).await;
    if shared.lacks_config() {
        tracing::warn!("no config with a domain loaded: not ready until one does (--ready-requires-config)");
    }
    // Connections are accepted (and their TLS handshakes made) by the
    // shared accept loop, each in its own task, and served on hyper's
    // HTTP/2 connection (on its worker, if any). Every connection must send
    // the HTTP/2 preface within the header timeout (the handshake
    // included) and is closed after the idle timeout without a byte.
    let routes = crate::api::grpc_routes::GrpcRoutes::new(
        Arc::clone(&shared),
        health_service,
        quotas,
        stopped.clone(),
        timeouts.request,
        options.body_limit,
    );
    tasks.push(tokio::spawn(crate::net::conn::serve_grpc(
        grpc_listener,
        tls.clone(),
        routes,
        timeouts,
        Arc::clone(&admission),
        stopped.clone(),
        workers.clone(),
    )));

    let metrics = metrics_listener.map(|(endpoint, listener)| {
        let path = options
            .metrics_listener
            .as_ref()
            .map_or("/metrics", |l| l.path.as_str());
        tasks.push(tokio::spawn(crate::net::conn::serve_http(
            listener,
            None,
            crate::api::envoy_metrics::routes(Arc::clone(&shared), path),
            timeouts,
            Arc::clone(&admission),
            stopped.clone(),
            workers.clone(),
        )));
        endpoint
    });
    let statsd = statsd.map(|statsd| {
        let statsd = Arc::new(parking_lot::Mutex::new(statsd));
        let (flushed, shared) = (Arc::clone(&statsd), Arc::clone(&shared));
        let every = options
            .statsd
            .as_ref()
            .map_or(Duration::from_secs(10), |s| s.flush_interval);
        tasks.push(crate::metrics::spawn_flushes(every, stopped.clone(), move || {
            flushed.lock().flush(shared.service.metrics());
        }));
        statsd
    });

    if let (Some(tls), Some(every)) = (tls, options.reload_every) {
        // New certificates are picked up when their files change, checked
        // (and read) on a blocking thread.
        tasks.push(spawn_every(every, stopped.clone(), move || {
            let tls = Arc::clone(&tls);
            async move {
                let _ = tokio::task::spawn_blocking(move || tls.reload_if_changed()).await;
            }
        }));
    }

    if let Some(redis) = &options.redis {
        // The store's health in the log: a warning when Redis starts
        // failing, a line when it is back; never one per request.
        let watched = Arc::clone(&shared);
        let policy = crate::redis_store::policy_name(redis.failure);
        let readiness = probe.filter(|_| options.ready_requires_redis);
        let health = health.clone();
        let mut log = crate::redis_store::OutageLog::default();
        tasks.push(spawn_every(Duration::from_secs(1), stopped.clone(), move || {
            match log.observe(&watched.engine().stats().failover) {
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
            let (watched, readiness, health) = (Arc::clone(&watched), readiness.clone(), health.clone());
            async move {
                if let Some(probe) = readiness {
                    redis_readiness(&watched, probe.answers().await, &health).await;
                }
            }
        }));
    }

    if let Some(client) = xds {
        let (applied, mut snapshots) = watch::channel(0);
        let apply = crate::xds::ApplyOptions {
            load: load_options(&options),
            give_back_memory: options.give_back_memory,
        };
        tasks.push(crate::xds::spawn(
            client,
            Arc::clone(&shared),
            apply,
            applied,
            stopped.clone(),
        ));
        // Readiness follows the snapshots applied (the first, and with
        // `ready_requires_config` each).
        let (shared, health) = (Arc::clone(&shared), health.clone());
        let mut stopped = stopped.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                tokio::select! {
                    changed = snapshots.changed() => if changed.is_err() { return },
                    _ = stopped.wait_for(|&s| s) => return,
                }
                set_health(&shared, &health).await;
            }
        }));
    }

    if options.ready_requires_config {
        // Readiness follows the config: each reload (the watcher's,
        // SIGHUP's) is looked at once it is done.
        let (shared, health) = (Arc::clone(&shared), health.clone());
        let mut reloads = reloader.reloads();
        let mut stopped = stopped.clone();
        tasks.push(tokio::spawn(async move {
            let mut lacked = shared.lacks_config();
            loop {
                tokio::select! {
                    changed = reloads.changed() => if changed.is_err() { return },
                    _ = stopped.wait_for(|&s| s) => return,
                }
                let lacks = shared.lacks_config();
                // Said once the health service says it too.
                set_health(&shared, &health).await;
                if lacks != lacked {
                    if lacks {
                        tracing::warn!("the config has no domain left: not ready (--ready-requires-config)");
                    } else {
                        tracing::info!("a config with a domain loaded: ready");
                    }
                    lacked = lacks;
                }
            }
        }));
    }

    if let Some(every) = options.reload_every.filter(|_| !options.config.is_empty()) {
        let watched = Arc::clone(&reloader);
        tasks.push(spawn_every(every, stopped.clone(), move || {
            let reloader = Arc::clone(&watched);
            async move {
                // Off the runtime's threads: the look reads the file
                // system, and a reload parses (a large config takes time),
                // the old config serving meanwhile.
                let _ = tokio::task::spawn_blocking(move || reloader.reload_if_settled()).await;
            }
        }));
    }
    tracing::info!(%http, %grpc, "serving");
    Ok(Running {
        http,
        grpc,
        metrics,
        statsd,
        shared,
        reloader,
        stop,
        tasks,
        health,
        drain_delay: options.drain_delay,
    })
}

/// Runs `work` every `every`, the first time at once, until `stopped`
/// turns true; a late round delays the next rather than bunching them.
fn spawn_every<F, Fut>(every: Duration, mut stopped: watch::Receiver<bool>, mut work: F) -> JoinHandle<()>
where
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stopped.wait_for(|&s| s) => return,
            }
            work().await;
        }
    })
}

/// The HTTP routes [`start`] serves (`/json`, `/v1/check`, `/v1/reset`,
/// `/healthz`, `/metrics`), over `engine`, without a listener, the gRPC
/// side or the config watch: to drive the service in-process, one request
/// at a time (`tower::ServiceExt::oneshot`), as the tests and fuzz targets
/// do. `options` gives the body limit and the headers; its addresses,
/// budgets, Redis options and reload interval are not read.
pub fn http_router(engine: Engine, options: &Options) -> axum::Router {
    let connections = Admission::new(options.connections);
    crate::api::http::router(Arc::new(shared(engine, options, connections)))
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

/// Readiness follows Redis: NOT_SERVING (and `/readyz` 503) when it
/// stops answering, SERVING again when it answers (unless draining);
/// each change logged once.
async fn redis_readiness(shared: &Shared, answers: bool, health: &tonic_health::server::HealthReporter) {
    use std::sync::atomic::Ordering::Relaxed;
    let was_down = shared.redis_down.swap(!answers, Relaxed);
    if was_down != answers {
        // No change.
        return;
    }
    if answers {
        tracing::info!("Redis answers: ready again");
    } else {
        tracing::warn!("Redis does not answer: not ready (--ready-requires-redis)");
    }
    set_health(shared, health).await;
}

/// The gRPC health service says what `/readyz` says: SERVING when
/// nothing keeps the server from being ready ([`Shared::not_ready`]),
/// NOT_SERVING otherwise.
async fn set_health(shared: &Shared, health: &tonic_health::server::HealthReporter) {
    let status = match shared.not_ready() {
        None => tonic_health::ServingStatus::Serving,
        Some(_) => tonic_health::ServingStatus::NotServing,
    };
    for name in HEALTH_NAMES {
        health.set_service_status(name, status).await;
    }
}

/// The names the gRPC health service answers for: the whole server (`""`)
/// and envoyproxy/ratelimit's service name.
pub(crate) const HEALTH_NAMES: [&str; 2] = ["", "ratelimit"];

/// How the config files are read.
fn load_options(options: &Options) -> LoadOptions {
    LoadOptions::default()
        .merge_domains(options.merge_domains)
        .max_file_bytes(options.max_config_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use slidegate_core::ManualClock;

    /// The watcher reads a change once the files look alike twice in a
    /// row, refuses an emptying one once (not again until the files
    /// change), and does not read again what a reload (SIGHUP's) read.
    #[test]
    fn a_change_is_read_once_it_has_settled() {
        let dir = std::env::temp_dir().join(format!("slidegate-settle-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("t.yaml");
        let yaml = |n: u32| {
            format!("domain: t\ndescriptors:\n  - key: k\n    rate_limit: {{ unit: hour, requests_per_unit: {n} }}\n")
        };
        std::fs::write(&file, yaml(5)).unwrap();
        let options = Options {
            config: vec![dir.clone()],
            ..Options::default()
        };
        let loaded = fingerprint(&options.config);
        let config = Config::load_with(&options.config, &load_options(&options)).unwrap();
        let engine = Engine::new(
            config,
            ManualClock::new(0),
            Budget::keys(16),
            Budget::keys(16),
            InputLimits::default(),
        );
        let shared = Arc::new(shared(engine, &options, Admission::new(options.connections)));
        let shared = reloader(shared, &options, loaded, None);
        let limit = || shared.shared.engine().config().domain("t").unwrap().rules[0].limits[0].requests_per_unit;
        assert!(shared.reload_if_settled().is_none());

        // Each write changes the length: a change whatever the clock's
        // resolution.
        std::fs::write(&file, yaml(10)).unwrap();
        assert!(shared.reload_if_settled().is_none(), "read at the first look");
        std::fs::write(&file, yaml(100)).unwrap();
        assert!(shared.reload_if_settled().is_none(), "read while changing");
        assert_eq!(limit(), 5);
        assert!(matches!(shared.reload_if_settled(), Some(Ok(()))));
        assert_eq!(limit(), 100);
        assert!(shared.reload_if_settled().is_none());

        std::fs::write(&file, yaml(1000)).unwrap();
        shared.reload().unwrap();
        assert_eq!(limit(), 1000);
        assert!(shared.reload_if_settled().is_none());
        assert!(shared.reload_if_settled().is_none());

        std::fs::write(&file, "domain: t\n").unwrap();
        assert!(shared.reload_if_settled().is_none());
        let refused = shared.reload_if_settled().unwrap().unwrap_err();
        assert!(refused.message.starts_with("reload refused: "), "{refused}");
        assert_eq!(limit(), 1000);
        assert!(shared.reload_if_settled().is_none(), "refused again");
        assert_eq!(*shared.reloads().borrow(), 3);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
