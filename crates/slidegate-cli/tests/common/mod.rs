//! Running `slidegate serve` as a process, for the process tests: spawn it,
//! read its log as it comes, wait on its lines, stop it.
#![allow(dead_code, unreachable_pub)]

pub mod certs;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::Duration;

/// A fresh, empty folder for the test `name`, named after it and this
/// process (the test removes it when it passes).
pub fn fresh(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("slidegate-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// envoyproxy/ratelimit's variables that `serve` honours: removed from
/// every process a test starts, so that a machine that sets one (`PORT`,
/// `LOG_LEVEL`, ...) changes no test. The tests of that contract set them.
pub const RATELIMIT_VARIABLES: &[&str] = &[
    "HOST",
    "PORT",
    "GRPC_HOST",
    "GRPC_PORT",
    "GRPC_UDS",
    "DEBUG_HOST",
    "DEBUG_PORT",
    "GRPC_MAX_CONNECTION_AGE",
    "GRPC_MAX_CONNECTION_AGE_GRACE",
    "GRPC_SERVER_USE_TLS",
    "GRPC_SERVER_TLS_CERT",
    "GRPC_SERVER_TLS_KEY",
    "GRPC_CLIENT_TLS_CACERT",
    "GRPC_SERVER_TLS_CA_CERT",
    "GRPC_CLIENT_TLS_SAN",
    "LOG_LEVEL",
    "LOG_FORMAT",
    "CONFIG_TYPE",
    "FORCE_START_WITHOUT_INITIAL_CONFIG",
    "CONFIG_GRPC_XDS_NODE_ID",
    "CONFIG_GRPC_XDS_NODE_METADATA",
    "CONFIG_GRPC_XDS_SERVER_URL",
    "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
    "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
    "CONFIG_GRPC_XDS_SERVER_USE_TLS",
    "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
    "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
    "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
    "CONFIG_GRPC_XDS_SERVER_TLS_SAN",
    "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL",
    "XDS_CLIENT_BACKOFF_MAX_INTERVAL",
    "XDS_CLIENT_BACKOFF_RANDOM_FACTOR",
    "XDS_CLIENT_BACKOFF_JITTER",
    "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES",
    "USE_DOG_STATSD",
    "USE_DOG_STATSD_MOGRIFIERS",
    "USE_STATSD",
    "STATSD_HOST",
    "STATSD_PORT",
    "EXTRA_TAGS",
    "STATS_FLUSH_INTERVAL",
    "DISABLE_STATS",
    "USE_PROMETHEUS",
    "PROMETHEUS_ADDR",
    "PROMETHEUS_PATH",
    "PROMETHEUS_MAPPER_YAML",
    "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS",
    "RUNTIME_ROOT",
    "RUNTIME_SUBDIRECTORY",
    "RUNTIME_APPDIRECTORY",
    "RUNTIME_IGNOREDOTFILES",
    "RUNTIME_WATCH_ROOT",
    "EXPIRATION_JITTER_MAX_SECONDS",
    "LOCAL_CACHE_SIZE_IN_BYTES",
    "NEAR_LIMIT_RATIO",
    "CACHE_KEY_PREFIX",
    "BACKEND_TYPE",
    "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
    "LIMIT_RESPONSE_HEADERS_ENABLED",
    "LIMIT_LIMIT_HEADER",
    "LIMIT_REMAINING_HEADER",
    "LIMIT_RESET_HEADER",
    "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
    "REDIS_SOCKET_TYPE",
    "REDIS_TYPE",
    "REDIS_URL",
    "REDIS_POOL_SIZE",
    "REDIS_AUTH",
    "REDIS_TLS",
    "REDIS_TLS_CLIENT_CERT",
    "REDIS_TLS_CLIENT_KEY",
    "REDIS_TLS_CACERT",
    "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
    "REDIS_PIPELINE_WINDOW",
    "REDIS_PIPELINE_LIMIT",
    "REDIS_CLUSTER_PIPELINE_PARALLELISM",
    "REDIS_PERSECOND",
    "REDIS_SENTINEL_AUTH",
    "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
    "REDIS_TIMEOUT",
    "REDIS_POOL_ON_EMPTY_BEHAVIOR",
    "REDIS_STARTUP_INITIAL_INTERVAL",
    "REDIS_STARTUP_MAX_INTERVAL",
    "REDIS_STARTUP_MAX_ELAPSED_TIME",
    "MEMCACHE_HOST_PORT",
    "MEMCACHE_SRV",
    "SHADOW_MODE",
    "QUOTA_MODE",
    "RESPONSE_DYNAMIC_METADATA",
    "MERGE_DOMAIN_CONFIG",
    "TRACING_ENABLED",
    "TRACING_SERVICE_NAME",
    "TRACING_EXPORTER_PROTOCOL",
    "TRACING_SAMPLING_RATE",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_SERVICE_NAME",
];

/// The built `slidegate`, without envoyproxy/ratelimit's variables (nor
/// the project's own `SLIDEGATE_*`) in its environment.
pub fn slidegate() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_slidegate"));
    for name in RATELIMIT_VARIABLES {
        command.env_remove(name);
    }
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("SLIDEGATE_") {
            command.env_remove(name);
        }
    }
    command
}

