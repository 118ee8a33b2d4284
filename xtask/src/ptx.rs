//! `cargo xtask ptx`: kernels/*.cu → kernels/*.ptx with NVRTC 12.0, and the `--check` mode.
//!
//! Each `.cu` is one kernel family and one PTX module per target; what the families share is
//! in headers beside them (`kernels/*.cuh`), found through an include path, never compiled
//! alone. `--check` rebuilds every family, so a header change that alters any PTX shows too.
//!
//! The dynamic loader reads LD_LIBRARY_PATH only when a process starts, and NVRTC itself
//! opens its builtins library by name; so the compile runs in a child xtask process started
//! with LD_LIBRARY_PATH pointing at the NVRTC 12.0 wheel installed under target/.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use cudarc::nvrtc::{CompileOptions, compile_ptx_with_opts};

/// The hidden subcommand the parent runs in the child.
pub const CHILD_COMMAND: &str = "__ptx-compile-child";

/// The PTX targets and the suffix of their files: PTX ISA 8.0 from NVRTC 12.0 loads on
/// drivers from 525 on; compute_80 is JIT-compiled by every card from Ampere up, compute_75
/// serves Turing (RTX 20-series), where bfloat16 is rounded without the sm_80 instruction.
const ARCHES: [(&str, &str); 2] = [("compute_80", ""), ("compute_75", ".compute_75")];

/// The pinned NVRTC wheels: a different NVRTC produces different PTX, so `--check` would fail.
const NVRTC_WHEELS: [&str; 2] = ["nvidia-cuda-nvrtc-cu12==12.0.140", "nvidia-cuda-runtime-cu12==12.0.146"];

/// Compile every kernel; write the PTX next to the sources, or with `check`, compare instead.
pub fn generate(root: &Path, check: bool) -> Result<(), String> {
    let nvrtc = ensure_nvrtc(root)?;
    let out_dir = root.join("target").join("xtask-ptx");
    let _ = fs::remove_dir_all(&out_dir);
    fs::create_dir_all(&out_dir).map_err(|e| format!("creating {}: {e}", out_dir.display()))?;
    let exe = std::env::current_exe().map_err(|e| format!("locating xtask itself: {e}"))?;
    let status = Command::new(exe)
        .arg(CHILD_COMMAND)
        .arg(&out_dir)
        .env("LD_LIBRARY_PATH", join_paths(&[nvrtc.join("lib")]))
        .status()
        .map_err(|e| format!("starting the NVRTC child process: {e}"))?;
    if !status.success() {
        return Err(format!("compiling the kernels failed ({status})"));
    }
    let targets = targets(root)?;
    let mut stale = Vec::new();
    for target in &targets {
        let fresh_path = out_dir.join(&target.ptx_name);
        let fresh = fs::read_to_string(&fresh_path).map_err(|e| format!("reading {}: {e}", fresh_path.display()))?;
        let committed_path = target.ptx_path();
        if check {
            let committed = fs::read_to_string(&committed_path).unwrap_or_default();
            if committed != fresh {
                stale.push(committed_path.display().to_string());
            }
        } else {
            fs::write(&committed_path, &fresh).map_err(|e| format!("writing {}: {e}", committed_path.display()))?;
            println!("wrote {} ({} bytes)", committed_path.display(), fresh.len());
        }
    }
    // PTX whose source is gone would still be committed and shipped: name it (check) or
    // delete it (generate), so the committed files are exactly the built ones.
    for orphan in committed_ptx(root)?.into_iter().filter(|p| !targets.iter().any(|t| t.ptx_path() == *p)) {
        if check {
            stale.push(format!("{} (no kernels/*.cu builds it)", orphan.display()));
        } else {
            fs::remove_file(&orphan).map_err(|e| format!("removing {}: {e}", orphan.display()))?;
            println!("removed {} (no kernels/*.cu builds it)", orphan.display());
        }
    }
    if stale.is_empty() {
        if check {
            println!("ptx: committed PTX matches the sources");
        }
        Ok(())
    } else {
        Err(format!("stale PTX, run `cargo xtask ptx` and commit: {}", stale.join(", ")))
    }
}

