//! The crate graph that ARCHITECTURE.md draws is the workspace's: each
//! crate depends (normal and build dependencies) on exactly the workspace
//! crates its line in the "Crate graph" block names, as `cargo metadata`
//! reads the manifests. A new dependency between crates is a change of
//! the architecture: draw it there first.

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

type Graph = BTreeMap<String, BTreeSet<String>>;

/// The graph ARCHITECTURE.md draws: the lines `crate -> a, b` (or
/// `crate -> nothing`) of the fenced block after the heading
/// "## Crate graph".
fn drawn(text: &str) -> Graph {
    let section = text
        .split("\n## Crate graph")
        .nth(1)
        .expect("ARCHITECTURE.md has a \"## Crate graph\" section");
    let block = section
        .split("```")
        .nth(1)
        .expect("the \"Crate graph\" section has a fenced block");
    let mut graph = Graph::new();
    for line in block.lines().skip(1).filter(|l| !l.trim().is_empty()) {
        let (name, deps) = line
            .split_once("->")
            .unwrap_or_else(|| panic!("a crate graph line is `crate -> deps`: {line:?}"));
        let deps = match deps.trim() {
            "nothing" => BTreeSet::new(),
            deps => deps.split(',').map(|d| d.trim().to_owned()).collect(),
        };
        let before = graph.insert(name.trim().to_owned(), deps);
        assert!(before.is_none(), "{} is drawn twice", name.trim());
    }
    graph
}

/// The graph of the workspace's manifests: each member and the members it
/// depends on (normal and build dependencies; dev-dependencies are the
/// tests' business).
fn manifests(root: &Path) -> Graph {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let output = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline"])
        .current_dir(root)
        .output()
        .expect("cargo metadata runs");
    assert!(
        output.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: Value = serde_json::from_slice(&output.stdout).expect("cargo metadata prints JSON");
    let packages = metadata["packages"].as_array().expect("packages");
    let members: BTreeSet<String> = packages
        .iter()
        .map(|p| p["name"].as_str().expect("name").to_owned())
        .collect();
    packages
        .iter()
        .map(|p| {
            let deps = p["dependencies"]
                .as_array()
                .expect("dependencies")
                .iter()
                .filter(|d| d["kind"].as_str() != Some("dev"))
                .filter_map(|d| d["name"].as_str())
                .filter(|name| members.contains(*name))
                .map(str::to_owned)
                .collect();
            (p["name"].as_str().expect("name").to_owned(), deps)
        })
        .collect()
}

#[test]
fn the_crates_depend_on_each_other_as_architecture_md_draws() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let text = std::fs::read_to_string(root.join("ARCHITECTURE.md")).expect("ARCHITECTURE.md reads");
    let drawn = drawn(&text);
    let actual = manifests(&root);
    let mut wrong = Vec::new();
    for name in drawn.keys().chain(actual.keys()).collect::<BTreeSet<_>>() {
        match (drawn.get(name), actual.get(name)) {
            (Some(d), Some(a)) if d == a => {}
            (Some(d), Some(a)) => wrong.push(format!(
                "{name}: drawn -> {d:?}, its manifest -> {a:?} (extra: {:?}, missing: {:?})",
                a.difference(d).collect::<Vec<_>>(),
                d.difference(a).collect::<Vec<_>>()
            )),
            (Some(_), None) => wrong.push(format!("{name}: drawn, but not a workspace member")),
            (None, Some(a)) => wrong.push(format!("{name}: a workspace member (-> {a:?}) that is not drawn")),
            (None, None) => unreachable!(),
        }
    }
    assert!(
        wrong.is_empty(),
        "ARCHITECTURE.md's crate graph is not the workspace's:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_drawn_graph_reads_lines_and_refuses_what_is_not_one() {
    let text = "# A\n\n## Crate graph\n\n```text\na -> nothing\nb -> a\nc -> a, b\n```\n";
    let graph = drawn(text);
    assert_eq!(graph.len(), 3);
    assert!(graph["a"].is_empty());
    assert_eq!(graph["c"], BTreeSet::from(["a".to_owned(), "b".to_owned()]));
    let bad = std::panic::catch_unwind(|| drawn("## Crate graph\n```text\na depends on b\n```\n"));
    assert!(bad.is_err());
}
