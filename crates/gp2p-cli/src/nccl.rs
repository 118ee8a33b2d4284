//! `gp2p nccl env|path`: where the NCCL door is, and the shell lines that load it in NCCL's
//! place (docs/nccl-door.md). The door is the `gp2p-nccl` crate's shared object, built beside
//! this binary (`cargo build -p gp2p-nccl`), or the file `GP2P_NCCL_LIBRARY` names. A pip
//! installation has its own launcher, `python -m geforce_p2p.nccl`, which knows where the wheel
//! keeps it.

use std::path::{Path, PathBuf};

use clap::Subcommand;

use crate::error::CliError;

/// The variable that names the door's file explicitly.
const LIBRARY_VAR: &str = "GP2P_NCCL_LIBRARY";
/// The names the door goes by beside the binary: cargo's, and the wheel's.
const NAMES: [&str; 2] = ["libgp2p_nccl.so", "libnccl.so.2"];

/// What to print.
#[derive(Subcommand)]
pub enum NcclCommand {
    /// Shell lines that load the door in NCCL's place: `eval "$(gp2p nccl env)"`.
    Env,
    /// The door's file.
    Path,
}

/// Run `gp2p nccl ...`.
pub fn run(command: &NcclCommand) -> Result<(), CliError> {
    let door = find(std::env::var_os(LIBRARY_VAR).map(PathBuf::from), std::env::current_exe().ok())?;
    match command {
        NcclCommand::Path => println!("{}", door.display()),
        NcclCommand::Env => {
            let preload = std::env::var("LD_PRELOAD").unwrap_or_default();
            for line in exports(&door.to_string_lossy(), &preload) {
                println!("{line}");
            }
        }
    }
    Ok(())
}

/// The door: `named` where given (it must exist), else beside `exe`.
fn find(named: Option<PathBuf>, exe: Option<PathBuf>) -> Result<PathBuf, CliError> {
    if let Some(named) = named {
        return if named.is_file() {
            Ok(named)
        } else {
            Err(CliError::Usage(format!("{LIBRARY_VAR}={}: no such file", named.display())))
        };
    }
    let folder = exe.as_deref().and_then(Path::parent).map(Path::to_path_buf).unwrap_or_default();
    NAMES.iter().map(|n| folder.join(n)).find(|p| p.is_file()).ok_or_else(|| {
        CliError::Usage(format!(
            "no NCCL door beside {}: build it there with `cargo build -p gp2p-nccl` (same profile as gp2p), name it in {LIBRARY_VAR}, or, with the pip package, run `python -m geforce_p2p.nccl env`",
            folder.display()
        ))
    })
}

/// The shell lines for the door at `door`, with `preload` the current `LD_PRELOAD`.
fn exports(door: &str, preload: &str) -> Vec<String> {
    let rest = preload.split([':', ' ']).filter(|p| !p.is_empty() && *p != door);
    let preload: Vec<&str> = std::iter::once(door).chain(rest).collect();
    let quote = |s: &str| format!("'{}'", s.replace('\'', "'\\''"));
    vec![
        format!("export LD_PRELOAD={}", quote(&preload.join(":"))),
        format!("export VLLM_NCCL_SO_PATH={}", quote(door)),
        format!("export SGLANG_NCCL_SO_PATH={}", quote(door)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_door_goes_first_once_and_is_quoted_for_the_shell() {
        // LD_PRELOAD's entries are separated by colons or spaces.
        let lines = exports("/d/libnccl.so.2", "/x.so:/d/libnccl.so.2 /y.so");
        assert_eq!(lines[0], "export LD_PRELOAD='/d/libnccl.so.2:/x.so:/y.so'");
        assert_eq!(lines[1], "export VLLM_NCCL_SO_PATH='/d/libnccl.so.2'");
        assert_eq!(exports("/it's", "")[2], "export SGLANG_NCCL_SO_PATH='/it'\\''s'");
    }

    #[test]
    fn a_missing_door_says_how_to_get_one() {
        let e = find(None, Some(PathBuf::from("/nonexistent/bin/gp2p"))).expect_err("none there").to_string();
        assert!(e.contains("cargo build -p gp2p-nccl") && e.contains("python -m geforce_p2p.nccl env"), "{e}");
        let e = find(Some(PathBuf::from("/nonexistent/door.so")), None).expect_err("named, missing").to_string();
        assert!(e.starts_with("GP2P_NCCL_LIBRARY=/nonexistent/door.so"), "{e}");
    }
}
