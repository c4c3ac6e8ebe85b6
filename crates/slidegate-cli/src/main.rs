//! `slidegate`: the command line of the slidegate rate limiter.
//!
//! Subcommands:
//!
//! - `serve`: the rate limit service (Envoy's gRPC `RateLimitService`,
//!   envoyproxy/ratelimit's YAML, an HTTP API, metrics).
//! - `simulate`: runs the algorithms against traffic models or access logs
//!   and an exact oracle, and reports wrong decisions, estimate error and
//!   the most any client got admitted in one window (see the
//!   `slidegate-sim` crate); with `--config`, replays access logs through a
//!   service config and reports what each rule would have refused.

#![deny(unsafe_code)]

mod alloc;
mod check;
mod otlp;
mod plots;
mod progress;
mod ratelimit_env;
mod serve;
mod simulate;
mod whatif;

use clap::parser::ValueSource;
use clap::{CommandFactory as _, FromArgMatches as _, Parser, Subcommand};
use ratelimit_env::{Env, Mode};
use std::ffi::OsString;
use std::process::ExitCode;

/// Sliding-window rate limiting.
#[derive(Parser, Debug)]
#[command(name = "slidegate", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve rate limit decisions: Envoy's RateLimitService over gRPC and an HTTP API
    ///
    /// Loads envoyproxy/ratelimit YAML files (with slidegate's extra keys),
    /// watches them and reloads them when they change; the counters live in
    /// a bounded in-memory store. Stops gracefully on SIGTERM or SIGINT.
    Serve(Box<serve::Args>),
    /// Load a config exactly as `serve` would, without serving it
    ///
    /// Prints a line per domain and exits 0, or prints every error (file,
    /// line, column and key), one per line, and exits 1. With --redis,
    /// every limit must have a Redis form too. With --explain, says which
    /// rule a descriptor matches and which limits apply.
    Check(check::Args),
    /// Simulate the algorithms on traffic models against an exact oracle
    ///
    /// Every client has its own limit. Measurement view: every request is
    /// counted, admitted or not; wrong_allow and wrong_deny count the requests
    /// where the algorithm's estimate and the exact count of the window
    /// disagree on `count + cost > limit`, and mean_err_% is the estimate's
    /// mean relative error. Admission view: refused requests are not counted;
    /// max_ratio is the most one client got admitted in any window, divided
    /// by the limit (above 1.0, a client exceeded its limit). gcra keeps no
    /// window count and has no measurement view.
    ///
    /// What-if replay (--config with --trace): every log line is a request
    /// decided by the service's config and engine at the line's time; per
    /// rule, the requests matched and refused, when refusals started and
    /// the keys refused most, as configured, by the exact sliding log and
    /// by a fixed window of the same length.
    Simulate(Box<simulate::Args>),
}

/// The command line, with what envoyproxy/ratelimit's environment asks
/// of `serve` added, and the notes to log about it. Started as `ratelimit`
/// (an image's `/bin/ratelimit`), the process is `slidegate serve` with
/// envoyproxy/ratelimit's defaults.
fn parse(argv: Vec<OsString>, env: &Env) -> anyhow::Result<(Cli, Vec<String>)> {
    let called = argv.first().map(std::path::Path::new).and_then(|p| p.file_name());
    let mode = if called.is_some_and(|name| name == "ratelimit") {
        Mode::Ratelimit
    } else {
        Mode::Slidegate
    };
    let mut argv = argv;
    if mode == Mode::Ratelimit {
        argv.insert(1, "serve".into());
    }
    let command = Cli::command();
    let matches = command.clone().try_get_matches_from(&argv).unwrap_or_else(|e| e.exit());
    let Some(("serve", given)) = matches.subcommand() else {
        return Ok((Cli::from_arg_matches(&matches)?, Vec::new()));
    };
    let contract = ratelimit_env::read(env, mode)?;
    let serve = command
        .find_subcommand("serve")
        .map(|s| s.get_arguments().cloned().collect::<Vec<_>>());
    for ask in contract.asks {
        let Some(arg) = serve.iter().flatten().find(|a| a.get_id() == ask.id) else {
            anyhow::bail!("{}: slidegate has no {} flag yet", ask.from.join(" "), ask.flag);
        };
        match given.value_source(ask.id) {
            Some(source @ (ValueSource::CommandLine | ValueSource::EnvVariable)) => {
                let have: Vec<String> = given
                    .get_raw(ask.id)
                    .into_iter()
                    .flatten()
                    .map(|v| v.to_string_lossy().into_owned())
                    .collect();
                // The values asked (a switch alone asks for `true`).
                let want = match &ask.values[..] {
                    [] => vec!["true".to_owned()],
                    values => values.to_vec(),
                };
                // A default of the `ratelimit` name yields to a flag given.
                if ask.from.is_empty() || have == want {
                    continue;
                }
                let by = match (source, arg.get_env()) {
                    (ValueSource::EnvVariable, Some(name)) => format!("{}={}", name.to_string_lossy(), have.join(",")),
                    _ => format!("the command line's {} {}", ask.flag, have.join(" ")),
                };
                anyhow::bail!(
                    "{} asks for {}, but {by} says otherwise: set one of them",
                    ask.from.join(" "),
                    ask.args().join(" ")
                );
            }
            _ => argv.extend(ask.args().into_iter().map(OsString::from)),
        }
    }
    let cli = Cli::try_parse_from(&argv).unwrap_or_else(|e| e.exit());
    Ok((cli, contract.notes))
}

