//! envoyproxy/ratelimit's process contract: the environment variables of
//! its `src/settings/settings.go`, read as `slidegate serve`'s flags, and
//! its defaults when slidegate runs under the name `ratelimit`.
//!
//! [`read`] turns the variables that are set into [`Ask`]s (a flag and its
//! values) and [`Contract::notes`] (a variable accepted that means nothing
//! here, said once at start). The caller adds an ask to the command line
//! only where slidegate's own flag or `SLIDEGATE_*` variable was not given;
//! where it was and says something else, that is an error naming both.
//! A setting slidegate cannot honour and that would change what is limited
//! or who may connect is an error, never a silent default.

use anyhow::{Context as _, bail, ensure};
use std::collections::BTreeMap;
use std::time::Duration;

/// How the process was started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// `slidegate serve`: envoyproxy/ratelimit's variables that are set
    /// are honoured, and slidegate's defaults stand for the rest.
    Slidegate,
    /// Started as `ratelimit` (an image's `/bin/ratelimit`): its variables
    /// and its defaults (every interface, ports 8080 and 8081, the config
    /// under `/srv/runtime_data/current/config`, statsd to
    /// `localhost:8125`, ...), as envoyproxy/ratelimit's binary has them.
    Ratelimit,
}

/// A flag the environment asks for.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Ask {
    /// The flag's id (its field in `serve::Args`).
    pub id: &'static str,
    /// The flag, as typed (`--grpc`).
    pub flag: &'static str,
    /// Its values, the flag repeated for each; none for a switch.
    pub values: Vec<String>,
    /// The variables it comes from (`GRPC_PORT=9000`); empty for a
    /// default of [`Mode::Ratelimit`], which never conflicts.
    pub from: Vec<String>,
}

/// What envoyproxy/ratelimit's environment asks of `serve`.
#[derive(Debug, Default)]
pub(crate) struct Contract {
    pub asks: Vec<Ask>,
    /// One line per variable accepted that changes nothing here.
    pub notes: Vec<String>,
}

/// The environment: the variables set to something (an empty one is unset,
/// as a Kubernetes `env` entry with an empty value means).
pub(crate) struct Env(BTreeMap<String, String>);

impl Env {
    pub(crate) fn from_process() -> Env {
        Env::from_pairs(std::env::vars_os().filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?))))
    }

    pub(crate) fn from_pairs(pairs: impl IntoIterator<Item = (String, String)>) -> Env {
        Env(pairs.into_iter().filter(|(_, v)| !v.is_empty()).collect())
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }

    fn set(&self, name: &str) -> Option<String> {
        self.get(name).map(|v| format!("{name}={v}"))
    }

    /// A boolean as Go's `strconv.ParseBool` reads it.
    fn bool(&self, name: &str) -> anyhow::Result<Option<bool>> {
        self.get(name)
            .map(|v| match v {
                "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
                "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
                _ => bail!("{name}={v}: expected true or false"),
            })
            .transpose()
    }

    fn int(&self, name: &str) -> anyhow::Result<Option<u64>> {
        self.get(name)
            .map(|v| {
                v.trim()
                    .parse::<u64>()
                    .with_context(|| format!("{name}={v}: expected a whole number"))
            })
            .transpose()
    }

    fn duration(&self, name: &str) -> anyhow::Result<Option<Duration>> {
        self.get(name)
            .map(|v| go_duration(v).with_context(|| format!("{name}={v}")))
            .transpose()
    }
}

/// A duration as Go's `time.ParseDuration` reads it: `300ms`, `1h30m`,
/// `1.5s`, `0`.
fn go_duration(text: &str) -> anyhow::Result<Duration> {
    const HINT: &str = "expected a Go duration such as 10s, 1h30m or 500ms";
    let mut rest = text.trim();
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    ensure!(!rest.is_empty() && !rest.starts_with('-'), "{HINT}");
    rest = rest.strip_prefix('+').unwrap_or(rest);
    let mut total = 0f64;
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, after) = rest.split_at(number_end);
        let number: f64 = number.parse().map_err(|_| anyhow::anyhow!("{HINT}"))?;
        let unit_end = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_end);
        let seconds = match unit {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            "" => bail!("missing unit: {HINT}"),
            other => bail!("unknown unit `{other}`: {HINT}"),
        };
        total += number * seconds;
        rest = after;
    }
    Duration::try_from_secs_f64(total).map_err(|_| anyhow::anyhow!("too long: {HINT}"))
}

/// slidegate's spelling of `d` (a whole number of nanoseconds and a unit).
fn ours(d: Duration) -> String {
    slidegate_core::duration::format_duration(d)
}

/// `host:port` as a socket address's text (IPv6 in brackets).
fn address(host: &str, port: u64) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

impl Ask {
    /// The ask as a command line's words.
    pub(crate) fn args(&self) -> Vec<String> {
        if self.values.is_empty() {
            return vec![self.flag.to_owned()];
        }
        self.values
            .iter()
            .flat_map(|v| [self.flag.to_owned(), v.clone()])
            .collect()
    }
}

impl Contract {
    fn ask(&mut self, id: &'static str, flag: &'static str, values: &[&str], from: Vec<String>) {
        self.asks.push(Ask {
            id,
            flag,
            values: values.iter().map(|v| (*v).to_owned()).collect(),
            from,
        });
    }

    fn note(&mut self, env: &Env, name: &str, what: &str) {
        if let Some(set) = env.set(name) {
            self.notes.push(format!("{set}: {what}"));
        }
    }
}

/// The variables of `names` that are set, as `NAME=value`.
fn from(env: &Env, names: &[&str]) -> Vec<String> {
    names.iter().filter_map(|n| env.set(n)).collect()
}

/// Reads envoyproxy/ratelimit's variables in `env`.
///
/// # Errors
///
/// A value that does not parse, or a setting slidegate cannot honour
/// (memcache, Redis Sentinel over TLS, OTLP over HTTP), named with its
/// variable.
pub(crate) fn read(env: &Env, mode: Mode) -> anyhow::Result<Contract> {
    let mut c = Contract::default();
    let theirs = mode == Mode::Ratelimit;
    listeners(env, theirs, &mut c)?;
    grpc_tls(env, &mut c)?;
    config_source(env, theirs, &mut c)?;
    redis(env, &mut c)?;
    stats(env, theirs, &mut c)?;
    logs_and_traces(env, &mut c)?;
    limits(env, theirs, &mut c)?;
    Ok(c)
}

