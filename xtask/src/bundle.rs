//! `cargo xtask test-gpu [--bundle DIR]`: release builds of the GPU suite and of `gp2p`,
//! with a `run` script that needs no Rust toolchain on the GPU machine.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The package holding the GPU tests.
const SUITE_PACKAGE: &str = "gp2p-tests";
/// The package holding the criterion benches.
const BENCH_PACKAGE: &str = "gp2p-benches";

/// Which of cargo's artifact messages to keep.
type ArtifactFilter<'a> = &'a dyn Fn(&serde_json::Value) -> bool;

/// Build the bundle under target/ and run it here; fails when no GPU is found.
pub fn run_here(root: &Path) -> Result<(), String> {
    let dir = root.join("target").join("gpu-bundle");
    bundle(root, &dir)?;
    let status =
        Command::new(dir.join("run")).status().map_err(|e| format!("running {}: {e}", dir.join("run").display()))?;
    if status.success() { Ok(()) } else { Err(format!("the GPU suite failed ({status})")) }
}

/// Build the suite's test binaries and `gp2p` in release mode into `dir`, with `dir/run`.
pub fn bundle(root: &Path, dir: &Path) -> Result<(), String> {
    let (tests_dir, benches_dir, bin_dir) = (dir.join("tests"), dir.join("benches"), dir.join("bin"));
    let _ = fs::remove_dir_all(dir);
    for d in [&tests_dir, &benches_dir, &bin_dir] {
        fs::create_dir_all(d).map_err(|e| format!("creating {}: {e}", d.display()))?;
    }
    let is_test = |m: &serde_json::Value| m["profile"]["test"].as_bool() == Some(true);
    let is_bench = |m: &serde_json::Value| is_test(m) && has_kind(m, "bench");
    let is_gp2p = |m: &serde_json::Value| has_kind(m, "bin") && m["target"]["name"] == "gp2p";
    // The GPU suite; the criterion benches, so host-side costs can be measured beside a GPU
    // (bench builds are release already); and gp2p with `testing`, so `gp2p bench
    // all-reduce --ranks N` can run logical ranks on one GPU.
    let builds: [(&[&str], ArtifactFilter, &PathBuf); 3] = [
        (&["test", "--release", "--no-run", "--package", SUITE_PACKAGE], &is_test, &tests_dir),
        (&["bench", "--no-run", "--package", BENCH_PACKAGE], &is_bench, &benches_dir),
        (&["build", "--release", "--package", "gp2p-cli", "--features", "testing"], &is_gp2p, &bin_dir),
    ];
    for (args, keep, into) in builds {
        for (name, exe) in build_binaries(root, args, keep)? {
            copy(&exe, &into.join(&name))?;
        }
    }
    let script = dir.join("run");
    fs::write(&script, RUN_SCRIPT).map_err(|e| format!("writing {}: {e}", script.display()))?;
    make_executable(&script)?;
    // Every binary embeds the same PTX, some 20 MiB apart in a tar: xz -9's 64 MiB window finds
    // the repeats (354 MB packed into 6.2 MB), `tar cJf`'s default 8 MiB one does not (22.5 MB).
    println!(
        "bundle ready: {d} (run `{d}/run` or `{d}/run --sanitize` on the GPU machine; \
         to carry it small: `tar cf - {d} | xz -9 > target/carry/bundle.tar.xz`)",
        d = dir.display()
    );
    Ok(())
}

/// Run cargo with `args` and JSON messages; returns (target name, executable) of every
/// artifact that `keep` accepts. Paths come from cargo itself, so CARGO_TARGET_DIR holds.
fn build_binaries(
    root: &Path,
    args: &[&str],
    keep: impl Fn(&serde_json::Value) -> bool,
) -> Result<Vec<(String, PathBuf)>, String> {
    let output = Command::new(env_cargo())
        .current_dir(root)
        .args(args)
        .arg("--message-format=json")
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("running cargo: {e}"))?;
    let what = args.join(" ");
    if !output.status.success() {
        return Err(format!("cargo {what} failed ({})", output.status));
    }
    let mut binaries = Vec::new();
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let Ok(message) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if let (true, Some(exe), Some(name)) =
            (keep(&message), message["executable"].as_str(), message["target"]["name"].as_str())
        {
            binaries.push((name.replace('-', "_"), PathBuf::from(exe)));
        }
    }
    if binaries.is_empty() {
        return Err(format!("cargo {what} built no binaries"));
    }
    Ok(binaries)
}

