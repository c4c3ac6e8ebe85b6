//! What `deploy/` ships, checked against the real tools: the Dockerfile's
//! build and run steps (without a Docker daemon), the compose demo's
//! Envoy actions against its slidegate config, the Kubernetes manifests
//! against the Kubernetes OpenAPI schemas, the systemd unit with
//! `systemd-analyze verify`, and the Prometheus rules and the Grafana
//! dashboard against a real Prometheus scraping a real `slidegate serve`.
//!
//! The tools are not optional: a missing one fails its test with the
//! command that installs it (`.ci/run` installs them all).

#[path = "../common/mod.rs"]
mod common;

mod docker;
mod envoy;
mod kubernetes;
mod prometheus;
mod systemd;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The repository's root.
pub(crate) fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A file of `deploy/`.
pub(crate) fn deploy(path: &str) -> PathBuf {
    root().join("deploy").join(path)
}

/// The text of a file of `deploy/`.
pub(crate) fn read(path: &str) -> String {
    let file = deploy(path);
    std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()))
}

/// `program` with `args`, run to its end; panics naming `install` (how a
/// fresh machine gets it) when the program is not there.
pub(crate) fn run(program: &str, args: &[&str], install: &str) -> Output {
    tool(program, install).args(args).output().unwrap()
}

/// A command for `program`, which must be installed: a missing tool fails
/// the test with how to install it.
pub(crate) fn tool(program: &str, install: &str) -> Command {
    let found = std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
        .unwrap_or(false);
    assert!(
        found,
        "`{program}` is needed by this test and is not on PATH: {install}"
    );
    Command::new(program)
}

/// `output` as one text to read in a failure: status, stdout, stderr.
pub(crate) fn shown(output: &Output) -> String {
    format!(
        "{}\n--- stdout\n{}\n--- stderr\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}
