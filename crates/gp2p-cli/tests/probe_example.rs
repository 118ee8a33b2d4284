//! `gp2p probe --example`: the bundled example machines render from the installed binary
//! (no files, no GPU), say they are examples, and round-trip through `--json` and `--from`;
//! without a name, or with an unknown one, the examples are listed. Without a driver,
//! `gp2p probe` still fails with exit code 3 (no driver or device) and its message, then names an example.

#![forbid(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Output};

/// The examples every build ships (`gp2p_probe::examples::EXAMPLES`).
const EXAMPLES: &[&str] = &["2x4090", "8x4090-epyc", "4x3090-switch"];

fn gp2p(args: &[&str]) -> Output {
    // From a directory with no repository files around: the examples live in the binary.
    Command::new(env!("CARGO_BIN_EXE_gp2p")).args(args).current_dir(std::env::temp_dir()).output().expect("gp2p runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn each_example_renders_marked_as_an_example() {
    for name in EXAMPLES {
        let out = gp2p(&["probe", "--example", name]);
        let stdout = text(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{name}: {}", text(&out.stderr));
        assert!(stdout.starts_with("geforce-p2p probe\nEXAMPLE, not this machine: "), "{name}: {stdout}");
        assert!(stdout.contains("EXAMPLE: this was a bundled example, not this machine"), "{name}: {stdout}");
        assert!(stdout.contains("\ntopology (how each pair's traffic meets in the host)\n"), "{name}: {stdout}");
        assert!(stdout.lines().all(|l| l == l.trim_end()), "{name}: trailing spaces");
    }
    let epyc = text(&gp2p(&["probe", "--example", "8x4090-epyc"]).stdout);
    assert!(
        epyc.contains("\n 4  SYS  SYS  SYS  SYS    X  SYS  SYS  SYS     4  64-79,192-207    0000:80:01.1\n"),
        "{epyc}"
    );
    let switch = text(&gp2p(&["probe", "--example", "4x3090-switch"]).stdout);
    assert!(switch.contains("shared uplink: cards 0, 1, 2, 3 behind one switch"), "{switch}");
    // ACS redirect on the switch's downstream ports: marked in the matrix, a step of its own.
    assert!(switch.contains("\n 0    X  SW*  SW*  SW*     0  0-111  0000:16:01.0\n"), "{switch}");
    assert!(
        switch.contains("\n      3. [ACS] clear ACS redirect on bridges 0000:18:00.0 and 0000:18:01.0: add `pci=disable_acs_redir=0000:18:00.0;0000:18:01.0`"),
        "{switch}"
    );
    let desktop = text(&gp2p(&["probe", "--example", "2x4090"]).stdout);
    assert!(
        desktop.contains("    remedy, in order:\n      1. [VER] ") && desktop.contains("\n      4. [PATCH] "),
        "{desktop}"
    );
}

#[test]
fn an_example_round_trips_through_json_and_from() {
    let dir = std::env::temp_dir().join(format!("gp2p-cli-probe-example-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for name in EXAMPLES {
        let json = gp2p(&["probe", "--example", name, "--json", "-"]);
        assert_eq!(json.status.code(), Some(0), "{name}: {}", text(&json.stderr));
        let saved = dir.join(format!("{name}.json"));
        std::fs::write(&saved, &json.stdout).unwrap();
        let from = gp2p(&["probe", "--from", saved.to_str().unwrap()]);
        assert_eq!(from.status.code(), Some(0), "{name}: {}", text(&from.stderr));
        let direct = gp2p(&["probe", "--example", name]);
        assert_eq!(text(&from.stdout), text(&direct.stdout), "{name}: --from renders what --example does");
        let again = gp2p(&["probe", "--json", "-", "--from", saved.to_str().unwrap()]);
        assert_eq!(text(&again.stdout), text(&json.stdout), "{name}: the JSON is stable");
        let doc: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
        assert!(doc["facts"]["example"].is_string() && doc["topology"]["pairs"].is_array(), "{name}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn no_name_or_an_unknown_one_lists_the_examples() {
    let list = gp2p(&["probe", "--example"]);
    assert_eq!(list.status.code(), Some(0), "{}", text(&list.stderr));
    let unknown = gp2p(&["probe", "--example", "9x9090"]);
    assert_eq!(unknown.status.code(), Some(2));
    let stderr = text(&unknown.stderr);
    assert!(stderr.starts_with("gp2p: no bundled example is called \"9x9090\""), "{stderr}");
    for name in EXAMPLES {
        assert!(text(&list.stdout).contains(&format!("\n  {name} ")), "{name} not listed: {}", text(&list.stdout));
        assert!(stderr.contains(&format!("\n  {name} ")), "{name} not listed: {stderr}");
    }
    // An example is neither this machine (--measure) nor a saved file (--from).
    assert_eq!(gp2p(&["probe", "--example", "2x4090", "--measure"]).status.code(), Some(2));
    assert_eq!(gp2p(&["probe", "--example", "2x4090", "--from", "x.json"]).status.code(), Some(2));
}

/// The first line of each error `gp2p probe` fails with when it has nothing to probe: no
/// driver, or a driver that sees no device.
const UNAVAILABLE: &[&str] = &["gp2p: no NVIDIA CUDA driver found", "gp2p: device 0 does not exist"];

#[test]
fn without_a_driver_probe_exits_3_with_its_message_then_names_an_example() {
    let out = gp2p(&["probe"]);
    if out.status.code() == Some(0) {
        // A machine with a driver and a GPU probes itself: the path under test is not
        // reachable here, and the test says it was not run (the line the bundle's runner
        // counts, `gp2p_tests::needs::NOT_RUN`) rather than passing.
        println!(
            "gp2p-not-run: probe_example::without_a_driver_probe_exits_3_with_its_message_then_names_an_example needs a machine without an NVIDIA GPU, this one has one"
        );
        return;
    }
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    let mut lines = stderr.lines();
    // The first line is the one tests/python/test_cpu.py (and users' scripts) look for: no
    // driver, or (with a driver but no GPU) no device.
    assert!(lines.next().is_some_and(|l| UNAVAILABLE.iter().any(|u| l.starts_with(u))), "{stderr}");
    assert!(lines.next().is_some_and(|l| l.contains("gp2p probe --example 2x4090")), "{stderr}");
    assert!(out.stdout.is_empty());
}
