//! Noticing that files changed: a fingerprint of their names, lengths and
//! modification times, which the config watcher and the TLS files' reload
//! compare from one look to the next.

use std::path::PathBuf;
use std::time::SystemTime;

/// A file's name, length and modification time.
pub(crate) type FileStamp = (PathBuf, u64, Option<SystemTime>);

/// A fingerprint of files (or folders of them, one level): their names,
/// lengths and modification times, to notice a change.
pub(crate) fn fingerprint(paths: &[PathBuf]) -> Vec<FileStamp> {
    let mut out = Vec::new();
    for path in paths {
        let mut files = vec![path.clone()];
        if let Ok(dir) = std::fs::read_dir(path) {
            files = dir.filter_map(|e| e.ok().map(|e| e.path())).collect();
            files.sort();
        }
        for file in files {
            let meta = std::fs::metadata(&file).ok();
            let len = meta.as_ref().map_or(0, std::fs::Metadata::len);
            let modified = meta.and_then(|m| m.modified().ok());
            out.push((file, len, modified));
        }
    }
    out
}
