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
        let json = gp2p(&["probe", "--json", "-", "--from"], &file);
        assert_eq!(json.status.code(), Some(0), "{name}: {}", text(&json.stderr));
        let again = dir.join(&name);
        std::fs::write(&again, &json.stdout).unwrap();
        let (first, second) = (gp2p(&["probe", "--from"], &file), gp2p(&["probe", "--from"], &again));
        assert_eq!(text(&first.stdout), text(&second.stdout), "{name}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// What `gp2p probe --from` prints for a pair of a saved file, from its verdict line on.
fn pair_text(file: &str, pair: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../gp2p-probe/tests/fixtures").join(file);
    let out = gp2p(&["probe", "--from"], &path);
    assert_eq!(out.status.code(), Some(0), "{file}: {}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let start = stdout.find(&format!("\n{pair} [")).unwrap_or_else(|| panic!("{file}: no pair {pair}: {stdout}"));
    stdout[start + 1..].to_owned()
}

#[test]
fn a_newer_branch_and_a_driver_past_the_table_render_from_saved_files() {
    let found = pair_text("4090-pair-stock-610.43.02.json", "0 -> 1");
    assert!(
        found.starts_with("0 -> 1 [PATCH, likely] the driver refuses P2P between these cards (NVML: read CNS, write CNS, atomics NS)\n    remedy: install the P2P patch, branch 610.43.02-p2p of aikitoria/open-gpu-kernel-modules, for open module 610.43.02 (PATCH.md)"),
        "{found}"
    );
    let past = pair_text("4090-pair-stock-625-past-table.json", "0 -> 1");
    assert!(
        past.starts_with("0 -> 1 [VER, possible] the driver refuses P2P (NVML: read CNS, write CNS, atomics NS); open module 625.20.03 is newer than every patch branch this probe knows: its table ends at 615.71.09 (checked on 2026-12-06), so a branch for 625.20.03 may exist\n    remedy, in order:\n      1. [VER] look for a 625.20.03 branch in the P2P patch's branch lists (https://github.com/aikitoria/open-gpu-kernel-modules/branches/all, "),
        "{past}"
    );
    assert!(!past.contains("no patch branch exists"), "{past}");
}

#[test]
fn acs_on_a_switch_path_and_acs_that_needs_root_render_from_saved_files() {
    let switch = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../gp2p-probe/tests/fixtures/4090-pair-patched-switch-acs-redirect.json");
    let whole = text(&gp2p(&["probe", "--from"], &switch).stdout);
    assert!(whole.contains("\n 0000:02:08.0  read    0x005d SrcValid ReqRedir CmpltRedir UpstreamFwd DirectTrans  YES: ReqRedir CmpltRedir\n"), "{whole}");
    assert!(whole.contains("\n 0    X  SW*     0  ?     0000:00:01.0\n"), "{whole}");
    let pair = pair_text("4090-pair-patched-switch-acs-redirect.json", "0 -> 1");
    assert!(
        pair.contains("\n    WARNING: ACS on bridges 0000:02:08.0 (ReqRedir+ CmpltRedir+) and 0000:02:10.0 (ReqRedir+ CmpltRedir+) between the cards redirects their peer traffic up to the root complex"),
        "{pair}"
    );
    assert!(
        pair.contains("`pci=disable_acs_redir=0000:02:08.0;0000:02:10.0`")
            && pair.contains(
                "`sudo setpci -s 0000:02:08.0 ECAP_ACS+0x6.w=0051; sudo setpci -s 0000:02:10.0 ECAP_ACS+0x6.w=0011`"
            ),
        "{pair}"
    );
    let pair = pair_text("4090-pair-patched-acs-needs-root.json", "0 -> 1");
    assert!(
        pair.contains("\n    note: ACS of bridges 0000:00:01.1 and 0000:40:01.1 between the cards was not read: the kernel shows a bridge's extended config space only to root; run the probe as root (`sudo gp2p probe`) to read it\n"),
        "{pair}"
    );
}