/// Whether a cargo artifact message's target is of `kind` (bin, bench, test, ...).
fn has_kind(message: &serde_json::Value, kind: &str) -> bool {
    message["target"]["kind"].as_array().is_some_and(|kinds| kinds.iter().any(|k| k.as_str() == Some(kind)))
}

fn env_cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

/// Copy a binary into the bundle without its debug info (symbols stay, so sanitizer
/// backtraces keep function names): the bundle must travel in a few tens of MiB.
fn copy(from: &Path, to: &Path) -> Result<(), String> {
    fs::copy(from, to).map_err(|e| format!("copying {} to {}: {e}", from.display(), to.display()))?;
    // Best effort: where binutils' strip is missing the bundle is only larger.
    let _ = Command::new("strip").arg("--strip-debug").arg(to).status();
    Ok(())
}

#[cfg(unix)]
fn make_executable(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(path, fs::Permissions::from_mode(0o755)).map_err(|e| format!("chmod {}: {e}", path.display()))
}

#[cfg(not(unix))]
fn make_executable(_: &Path) -> Result<(), String> {
    Ok(())
}

/// The bundle's runner. It runs every test; a GPU test that finds this machine lacking what
/// it needs (`gp2p_tests::needs!`) prints one `gp2p-not-run: <test> <reason>` line and
/// returns, and the runner moves it from libtest's passed to not run, grouped by reason in
/// the closing line. Test names decide nothing.
const RUN_SCRIPT: &str = r#"#!/usr/bin/env bash
# geforce-p2p GPU suite. Usage: run [--sanitize [memcheck|racecheck]]
#   (no flag)   every test, CPU and GPU, in release mode
#   --sanitize  the GPU tests under compute-sanitizer memcheck, then racecheck (or the one named)
# Environment: GP2P_TEST_MAX_LEN caps the longest test length; TEST_THREADS (default 4, and 1
# under the sanitizer, whose racecheck lost track of launches from several test threads);
# GP2P_TEST_TIMEOUT (seconds, default 900) kills a test binary that hangs, as a failure.
# A test this machine cannot run (too few GPUs) prints "gp2p-not-run: <test> <reason>" and is
# counted as not run, never as passed. Closing line:
#   gp2p GPU suite (MODE): X passed, Y failed, Z not run (REASON: N; ...)
set -u
here=$(cd "$(dirname "$0")" && pwd)
mode=plain
threads=${TEST_THREADS:-4}
tools="memcheck racecheck"
case "${1:-}" in
  "") ;;
  --sanitize) mode=sanitize; threads=${TEST_THREADS:-1} ;;
  *) echo "usage: $0 [--sanitize [memcheck|racecheck]]" >&2; exit 2 ;;
esac
case "${2:-}" in
  "") ;;
  memcheck | racecheck) tools=$2 ;;
  *) echo "usage: $0 [--sanitize [memcheck|racecheck]]" >&2; exit 2 ;;
esac
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [ "${gpus:-0}" -lt 1 ]; then
  echo "no NVIDIA GPU found (nvidia-smi -L lists none): the GPU suite needs one" >&2
  exit 1
