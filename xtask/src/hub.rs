//! `cargo xtask hub DIR [--wheel WHEEL]`: write DIR as a Hugging Face `kernels` repository of
//! the `geforce_p2p` package, which users load with
//! `get_kernel("<org>/geforce-p2p", version=1, trust_remote_code=True)`.
//!
//! Without `--wheel` it builds the release wheel first, as docs/python.md describes (maturin
//! with zig, manylinux_2_28, in a virtual environment under
//! `target/hub-build`, the NCCL door beside the extension: `crate::door`); the layout itself is `crates/gp2p-python/hub/make_repo.py`'s, whose
//! module docs say which variants and why.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::command::run;

/// Where the build environment and the wheel go.
const WORK: &str = "target/hub-build";

/// Build (or take) the wheel and lay out the repository in `out`.
pub fn hub(root: &Path, out: &Path, wheel: Option<&Path>) -> Result<(), String> {
    let wheel = match wheel {
        Some(wheel) => wheel.to_path_buf(),
        None => build_wheel(root)?,
    };
    let script = root.join("crates/gp2p-python/hub/make_repo.py");
    run(Command::new("python3").arg(script).arg("--wheel").arg(&wheel).arg("--out").arg(out))
}

/// The release wheel, built in a fresh output folder so exactly one wheel is there.
fn build_wheel(root: &Path) -> Result<PathBuf, String> {
    let work = root.join(WORK);
    let venv = work.join("venv");
    let python = venv.join("bin/python");
    if !python.exists() {
        run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
        run(Command::new(&python)
            .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check"])
            .args(["maturin>=1.7,<2", "ziglang"]))?;
    }
    // The door first: maturin packs it with the package's other files.
    crate::door::build_with_zig(root, &python, &work.join("door"))?;
    let wheels = work.join("wheel");
    if wheels.exists() {
        std::fs::remove_dir_all(&wheels).map_err(|e| format!("removing {}: {e}", wheels.display()))?;
    }
    run(Command::new(venv.join("bin/maturin"))
        .current_dir(root)
        // Its own target folder: a release build with zig as the linker shares nothing with
        // the workspace's builds, and would otherwise hold their lock for minutes.
        .env("CARGO_TARGET_DIR", work.join("cargo"))
        // maturin finds zig as `python3 -m ziglang`: the environment's python must come first.
        .env("PATH", search_path(&venv.join("bin")))
        .args(["build", "--release", "-m", "crates/gp2p-python/Cargo.toml", "--zig"])
        .args(["--compatibility", "manylinux_2_28", "--out"])
        .arg(&wheels))?;
    let mut built: Vec<PathBuf> = std::fs::read_dir(&wheels)
        .map_err(|e| format!("reading {}: {e}", wheels.display()))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "whl"))
        .collect();
    match (built.pop(), built.is_empty()) {
        (Some(wheel), true) => Ok(wheel),
        _ => Err(format!("maturin left no single wheel in {}", wheels.display())),
    }
}

/// `PATH` with `first` in front.
fn search_path(first: &Path) -> std::ffi::OsString {
    let rest = std::env::var_os("PATH").unwrap_or_default();
    let mut paths = vec![first.to_path_buf()];
    paths.extend(std::env::split_paths(&rest));
    std::env::join_paths(paths).unwrap_or(rest)
}
