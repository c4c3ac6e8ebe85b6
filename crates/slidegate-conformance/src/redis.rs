//! Throw-away Redis servers for tests: a `redis-server` per test on a free
//! loopback port (never 6379), ready when its log says so, killed on drop
//! or when the test process exits (and started again on the same port,
//! for failure tests); a
//! three-master Redis Cluster; or a primary found through a Sentinel.
//!
//! Every key a slidegate test writes starts with [`KEY_PREFIX`]; on drop a
//! server checks (unless the test already failed) that every key it holds
//! does, and that none was left without an expiry.

use ::redis::aio::MultiplexedConnection;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::sleep;
use std::time::{Duration, Instant};

/// What every key a slidegate test writes starts with.
pub const KEY_PREFIX: &str = "slidegate:";

/// `redis-server` with `args`, tied to this process: it runs under a
/// shell that holds the write end of its stdin, and the shell kills it
/// (`SIGKILL`) when that closes, which [`stop`] does and the system does
/// when this process exits however it exits. A server a test keeps in a
/// `static` is never dropped; without the tie it outlived the test binary.
/// The server's stdout is the child's, piped when `log` is set.
fn spawn_tied(args: &[&str], log: bool) -> Child {
    let script = r#"redis-server "$@" & pid=$!
exec >/dev/null
read -r _
kill -9 $pid 2>/dev/null
wait $pid"#;
    Command::new("sh")
        .args(["-c", script, "redis-server"])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(if log { Stdio::piped() } else { Stdio::null() })
        .stderr(Stdio::null())
        .spawn()
        .expect("sh and redis-server are installed")
}

/// Kills a server started by [`spawn_tied`] and waits until it is gone.
fn stop(child: &mut Child) {
    drop(child.stdin.take());
    let _ = child.wait();
}

/// A `redis-server` of its own, killed on drop. On drop (unless the test
/// already failed) it checks that no key was left without an expiry.
pub struct RedisServer {
    child: Child,
    port: u16,
    killed: bool,
}

impl RedisServer {
    /// Starts a server on a free loopback port (never 6379) without
    /// persistence and waits until it answers `PING`.
    pub fn start() -> RedisServer {
        let mut last = String::new();
        for _ in 0..5 {
            let port = free_port();
            match RedisServer::start_on(port, &[]) {
                Ok(server) => return server,
                Err(e) => last = e,
            }
        }
        panic!("redis-server did not answer PING: {last}");
    }

    /// Starts a server on `port` with `extra` arguments and waits (bounded)
    /// until it answers `PING`; the last error if it never does (another
    /// process took the port, say).
    pub fn start_on(port: u16, extra: &[&str]) -> Result<RedisServer, String> {
        let port_arg = port.to_string();
        let mut args = vec![
            "--port",
            &port_arg,
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ];
        args.extend_from_slice(extra);
        let mut child = spawn_tied(&args, true);
        // Ready when its log says so (an event, not a poll); the log ends
        // without it when the server exits (another process took the port).
        let log = child.stdout.take().expect("stdout is piped");
        let mut lines = std::io::BufRead::lines(std::io::BufReader::new(log));
        let ready = lines
            .by_ref()
            .map_while(Result::ok)
            .any(|line| line.contains("Ready to accept connections"));
        // Keep draining the log so the server never blocks writing it.
        std::thread::spawn(move || lines.for_each(drop));
        let mut server = RedisServer {
            child,
            port,
            killed: false,
        };
        let answer = if ready {
            server
                .sync_conn()
                .and_then(|mut c| ::redis::cmd("PING").query::<String>(&mut c))
                .map_err(|e| e.to_string())
        } else {
            Err(format!("redis-server on port {port} exited before it was ready"))
        };
        match answer {
            Ok(_) => Ok(server),
            Err(last) => {
                stop(&mut server.child);
                std::mem::forget(server);
                Err(last)
            }
        }
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Kills the server now (SIGKILL) and answers its port; the server is
    /// gone, so there is no expiry check.
    pub fn kill(mut self) -> u16 {
        stop(&mut self.child);
        self.killed = true;
        self.port
    }

    /// The server's URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// A blocking connection, for checks.
    pub fn sync_conn(&self) -> ::redis::RedisResult<::redis::Connection> {
        ::redis::Client::open(self.url())?.get_connection_with_timeout(Duration::from_secs(2))
    }

    /// A multiplexed connection of its own.
    pub async fn conn(&self) -> MultiplexedConnection {
        ::redis::Client::open(self.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }

    /// Every key on the server with its `PTTL`.
    pub fn keys_and_ttls(&self) -> Vec<(String, i64)> {
        let mut conn = self.sync_conn().unwrap();
        let keys: Vec<String> = ::redis::cmd("SCAN")
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
                let ttl: i64 = ::redis::cmd("PTTL").arg(&k).query(&mut conn).unwrap();
                (k, ttl)
            })
            .collect()
    }

