//! statsd output: envoyproxy/ratelimit's stats ([`super::upstream`]) sent
//! every flush interval as the counts added since the last flush, over UDP,
//! through cadence, from a timer task (never from a request).

use super::Metrics;
use cadence::{BufferedUdpMetricSink, Counted, StatsdClient};
use std::collections::HashMap;
use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The largest datagram sent: lines are batched up to it, the payload
/// that fits a 1,500-byte Ethernet frame's IPv6 and UDP headers.
const MAX_DATAGRAM: usize = 1432;

/// Where and how envoyproxy/ratelimit's stats are sent to a statsd server
/// (its `USE_STATSD`).
///
/// Every flush interval, each stat that grew since the last flush is sent
/// as a statsd counter (`name:delta|c`) of what it grew by, under
/// envoyproxy/ratelimit's name: the per-rule
/// `ratelimit.service.rate_limit.<domain>.<key>.{total_hits,over_limit,near_limit,within_limit,shadow_mode}`,
/// `ratelimit.service.config_load_success` and `config_load_error`,
/// `ratelimit.service.global_shadow_mode`,
/// `ratelimit.service.call.should_rate_limit.{redis_error,service_error}`
/// and `ratelimit_server.ShouldRateLimit.total_requests`. Lines are batched
/// into datagrams of at most 1,432 bytes, over UDP (envoyproxy/ratelimit
/// sends plain statsd over TCP; the statsd exporter, statsd and the
/// Datadog agent listen on UDP). A datagram that cannot be sent is lost
/// and counted in the log, once until sending works again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatsdOptions {
    /// The statsd server's host name or address (`STATSD_HOST`; default
    /// `localhost`), looked up once, at the start.
    pub host: String,
    /// Its UDP port (`STATSD_PORT`; default 8125).
    pub port: u16,
    /// How often the stats are sent (`STATS_FLUSH_INTERVAL`; default 10 s,
    /// more than 0), and once more when the server has stopped.
    pub flush_interval: Duration,
    /// Tags on every stat (`EXTRA_TAGS`, read by
    /// [`StatsdOptions::parse_extra_tags`]), sorted by name, `.`, `:` and
    /// `|` of a value written `_`, a tag with an empty name or value left
    /// out, as envoyproxy/ratelimit's stats library writes them.
    pub extra_tags: Vec<(String, String)>,
    /// DogStatsD's tag format (`USE_DOG_STATSD`): tags after the value
    /// (`name:1|c|#k:v`) rather than in the name (`name.__k=v:1|c`, as
    /// envoyproxy/ratelimit's plain statsd writes them).
    pub dogstatsd: bool,
}

impl Default for StatsdOptions {
    fn default() -> Self {
        StatsdOptions {
            host: "localhost".to_owned(),
            port: 8125,
            flush_interval: Duration::from_secs(10),
            extra_tags: Vec::new(),
            dogstatsd: false,
        }
    }
}

impl StatsdOptions {
    /// Options sending to `host:port`, the others by default.
    pub fn new(host: impl Into<String>, port: u16) -> Self {
        StatsdOptions {
            host: host.into(),
            port,
            ..StatsdOptions::default()
        }
    }

    /// Reads envoyproxy/ratelimit's `EXTRA_TAGS`: `name:value` pairs
    /// separated by commas (`k1:v1,k2:v2`), a value running to the pair's
    /// end (it may hold `:`); the empty text is no tag.
    ///
    /// # Errors
    ///
    /// [`ExtraTagsError`] for a pair without `:`.
    pub fn parse_extra_tags(text: &str) -> Result<Vec<(String, String)>, ExtraTagsError> {
        if text.is_empty() {
            return Ok(Vec::new());
        }
        text.split(',')
            .map(|pair| match pair.split_once(':') {
                Some((name, value)) => Ok((name.to_owned(), value.to_owned())),
                None => Err(ExtraTagsError { pair: pair.to_owned() }),
            })
            .collect()
    }
}

/// An `EXTRA_TAGS` pair without `:`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("extra tag {pair:?} is not name:value (tags are written k1:v1,k2:v2)")]
#[non_exhaustive]
pub struct ExtraTagsError {
    /// The pair refused.
    pub pair: String,
}

/// Why statsd output could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StatsdError {
    /// The flush interval is 0.
    #[error("the statsd flush interval must be more than 0")]
    ZeroInterval,
    /// The host could not be looked up.
    #[error("cannot look up the statsd server {host}:{port}")]
    Lookup {
        /// The host.
        host: String,
        /// The port.
        port: u16,
        /// Why.
        source: std::io::Error,
    },
    /// The host has no address.
    #[error("the statsd server {host}:{port} has no address")]
    NoAddress {
        /// The host.
        host: String,
        /// The port.
        port: u16,
    },
    /// The UDP socket could not be made.
    #[error("cannot open a UDP socket to send stats to {addr}")]
    Socket {
        /// The statsd server's address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
}