/// A plain HTTP/2 channel to the gRPC address `grpc`, connected.
pub async fn channel(grpc: &str) -> tonic::transport::Channel {
    tonic::transport::Channel::from_shared(format!("http://{grpc}"))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

/// envoyproxy/ratelimit's listener variables for free loopback ports.
pub const LOOPBACK: [(&str, &str); 4] = [
    ("HOST", "127.0.0.1"),
    ("PORT", "0"),
    ("GRPC_HOST", "127.0.0.1"),
    ("GRPC_PORT", "0"),
];

/// `slidegate serve` on free loopback ports, then `extra`.
pub fn serve_command(extra: &[&str]) -> Command {
    let mut command = slidegate();
    command
        .args(["serve", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"])
        .args(extra);
    command
}

/// One HTTP/1.1 request on a connection of its own; the whole answer.
pub fn request(addr: &str, method: &str, path: &str, body: &str) -> String {
    request_with(addr, method, path, "", body)
}

/// [`request`] with `extra` header lines (each ending in `\r\n`).
pub fn request_with(addr: &str, method: &str, path: &str, extra: &str, body: &str) -> String {
    let mut stream = TcpStream::connect(addr).expect("the server accepts");
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-type: application/json\r\n{extra}content-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    answer
}

/// Waits (bounded: 20 s) for the child to exit; kills it if it does not.
pub fn exit_code(mut child: Child) -> Option<i32> {
    let pid = child.id();
    let (done, exited) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(child.wait().ok().and_then(|s| s.code()));
    });
    match exited.recv_timeout(Duration::from_secs(20)) {
        Ok(code) => code,
        Err(_) => {
            let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
            None
        }
    }
}

/// Runs `slidegate serve` on free loopback ports with `extra` flags to its
/// end (a start that fails); its exit code and stderr.
pub fn serve_fails(extra: &[&str]) -> (Option<i32>, String) {
    let out = serve_command(extra).output().unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Starts `slidegate serve` on free loopback ports with `extra` flags, its
/// log at `RUST_LOG=info` (and no drain delay); the child and its log,
/// line by line, as it comes.
pub fn serve_logging(extra: &[&str]) -> (Child, Receiver<String>) {
    serve_logging_with(extra, &[])
}

/// [`serve_logging`] with `env` set for the process too.
pub fn serve_logging_with(extra: &[&str], env: &[(&str, &str)]) -> (Child, Receiver<String>) {
    let drain: &[&str] = if extra.contains(&"--drain-delay") {
        &[]
    } else {
        &["--drain-delay", "0s"]
    };
    spawn_logging(serve_command(drain).args(extra).envs(env.iter().copied()))
}

/// Spawns `command` (a `slidegate serve`) with its log at `RUST_LOG=info`
/// (unless `command` sets it);
/// the child and its log, line by line, as it comes.
pub fn spawn_logging(command: &mut Command) -> (Child, Receiver<String>) {
    if !command.get_envs().any(|(name, _)| name == "RUST_LOG") {
        command.env("RUST_LOG", "info");
    }
    let mut child = command.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    (child, lines)
}

/// The first log line that `pick` maps to something, the lines before it
/// kept in `log`; bounded (20 s without a line fails).
pub fn next_line<T>(lines: &Receiver<String>, log: &mut Vec<String>, mut pick: impl FnMut(&str) -> Option<T>) -> T {
    loop {
        let line = lines
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("the log stopped: {log:#?}"));
        let picked = pick(&line);
        log.push(line);
        if let Some(found) = picked {
            return found;
        }
    }
}

/// The HTTP address from the text log's line saying where it listens.
pub fn listening(line: &str) -> Option<String> {
    listening_on(line).map(|(http, _)| http)
}

/// The HTTP and gRPC addresses from the text log's line saying where it
/// listens.
pub fn listening_on(line: &str) -> Option<(String, String)> {
    let (http, grpc) = line.strip_prefix("slidegate: HTTP on ")?.split_once(", gRPC on ")?;
    Some((http.to_owned(), grpc.to_owned()))
}

/// Sends SIGTERM and checks the clean exit.
pub fn terminate(child: Child) {
    signal("TERM", &child);
    assert_eq!(exit_code(child), Some(0));
}

/// Sends the signal `name` (`HUP`, `TERM`) to `child`.
pub fn signal(name: &str, child: &Child) {
    let sent = Command::new("kill")
        .args([format!("-{name}"), child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
}