    /// Asserts that every key on the server has an expiry.
    pub fn assert_every_key_expires(&self) {
        for (key, ttl) in self.keys_and_ttls() {
            assert!(key.starts_with(KEY_PREFIX), "a key that is not the tests': {key}");
            // -1: no expiry; -2: gone meanwhile.
            assert!(ttl != -1, "{key} has no expiry");
        }
    }

    /// The sum of the bucket counts of the `sliding_window` ring (a hash
    /// with `n` and one field per bucket) whose key contains `needle`; 0
    /// when there is none.
    pub fn ring_count(&self, needle: &str) -> u64 {
        let Some((key, _)) = self.keys_and_ttls().into_iter().find(|(k, _)| k.contains(needle)) else {
            return 0;
        };
        let fields: Vec<(String, u64)> = ::redis::cmd("HGETALL")
            .arg(key)
            .query(&mut self.sync_conn().expect("a connection"))
            .expect("HGETALL");
        fields.iter().filter(|(f, _)| f != "n").map(|(_, c)| c).sum()
    }

    /// `redis-cli` on this server: its answer, trimmed.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = std::process::Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port().to_string()])
            .args(args)
            .output()
            .expect("redis-cli is installed");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// Waits (bounded) until `redis-cli ARGS` answers with `needle` in it
    /// (a node that has taken its slots says `cluster_state:ok`); false if
    /// it still does not after `within`.
    pub fn wait_answer(&self, args: &[&str], needle: &str, within: Duration) -> bool {
        let start = Instant::now();
        while start.elapsed() < within {
            if self.cli(args).contains(needle) {
                return true;
            }
            sleep(Duration::from_millis(20));
        }
        false
    }

    /// Waits (bounded) until `key` is gone; false if it is still there
    /// after `within`.
    pub fn wait_gone(&self, key: &str, within: Duration) -> bool {
        let mut conn = self.sync_conn().unwrap();
        let start = Instant::now();
        while start.elapsed() < within {
            let exists: bool = ::redis::cmd("EXISTS").arg(key).query(&mut conn).unwrap();
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
        let check = (!std::thread::panicking() && !self.killed)
            .then(|| std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.assert_every_key_expires())));
        stop(&mut self.child);
        if let Some(Err(e)) = check {
            std::panic::resume_unwind(e);
        }
    }
}

