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
    println!(
        "bundle ready: {} (run `{}/run` or `{}/run --sanitize` on the GPU machine)",
        dir.display(),
        dir.display(),
        dir.display()
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

/// The bundle's runner. Two-GPU tests are named `two_gpu_*`; with fewer than two GPUs they
/// are listed as not run, never counted as passed.
const RUN_SCRIPT: &str = r#"#!/usr/bin/env bash
# geforce-p2p GPU suite. Usage: run [--sanitize [memcheck|racecheck]]
#   (no flag)   every test, CPU and GPU, in release mode
#   --sanitize  the GPU tests under compute-sanitizer memcheck, then racecheck (or the one named)
# Environment: GP2P_TEST_MAX_LEN caps the longest test length; TEST_THREADS (default 4, and 1
# under the sanitizer, whose racecheck lost track of launches from several test threads);
# GP2P_TEST_TIMEOUT (seconds, default 900) kills a test binary that hangs, as a failure.
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
skip=()
not_run=0
if [ "$gpus" -lt 2 ]; then
  skip=(--skip two_gpu)
  for t in "$here"/tests/*; do
    n=$("$t" --list --include-ignored 2>/dev/null | grep -c 'two_gpu.*: test' || true)
    not_run=$((not_run + n))
  done
fi
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
passed=0
failed=0
count() { # word log: sum "N word;" over libtest's result lines
  grep -E '^test result:' "$2" | awk -v w="$1;" '{for (i = 2; i <= NF; i++) if ($i == w) s += $(i - 1)} END {print s + 0}'
}
run_suite() { # glob prefix...
  glob=$1
  shift
  for t in "$here"/tests/$glob; do
    name=$(basename "$t")
    # A binary left with no test (the two-GPU tests on one GPU) never calls CUDA, which the
    # sanitizer reports as a failure: skip it.
    if ! "$t" --list --include-ignored "${skip[@]}" 2>/dev/null | grep -q ': test$'; then
      echo "-- $name: no test to run here"
      continue
    fi
    log=$(mktemp)
    timeout --signal=KILL "${GP2P_TEST_TIMEOUT:-900}" "$@" "$t" --include-ignored --test-threads="$threads" "${skip[@]}" >"$log" 2>&1
    rc=$?
    if [ "$rc" -eq 137 ]; then
      echo "!! $name was killed after ${GP2P_TEST_TIMEOUT:-900} s (hung)"
    fi
    cat "$log"
    p=$(count passed "$log")
    f=$(count failed "$log")
    passed=$((passed + ${p:-0}))
    failed=$((failed + ${f:-0}))
    if [ "$rc" -ne 0 ] && [ "${f:-0}" -eq 0 ]; then
      echo "!! $name exited with $rc without a failing test (crash or sanitizer error)"
      failed=$((failed + 1))
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
    run_suite "gpu_*" "$sanitizer" --tool "$tool" --error-exitcode 86 --print-limit 20
  done
fi
echo
label=$mode; [ "$mode" = sanitize ] && label="sanitize: $tools"
echo "gp2p GPU suite ($label): $passed passed, $failed failed, $not_run not run (need two GPUs)"
[ "$failed" -eq 0 ]
"#;
