//! The door as C programs meet it: a driver linked against a `libnccl.so.2` with the door
//! preloaded in its place, a stand-in for the real NCCL that records every call it gets, and
//! no GPU. Ranks are processes (the driver forks them); every rank of a communicator must
//! reach the same decision through the rendezvous the unique id names, and every call on a
//! handed-over communicator must reach the real library with its arguments untouched.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: failing is how it reports

use std::path::{Path, PathBuf};
use std::process::Command;

mod support;
use support::door;

/// A folder of this test's own under the target folder.
fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("gp2p-nccl-from-c").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a scratch folder");
    dir
}

fn gcc(args: &[&str]) {
    let out = Command::new("gcc").args(args).output().expect("gcc runs (the door's C tests need a C compiler)");
    assert!(out.status.success(), "gcc {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// The stand-in NCCL (as `<dir>/standin/libnccl.so.2`) and the driver linked against it.
fn build(dir: &Path) -> (PathBuf, PathBuf) {
    let sources = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join("c");
    let standin_dir = dir.join("standin");
    std::fs::create_dir_all(&standin_dir).expect("folder");
    let standin = standin_dir.join("libnccl.so.2");
    let (standin_s, source) = (standin.to_string_lossy().into_owned(), sources.join("standin.c"));
    gcc(&["-shared", "-fPIC", "-Wall", "-Wl,-soname,libnccl.so.2", "-o", &standin_s, &source.to_string_lossy()]);
    let driver = dir.join("driver");
    let rpath = format!("-Wl,-rpath,{}", standin_dir.display());
    let (driver_s, source) = (driver.to_string_lossy().into_owned(), sources.join("driver.c"));
    gcc(&["-Wall", "-o", &driver_s, &source.to_string_lossy(), &standin_s, &rpath]);
    (standin, driver)
}

/// What one run printed, and what the stand-in recorded.
struct Run {
    stdout: String,
    stderr: String,
    log: String,
}

impl Run {
    fn lines(&self, prefix: &str) -> Vec<&str> {
        self.stdout.lines().filter(|l| l.starts_with(prefix)).collect()
    }

    fn calls(&self, name: &str) -> Vec<&str> {
        self.log.lines().filter(|l| l.split(' ').next() == Some(name)).collect()
    }
}

/// Run the driver's `scenario` with the door preloaded and `env` set; no GPU is used
/// (`CUDA_VISIBLE_DEVICES` is empty), so the door finds no device to serve on.
fn run(dir: &Path, driver: &Path, scenario: &[&str], env: &[(&str, &str)]) -> Run {
    let log = dir.join(format!("{}.log", scenario.join("-")));
    let _ = std::fs::remove_file(&log);
    let mut cmd = Command::new(driver);
    cmd.args(scenario)
        .env("LD_PRELOAD", door())
        .env("STANDIN_LOG", &log)
        .env("CUDA_VISIBLE_DEVICES", "")
        .env("GP2P_NCCL_TIMEOUT", "30")
        .env_remove("GP2P_NCCL")
        .env_remove("GP2P_NCCL_REAL")
        .env_remove("NCCL_DEBUG")
        .env_remove("LD_LIBRARY_PATH");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("the driver runs");
    assert!(out.status.success(), "driver {scenario:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    Run {
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        log: std::fs::read_to_string(&log).unwrap_or_default(),
    }
}

/// The stand-in's unique id, first 16 bytes in hex.
const STANDIN_ID: &str = "5a5a5a5a11223344020012347f000001";
/// The door id's magic in hex (`gp2pDOOR`).
const DOOR_MAGIC: &str = "67703270444f4f52";

#[test]
fn every_rank_hands_over_through_the_rendezvous_and_every_call_reaches_the_real_nccl_untouched() {
    let dir = scratch("hand-over");
    let (standin, driver) = build(&dir);
    let standin = standin.to_string_lossy().into_owned();
    let r = run(&dir, &driver, &["ranks", "3"], &[("GP2P_NCCL_REAL", &standin)]);
    assert_eq!(r.lines("version"), ["version 0 22703 22703"], "the real library's version, through the alias too");
    let id = r.lines("unique_id");
    assert!(id.len() == 1 && id[0].starts_with(&format!("unique_id 0 {DOOR_MAGIC}")), "{id:?}");
    for rank in 0..3 {
        for (what, expected) in [
            ("init", "0"),
            ("allreduce", "0"),
            ("bcast", "0"),
            ("count", "0 100"),
            ("async", "0 0"),
            ("group", "0 0"),
            ("destroy", "0"),
        ] {
            let line = format!("rank {rank} {what} {expected}");
            assert!(r.stdout.lines().any(|l| l.starts_with(&line)), "no `{line}` in:\n{}\n{}", r.stdout, r.stderr);
        }
        let init = format!("ncclCommInitRank nranks=3 rank={rank} id={STANDIN_ID} rest_zero=1");
        assert!(r.calls("ncclCommInitRank").contains(&init.as_str()), "{init} in\n{}", r.log);
        let all_reduce =
            format!("ncclAllReduce comm={rank} send=0x1000 recv=0x2000 count=256 datatype=7 op=0 stream=0x77");
        assert!(r.calls("ncclAllReduce").contains(&all_reduce.as_str()), "{all_reduce} in\n{}", r.log);
        let bcast = format!("ncclBroadcast comm={rank} send=0x3000 recv=0x3000 count=8 datatype=2 root=1 stream=(nil)");
        assert!(r.calls("ncclBroadcast").contains(&bcast.as_str()), "{bcast} in\n{}", r.log);
    }
    // One real id a process names the interface the rendezvous listens on; the hand-over's
    // own is made once the verdict is known (a served communicator's id makes none).
    assert_eq!(r.calls("ncclGetUniqueId").len(), 2);
    assert!(r.calls("ncclBcast").is_empty(), "ncclBcast goes as the in-place ncclBroadcast");
    assert_eq!(r.calls("ncclCommDestroy").len(), 3);
    assert_eq!(r.calls("ncclGroupStart").len(), 3);
    let said: Vec<&str> = r.stderr.lines().filter(|l| l.starts_with("geforce-p2p NCCL door: on: handing")).collect();
    assert_eq!(said.len(), 3, "each rank's process says it once:\n{}", r.stderr);
    for rank in 0..3 {
        let line = said.iter().find(|l| l.ends_with(&format!("[rank {rank}]"))).expect("rank's line");
        assert!(line.contains("3 rank(s)") && line.contains("has no device the door can use"), "{line}");
    }
}

#[test]
fn with_the_door_off_the_real_id_and_communicators_pass_through_without_a_rendezvous() {
    let dir = scratch("off");
    let (standin, driver) = build(&dir);
    let standin = standin.to_string_lossy().into_owned();
    let r = run(&dir, &driver, &["ranks", "2"], &[("GP2P_NCCL_REAL", &standin), ("GP2P_NCCL", "off")]);
    assert_eq!(r.lines("unique_id"), [format!("unique_id 0 {STANDIN_ID}")]);
    assert_eq!(r.calls("ncclCommInitRank").len(), 2, "{}", r.log);
    assert_eq!(r.calls("ncclAllReduce").len(), 2);
    assert!(!r.stderr.contains("handing"), "no decision to announce: {}", r.stderr);
}

#[test]
fn the_real_nccl_is_found_in_ld_library_path_and_the_door_never_loads_itself() {
    let dir = scratch("discovery");
    let (standin, driver) = build(&dir);
    // The door under the real library's file name, first in the path: it must be skipped.
    let decoy = dir.join("decoy");
    std::fs::create_dir_all(&decoy).expect("folder");
    std::fs::copy(door(), decoy.join("libnccl.so.2")).expect("copy");
    let path = format!("{}:{}", decoy.display(), standin.parent().expect("folder").display());
    let mut r = run(&dir, &driver, &["ranks", "1"], &[("LD_LIBRARY_PATH", &path)]);
    assert_eq!(r.lines("version"), ["version 0 22703 22703"], "{}", r.stderr);
    assert!(r.lines("rank 0 init 0").len() == 1, "{}", r.stdout);
    // Preloaded from the decoy itself: its own file is never the real one either.
    r = {
        let mut cmd = Command::new(&driver);
        cmd.args(["ranks", "1"])
            .env("LD_PRELOAD", decoy.join("libnccl.so.2"))
            .env("LD_LIBRARY_PATH", &path)
            .env("CUDA_VISIBLE_DEVICES", "")
            .env("STANDIN_LOG", dir.join("decoy.log"))
            .env("GP2P_NCCL_TIMEOUT", "30")
            .env_remove("GP2P_NCCL_REAL")
            .env_remove("GP2P_NCCL");
        let out = cmd.output().expect("runs");
        Run {
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            log: String::new(),
        }
    };
    assert_eq!(r.lines("version"), ["version 0 22703 22703"], "{}", r.stderr);
}

#[test]
fn without_a_real_nccl_a_hand_over_fails_on_every_rank_saying_how_to_fix_it() {
    let dir = scratch("no-real");
    let (_, driver) = build(&dir);
    let r = run(&dir, &driver, &["ranks", "2"], &[("GP2P_NCCL_REAL", "/nonexistent/libnccl.so.2")]);
    assert_eq!(r.lines("version"), ["version 0 22809 22809"], "the header's version without a real one");
    assert!(r.lines("unique_id")[0].starts_with(&format!("unique_id 0 {DOOR_MAGIC}")));
    for rank in 0..2 {
        assert!(r.lines(&format!("rank {rank} init 2")).len() == 1, "ncclSystemError:\n{}", r.stdout);
        let message = r.lines(&format!("rank {rank} last_error"));
        assert!(
            message.len() == 1
                && message[0].contains("must run on the real NCCL")
                && message[0].contains("GP2P_NCCL_REAL"),
            "{message:?}"
        );
    }
}

#[test]
fn bad_arguments_return_nccl_s_codes_and_name_the_argument() {
    let dir = scratch("bad");
    let (_, driver) = build(&dir);
    let r = run(&dir, &driver, &["bad"], &[("GP2P_NCCL_REAL", "/nonexistent/libnccl.so.2")]);
    let expect = |key: &str, code: &str, words: &str| {
        let line = r.lines(&format!("{key} ")).first().copied().unwrap_or_default().to_owned();
        assert!(line.starts_with(&format!("{key} {code} ")) && line.contains(words), "{key}: {line}");
    };
    expect("null_comm_out", "4", "comm: null");
    expect("rank_too_big", "4", "rank: 2 is not in 0..2");
    expect("no_ranks", "4", "nranks: 0");
    expect("null_comm", "4", "comm: null");
    expect("unknown_comm", "4", "is not a communicator");
    expect("end_without_start", "5", "ncclGroupEnd without ncclGroupStart");
    assert_eq!(r.lines("null_version"), ["null_version 4"]);
    assert_eq!(r.lines("error_string "), ["error_string invalid usage (run with NCCL_DEBUG=WARN for details)"]);
    assert_eq!(r.lines("error_string_unknown"), ["error_string_unknown unknown result code"]);
}

#[test]
fn a_caller_s_config_reaches_the_real_nccl_untouched_and_its_errors_come_back() {
    let dir = scratch("config");
    let (standin, driver) = build(&dir);
    let standin = standin.to_string_lossy().into_owned();
    let r = run(&dir, &driver, &["config"], &[("GP2P_NCCL_REAL", &standin)]);
    let at = r.lines("config_at ")[0].trim_start_matches("config_at ").to_owned();
    let init = r.calls("ncclCommInitRankConfig");
    assert_eq!(
        init,
        [format!("ncclCommInitRankConfig config={at} size=80 magic=cafebeef blocking=1").as_str()],
        "{}",
        r.log
    );
    assert_eq!(r.lines("init "), ["init 0"]);
    // The real NCCL's own message, as torch asks for it (with a null communicator).
    assert_eq!(r.lines("failing_call"), ["failing_call 5 the stand-in's last error"]);
    assert_eq!(r.lines("destroy"), ["destroy 0", "destroy_null 0"]);
}

#[test]
fn a_non_blocking_creation_is_in_progress_then_settles_on_the_door_s_copy_of_the_config() {
    let dir = scratch("nonblocking");
    let (standin, driver) = build(&dir);
    let standin = standin.to_string_lossy().into_owned();
    let r = run(&dir, &driver, &["nonblocking"], &[("GP2P_NCCL_REAL", &standin)]);
    assert_eq!(r.lines("init "), ["init 7"], "ncclInProgress:\n{}\n{}", r.stdout, r.stderr);
    assert_eq!(r.lines("settled"), ["settled 0"]);
    let init = r.calls("ncclCommInitRankConfig");
    assert!(init.len() == 1 && init[0].ends_with("size=80 magic=cafebeef blocking=0"), "{}", r.log);
    assert_eq!(r.calls("ncclCommInitRank").len(), 1);
}

#[test]
fn one_thread_creates_and_drives_two_ranks_in_groups() {
    let dir = scratch("grouped");
    let (standin, driver) = build(&dir);
    let standin = standin.to_string_lossy().into_owned();
    let r = run(&dir, &driver, &["grouped"], &[("GP2P_NCCL_REAL", &standin)]);
    assert_eq!(r.lines("group_init"), ["group_init 0 0 0 0"], "{}\n{}", r.stdout, r.stderr);
    assert_eq!(r.lines("group_calls"), ["group_calls 0 0 0"]);
    let inits = r.calls("ncclCommInitRank");
    for rank in 0..2 {
        let init = format!("ncclCommInitRank nranks=2 rank={rank} id={STANDIN_ID} rest_zero=1");
        assert!(inits.contains(&init.as_str()), "{init} in\n{}", r.log);
        assert!(r.log.contains(&format!("ncclAllReduce comm={rank} ")), "{}", r.log);
    }
    assert_eq!(r.lines("destroy"), ["destroy 0 0", "destroy 1 0"]);
}

#[test]
fn one_thread_creates_two_non_blocking_ranks_each_in_a_group_of_its_own() {
    let dir = scratch("grouped-nonblocking");
    let (standin, driver) = build(&dir);
    let standin = standin.to_string_lossy().into_owned();
    // A group end that waited for its rank's creation would wait for the other rank, not yet
    // asked for, until this timeout, and then fail both.
    let env = [("GP2P_NCCL_REAL", standin.as_str()), ("GP2P_NCCL_TIMEOUT", "20")];
    let r = run(&dir, &driver, &["grouped_nonblocking"], &env);
    assert_eq!(r.lines("group_init"), ["group_init 0 0 0 7", "group_init 1 0 0 7"], "{}\n{}", r.stdout, r.stderr);
    assert_eq!(r.lines("settled"), ["settled 0 0", "settled 1 0"], "{}\n{}", r.stdout, r.stderr);
    let configs = r.calls("ncclCommInitRankConfig");
    assert!(configs.len() == 2 && configs.iter().all(|c| c.ends_with("blocking=0")), "{}", r.log);
    let inits = r.calls("ncclCommInitRank");
    for rank in 0..2 {
        assert!(inits.iter().any(|i| i.starts_with(&format!("ncclCommInitRank nranks=2 rank={rank} "))), "{}", r.log);
    }
    assert_eq!(r.lines("destroy"), ["destroy 0 0", "destroy 1 0"]);
}
