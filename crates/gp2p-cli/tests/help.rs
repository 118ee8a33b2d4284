//! `gp2p … --help` lists the allowed values of every enum-valued flag (they are clap
//! `ValueEnum`s), and a value outside them is a usage error that names them. No GPU needed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Output};

fn gp2p(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gp2p")).args(args).output().expect("gp2p runs")
}

fn stdout(args: &[&str]) -> String {
    let out = gp2p(args);
    assert_eq!(out.status.code(), Some(0), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn help_lists_the_allowed_values_of_enum_flags() {
    // -h prints clap's one-line form of each list.
    let collective = stdout(&["bench", "all-reduce", "-h"]);
    for values in [
        "[possible values: auto, scratch, zero-copy]",
        "[possible values: sum, avg, min, max, prod]",
        "[possible values: f32, f64, f16, bf16, i8, u8, i32, u32, i64, u64, f8e4m3, f8e5m2]",
    ] {
        assert!(collective.contains(values), "all-reduce -h lacks {values}:\n{collective}");
    }
    let copy = stdout(&["bench", "copy", "-h"]);
    assert!(copy.contains("[possible values: auto, peer, staged]"), "{copy}");
    for bench in ["copy", "host", "reduce", "all-reduce"] {
        let help = stdout(&["bench", bench, "-h"]);
        assert!(help.contains("--stream") && help.contains("[possible values: own, legacy]"), "{bench}: {help}");
    }
    // --help gives each value its line, with `all` explained.
    let reduce = stdout(&["bench", "reduce", "--help"]);
    assert!(
        reduce.contains("every dtype in turn") && reduce.contains("- bf16") && reduce.contains("- f8e5m2"),
        "{reduce}"
    );
}

#[test]
fn a_value_outside_the_list_is_a_usage_error_naming_the_list() {
    let out = gp2p(&["bench", "all-reduce", "--receive", "zerocopy"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("zerocopy") && stderr.contains("zero-copy"), "{stderr}");
}

#[test]
fn the_one_line_summary_names_every_command() {
    let help = stdout(&["--help"]);
    let summary = help.lines().next().unwrap_or_default();
    for command in ["probe", "devices", "benchmark", "plan", "NCCL"] {
        assert!(summary.contains(command), "the first line lacks {command}: {summary}");
    }
}

#[test]
fn the_codec_bench_refuses_what_its_kernels_do_not_take_before_opening_a_gpu() {
    let help = stdout(&["bench", "codec", "-h"]);
    assert!(help.contains("[possible values: int8, fp8]") && help.contains("--ranks"), "{help}");
    for (args, names) in [
        (&["bench", "codec", "--ranks", "9"][..], "--ranks 9"),
        (&["bench", "codec", "--ranks", "1"][..], "--ranks 1"),
        (&["bench", "codec", "-e", "64M", "--block", "48"][..], "--block 48"),
        (&["bench", "codec", "-e", "64M", "--dtype", "i8"][..], "f32, f16 or bf16"),
        // The default end, 1 GiB, is past what its CPU reference checks in reasonable time.
        (&["bench", "codec"][..], "pass -e 256M or less"),
    ] {
        let out = gp2p(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(names), "{args:?}: {stderr}");
    }
}
