//! envoyproxy/ratelimit's process contract, as a process: `slidegate`
//! started under the name `ratelimit` with that service's environment
//! variables and no argument, as an image's `/bin/ratelimit` is.

mod common;

use slidegate_conformance::redis::RedisSentinel;
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
    let channel = tonic::transport::Channel::from_shared(format!("http://{grpc}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
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
    command.envs([
        ("HOST", "127.0.0.1"),
        ("PORT", "0"),
        ("GRPC_HOST", "127.0.0.1"),
        ("GRPC_PORT", "0"),
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
