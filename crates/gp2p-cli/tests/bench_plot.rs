//! `gp2p bench plot --from` redraws saved reports with no GPU: a `gp2p bench --json` report
//! with NCCL's rows beside it becomes an SVG with binary size labels, a marker on every point
//! and the machine and commit under the title; a file that cannot be read is refused with
//! exit code 1 and a message naming it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::{Command, Output};

/// A two-rank all-reduce report as `gp2p bench all-reduce --json` writes it, 4 KiB to 1 GiB.
fn ours() -> String {
    let rows: Vec<String> = (0..10)
        .map(|k| {
            let bytes = 4096u64 << (2 * k);
            format!(
                r#"{{"bench": "all_reduce", "route": "auto", "dtype": "f32", "op": "sum", "ranks": 2,
                "bytes": {bytes}, "count": {}, "time_us": 10.0, "algbw": 1.0, "busbw": {}, "ceiling": 49.5,
                "ceiling_name": "duplex", "ratio": 0.1, "enqueue_us": 9.0, "wrong": 0}}"#,
                bytes / 4,
                4 * k + 1
            )
        })
        .collect();
    format!(
        r#"{{"command": "bundle/bin/gp2p bench all-reduce --ranks 2 --json x.json", "commit": "c729cde",
        "machine": "h200-x2", "gpu": {{"name": "NVIDIA H200", "driver": "CUDA 13.0", "pci_bus_id": "0", "link": null}},
        "ceilings": {{"duplex": 49.5, "duplex_d2h": 49.1}}, "repeats": 20, "streams": "own", "rows": [{}]}}"#,
        rows.join(",")
    )
}

/// NCCL's rows as benches/nccl/nccl_shm.py writes them: all_reduce and all_gather.
fn nccl() -> String {
    let rows: Vec<String> = ["all_reduce", "all_gather"]
        .iter()
        .flat_map(|bench| {
            (0..10).map(move |k| {
                format!(
                    r#"{{"bench": "{bench}", "route": "nccl-shm", "dtype": "f32", "op": "sum", "ranks": 2,
                    "bytes": {}, "count": 1, "time_us": 20.0, "algbw": 1.0, "busbw": {}, "wrong": 0}}"#,
                    4096u64 << (2 * k),
                    2 * k + 1
                )
            })
        })
        .collect();
    format!(r#"{{"gpu": "NVIDIA H200", "rows": [{}]}}"#, rows.join(","))
}

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("gp2p-bench-plot-{}-{name}", std::process::id()))
}

fn gp2p(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gp2p")).args(args).output().expect("gp2p runs")
}

#[test]
fn saved_reports_redraw_with_their_rivals_beside_them() {
    let (a, b, svg) = (temp("ours.json"), temp("nccl.json"), temp("plot.svg"));
    std::fs::write(&a, ours()).unwrap();
    std::fs::write(&b, nccl()).unwrap();
    let args = ["bench", "plot", "--from", a.to_str().unwrap(), "--from", b.to_str().unwrap()];
    let out = gp2p(&[&args[..], &["--plot", svg.to_str().unwrap()]].concat());
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(&svg).unwrap();
    for want in
        ["gp2p bench all-reduce", "h200-x2 (NVIDIA H200) · commit c729cde", "gp2p auto", "nccl-shm", "4 KiB", "1 GiB"]
    {
        assert!(text.contains(want), "the plot lacks {want:?}");
    }
    assert!(!text.contains("1073741824") && !text.contains("1000000000"), "a size in plain digits");
    assert_eq!(text.matches("<circle").count(), 10, "ours: a circle per point");
    assert_eq!(text.matches("<polygon").count(), 10, "NCCL's all_reduce rows only: a triangle per point");

    // --series keeps one series; --commit and --machine override the file's.
    let only = gp2p(
        &[&args[..], &["--plot", svg.to_str().unwrap(), "--series", "nccl-shm", "--commit", "abc", "--machine", "m"]]
            .concat(),
    );
    assert_eq!(only.status.code(), Some(0), "{}", String::from_utf8_lossy(&only.stderr));
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.contains("m (NVIDIA H200) · commit abc") && !text.contains("gp2p auto"), "{text}");
    assert_eq!(text.matches("<circle").count(), 0);
    for path in [a, b, svg] {
        let _ = std::fs::remove_file(path);
    }
}

#[test]
fn an_unreadable_file_is_refused_by_name() {
    let (missing, broken, svg) = (temp("missing.json"), temp("broken.json"), temp("never.svg"));
    std::fs::write(&broken, "{ not json").unwrap();
    for file in [&missing, &broken] {
        let out = gp2p(&["bench", "plot", "--from", file.to_str().unwrap(), "--plot", svg.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(1));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(&*file.to_string_lossy()), "{stderr}");
        assert!(!svg.exists(), "nothing is drawn from a file that cannot be read");
    }
    let _ = std::fs::remove_file(broken);
}
