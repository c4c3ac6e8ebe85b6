//! Every Rust block of the guides is compiled: the README and each
//! `docs/*.md` are included in this crate's docs (the README as its front
//! page, `docs/` under `slidegate::guide`), so `cargo test --doc` builds
//! and runs their Rust blocks against `slidegate` alone. This test holds
//! the guides to that:
//!
//! - every fenced block names its language: a bare fence is Rust to
//!   rustdoc, so a shell line in one fails the doctests, and a Rust block
//!   with no name is easy to take for text;
//! - a Rust block (```` ```rust ````, or rustdoc's attributes alone) is
//!   compiled: `no_run`, `should_panic` and `compile_fail` are fine,
//!   `ignore` is refused (a block that does not compile is a stale
//!   block);
//! - a Rust block uses `slidegate::` paths, not the crates behind the
//!   facade (`slidegate_core`, `slidegate_tower`, ...): the reader depends
//!   on `slidegate`;
//! - every `docs/*.md` file is included by `src/lib.rs`, so that a new
//!   guide cannot escape the doctests.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The attributes rustdoc reads on a Rust block; any other word names
/// another language.
const RUST_ATTRIBUTES: &[&str] = &[
    "rust",
    "no_run",
    "should_panic",
    "compile_fail",
    "ignore",
    "edition2015",
    "edition2018",
    "edition2021",
    "edition2024",
    "test_harness",
    "standalone_crate",
];

/// The crates behind the facade, which a guide's Rust block must not name.
const BEHIND_THE_FACADE: &[&str] = &[
    "slidegate_core",
    "slidegate_store",
    "slidegate_memory",
    "slidegate_tower",
    "slidegate_redis",
];

/// What is wrong with the fenced blocks of `text` (a Markdown file named
/// `name`), one line per problem.
fn problems(name: &str, text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut lines = text.lines().enumerate();
    while let Some((at, line)) = lines.next() {
        let trimmed = line.trim_start();
        let Some(fence) = ["```", "~~~"].into_iter().find(|f| trimmed.starts_with(f)) else {
            continue;
        };
        let mark = fence.chars().next().unwrap_or('`');
        let width = trimmed.chars().take_while(|&c| c == mark).count();
        let info = trimmed[width..].trim();
        let words: Vec<&str> = info
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|w| !w.is_empty())
            .collect();
        let mut body = String::new();
        for (_, inner) in lines.by_ref() {
            let inner_trimmed = inner.trim();
            if inner_trimmed.chars().take_while(|&c| c == mark).count() >= width
                && inner_trimmed.chars().all(|c| c == mark)
            {
                break;
            }
            body.push_str(inner);
            body.push('\n');
        }
        let line_no = at + 1;
        if words.is_empty() {
            out.push(format!(
                "{name}:{line_no}: a block without a language: rustdoc compiles it as Rust; \
                 name it (`rust`, `sh`, `text`, `yaml`, `json`)"
            ));
            continue;
        }
        let rust = words.iter().all(|w| RUST_ATTRIBUTES.contains(w));
        if !rust {
            continue;
        }
        if words.contains(&"ignore") {
            out.push(format!(
                "{name}:{line_no}: an `ignore`d Rust block is never compiled: make it compile \
                 (`no_run` if it must not run)"
            ));
        }
        for krate in BEHIND_THE_FACADE {
            if body.contains(krate) {
                out.push(format!(
                    "{name}:{line_no}: a Rust block names `{krate}`: use the `slidegate::` path"
                ));
            }
        }
    }
    out
}

/// The guides: the README and every Markdown file of `docs/`.
fn guides() -> Vec<PathBuf> {
    let mut files = vec![root().join("README.md")];
    let docs = std::fs::read_dir(root().join("docs")).expect("docs/ is read");
    let mut docs: Vec<PathBuf> = docs
        .map(|entry| entry.expect("a docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    assert!(!docs.is_empty(), "no docs/*.md found");
    files.extend(docs);
    files
}

#[test]
fn every_rust_block_of_the_guides_is_compiled_against_the_facade() {
    let mut found = Vec::new();
    for path in guides() {
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let name = path.strip_prefix(root()).unwrap_or(&path).display().to_string();
        found.extend(problems(&name, &text));
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn every_guide_is_included_in_the_crate_docs() {
    let lib = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs")).expect("lib.rs");
    let mut missing = Vec::new();
    for path in guides() {
        let relative = path.strip_prefix(root()).expect("under the root").display().to_string();
        let include = format!("include_str!(\"../../../{relative}\")");
        if !lib.contains(&include) {
            missing.push(format!("{relative}: add `#[doc = {include}]` to src/lib.rs"));
        }
    }
    assert!(
        missing.is_empty(),
        "guides the doctests do not see:\n{}",
        missing.join("\n")
    );
}

/// The rules catch what they are for.
#[test]
fn the_rules_refuse_bad_blocks() {
    let check = |text: &str, expect: &[&str]| {
        let found = problems("t.md", text);
        assert_eq!(found.len(), expect.len(), "{found:?}");
        for (problem, words) in found.iter().zip(expect) {
            assert!(problem.contains(words), "{problem} lacks {words}");
        }
    };
    check("```\nls\n```\n", &["t.md:1: a block without a language"]);
    check("text\n\n```ignore\nlet x = 1;\n```\n", &["t.md:3: an `ignore`d"]);
    check("```rust,ignore\nlet x = 1;\n```\n", &["`ignore`d"]);
    check(
        "```rust\nuse slidegate_core::Policy;\n```\n",
        &["names `slidegate_core`"],
    );
    check(
        "```no_run\nuse slidegate_redis::RedisOptions;\n```\n",
        &["`slidegate_redis`"],
    );
    // Fine: other languages, and Rust that is compiled.
    check("```sh\ncargo test\n```\n```text\nslidegate_core\n```\n", &[]);
    check(
        "```rust\nuse slidegate::Policy;\n```\n```rust,no_run\n```\n```compile_fail\n```\n",
        &[],
    );
    // A longer fence holds a shorter one.
    check("````text\n```\n````\n", &[]);
}
