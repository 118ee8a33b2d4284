//! What the door's tests share: NCCL 2.28.9's own wheel (its `nccl.h` and `libnccl.so.2`), the
//! reference the ABI and the exported names are checked against, fetched with pip once into
//! the target folder.
// Each test file uses some of these helpers; a test: failing is how it reports.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// The NCCL the door implements the interface of.
pub const NCCL_WHEEL: &str = "nvidia-nccl-cu13==2.28.9";

/// The target folder (the test runs from `target/<profile>/deps`).
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's path");
    exe.ancestors().nth(3).expect("target/<profile>/deps/<test>").to_path_buf()
}

/// `nvidia/nccl` of NCCL 2.28.9's wheel (its `include/nccl.h`, `lib/libnccl.so.2`),
/// installed with pip into the target folder at first use. Panics, saying how to fix it,
/// where it cannot be had (no pip, no network): these tests are not skipped silently.
pub fn nccl_2_28() -> PathBuf {
    static INSTALL: Mutex<()> = Mutex::new(());
    let _one_at_a_time = INSTALL.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let root = target_dir().join("nccl-2.28.9");
    let nccl = root.join("nvidia").join("nccl");
    if nccl.join("include").join("nccl.h").exists() && nccl.join("lib").join("libnccl.so.2").exists() {
        return nccl;
    }
    let out = Command::new("python3")
        .args(["-m", "pip", "install", "--quiet", "--no-deps", "--target"])
        .arg(&root)
        .arg(NCCL_WHEEL)
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success() && nccl.join("include").join("nccl.h").exists(),
        "could not install {NCCL_WHEEL} into {}: {}\nInstall it there by hand: python3 -m pip install --no-deps --target {} {NCCL_WHEEL}",
        root.display(),
        String::from_utf8_lossy(&out.stderr),
        root.display()
    );
    nccl
}

/// The names a shared object exports (defined, dynamic), from `nm -D`.
pub fn exported(object: &Path) -> Vec<String> {
    let out = Command::new("nm").args(["-D", "--defined-only"]).arg(object).output().expect("nm runs (binutils)");
    assert!(out.status.success(), "nm {}: {}", object.display(), String::from_utf8_lossy(&out.stderr));
    let mut names: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2))
        .map(str::to_owned)
        .collect();
    names.sort();
    names
}

/// The door's shared object: in `deps` beside the test itself, where `cargo test` builds it
/// with the crate (the copy `cargo build` puts one folder up may be older).
pub fn door() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's path");
    let door = exe.parent().expect("target/<profile>/deps").join("libgp2p_nccl.so");
    assert!(door.exists(), "{} is built with the crate's tests", door.display());
    door
}
