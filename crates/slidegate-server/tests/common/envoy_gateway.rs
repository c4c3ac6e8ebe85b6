//! Envoy Gateway's translator test data, vendored unchanged in
//! `tests/data/envoy-gateway/` (see its README): for each case `NAME`, the
//! rate limit service's configs in `NAME.yaml` (one `RateLimitConfig` per
//! YAML document, as Envoy Gateway sends them one resource each) and
//! Envoy's routes in `NAME.routes.yaml` (one route per document, its
//! `rate_limits` actions by domain).
#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};

/// The folder of the data.
pub fn folder() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/envoy-gateway")
}

/// Every case's name (`NAME` of `NAME.yaml` and `NAME.routes.yaml`),
/// sorted.
pub fn names() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(folder())
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .filter_map(|file| file.strip_suffix(".routes.yaml").map(str::to_owned))
        .collect();
    names.sort();
    names
}

/// The YAML documents of `text`, split at its `---` lines.
pub fn documents(text: &str) -> Vec<String> {
    let mut documents = vec![String::new()];
    for line in text.lines() {
        if line.trim_end() == "---" {
            documents.push(String::new());
        } else {
            let last = documents.last_mut().unwrap();
            last.push_str(line);
            last.push('\n');
        }
    }
    documents.retain(|d| !d.trim().is_empty());
    documents
}

/// The configs of the case `name`, one per document, in file order.
pub fn case_configs(name: &str) -> Vec<String> {
    documents(&std::fs::read_to_string(folder().join(format!("{name}.yaml"))).unwrap())
}

/// The routes of the case `name`, one YAML document each, in file order.
pub fn case_routes(name: &str) -> Vec<String> {
    documents(&std::fs::read_to_string(folder().join(format!("{name}.routes.yaml"))).unwrap())
}

/// Every `RateLimitConfig` of the data, as (a name, its YAML): the name is
/// the case's, with `#i` after it for the i-th document (from 0) of a case
/// with several. Several cases reuse a domain (`first-listener`), so the
/// configs of one case belong together, those of two cases do not.
pub fn configs() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for name in names() {
        let documents = case_configs(&name);
        let several = documents.len() > 1;
        for (i, yaml) in documents.into_iter().enumerate() {
            let label = if several { format!("{name}#{i}") } else { name.clone() };
            out.push((label, yaml));
        }
    }
    out
}
