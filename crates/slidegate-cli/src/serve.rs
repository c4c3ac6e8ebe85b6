//! `slidegate serve`: the rate limit service.

use crate::otlp::Otlp;
use anyhow::Context as _;
use clap::builder::BoolishValueParser;
use clap::{ArgAction, Args as ClapArgs, ValueEnum};
use slidegate_core::MonotonicClock;
use slidegate_core::duration::parse_positive_duration;
use slidegate_memory::Budget;
use slidegate_redis::RedisTls;
use slidegate_server::engine::{InputLimits, Settings};
use slidegate_server::net::tls::TlsFile;
use slidegate_server::quota::QuotaOptions;
use slidegate_server::quota::share::Timing;
use slidegate_server::redis_store::RedisOptions;
use slidegate_server::server::ResponseHeaderNames;
use slidegate_server::server::{
    self, ConnectionLimits, Endpoint, MetricsListener, Options, StartError, StatsdOptions, Timeouts, TlsOptions,
};
use slidegate_server::trace::DECISION_TARGET;
use slidegate_server::xds::{XdsBackoff, XdsOptions, XdsTls};
use slidegate_store::FailurePolicy;
use slidegate_tower::LegacyReset;
use std::path::PathBuf;
use std::time::Duration;

/// The help's headings, one per kind of flag.
const LISTENERS: &str = "Listeners";
const CONFIG: &str = "Config";
const XDS: &str = "Config over xDS";
const STORE: &str = "Store and Redis";
const ANSWERS: &str = "Answers";
const ENVOY: &str = "envoyproxy/ratelimit compatibility";
const HEALTH: &str = "Health and shutdown";
const CLIENT_LIMITS: &str = "Limits on clients";
const OBSERVABILITY: &str = "Observability";
const QUOTA: &str = "Rate limit quota service (Envoy's rate_limit_quota filter)";

/// Every flag is also read from the environment variable named beside it.
/// A switch is a flag alone (`--shadow-mode`), `--no-…` turning off one on
/// by default; in the environment it is `true` or `false` (`1`/`0`,
/// `yes`/`no`, `on`/`off`).
#[derive(ClapArgs, Debug)]
pub(crate) struct Args {
    /// The HTTP address (IP:PORT, or `unix:PATH`).
    ///
    /// It serves `POST /json`, `/v1/check`, `/v1/reset`, `GET /healthz`,
    /// `/healthcheck`, `/readyz` and `/metrics`. Nothing in it
    /// authenticates but `/v1/reset` (and mutual TLS, with
    /// `--tls-client-ca`): keep it on a private network. A Unix socket is
    /// served in the clear, even with `--tls-cert`; a socket file left at
    /// PATH by a process that is gone is replaced (anything else there is
    /// an error), and the file is removed on exit.
    #[arg(long, env = "SLIDEGATE_HTTP", default_value = "127.0.0.1:8080", value_name = "ADDRESS", help_heading = LISTENERS)]
    http: Endpoint,
    /// The gRPC address, Envoy's `RateLimitService` (as `--http`).
    #[arg(long, env = "SLIDEGATE_GRPC", default_value = "127.0.0.1:8081", value_name = "ADDRESS", help_heading = LISTENERS)]
    grpc: Endpoint,
    /// Serve TLS with this certificate chain (PEM); needs `--tls-key`.
    ///
    /// Both listeners, the server's certificate first; gRPC negotiates
    /// ALPN `h2`, HTTP `http/1.1`. TCP only: Unix sockets stay in the
    /// clear. The TLS files are read again when they change (checked every
    /// `--reload-every`) and on SIGHUP: new connections get the new files;
    /// a bad new file is logged and the previous ones keep serving.
    #[arg(long, env = "SLIDEGATE_TLS_CERT", value_name = "PATH", help_heading = LISTENERS)]
    tls_cert: Option<PathBuf>,
    /// The private key of `--tls-cert` (PEM: PKCS#8, PKCS#1 or SEC1).
    #[arg(long, env = "SLIDEGATE_TLS_KEY", value_name = "PATH", help_heading = LISTENERS)]
    tls_key: Option<PathBuf>,
    /// Mutual TLS: clients need a certificate signed by these CAs (PEM).
    ///
    /// A client without a certificate, or with another, is refused at the
    /// handshake. Needs `--tls-cert`.
    #[arg(long, env = "SLIDEGATE_TLS_CLIENT_CA", value_name = "PATH", help_heading = LISTENERS)]
    tls_client_ca: Option<PathBuf>,
    /// Mutual TLS: a client certificate must also name this DNS name.
    ///
    /// Among its subject alternative names (an IP address too).
    /// envoyproxy/ratelimit's `GRPC_CLIENT_TLS_SAN`. Needs
    /// `--tls-client-ca`.
    #[arg(long, env = "SLIDEGATE_TLS_CLIENT_SAN", requires = "tls_client_ca", value_name = "NAME", help_heading = LISTENERS)]
    tls_client_san: Option<String>,
    /// TLS on the gRPC listener only; HTTP (health probes, `/metrics`)
    /// stays in the clear.
    ///
    /// As envoyproxy/ratelimit's `GRPC_SERVER_USE_TLS`, and Envoy
    /// Gateway's probes of `GET /healthcheck` over plain HTTP, have it.
    /// Needs `--tls-cert`.
    #[arg(long, env = "SLIDEGATE_TLS_GRPC_ONLY", requires = "tls_cert", action = ArgAction::SetTrue, value_parser = BoolishValueParser::new(), help_heading = LISTENERS)]
    tls_grpc_only: bool,
    /// Turn on `POST /v1/reset` for `Authorization: Bearer TOKEN`.
    ///
    /// A request without the token is answered 401, with another 403.
    /// Without this flag the endpoint is off (404). Prefer the environment
    /// variable: a flag shows in the process list.
    #[arg(long, env = "SLIDEGATE_ADMIN_TOKEN", hide_env_values = true, value_name = "TOKEN", help_heading = LISTENERS)]
    admin_token: Option<String>,
    /// Threads serving connections [default: the CPUs, at most 64].
    ///
    /// Each on a single-threaded runtime of its own (a connection's
    /// requests and writes stay on one thread, and an HTTP/2 connection's
    /// answers go out together); 0 serves them on the shared runtime.
    #[arg(long, env = "SLIDEGATE_WORKERS", value_name = "N", help_heading = LISTENERS)]
    workers: Option<usize>,

    /// A YAML config file or folder of them (one domain per file); repeat.
    ///
    /// envoyproxy/ratelimit's format. Without one, only the ad-hoc API of
    /// `POST /v1/check` limits anything. In the environment, separate
    /// paths with `:`.
    #[arg(long, env = "SLIDEGATE_CONFIG", value_delimiter = ':', value_name = "PATH", help_heading = CONFIG)]
    config: Vec<PathBuf>,
    /// How often the config files are checked for changes (`0s`: never).
    #[arg(long, env = "SLIDEGATE_RELOAD_EVERY", default_value = "1s", value_parser = parse_interval, value_name = "DURATION", help_heading = CONFIG)]
    reload_every: Duration,
    /// Accept a reload that leaves no limit where some were.
    ///
    /// A `--config` folder left with no config file, or a domain whose
    /// file still names it but no limit, where the config in force has
    /// some (a file caught half written: `domain: NAME` alone). Without it
    /// such a reload (on a change or SIGHUP) is refused with one error
    /// line, counted as failed, and the config in force keeps serving;
    /// changes are read only once the files have stayed alike for one more
    /// look. An empty file is refused either way, and so, at start, is a
    /// folder without a config file (unless `--ready-requires-config`).
    #[arg(long, env = "SLIDEGATE_ALLOW_EMPTY_RELOAD", action = ArgAction::SetTrue, value_parser = BoolishValueParser::new(), help_heading = CONFIG)]
    allow_empty_reload: bool,
    /// Merge the files of one domain (else a domain in two is an error).
    ///
    /// A top-level descriptor defined in two files is an error either way.
    #[arg(long, env = "MERGE_DOMAIN_CONFIG", action = ArgAction::SetTrue, value_parser = BoolishValueParser::new(), help_heading = CONFIG)]
    merge_domain_config: bool,
    /// The largest config file read, in bytes.
    ///
    /// A larger one is refused (at start and at reload) before it is read.
    #[arg(long, env = "SLIDEGATE_MAX_CONFIG_BYTES", default_value_t = 64 << 20, value_name = "BYTES", help_heading = CONFIG)]
    max_config_bytes: u64,

