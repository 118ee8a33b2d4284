//! Comments cite only what a reader can open: a path in a comment that starts at one of the
//! repository's top folders (`crates/…`, `benches/results/…`), or a bare `*.md` file name,
//! names a file of the repository, from its root or from the crate the comment is in; or a
//! file of its history, cited with its commit (`git show <commit>:<path>`, or `<path>` at
//! <commit>). A figure a comment relies on lives in benches/results and is cited by that
//! path; notes kept outside the repository are not cited.

use std::fs;
use std::path::{Path, PathBuf};

/// The repository's top folders a cited path may start with.
const TOP: &[&str] = &["crates/", "kernels/", "benches/", "tests/", "docs/", "xtask/", ".ci/"];
/// Source files whose comments are read.
const SOURCES: &[&str] = &["rs", "py", "cu", "cuh", "sh"];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The comment of `line` in a file of `extension`, if it has one.
fn comment<'a>(line: &'a str, extension: &str) -> Option<&'a str> {
    let t = line.trim_start();
    match extension {
        "rs" | "cu" | "cuh" => t.find("//").map(|i| &t[i + 2..]),
        _ => t.strip_prefix('#'),
    }
}

/// The paths `comment` cites: tokens starting with a top folder, and bare `*.md` names; a
/// path cited with its commit (`git show abc1234:path`, `path` at abc1234) is history, which
/// git opens, and is left out.
fn cited(comment: &str) -> Vec<String> {
    let token_char = |c: char| c.is_alphanumeric() || "_-./".contains(c);
    let is_commit = |w: &str| w.len() >= 7 && w.chars().all(|c| c.is_ascii_hexdigit());
    let mut historic = Vec::new();
    let words: Vec<&str> = comment.split_whitespace().collect();
    for (i, word) in words.iter().enumerate() {
        let bare = word.trim_matches(|c: char| !token_char(c) && c != ':');
        if let Some((rev, path)) = bare.split_once(':')
            && is_commit(rev)
        {
            historic.push(path.trim_end_matches(|c: char| !token_char(c) || c == '.' || c == '/').to_string());
        }
        if words.get(i + 1) == Some(&"at")
            && words.get(i + 2).is_some_and(|w| is_commit(w.trim_matches(|c: char| !c.is_ascii_hexdigit())))
        {
            historic.push(word.trim_matches(|c: char| !token_char(c)).trim_end_matches(['.', '/']).to_string());
        }
    }
    comment
        .split(|c: char| !token_char(c))
        .filter(|t| !historic.iter().any(|h| h == t.trim_end_matches(['.', '/'])))
        .map(|t| t.trim_end_matches(['.', '/']))
        .filter(|t| {
            let top = TOP.iter().any(|d| t.starts_with(d)) && t.rsplit('/').next().is_some_and(|f| f.contains('.'));
            let bare_md = !t.contains('/') && t.ends_with(".md") && t.len() > 3;
            top || bare_md
        })
        .map(String::from)
        .collect()
}

/// The folder of the crate `file` belongs to: the nearest one above it with a Cargo.toml.
fn crate_of(file: &Path) -> Option<&Path> {
    file.ancestors().skip(1).find(|d| d.join("Cargo.toml").exists())
}

#[test]
fn comments_cite_only_files_of_the_repository() {
    let root = root();
    let files = crate::tidy_files::files_below(&root, &[], &[]);
    let names: std::collections::BTreeSet<String> =
        files.iter().filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned())).collect();
    let mut missing = Vec::new();
    let mut read = 0;
    for file in &files {
        let Some(ext) = file.extension().map(|e| e.to_string_lossy().into_owned()) else { continue };
        if !SOURCES.contains(&ext.as_str()) || file.ends_with("xtask/src/tidy_comments.rs") {
            continue;
        }
        let Ok(text) = fs::read_to_string(file) else { continue };
        read += 1;
        for (n, line) in text.lines().enumerate() {
            let Some(comment) = comment(line, &ext) else { continue };
            for path in cited(comment) {
                let exists = if path.contains('/') {
                    root.join(&path).exists() || crate_of(file).is_some_and(|c| c.join(&path).exists())
                } else {
                    names.contains(&path)
                };
                if !exists {
                    let at = file.strip_prefix(&root).unwrap_or(file).display().to_string();
                    missing.push(format!("{at}:{}: {path}", n + 1));
                }
            }
        }
    }
    assert!(read > 100, "the sources were found ({read} read)");
    assert!(
        missing.is_empty(),
        "comments cite files that are not in the repository (cite what is, or say it in words):\n{}",
        missing.join("\n")
    );
}

#[test]
fn the_citation_reader_takes_repository_paths_and_md_names() {
    let line = "see crates/a/src/b.rs, DESIGN.md and benches/results/h200/x.txt. Not a.b, /tmp/x.rs or crates/";
    assert_eq!(cited(line), ["crates/a/src/b.rs", "DESIGN.md", "benches/results/h200/x.txt"]);
    assert_eq!(comment("    let x = 1; // why", "rs"), Some(" why"));
    assert_eq!(comment("  # why", "py"), Some(" why"));
    assert_eq!(comment("x = 1", "py"), None);
    let history = "`git show 135766c:benches/results/old.txt` and (`benches/results/x2/run.txt` at fe6bbb0) \
                   (git show 29a67de:benches/results/r.txt).";
    assert!(cited(history).is_empty(), "history is cited with its commit: {:?}", cited(history));
}