fn listeners(env: &Env, theirs: bool, c: &mut Contract) -> anyhow::Result<()> {
    let (host, port) = (env.get("HOST"), env.int("PORT")?);
    if theirs || host.is_some() || port.is_some() {
        let http = address(host.unwrap_or("0.0.0.0"), port.unwrap_or(8080));
        c.ask("http", "--http", &[&http], from(env, &["HOST", "PORT"]));
    }
    if let Some(path) = env.get("GRPC_UDS") {
        c.ask("grpc", "--grpc", &[&format!("unix:{path}")], from(env, &["GRPC_UDS"]));
    } else {
        let (host, port) = (env.get("GRPC_HOST"), env.int("GRPC_PORT")?);
        if theirs || host.is_some() || port.is_some() {
            let grpc = address(host.unwrap_or("0.0.0.0"), port.unwrap_or(8081));
            c.ask("grpc", "--grpc", &[&grpc], from(env, &["GRPC_HOST", "GRPC_PORT"]));
        }
    }
    for name in ["DEBUG_HOST", "DEBUG_PORT"] {
        c.note(
            env,
            name,
            "no debug listener: the config in force is `slidegate check --explain`'s business, and the stats are on \
             the HTTP listener's /metrics",
        );
    }
    let age = env.duration("GRPC_MAX_CONNECTION_AGE")?;
    if let Some(age) = age.or(theirs.then_some(Duration::from_secs(24 * 3600))) {
        ensure!(!age.is_zero(), "GRPC_MAX_CONNECTION_AGE=0: must be longer than zero");
        c.ask(
            "max_connection_age",
            "--max-connection-age",
            &[&ours(age)],
            from(env, &["GRPC_MAX_CONNECTION_AGE"]),
        );
    }
    c.note(
        env,
        "GRPC_MAX_CONNECTION_AGE_GRACE",
        "a connection past its age is asked to close (GOAWAY) and its calls under way finish; none is cut short",
    );
    Ok(())
}

fn grpc_tls(env: &Env, c: &mut Contract) -> anyhow::Result<()> {
    if env.bool("GRPC_SERVER_USE_TLS")? != Some(true) {
        for name in [
            "GRPC_SERVER_TLS_CERT",
            "GRPC_SERVER_TLS_KEY",
            "GRPC_CLIENT_TLS_CACERT",
            "GRPC_SERVER_TLS_CA_CERT",
        ] {
            c.note(env, name, "ignored: GRPC_SERVER_USE_TLS is not true");
        }
        return Ok(());
    }
    let need = |name: &str| {
        env.get(name)
            .map(str::to_owned)
            .with_context(|| format!("GRPC_SERVER_USE_TLS=true needs {name}"))
    };
    let (cert, key) = (need("GRPC_SERVER_TLS_CERT")?, need("GRPC_SERVER_TLS_KEY")?);
    let names = ["GRPC_SERVER_USE_TLS", "GRPC_SERVER_TLS_CERT", "GRPC_SERVER_TLS_KEY"];
    c.ask("tls_cert", "--tls-cert", &[&cert], from(env, &names));
    c.ask("tls_key", "--tls-key", &[&key], from(env, &names));
    c.ask(
        "tls_grpc_only",
        "--tls-grpc-only",
        &[],
        from(env, &["GRPC_SERVER_USE_TLS"]),
    );
    // envoyproxy/ratelimit reads GRPC_CLIENT_TLS_CACERT; Envoy Gateway
    // writes GRPC_SERVER_TLS_CA_CERT (which it ignores). Either asks for
    // client certificates signed by that CA.
    let ca = match (env.get("GRPC_CLIENT_TLS_CACERT"), env.get("GRPC_SERVER_TLS_CA_CERT")) {
        (Some(a), Some(b)) if a != b => bail!(
            "GRPC_CLIENT_TLS_CACERT={a} and GRPC_SERVER_TLS_CA_CERT={b}: two client CAs; set one (they mean the same \
             here)"
        ),
        (a, b) => a.or(b),
    };
    if let Some(ca) = ca {
        let names = ["GRPC_CLIENT_TLS_CACERT", "GRPC_SERVER_TLS_CA_CERT"];
        c.ask("tls_client_ca", "--tls-client-ca", &[ca], from(env, &names));
    }
    if let Some(san) = env.get("GRPC_CLIENT_TLS_SAN") {
        ensure!(
            ca.is_some(),
            "GRPC_CLIENT_TLS_SAN={san} needs GRPC_CLIENT_TLS_CACERT: a client certificate's names are checked once its \
             CA is"
        );
        c.ask(
            "tls_client_san",
            "--tls-client-san",
            &[san],
            from(env, &["GRPC_CLIENT_TLS_SAN"]),
        );
    }
    Ok(())
}

fn config_source(env: &Env, theirs: bool, c: &mut Contract) -> anyhow::Result<()> {
    let kind = env.get("CONFIG_TYPE").unwrap_or("FILE");
    let runtime = ["RUNTIME_ROOT", "RUNTIME_SUBDIRECTORY", "RUNTIME_APPDIRECTORY"];
    match kind {
        "FILE" => {
            if theirs || runtime.iter().any(|n| env.get(n).is_some()) {
                let mut path = std::path::PathBuf::from(env.get("RUNTIME_ROOT").unwrap_or("/srv/runtime_data/current"));
                path.push(env.get("RUNTIME_SUBDIRECTORY").unwrap_or(""));
                path.push(env.get("RUNTIME_APPDIRECTORY").unwrap_or("config"));
                let path = path.display().to_string();
                c.ask(
                    "config",
                    "--config",
                    &[&path],
                    from(env, &[&["CONFIG_TYPE"], &runtime[..]].concat()),
                );
            }
            c.note(
                env,
                "FORCE_START_WITHOUT_INITIAL_CONFIG",
                "only the xDS source (CONFIG_TYPE=GRPC_XDS_SOTW) waits for a first config",
            );
            xds_unused(env, c);
        }
        "GRPC_XDS_SOTW" => {
            xds(env, c)?;
            for name in runtime {
                c.note(
                    env,
                    name,
                    "no config files with CONFIG_TYPE=GRPC_XDS_SOTW: the config comes over xDS",
                );
            }
        }
        other => bail!("CONFIG_TYPE={other}: expected FILE or GRPC_XDS_SOTW"),
    }
    c.note(
        env,
        "RUNTIME_WATCH_ROOT",
        "the config folder is looked at every --reload-every (1s), a symlink swap of the root included",
    );
    if env.bool("RUNTIME_IGNOREDOTFILES")? == Some(false) {
        c.note(
            env,
            "RUNTIME_IGNOREDOTFILES",
            "files whose name starts with a dot are always skipped, and only *.yaml and *.yml files are read",
        );
    }
    Ok(())
}