    /// Take the config from this xDS control plane (HOST:PORT), not files.
    ///
    /// envoyproxy/ratelimit's `CONFIG_TYPE=GRPC_XDS_SOTW`: one ADS stream
    /// (state of the world) subscribed to `RateLimitConfig` resources, one
    /// domain each. A good snapshot is applied as a file reload is (counts
    /// kept) and ACKed; a bad one is NACKed with its errors and the config
    /// in force keeps serving. A lost stream is opened again after the
    /// backoff, the config kept meanwhile. Not ready until the first
    /// snapshot unless `--xds-force-start`. `http://` or `https://` may
    /// come first. Not with `--config`.
    #[arg(long, env = "SLIDEGATE_XDS", conflicts_with = "config", value_name = "HOST:PORT", help_heading = XDS)]
    xds: Option<String>,
    /// The node id sent to the control plane (Envoy Gateway serves `envoy-ratelimit`).
    #[arg(long, env = "SLIDEGATE_XDS_NODE_ID", default_value = "default", requires = "xds", value_name = "ID", help_heading = XDS)]
    xds_node_id: String,
    /// The node's metadata (`key=value,key=value`).
    #[arg(long, env = "SLIDEGATE_XDS_NODE_METADATA", requires = "xds", value_name = "PAIRS", help_heading = XDS)]
    xds_node_metadata: Option<String>,
    /// Request headers sent on the stream (`name:value,name:value`).
    #[arg(long, env = "SLIDEGATE_XDS_HEADER", requires = "xds", value_name = "PAIRS", help_heading = XDS)]
    xds_header: Option<String>,
    /// Reach the control plane over TLS (needs `--xds-tls-ca`).
    #[arg(long, env = "SLIDEGATE_XDS_TLS", requires = "xds", action = ArgAction::SetTrue, value_parser = BoolishValueParser::new(), help_heading = XDS)]
    xds_tls: bool,
    /// The CA certificates the control plane's certificate is checked against (PEM).
    #[arg(long, env = "SLIDEGATE_XDS_TLS_CA", requires = "xds_tls", value_name = "PATH", help_heading = XDS)]
    xds_tls_ca: Option<PathBuf>,
    /// Mutual TLS: the client certificate shown to the control plane (PEM).
    #[arg(long, env = "SLIDEGATE_XDS_TLS_CERT", requires_all = ["xds_tls", "xds_tls_key"], value_name = "PATH", help_heading = XDS)]
    xds_tls_cert: Option<PathBuf>,
    /// The private key of `--xds-tls-cert` (PEM).
    #[arg(long, env = "SLIDEGATE_XDS_TLS_KEY", requires_all = ["xds_tls", "xds_tls_cert"], value_name = "PATH", help_heading = XDS)]
    xds_tls_key: Option<PathBuf>,
    /// The name the control plane's certificate must carry [default: the host of `--xds`].
    #[arg(long, env = "SLIDEGATE_XDS_TLS_SERVER_NAME", requires = "xds_tls", value_name = "NAME", help_heading = XDS)]
    xds_tls_server_name: Option<String>,
    /// The first wait before connecting again; it doubles up to `--xds-backoff-max`.
    #[arg(long, env = "SLIDEGATE_XDS_BACKOFF_INITIAL", default_value = "10s", value_parser = parse_timeout, requires = "xds", value_name = "DURATION", help_heading = XDS)]
    xds_backoff_initial: Duration,
    /// The longest wait before connecting again.
    #[arg(long, env = "SLIDEGATE_XDS_BACKOFF_MAX", default_value = "60s", value_parser = parse_timeout, requires = "xds", value_name = "DURATION", help_heading = XDS)]
    xds_backoff_max: Duration,
    /// How far jitter moves a wait, from 0 to 1.
    #[arg(long, env = "SLIDEGATE_XDS_BACKOFF_RANDOM_FACTOR", default_value_t = 0.5, requires = "xds", value_name = "FACTOR", help_heading = XDS)]
    xds_backoff_random_factor: f64,
    /// Waits without jitter (every instance reconnects in step).
    #[arg(long, env = "SLIDEGATE_XDS_NO_BACKOFF_JITTER", requires = "xds", action = ArgAction::SetTrue, value_parser = BoolishValueParser::new(), help_heading = XDS)]
    xds_no_backoff_jitter: bool,
    /// The largest response taken from the control plane, in bytes [default: 4 MiB].
    #[arg(long, env = "SLIDEGATE_XDS_MAX_MESSAGE_BYTES", requires = "xds", value_name = "BYTES", help_heading = XDS)]
    xds_max_message_bytes: Option<usize>,
    /// Ready at once, before the first snapshot (every descriptor OK until then).
    #[arg(long, env = "SLIDEGATE_XDS_FORCE_START", requires = "xds", action = ArgAction::SetTrue, value_parser = BoolishValueParser::new(), help_heading = XDS)]
    xds_force_start: bool,

