//! slidegate's fuzz targets as plain functions of the fuzzer's bytes.
//!
//! Each target panics only when an invariant is broken (or when the code
//! under test panics on its own): the cargo-fuzz wrappers in `fuzz/` call
//! them under libFuzzer, and `tests/corpus.rs` replays the committed corpus
//! (`fuzz/corpus/<target>/`) through them as an ordinary test, so CI needs
//! no fuzzer.
//!
//! - [`config_yaml`]: envoyproxy/ratelimit's YAML ([`Config::parse_domain`],
//!   [`Config::from_domains`], matching);
//! - [`json_request`]: `POST /json`, `/v1/check` and `/v1/reset` through
//!   the real HTTP router, in-process;
//! - [`grpc_request`]: a protobuf `RateLimitRequest` through the wire
//!   conversion and [`Engine::decide`];
//! - [`core_states`]: the core's state machines under `(time, cost)`
//!   sequences, against the exact oracles of `slidegate-conformance`.
//!
//! See `fuzz/README.md` for how to run them and what they found.
#![forbid(unsafe_code)]

mod core;
mod server;

pub use crate::core::core_states;
pub use crate::server::{config_yaml, grpc_request, json_request};

#[cfg(doc)]
use slidegate_server::{config::Config, engine::Engine};

/// The names of the targets, as the corpus directories are named.
pub const TARGETS: [&str; 4] = ["config_yaml", "json_request", "grpc_request", "core_states"];

/// Runs the target called `name` on `data`; `false` if there is no such
/// target.
pub fn run(name: &str, data: &[u8]) -> bool {
    match name {
        "config_yaml" => config_yaml(data),
        "json_request" => json_request(data),
        "grpc_request" => grpc_request(data),
        "core_states" => core_states(data),
        _ => return false,
    }
    true
}

/// Reads numbers off the fuzzer's bytes, giving zeros once they run out,
/// so that every input means something.
#[derive(Debug)]
pub(crate) struct Bytes<'a> {
    data: &'a [u8],
}

impl<'a> Bytes<'a> {
    pub(crate) fn new(data: &'a [u8]) -> Self {
        Bytes { data }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    pub(crate) fn u8(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&b, rest)) => {
                self.data = rest;
                b
            }
            None => 0,
        }
    }

    pub(crate) fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    pub(crate) fn u64(&mut self) -> u64 {
        let mut bytes = [0; 8];
        for b in &mut bytes {
            *b = self.u8();
        }
        u64::from_le_bytes(bytes)
    }

    /// A number in `lo..=hi`.
    pub(crate) fn range(&mut self, lo: u64, hi: u64) -> u64 {
        let span = hi - lo + 1;
        lo + if span <= 256 {
            u64::from(self.u8()) % span
        } else {
            u64::from(self.u16()) % span
        }
    }
}
