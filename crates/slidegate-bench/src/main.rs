//! `slidegate-bench`: decisions per second measured in this process, each
//! case beside its baseline in the same run: the algorithms, the keyed
//! store, the service and (with `--redis`) the Redis scripts and the hybrid
//! mode. A tool of the repository, not part of the shipped `slidegate`
//! binary: it links governor, the baseline of the `algorithms` and `store`
//! groups.
//!
//! ```text
//! cargo run --release -p slidegate-bench -- --only algorithms,store --time 1s --rounds 3
//! ```
//!
//! `slidegate-bench rlqs --grpc 127.0.0.1:PORT` loads a running `slidegate
//! serve`'s rate limit quota service as many Envoys would
//! (`crate::bench_rlqs`).

#![forbid(unsafe_code)]

mod bench;
mod bench_clients;
mod bench_hybrid;
mod bench_redis;
mod bench_rlqs;
mod case;
mod progress;
mod redis_conn;
mod table;

use clap::Parser;
use std::process::ExitCode;

/// The service group measures `slidegate serve` as it ships: on the
/// shipped binary's allocator (`slidegate-cli`'s `alloc.rs`).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Measure decisions per second, each case beside its baseline in the same run
///
/// algorithms: every algorithm's decision on one key, reading the
/// monotonic clock, against governor's direct limiter with its default
/// clock, yes or no and with the headers' figures, admitted and
/// refused; store: the keyed in-memory store on one hot key and over
/// --keys keys, against governor's keyed limiter, on 1 and 2 threads;
/// service: `slidegate serve` started in this process on loopback, HTTP
/// `POST /v1/check` and gRPC `ShouldRateLimit` from --concurrency
/// clients in this process, with the service's CPU per decision; redis
/// (with --redis): the Lua scripts against plain INCR through the same
/// client, at each of --redis-concurrency, with Redis's CPU per
/// decision; hybrid (with --redis): the hybrid mode against the script.
#[derive(Parser, Debug)]
#[command(name = "slidegate-bench", version, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,

    #[command(flatten)]
    args: bench::Args,
}

/// Loads of a server running elsewhere, rather than the groups above.
#[derive(clap::Subcommand, Debug)]
enum Command {
    /// Load a running `slidegate serve`'s rate limit quota service (RLQS)
    /// as many Envoys' rate_limit_quota filters would
    ///
    /// --streams streams of StreamRateLimitQuotas over --connections
    /// HTTP/2 connections, each with --buckets bucket ids of its own:
    /// each stream's first report (every bucket new), then --rounds rounds
    /// of a report from every stream, each waiting for its answer; every
    /// answer must hold an action per bucket. Prints bucket reports/s and,
    /// with --server-pid, the server's CPU per bucket report. Loopback
    /// only; every step bounded by --timeout.
    Rlqs(bench_rlqs::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut stdout = std::io::stdout().lock();
    let done = match &cli.command {
        Some(Command::Rlqs(args)) => bench_rlqs::run(args, &mut stdout),
        None => bench::run(&cli.args, &mut stdout),
    };
    match done {
        Ok(()) => ExitCode::SUCCESS,
        // A closed pipe (`slidegate-bench | head`) is not a failure.
        Err(e)
            if e.downcast_ref::<std::io::Error>()
                .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe) =>
        {
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