    /// Memory for sliding windows of up to 8 buckets (the default), in MiB.
    ///
    /// Never more is held: the soonest-expiring counters are evicted to
    /// make room.
    #[arg(long, env = "SLIDEGATE_MEMORY_MIB", default_value_t = 256, value_name = "MIB", help_heading = STORE)]
    memory_mib: usize,
    /// Memory for the counters of every other algorithm, in MiB.
    #[arg(long, env = "SLIDEGATE_OTHER_MEMORY_MIB", default_value_t = 32, value_name = "MIB", help_heading = STORE)]
    other_memory_mib: usize,
    /// Count in Redis (a `redis://` URL), shared by every instance on it.
    ///
    /// Every instance on the same Redis shares its limits; a `rediss://`
    /// URL talks TLS (see `--redis-tls-ca`). Repeat it for the seed nodes of a Redis Cluster. Redis
    /// must answer at start, or `serve` exits with status 1 and the reason;
    /// once started, a Redis that fails is `--redis-failure`'s business,
    /// and decisions come from Redis again when it is back. Every limit of
    /// the config needs a Redis form (not `exponential_histogram`; see
    /// docs/service.md for the ranges): a config with a limit that has none
    /// is refused at start and at reload. In the environment, separate URLs
    /// with `,`.
    #[arg(long = "redis", env = "SLIDEGATE_REDIS", value_delimiter = ',', value_name = "URL", help_heading = STORE)]
    redis: Vec<String>,
    /// Find the Redis master of this name through Sentinel: every `--redis`
    /// is then a Sentinel's URL.
    ///
    /// The Sentinels are asked for the master at start and again whenever
    /// the master stops answering (a failover).
    #[arg(long, env = "SLIDEGATE_REDIS_SENTINEL_MASTER", requires = "redis", conflicts_with = "redis_cluster", value_name = "NAME", help_heading = STORE)]
    redis_sentinel_master: Option<String>,
    /// Use the Redis Cluster client even with one `--redis` URL.
    ///
    /// Several URLs always do.
    #[arg(long, env = "SLIDEGATE_REDIS_CLUSTER", requires = "redis", action = ArgAction::SetTrue, value_parser = BoolishValueParser::new(), help_heading = STORE)]
    redis_cluster: bool,
    /// Trust these CAs (PEM) for Redis's certificate, not the system's.
    ///
    /// For `rediss://` URLs (TLS, one server or a cluster; not yet
    /// Sentinel); without it the system's roots are trusted.
    #[arg(long, env = "SLIDEGATE_REDIS_TLS_CA", requires = "redis", value_name = "PATH", help_heading = STORE)]
    redis_tls_ca: Option<PathBuf>,
    /// Present this client certificate (PEM) to Redis over TLS.
    ///
    /// For a Redis that asks clients for one (`tls-auth-clients yes`).
    /// Needs `--redis-tls-key` and `rediss://` URLs.
    #[arg(long, env = "SLIDEGATE_REDIS_TLS_CERT", requires_all = ["redis", "redis_tls_key"], value_name = "PATH", help_heading = STORE)]
    redis_tls_cert: Option<PathBuf>,
    /// The private key of `--redis-tls-cert` (PEM: PKCS#8, PKCS#1 or SEC1).
    #[arg(long, env = "SLIDEGATE_REDIS_TLS_KEY", requires = "redis_tls_cert", value_name = "PATH", help_heading = STORE)]
    redis_tls_key: Option<PathBuf>,
    /// Accept a Redis certificate that does not name the host connected to.
    ///
    /// Its chain is still checked against the trusted CAs. For `rediss://`
    /// URLs of one server or a cluster.
    #[arg(long, env = "SLIDEGATE_REDIS_TLS_SKIP_HOSTNAME_CHECK", requires = "redis", action = ArgAction::SetTrue, value_parser = BoolishValueParser::new(), help_heading = STORE)]
    redis_tls_skip_hostname_check: bool,
    /// What a decision does when Redis fails or is slower than `--redis-timeout`.
    ///
    /// After a failure Redis is skipped for 100 ms, then tried again.
    ///
    /// With `local`, N instances (`--redis-instances N`) on a limit L admit
    /// together in one window at most L × (1 + R) + Σᵢ (⌈L/N⌉ − ⌈uᵢ/N⌉),
    /// where uᵢ is the largest count Redis reported to instance i for the
    /// key in the window before it first fell back there (for one outage,
    /// the count it last saw before it; 0 if none) and R how many times
    /// Redis came back empty in the window (0 through a pause or an outage
    /// that keeps its data, 1 through a restart without persistence): L
    /// through a pause and 2L through an empty restart when every instance
    /// saw the key at its limit; at most 2L + N − 1 and 3L + N − 1 when
    /// none did.
    #[arg(long, env = "SLIDEGATE_REDIS_FAILURE", value_enum, default_value_t = Failure::Open, value_name = "POLICY", help_heading = STORE)]
    redis_failure: Failure,
    /// How many instances share the limits (for `--redis-failure local`).
    ///
    /// With `--redis-failure local` each counts alone on the limit divided
    /// by this (rounded up) while Redis is down, starting from its share
    /// of the count Redis last reported to it for the key (that count
    /// divided by this, rounded up); the bound of `--redis-failure` holds
    /// while no more instances than this share the limit (each one more
    /// adds a share). In hybrid mode (`--redis-sync-interval`) a key this
    /// instance has not yet synced is decided on that share, so that a
    /// flood of a new key on every instance admits about the limit in all
    /// (with `--redis-bounded` a key is decided on its lease instead).
    #[arg(long, env = "SLIDEGATE_REDIS_INSTANCES", default_value_t = 1, value_name = "N", help_heading = STORE)]
    redis_instances: u64,
    /// The longest wait for Redis per call (one decision of one limit).
    ///
    /// 50 ms is far beyond a healthy call (well under 1 ms) and bounds what
    /// a dead Redis adds to a decision; keep it below the client's own
    /// timeout (Envoy's rate limit filter waits 20 ms by default) for this
    /// service's failure policy to answer rather than the client's.
    #[arg(long, env = "SLIDEGATE_REDIS_TIMEOUT", default_value = "50ms", value_parser = parse_timeout, value_name = "DURATION", help_heading = STORE)]
    redis_timeout: Duration,
    /// What every Redis key starts with (no `{` or `}`).
    ///
    /// Each key goes on with the limit's policy and the descriptor, so
    /// that a changed limit starts afresh.
    #[arg(long, env = "SLIDEGATE_REDIS_PREFIX", default_value = "slidegate:", value_name = "PREFIX", help_heading = STORE)]
    redis_prefix: String,
    /// Hybrid mode: decide in this process, syncing counts to Redis this often.
    ///
    /// `sliding_window` limits (the default algorithm) decide in this
    /// process, on the count Redis last answered plus this instance's own
    /// since, and send their counts to Redis every DURATION (say 50ms) in
    /// one pipelined batch: no round trip per decision, one command per key
    /// per interval. Instances together may admit more than the limit, up
    /// to about (instances − 1) × rate × interval (two intervals at worst;
    /// see docs/service.md). Other algorithms stay script decisions (see
    /// `--redis-batching`). Syncs failing for 4 intervals (at least 200 ms)
    /// hand decisions to `--redis-failure`. SIGTERM sends the counts not
    /// yet synced; a process killed (SIGKILL, a crash) cannot, and those it
    /// admitted since its last sync are lost (about an interval's while
    /// Redis answers; while syncs fail, up to an interval's and the 4
    /// intervals' before `--redis-failure` decides), so the instances may
    /// admit them again in the window (measured: 100 in a window of 50).
    #[arg(long, env = "SLIDEGATE_REDIS_SYNC_INTERVAL", value_parser = parse_timeout, value_name = "DURATION", requires = "redis", help_heading = STORE)]
    redis_sync_interval: Option<Duration>,
    /// Hybrid mode, bounded: instances together never pass the limit.
    ///
    /// Each sync is also granted a lease, a share of what each key has left
    /// (an equal share among the instances holding one, what is asked for
    /// at most), and decisions spend it without a round trip; a lease spent
    /// asks for an early sync. Instances together never admit more than
    /// the limit in any window, whatever the traffic; the price is requests
    /// refused here while another instance holds unused share. A lease
    /// lasts 4 sync intervals (at least 200 ms): one not renewed by then
    /// (an instance that died) is counted as spent.
    #[arg(long, env = "SLIDEGATE_REDIS_BOUNDED", requires = "redis_sync_interval", action = ArgAction::SetTrue, value_parser = BoolishValueParser::new(), help_heading = STORE)]
    redis_bounded: bool,
    /// Batch the decisions that wait for a script call in flight (on by default).
    ///
    /// The decisions that come while a script call to Redis is in flight
    /// wait for it and go together in the next call, one script run that
    /// decides each in order, exactly and atomically, reading each key's
    /// state once (on a cluster, those of one hash slot). A call with
    /// nothing in flight goes at once.
    #[arg(long, env = "SLIDEGATE_REDIS_BATCHING", action = ArgAction::SetTrue, default_value = "true", value_parser = BoolishValueParser::new(), overrides_with = "no_redis_batching", requires = "redis", help_heading = STORE)]
    redis_batching: bool,
    /// One script call to Redis per decision.
    #[arg(long, overrides_with = "redis_batching", requires = "redis", help_heading = STORE)]
    no_redis_batching: bool,

    /// Put the RateLimit headers in gRPC answers' `response_headers_to_add`.
    #[arg(long, env = "SLIDEGATE_GRPC_HEADERS", action = ArgAction::SetTrue, value_parser = BoolishValueParser::new(), help_heading = ANSWERS)]
    grpc_headers: bool,
    /// Add `X-RateLimit-Limit`, `-Remaining` and `-Reset` (`delay` or `epoch`).
    ///
    /// The reset as seconds from now (`delay`) or a Unix time (`epoch`).
    #[arg(long, env = "SLIDEGATE_LEGACY_HEADERS", value_parser = ["delay", "epoch"], value_name = "RESET", help_heading = ANSWERS)]
    legacy_headers: Option<String>,

