//! envoyproxy/ratelimit's process contract, as a process: `slidegate`
//! started under the name `ratelimit` with that service's environment
//! variables and no argument, as an image's `/bin/ratelimit` is.

mod common;

use common::certs::Ca;
use slidegate_conformance::redis::{RedisSentinel, RedisServer, free_port};
use slidegate_server::proto::descriptor::RateLimitDescriptor;
use slidegate_server::proto::descriptor::rate_limit_descriptor::Entry;
use slidegate_server::proto::rls::RateLimitRequest;
use slidegate_server::proto::rls::rate_limit_response::Code;
use slidegate_server::proto::rls::rate_limit_service_client::RateLimitServiceClient;
use std::path::{Path, PathBuf};
use std::process::Command;

/// `dir/ratelimit`, a symbolic link to the built `slidegate`, as an image
/// offers `/bin/ratelimit`; started with no argument and without the
/// variables of the machine running the tests.
fn ratelimit(dir: &Path) -> Command {
    let link = dir.join("ratelimit");
    if !link.exists() {
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_slidegate"), &link).unwrap();
    }
    let mut command = Command::new(link);
    for name in common::RATELIMIT_VARIABLES {
        command.env_remove(name);
    }
    command
}

/// One `ShouldRateLimit` of `key=value` in `domain` to `grpc`.
async fn decide(grpc: &str, domain: &str, key: &str, value: &str) -> Code {
    let channel = common::channel(grpc).await;
    let mut client = RateLimitServiceClient::new(channel);
    let request = RateLimitRequest {
        domain: domain.to_owned(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: key.to_owned(),
                value: value.to_owned(),
            }],
            ..Default::default()
        }],
        hits_addend: 0,
    };
    client
        .should_rate_limit(request)
        .await
        .unwrap()
        .into_inner()
        .overall_code()
}

/// The config of envoyproxy/ratelimit's file source: under
/// `RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config/`.
fn runtime(dir: &Path) -> PathBuf {
    let config = dir.join("data/ratelimit/config");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(
        config.join("limits.yaml"),
        "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: { unit: hour, requests_per_unit: 2 }\n",
    )
    .unwrap();
    dir.join("data")
}

/// `ratelimit` with its file source and a Redis found through Sentinel
/// (`REDIS_TYPE=sentinel`, `REDIS_URL=master,host:port`), as
/// envoyproxy/ratelimit's variables say: it loads the config under the
/// runtime root, counts in the primary the Sentinel names, and logs once
/// each variable that means nothing here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ratelimit_name_serves_envoyproxy_ratelimits_environment() {
    let dir = common::fresh("ratelimit-env");
    let sentinel = RedisSentinel::start();
    let root = runtime(&dir);
    let mut command = ratelimit(&dir);
    command.envs(common::LOOPBACK).envs([
        ("RUNTIME_ROOT", root.to_str().unwrap()),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("RUNTIME_WATCH_ROOT", "false"),
        ("USE_STATSD", "false"),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_TYPE", "sentinel"),
        (
            "REDIS_URL",
            &format!("{},127.0.0.1:{}", RedisSentinel::MASTER, sentinel.port()),
        ),
        ("REDIS_POOL_SIZE", "10"),
        // The tests' keys start with `slidegate:`.
        ("CACHE_KEY_PREFIX", "slidegate:eg:"),
    ]);
    let (child, lines) = common::spawn_logging(&mut command);
    let mut log = Vec::new();
    let (_, grpc) = common::next_line(&lines, &mut log, common::listening_on);
    let noted = log
        .iter()
        .filter(|l| l.contains("REDIS_POOL_SIZE=10: no pool to size"))
        .count();
    let watch = log.iter().filter(|l| l.contains("RUNTIME_WATCH_ROOT=false")).count();
    assert_eq!((noted, watch), (1, 1), "{log:#?}");

    assert_eq!(decide(&grpc, "edge", "user", "alice").await, Code::Ok);
    assert_eq!(decide(&grpc, "edge", "user", "alice").await, Code::Ok);
    // envoyproxy/ratelimit's default: a refused request counts too.
    assert_eq!(decide(&grpc, "edge", "user", "alice").await, Code::OverLimit);
    let keys = sentinel.primary.keys_and_ttls();
    assert!(
        !keys.is_empty() && keys.iter().all(|(k, _)| k.starts_with("slidegate:eg:")),
        "{keys:?}"
    );
    common::terminate(child);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A variable of envoyproxy/ratelimit's and slidegate's own flag that
