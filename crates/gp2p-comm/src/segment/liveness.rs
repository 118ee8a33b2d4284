//! Which ranks' processes have exited: what a communicator asks while its calls wait on the
//! GPU (NCCL's `ncclCommGetAsyncError` is polled by torch's watchdog), so a rank that died
//! shows at once instead of at the end of a peer timeout. A pid names a process only within
//! its pid namespace: ranks in other namespaces (containers sharing /dev/shm) are never
//! called gone.

use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{Segment, is_alive};

/// The low 32 bits of this process's pid namespace's inode; 0 where `/proc` does not say.
/// Read once per process (a process keeps its pid namespace for life; a forked child, another
/// pid, reads its own): nccl-tests poll for async errors in a loop, and a `stat` each time
/// would cost a system call per poll.
pub(crate) fn pid_namespace() -> u32 {
    // The pid in the high half, the namespace in the low: one word, no lock to fork under.
    static READ: AtomicU64 = AtomicU64::new(0);
    let pid = std::process::id();
    let read = READ.load(Ordering::Relaxed);
    if read != 0 && (read >> 32) as u32 == pid {
        return read as u32;
    }
    let namespace = std::fs::metadata("/proc/self/ns/pid").map_or(0, |m| m.ino() as u32);
    READ.store(u64::from(pid) << 32 | u64::from(namespace), Ordering::Relaxed);
    namespace
}

impl Segment {
    /// Whether another rank joined from this very process (ranks as threads, as nccl-tests'
    /// `-t` makes them): such ranks on one device share its CUDA context, where one rank's
    /// driver call may wait behind the others' kernels (see the communicator's launch cache).
    /// Asked once every rank has joined; `true` where the slots cannot be read, the side on
    /// which nothing can hang.
    pub fn peers_share_this_process(&self) -> bool {
        let (ours, pid) = (pid_namespace(), std::process::id() as i32);
        let Ok(slots) = self.slots() else { return true };
        slots.iter().enumerate().any(|(rank, slot)| {
            rank != self.rank
                && slot.pid.load(Ordering::Acquire) == pid
                && slot.pid_namespace.load(Ordering::Acquire) == ours
        })
    }

    /// The other ranks whose process has exited (in this process's pid namespace).
    pub fn gone_ranks(&self) -> Vec<usize> {
        let ours = pid_namespace();
        let Ok(slots) = self.slots() else { return Vec::new() };
        slots
            .iter()
            .enumerate()
            .filter(|&(rank, slot)| {
                let pid = slot.pid.load(Ordering::Acquire);
                rank != self.rank
                    && ours != 0
                    && slot.pid_namespace.load(Ordering::Acquire) == ours
                    && pid > 0
                    && !is_alive(pid)
            })
            .map(|(rank, _)| rank)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::UniqueId;

    #[test]
    fn a_rank_whose_process_is_gone_is_named_and_live_ones_are_not() {
        let Ok(id) = UniqueId::new() else { return }; // no /dev/shm here
        let segments: Vec<Segment> = std::thread::scope(|s| {
            let ranks: Vec<_> = (0..2)
                .map(|rank| s.spawn(move || Segment::join(&id, rank, 2, 4096, Duration::from_secs(10))))
                .collect();
            ranks.into_iter().map(|h| h.join().expect("rank").expect("joins")).collect()
        });
        assert!(segments[0].gone_ranks().is_empty(), "both live in this process");
        assert!(segments[0].peers_share_this_process() && segments[1].peers_share_this_process());
        // Rank 1's slot as a process that has exited would leave it: a pid that is no more.
        let mut child = std::process::Command::new("true").spawn().expect("a short-lived process");
        let dead = i32::try_from(child.id()).expect("a pid");
        child.wait().expect("it exits");
        let slots = segments[1].slots().expect("slots");
        slots[1].pid.store(dead, Ordering::Release);
        assert_eq!(segments[0].gone_ranks(), [1]);
        assert!(!segments[0].peers_share_this_process(), "rank 1 now names another process");
        // Another pid namespace's pid says nothing here.
        slots[1].pid_namespace.store(pid_namespace().wrapping_add(1), Ordering::Release);
        assert!(segments[0].gone_ranks().is_empty());
        // This pid in another namespace is another process.
        slots[1].pid.store(std::process::id() as i32, Ordering::Release);
        assert!(!segments[0].peers_share_this_process());
    }
}