    /// A request over a limit counts nothing (on by default).
    ///
    /// slidegate's default: a refused request is not counted. A
    /// descriptor's own `hits_addend` (Envoy's debit when a stream ends) is
    /// counted either way.
    #[arg(long, env = "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", action = ArgAction::SetTrue, default_value = "true", value_parser = BoolishValueParser::new(), overrides_with = "no_stop_cache_key_increment_when_overlimit", help_heading = ENVOY)]
    stop_cache_key_increment_when_overlimit: bool,
    /// Count every hit, refused ones too, as envoyproxy/ratelimit's default.
    #[arg(long, overrides_with = "stop_cache_key_increment_when_overlimit", help_heading = ENVOY)]
    no_stop_cache_key_increment_when_overlimit: bool,
    /// Answer every request OK; the descriptors still say what each decided.
    ///
    /// Counted in `slidegate_global_shadow_mode_total`.
    #[arg(long, env = "SHADOW_MODE", action = ArgAction::SetTrue, value_parser = BoolishValueParser::new(), help_heading = ENVOY)]
    shadow_mode: bool,
    /// Every rule in quota mode: over the limit only when every limited descriptor is.
    #[arg(long, env = "QUOTA_MODE", action = ArgAction::SetTrue, value_parser = BoolishValueParser::new(), help_heading = ENVOY)]
    quota_mode: bool,
    /// Return the descriptors and the rules' `metadata` as dynamic metadata.
    ///
    /// The request's descriptors and the matched rules' `metadata` go back
    /// to Envoy as the answer's dynamic metadata.
    #[arg(long, env = "RESPONSE_DYNAMIC_METADATA", action = ArgAction::SetTrue, value_parser = BoolishValueParser::new(), help_heading = ENVOY)]
    response_dynamic_metadata: bool,
    /// Add envoyproxy/ratelimit's limit, remaining and reset headers.
    ///
    /// Those of the descriptor closest to its limit, in gRPC and `/json`
    /// answers' `response_headers_to_add`.
    #[arg(long, env = "LIMIT_RESPONSE_HEADERS_ENABLED", action = ArgAction::SetTrue, value_parser = BoolishValueParser::new(), help_heading = ENVOY)]
    limit_response_headers_enabled: bool,
    /// The name of the limit header of `--limit-response-headers-enabled`.
    #[arg(long, env = "LIMIT_LIMIT_HEADER", default_value = "RateLimit-Limit", value_parser = parse_header_name, value_name = "NAME", help_heading = ENVOY)]
    limit_limit_header: http::HeaderName,
    /// The name of its remaining header.
    #[arg(long, env = "LIMIT_REMAINING_HEADER", default_value = "RateLimit-Remaining", value_parser = parse_header_name, value_name = "NAME", help_heading = ENVOY)]
    limit_remaining_header: http::HeaderName,
    /// The name of its reset header.
    #[arg(long, env = "LIMIT_RESET_HEADER", default_value = "RateLimit-Reset", value_parser = parse_header_name, value_name = "NAME", help_heading = ENVOY)]
    limit_reset_header: http::HeaderName,
    /// The share of a limit past which admitted hits count as near it (0 to 1).
    ///
    /// Counted in `slidegate_rule_near_limit_hits_total`.
    #[arg(long, env = "NEAR_LIMIT_RATIO", default_value_t = 0.8, value_name = "RATIO", help_heading = ENVOY)]
    near_limit_ratio: f64,

    /// Not ready until a config with a domain has loaded.
    ///
    /// `/readyz` and `/healthcheck` answer 503 and the gRPC health service
    /// NOT_SERVING meanwhile, and again if a reload leaves no domain (with
    /// `--allow-empty-reload`). A `--config` folder without a config file
    /// then starts, as no domain, and the server turns ready when the
    /// watcher (or SIGHUP) loads one. Needs `--config`.
    #[arg(long, env = "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", action = ArgAction::SetTrue, value_parser = BoolishValueParser::new(), help_heading = HEALTH)]
    ready_requires_config: bool,
    /// Not ready while Redis does not answer (asked every second).
    ///
    /// `/readyz` answers 503 and the gRPC health service NOT_SERVING until
    /// it does. Without this flag readiness ignores Redis, and decisions
    /// follow `--redis-failure` meanwhile.
    #[arg(long, env = "SLIDEGATE_READY_REQUIRES_REDIS", requires = "redis", action = ArgAction::SetTrue, value_parser = BoolishValueParser::new(), help_heading = HEALTH)]
    ready_requires_redis: bool,
    /// On SIGTERM or SIGINT, how long to serve on once health says NOT_SERVING.
    ///
    /// The gRPC health service turns NOT_SERVING (and `/readyz` 503) so
    /// that load balancers stop sending first; then the listeners close
    /// and the requests in flight finish. `0s` stops at once.
    #[arg(long, env = "SLIDEGATE_DRAIN_DELAY", default_value = "2s", value_parser = parse_interval, value_name = "DURATION", help_heading = HEALTH)]
    drain_delay: Duration,

    /// Largest HTTP request body and gRPC request message, in bytes.
    ///
    /// Larger ones are refused (HTTP 413, gRPC `OUT_OF_RANGE`).
    #[arg(long, env = "SLIDEGATE_MAX_BODY", default_value_t = 65_536, value_name = "BYTES", help_heading = CLIENT_LIMITS)]
    max_body: usize,
    /// The longest wait for a request's headers (gRPC: the first call).
    ///
    /// HTTP: from when the connection opens or the previous answer is sent
    /// (so also the longest a kept-alive connection may sit idle between
    /// requests); gRPC: the longest wait for the HTTP/2 preface, and for
    /// the first call (then a `GOAWAY`). With TLS, the handshake must finish
    /// within it too (gRPC: the handshake and the preface together). The
    /// connection is then closed.
    #[arg(long, env = "SLIDEGATE_HEADER_TIMEOUT", default_value = "10s", value_parser = parse_timeout, value_name = "DURATION", help_heading = CLIENT_LIMITS)]
    header_timeout: Duration,
    /// How long a connection may go without starting a request.
    ///
    /// A connection (HTTP or gRPC) must start its first request (call)
    /// within `--header-timeout` of opening and then one within this long
    /// of the last, unless one is in flight (a rate limit quota stream is
    /// while it lasts); otherwise it is asked to close
    /// (gRPC: a `GOAWAY`; a client reconnects for its next call). Bytes
    /// alone (HTTP/2 `PING`s and `SETTINGS`, part of a request) do not keep
    /// it. One on which no byte is read or written for this long is closed
    /// too.
    #[arg(long, env = "SLIDEGATE_IDLE_TIMEOUT", default_value = "60s", value_parser = parse_timeout, value_name = "DURATION", help_heading = CLIENT_LIMITS)]
    idle_timeout: Duration,
    /// The longest wait for a request body, and the longest gRPC call.
    ///
    /// HTTP: then 408; gRPC: then `CANCELLED`, or at the client's
    /// `grpc-timeout` if shorter.
    #[arg(long, env = "SLIDEGATE_REQUEST_TIMEOUT", default_value = "10s", value_parser = parse_timeout, value_name = "DURATION", help_heading = CLIENT_LIMITS)]
    request_timeout: Duration,
    /// The most connections open at once [default: from the fd limit].
    ///
    /// HTTP and gRPC together. When all are taken, a new connection takes
    /// the place of one without a request in flight from the client address
    /// holding most connections, never from one holding fewer than its own
    /// (first one that never made a request, the oldest, closed at once;
    /// else the newest of the others, asked to close, so that established
    /// clients keep their place), or is closed at once when there is none
    /// (counted in `slidegate_connections_closed_total`). The default is
    /// seven eighths of the file descriptor limit left after 32, at least
    /// 8, at most 16384.
    #[arg(long, env = "SLIDEGATE_MAX_CONNECTIONS", value_name = "N", help_heading = CLIENT_LIMITS)]
    max_connections: Option<usize>,
    /// The most concurrent gRPC calls (HTTP/2 streams) on one connection.
    ///
    /// A client that wants more opens another connection, as Envoy and
    /// gRPC clients do.
    #[arg(long, env = "SLIDEGATE_MAX_CONCURRENT_STREAMS", default_value_t = slidegate_server::net::admission::DEFAULT_MAX_STREAMS, value_name = "N", help_heading = CLIENT_LIMITS)]
    max_concurrent_streams: u32,
    /// The most requests and calls in flight at once; past it, shed at once.
    ///
    /// Over every connection. A new one past it is answered at once, HTTP
    /// 503 with `Retry-After: 1` or gRPC `RESOURCE_EXHAUSTED`, and counted
    /// (`slidegate_calls_shed_total`), rather than queued.
    #[arg(long, env = "SLIDEGATE_MAX_IN_FLIGHT", default_value_t = slidegate_server::net::admission::DEFAULT_MAX_IN_FLIGHT, value_name = "N", help_heading = CLIENT_LIMITS)]
    max_in_flight: usize,
    /// Ask connections this old to close (unset: no maximum age).
    ///
    /// gRPC: a `GOAWAY`, its calls in flight finishing within
    /// `--request-timeout`, as gRPC's `max_connection_age`; clients
    /// reconnect, so that load spreads anew over instances.
    #[arg(long, env = "SLIDEGATE_MAX_CONNECTION_AGE", value_parser = parse_timeout, value_name = "DURATION", help_heading = CLIENT_LIMITS)]
    max_connection_age: Option<Duration>,
    /// Most descriptors in one request.
    #[arg(long, env = "SLIDEGATE_MAX_DESCRIPTORS", default_value_t = 64, value_name = "N", help_heading = CLIENT_LIMITS)]
    max_descriptors: usize,
    /// Most entries in one descriptor.
    #[arg(long, env = "SLIDEGATE_MAX_ENTRIES", default_value_t = 16, value_name = "N", help_heading = CLIENT_LIMITS)]
    max_entries: usize,
    /// Longest domain, entry key or value, or ad-hoc key, in bytes.
    #[arg(long, env = "SLIDEGATE_MAX_TEXT", default_value_t = 1024, value_name = "BYTES", help_heading = CLIENT_LIMITS)]
    max_text: usize,

