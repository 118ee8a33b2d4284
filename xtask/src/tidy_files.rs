//! What the file-reading tidy tests share: the repository's files, folder by folder.

use std::fs;
use std::path::{Path, PathBuf};

/// Folders no tidy test reads: build output and what is not the project's.
pub(crate) const NOT_THE_PROJECT: &[&str] = &["target", ".git", ".carry", ".nccltests", "node_modules", "__pycache__"];

/// Every file below `dir` whose extension is in `extensions` (every file where it is empty),
/// leaving out the folders named in [`NOT_THE_PROJECT`] and in `skip`.
pub(crate) fn files_below(dir: &Path, extensions: &[&str], skip: &[&str]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(dir) = todo.pop() {
        let Ok(entries) = fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if path.is_dir() {
                if !NOT_THE_PROJECT.contains(&name.as_str()) && !skip.contains(&name.as_str()) {
                    todo.push(path);
                }
            } else if extensions.is_empty()
                || path.extension().is_some_and(|e| extensions.contains(&e.to_string_lossy().as_ref()))
            {
                out.push(path);
            }
        }
    }
    out
}