/// A free loopback port below 55 536, so that a cluster node's bus port
/// (the port + 10 000) is a port too, and free as well.
pub fn free_port() -> u16 {
    loop {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        if port < 55_536 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

/// A Redis Cluster of three masters (no replicas), each a throw-away
/// `redis-server --cluster-enabled yes` in a temporary directory of its own,
/// all killed and the directory removed on drop. On drop (unless the test
/// already failed) it checks that no key on any master was left without an
/// expiry.
pub struct RedisCluster {
    /// The masters, in the order they were given to `--cluster create`
    /// (the first holds slots 0 to 5460, the second 5461 to 10922, the
    /// third the rest).
    pub nodes: Vec<RedisServer>,
    dir: PathBuf,
}

impl RedisCluster {
    /// Starts three nodes, joins them with `redis-cli --cluster create`,
    /// and waits (bounded) until every node reports `cluster_state:ok` and
    /// knows all 16 384 slots.
    pub fn start() -> RedisCluster {
        static DIRS: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "slidegate-cluster-{}-{}",
            std::process::id(),
            DIRS.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let mut nodes = Vec::new();
        while nodes.len() < 3 {
            let port = free_port();
            let conf = dir.join(format!("nodes-{port}.conf"));
            let extra = [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                conf.to_str().unwrap(),
                "--dir",
                dir.to_str().unwrap(),
            ];
            if let Ok(node) = RedisServer::start_on(port, &extra) {
                nodes.push(node);
            }
        }
        let cluster = RedisCluster { nodes, dir };
        let addresses: Vec<String> = cluster.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)).collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .expect("redis-cli is installed");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        cluster.wait_ok(Duration::from_secs(20));
        cluster
    }

    /// Waits (bounded) until every node reports `cluster_state:ok` with all
    /// 16 384 slots assigned and agrees on the owner of every slot.
    pub fn wait_ok(&self, within: Duration) {
        let start = Instant::now();
        let mut last = String::new();
        while start.elapsed() < within {
            let ok = self.nodes.iter().all(|node| {
                let info = node
                    .sync_conn()
                    .and_then(|mut c| ::redis::cmd("CLUSTER").arg("INFO").query::<String>(&mut c));
                match info {
                    Ok(info) => {
                        let ok = info.contains("cluster_state:ok") && info.contains("cluster_slots_ok:16384");
                        if !ok {
                            last = info;
                        }
                        ok
                    }
                    Err(e) => {
                        last = e.to_string();
                        false
                    }
                }
            });
            if ok && self.owners_agree() {
                return;
            }
            sleep(Duration::from_millis(20));
        }
        panic!("the cluster did not come up within {within:?}: {last}");
    }

    /// Whether every node names the same node for every slot.
    fn owners_agree(&self) -> bool {
        let slots: Vec<Option<Vec<(i64, i64, u16)>>> = self
            .nodes
            .iter()
            .map(|node| {
                let mut conn = node.sync_conn().ok()?;
                let value: ::redis::Value = ::redis::cmd("CLUSTER").arg("SLOTS").query(&mut conn).ok()?;
                let ::redis::Value::Array(ranges) = value else {
                    return None;
                };
                let mut out = Vec::new();
                for range in ranges {
                    let ::redis::Value::Array(parts) = range else {
                        return None;
                    };
                    let (
                        Some(::redis::Value::Int(from)),
                        Some(::redis::Value::Int(to)),
                        Some(::redis::Value::Array(master)),
                    ) = (parts.first(), parts.get(1), parts.get(2))
                    else {
                        return None;
                    };
                    let Some(::redis::Value::Int(port)) = master.get(1) else {
                        return None;
                    };
                    out.push((*from, *to, *port as u16));
                }
                out.sort();
                Some(out)
            })
            .collect();
        slots.iter().all(|s| s.is_some()) && slots.windows(2).all(|w| w[0] == w[1])
    }

    /// The nodes' URLs.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The slot of `key`, as the cluster computes it.
    pub fn slot(&self, key: &str) -> u16 {
        let mut conn = self.nodes[0].sync_conn().unwrap();
        ::redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut conn)
            .unwrap()
    }

    /// The node's id in the cluster.
    pub fn node_id(&self, node: usize) -> String {
        let mut conn = self.nodes[node].sync_conn().unwrap();
        ::redis::cmd("CLUSTER").arg("MYID").query(&mut conn).unwrap()
    }

    /// The indices of the nodes holding `key`, asked of every node (one
    /// that does not own the slot answers `MOVED`: it does not hold it).
    pub fn holders(&self, key: &str) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| {
                let mut conn = self.nodes[i].sync_conn().unwrap();
                match ::redis::cmd("EXISTS").arg(key).query::<bool>(&mut conn) {
                    Ok(exists) => exists,
                    Err(e) if e.redirect_node().is_some() => false,
                    Err(e) => panic!("EXISTS {key}: {e}"),
                }
            })
            .collect()
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        // Each node checks its own keys as it is dropped; the first failure
        // is raised after all are gone.
        let mut failure = None;
        for node in self.nodes.drain(..) {
            if let Err(e) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(node))) {
                failure.get_or_insert(e);
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        if let Some(e) = failure {
            std::panic::resume_unwind(e);
        }
    }
}

/// A throw-away primary and one `redis-server --sentinel` monitoring it
/// (quorum 1), both on free loopback ports, the sentinel's config in a
/// temporary directory of its own; the sentinel is killed and the
/// directory removed on drop, then the primary is dropped (and checks its
/// keys' expiries).
pub struct RedisSentinel {
    /// The primary the sentinel monitors (first).
    pub primary: RedisServer,
    /// Its replica, when started with one.
    pub replica: Option<RedisServer>,
    sentinel: Child,
    port: u16,
    dir: PathBuf,
}

impl RedisSentinel {
    /// The master's name the sentinel monitors.
    pub const MASTER: &'static str = "slidegate-primary";

    /// Starts a primary and a sentinel monitoring it, and waits (bounded,
    /// 10 s) until the sentinel names the primary's address for
    /// [`RedisSentinel::MASTER`].
    pub fn start() -> RedisSentinel {
        RedisSentinel::launch(RedisServer::start(), None, RedisSentinel::fresh_dir())
    }

