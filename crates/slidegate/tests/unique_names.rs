//! No two different public items of one name are reachable from this
//! crate: `slidegate::Store` and `slidegate::memory::...` must never be two
//! things called the same.
//!
//! Read from the sources (this crate's `lib.rs` and the `lib.rs` of every
//! crate it re-exports, with their public modules), as rustfmt writes them:
//! every name reachable through the facade is listed with the item it
//! stands for (the crate that defines it and its own name there), and a
//! name standing for two items fails the test. The hidden modules count
//! too (`#[doc(hidden)]` hides an item from the docs, not from users).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// An item: the crate that defines it (its library name) and its name
/// there.
type Item = (String, String);

fn crates_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The source of `path` without comments, strings or char literals.
fn code(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        if text[i..].starts_with("//") {
            i = text[i..].find('\n').map_or(b.len(), |n| i + n);
        } else if text[i..].starts_with("/*") {
            i = text[i + 2..].find("*/").map_or(b.len(), |n| i + 2 + n + 2);
        } else if b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if b[i] == b'\'' && char_literal(&text[i..]).is_some() {
            i += char_literal(&text[i..]).unwrap();
            out.push_str("' '");
        } else if text[i..].starts_with("r#\"") {
            i = text[i + 3..].find("\"#").map_or(b.len(), |n| i + 3 + n + 2);
            out.push_str("\"\"");
        } else {
            let c = text[i..].chars().next().unwrap();
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// The length of the char literal `s` starts with, if it is one (and not
/// a lifetime).
fn char_literal(s: &str) -> Option<usize> {
    let mut chars = s.char_indices().skip(1);
    let (_, c) = chars.next()?;
    if c == '\\' {
        return s[2..].find('\'').map(|n| 2 + n + 1);
    }
    let (at, close) = chars.next()?;
    (close == '\'').then_some(at + 1)
}

/// The names a use tree (`a::{b::C, D as E, f::*}`) brings in: (the path
/// to the item, the name it is reachable under); a glob's name is `*`.
fn use_tree(prefix: &[String], tree: &str, out: &mut Vec<(Vec<String>, String)>) {
    let tree = tree.trim();
    if tree.is_empty() {
        return;
    }
    if let Some(open) = tree.find('{') {
        let head: Vec<String> = tree[..open]
            .split("::")
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect();
        let close = tree.rfind('}').expect("a use tree's braces close");
        let mut path = prefix.to_vec();
        path.extend(head);
        let (mut depth, mut start) = (0, open + 1);
        for (i, c) in tree.char_indices().take(close).skip(open + 1) {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    use_tree(&path, &tree[start..i], out);
                    start = i + 1;
                }
                _ => {}
            }
        }
        use_tree(&path, &tree[start..close], out);
        return;
    }
    let (path, alias) = match tree.split_once(" as ") {
        Some((p, a)) => (p, Some(a.trim().to_string())),
        None => (tree, None),
    };
    let mut full = prefix.to_vec();
    full.extend(path.split("::").map(|s| s.trim().to_string()));
    let last = full.last().cloned().unwrap_or_default();
    if last == "self" {
        return; // a module, not an item
    }
    out.push((full, alias.unwrap_or(last)));
}

/// The library name of a workspace crate named by a path's first segment,
/// or `None` for a module of the crate itself.
fn crate_of(first: &str) -> Option<&str> {
    first.starts_with("slidegate").then_some(first)
}

/// Every public item of crate `krate` (library name) reachable from its
/// root, by the name it is reachable under (any module).
fn crate_items(krate: &str, seen: &mut BTreeSet<String>, out: &mut Vec<(String, Item)>) {
    if !seen.insert(krate.to_string()) {
        return;
    }
    let dir = crates_dir().join(krate.replace('_', "-")).join("src");
    module_items(krate, &dir.join("lib.rs"), &dir, seen, out);
}

