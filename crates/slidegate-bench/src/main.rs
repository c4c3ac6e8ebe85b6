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

#![forbid(unsafe_code)]

mod bench;
mod bench_clients;
mod bench_hybrid;
mod bench_redis;
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
#[command(name = "slidegate-bench", version)]
struct Cli {
    #[command(flatten)]
    args: bench::Args,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut stdout = std::io::stdout().lock();
    match bench::run(&cli.args, &mut stdout) {
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