/// The xDS variables, said to mean nothing when the config is from files.
fn xds_unused(env: &Env, c: &mut Contract) {
    for (name, _) in env
        .0
        .iter()
        .filter(|(k, _)| k.starts_with("CONFIG_GRPC_XDS_") || k.starts_with("XDS_CLIENT_"))
    {
        c.notes.push(format!(
            "{}: ignored: CONFIG_TYPE is FILE, not GRPC_XDS_SOTW",
            env.set(name).unwrap_or_default()
        ));
    }
}

fn xds(env: &Env, c: &mut Contract) -> anyhow::Result<()> {
    let url = env.get("CONFIG_GRPC_XDS_SERVER_URL").unwrap_or("localhost:18000");
    c.ask(
        "xds",
        "--xds",
        &[url],
        from(env, &["CONFIG_TYPE", "CONFIG_GRPC_XDS_SERVER_URL"]),
    );
    let node = env.get("CONFIG_GRPC_XDS_NODE_ID").unwrap_or("default");
    c.ask(
        "xds_node_id",
        "--xds-node-id",
        &[node],
        from(env, &["CONFIG_GRPC_XDS_NODE_ID"]),
    );
    if let Some(metadata) = env.get("CONFIG_GRPC_XDS_NODE_METADATA") {
        c.ask(
            "xds_node_metadata",
            "--xds-node-metadata",
            &[metadata],
            from(env, &["CONFIG_GRPC_XDS_NODE_METADATA"]),
        );
    }
    if let Some(headers) = env.get("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS") {
        c.ask(
            "xds_header",
            "--xds-header",
            &[headers],
            from(env, &["CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS"]),
        );
    }
    if env.bool("CONFIG_GRPC_XDS_SERVER_USE_TLS")? == Some(true) {
        c.ask(
            "xds_tls",
            "--xds-tls",
            &[],
            from(env, &["CONFIG_GRPC_XDS_SERVER_USE_TLS"]),
        );
        for (name, id, flag) in [
            ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "xds_tls_cert", "--xds-tls-cert"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "xds_tls_key", "--xds-tls-key"),
            ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "xds_tls_ca", "--xds-tls-ca"),
            (
                "CONFIG_GRPC_XDS_SERVER_TLS_SAN",
                "xds_tls_server_name",
                "--xds-tls-server-name",
            ),
        ] {
            if let Some(value) = env.get(name) {
                c.ask(id, flag, &[value], from(env, &[name]));
            }
        }
    } else {
        for name in [
            "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
            "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
            "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
            "CONFIG_GRPC_XDS_SERVER_TLS_SAN",
        ] {
            c.note(env, name, "ignored: CONFIG_GRPC_XDS_SERVER_USE_TLS is not true");
        }
    }
    for (name, id, flag) in [
        (
            "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL",
            "xds_backoff_initial",
            "--xds-backoff-initial",
        ),
        (
            "XDS_CLIENT_BACKOFF_MAX_INTERVAL",
            "xds_backoff_max",
            "--xds-backoff-max",
        ),
    ] {
        if let Some(d) = env.duration(name)? {
            c.ask(id, flag, &[&ours(d)], from(env, &[name]));
        }
    }
    if let Some(factor) = env.get("XDS_CLIENT_BACKOFF_RANDOM_FACTOR") {
        c.ask(
            "xds_backoff_random_factor",
            "--xds-backoff-random-factor",
            &[factor],
            from(env, &["XDS_CLIENT_BACKOFF_RANDOM_FACTOR"]),
        );
    }
    if env.bool("XDS_CLIENT_BACKOFF_JITTER")? == Some(false) {
        c.ask(
            "xds_no_backoff_jitter",
            "--xds-no-backoff-jitter",
            &[],
            from(env, &["XDS_CLIENT_BACKOFF_JITTER"]),
        );
    }
    if let Some(bytes) = env.int("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES")? {
        c.ask(
            "xds_max_message_bytes",
            "--xds-max-message-bytes",
            &[&bytes.to_string()],
            from(env, &["XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES"]),
        );
    }
    if env.bool("FORCE_START_WITHOUT_INITIAL_CONFIG")? == Some(true) {
        c.ask(
            "xds_force_start",
            "--xds-force-start",
            &[],
            from(env, &["FORCE_START_WITHOUT_INITIAL_CONFIG"]),
        );
    }
    c.note(
        env,
        "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
        "reconnects follow the XDS_CLIENT_BACKOFF_* settings",
    );
    Ok(())
}

/// `REDIS_TLS_*`, with `REDIS_TLS=true` (`tls`; its `rediss://` URLs are
/// the caller's).
fn redis_tls(env: &Env, tls: bool, c: &mut Contract) -> anyhow::Result<()> {
    let files = [
        ("REDIS_TLS_CACERT", "redis_tls_ca", "--redis-tls-ca"),
        ("REDIS_TLS_CLIENT_CERT", "redis_tls_cert", "--redis-tls-cert"),
        ("REDIS_TLS_CLIENT_KEY", "redis_tls_key", "--redis-tls-key"),
    ];
    if !tls {
        for (name, _, _) in files {
            c.note(env, name, "ignored: REDIS_TLS is not true");
        }
        c.note(
            env,
            "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
            "ignored: REDIS_TLS is not true",
        );
        return Ok(());
    }
    match (env.get("REDIS_TLS_CLIENT_CERT"), env.get("REDIS_TLS_CLIENT_KEY")) {
        (Some(_), None) => bail!("REDIS_TLS_CLIENT_CERT needs REDIS_TLS_CLIENT_KEY (the certificate's private key)"),
        (None, Some(_)) => bail!("REDIS_TLS_CLIENT_KEY needs REDIS_TLS_CLIENT_CERT (the certificate of the key)"),
        _ => {}
    }
    for (name, id, flag) in files {
        if let Some(path) = env.get(name) {
            c.ask(id, flag, &[path], from(env, &[name]));
        }
    }
    if env.bool("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION")? == Some(true) {
        c.ask(
            "redis_tls_skip_hostname_check",
            "--redis-tls-skip-hostname-check",
            &[],
            from(env, &["REDIS_TLS_SKIP_HOSTNAME_VERIFICATION"]),
        );
    }
    Ok(())
}

