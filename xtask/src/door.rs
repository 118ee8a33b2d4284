//! The NCCL door (crate `gp2p-nccl`) built for the Python package, which ships it as
//! `geforce_p2p/_nccl/libnccl.so.2` ([`SHIPPED`]: maturin packs every file of the package's
//! folder). The Hub's release build links it as maturin links the extension, with zig for
//! manylinux_2_28, and strips it as the extension is stripped; `tests/python/run-cpu-tests`
//! copies the workspace's own build instead.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::command::run;

/// Where the package keeps the door, from the workspace root.
pub const SHIPPED: &str = "crates/gp2p-python/python/geforce_p2p/_nccl/libnccl.so.2";
/// The glibc the release build links against (maturin's `--compatibility manylinux_2_28`).
const ZIG_TARGET: &str = "x86_64-linux-gnu.2.28";

/// Build the door in release with zig from `python`'s environment (where `ziglang` is
/// installed) as the linker, under `target_dir`, and put it where the package ships it.
pub fn build_with_zig(root: &Path, python: &Path, target_dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(target_dir).map_err(|e| format!("creating {}: {e}", target_dir.display()))?;
    let linker = target_dir.join("zig-cc");
    let script = format!("#!/bin/sh\nexec '{}' -m ziglang cc -target {ZIG_TARGET} \"$@\"\n", python.display());
    std::fs::write(&linker, script).map_err(|e| format!("writing {}: {e}", linker.display()))?;
    make_executable(&linker)?;
    run(Command::new("cargo")
        .current_dir(root)
        .env("CARGO_TARGET_DIR", target_dir)
        .env("CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER", &linker)
        .env("CARGO_PROFILE_RELEASE_STRIP", "symbols")
        .args(["build", "--release", "--quiet", "-p", "gp2p-nccl", "--target", "x86_64-unknown-linux-gnu"]))?;
    let built: PathBuf = target_dir.join("x86_64-unknown-linux-gnu/release/libgp2p_nccl.so");
    ship(root, &built)
}

/// Copy a built door to where the package ships it.
fn ship(root: &Path, built: &Path) -> Result<(), String> {
    let shipped = root.join(SHIPPED);
    if let Some(folder) = shipped.parent() {
        std::fs::create_dir_all(folder).map_err(|e| format!("creating {}: {e}", folder.display()))?;
    }
    std::fs::copy(built, &shipped).map_err(|e| format!("copying {} to {}: {e}", built.display(), shipped.display()))?;
    Ok(())
}

fn make_executable(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("making {} executable: {e}", path.display()))
}
