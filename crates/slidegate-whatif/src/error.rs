//! Why a replay cannot start.

use slidegate_server::config::ConfigError;

/// Why a [`Replay`](crate::Replay) cannot start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WhatIfError {
    /// The config does not load (file, line, column and key), as `serve`
    /// would refuse it.
    #[error("{0}")]
    Config(ConfigError),
    /// The requests' domain is not in the config.
    #[error("domain `{domain}` is not in the config: it has {}", known_list(.known))]
    UnknownDomain {
        /// The domain asked for.
        domain: String,
        /// The domains the config has.
        known: Vec<String>,
    },
    /// Every descriptor is empty: no request would be sent.
    #[error("no descriptor: give its entries with --descriptor KEY=FIELD")]
    NoDescriptor,
    /// The runtime that runs a decision which does not complete at once
    /// cannot start.
    #[error("starting the replay's runtime")]
    Runtime(#[source] std::io::Error),
}

/// `` `a`, `b` ``, or `no domains`.
fn known_list(known: &[String]) -> String {
    if known.is_empty() {
        "no domains".to_owned()
    } else {
        known.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")
    }
}