fi
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
passed=0
failed=0
not_run=0
not_run_log=$(mktemp)
trap 'rm -f "$not_run_log"' EXIT
count() { # word log: sum "N word;" over libtest's result lines
  grep -E '^test result:' "$2" | awk -v w="$1;" '{for (i = 2; i <= NF; i++) if ($i == w) s += $(i - 1)} END {print s + 0}'
}
run_suite() { # glob prefix...
  glob=$1
  shift
  for t in "$here"/tests/$glob; do
    name=$(basename "$t")
    log=$(mktemp)
    # --show-output prints what passing tests printed, the not-run lines among it.
    timeout --signal=KILL "${GP2P_TEST_TIMEOUT:-900}" "$@" "$t" --include-ignored --test-threads="$threads" --show-output >"$log" 2>&1
    rc=$?
    if [ "$rc" -eq 137 ]; then
      echo "!! $name was killed after ${GP2P_TEST_TIMEOUT:-900} s (hung)"
    fi
    cat "$log"
    p=$(count passed "$log")
    f=$(count failed "$log")
    # libtest lists a test that returned early as passed: one not-run line moves it.
    n=$(grep -o 'gp2p-not-run: .*' "$log" | tee -a "$not_run_log" | wc -l)
    passed=$((passed + ${p:-0} - n))
    failed=$((failed + ${f:-0}))
    not_run=$((not_run + n))
    if [ "$rc" -ne 0 ] && [ "${f:-0}" -eq 0 ]; then
      # A binary whose every test was not run made no CUDA call beyond counting devices,
      # and the sanitizer may call that an error ("terminated before first instrumented API
      # call"). Accepted only then: every test accounted for as not run, nothing unchecked.
      if [ "$mode" = sanitize ] && [ "${p:-0}" -eq "$n" ] && grep -q 'before first instrumented API call' "$log"; then
        echo "-- $name: every test was not run here, so the sanitizer saw no CUDA work (not an error)"
      else
        echo "!! $name exited with $rc without a failing test (crash or sanitizer error)"
        failed=$((failed + 1))
      fi
    fi
    rm -f "$log"
  done
}
if [ "$mode" = plain ]; then
  run_suite "*" env
else
  for tool in $tools; do
    echo "== compute-sanitizer --tool $tool"
    # Only binaries with GPU tests: the sanitizer fails a program that never calls CUDA.
    # GP2P_SANITIZER tells tests whose kernels must run at once that they will not (the
    # sanitizer runs kernels one at a time): they report themselves not run.
    # The one-kernel chunk exchange between two devices of one process is off for the same
    # reason (each call would wait out its queue timeout); gpu_lines runs it outside.
    run_suite "gpu_*" env GP2P_SANITIZER="$tool" GP2P_CHUNK_EXCHANGE_MAX_BYTES=0 "$sanitizer" --tool "$tool" --error-exitcode 86 --print-limit 20
  done
fi
echo
if [ "$not_run" -gt 0 ]; then
  echo "== not run"
  cat "$not_run_log"
  # "needs 2 GPUs, 1 present: 9; ...": each reason (the line less its first two fields) and its count.
  why=$(sed -E 's/^gp2p-not-run: [^ ]+ //' "$not_run_log" | sort | uniq -c |
    awk '{n = $1; sub(/^ *[0-9]+ /, ""); printf "%s%s: %d", (NR > 1 ? "; " : ""), $0, n}')
else
  why="every test's needs met"
fi
label=$mode; [ "$mode" = sanitize ] && label="sanitize: $tools"
echo "gp2p GPU suite ($label): $passed passed, $failed failed, $not_run not run ($why)"
[ "$failed" -eq 0 ]
"#;

/// The runner's counting, run on a fake bundle: stand-ins for `nvidia-smi`, the sanitizer and
/// two test binaries that print what libtest prints.
#[cfg(all(test, unix))]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // a test: failing is how it reports

    use super::*;

    /// A libtest run of three tests: one passed, one not run (it printed the line and
    /// returned, so libtest says passed), one failed.
    const MIXED: &str = r#"#!/usr/bin/env bash
cat <<'OUT'
running 3 tests
test a ... ok
test b ... ok
test c ... FAILED

successes:

---- b stdout ----
gp2p-not-run: gpu_mixed::b needs 2 GPUs, 1 present

failures:

---- c stdout ----
thread 'c' panicked at tests/c.rs:1:1: wrong