/// Runs in the child process, with LD_LIBRARY_PATH set: compile every source into `out_dir`.
pub fn compile_in_child(root: &Path, out_dir: &Path) -> Result<(), String> {
    let include = root.join("kernels");
    let include = include.to_str().ok_or_else(|| format!("{} is not UTF-8", include.display()))?;
    for Target { source, arch, ptx_name } in targets(root)? {
        let stem = stem_of(&source)?;
        let text = fs::read_to_string(&source).map_err(|e| format!("reading {}: {e}", source.display()))?;
        let options = CompileOptions {
            arch: Some(arch),
            options: vec!["--std=c++17".into()],
            // The shared headers (`#include "common.cuh"`): NVRTC compiles a source from
            // memory, with no folder of its own to look in. No line info is asked for, so
            // the path never reaches the PTX and a checkout anywhere builds the same text.
            include_paths: vec![include.to_owned()],
            name: Some(format!("{stem}.cu")),
            ..Default::default()
        };
        let ptx =
            compile_ptx_with_opts(text, options).map_err(|e| format!("NVRTC failed on {}: {e:?}", source.display()))?;
        let mut text = ptx.to_src();
        // NVRTC may end the text with NUL; the committed file and include_str! want none.
        text.retain(|c| c != '\0');
        let out = out_dir.join(ptx_name);
        fs::write(&out, text).map_err(|e| format!("writing {}: {e}", out.display()))?;
    }
    Ok(())
}

/// One PTX file to build: a kernel source, the target it is built for, and the file's name.
struct Target {
    source: PathBuf,
    arch: &'static str,
    ptx_name: String,
}

impl Target {
    /// Where the committed PTX lies: beside its source.
    fn ptx_path(&self) -> PathBuf {
        self.source.with_file_name(&self.ptx_name)
    }
}

/// Every source for every target in [`ARCHES`] (`reduce.ptx`, `reduce.compute_75.ptx`,
/// `exchange.ptx`, …).
fn targets(root: &Path) -> Result<Vec<Target>, String> {
    let mut all = Vec::new();
    for source in kernel_sources(root)? {
        let stem = stem_of(&source)?;
        for (arch, suffix) in ARCHES {
            all.push(Target { source: source.clone(), arch, ptx_name: format!("{stem}{suffix}.ptx") });
        }
    }
    Ok(all)
}

/// `kernels/*.cu`, one per kernel family (headers, `*.cuh`, are not listed).
fn kernel_sources(root: &Path) -> Result<Vec<PathBuf>, String> {
    let sources = kernel_files(root, "cu")?;
    if sources.is_empty() {
        return Err(format!("no .cu files in {}", root.join("kernels").display()));
    }
    Ok(sources)
}

/// `kernels/*.ptx`, as committed.
fn committed_ptx(root: &Path) -> Result<Vec<PathBuf>, String> {
    kernel_files(root, "ptx")
}

/// The files of `kernels/` ending in `.{extension}`, sorted so the output order never depends
/// on the file system.
fn kernel_files(root: &Path, extension: &str) -> Result<Vec<PathBuf>, String> {
    let dir = root.join("kernels");
    let entries = fs::read_dir(&dir).map_err(|e| format!("listing {}: {e}", dir.display()))?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == extension))
        .collect();
    files.sort();
    Ok(files)
}

fn stem_of(path: &Path) -> Result<String, String> {
    path.file_stem()
        .and_then(|s| s.to_str())
        .map(str::to_owned)
        .ok_or_else(|| format!("{} has no usable file name", path.display()))
}

/// The NVRTC 12.0 install: `GP2P_NVRTC_DIR` if set, else target/nvrtc-12.0 (installed from
/// PyPI on first use). Returns the wheel's `nvidia/cuda_nvrtc` folder.
fn ensure_nvrtc(root: &Path) -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os("GP2P_NVRTC_DIR") {
        return Ok(PathBuf::from(dir));
    }
    let site = root.join("target").join("nvrtc-12.0");
    let nvrtc = site.join("nvidia").join("cuda_nvrtc");
    if nvrtc.join("lib").join("libnvrtc.so.12").exists() {
        return Ok(nvrtc);
    }
    eprintln!("xtask: installing NVRTC 12.0 from PyPI into {}", site.display());
    let status = Command::new("python3")
        .args(["-m", "pip", "install", "--quiet", "--no-deps", "--only-binary=:all:", "--target"])
        .arg(&site)
        .args(NVRTC_WHEELS)
        .status()
        .map_err(|e| format!("running python3 -m pip (is python3 with pip installed?): {e}"))?;
    if !status.success() || !nvrtc.join("lib").join("libnvrtc.so.12").exists() {
        return Err(format!("installing {} failed ({status})", NVRTC_WHEELS.join(" ")));
    }
    Ok(nvrtc)
}

fn join_paths(paths: &[PathBuf]) -> std::ffi::OsString {
    let mut all: Vec<PathBuf> = paths.to_vec();
    if let Some(existing) = std::env::var_os("LD_LIBRARY_PATH") {
        all.extend(std::env::split_paths(&existing));
    }
    std::env::join_paths(all).unwrap_or_default()
}