    /// A temporary directory of its own.
    fn fresh_dir() -> PathBuf {
        static DIRS: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "slidegate-sentinel-{}-{}",
            std::process::id(),
            DIRS.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// [`RedisSentinel::start`] with a replica of the primary too (its
    /// replication link up before the sentinel starts, so that the
    /// sentinel finds it at once): [`RedisSentinel::failover`] can then
    /// promote it.
    pub fn start_with_replica() -> RedisSentinel {
        let primary = RedisServer::start();
        let of = primary.port().to_string();
        // The replica writes the primary's snapshot into its own `--dir`.
        let dir = RedisSentinel::fresh_dir();
        let dir_arg = dir.to_str().unwrap().to_owned();
        let mut replica = None;
        for _ in 0..5 {
            if let Ok(r) = RedisServer::start_on(free_port(), &["--replicaof", "127.0.0.1", &of, "--dir", &dir_arg]) {
                replica = Some(r);
                break;
            }
        }
        let replica = replica.expect("a replica started");
        let start = Instant::now();
        while !replica.cli(&["INFO", "replication"]).contains("master_link_status:up") {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "the replica did not sync within 10 s"
            );
            sleep(Duration::from_millis(20));
        }
        RedisSentinel::launch(primary, Some(replica), dir)
    }

    fn launch(primary: RedisServer, replica: Option<RedisServer>, dir: PathBuf) -> RedisSentinel {
        let port = free_port();
        let conf = dir.join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {}\nsentinel monitor {} 127.0.0.1 {} 1\n",
                dir.display(),
                Self::MASTER,
                primary.port()
            ),
        )
        .unwrap();
        let conf = conf.to_str().expect("a temporary path in UTF-8");
        let sentinel = spawn_tied(&[conf, "--sentinel"], false);
        let mut out = RedisSentinel {
            primary,
            replica,
            sentinel,
            port,
            dir,
        };
        let want = out.primary.port();
        if let Err(last) = out.wait_master(want, Duration::from_secs(10)) {
            stop(&mut out.sentinel);
            panic!("the sentinel did not name the primary within 10 s: {last}");
        }
        out
    }

    /// Waits (bounded) until the sentinel names `port` (on loopback) as
    /// the master; the last answer if it does not within `within`.
    pub fn wait_master(&mut self, port: u16, within: Duration) -> Result<(), String> {
        let expect = vec!["127.0.0.1".to_owned(), port.to_string()];
        let start = Instant::now();
        let mut last = String::new();
        while start.elapsed() < within {
            match self.master_addr() {
                Ok(Some(addr)) if addr == expect => return Ok(()),
                Ok(other) => last = format!("{other:?}"),
                Err(e) => last = e.to_string(),
            }
            if let Ok(Some(status)) = self.sentinel.try_wait() {
                return Err(format!("the sentinel exited: {status}"));
            }
            sleep(Duration::from_millis(50));
        }
        Err(last)
    }

    /// Makes the sentinel promote the replica (`SENTINEL FAILOVER`) and
    /// waits (bounded, 10 s) until it names the replica as the master.
    /// Panics without a replica.
    pub fn failover(&mut self) {
        let port = self.replica.as_ref().expect("started with a replica").port();
        let mut conn = ::redis::Client::open(self.url())
            .unwrap()
            .get_connection_with_timeout(Duration::from_secs(2))
            .unwrap();
        // Refused (NOGOODSLAVE) until the sentinel has found the replica
        // and heard from it: asked again, bounded.
        let start = Instant::now();
        loop {
            let asked: ::redis::RedisResult<String> = ::redis::cmd("SENTINEL")
                .arg("FAILOVER")
                .arg(Self::MASTER)
                .query(&mut conn);
            match asked {
                Ok(_) => break,
                Err(e) if start.elapsed() < Duration::from_secs(10) => {
                    let _ = e;
                    sleep(Duration::from_millis(100));
                }
                Err(e) => panic!("the sentinel refused the failover for 10 s: {e}"),
            }
        }
        if let Err(last) = self.wait_master(port, Duration::from_secs(10)) {
            panic!("the sentinel did not promote the replica within 10 s: {last}");
        }
    }

    /// `SENTINEL get-master-addr-by-name` of [`RedisSentinel::MASTER`]:
    /// its host and port, or `None` when it knows no such master.
    pub fn master_addr(&self) -> ::redis::RedisResult<Option<Vec<String>>> {
        let mut conn = ::redis::Client::open(self.url())?.get_connection_with_timeout(Duration::from_secs(2))?;
        ::redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(Self::MASTER)
            .query(&mut conn)
    }

    /// The sentinel's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The sentinel's URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}

impl Drop for RedisSentinel {
    fn drop(&mut self) {
        stop(&mut self.sentinel);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
