//! Prints the Lua source of one of the store's scripts, as sent to Redis:
//! `one` ([`slidegate_redis::scripts::ONE`]) or `multi`
//! ([`slidegate_redis::scripts::MULTI`]). For measuring them inside
//! `redis-server` (`bench/load/redis-instructions.sh`).

use std::process::ExitCode;

fn main() -> ExitCode {
    match std::env::args().nth(1).as_deref() {
        Some("one") => print!("{}", slidegate_redis::scripts::ONE),
        Some("multi") => print!("{}", slidegate_redis::scripts::MULTI),
        other => {
            eprintln!("usage: script one|multi (got {other:?})");
            return ExitCode::from(2);
        }
    }
    ExitCode::SUCCESS
}