    /// The least severe log lines written: `trace`, `debug`, `info`, `warn` or `error`.
    ///
    /// `RUST_LOG`, when set, says more finely what is logged, and wins.
    #[arg(long, env = "SLIDEGATE_LOG_LEVEL", default_value = "info", value_parser = ["trace", "debug", "info", "warn", "error"], value_name = "LEVEL", help_heading = OBSERVABILITY)]
    log_level: String,
    /// Send envoyproxy/ratelimit's stats to this statsd (HOST:PORT, over UDP).
    ///
    /// `ratelimit.service.rate_limit.DOMAIN.KEY.total_hits` and the others,
    /// named as envoyproxy/ratelimit names them, as counter deltas every
    /// `--statsd-flush-interval`; the host is looked up once, at start.
    /// Beside `/metrics`, which stays.
    #[arg(long, env = "SLIDEGATE_STATSD", value_name = "HOST:PORT", help_heading = OBSERVABILITY)]
    statsd: Option<String>,
    /// How often the stats are sent to `--statsd`.
    #[arg(long, env = "SLIDEGATE_STATSD_FLUSH_INTERVAL", default_value = "10s", value_parser = parse_timeout, value_name = "DURATION", requires = "statsd", help_heading = OBSERVABILITY)]
    statsd_flush_interval: Duration,
    /// Tags added to every stat sent to `--statsd` (`key:value,key:value`).
    #[arg(long, env = "SLIDEGATE_STATSD_TAGS", value_name = "TAGS", requires = "statsd", help_heading = OBSERVABILITY)]
    statsd_tags: Option<String>,
    /// Send the tags as DogStatsD does (`|#key:value`).
    #[arg(long, env = "SLIDEGATE_DOGSTATSD", requires = "statsd", action = ArgAction::SetTrue, value_parser = BoolishValueParser::new(), help_heading = OBSERVABILITY)]
    dogstatsd: bool,
    /// Serve the metrics on this address too, with envoyproxy/ratelimit's series.
    ///
    /// Plain HTTP, `GET --metrics-path` only: slidegate's metrics and the
    /// `ratelimit_service_rate_limit_*` series as Envoy Gateway's statsd
    /// mapping names them (its dashboards read them), as
    /// envoyproxy/ratelimit's `USE_PROMETHEUS` and `PROMETHEUS_ADDR` do.
    #[arg(long, env = "SLIDEGATE_METRICS_LISTEN", value_name = "ADDRESS", help_heading = OBSERVABILITY)]
    metrics_listen: Option<Endpoint>,
    /// The path of `--metrics-listen`.
    #[arg(long, env = "SLIDEGATE_METRICS_PATH", default_value = "/metrics", value_name = "PATH", requires = "metrics_listen", help_heading = OBSERVABILITY)]
    metrics_path: String,
    /// The log's format: `text`, or `json` (one object per line).
    ///
    /// With `json` the line saying where it listens is a log event too.
    #[arg(long, env = "SLIDEGATE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, value_name = "FORMAT", help_heading = OBSERVABILITY)]
    log_format: LogFormat,
    /// Export a span per decision over OTLP/gRPC to this collector.
    ///
    /// Say `http://127.0.0.1:4317`: `ratelimit.decide`, of kind SERVER,
    /// with the domain, the outcome (`OK`, `OVER_LIMIT`, `INVALID_ARGUMENT`,
    /// `UNAVAILABLE`), the store and the number of descriptors, in the
    /// trace of the request's W3C `traceparent` or B3 headers (`x-b3-*` or
    /// `b3`, as Envoy sends them) when it has one, and not made if they say
    /// it is not sampled. Spans go out in batches, off the request path,
    /// and the last ones at shutdown (waiting at most 5 s); a collector
    /// that cannot be reached loses spans, never decisions, and is logged
    /// once until it answers. The SDK's `OTEL_BSP_*` and
    /// `OTEL_EXPORTER_OTLP_TIMEOUT` variables apply. Without it no span is
    /// made.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT", value_name = "URL", help_heading = OBSERVABILITY)]
    otlp_endpoint: Option<String>,
    /// The service name of the exported spans.
    #[arg(long, env = "OTEL_SERVICE_NAME", default_value = "slidegate", value_name = "NAME", help_heading = OBSERVABILITY)]
    otel_service_name: String,

    /// How long an assignment sent to Envoy lasts, in whole seconds (6 s or more).
    ///
    /// Envoy reports every 5 s and gets a new assignment each time; past
    /// this without one it falls back to its `expired_assignment_behavior`.
    /// What an Envoy was sent stays reserved this long (plus 1 s), so a
    /// longer TTL makes shares move more slowly between Envoys.
    #[arg(long, env = "SLIDEGATE_RLQS_TTL", default_value = "10s", value_parser = parse_ttl, value_name = "DURATION", help_heading = QUOTA)]
    rlqs_ttl: Duration,
    /// Quota buckets kept in memory without Redis; more are denied.
    #[arg(long, env = "SLIDEGATE_RLQS_MAX_BUCKETS", default_value_t = 100_000, value_name = "N", help_heading = QUOTA)]
    rlqs_max_buckets: usize,
    /// Quota buckets one stream may report; more get no answer.
    #[arg(long, env = "SLIDEGATE_RLQS_MAX_STREAM_BUCKETS", default_value_t = 10_000, value_name = "N", help_heading = QUOTA)]
    rlqs_max_stream_buckets: usize,
    /// A bucket reported with no request for this long is abandoned.
    #[arg(long, env = "SLIDEGATE_RLQS_IDLE_BUCKET", default_value = "5m", value_parser = parse_timeout, value_name = "DURATION", help_heading = QUOTA)]
    rlqs_idle_bucket: Duration,
}