/// The statsd output: the client, and what was sent so far.
pub(crate) struct Statsd {
    client: StatsdClient,
    addr: SocketAddr,
    /// The tags, cleaned and sorted.
    tags: Vec<(String, String)>,
    /// `.__k=v` for each tag, without DogStatsD.
    name_suffix: String,
    dogstatsd: bool,
    /// Each stat's value at the last flush.
    sent: HashMap<String, u64>,
    /// Whether the last flush failed (the log says so once).
    failing: bool,
    /// Sends that failed.
    errors: u64,
}

impl Statsd {
    /// The output `options` describe: the host looked up, a non-blocking
    /// UDP socket opened.
    ///
    /// # Errors
    ///
    /// [`StatsdError`] for a flush interval of 0, a host that cannot be
    /// looked up, or a socket that cannot be opened.
    pub(crate) async fn connect(options: &StatsdOptions) -> Result<Statsd, StatsdError> {
        if options.flush_interval.is_zero() {
            return Err(StatsdError::ZeroInterval);
        }
        let (host, port) = (options.host.as_str(), options.port);
        let addr = tokio::net::lookup_host((host, port))
            .await
            .map_err(|source| StatsdError::Lookup {
                host: host.to_owned(),
                port,
                source,
            })?
            .next()
            .ok_or_else(|| StatsdError::NoAddress {
                host: host.to_owned(),
                port,
            })?;
        let socket_error = |source| StatsdError::Socket { addr, source };
        let local: SocketAddr = if addr.is_ipv4() {
            (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
        } else {
            (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
        };
        let socket = UdpSocket::bind(local).map_err(socket_error)?;
        // A full send buffer drops the datagram rather than block the task.
        socket.set_nonblocking(true).map_err(socket_error)?;
        let sink = BufferedUdpMetricSink::with_capacity(addr, socket, MAX_DATAGRAM)
            .map_err(|e| socket_error(std::io::Error::other(e)))?;
        let mut tags: Vec<(String, String)> = options
            .extra_tags
            .iter()
            .filter(|(k, v)| !k.is_empty() && !v.is_empty())
            .map(|(k, v)| (k.clone(), v.replace(['.', ':', '|'], "_")))
            .collect();
        tags.sort();
        tags.dedup_by(|a, b| a.0 == b.0);
        let name_suffix = tags.iter().map(|(k, v)| format!(".__{k}={v}")).collect();
        Ok(Statsd {
            client: StatsdClient::from_sink("", sink),
            addr,
            tags,
            name_suffix,
            dogstatsd: options.dogstatsd,
            sent: HashMap::new(),
            failing: false,
            errors: 0,
        })
    }

    /// Sends what each stat of `metrics` grew by since the last flush
    /// (nothing for those that did not); the lines sent.
    pub(crate) fn flush(&mut self, metrics: &Metrics) -> usize {
        let mut lines = 0;
        let mut error = None;
        for (name, value) in metrics.upstream_stats() {
            let before = self.sent.get(&name).copied().unwrap_or(0);
            let delta = value.saturating_sub(before);
            if delta == 0 {
                continue;
            }
            let sent = if self.dogstatsd {
                let mut line = self.client.count_with_tags(&name, delta);
                for (k, v) in &self.tags {
                    line = line.with_tag(k, v);
                }
                line.try_send()
            } else {
                let tagged = format!("{name}{}", self.name_suffix);
                self.client.count_with_tags(&tagged, delta).try_send()
            };
            match sent {
                Ok(_) => lines += 1,
                Err(e) => error = Some(e),
            }
            self.sent.insert(name, value);
        }
        if let Err(e) = self.client.flush() {
            error = Some(e);
        }
        match error {
            Some(e) => {
                self.errors += 1;
                if !self.failing {
                    tracing::warn!(
                        addr = %self.addr,
                        error = %e,
                        "cannot send stats to statsd: those of this flush are lost (said once until sending works)"
                    );
                    self.failing = true;
                }
            }
            None if self.failing => {
                tracing::info!(addr = %self.addr, failed = self.errors, "stats reach statsd again");
                self.failing = false;
            }
            None => {}
        }
        lines
    }
}

/// Runs `flush` every `every`, the first time one interval after the
/// start, until `stopped` turns true (the last flush is the stopping
/// server's, once its calls in flight are answered); a late round delays
/// the next.
pub(crate) fn spawn_flushes(
    every: Duration,
    mut stopped: watch::Receiver<bool>,
    mut flush: impl FnMut() + Send + 'static,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => flush(),
                _ = stopped.wait_for(|&s| s) => return,
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn extra_tags_as_envoyproxy_ratelimit_reads_them() {
        let pairs = |list: &[(&str, &str)]| -> Vec<(String, String)> {
            list.iter().map(|&(k, v)| (k.to_owned(), v.to_owned())).collect()
        };
        assert_eq!(StatsdOptions::parse_extra_tags(""), Ok(Vec::new()));
        assert_eq!(
            StatsdOptions::parse_extra_tags("env:prod,url:http://x"),
            Ok(pairs(&[("env", "prod"), ("url", "http://x")]))
        );
        let e = StatsdOptions::parse_extra_tags("env:prod,oops").unwrap_err();
        assert_eq!(e.pair, "oops");
        assert!(e.to_string().contains("\"oops\""), "{e}");
    }

    #[tokio::test]
    async fn a_zero_interval_is_refused() {
        let options = StatsdOptions {
            flush_interval: Duration::ZERO,
            ..StatsdOptions::new("127.0.0.1", 9)
        };
        let e = Statsd::connect(&options).await.err().unwrap();
        assert!(matches!(e, StatsdError::ZeroInterval), "{e}");
    }

    /// The timer task flushes one interval after the start, not before,
    /// then every interval until the stop; on paused time.
    #[tokio::test(start_paused = true)]
    async fn flushes_follow_the_interval_and_the_stop() {
        let receiver = UdpSocket::bind("127.0.0.1:0").unwrap();
        receiver.set_nonblocking(true).unwrap();
        let port = receiver.local_addr().unwrap().port();
        let statsd = Statsd::connect(&StatsdOptions::new("127.0.0.1", port)).await.unwrap();
        let statsd = Arc::new(parking_lot::Mutex::new(statsd));
        let metrics = Arc::new(Metrics::new());
        let (stop, stopped) = watch::channel(false);
        let task = {
            let (statsd, metrics) = (Arc::clone(&statsd), Arc::clone(&metrics));
            spawn_flushes(Duration::from_secs(10), stopped, move || {
                statsd.lock().flush(&metrics);
            })
        };
        let received = || {
            let mut buf = [0u8; 2048];
            let mut lines = Vec::new();
            while let Ok(n) = receiver.recv(&mut buf) {
                assert!(n <= MAX_DATAGRAM);
                lines.extend(String::from_utf8_lossy(&buf[..n]).lines().map(str::to_owned));
            }
            lines
        };
        metrics.reload(true);
        tokio::time::sleep(Duration::from_secs(9)).await;
        assert!(received().is_empty(), "flushed before the interval");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(received(), ["ratelimit.service.config_load_success:1|c"]);
        // Nothing new: nothing sent.
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(received().is_empty());
        metrics.reload(false);
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(received(), ["ratelimit.service.config_load_error:1|c"]);
        metrics.reload(false);
        stop.send(true).unwrap();
        task.await.unwrap();
        tokio::time::sleep(Duration::from_secs(20)).await;
        assert!(received().is_empty(), "flushed after the stop");
    }

    /// Tags in the name or, with DogStatsD, after the value; lines batched
    /// into datagrams of at most 1,432 bytes.
    #[tokio::test]
    async fn tags_and_batches() {
        let receiver = UdpSocket::bind("127.0.0.1:0").unwrap();
        receiver.set_nonblocking(true).unwrap();
        let port = receiver.local_addr().unwrap().port();
        let tags = StatsdOptions::parse_extra_tags("zone:eu.west,app:rl,empty:").unwrap();
        let datagrams = || {
            let mut buf = [0u8; 4096];
            let mut out = Vec::new();
            while let Ok(n) = receiver.recv(&mut buf) {
                out.push(String::from_utf8_lossy(&buf[..n]).into_owned());
            }
            out
        };
        for (dogstatsd, want) in [
            (
                false,
                "ratelimit.service.config_load_success.__app=rl.__zone=eu_west:1|c",
            ),
            (true, "ratelimit.service.config_load_success:1|c|#app:rl,zone:eu_west"),
        ] {
            let options = StatsdOptions {
                extra_tags: tags.clone(),
                dogstatsd,
                ..StatsdOptions::new("127.0.0.1", port)
            };
            let mut statsd = Statsd::connect(&options).await.unwrap();
            let metrics = Metrics::new();
            metrics.reload(true);
            assert_eq!(statsd.flush(&metrics), 1);
            assert_eq!(datagrams(), [format!("{want}\n")]);
        }

        // Many stats: several datagrams, none past the limit, no line cut.
        let mut statsd = Statsd::connect(&StatsdOptions::new("127.0.0.1", port)).await.unwrap();
        let metrics = Metrics::new();
        let hits = super::super::Hits {
            total: 2,
            within: 1,
            over: 1,
            ..Default::default()
        };
        for i in 0..100 {
            metrics.rule("d", &format!("{}_{i}", "k".repeat(40)), true, Some(hits));
        }
        assert_eq!(statsd.flush(&metrics), 300);
        let got = datagrams();
        // About 90 bytes a line: 15 lines a datagram, not one.
        assert!((2..=25).contains(&got.len()), "{} datagrams", got.len());
        let mut lines = 0;
        for datagram in &got {
            assert!(datagram.len() <= MAX_DATAGRAM, "{}", datagram.len());
            for line in datagram.lines() {
                let (name, value) = line.split_once(':').unwrap();
                assert!(name.starts_with("ratelimit.service.rate_limit.d.kkkk"), "{line}");
                assert!(["1|c", "2|c"].contains(&value), "{line}");
                lines += 1;
            }
        }
        assert_eq!(lines, 300);
        // Sent: nothing more until they grow.
        assert_eq!(statsd.flush(&metrics), 0);
    }
}
