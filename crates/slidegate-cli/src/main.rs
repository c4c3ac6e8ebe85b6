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
mod serve;
mod simulate;
mod whatif;

use clap::{Parser, Subcommand};
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut stdout = std::io::stdout().lock();
    let result = match &cli.command {
        Command::Serve(args) => serve::run(args),
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
            "Store and Redis:",
            "Answers:",
            "envoyproxy/ratelimit compatibility:",
            "Health and shutdown:",
            "Limits on clients:",
            "Observability:",
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
}