/// `--rlqs-ttl`: whole seconds (Envoy reads only the seconds), at least 6
/// (Envoy reports every 5 s: a shorter TTL lapses between its reports).
fn parse_ttl(s: &str) -> Result<Duration, String> {
    let ttl = parse_timeout(s)?;
    if ttl.subsec_nanos() != 0 {
        return Err(format!(
            "`{s}` is not a whole number of seconds: Envoy reads only an assignment's seconds"
        ));
    }
    if ttl < Duration::from_secs(6) {
        return Err(format!(
            "`{s}` is under 6s: Envoy reports every 5 s, so its assignments would lapse between reports"
        ));
    }
    Ok(ttl)
}

/// `--redis-failure`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Failure {
    /// Admit, counting nothing: the service stays up, unlimited.
    Open,
    /// Refuse (OVER_LIMIT, HTTP 429), retry after 100 ms: nothing passes.
    Closed,
    /// Count in this process, on the limit divided by `--redis-instances`,
    /// from this instance's share of what Redis last counted for the key.
    Local,
}

fn parse_timeout(s: &str) -> Result<Duration, String> {
    parse_positive_duration(s).map_err(|e| e.to_string())
}

fn parse_interval(s: &str) -> Result<Duration, String> {
    if s.trim() == "0s" || s.trim() == "0" {
        return Ok(Duration::ZERO);
    }
    parse_positive_duration(s).map_err(|e| e.to_string())
}

impl Args {
    /// The boolean switches: shadow mode, quota mode, merging domains,
    /// dynamic metadata, stopping increments over the limit.
    #[cfg(test)]
    pub(crate) fn switches(&self) -> [bool; 5] {
        [
            self.shadow_mode,
            self.quota_mode,
            self.merge_domain_config,
            self.response_dynamic_metadata,
            self.stop_cache_key_increment_when_overlimit && !self.no_stop_cache_key_increment_when_overlimit,
        ]
    }

    fn options(&self) -> anyhow::Result<Options> {
        let mib = |flag: &str, mib: usize| {
            mib.checked_mul(1 << 20)
                .filter(|&b| b > 0)
                .with_context(|| format!("{flag} {mib}: must be between 1 and {}", usize::MAX >> 20))
        };
        let bytes = mib("--memory-mib", self.memory_mib)?;
        let other_bytes = mib("--other-memory-mib", self.other_memory_mib)?;
        // The stores are allocated whole at start: refuse what the machine
        // (or the cgroup the process runs in) cannot hold, before trying.
        if self.redis.is_empty()
            && let Some((limit, what)) = memory_limit()
        {
            let asked = (bytes as u64).saturating_add(other_bytes as u64);
            anyhow::ensure!(
                asked < limit,
                "--memory-mib {} and --other-memory-mib {} ask for {} MiB, but {what} has {} MiB: give less",
                self.memory_mib,
                self.other_memory_mib,
                asked >> 20,
                limit >> 20
            );
        }
        for (flag, value) in [
            ("--max-connections", self.max_connections.unwrap_or(1)),
            ("--max-concurrent-streams", self.max_concurrent_streams as usize),
            ("--max-in-flight", self.max_in_flight),
            ("--max-body", self.max_body),
            ("--max-descriptors", self.max_descriptors),
            ("--max-entries", self.max_entries),
            ("--max-text", self.max_text),
        ] {
            anyhow::ensure!(value > 0, "{flag} {value}: must be at least 1");
        }
        anyhow::ensure!(
            !self.ready_requires_config || !self.config.is_empty() || self.xds.is_some(),
            "--ready-requires-config (HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED) needs --config or --xds: without a \
             config to wait for, the server would never be ready"
        );
        anyhow::ensure!(
            self.redis_instances > 0,
            "--redis-instances {}: must be at least 1",
            self.redis_instances
        );
        let tls = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some(TlsOptions {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: self.tls_client_ca.clone(),
                client_san: self.tls_client_san.clone(),
                http: !self.tls_grpc_only,
            }),
            (None, None) => {
                anyhow::ensure!(
                    self.tls_client_ca.is_none(),
                    "--tls-client-ca needs --tls-cert and --tls-key"
                );
                None
            }
            (Some(_), None) => anyhow::bail!("--tls-cert needs --tls-key (the certificate's private key)"),
            (None, Some(_)) => anyhow::bail!("--tls-key needs --tls-cert (the certificate of the key)"),
        };
        let redis = (!self.redis.is_empty()).then(|| RedisOptions {
            urls: self.redis.clone(),
            cluster: self.redis_cluster,
            sentinel: self.redis_sentinel_master.clone(),
            failure: match self.redis_failure {
                Failure::Open => FailurePolicy::Open,
                Failure::Closed => FailurePolicy::Closed,
                Failure::Local => FailurePolicy::Local {
                    instances: self.redis_instances,
                },
            },
            instances: self.redis_instances,
            timeout: self.redis_timeout,
            prefix: self.redis_prefix.clone(),
            sync_interval: self.redis_sync_interval,
            bounded: self.redis_bounded,
            batching: self.redis_batching && !self.no_redis_batching,
            tls: RedisTls {
                ca: self.redis_tls_ca.clone(),
                client_cert: self.redis_tls_cert.clone(),
                client_key: self.redis_tls_key.clone(),
                skip_hostname_verification: self.redis_tls_skip_hostname_check,
            },
        });
        let statsd = match &self.statsd {
            None => None,
            Some(target) => {
                let (host, port) = target
                    .rsplit_once(':')
                    .and_then(|(host, port)| Some((host.trim_matches(['[', ']']), port.parse::<u16>().ok()?)))
                    .filter(|(host, _)| !host.is_empty())
                    .with_context(|| format!("--statsd {target}: expected HOST:PORT, as localhost:8125"))?;
                let mut options = StatsdOptions::new(host, port);
                options.flush_interval = self.statsd_flush_interval;
                options.dogstatsd = self.dogstatsd;
                if let Some(tags) = &self.statsd_tags {
                    options.extra_tags =
                        StatsdOptions::parse_extra_tags(tags).with_context(|| format!("--statsd-tags {tags}"))?;
                }
                Some(options)
            }
        };
        let xds = self.xds.as_ref().map(|server| self.xds_options(server)).transpose()?;
        let metrics_listener = self
            .metrics_listen
            .clone()
            .map(|addr| MetricsListener::new(addr).path(&self.metrics_path));
        let mut connections = ConnectionLimits::default();
        if let Some(n) = self.max_connections {
            connections.max_connections = n;
        }
        connections.max_streams = self.max_concurrent_streams;
        connections.max_in_flight = self.max_in_flight;
        connections.max_age = self.max_connection_age;
        Ok(Options {
            xds,
            statsd,
            metrics_listener,
            connections,
            redis,
            config: self.config.clone(),
            http: self.http.clone(),
            grpc: self.grpc.clone(),
            tls,
            budget: Budget::bytes(bytes),
            other_budget: Budget::bytes(other_bytes),
            input: InputLimits {
                descriptors: self.max_descriptors,
                entries: self.max_entries,
                text: self.max_text,
            },
            body_limit: self.max_body,
            admin_token: self.admin_token.clone(),
            timeouts: Timeouts {
                header: self.header_timeout,
                idle: self.idle_timeout,
                request: self.request_timeout,
            },
            reload_every: (!self.reload_every.is_zero()).then_some(self.reload_every),
            allow_empty_reload: self.allow_empty_reload,
            grpc_headers: self.grpc_headers,
            settings: Settings {
                stop_increment_when_over_limit: self.stop_cache_key_increment_when_overlimit
                    && !self.no_stop_cache_key_increment_when_overlimit,
                shadow_mode: self.shadow_mode,
                quota_mode: self.quota_mode,
                dynamic_metadata: self.response_dynamic_metadata,
            },
            near_limit_ratio: self.near_limit_ratio,
            merge_domains: self.merge_domain_config,
            drain_delay: self.drain_delay,
            quota: QuotaOptions {
                timing: Timing::with_ttl(self.rlqs_ttl),
                max_stream_buckets: self.rlqs_max_stream_buckets,
                idle_bucket: self.rlqs_idle_bucket,
                max_buckets: self.rlqs_max_buckets,
                ..QuotaOptions::default()
            },
            max_config_bytes: self.max_config_bytes,
            ready_requires_redis: self.ready_requires_redis,
            ready_requires_config: self.ready_requires_config,
            give_back_memory: crate::alloc::give_back_free_memory,
            workers: match self.workers {
                Some(n) => {
                    anyhow::ensure!(n <= MAX_WORKERS, "--workers {n}: at most {MAX_WORKERS}");
                    n
                }
                None => std::thread::available_parallelism().map_or(1, |n| n.get().min(64)),
            },
            response_headers: self.limit_response_headers_enabled.then(|| ResponseHeaderNames {
                limit: self.limit_limit_header.clone(),
                remaining: self.limit_remaining_header.clone(),
                reset: self.limit_reset_header.clone(),
            }),
            legacy_headers: match self.legacy_headers.as_deref() {
                Some("epoch") => Some(LegacyReset::EpochSeconds),
                Some(_) => Some(LegacyReset::DelaySeconds),
                None => None,
            },
        })
    }
}