/// disagree stop the start with one line naming both; a setting slidegate
/// cannot honour is refused, named.
#[test]
fn a_conflict_or_a_setting_it_cannot_honour_stops_the_start() {
    let dir = common::fresh("ratelimit-env-refused");
    for (env, args, says) in [
        (
            &[("GRPC_PORT", "9000")][..],
            &["--grpc", "127.0.0.1:0"][..],
            "error: GRPC_PORT=9000 asks for --grpc 0.0.0.0:9000, but the command line's --grpc 127.0.0.1:0 says \
             otherwise: set one of them\n",
        ),
        (
            &[("GRPC_PORT", "9000"), ("SLIDEGATE_GRPC", "127.0.0.1:0")],
            &[],
            "error: GRPC_PORT=9000 asks for --grpc 0.0.0.0:9000, but SLIDEGATE_GRPC=127.0.0.1:0 says otherwise: set \
             one of them\n",
        ),
        (
            &[("BACKEND_TYPE", "memcache")],
            &[],
            "error: BACKEND_TYPE=memcache: slidegate counts in memory or in Redis (BACKEND_TYPE=redis)\n",
        ),
    ] {
        let out = ratelimit(&dir).envs(env.iter().copied()).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(1));
        assert_eq!(String::from_utf8_lossy(&out.stderr), says);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `leaf`'s certificate and key, written to `dir/name.pem` and
/// `dir/name.key`; their paths.
fn write_leaf(dir: &Path, name: &str, leaf: &common::certs::Leaf) -> (String, String) {
    let (cert, key) = (dir.join(format!("{name}.pem")), dir.join(format!("{name}.key")));
    std::fs::write(&cert, &leaf.pem).unwrap();
    std::fs::write(&key, &leaf.key_pem).unwrap();
    (path_text(&cert), path_text(&key))
}

fn path_text(path: &Path) -> String {
    path.to_str().unwrap().to_owned()
}

/// `redis-server` answering TLS on `127.0.0.1` and `127.0.0.2` at the
/// port it answers, with a certificate of `ca` for `127.0.0.1` and
/// `localhost`,
/// requiring a client certificate of `ca`; the tests' own checks use its
/// plain port (on `127.0.0.2` too).
fn tls_redis(dir: &Path, ca_file: &str, ca: &Ca) -> (RedisServer, u16) {
    let (cert, key) = write_leaf(dir, "redis", &ca.server("redis"));
    let mut last = String::new();
    for _ in 0..5 {
        let tls_port = free_port().to_string();
        let extra = [
            "--bind",
            "127.0.0.1 127.0.0.2",
            "--tls-port",
            &tls_port,
            "--tls-cert-file",
            &cert,
            "--tls-key-file",
            &key,
            "--tls-ca-cert-file",
            ca_file,
            "--tls-auth-clients",
            "yes",
        ];
        match RedisServer::start_on(free_port(), &extra) {
            Ok(server) => return (server, tls_port.parse().unwrap()),
            Err(e) => last = e,
        }
    }
    panic!("no TLS redis-server: {last}");
}

/// `redis-cli` over TLS with the client certificate `me`: its answer.
fn tls_cli(port: u16, ca_file: &str, me: &(String, String), args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "--tls", "--cacert", ca_file])
        .args(["--cert", &me.0, "--key", &me.1])
        .args(args)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// `REDIS_TLS=true` with envoyproxy/ratelimit's certificate variables:
