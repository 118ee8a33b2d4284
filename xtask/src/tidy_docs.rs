//! The docs' tidy checks: the README stays a first screen (what the project is, who it is
//! for, the commands and the doors; the rest lives in docs/ pages it links), and every
//! relative link of the README and the docs pages leads to a file of the repository.

use std::fs;
use std::path::{Path, PathBuf};

/// The most lines the README may have.
const README_MAX_LINES: usize = 150;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The relative link targets of `markdown` (`[text](target)`), anchors and web addresses left
/// out, each without its `#fragment`.
fn relative_links(markdown: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = markdown;
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        let Some(end) = rest.find(')') else { break };
        let target = rest[..end].split('#').next().unwrap_or("").trim();
        if !target.is_empty() && !target.contains("://") && !target.starts_with("mailto:") {
            found.push(target.to_string());
        }
        rest = &rest[end..];
    }
    found
}

#[test]
fn the_readme_is_a_first_screen_of_at_most_150_lines() {
    let text = fs::read_to_string(root().join("README.md")).expect("reading README.md");
    let lines = text.lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines, more than {README_MAX_LINES}: move what is not the first screen (what it is, \
         the commands, the doors) to a page under docs/ and link it"
    );
}

#[test]
fn every_relative_link_of_the_readme_and_the_docs_leads_to_a_file() {
    let root = root();
    let mut pages = vec![root.join("README.md")];
    for entry in fs::read_dir(root.join("docs")).expect("listing docs/") {
        let path = entry.expect("a docs/ entry").path();
        if path.extension().is_some_and(|e| e == "md") {
            pages.push(path);
        }
    }
    let mut broken = Vec::new();
    for page in &pages {
        let text = fs::read_to_string(page).expect("reading a page");
        let dir = page.parent().expect("a page's folder");
        for link in relative_links(&text) {
            if !dir.join(&link).exists() {
                broken.push(format!("{}: {link}", page.strip_prefix(&root).unwrap_or(page).display()));
            }
        }
    }
    assert!(pages.len() > 3, "the pages were found: {pages:?}");
    assert!(broken.is_empty(), "links to no file: {broken:?}");
}

#[test]
fn the_link_reader_takes_relative_targets_only() {
    let text = "[a](docs/a.md) [b](https://x.org/b) [c](#here) [d](../d.md#part) [e](mailto:x@y)";
    assert_eq!(relative_links(text), ["docs/a.md", "../d.md"]);
}
