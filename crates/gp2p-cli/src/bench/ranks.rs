//! The processes of `gp2p bench comm`: rank 0 starts ranks 1..N as this very program with the
//! same arguments, each told its rank, the world and the communicator's id in [`CHILD_VAR`];
//! rank 0 waits for them at the end, and kills them if it stops first.

use std::process::{Child, Command, Stdio};

use geforce_p2p::comm::UniqueId;

use crate::error::CliError;

/// Set in each rank this process starts: `rank world id`.
const CHILD_VAR: &str = "GP2P_BENCH_COMM_RANK";

/// The other ranks' processes, killed if rank 0 stops before they finish.
pub(super) struct Ranks(Vec<Child>);

impl Ranks {
    /// Wait for every rank; fail naming those that failed.
    pub(super) fn finish(mut self) -> Result<(), CliError> {
        let failed: Vec<String> = std::mem::take(&mut self.0)
            .into_iter()
            .enumerate()
            .filter_map(|(i, mut child)| match child.wait() {
                Ok(status) if status.success() => None,
                Ok(status) => Some(format!("rank {} ({status})", i + 1)),
                Err(e) => Some(format!("rank {} ({e})", i + 1)),
            })
            .collect();
        if failed.is_empty() { Ok(()) } else { Err(CliError::Wrong(format!("ranks failed: {}", failed.join(", ")))) }
    }
}

impl Drop for Ranks {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Start ranks 1..world: this program again with the same arguments (under Python, as
/// `python -m geforce_p2p`), each told its rank, the world and the id.
pub(super) fn start_ranks(world: usize, id: &UniqueId) -> Result<Ranks, CliError> {
    let exe = std::env::current_exe()
        .map_err(|e| CliError::Usage(format!("cannot find this program to start ranks: {e}")))?;
    let under_python = exe.file_name().is_some_and(|n| n.to_string_lossy().starts_with("python"));
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut ranks = Ranks(Vec::new());
    for rank in 1..world {
        let mut cmd = Command::new(&exe);
        if under_python {
            cmd.args(["-m", "geforce_p2p"]);
        }
        let child = cmd
            .args(&args)
            .env(CHILD_VAR, format!("{rank} {world} {id}"))
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| CliError::Usage(format!("starting rank {rank}: {e}")))?;
        ranks.0.push(child);
    }
    Ok(ranks)
}

/// This process's rank, the world and the id, where rank 0 started it.
pub(super) fn as_child() -> Result<Option<(usize, usize, UniqueId)>, CliError> {
    let Ok(text) = std::env::var(CHILD_VAR) else { return Ok(None) };
    let bad = || CliError::Usage(format!("{CHILD_VAR}={text}: expected `rank world id`"));
    let mut words = text.split(' ');
    let rank = words.next().and_then(|w| w.parse().ok()).ok_or_else(bad)?;
    let world = words.next().and_then(|w| w.parse().ok()).ok_or_else(bad)?;
    let id = words.next().ok_or_else(bad)?.parse::<UniqueId>()?;
    Ok(Some((rank, world, id)))
}