fn main() -> ExitCode {
    let (cli, notes) = match parse(std::env::args_os().collect(), &Env::from_process()) {
        Ok(parsed) => parsed,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    let mut stdout = std::io::stdout().lock();
    let result = match &cli.command {
        Command::Serve(args) => serve::run(args, &notes),
        Command::Check(args) => check::run(args, &mut stdout),
        Command::Simulate(args) => simulate::run(args, &mut stdout),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // A closed pipe (`slidegate simulate | head`) is not a failure.
        Err(e)
            if e.downcast_ref::<std::io::Error>()
                .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe) =>
        {
            ExitCode::SUCCESS
        }
        // `check` printed its errors, one per line.
        Err(e) if e.downcast_ref::<check::Reported>().is_some() => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A switch is a flag alone; `--no-…` turns off one on by default, the
    /// last of the two winning; `--x false` is no longer a form.
    #[test]
    fn switches_are_flags_alone() {
        let parse = |args: &[&str]| match Cli::try_parse_from(args).map(|cli| cli.command) {
            Ok(Command::Serve(serve)) => serve.switches(),
            other => panic!("{other:?}"),
        };
        let base = ["slidegate", "serve"];
        assert_eq!(parse(&base), [false, false, false, false, true]);
        let all = [
            "--shadow-mode",
            "--quota-mode",
            "--merge-domain-config",
            "--response-dynamic-metadata",
            "--stop-cache-key-increment-when-overlimit",
            "--grpc",
            "127.0.0.1:0",
        ];
        assert_eq!(parse(&[&base[..], &all].concat()), [true; 5]);
        let off = ["--no-stop-cache-key-increment-when-overlimit"];
        assert_eq!(parse(&[&base[..], &off].concat()), [false; 5]);
        let again = [
            "--no-stop-cache-key-increment-when-overlimit",
            "--stop-cache-key-increment-when-overlimit",
        ];
        assert_eq!(parse(&[&base[..], &again].concat()), [false, false, false, false, true]);
        for old in [
            &["--shadow-mode", "true"][..],
            &["--shadow-mode=false"],
            &["--quota-mode", "0"],
        ] {
            assert!(Cli::try_parse_from([&base[..], old].concat()).is_err(), "{old:?}");
        }
        let check = Cli::try_parse_from(["slidegate", "check", "--config", "x.yaml", "--merge-domain-config"]);
        assert!(check.is_ok(), "{check:?}");
    }

    /// `serve --help` groups every flag under a heading, in this order, and
    /// `-h` gives each flag one line.
    #[test]
    fn serve_help_groups_every_flag() {
        use clap::CommandFactory as _;
        let mut cli = Cli::command();
        let serve = cli.find_subcommand_mut("serve").expect("a serve command");
        let ungrouped: Vec<String> = serve
            .get_arguments()
            .filter(|a| a.get_id() != "help" && a.get_help_heading().is_none())
            .map(|a| a.get_id().to_string())
            .collect();
        assert!(ungrouped.is_empty(), "flags without a heading: {ungrouped:?}");
        let help = serve.render_help().to_string();
        let headings = [
            "Listeners:",
            "Config:",
            "Config over xDS:",
            "Store and Redis:",
            "Answers:",
            "envoyproxy/ratelimit compatibility:",
            "Health and shutdown:",
            "Limits on clients:",
            "Observability:",
            "Rate limit quota service (Envoy's rate_limit_quota filter):",
        ];
        let mut at = 0;
        for heading in headings {
            let found = help[at..].find(&format!("\n{heading}\n"));
            assert!(found.is_some(), "{heading} missing or out of order:\n{help}");
            at += found.unwrap_or(0) + 1;
        }
        // One line of text a flag in the short help: on the flag's line,
        // or (clap's layout for long flags) on the one line after it.
        let mut continued = 0;
        for line in help.lines() {
            let text = line.trim_start();
            if text.starts_with('-') || text.is_empty() || !line.starts_with(' ') {
                continued = 0;
            } else {
                continued += 1;
                assert!(continued <= 1, "a flag's help takes more than a line:\n{help}");
            }
        }
    }

    /// `--rlqs-ttl` is whole seconds, at least 6 (Envoy's reports come
    /// every 5 s), each refusal naming the value and why.
    #[test]
    fn rlqs_ttl_is_whole_seconds_past_a_report() {
        let parse = |ttl: &str| Cli::try_parse_from(["slidegate", "serve", "--rlqs-ttl", ttl]).map(|_| ());
        assert!(parse("10s").is_ok());
        assert!(parse("6s").is_ok());
        let whole = parse("7500ms").unwrap_err().to_string();
        assert!(whole.contains("`7500ms` is not a whole number of seconds"), "{whole}");
        let short = parse("5s").unwrap_err().to_string();
        assert!(short.contains("`5s` is under 6s: Envoy reports every 5 s"), "{short}");
    }

    fn parsed(argv: &[&str], env: &[(&str, &str)]) -> anyhow::Result<(String, Vec<String>)> {
        let env = Env::from_pairs(env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
        let (cli, notes) = parse(argv.iter().map(OsString::from).collect(), &env)?;
        Ok((format!("{:?}", cli.command), notes))
    }

    /// Started as `ratelimit` with no argument, the process serves with
    /// envoyproxy/ratelimit's defaults; its variables set win over them.
    #[test]
    fn the_ratelimit_name_serves_with_its_defaults() {
        let (serve, notes) = parsed(&["/bin/ratelimit"], &[("USE_STATSD", "false"), ("GRPC_PORT", "9001")]).unwrap();
        for field in [
            "http: Tcp(0.0.0.0:8080)",
            "grpc: Tcp(0.0.0.0:9001)",
            "config: [\"/srv/runtime_data/current/config\"]",
            "no_stop_cache_key_increment_when_overlimit: true",
        ] {
            assert!(serve.contains(field), "{field} in {serve}");
        }
        assert!(notes.is_empty(), "{notes:?}");
        // Another name is slidegate, with its own defaults.
        let (serve, _) = parsed(&["/usr/bin/slidegate", "serve"], &[]).unwrap();
        assert!(serve.contains("http: Tcp(127.0.0.1:8080)"), "{serve}");
    }

    /// A flag given and a variable of envoyproxy/ratelimit's that asks for
    /// something else: an error naming both. The same value is no conflict,
    /// and a default of the `ratelimit` name yields to the flag.
    #[test]
    fn a_flag_and_a_variable_that_disagree_are_an_error() {
        let e = parsed(
            &["slidegate", "serve", "--grpc", "127.0.0.1:9"],
            &[("GRPC_PORT", "9000")],
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "GRPC_PORT=9000 asks for --grpc 0.0.0.0:9000, but the command line's --grpc 127.0.0.1:9 says \
             otherwise: set one of them"
        );
        let same = parsed(
            &["slidegate", "serve", "--grpc", "127.0.0.1:9000"],
            &[("GRPC_HOST", "127.0.0.1"), ("GRPC_PORT", "9000")],
        );
        assert!(same.is_ok(), "{same:?}");
        let (serve, _) = parsed(
            &[
                "ratelimit",
                "--http",
                "127.0.0.1:1",
                "--stop-cache-key-increment-when-overlimit",
            ],
            &[("USE_STATSD", "false")],
        )
        .unwrap();
        assert!(serve.contains("http: Tcp(127.0.0.1:1)"), "{serve}");
        assert!(
            serve.contains("stop_cache_key_increment_when_overlimit: true"),
            "{serve}"
        );
    }

    /// Notes are said for the variables that mean nothing here.
    #[test]
    fn variables_that_mean_nothing_here_are_noted() {
        let (_, notes) = parsed(
            &["slidegate", "serve"],
            &[
                ("REDIS_SOCKET_TYPE", "tcp"),
                ("REDIS_URL", "127.0.0.1:6379"),
                ("REDIS_PIPELINE_WINDOW", "150us"),
            ],
        )
        .unwrap();
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(
            notes[0].starts_with("REDIS_PIPELINE_WINDOW=150us: no pool to size"),
            "{notes:?}"
        );
    }

    /// Every flag envoyproxy/ratelimit's variables can ask for is one of
    /// `serve`'s, and every such environment parses.
    #[test]
    fn every_flag_the_variables_ask_for_exists() {
        let every = [
            ("HOST", "127.0.0.1"),
            ("PORT", "1"),
            ("GRPC_HOST", "127.0.0.1"),
            ("GRPC_PORT", "2"),
            ("GRPC_MAX_CONNECTION_AGE", "1h"),
            ("GRPC_SERVER_USE_TLS", "true"),
            ("GRPC_SERVER_TLS_CERT", "c"),
            ("GRPC_SERVER_TLS_KEY", "k"),
            ("GRPC_CLIENT_TLS_CACERT", "ca"),
            ("GRPC_CLIENT_TLS_SAN", "envoy"),
            ("LOG_LEVEL", "debug"),
            ("LOG_FORMAT", "json"),
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_SERVER_URL", "cp:18000"),
            ("CONFIG_GRPC_XDS_NODE_ID", "n"),
            ("CONFIG_GRPC_XDS_NODE_METADATA", "a=b"),
            ("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "x:y"),
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "c"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "k"),
            ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "ca"),
            ("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "cp"),
            ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "1s"),
            ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "2s"),
            ("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "0.1"),
            ("XDS_CLIENT_BACKOFF_JITTER", "false"),
            ("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "1000000"),
            ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_TYPE", "cluster"),
            ("REDIS_URL", "r1:1,r2:2"),
            ("CACHE_KEY_PREFIX", "p:"),
            ("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "true"),
            ("USE_STATSD", "true"),
            ("STATSD_HOST", "127.0.0.1"),
            ("STATSD_PORT", "8125"),
            ("STATS_FLUSH_INTERVAL", "1s"),
            ("EXTRA_TAGS", "a:b"),
            ("USE_DOG_STATSD", "true"),
            ("USE_PROMETHEUS", "true"),
            ("PROMETHEUS_ADDR", ":19001"),
            ("PROMETHEUS_PATH", "/m"),
            ("TRACING_ENABLED", "true"),
            ("TRACING_EXPORTER_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"),
            ("TRACING_SERVICE_NAME", "rl"),
        ];
        let sentinel = [
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_TYPE", "sentinel"),
            ("REDIS_URL", "m,s:26379"),
        ];
        let files = [("RUNTIME_ROOT", "/data"), ("GRPC_UDS", "/run/rl.sock")];
        for (env, mode) in [
            (&every[..], Mode::Ratelimit),
            (&sentinel, Mode::Slidegate),
            (&files, Mode::Ratelimit),
        ] {
            let env = Env::from_pairs(env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
            let contract = ratelimit_env::read(&env, mode).unwrap();
            let command = Cli::command();
            let serve = command.find_subcommand("serve").unwrap();
            for ask in &contract.asks {
                let arg = serve.get_arguments().find(|a| a.get_id() == ask.id);
                let long = arg.and_then(|a| a.get_long()).map(|l| format!("--{l}"));
                assert_eq!(long.as_deref(), Some(ask.flag), "{ask:?}");
            }
        }
        let (serve, _) = parsed(&["ratelimit"], &every).unwrap();
        for field in [
            "xds: Some(\"cp:18000\")",
            "statsd: Some(\"127.0.0.1:8125\")",
            "redis_cluster: true",
        ] {
            assert!(serve.contains(field), "{field} in {serve}");
        }
    }
}