fn redis(env: &Env, c: &mut Contract) -> anyhow::Result<()> {
    match env.get("BACKEND_TYPE").unwrap_or("redis") {
        "redis" => {}
        other => bail!("BACKEND_TYPE={other}: slidegate counts in memory or in Redis (BACKEND_TYPE=redis)"),
    }
    if let Some((name, _)) = env.0.iter().find(|(k, _)| k.starts_with("MEMCACHE_")) {
        bail!(
            "{}: slidegate does not count in memcached; unset the MEMCACHE_* variables",
            env.set(name).unwrap_or_default()
        );
    }
    let tls = env.bool("REDIS_TLS")? == Some(true);
    if env.bool("REDIS_PERSECOND")? == Some(true) {
        bail!(
            "REDIS_PERSECOND=true: slidegate counts every limit in one Redis (REDIS_URL); unset REDIS_PERSECOND and \
             the REDIS_PERSECOND_* variables"
        );
    }
    let Some(url) = env.get("REDIS_URL") else {
        for name in [
            "REDIS_SOCKET_TYPE",
            "REDIS_TYPE",
            "REDIS_AUTH",
            "REDIS_SENTINEL_AUTH",
            "REDIS_TLS",
            "REDIS_TLS_CACERT",
            "REDIS_TLS_CLIENT_CERT",
            "REDIS_TLS_CLIENT_KEY",
            "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
        ] {
            c.note(env, name, "ignored without REDIS_URL: the counters are in memory");
        }
        return Ok(());
    };
    let socket = env.get("REDIS_SOCKET_TYPE").unwrap_or("unix");
    let auth = env.get("REDIS_AUTH");
    let names = [
        "REDIS_URL",
        "REDIS_SOCKET_TYPE",
        "REDIS_TYPE",
        "REDIS_AUTH",
        "REDIS_TLS",
    ];
    let scheme = if tls { "rediss" } else { "redis" };
    let redis_url = |address: &str| -> anyhow::Result<String> {
        let userinfo = auth.map(|a| match a.split_once(':') {
            Some((user, password)) => format!("{}:{}@", encode(user), encode(password)),
            None => format!(":{}@", encode(a)),
        });
        Ok(match socket {
            "tcp" => {
                ensure!(
                    !address.contains("://"),
                    "REDIS_URL={url}: envoyproxy/ratelimit takes host:port, without a scheme"
                );
                format!("{scheme}://{}{address}", userinfo.unwrap_or_default())
            }
            "unix" => match (auth, tls) {
                (Some(_), _) => bail!("REDIS_AUTH with REDIS_SOCKET_TYPE=unix: give the password over TCP"),
                (None, true) => bail!("REDIS_TLS=true with REDIS_SOCKET_TYPE=unix: TLS to Redis is over TCP"),
                (None, false) => format!("unix://{address}"),
            },
            other => bail!("REDIS_SOCKET_TYPE={other}: expected tcp or unix"),
        })
    };
    let topology = env.get("REDIS_TYPE").unwrap_or("SINGLE");
    match topology.to_ascii_uppercase().as_str() {
        "SINGLE" => c.ask("redis", "--redis", &[&redis_url(url)?], from(env, &names)),
        "CLUSTER" => {
            let mut values = Vec::new();
            for node in url.split(',').map(str::trim).filter(|n| !n.is_empty()) {
                values.push(redis_url(node)?);
            }
            c.asks.push(Ask {
                id: "redis",
                flag: "--redis",
                values,
                from: from(env, &names),
            });
            c.ask("redis_cluster", "--redis-cluster", &[], from(env, &["REDIS_TYPE"]));
        }
        "SENTINEL" => {
            let mut parts = url.split(',').map(str::trim);
            let master = parts.next().unwrap_or_default();
            let sentinels: Vec<&str> = parts.filter(|p| !p.is_empty()).collect();
            ensure!(
                !master.is_empty() && !sentinels.is_empty(),
                "REDIS_URL={url}: with REDIS_TYPE=sentinel, expected the master's name then the Sentinels, as \
                 mymaster,host1:26379,host2:26379"
            );
            ensure!(
                env.get("REDIS_SENTINEL_AUTH").is_none(),
                "REDIS_SENTINEL_AUTH: slidegate does not authenticate to the Sentinels yet; unset it"
            );
            ensure!(
                !tls,
                "REDIS_TLS=true with REDIS_TYPE=sentinel: slidegate does not reach Sentinel over TLS yet"
            );
            c.asks.push(Ask {
                id: "redis",
                flag: "--redis",
                values: sentinels.iter().map(|s| format!("redis://{s}")).collect(),
                from: from(env, &names),
            });
            c.ask(
                "redis_sentinel_master",
                "--redis-sentinel-master",
                &[master],
                from(env, &["REDIS_TYPE", "REDIS_URL"]),
            );
            ensure!(
                auth.is_none(),
                "REDIS_AUTH with REDIS_TYPE=sentinel: slidegate does not pass a password to a master found through \
                 Sentinel yet; unset it"
            );
        }
        _ => bail!("REDIS_TYPE={topology}: expected single, sentinel or cluster"),
    }
    redis_tls(env, tls, c)?;
    if let Some(prefix) = env.get("CACHE_KEY_PREFIX") {
        c.ask(
            "redis_prefix",
            "--redis-prefix",
            &[prefix],
            from(env, &["CACHE_KEY_PREFIX"]),
        );
    }
    if env.bool("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION")? == Some(true) {
        c.ask(
            "ready_requires_redis",
            "--ready-requires-redis",
            &[],
            from(env, &["REDIS_HEALTH_CHECK_ACTIVE_CONNECTION"]),
        );
    }
    for name in [
        "REDIS_POOL_SIZE",
        "REDIS_POOL_ON_EMPTY_BEHAVIOR",
        "REDIS_PIPELINE_WINDOW",
        "REDIS_PIPELINE_LIMIT",
        "REDIS_CLUSTER_PIPELINE_PARALLELISM",
    ] {
        c.note(
            env,
            name,
            "no pool to size: one multiplexed connection per Redis node, and decisions waiting on a script call in \
             flight are batched (--redis-batching)",
        );
    }
    c.note(
        env,
        "REDIS_TIMEOUT",
        "each call to Redis waits at most --redis-timeout (50ms), then --redis-failure decides",
    );
    for name in [
        "REDIS_STARTUP_INITIAL_INTERVAL",
        "REDIS_STARTUP_MAX_INTERVAL",
        "REDIS_STARTUP_MAX_ELAPSED_TIME",
    ] {
        c.note(env, name, "Redis must answer at start, or serve exits with the reason");
    }
    c.note(
        env,
        "EXPIRATION_JITTER_MAX_SECONDS",
        "a counter's key expires when its window ends, without jitter",
    );
    c.note(
        env,
        "LOCAL_CACHE_SIZE_IN_BYTES",
        "no cache of over-limit keys; see --redis-sync-interval for deciding locally",
    );
    Ok(())
}