/// `ratelimit` reaches a Redis that takes TLS only, and only from clients
/// with a certificate of its CA, and counts there; without the client
/// certificate, with a bad CA file, or at an address the certificate does
/// not name, the start stops with one line saying why, and
/// `REDIS_TLS_SKIP_HOSTNAME_VERIFICATION=true` takes that address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_over_tls_with_a_client_certificate() {
    let dir = common::fresh("ratelimit-env-redis-tls");
    let root = runtime(&dir);
    let ca = Ca::new("redis test CA");
    let ca_file = dir.join("ca.pem");
    std::fs::write(&ca_file, &ca.pem).unwrap();
    let ca_file = path_text(&ca_file);
    let me = write_leaf(&dir, "slidegate", &ca.client("slidegate"));
    let (redis, tls_port) = tls_redis(&dir, &ca_file, &ca);
    let url = format!("127.0.0.1:{tls_port}");
    let start = |url: &str, tls: &[(&str, &str)]| {
        let mut command = ratelimit(&dir);
        command
            .envs(common::LOOPBACK)
            .envs([
                ("RUNTIME_ROOT", root.to_str().unwrap()),
                ("RUNTIME_SUBDIRECTORY", "ratelimit"),
                ("USE_STATSD", "false"),
                ("REDIS_SOCKET_TYPE", "tcp"),
                ("REDIS_URL", url),
                ("REDIS_TLS", "true"),
                // The tests' keys start with `slidegate:`.
                ("CACHE_KEY_PREFIX", "slidegate:tls:"),
            ])
            .envs(tls.iter().copied());
        command
    };
    let certified = [
        ("REDIS_TLS_CACERT", ca_file.as_str()),
        ("REDIS_TLS_CLIENT_CERT", me.0.as_str()),
        ("REDIS_TLS_CLIENT_KEY", me.1.as_str()),
    ];

    // Counts in that Redis, over TLS: a plain connection to its TLS port
    // would get no answer.
    let (child, lines) = common::spawn_logging(&mut start(&url, &certified));
    let (_, grpc) = common::next_line(&lines, &mut Vec::new(), common::listening_on);
    assert_eq!(decide(&grpc, "edge", "user", "alice").await, Code::Ok);
    assert_eq!(decide(&grpc, "edge", "user", "alice").await, Code::Ok);
    assert_eq!(decide(&grpc, "edge", "user", "alice").await, Code::OverLimit);
    let keys = tls_cli(tls_port, &ca_file, &me, &["--scan"]);
    assert!(
        !keys.is_empty() && keys.lines().all(|k| k.starts_with("slidegate:tls:")),
        "{keys:?}"
    );
    common::terminate(child);

    let fails = |url: &str, tls: &[(&str, &str)]| {
        let out = start(url, tls).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
        stderr
    };
    // Without its client certificate, Redis refuses the handshake.
    let said = fails(&url, &certified[..1]);
    assert!(
        said.starts_with(&format!("error: cannot reach Redis at rediss://{url}")) && said.contains("Certificate"),
        "{said}"
    );
    // A CA file that is not there, or holds no certificate, is named.
    let missing = path_text(&dir.join("missing.pem"));
    let said = fails(
        &url,
        &[("REDIS_TLS_CACERT", missing.as_str()), certified[1], certified[2]],
    );
    assert!(
        said.starts_with(&format!("error: Redis TLS CA file {missing}: cannot read it: ")),
        "{said}"
    );
    let said = fails(&url, &[("REDIS_TLS_CACERT", me.1.as_str()), certified[1], certified[2]]);
    assert_eq!(
        said,
        format!("error: Redis TLS CA file {}: no PEM certificate in it\n", me.1)
    );
    // 127.0.0.2 is not a name of the certificate: refused, unless told to
    // skip that check (the CA's signature is still checked).
    let other = format!("127.0.0.2:{tls_port}");
    let said = fails(&other, &certified);
    assert_eq!(
        said.matches("certificate not valid for name \"127.0.0.2\"").count(),
        1,
        "{said}"
    );
    let skip = [&certified[..], &[("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "true")]].concat();
    let said = fails(&other, &skip[1..]);
    assert!(
        said.contains("UnknownIssuer"),
        "the system's roots do not have the test's CA: {said}"
    );
    let (child, lines) = common::spawn_logging(&mut start(&other, &skip));
    let (_, grpc) = common::next_line(&lines, &mut Vec::new(), common::listening_on);
    assert_eq!(decide(&grpc, "edge", "user", "bob").await, Code::Ok);
    common::terminate(child);
    let keys = redis.keys_and_ttls();
    assert!(keys.iter().any(|(k, _)| k.contains("bob")), "{keys:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
