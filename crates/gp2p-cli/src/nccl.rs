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
            let door = preloadable(&door)?;
            let preload = std::env::var_os("LD_PRELOAD").unwrap_or_default();
            let queues = std::env::var_os("CUDA_DEVICE_MAX_CONNECTIONS").is_none() && !geforce_p2p::comm::mps_serves();
            let real = match std::env::var_os(REAL_VAR).filter(|v| !v.is_empty()) {
                Some(_) => None,
                None => users_real(SERVERS_VARS.map(std::env::var_os), Path::new(&door)),
            };
            for line in exports(&door, &preload.to_string_lossy(), queues, real.as_deref()) {
                println!("{line}");
            }
        }
    }
    Ok(())
}

/// The hardware queues asked for where the environment names none and no MPS daemon serves
/// (CUDA's most): ranks that are threads of one process on one device (nccl-tests `-t N`) need
/// one for each of their streams. Python's launcher sets the same.
const HARDWARE_QUEUES: &str = "32";

/// `door` as `LD_PRELOAD` can carry it: absolute, without a space or colon (where the dynamic
/// linker splits the variable, and torch would quietly load the real NCCL).
fn preloadable(door: &Path) -> Result<String, CliError> {
    let door = std::fs::canonicalize(door).unwrap_or_else(|_| door.to_path_buf());
    let text = door.to_string_lossy().into_owned();
    if text.contains([' ', ':']) {
        return Err(CliError::Usage(format!(
            "the door's path {text:?} holds a space or a colon, where LD_PRELOAD splits it: put it where its path has neither and name it in {LIBRARY_VAR}"
        )));
    }
    Ok(text)
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

/// Where the door finds the real NCCL it hands communicators over to, where set.
const REAL_VAR: &str = "GP2P_NCCL_REAL";

/// The servers' variables naming the NCCL their own wrappers load, which the door takes over.
const SERVERS_VARS: [&str; 2] = ["VLLM_NCCL_SO_PATH", "SGLANG_NCCL_SO_PATH"];

/// A real NCCL the user named in one of the servers' variables (`named`, their values), for
/// [`REAL_VAR`]: the first that is not a door, as Python's launcher keeps it, so what the door
/// hands over runs where the user said.
fn users_real(named: [Option<std::ffi::OsString>; 2], door: &Path) -> Option<String> {
    named
        .into_iter()
        .flatten()
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .find(|p| !is_a_door(p, door))
        .map(|p| p.to_string_lossy().into_owned())
}

/// Whether `path` is `door`, or another build's door (a wheel keeps it in `geforce_p2p/_nccl`,
/// cargo names it `libgp2p_nccl.so`): never the real NCCL.
fn is_a_door(path: &Path, door: &Path) -> bool {
    let in_wheel = path.parent().and_then(Path::file_name).is_some_and(|f| f == "_nccl");
    let built = path.file_name().is_some_and(|f| f == NAMES[0]);
    let same = match (std::fs::canonicalize(path), std::fs::canonicalize(door)) {
        (Ok(a), Ok(b)) => a == b,
        _ => path == door,
    };
    in_wheel || built || same
}

/// The shell lines for the door at `door`, with `preload` the current `LD_PRELOAD`, the
/// hardware queues where `queues`, and the real NCCL the user named where `real`.
fn exports(door: &str, preload: &str, queues: bool, real: Option<&str>) -> Vec<String> {
    let rest = preload.split([':', ' ']).filter(|p| !p.is_empty() && *p != door);
    let preload: Vec<&str> = std::iter::once(door).chain(rest).collect();
    let quote = |s: &str| format!("'{}'", s.replace('\'', "'\\''"));
    let mut lines = vec![
        format!("export LD_PRELOAD={}", quote(&preload.join(":"))),
        format!("export VLLM_NCCL_SO_PATH={}", quote(door)),
        format!("export SGLANG_NCCL_SO_PATH={}", quote(door)),
    ];
    if queues {
        lines.push(format!("export CUDA_DEVICE_MAX_CONNECTIONS={HARDWARE_QUEUES}"));
    }
    if let Some(real) = real {
        lines.push(format!("export {REAL_VAR}={}", quote(real)));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_door_goes_first_once_and_is_quoted_for_the_shell() {
        // LD_PRELOAD's entries are separated by colons or spaces.
        let lines = exports("/d/libnccl.so.2", "/x.so:/d/libnccl.so.2 /y.so", false, None);
        assert_eq!(lines[0], "export LD_PRELOAD='/d/libnccl.so.2:/x.so:/y.so'");
        assert_eq!(lines[1], "export VLLM_NCCL_SO_PATH='/d/libnccl.so.2'");
        assert_eq!(lines.len(), 3);
        assert_eq!(exports("/it's", "", false, None)[2], "export SGLANG_NCCL_SO_PATH='/it'\\''s'");
        assert_eq!(exports("/d", "", true, None)[3], "export CUDA_DEVICE_MAX_CONNECTIONS=32", "as Python's launcher");
    }

    #[test]
    fn a_real_nccl_named_for_a_server_is_handed_on_and_a_door_never_is() {
        let door = Path::new("/d/libnccl.so.2");
        let named = |v: Option<&str>, s: Option<&str>| users_real([v.map(Into::into), s.map(Into::into)], door);
        assert_eq!(named(Some("/opt/nccl/libnccl.so.2"), None).as_deref(), Some("/opt/nccl/libnccl.so.2"));
        assert_eq!(named(Some("/d/libnccl.so.2"), Some("/s/libnccl.so.2")).as_deref(), Some("/s/libnccl.so.2"));
        for a_door in ["/d/libnccl.so.2", "/v/site/geforce_p2p/_nccl/libnccl.so.2", "/w/target/release/libgp2p_nccl.so"]
        {
            assert_eq!(named(Some(a_door), Some("")), None, "{a_door}");
        }
        let lines = exports("/d/libnccl.so.2", "", false, Some("/opt/it's/libnccl.so.2"));
        assert_eq!(lines.last().map(String::as_str), Some("export GP2P_NCCL_REAL='/opt/it'\\''s/libnccl.so.2'"));
    }

    #[test]
    fn a_door_ld_preload_would_split_is_refused_and_a_relative_one_made_absolute() {
        let dir = std::env::temp_dir().join(format!("gp2p nccl test {}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("folder");
        let door = dir.join("libnccl.so.2");
        std::fs::write(&door, b"").expect("file");
        let e = preloadable(&door).expect_err("a space").to_string();
        assert!(e.contains("space or a colon") && e.contains(LIBRARY_VAR), "{e}");
        let absolute = std::fs::canonicalize("Cargo.toml").expect("the crate's manifest");
        assert_eq!(preloadable(Path::new("Cargo.toml")).expect("no space"), absolute.to_string_lossy());
        std::fs::remove_dir_all(&dir).expect("cleaned");
    }

    #[test]
    fn a_missing_door_says_how_to_get_one() {
        let e = find(None, Some(PathBuf::from("/nonexistent/bin/gp2p"))).expect_err("none there").to_string();
        assert!(e.contains("cargo build -p gp2p-nccl") && e.contains("python -m geforce_p2p.nccl env"), "{e}");
        let e = find(Some(PathBuf::from("/nonexistent/door.so")), None).expect_err("named, missing").to_string();
        assert!(e.starts_with("GP2P_NCCL_LIBRARY=/nonexistent/door.so"), "{e}");
    }
}