/// Percent-encodes what a URL's user info cannot hold as is.
fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn stats(env: &Env, theirs: bool, c: &mut Contract) -> anyhow::Result<()> {
    let disabled = env.bool("DISABLE_STATS")? == Some(true);
    let statsd = env.bool("USE_STATSD")?.unwrap_or(theirs) && !disabled;
    if statsd {
        let host = env.get("STATSD_HOST").unwrap_or("localhost");
        let port = env.int("STATSD_PORT")?.unwrap_or(8125);
        c.ask(
            "statsd",
            "--statsd",
            &[&address(host, port)],
            from(env, &["USE_STATSD", "STATSD_HOST", "STATSD_PORT"]),
        );
        if let Some(d) = env.duration("STATS_FLUSH_INTERVAL")? {
            c.ask(
                "statsd_flush_interval",
                "--statsd-flush-interval",
                &[&ours(d)],
                from(env, &["STATS_FLUSH_INTERVAL"]),
            );
        }
        if let Some(tags) = env.get("EXTRA_TAGS") {
            c.ask("statsd_tags", "--statsd-tags", &[tags], from(env, &["EXTRA_TAGS"]));
        }
        if env.bool("USE_DOG_STATSD")? == Some(true) {
            c.ask("dogstatsd", "--dogstatsd", &[], from(env, &["USE_DOG_STATSD"]));
        }
        c.note(
            env,
            "USE_DOG_STATSD_MOGRIFIERS",
            "the stat names are sent as envoyproxy/ratelimit names them, unchanged",
        );
    } else {
        for name in [
            "STATSD_HOST",
            "STATSD_PORT",
            "STATS_FLUSH_INTERVAL",
            "EXTRA_TAGS",
            "USE_DOG_STATSD",
        ] {
            c.note(env, name, "ignored: statsd is off (USE_STATSD, DISABLE_STATS)");
        }
    }
    if env.bool("USE_PROMETHEUS")? == Some(true) && !disabled {
        let addr = env.get("PROMETHEUS_ADDR").unwrap_or(":9090");
        // Go's `:9090` is every interface.
        let addr = match addr.strip_prefix(':') {
            Some(port) => format!("0.0.0.0:{port}"),
            None => addr.to_owned(),
        };
        c.ask(
            "metrics_listen",
            "--metrics-listen",
            &[&addr],
            from(env, &["USE_PROMETHEUS", "PROMETHEUS_ADDR"]),
        );
        if let Some(path) = env.get("PROMETHEUS_PATH") {
            c.ask(
                "metrics_path",
                "--metrics-path",
                &[path],
                from(env, &["PROMETHEUS_PATH"]),
            );
        }
        c.note(
            env,
            "PROMETHEUS_MAPPER_YAML",
            "not read: the ratelimit_service_* series are served as Envoy Gateway's default mapping names them",
        );
        c.note(
            env,
            "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS",
            "response times are in seconds (slidegate_request_duration_seconds)",
        );
    }
    Ok(())
}

fn logs_and_traces(env: &Env, c: &mut Contract) -> anyhow::Result<()> {
    if let Some(level) = env.get("LOG_LEVEL") {
        // logrus's names; fatal and panic are error here.
        let ours = match level.to_ascii_lowercase().as_str() {
            "trace" => "trace",
            "debug" => "debug",
            "info" => "info",
            "warn" | "warning" => "warn",
            "error" | "fatal" | "panic" => "error",
            _ => bail!("LOG_LEVEL={level}: expected trace, debug, info, warn, error, fatal or panic"),
        };
        c.ask("log_level", "--log-level", &[ours], from(env, &["LOG_LEVEL"]));
    }
    if let Some(format) = env.get("LOG_FORMAT") {
        let ours = match format {
            "text" => "text",
            "json" => "json",
            _ => bail!("LOG_FORMAT={format}: expected text or json"),
        };
        c.ask("log_format", "--log-format", &[ours], from(env, &["LOG_FORMAT"]));
    }
    if env.bool("TRACING_ENABLED")? == Some(true) {
        let protocol = env.get("TRACING_EXPORTER_PROTOCOL").unwrap_or("http");
        ensure!(
            protocol == "grpc",
            "TRACING_ENABLED=true with TRACING_EXPORTER_PROTOCOL={protocol}: slidegate exports OTLP over gRPC only; \
             set TRACING_EXPORTER_PROTOCOL=grpc and OTEL_EXPORTER_OTLP_ENDPOINT"
        );
        ensure!(
            env.get("OTEL_EXPORTER_OTLP_ENDPOINT").is_some(),
            "TRACING_ENABLED=true needs OTEL_EXPORTER_OTLP_ENDPOINT (the collector's OTLP/gRPC address)"
        );
        if let Some(name) = env.get("TRACING_SERVICE_NAME") {
            c.ask(
                "otel_service_name",
                "--otel-service-name",
                &[name],
                from(env, &["TRACING_SERVICE_NAME"]),
            );
        }
        for name in [
            "TRACING_SERVICE_NAMESPACE",
            "TRACING_SERVICE_INSTANCE_ID",
            "TRACING_SAMPLING_RATE",
        ] {
            c.note(
                env,
                name,
                "not read: every decision is exported, under the service name alone",
            );
        }
    }
    Ok(())
}

