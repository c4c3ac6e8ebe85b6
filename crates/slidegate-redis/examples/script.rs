//! Prints the Lua source of one of the store's scripts, as sent to Redis:
//! `one` ([`slidegate_redis::scripts::ONE`]) or `multi`
//! ([`slidegate_redis::scripts::MULTI`]), or the same as the Redis
//! function library the store loads (`one-function`, `multi-function`:
//! [`slidegate_redis::Function`], its name on its first line). For
//! measuring them inside `redis-server` (`bench/load/redis-instructions.sh`).

use std::process::ExitCode;

fn main() -> ExitCode {
    match std::env::args().nth(1).as_deref() {
        Some("one") => print!("{}", slidegate_redis::scripts::ONE),
        Some("multi") => print!("{}", slidegate_redis::scripts::MULTI),
        Some("one-function") => print!("{}", slidegate_redis::ONE_FUNCTION.library),
        Some("multi-function") => print!("{}", slidegate_redis::MULTI_FUNCTION.library),
        other => {
            eprintln!("usage: script one|multi|one-function|multi-function (got {other:?})");
            return ExitCode::from(2);
        }
    }
    ExitCode::SUCCESS
}