/// The most `--workers`.
impl Args {
    /// The xDS source of `--xds SERVER` and its flags.
    fn xds_options(&self, server: &str) -> anyhow::Result<XdsOptions> {
        anyhow::ensure!(
            (0.0..=1.0).contains(&self.xds_backoff_random_factor),
            "--xds-backoff-random-factor {}: must be between 0 and 1",
            self.xds_backoff_random_factor
        );
        anyhow::ensure!(
            self.xds_backoff_initial <= self.xds_backoff_max,
            "--xds-backoff-initial {:?} is longer than --xds-backoff-max {:?}",
            self.xds_backoff_initial,
            self.xds_backoff_max
        );
        anyhow::ensure!(
            !self.xds_tls || self.xds_tls_ca.is_some(),
            "--xds-tls needs --xds-tls-ca: the control plane's certificate is checked against it"
        );
        Ok(XdsOptions {
            server: server.to_owned(),
            node_id: self.xds_node_id.clone(),
            node_metadata: pairs("--xds-node-metadata", self.xds_node_metadata.as_deref(), '=')?,
            headers: pairs("--xds-header", self.xds_header.as_deref(), ':')?,
            tls: self.xds_tls.then(|| XdsTls {
                ca: self.xds_tls_ca.clone(),
                cert: self.xds_tls_cert.clone(),
                key: self.xds_tls_key.clone(),
                server_name: self.xds_tls_server_name.clone(),
            }),
            backoff: XdsBackoff {
                initial: self.xds_backoff_initial,
                max: self.xds_backoff_max,
                random_factor: self.xds_backoff_random_factor,
                jitter: !self.xds_no_backoff_jitter,
            },
            max_message_bytes: self.xds_max_message_bytes,
            wait_for_first_snapshot: !self.xds_force_start,
        })
    }
}

/// `key<sep>value` pairs separated by `,` (`flag`'s value); none for `None`.
fn pairs(flag: &str, text: Option<&str>, sep: char) -> anyhow::Result<Vec<(String, String)>> {
    let Some(text) = text else { return Ok(Vec::new()) };
    text.split(',')
        .map(str::trim)
        .filter(|pair| !pair.is_empty())
        .map(|pair| match pair.split_once(sep) {
            Some((key, value)) if !key.trim().is_empty() => Ok((key.trim().to_owned(), value.trim().to_owned())),
            _ => anyhow::bail!("{flag} {text}: `{pair}` is not key{sep}value"),
        })
        .collect()
}

const MAX_WORKERS: usize = 1024;

/// Serves until SIGTERM or SIGINT.
/// Serves until SIGTERM or SIGINT; `notes` (about envoyproxy/ratelimit's
/// variables that mean nothing here) are logged once the log is up.
pub(crate) fn run(args: &Args, notes: &[String]) -> anyhow::Result<()> {
    let options = args.options()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    // An empty `OTEL_EXPORTER_OTLP_ENDPOINT` is no endpoint.
    let endpoint = args.otlp_endpoint.as_deref().filter(|e| !e.trim().is_empty());
    let otlp = match endpoint {
        Some(endpoint) => {
            let _inside = runtime.enter();
            Some(Otlp::start(endpoint, &args.otel_service_name)?)
        }
        None => None,
    };
    init_log(args.log_format, &args.log_level, otlp.as_ref())?;
    for note in notes {
        tracing::info!("envoyproxy/ratelimit's {note}");
    }
    if let Some(endpoint) = endpoint {
        tracing::info!("exporting a span per decision over OTLP to {endpoint}");
    }
    let served = runtime.block_on(async {
        let signal = server::shutdown_signal().context("cannot install the SIGTERM and SIGINT handlers")?;
        let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
            .context("cannot install the SIGHUP handler")?;
        let running = server::start(options, MonotonicClock::new())
            .await
            .map_err(name_the_flag)?;
        // Said once the server runs: a start that fails says only why.
        if args.config.is_empty() && args.xds.is_none() {
            tracing::warn!(
                "no config given (--config, or SLIDEGATE_CONFIG in the environment): no domain has limits, \
                 so every descriptor is answered OK; only the ad-hoc checks of POST /v1/check limit anything"
            );
        }
        // SIGHUP reloads the config and the TLS files now, through the
        // watchers' paths (which log the outcome; the config's is counted).
        let reloader = std::sync::Arc::clone(running.reloader());
        tokio::spawn(async move {
            while hangup.recv().await.is_some() {
                tracing::info!("SIGHUP: reloading the config");
                // Off the runtime's threads, as the watcher's reloads.
                let reloader = std::sync::Arc::clone(&reloader);
                let _ = tokio::task::spawn_blocking(move || {
                    let _ = reloader.reload();
                    let _ = reloader.reload_tls();
                })
                .await;
            }
        });
        match args.log_format {
            LogFormat::Text => eprintln!("slidegate: HTTP on {}, gRPC on {}", running.http, running.grpc),
            LogFormat::Json => tracing::info!(http = %running.http, grpc = %running.grpc, "listening"),
        }
        if let Some(metrics) = &running.metrics {
            match args.log_format {
                LogFormat::Text => eprintln!("slidegate: metrics on {metrics}"),
                LogFormat::Json => tracing::info!(metrics = %metrics, "listening"),
            }
        }
        running.run_until(signal).await;
        anyhow::Ok(())
    });
    // The runtime still runs: it carries the last export.
    if let Some(otlp) = otlp {
        otlp.shutdown();
    }
    served
}

/// The log on stderr at `RUST_LOG` (by default `info`), as `format` says;
/// with `otlp`, its layer for the decision spans beside it.
fn init_log(format: LogFormat, level: &str, otlp: Option<&Otlp>) -> anyhow::Result<()> {
    use tracing_subscriber::util::SubscriberInitExt as _;
    subscriber(format, level, otlp)?
        .try_init()
        .context("cannot start the log")
}

/// The log (and with `otlp` the exporter of the decision spans).
fn subscriber(
    format: LogFormat,
    level: &str,
    otlp: Option<&Otlp>,
) -> anyhow::Result<Box<dyn tracing::Subscriber + Send + Sync>> {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    // h2 warns once per connection it closes for a flood of resets or
    // frames (an attack makes thousands a second): the server counts those
    // and logs one line per 10 s instead, so h2's own are off unless
    // `RUST_LOG` names them.
    let from_env = std::env::var("RUST_LOG").unwrap_or_default();
    let mut filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| level.into());
    if !from_env.contains("h2") {
        filter = filter.add_directive("h2=error".parse()?);
    }
    let filter = filter
        // The decision spans carry what a request does: never in the log
        // (and, without `--otlp-endpoint`, never made at all).
        .add_directive(format!("{DECISION_TARGET}=off").parse()?);
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let fmt = match format {
        LogFormat::Text => fmt
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .boxed(),
        LogFormat::Json => fmt.json().boxed(),
    };
    let log = tracing_subscriber::registry().with(fmt.with_filter(filter));
    // No exporter is no layer: an absent layer (`None`) would say it wants
    // every span, and each decision would make a span for nothing (about
    // 3,000 instructions a gRPC call).
    Ok(match otlp {
        Some(otlp) => Box::new(log.with(otlp.layer())),
        None => Box::new(log),
    })
}