test result: FAILED. 2 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.00s
OUT
exit 101
"#;

    /// A binary whose every test was not run: two lines, libtest says two passed.
    const NONE_RUN: &str = r#"#!/usr/bin/env bash
cat <<'OUT'
running 2 tests
test d ... ok
test e ... ok

successes:

---- d stdout ----
gp2p-not-run: gpu_two::d needs 2 GPUs, 1 present

---- e stdout ----
gp2p-not-run: gpu_two::e needs 2 GPUs, 1 present

test result: ok. 2 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.00s
OUT
"#;

    /// compute-sanitizer on a program that made no CUDA call: the program's output, then
    /// the sanitizer's complaint and a failing exit.
    const SANITIZER: &str = r#"#!/usr/bin/env bash
while [ "${1#--}" != "$1" ]; do shift 2; done
"$@"
echo "========= Error: Target application terminated before first instrumented API call"
exit 1
"#;

    fn write_script(path: &Path, text: &str) {
        fs::write(path, text).unwrap();
        make_executable(path).unwrap();
    }

    /// The runner's closing line for a fake bundle holding `binaries`, in `mode`'s arguments.
    fn closing_line(name: &str, binaries: &[(&str, &str)], args: &[&str]) -> (String, bool) {
        let dir = std::env::temp_dir().join(format!("gp2p-xtask-runner-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let (tests, bin) = (dir.join("tests"), dir.join("fake-bin"));
        fs::create_dir_all(&tests).unwrap();
        fs::create_dir_all(&bin).unwrap();
        write_script(&dir.join("run"), RUN_SCRIPT);
        write_script(&bin.join("nvidia-smi"), "#!/bin/sh\necho 'GPU 0: NVIDIA Fake (UUID: GPU-0)'\n");
        write_script(&bin.join("compute-sanitizer"), SANITIZER);
        for (file, text) in binaries {
            write_script(&tests.join(file), text);
        }
        let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
        let out = Command::new("bash").arg(dir.join("run")).args(args).env("PATH", path).output().unwrap();
        fs::remove_dir_all(&dir).unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let last = stdout.lines().last().unwrap_or_default().to_owned();
        (last, out.status.success())
    }

    #[test]
    fn not_run_lines_move_tests_from_passed_to_not_run_grouped_by_reason() {
        let (line, ok) = closing_line("plain", &[("gpu_mixed", MIXED), ("gpu_two", NONE_RUN)], &[]);
        assert_eq!(line, "gp2p GPU suite (plain): 1 passed, 1 failed, 3 not run (needs 2 GPUs, 1 present: 3)");
        assert!(!ok, "a failed test fails the run");
        let (line, ok) = closing_line("clean", &[("gpu_two", NONE_RUN)], &[]);
        assert_eq!(line, "gp2p GPU suite (plain): 0 passed, 0 failed, 2 not run (needs 2 GPUs, 1 present: 2)");
        assert!(ok);
    }

    #[test]
    fn the_sanitizer_finding_no_cuda_call_is_no_failure_only_when_nothing_ran() {
        let (line, ok) = closing_line("sanitize", &[("gpu_two", NONE_RUN)], &["--sanitize", "memcheck"]);
        assert_eq!(
            line,
            "gp2p GPU suite (sanitize: memcheck): 0 passed, 0 failed, 2 not run (needs 2 GPUs, 1 present: 2)"
        );
        assert!(ok);
        // A binary that ran a test and still drew the complaint is a failure.
        let ran = NONE_RUN.replace("gp2p-not-run: gpu_two::e needs 2 GPUs, 1 present", "ran");
        let (line, ok) = closing_line("sanitize-ran", &[("gpu_two", &ran)], &["--sanitize", "memcheck"]);
        assert_eq!(
            line,
            "gp2p GPU suite (sanitize: memcheck): 1 passed, 1 failed, 1 not run (needs 2 GPUs, 1 present: 1)"
        );
        assert!(!ok);
    }
}
