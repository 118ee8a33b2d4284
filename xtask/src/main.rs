//! `cargo xtask`: the one entry point for project chores.
//!
//! - `cargo xtask ptx [--check]`: compile `kernels/*.cu` to PTX with NVRTC 12.0 (installed
//!   from PyPI under `target/` when absent); `--check` fails when the committed PTX is stale.
//! - `cargo xtask test-gpu [--bundle DIR]`: run the GPU suite here, or build it into DIR with
//!   a `DIR/run` script for a GPU machine that has no Rust toolchain.
//! - `cargo xtask hub DIR [--wheel WHEEL]`: write DIR as the Hugging Face `kernels`
//!   repository of the Python package (building its release wheel unless given one).

mod bundle;
mod command;
mod door;
mod hub;
mod ptx;
#[cfg(test)]
mod tidy;
#[cfg(test)]
mod tidy_comments;
#[cfg(test)]
mod tidy_docs;
#[cfg(test)]
mod tidy_files;
#[cfg(test)]
mod tidy_python;
#[cfg(test)]
mod tidy_size;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

const USAGE: &str =
    "usage: cargo xtask ptx [--check] | cargo xtask test-gpu [--bundle DIR] | cargo xtask hub DIR [--wheel WHEEL]";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let result = match args.as_slice() {
        ["ptx"] => ptx::generate(&workspace_root(), false),
        ["ptx", "--check"] => ptx::generate(&workspace_root(), true),
        [ptx::CHILD_COMMAND, out_dir] => ptx::compile_in_child(&workspace_root(), Path::new(out_dir)),
        ["test-gpu"] => bundle::run_here(&workspace_root()),
        ["test-gpu", "--bundle", dir] => bundle::bundle(&workspace_root(), Path::new(dir)),
        ["hub", dir] => hub::hub(&workspace_root(), Path::new(dir), None),
        ["hub", dir, "--wheel", wheel] => hub::hub(&workspace_root(), Path::new(dir), Some(Path::new(wheel))),
        _ => Err(format!("{USAGE}\ngot: {}", args.join(" "))),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("xtask: {message}");
            ExitCode::FAILURE
        }
    }
}

/// The workspace root: xtask's manifest directory's parent.
fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}
