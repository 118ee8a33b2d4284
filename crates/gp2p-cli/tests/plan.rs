//! `gp2p plan`: the cost model's table runs with no GPU or driver, one row per size, each
//! naming its choice; `GP2P_ALGORITHM` forces a choice or, naming none, fails; fewer than
//! two ranks are refused; `--measure` without a driver exits 2 like `gp2p probe`.

#![forbid(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Output};

/// `gp2p args…` with `GP2P_ALGORITHM` set to `forced`, or removed.
fn gp2p(args: &[&str], forced: Option<&str>) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_gp2p"));
    command.args(args);
    match forced {
        Some(value) => command.env("GP2P_ALGORITHM", value),
        None => command.env_remove("GP2P_ALGORITHM"),
    };
    command.output().expect("gp2p runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The model's table's data rows: lines that start with spaces, then a size, before the
/// communicator's table.
fn rows(stdout: &str) -> Vec<&str> {
    data_rows(stdout.split("One process per GPU").next().unwrap_or_default())
}

/// The communicator's table's data rows (among more than two ranks), before its compressed
/// all-reduce's.
fn communicator_rows(stdout: &str) -> Vec<&str> {
    let theirs = stdout.split_once("One process per GPU").map(|(_, theirs)| theirs).unwrap_or_default();
    data_rows(theirs.split("Compressed all-reduce").next().unwrap_or_default())
}

/// The compressed all-reduce's table's data rows.
fn compressed_rows(stdout: &str) -> Vec<&str> {
    stdout.split_once("Compressed all-reduce").map(|(_, rows)| data_rows(rows)).unwrap_or_default()
}

fn data_rows(text: &str) -> Vec<&str> {
    text.lines().filter(|l| l.starts_with(' ') && l.trim_start().starts_with(|c: char| c.is_ascii_digit())).collect()
}

const ALGORITHMS: [&str; 3] = ["ring", "one-shot", "two-shot"];

#[test]
fn plan_for_eight_ranks_prints_a_row_per_size_each_with_a_choice() {
    let out = gp2p(&["plan", "--ranks", "8"], None);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(stdout.lines().any(|l| l.starts_with("machine: ")), "{stdout}");
    let rows = rows(&stdout);
    assert_eq!(rows.len(), 15, "4 B to 1 GiB by 4: {stdout}");
    for row in &rows {
        let cells: Vec<&str> = row.split_whitespace().collect();
        // size, three times, the choice, the bound (one or two words), busbw.
        assert!(ALGORITHMS.contains(&cells[4]), "no choice in {row:?}");
        assert!(cells[1..4].iter().all(|t| t.parse::<f64>().is_ok_and(|t| t > 0.0)), "{row:?}");
    }
    assert!(rows[0].contains("one-shot"), "the smallest size takes one trip: {stdout}");
    assert!(rows[rows.len() - 1].trim_start().starts_with("1G") && rows[rows.len() - 1].contains("two-shot"));
    assert!(stdout.contains("GP2P_ALGORITHM") && stdout.contains("not measurements"), "{stdout}");
    // The communicator's own: the lines up to their 64 KiB, the flagged chunks to 1 MiB, the
    // rounds above.
    let theirs = communicator_rows(&stdout);
    assert_eq!(theirs.len(), 15, "{stdout}");
    let chunks = theirs.iter().position(|r| r.ends_with("two-shot (flagged chunks)")).unwrap();
    assert!(theirs[chunks - 1].trim_start().starts_with("64K ") && theirs[chunks - 1].ends_with("one-shot (lines)"));
    let split = theirs.iter().position(|r| r.ends_with("two-shot (rounds)")).unwrap();
    assert!(theirs[split - 1].trim_start().starts_with("1M ") && split - chunks == 2, "256K and 1M: {stdout}");
    assert!(theirs[split..].iter().all(|r| r.ends_with("two-shot (rounds)")), "{stdout}");
    // The compressed all-reduce: exact below the model's minimum, compressed from it on.
    let squeezed = compressed_rows(&stdout);
    assert_eq!(squeezed.len(), 15, "{stdout}");
    let on = squeezed.iter().position(|r| r.ends_with("compressed")).unwrap();
    assert!(on > 0 && squeezed[..on].iter().all(|r| r.ends_with("exact")), "{stdout}");
    assert!(squeezed[on..].iter().all(|r| r.ends_with("compressed")), "{stdout}");
    assert!(stdout.contains("GP2P_COMPRESS=int8|fp8[:BLOCK]"), "{stdout}");
}

#[test]
fn fewer_than_two_ranks_are_refused_naming_the_flag() {
    for ranks in ["0", "1"] {
        let out = gp2p(&["plan", "--ranks", ranks], None);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "--ranks {ranks}: {stderr}");
        assert!(stderr.contains(&format!("--ranks {ranks}")) && stderr.contains("2 to 4096 ranks"), "{stderr}");
        assert!(out.stdout.is_empty(), "nothing printed for a refused plan");
    }
}

#[test]
fn the_environment_forces_a_choice_or_fails_naming_the_choices() {
    let out = gp2p(&["plan", "--ranks", "4", "--sizes", "8,1G"], Some("ring"));
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let rows = rows(&stdout);
    assert_eq!(rows.len(), 2, "{stdout}");
    assert!(rows.iter().all(|r| r.contains("ring (forced)")), "{stdout}");
    let out = gp2p(&["plan", "--ranks", "4"], Some("tree"));
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    for word in ["GP2P_ALGORITHM", "tree"].iter().chain(&ALGORITHMS) {
        assert!(stderr.contains(word), "{word} missing: {stderr}");
    }
}

