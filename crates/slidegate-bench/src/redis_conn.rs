//! The bench's Redis connections: loopback servers only, every call bounded
//! by [`TIMEOUT`], and the run's keys deleted at the end ([`clean`]); used
//! by the `redis` and `hybrid` groups.

use anyhow::{Context, Result, bail};
use redis::aio::MultiplexedConnection;
use std::net::IpAddr;
use std::time::Duration;

/// The bound of connecting and of every call: a dead or stuck server is an
/// error, never a hang.
pub(crate) const TIMEOUT: Duration = Duration::from_secs(2);

/// Refuses a URL that does not parse or does not name a loopback host.
pub(crate) fn loopback_client(url: &str) -> Result<redis::Client> {
    let client = redis::Client::open(url).with_context(|| format!("--redis {url}: not a Redis URL"))?;
    let host = match client.get_connection_info().addr() {
        redis::ConnectionAddr::Tcp(host, _) => host.clone(),
        redis::ConnectionAddr::TcpTls { host, .. } => host.clone(),
        _ => bail!(
            "--redis {url}: not a TCP address; benchmarks only talk to loopback servers (127.0.0.1, ::1 or localhost)"
        ),
    };
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let loopback = bare.eq_ignore_ascii_case("localhost") || bare.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback());
    anyhow::ensure!(
        loopback,
        "--redis {url}: {host} is not loopback; benchmarks only talk to loopback servers (127.0.0.1, ::1 or localhost)"
    );
    Ok(client)
}

/// One multiplexed connection, connected and answering `PING` within
/// [`TIMEOUT`].
pub(crate) async fn connect(url: &str) -> Result<MultiplexedConnection> {
    let client = loopback_client(url)?;
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(TIMEOUT))
        .set_response_timeout(Some(TIMEOUT));
    let mut conn = tokio::time::timeout(TIMEOUT, client.get_multiplexed_async_connection_with_config(&config))
        .await
        .map_err(|_| anyhow::anyhow!("--redis {url}: no connection within {TIMEOUT:?}"))?
        .with_context(|| format!("--redis {url}: cannot connect"))?;
    let _: String = tokio::time::timeout(TIMEOUT, redis::cmd("PING").query_async(&mut conn))
        .await
        .map_err(|_| anyhow::anyhow!("--redis {url}: no answer to PING within {TIMEOUT:?}"))?
        .with_context(|| format!("--redis {url}: PING failed"))?;
    Ok(conn)
}

/// Deletes every key under `prefix`: `SCAN` with `MATCH`, `UNLINK`.
pub(crate) async fn clean(conn: &MultiplexedConnection, prefix: &str) -> Result<()> {
    let mut conn = conn.clone();
    let pattern = format!("{prefix}*");
    let mut cursor = 0u64;
    loop {
        let (next, keys): (u64, Vec<String>) = tokio::time::timeout(
            TIMEOUT,
            redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut conn),
        )
        .await
        .map_err(|_| anyhow::anyhow!("no answer to SCAN within {TIMEOUT:?}"))?
        .context("SCAN")?;
        if !keys.is_empty() {
            let _: u64 = tokio::time::timeout(TIMEOUT, redis::cmd("UNLINK").arg(&keys).query_async(&mut conn))
                .await
                .map_err(|_| anyhow::anyhow!("no answer to UNLINK within {TIMEOUT:?}"))?
                .context("UNLINK")?;
        }
        if next == 0 {
            return Ok(());
        }
        cursor = next;
    }
}
