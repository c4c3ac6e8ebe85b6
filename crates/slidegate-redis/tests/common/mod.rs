//! A throw-away `redis-server` per test, on a free loopback port.

#![allow(dead_code, unreachable_pub)]

use redis::aio::MultiplexedConnection;
use slidegate_core::Policy;
use slidegate_redis::{RedisClock, RedisLimiter};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

/// The prefix of every key the tests' limiters write.
pub const PREFIX: &str = "slidegate:test:";

/// A `redis-server` of its own, killed on drop. On drop (unless the test
/// already failed) it checks that no key was left without an expiry.
pub struct RedisServer {
    child: Child,
    port: u16,
}

impl RedisServer {
    /// Starts a server on a free loopback port (never 6379) without
    /// persistence and waits until it answers `PING`.
    pub fn start() -> RedisServer {
        let mut last = String::new();
        for _ in 0..5 {
            let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
            let child = Command::new("redis-server")
                .args([
                    "--port",
                    &port.to_string(),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                ])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server is installed");
            let mut server = RedisServer { child, port };
            for _ in 0..200 {
                match server
                    .sync_conn()
                    .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
                {
                    Ok(_) => return server,
                    Err(e) => last = e.to_string(),
                }
                if server.child.try_wait().unwrap().is_some() {
                    break; // lost the port to someone else: try another
                }
                sleep(Duration::from_millis(25));
            }
            let _ = server.child.kill();
            let _ = server.child.wait();
            std::mem::forget(server);
        }
        panic!("redis-server did not answer PING: {last}");
    }

    /// The server's URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// A blocking connection, for checks.
    pub fn sync_conn(&self) -> redis::RedisResult<redis::Connection> {
        redis::Client::open(self.url())?.get_connection_with_timeout(Duration::from_secs(2))
    }

    /// A multiplexed connection of its own.
    pub async fn conn(&self) -> MultiplexedConnection {
        redis::Client::open(self.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }

    /// A limiter of `policy` with a timeout of 2 s on `clock`.
    pub async fn limiter(&self, policy: Policy, clock: RedisClock) -> RedisLimiter {
        RedisLimiter::new(self.conn().await, policy, PREFIX, Duration::from_secs(2))
            .unwrap()
            .with_clock(clock)
    }

    /// Every key on the server with its `PTTL`.
    pub fn keys_and_ttls(&self) -> Vec<(String, i64)> {
        let mut conn = self.sync_conn().unwrap();
        let keys: Vec<String> = redis::cmd("SCAN")
            .cursor_arg(0)
            .arg("COUNT")
            .arg(1000)
            .clone()
            .iter(&mut conn)
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        keys.into_iter()
            .map(|k| {
                let ttl: i64 = redis::cmd("PTTL").arg(&k).query(&mut conn).unwrap();
                (k, ttl)
            })
            .collect()
    }

    /// Asserts that every key on the server has an expiry.
    pub fn assert_every_key_expires(&self) {
        for (key, ttl) in self.keys_and_ttls() {
            assert!(key.starts_with(PREFIX), "a key that is not the tests': {key}");
            // -1: no expiry; -2: gone meanwhile.
            assert!(ttl != -1, "{key} has no expiry");
        }
    }

    /// Waits (bounded) until `key` is gone; false if it is still there
    /// after `within`.
    pub fn wait_gone(&self, key: &str, within: Duration) -> bool {
        let mut conn = self.sync_conn().unwrap();
        let start = Instant::now();
        while start.elapsed() < within {
            let exists: bool = redis::cmd("EXISTS").arg(key).query(&mut conn).unwrap();
            if !exists {
                return true;
            }
            sleep(Duration::from_millis(20));
        }
        false
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let check = (!std::thread::panicking())
            .then(|| std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.assert_every_key_expires())));
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(Err(e)) = check {
            std::panic::resume_unwind(e);
        }
    }
}
