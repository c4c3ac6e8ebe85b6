//! Replays the committed fuzz corpus (`fuzz/corpus/<target>/`) through
//! the targets, so that CI checks every input the fuzzer kept, and every
//! crash it found (`fuzz/regressions/<target>/`), without a fuzzer.

use std::path::{Path, PathBuf};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

/// Every file under `dir`, sorted; none if it does not exist.
fn files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

fn replay(target: &str) {
    let corpus = files(&fuzz_dir().join("corpus").join(target));
    assert!(!corpus.is_empty(), "no corpus for {target}");
    let regressions = files(&fuzz_dir().join("regressions").join(target));
    for path in corpus.iter().chain(&regressions) {
        let data = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let result = std::panic::catch_unwind(|| slidegate_fuzz::run(target, &data));
        match result {
            Ok(known) => assert!(known, "no target {target}"),
            Err(_) => panic!("{target} failed on {}", path.display()),
        }
    }
}

#[test]
fn config_yaml() {
    replay("config_yaml");
}

#[test]
fn json_request() {
    replay("json_request");
}

#[test]
fn grpc_request() {
    replay("grpc_request");
}

#[test]
fn core_states() {
    replay("core_states");
}

#[test]
fn every_target_has_a_test() {
    assert_eq!(
        slidegate_fuzz::TARGETS,
        ["config_yaml", "json_request", "grpc_request", "core_states"]
    );
}