/// A start error, a TLS file's named by its flag.
fn name_the_flag(error: StartError) -> anyhow::Error {
    match error {
        StartError::Tls(e) => {
            let flag = match e.file() {
                TlsFile::Key => "--tls-key",
                TlsFile::ClientCa => "--tls-client-ca",
                _ => "--tls-cert",
            };
            anyhow::anyhow!("{flag} {}: {}", e.path().display(), e.reason())
        }
        // Every error of the config, one per line, as `check` prints them.
        StartError::Config(errors) => crate::check::report(&errors),
        e => e.into(),
    }
}

/// A header name for `--limit-*-header`.
fn parse_header_name(text: &str) -> Result<http::HeaderName, String> {
    http::HeaderName::try_from(text).map_err(|_| format!("`{text}` is not a valid HTTP header name"))
}

/// The memory this process may use: the smaller of the machine's
/// (`MemTotal` in `/proc/meminfo`) and its cgroup's limit, with what it
/// is; `None` where neither can be read.
fn memory_limit() -> Option<(u64, &'static str)> {
    let machine = std::fs::read_to_string("/proc/meminfo").ok().and_then(|text| {
        let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some((kib.saturating_mul(1024), "this machine"))
    });
    let membership = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let cgroup = cgroup_memory_limit(&membership, |path| std::fs::read_to_string(path).ok())
        .map(|bytes| (bytes, "the process's cgroup"));
    match (machine, cgroup) {
        (Some(m), Some(c)) => Some(if c.0 < m.0 { c } else { m }),
        (m, c) => m.or(c),
    }
}

/// The memory limit of the cgroup that `membership` (the text of
/// `/proc/self/cgroup`) names, `read` giving the files under
/// `/sys/fs/cgroup`: the smallest limit of that cgroup and its ancestors
/// (v2 `memory.max`, v1 `memory.limit_in_bytes`), those that can be read.
///
/// A container sees its own cgroup at the root (`0::/`); a systemd
/// service sees the host's tree and sits in its unit's cgroup
/// (`0::/system.slice/slidegate.service`), whose `MemoryMax=` is that
/// folder's `memory.max`, not the root's.
fn cgroup_memory_limit(membership: &str, read: impl Fn(&str) -> Option<String>) -> Option<u64> {
    let limit = |path: &str| read(path).and_then(|t| t.trim().parse::<u64>().ok());
    // v2: `0::PATH`; v1: `N:...memory...:PATH`. A hybrid system has both,
    // its memory controller on v1.
    let v2 = membership.lines().find_map(|l| l.strip_prefix("0::"));
    let v1 = membership.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        controllers.split(',').any(|c| c == "memory").then_some(path)
    });
    let mut hierarchies = Vec::new();
    if let Some(path) = v2 {
        hierarchies.push(("/sys/fs/cgroup", "memory.max", path));
    }
    if let Some(path) = v1 {
        hierarchies.push(("/sys/fs/cgroup/memory", "memory.limit_in_bytes", path));
    }
    if hierarchies.is_empty() {
        // No membership known: the root of either hierarchy.
        hierarchies = vec![
            ("/sys/fs/cgroup", "memory.max", "/"),
            ("/sys/fs/cgroup/memory", "memory.limit_in_bytes", "/"),
        ];
    }
    let mut smallest: Option<u64> = None;
    for (base, file, path) in hierarchies {
        let mut folder = path.trim_end_matches('/').to_owned();
        loop {
            // `max` (no limit) does not parse, and a folder not mounted
            // here (a container's view of the host's path) reads nothing.
            if let Some(bytes) = limit(&format!("{base}{folder}/{file}")) {
                smallest = Some(smallest.map_or(bytes, |s| s.min(bytes)));
            }
            match folder.rfind('/') {
                Some(at) => folder.truncate(at),
                None => break,
            }
        }
    }
    smallest
}

#[cfg(test)]
mod cgroup_tests {
    use super::cgroup_memory_limit;
    use std::collections::HashMap;

    fn files(list: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = list.iter().map(|(p, t)| ((*p).to_owned(), (*t).to_owned())).collect();
        move |path: &str| map.get(path).cloned()
    }

    /// In a container (its own cgroup at the root): the root's file.
    #[test]
    fn a_container_reads_its_root() {
        let read = files(&[("/sys/fs/cgroup/memory.max", "402653184\n")]);
        assert_eq!(cgroup_memory_limit("0::/\n", read), Some(402_653_184));
    }

    /// Under systemd: the unit's `MemoryMax=`, in its own folder, and the
    /// smaller of it and its slice's.
    #[test]
    fn a_systemd_service_reads_its_units_folder_and_its_ancestors() {
        let unit = "0::/system.slice/slidegate.service\n";
        let read = files(&[
            (
                "/sys/fs/cgroup/system.slice/slidegate.service/memory.max",
                "536870912\n",
            ),
            ("/sys/fs/cgroup/system.slice/memory.max", "max\n"),
        ]);
        assert_eq!(cgroup_memory_limit(unit, read), Some(536_870_912));
        let read = files(&[
            (
                "/sys/fs/cgroup/system.slice/slidegate.service/memory.max",
                "536870912\n",
            ),
            ("/sys/fs/cgroup/system.slice/memory.max", "268435456\n"),
        ]);
        assert_eq!(cgroup_memory_limit(unit, read), Some(268_435_456));
        // No limit anywhere.
        let read = files(&[("/sys/fs/cgroup/system.slice/slidegate.service/memory.max", "max\n")]);
        assert_eq!(cgroup_memory_limit(unit, read), None);
    }

    /// cgroup v1, and a hybrid system (v1's memory controller beside the
    /// unified v2 tree, which has no memory limit).
    #[test]
    fn cgroup_v1_reads_the_memory_hierarchy() {
        let v1 = "12:cpu,cpuacct:/x\n4:memory:/docker/abc\n";
        let read = || {
            files(&[
                ("/sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes", "1073741824\n"),
                ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n"),
            ])
        };
        assert_eq!(cgroup_memory_limit(v1, read()), Some(1_073_741_824));
        assert_eq!(
            cgroup_memory_limit(&format!("{v1}0::/x\n"), read()),
            Some(1_073_741_824)
        );
    }

    /// Nothing known: the roots, as before.
    #[test]
    fn without_membership_the_roots_are_read() {
        let read = files(&[("/sys/fs/cgroup/memory.max", "1000\n")]);
        assert_eq!(cgroup_memory_limit("", read), Some(1000));
    }
}

/// `--log-format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

#[cfg(test)]
mod log_tests {
    use super::*;

    /// Without an exporter the decision spans are never made: the log's
    /// subscriber does not want them (nor would it with an absent layer
    /// left in, which the test before this fix failed on).
    #[test]
    fn without_otlp_the_decision_spans_are_off() {
        let subscriber = subscriber(LogFormat::Text, "info", None).unwrap();
        tracing::subscriber::with_default(subscriber, || {
            let span = slidegate_server::trace::DecisionSpan::start(
                &http::HeaderMap::new(),
                slidegate_server::metrics::Api::Grpc,
                Some("d"),
                1,
                "memory",
            );
            assert!(span.is_disabled());
            // The log itself is on.
            assert!(tracing::enabled!(tracing::Level::INFO));
        });
    }
}
