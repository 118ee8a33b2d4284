//! No source file over 600 lines, tests aside: a room one reader holds at once. Tests are the
//! files under a `tests/` folder, the modules declared `#[cfg(test)]`, and a file's part from
//! its first `#[cfg(test)]` on; generated tables are not source here (the PTX, the probe's
//! data). What grows past the limit is split along what it does, not by size.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

/// The most lines a source file may have, its tests aside.
const MAX_LINES: usize = 600;
/// Source files.
const SOURCES: &[&str] = &["rs", "py", "cu", "cuh"];

/// The files of the modules `file` declares under `#[cfg(test)]` (`mod x;` after the
/// attribute): `x.rs` and `x/mod.rs` in the folder its children live in.
fn test_modules(file: &Path, text: &str) -> Vec<PathBuf> {
    let stem = file.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let Some(parent) = file.parent() else { return Vec::new() };
    let children =
        if ["lib", "main", "mod"].contains(&stem.as_str()) { parent.to_path_buf() } else { parent.join(&stem) };
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    let mut found = Vec::new();
    for pair in lines.windows(2) {
        if pair[0] == "#[cfg(test)]"
            && let Some(name) = pair[1].strip_prefix("mod ").and_then(|r| r.strip_suffix(';'))
        {
            found.push(children.join(format!("{name}.rs")));
            found.push(children.join(name).join("mod.rs"));
        }
    }
    found
}

/// Lines of `text` before its first `#[cfg(test)]` (all of them where there is none).
fn lines_before_tests(text: &str) -> usize {
    text.lines().take_while(|l| l.trim() != "#[cfg(test)]").count()
}

#[test]
fn no_source_file_is_over_600_lines_tests_aside() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let files = crate::tidy_files::files_below(&root, SOURCES, &["tests"]);
    let mut tests = BTreeSet::new();
    for file in files.iter().filter(|f| f.extension().is_some_and(|e| e == "rs")) {
        let text = fs::read_to_string(file).unwrap_or_default();
        tests.extend(test_modules(file, &text).into_iter().map(|p| p.canonicalize().unwrap_or(p)));
    }
    let mut long = Vec::new();
    for file in &files {
        let canonical = file.canonicalize().unwrap_or_else(|_| file.clone());
        let name = file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if tests.contains(&canonical) || name == "tests.rs" || name.starts_with("test_") || name == "conftest.py" {
            continue;
        }
        let text = fs::read_to_string(file).unwrap_or_default();
        let n = if name.ends_with(".rs") { lines_before_tests(&text) } else { text.lines().count() };
        if n > MAX_LINES {
            long.push(format!("{} ({n})", file.strip_prefix(&root).unwrap_or(file).display()));
        }
    }
    assert!(files.len() > 100, "the sources were found ({})", files.len());
    assert!(
        long.is_empty(),
        "source files over {MAX_LINES} lines, tests aside: {long:?}; split each along what it does"
    );
}

#[test]
fn tests_are_told_apart_from_source() {
    let text = "mod a;\n#[cfg(test)]\nmod tidy;\n\nfn f() {}\n#[cfg(test)]\nmod tests {\n}\n";
    let found = test_modules(Path::new("/x/src/main.rs"), text);
    assert_eq!(found, [PathBuf::from("/x/src/tidy.rs"), PathBuf::from("/x/src/tidy/mod.rs")]);
    let nested = test_modules(Path::new("/x/src/raw.rs"), "#[cfg(test)]\nmod codec;\n");
    assert_eq!(nested[0], PathBuf::from("/x/src/raw/codec.rs"));
    assert_eq!(lines_before_tests(text), 1, "the first #[cfg(test)] ends the source part");
    assert_eq!(lines_before_tests("a\nb\n"), 2);
}