#[test]
fn json_holds_every_size_and_algorithm() {
    let path = std::env::temp_dir().join(format!("gp2p-cli-plan-{}.json", std::process::id()));
    let out =
        gp2p(&["plan", "--ranks", "4", "--host", "48", "--sizes", "8,1M,1G", "--json", path.to_str().unwrap()], None);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let value: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(value["ranks"], 4);
    assert_eq!(value["machine"]["host_gbps"], 48.0);
    let rows = value["rows"].as_array().unwrap();
    assert_eq!(rows.iter().map(|r| r["bytes"].as_u64().unwrap()).collect::<Vec<_>>(), [8, 1 << 20, 1 << 30]);
    for row in rows {
        assert!(ALGORITHMS.contains(&row["chosen"].as_str().unwrap()), "{row}");
        assert_eq!(row["predictions"].as_array().unwrap().len(), 3, "{row}");
    }
    // Four cards behind a 48 GB/s uplink: one trip at 8 B, the two-shot at 1 GiB.
    assert_eq!((rows[0]["chosen"].as_str(), rows[2]["chosen"].as_str()), (Some("one-shot"), Some("two-shot")));
    assert_eq!(rows[2]["bound"], "host");
}

#[test]
fn measure_needs_a_driver_and_says_what_it_measured() {
    let out = gp2p(&["plan", "--ranks", "2", "--sizes", "1M", "--measure"], None);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    match out.status.code() {
        // No driver or no device here: like `gp2p probe`, exit 3 and say so.
        Some(3) => {
            assert!(stderr.contains("driver") || stderr.contains("device"), "{stderr}");
            assert!(stderr.contains("python -m geforce_p2p probe --example 2x4090"), "the next step: {stderr}");
        }
        // A GPU: the per-card rates were measured.
        Some(0) => assert!(stdout.contains("measured here") && stdout.contains("h2d, d2h, duplex"), "{stdout}"),
        code => panic!("exit {code:?}: {stdout}{stderr}"),
    }
}

#[test]
fn an_example_machine_hands_its_cards_and_shared_uplink_to_the_model() {
    // Four cards behind one PCIe switch: the plan takes 4 ranks and the shared uplink from
    // the example's topology, and at 1 GiB the uplink (four cards through one link) binds.
    let out = gp2p(&["plan", "--example", "4x3090-switch"], None);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("over 4 ranks"), "{stdout}");
    assert!(stdout.contains("uplink: 4 cards share one PCIe uplink at most"), "{stdout}");
    assert!(stdout.contains("the example 4x3090-switch's topology"), "{stdout}");
    let last = *rows(&stdout).last().unwrap();
    assert!(last.contains("two-shot") && last.contains("uplink"), "{last}");
    // Each card on its own root port (the EPYC box): no uplink line, 8 ranks.
    let out = gp2p(&["plan", "--example", "8x4090-epyc", "-b", "1G", "-e", "1G"], None);
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("over 8 ranks")
            && stdout.contains("uplink: every card has its own (the example 8x4090-epyc's topology)"),
        "{stdout}"
    );
    assert!(!rows(&stdout)[0].contains("uplink"), "{stdout}");
    // The flag wins over the topology; an unknown example is refused with the list.
    let out = gp2p(&["plan", "--example", "4x3090-switch", "--uplink", "1", "-b", "1G", "-e", "1G"], None);
    let stdout = text(&out.stdout);
    assert!(!rows(&stdout)[0].contains("uplink"), "{stdout}");
    assert!(stdout.contains("uplink: every card has its own (--uplink)"), "the flag is named as the source: {stdout}");
    let out = gp2p(&["plan", "--ranks", "2", "--uplink", "4"], None);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("--uplink 4: expected 1 to 2 cards"), "{}", text(&out.stderr));
    let out = gp2p(&["plan", "--ranks", "9223372036854775809"], None);
    assert_eq!(out.status.code(), Some(2), "a huge rank count is refused, not overflowed");
    let listed = gp2p(&["plan", "--example"], None);
    assert_eq!(listed.status.code(), Some(0), "{}", text(&listed.stderr));
    assert!(text(&listed.stdout).contains("4x3090-switch"), "without a name, the examples: {}", text(&listed.stdout));
    let out = gp2p(&["plan", "--example", "nothing"], None);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("--example nothing: no such example") && text(&out.stderr).contains("2x4090"));
    let out = gp2p(&["plan"], None);
    assert_eq!(out.status.code(), Some(2), "neither --ranks nor --example: a usage error");
}

#[test]
fn hosts_add_the_two_level_table_and_refuse_a_network_of_nothing() {
    let out = gp2p(&["plan", "--ranks", "4", "--hosts", "2", "--sizes", "1M,1G"], None);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let (_, across) = stdout.split_once("Across 2 hosts of 4 cards, 25 Gb/s").expect("the hosts' table");
    let rows = data_rows(across);
    assert_eq!(rows.len(), 2, "{stdout}");
    // 1 GiB, by hand in gp2p_collectives::hosts' tests: 420.4 ms in turn, 601.5 ms flat.
    assert!(rows[1].contains("420358.8") && rows[1].contains("601455.0") && rows[1].contains("0.57"), "{stdout}");
    let out = gp2p(&["plan", "--ranks", "4", "--hosts", "2", "--network-gbps", "0"], None);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("--network-gbps 0: expected a rate above 0"), "{}", text(&out.stderr));
    let out = gp2p(&["plan", "--ranks", "4", "--network-gbps", "100"], None);
    assert_ne!(out.status.code(), Some(0), "--network-gbps needs --hosts");
}
