//! `gp2p probe --from` on the probe's saved-facts fixtures (`crates/gp2p-probe/tests/fixtures`):
//! every consistent file renders, as a table and as JSON that loads again; a file that
//! contradicts itself is refused with exit code 1 and a message naming the file. No GPU
//! or driver is needed.

// No unsafe here: raw driver calls go through gp2p_cuda::raw and the safe APIs above it.
#![forbid(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Files that must be refused, and what the refusal says.
const REFUSED: &[(&str, &str)] = &[
    ("pair-names-absent-device.json", "names device 2"),
    ("self-pair.json", "joins a device to itself"),
    ("duplicate-ordinals.json", "device 0 is listed twice"),
];

fn fixtures() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../gp2p-probe/tests/fixtures");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    assert!(files.len() > REFUSED.len(), "fixtures missing from {}", dir.display());
    files
}

fn gp2p(args: &[&str], file: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gp2p")).args(args).arg(file).output().expect("gp2p runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn every_fixture_renders_or_is_refused_with_exit_1() {
    for file in fixtures() {
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        let out = gp2p(&["probe", "--from"], &file);
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        match REFUSED.iter().find(|(refused, _)| *refused == name) {
            Some((_, says)) => {
                assert_eq!(out.status.code(), Some(1), "{name}: {stdout}{stderr}");
                assert!(stderr.contains(says) && stderr.contains(&name), "{name}: {stderr}");
                assert!(stdout.is_empty(), "{name}: nothing is rendered from a refused file: {stdout}");
            }
            None => {
                assert_eq!(out.status.code(), Some(0), "{name}: {stderr}");
                assert!(stdout.starts_with("geforce-p2p probe\n"), "{name}: {stdout}");
                assert!(!stdout.contains('\u{1b}'), "{name}: raw escape on output");
                // The device table and pair matrix are drawn like the CLI's tables: a header
                // that starts with a space, data rows that start with spaces then a number.
                assert!(stdout.contains("\n #  name "), "{name}: no device table header: {stdout}");
                assert!(stdout.lines().any(|l| l.starts_with(' ') && l.trim_start().starts_with('0')), "{name}");
                assert!(stdout.lines().all(|l| l == l.trim_end()), "{name}: trailing spaces: {stdout}");
            }
        }
    }
}

#[test]
fn json_from_a_fixture_loads_again_and_renders_the_same() {
    let dir = std::env::temp_dir().join(format!("gp2p-cli-probe-from-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for file in fixtures() {
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        if REFUSED.iter().any(|(refused, _)| *refused == name) {
            continue;
        }
        let json = gp2p(&["probe", "--json", "--from"], &file);
        assert_eq!(json.status.code(), Some(0), "{name}: {}", text(&json.stderr));
        let again = dir.join(&name);
        std::fs::write(&again, &json.stdout).unwrap();
        let (first, second) = (gp2p(&["probe", "--from"], &file), gp2p(&["probe", "--from"], &again));
        assert_eq!(text(&first.stdout), text(&second.stdout), "{name}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