fn limits(env: &Env, theirs: bool, c: &mut Contract) -> anyhow::Result<()> {
    // STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT is read by its flag; only
    // its default differs (off in envoyproxy/ratelimit, on in slidegate).
    if theirs && env.get("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT").is_none() {
        c.ask(
            "no_stop_cache_key_increment_when_overlimit",
            "--no-stop-cache-key-increment-when-overlimit",
            &[],
            Vec::new(),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Env {
        Env::from_pairs(pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())))
    }

    /// The asks as one command line, in order.
    fn line(c: &Contract) -> Vec<String> {
        c.asks.iter().flat_map(Ask::args).collect()
    }

    fn asked<'a>(c: &'a Contract, id: &str) -> Option<&'a [String]> {
        c.asks.iter().find(|a| a.id == id).map(|a| &a.values[..])
    }

    #[test]
    fn go_durations_read_as_go_reads_them() {
        for (text, want) in [
            ("10s", Duration::from_secs(10)),
            ("1h30m", Duration::from_secs(5400)),
            ("1.5s", Duration::from_millis(1500)),
            ("300ms", Duration::from_millis(300)),
            ("2us", Duration::from_micros(2)),
            ("0", Duration::ZERO),
            ("24h", Duration::from_secs(86_400)),
        ] {
            assert_eq!(go_duration(text).unwrap(), want, "{text}");
        }
        for bad in ["", "10", "-1s", "1d", "s", "1x"] {
            assert!(go_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn nothing_set_asks_nothing_of_slidegate() {
        let c = read(&env(&[]), Mode::Slidegate).unwrap();
        assert!(c.asks.is_empty(), "{:?}", c.asks);
        assert!(c.notes.is_empty(), "{:?}", c.notes);
    }

    /// Under the name `ratelimit`, with nothing set, the process is
    /// envoyproxy/ratelimit's defaults.
    #[test]
    fn the_ratelimit_name_takes_envoyproxy_ratelimits_defaults() {
        let c = read(&env(&[]), Mode::Ratelimit).unwrap();
        assert_eq!(
            line(&c),
            [
                "--http",
                "0.0.0.0:8080",
                "--grpc",
                "0.0.0.0:8081",
                "--max-connection-age",
                "1d",
                "--config",
                "/srv/runtime_data/current/config",
                "--statsd",
                "localhost:8125",
                "--no-stop-cache-key-increment-when-overlimit",
            ]
        );
        // A default never conflicts with a flag given.
        assert!(c.asks.iter().all(|a| a.from.is_empty()));
    }

    /// The environment of Envoy Gateway's rendered Deployment.
    #[test]
    fn envoy_gateways_environment_reads_as_these_flags() {
        let c = read(
            &env(&[
                ("RUNTIME_ROOT", "/data"),
                ("RUNTIME_SUBDIRECTORY", "ratelimit"),
                ("RUNTIME_IGNOREDOTFILES", "true"),
                ("RUNTIME_WATCH_ROOT", "false"),
                ("LOG_LEVEL", "info"),
                ("USE_STATSD", "false"),
                ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
                ("CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway:18001"),
                ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
                ("GRPC_SERVER_USE_TLS", "true"),
                ("GRPC_SERVER_TLS_CERT", "/certs/tls.crt"),
                ("GRPC_SERVER_TLS_KEY", "/certs/tls.key"),
                ("GRPC_SERVER_TLS_CA_CERT", "/certs/ca.crt"),
                ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
                ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/certs/tls.crt"),
                ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "/certs/tls.key"),
                ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/certs/ca.crt"),
                ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
                ("REDIS_SOCKET_TYPE", "tcp"),
                ("REDIS_URL", "redis.redis.svc:6379"),
                ("USE_PROMETHEUS", "true"),
                ("PROMETHEUS_ADDR", ":19001"),
                ("PROMETHEUS_MAPPER_YAML", "/etc/statsd-exporter/conf.yaml"),
            ]),
            Mode::Ratelimit,
        )
        .unwrap();
        assert_eq!(asked(&c, "http").unwrap(), ["0.0.0.0:8080"]);
        assert_eq!(asked(&c, "grpc").unwrap(), ["0.0.0.0:8081"]);
        assert_eq!(asked(&c, "tls_cert").unwrap(), ["/certs/tls.crt"]);
        assert_eq!(asked(&c, "tls_key").unwrap(), ["/certs/tls.key"]);
        assert_eq!(asked(&c, "tls_client_ca").unwrap(), ["/certs/ca.crt"]);
        assert!(asked(&c, "tls_grpc_only").is_some());
        assert_eq!(asked(&c, "xds").unwrap(), ["envoy-gateway:18001"]);
        assert_eq!(asked(&c, "xds_node_id").unwrap(), ["envoy-ratelimit"]);
        assert_eq!(asked(&c, "xds_tls_cert").unwrap(), ["/certs/tls.crt"]);
        assert_eq!(asked(&c, "xds_tls_ca").unwrap(), ["/certs/ca.crt"]);
        assert!(asked(&c, "xds_force_start").is_some());
        assert_eq!(asked(&c, "redis").unwrap(), ["redis://redis.redis.svc:6379"]);
        assert_eq!(asked(&c, "metrics_listen").unwrap(), ["0.0.0.0:19001"]);
        assert_eq!(asked(&c, "log_level").unwrap(), ["info"]);
        assert!(asked(&c, "config").is_none(), "no files with xDS");
        assert!(asked(&c, "statsd").is_none(), "USE_STATSD=false");
        let notes = c.notes.join("\n");
        for said in [
            "RUNTIME_ROOT=/data",
            "RUNTIME_WATCH_ROOT=false",
            "PROMETHEUS_MAPPER_YAML=",
        ] {
            assert!(notes.contains(said), "{said} in {notes}");
        }
        // Each asks under the variables it comes from.
        let from = &c.asks.iter().find(|a| a.id == "redis").unwrap().from;
        assert_eq!(from, &["REDIS_URL=redis.redis.svc:6379", "REDIS_SOCKET_TYPE=tcp"]);
    }

    /// Envoy Gateway's Deployment for a Redis with TLS (its
    /// `testdata/deployments/redis-tls-settings.yaml`): `rediss://` with
    /// the password, its client certificate and key, the system's roots.
    #[test]
    fn envoy_gateways_redis_tls_settings_read_as_these_flags() {
        let c = read(
            &env(&[
                ("REDIS_SOCKET_TYPE", "tcp"),
                ("REDIS_URL", "redis.redis.svc:6379"),
                ("REDIS_TLS", "true"),
                ("REDIS_TLS_CLIENT_CERT", "/redis-certs/tls.crt"),
                ("REDIS_TLS_CLIENT_KEY", "/redis-certs/tls.key"),
                ("REDIS_AUTH", "redis_auth_password"),
            ]),
            Mode::Slidegate,
        )
        .unwrap();
        assert_eq!(
            line(&c),
            [
                "--redis",
                "rediss://:redis_auth_password@redis.redis.svc:6379",
                "--redis-tls-cert",
                "/redis-certs/tls.crt",
                "--redis-tls-key",
                "/redis-certs/tls.key",
            ]
        );
        let from = &c.asks.iter().find(|a| a.id == "redis").unwrap().from;
        assert_eq!(
            from,
            &[
                "REDIS_URL=redis.redis.svc:6379",
                "REDIS_SOCKET_TYPE=tcp",
                "REDIS_AUTH=redis_auth_password",
                "REDIS_TLS=true"
            ]
        );
        assert!(c.notes.is_empty(), "{:?}", c.notes);
    }

    /// Every `REDIS_TLS_*` variable, on every URL of a cluster; without
    /// `REDIS_TLS=true` they are said to be ignored.
    #[test]
    fn the_redis_tls_variables_read_as_these_flags() {
        let tls = [
            ("REDIS_TLS_CACERT", "/ca.pem"),
            ("REDIS_TLS_CLIENT_CERT", "/c.pem"),
            ("REDIS_TLS_CLIENT_KEY", "/k.pem"),
            ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "true"),
        ];
        let cluster = [
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_TYPE", "cluster"),
            ("REDIS_URL", "a:1,b:2"),
        ];
        let on = [&cluster[..], &tls, &[("REDIS_TLS", "true")]].concat();
        let c = read(&env(&on), Mode::Slidegate).unwrap();
        assert_eq!(
            line(&c),
            [
                "--redis",
                "rediss://a:1",
                "--redis",
                "rediss://b:2",
                "--redis-cluster",
                "--redis-tls-ca",
                "/ca.pem",
                "--redis-tls-cert",
                "/c.pem",
                "--redis-tls-key",
                "/k.pem",
                "--redis-tls-skip-hostname-check",
            ]
        );
        let from = &c.asks.iter().find(|a| a.id == "redis_tls_ca").unwrap().from;
        assert_eq!(from, &["REDIS_TLS_CACERT=/ca.pem"]);
        assert!(c.notes.is_empty(), "{:?}", c.notes);

        let off = [&cluster[..], &tls, &[("REDIS_TLS", "false")]].concat();
        let c = read(&env(&off), Mode::Slidegate).unwrap();
        assert_eq!(
            line(&c),
            ["--redis", "redis://a:1", "--redis", "redis://b:2", "--redis-cluster"]
        );
        assert_eq!(c.notes.len(), 4, "{:?}", c.notes);
        assert!(
            c.notes
                .iter()
                .all(|n| n.starts_with("REDIS_TLS_") && n.ends_with(": ignored: REDIS_TLS is not true")),
            "{:?}",
            c.notes
        );
    }

    #[test]
    fn the_listeners_take_hosts_ports_and_sockets() {
        let c = read(&env(&[("PORT", "9000"), ("GRPC_UDS", "/run/rl.sock")]), Mode::Slidegate).unwrap();
        assert_eq!(line(&c), ["--http", "0.0.0.0:9000", "--grpc", "unix:/run/rl.sock"]);
        let c = read(&env(&[("GRPC_HOST", "::1"), ("GRPC_PORT", "9001")]), Mode::Slidegate).unwrap();
        assert_eq!(line(&c), ["--grpc", "[::1]:9001"]);
        let e = read(&env(&[("PORT", "http")]), Mode::Slidegate).unwrap_err();
        assert_eq!(e.to_string(), "PORT=http: expected a whole number");
    }

    #[test]
    fn the_redis_topologies_and_their_urls() {
        let redis = |pairs: &[(&str, &str)]| read(&env(pairs), Mode::Slidegate).map(|c| line(&c));
        assert_eq!(
            redis(&[
                ("REDIS_SOCKET_TYPE", "tcp"),
                ("REDIS_URL", "r:6379"),
                ("REDIS_AUTH", "u:p@ss")
            ])
            .unwrap(),
            ["--redis", "redis://u:p%40ss@r:6379"]
        );
        assert_eq!(
            redis(&[("REDIS_URL", "/var/run/redis.sock")]).unwrap(),
            ["--redis", "unix:///var/run/redis.sock"]
        );
        assert_eq!(
            redis(&[
                ("REDIS_SOCKET_TYPE", "tcp"),
                ("REDIS_TYPE", "cluster"),
                ("REDIS_URL", "a:1,b:2")
            ])
            .unwrap(),
            ["--redis", "redis://a:1", "--redis", "redis://b:2", "--redis-cluster"]
        );
        assert_eq!(
            redis(&[
                ("REDIS_SOCKET_TYPE", "tcp"),
                ("REDIS_TYPE", "SENTINEL"),
                ("REDIS_URL", "m,s1:26379,s2:26379")
            ])
            .unwrap(),
            [
                "--redis",
                "redis://s1:26379",
                "--redis",
                "redis://s2:26379",
                "--redis-sentinel-master",
                "m"
            ]
        );
        for (pairs, says) in [
            (
                &[("REDIS_SOCKET_TYPE", "tcp"), ("REDIS_URL", "redis://r:6379")][..],
                "REDIS_URL=redis://r:6379: envoyproxy/ratelimit takes host:port",
            ),
            (
                &[("REDIS_URL", "r:1"), ("REDIS_TYPE", "ring")],
                "REDIS_TYPE=ring: expected",
            ),
            (
                &[("REDIS_TLS", "true"), ("REDIS_URL", "/run/redis.sock")],
                "REDIS_TLS=true with REDIS_SOCKET_TYPE=unix: TLS to Redis is over TCP",
            ),
            (
                &[
                    ("REDIS_TLS", "true"),
                    ("REDIS_SOCKET_TYPE", "tcp"),
                    ("REDIS_TYPE", "sentinel"),
                    ("REDIS_URL", "m,s1:26379"),
                ],
                "REDIS_TLS=true with REDIS_TYPE=sentinel: slidegate does not reach Sentinel over TLS yet",
            ),
            (
                &[
                    ("REDIS_TLS", "true"),
                    ("REDIS_SOCKET_TYPE", "tcp"),
                    ("REDIS_URL", "r:1"),
                    ("REDIS_TLS_CLIENT_CERT", "/c.pem"),
                ],
                "REDIS_TLS_CLIENT_CERT needs REDIS_TLS_CLIENT_KEY",
            ),
            (
                &[("REDIS_TLS", "yes"), ("REDIS_SOCKET_TYPE", "tcp"), ("REDIS_URL", "r:1")],
                "REDIS_TLS=yes: expected true or false",
            ),
            (&[("BACKEND_TYPE", "memcache")], "BACKEND_TYPE=memcache:"),
            (&[("MEMCACHE_HOST_PORT", "m:11211")], "MEMCACHE_HOST_PORT=m:11211:"),
            (
                &[("REDIS_SOCKET_TYPE", "udp"), ("REDIS_URL", "r:1")],
                "REDIS_SOCKET_TYPE=udp",
            ),
            (
                &[
                    ("REDIS_SOCKET_TYPE", "tcp"),
                    ("REDIS_TYPE", "sentinel"),
                    ("REDIS_URL", "m"),
                ],
                "REDIS_URL=m: with REDIS_TYPE=sentinel, expected the master's name",
            ),
        ] {
            let e = redis(pairs).unwrap_err().to_string();
            assert!(e.starts_with(says), "{e}");
        }
        // Pool settings are accepted and said to mean nothing here.
        let c = read(
            &env(&[
                ("REDIS_SOCKET_TYPE", "tcp"),
                ("REDIS_URL", "r:1"),
                ("REDIS_POOL_SIZE", "20"),
            ]),
            Mode::Slidegate,
        )
        .unwrap();
        assert!(
            c.notes[0].starts_with("REDIS_POOL_SIZE=20: no pool to size"),
            "{:?}",
            c.notes
        );
    }

    #[test]
    fn settings_slidegate_cannot_honour_are_errors() {
        for (pairs, says) in [
            (
                &[("CONFIG_TYPE", "CONSUL")][..],
                "CONFIG_TYPE=CONSUL: expected FILE or GRPC_XDS_SOTW",
            ),
            (
                &[("GRPC_SERVER_USE_TLS", "true")],
                "GRPC_SERVER_USE_TLS=true needs GRPC_SERVER_TLS_CERT",
            ),
            (
                &[
                    ("GRPC_SERVER_USE_TLS", "true"),
                    ("GRPC_SERVER_TLS_CERT", "c"),
                    ("GRPC_SERVER_TLS_KEY", "k"),
                    ("GRPC_CLIENT_TLS_SAN", "envoy"),
                ],
                "GRPC_CLIENT_TLS_SAN=envoy needs GRPC_CLIENT_TLS_CACERT",
            ),
            (
                &[("GRPC_SERVER_USE_TLS", "yes")],
                "GRPC_SERVER_USE_TLS=yes: expected true or false",
            ),
            (
                &[("TRACING_ENABLED", "true")],
                "TRACING_ENABLED=true with TRACING_EXPORTER_PROTOCOL=http",
            ),
            (&[("LOG_LEVEL", "loud")], "LOG_LEVEL=loud: expected"),
            (
                &[("STATS_FLUSH_INTERVAL", "5"), ("USE_STATSD", "true")],
                "STATS_FLUSH_INTERVAL=5",
            ),
        ] {
            let e = format!("{:#}", read(&env(pairs), Mode::Slidegate).unwrap_err());
            assert!(e.starts_with(says), "{e}");
        }
    }

    #[test]
    fn the_config_folder_is_root_subdirectory_and_app_directory() {
        let c = read(
            &env(&[("RUNTIME_ROOT", "/data"), ("RUNTIME_SUBDIRECTORY", "ratelimit")]),
            Mode::Slidegate,
        )
        .unwrap();
        assert_eq!(line(&c), ["--config", "/data/ratelimit/config"]);
        let c = read(
            &env(&[("RUNTIME_ROOT", "/data"), ("RUNTIME_APPDIRECTORY", "limits")]),
            Mode::Slidegate,
        )
        .unwrap();
        assert_eq!(line(&c), ["--config", "/data/limits"]);
    }

    #[test]
    fn stats_follow_use_statsd_and_disable_stats() {
        let c = read(
            &env(&[
                ("USE_STATSD", "true"),
                ("STATSD_HOST", "127.0.0.1"),
                ("STATSD_PORT", "9125"),
                ("EXTRA_TAGS", "a:b"),
                ("STATS_FLUSH_INTERVAL", "1s"),
                ("USE_DOG_STATSD", "true"),
            ]),
            Mode::Slidegate,
        )
        .unwrap();
        assert_eq!(
            line(&c),
            [
                "--statsd",
                "127.0.0.1:9125",
                "--statsd-flush-interval",
                "1s",
                "--statsd-tags",
                "a:b",
                "--dogstatsd"
            ]
        );
        let c = read(&env(&[("DISABLE_STATS", "true")]), Mode::Ratelimit).unwrap();
        assert!(asked(&c, "statsd").is_none());
    }
}