/// The public items of the module in `file` (whose child modules are in
/// `dir`), and those of its public child modules.
fn module_items(krate: &str, file: &Path, dir: &Path, seen: &mut BTreeSet<String>, out: &mut Vec<(String, Item)>) {
    let code = code(file);
    // Top-level lines, and those of inline `pub mod name {` blocks.
    let mut lines: Vec<String> = Vec::new();
    let mut inline = false;
    let mut statement = String::new();
    for line in code.lines() {
        let level = if inline { "    " } else { "" };
        if !inline && line.starts_with("pub mod ") && line.trim_end().ends_with('{') {
            inline = true;
            continue;
        }
        if inline && line.starts_with('}') {
            inline = false;
            continue;
        }
        let Some(rest) = line.strip_prefix(level) else {
            continue;
        };
        if rest.starts_with(' ') || rest.starts_with('}') {
            if !statement.is_empty() {
                statement.push_str(rest);
                if rest.trim_end().ends_with(';') {
                    lines.push(std::mem::take(&mut statement));
                }
            }
            continue;
        }
        if rest.starts_with("pub use ") && !rest.trim_end().ends_with(';') {
            statement = rest.to_string();
        } else {
            lines.push(rest.to_string());
        }
    }
    for line in lines {
        if let Some(tree) = line.strip_prefix("pub use ") {
            let mut names = Vec::new();
            use_tree(&[], tree.trim_end().trim_end_matches(';'), &mut names);
            for (path, name) in names {
                let first = path.first().map(String::as_str).unwrap_or("");
                let local = ["crate", "self", "super"].contains(&first)
                    || dir.join(format!("{first}.rs")).exists()
                    || dir.join(first).join("mod.rs").exists();
                let owner = match crate_of(first) {
                    Some(other) => other.to_string(),
                    None if local => krate.to_string(),
                    // Another crate's item (`pub use http::HeaderValue`).
                    None => first.to_string(),
                };
                let item = path.last().cloned().unwrap_or_default();
                if name == "*" {
                    assert!(
                        crate_of(first).is_some() && path.len() == 2,
                        "{}: only whole-crate globs are read: {line}",
                        file.display()
                    );
                    crate_items(&owner, seen, out);
                    // The crate's items are reachable here as well, as the same items.
                } else {
                    out.push((name, (owner, item)));
                }
            }
            continue;
        }
        let Some(rest) = line.strip_prefix("pub ") else {
            continue;
        };
        let rest = rest.trim_start_matches("unsafe ").trim_start_matches("async ");
        let Some((kind, tail)) = rest.split_once(' ') else {
            continue;
        };
        let name: String = tail.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        match kind {
            "mod" => {
                let sub = if file.ends_with("lib.rs") || file.ends_with("mod.rs") {
                    dir.to_path_buf()
                } else {
                    dir.join(file.file_stem().unwrap())
                };
                let path = [sub.join(format!("{name}.rs")), sub.join(&name).join("mod.rs")]
                    .into_iter()
                    .find(|p| p.exists());
                if let Some(path) = path {
                    let child = path.parent().unwrap().to_path_buf();
                    module_items(krate, &path, &child, seen, out);
                }
            }
            "struct" | "enum" | "trait" | "type" | "union" | "const" | "static" | "fn" => {
                out.push((name.clone(), (krate.to_string(), name)));
            }
            _ => {}
        }
    }
}

#[test]
fn no_two_public_items_share_a_name() {
    let mut seen = BTreeSet::new();
    let mut items = Vec::new();
    let lib = crates_dir().join("slidegate").join("src");
    module_items("slidegate", &lib.join("lib.rs"), &lib, &mut seen, &mut items);
    // The facade's own re-exports, and every crate it opens in full.
    for facade_crate in ["slidegate_core", "slidegate_store", "slidegate_memory"] {
        assert!(seen.contains(facade_crate), "the facade no longer opens {facade_crate}");
    }
    let mut by_name: BTreeMap<String, BTreeSet<Item>> = BTreeMap::new();
    for (name, item) in items {
        by_name.entry(name).or_default().insert(item);
    }
    assert!(by_name.len() > 50, "too few names read: {by_name:?}");
    let repeated: Vec<String> = by_name
        .iter()
        .filter(|(_, items)| items.len() > 1)
        .map(|(name, items)| {
            let owners: Vec<String> = items.iter().map(|(c, n)| format!("{c}::{n}")).collect();
            format!("{name}: {}", owners.join(", "))
        })
        .collect();
    assert!(
        repeated.is_empty(),
        "names reachable from `slidegate` for two different items:\n{}",
        repeated.join("\n")
    );
}
