//! Turns `data/branches.json`, the table of published P2P patch branches, into Rust
//! constants (`branches.rs` includes them), so the table is data with a source per entry
//! and still a `const` slice at run time: no parsing, and no way to ship a table that does
//! not parse. Every check fails the build with the entry and what is wrong.

use std::error::Error;
use std::fmt::Write as _;
use std::path::Path;

use serde_json::Value;

/// The table, relative to the crate.
const TABLE: &str = "data/branches.json";
/// The repositories a branch may come from, and the `Line` variant of each.
const LINES: &[(&str, &str)] =
    &[("tinygrad/open-gpu-kernel-modules", "Tinygrad"), ("aikitoria/open-gpu-kernel-modules", "Aikitoria")];
/// Architecture names as `facts::Architecture` spells its variants.
const ARCHITECTURES: &[&str] = &["Ampere", "Ada", "Blackwell"];
/// What an entry's `dated` may say, and the `Dated` variant of each.
const DATED: &[(&str, &str)] = &[("published", "Published"), ("seen", "Seen"), ("checked", "Checked")];

fn main() -> Result<(), Box<dyn Error>> {
    println!("cargo::rerun-if-changed={TABLE}");
    let text = std::fs::read_to_string(TABLE).map_err(|e| format!("{TABLE}: {e}"))?;
    let table: Value = serde_json::from_str(&text).map_err(|e| format!("{TABLE}: {e}"))?;
    let code = generate(&table).map_err(|e| format!("{TABLE}: {e}"))?;
    let out = std::env::var("OUT_DIR")?;
    std::fs::write(Path::new(&out).join("branches.rs"), code)?;
    Ok(())
}

/// The Rust source of the table's constants.
fn generate(table: &Value) -> Result<String, String> {
    let checked = text(table, "checked", "the table")?;
    date(checked, "the table's `checked`")?;
    let note = text(table, "note", "the table")?;
    let look_in: Vec<&str> = table
        .get("look_in")
        .and_then(Value::as_array)
        .ok_or("the table has no `look_in` list")?
        .iter()
        .map(|v| v.as_str().ok_or("`look_in` holds something other than a URL"))
        .collect::<Result<_, _>>()?;
    let entries = table.get("branches").and_then(Value::as_array).ok_or("the table has no `branches` list")?;
    let mut code = String::new();
    let _ = writeln!(code, "/// The date the table was last checked against the published branches (YYYY-MM-DD).");
    let _ = writeln!(code, "pub const TABLE_CHECKED: &str = {checked:?};");
    let _ = writeln!(code, "/// What the table holds and how far its check reached, as its data file says.");
    let _ = writeln!(code, "pub const TABLE_NOTE: &str = {note:?};");
    let _ = writeln!(code, "/// Where to look for branches newer than the table: each line's list of branches.");
    let _ = writeln!(code, "pub const BRANCH_LISTS: &[&str] = &{look_in:?};");
    let _ = writeln!(code, "/// Every branch the probe knows, oldest driver first (`data/branches.json`).");
    let _ = writeln!(code, "pub const PATCH_BRANCHES: &[Branch] = &[");
    let mut last_ordinary: Option<(Vec<u32>, String)> = None;
    for (i, entry) in entries.iter().enumerate() {
        let at = format!("branch {}", i + 1);
        let version = text(entry, "version", &at)?;
        let at = format!("branch {} ({version})", i + 1);
        let numeric = numeric_version(version).ok_or(format!("{at}: the version is not dotted numbers"))?;
        let name = text(entry, "name", &at)?;
        let repository = text(entry, "repository", &at)?;
        let line = LINES
            .iter()
            .find(|(repo, _)| *repo == repository)
            .map(|(_, line)| *line)
            .ok_or(format!("{at}: repository {repository:?} is not one of {LINES:?}"))?;
        let url = text(entry, "url", &at)?;
        if !url.starts_with(&format!("https://github.com/{repository}/")) {
            return Err(format!("{at}: url {url:?} is not in {repository}"));
        }
        let archs: Vec<String> = entry
            .get("architectures")
            .and_then(Value::as_array)
            .ok_or(format!("{at}: no `architectures` list"))?
            .iter()
            .map(|a| match a.as_str() {
                Some(a) if ARCHITECTURES.contains(&a) => Ok(format!("Architecture::{a}")),
                _ => Err(format!("{at}: architecture {a} is not one of {ARCHITECTURES:?}")),
            })
            .collect::<Result<_, _>>()?;
        if archs.is_empty() {
            return Err(format!("{at}: drives no architecture"));
        }
        let per_allocation = entry.get("per_allocation_bar1").and_then(Value::as_bool).unwrap_or(false);
        let third_party_only = entry.get("third_party_only").and_then(Value::as_bool).unwrap_or(false);
        let when = text(entry, "date", &at)?;
        date(when, &at)?;
        if when > checked {
            return Err(format!("{at}: dated {when}, after the table's check on {checked}"));
        }
        let dated = text(entry, "dated", &at)?;
        let dated = DATED
            .iter()
            .find(|(word, _)| *word == dated)
            .map(|(_, variant)| *variant)
            .ok_or(format!("{at}: `dated` {dated:?} is not one of {DATED:?}"))?;
        let evidence = text(entry, "evidence", &at)?;
        if !per_allocation {
            // One ordinary branch per version, oldest first: `branch_for_version` takes
            // the first, and "past the table" means past the last.
            if let Some((before, name_before)) = &last_ordinary {
                if *before >= numeric {
                    return Err(format!(
                        "{at}: not newer than {name_before}; keep ordinary branches oldest first, one per version"
                    ));
                }
            }
            last_ordinary = Some((numeric, name.to_owned()));
        }
        let _ = writeln!(
            code,
            "    Branch {{ version: {version:?}, name: {name:?}, line: Line::{line}, architectures: &[{}], per_allocation_bar1: {per_allocation}, url: {url:?}, date: {when:?}, dated: Dated::{dated}, evidence: {evidence:?}, third_party_only: {third_party_only} }},",
            archs.join(", ")
        );
    }
    if last_ordinary.is_none() {
        return Err("no ordinary branch".into());
    }
    let _ = writeln!(code, "];");
    Ok(code)
}

/// The string field `key` of `value`, non-empty.
fn text<'v>(value: &'v Value, key: &str, at: &str) -> Result<&'v str, String> {
    match value.get(key).and_then(Value::as_str) {
        Some(s) if !s.trim().is_empty() => Ok(s),
        _ => Err(format!("{at}: `{key}` is missing or empty")),
    }
}

/// Checks a YYYY-MM-DD date (so that dates compare as strings).
fn date(text: &str, at: &str) -> Result<(), String> {
    let parts: Vec<&str> = text.split('-').collect();
    let shape = parts.len() == 3
        && [4, 2, 2].iter().zip(&parts).all(|(n, p)| p.len() == *n && p.chars().all(|c| c.is_ascii_digit()));
    if shape { Ok(()) } else { Err(format!("{at}: date {text:?} is not YYYY-MM-DD")) }
}

/// A driver version's numbers (`570.86.16` → [570, 86, 16]).
fn numeric_version(version: &str) -> Option<Vec<u32>> {
    version.split('.').map(|p| p.parse().ok()).collect()
}
