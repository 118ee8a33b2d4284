//! What the ranks of a communicator agree on, on the host, once it exists, and what another
//! thread may do to it without its lock: its id, the ids of communicators made from it
//! ([`UniqueId::derive`]), a few words from every rank ([`Control::exchange_host`]: what
//! NCCL's `ncclCommSplit` gathers), aborting it ([`Control::abort`]) and which ranks' processes
//! are gone.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use super::Communicator;
use crate::layout::BROKEN;
use crate::registration::word;
use crate::segment::HOST_WORDS;
use crate::{Error, Result, Segment, UniqueId};

/// A communicator's host-side controls, cheap to clone and usable from any thread while
/// another holds the communicator: the host exchange (which may wait for other ranks) and the
/// abort (which must not wait for anything).
#[derive(Clone)]
pub struct Control {
    segment: Arc<Segment>,
    /// Rounds of the host exchange made so far.
    rounds: Arc<AtomicU32>,
    /// How long a round may wait (the join's bound).
    timeout: Duration,
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Control(rank {} of {})", self.segment.rank(), self.segment.world())
    }
}

impl Control {
    pub(super) fn new(segment: Arc<Segment>, timeout: Duration) -> Control {
        Control { segment, rounds: Arc::new(AtomicU32::new(0)), timeout }
    }

    /// The id every rank joined with.
    pub fn id(&self) -> &UniqueId {
        self.segment.id()
    }

    /// Publish `mine` and return every rank's words, in rank order: a collective on the host
    /// that every rank makes, in the same order as its other host exchanges (one at a time per
    /// rank), waiting at most the join timeout. Nothing is enqueued on the GPU.
    ///
    /// # Errors
    /// [`Error::PeersMissing`] naming the ranks that did not take part in time.
    pub fn exchange_host(&self, mine: [u64; HOST_WORDS]) -> Result<Vec<[u64; HOST_WORDS]>> {
        let round = self.rounds.load(Ordering::Acquire).checked_add(1).ok_or_else(|| Error::InvalidOption {
            name: "host exchange",
            reason: String::from("more than 2^32 rounds on one communicator"),
        })?;
        let all = self.segment.exchange_host(round, mine, self.timeout)?;
        self.rounds.store(round, Ordering::Release);
        Ok(all)
    }

    /// Give up on every call of the communicator, on every rank: every wait of an enqueued
    /// call stops at its next look at the shared word, and every later call fails
    /// ([`Error::Broken`]). Waits for nothing and takes no lock.
    pub fn abort(&self) {
        if let Ok(shared) = word(&self.segment, BROKEN) {
            shared.store(1, Ordering::Release);
        }
    }

    /// The other ranks whose process has exited.
    pub fn gone_ranks(&self) -> Vec<usize> {
        self.segment.gone_ranks()
    }
}

impl Communicator {
    /// The id every rank joined with.
    pub fn id(&self) -> &UniqueId {
        self.segment.id()
    }

    /// The host-side controls, for other threads ([`Control`]).
    pub fn control(&self) -> Control {
        self.control.clone()
    }

    /// [`Control::exchange_host`].
    ///
    /// # Errors
    /// As [`Control::exchange_host`].
    pub fn exchange_host(&mut self, mine: [u64; HOST_WORDS]) -> Result<Vec<[u64; HOST_WORDS]>> {
        self.control.exchange_host(mine)
    }
}

impl Communicator {
    /// What the ranks on this rank's device share, asked at creation with one host exchange
    /// of each rank's device's PCI bus id (what the driver calls the device), where it matters
    /// (every rank decides alike, from the world and the layout they agreed on; nothing is
    /// exchanged otherwise):
    /// - two ranks on one device as processes (under MPS) share its one link (`shared_link`);
    ///   two threads of one process on one device share its context as well, and keep the
    ///   paths of two cards: there the rounds ran slower than the one kernel and the exchange
    ///   (nccl-tests `-t 2` through the door, one H200, in turns: 390 against 3f1da72's 255 us
    ///   at 4 MiB, 1360 against 950 at 16 MiB) and hung 2 runs in 10, which that path did in
    ///   none of 6 (`benches/results/h200/door-threads-paths.txt`);
    /// - where the layout made areas for the many-rank flagged-chunk kernel, whose blocks all
    ///   poll, the ranks on one device take half of its multiprocessors' room between them,
    ///   so that every rank's blocks are resident at once beside kernels that wait on them
    ///   (`chunk_blocks`, [`shared_chunk_blocks`]).
    pub(super) fn learn_device_sharing(&mut self) -> Result<()> {
        if self.world() != 2 && self.layout.many_chunks == 0 {
            return Ok(());
        }
        let mine = bus_id_word(&self.device.info().pci_bus_id);
        let all = self.control.exchange_host([mine, 0, 0, 0, 0, 0])?;
        let sharing = all.iter().filter(|words| words[0] == mine).count().max(1);
        self.shared_link = self.world() == 2 && sharing == 2 && !self.segment.peers_share_this_process();
        if self.layout.many_chunks > 0 {
            let resident = self.device.info().multiprocessors as usize * gp2p_kernels::CHUNK_BLOCKS_PER_SM as usize;
            self.chunk_blocks = self.chunk_blocks.min(shared_chunk_blocks(resident, sharing));
        }
        Ok(())
    }
}

/// The most blocks each of `sharing` ranks on one device runs the many-rank flagged-chunk
/// kernel with, of the device's `resident` (two a multiprocessor): half of an even split, so
/// the kernels that may run beside it and wait on it finishing (a rank's waits for its next
/// call, once it is ahead) always find room, and every rank's polling blocks stay resident.
/// With the whole split among 8 Python processes on one H200 the first all-reduces waited out
/// their timeout (`benches/results/h200/python-many-chunks-on.log`); with this half, that
/// file and `gpu_comm_many` passed three times each on one H100
/// (`benches/results/h10080gbhbm3/python-many-chunks-on.log`, `comm-many-chunks-on.log`).
fn shared_chunk_blocks(resident: usize, sharing: usize) -> usize {
    (resident / (2 * sharing.max(1))).max(1)
}

/// A PCI bus id (`domain:bus:device.function`, any case) as one word: FNV-1a over its
/// lower-case bytes, so equal ids give equal words on every rank.
fn bus_id_word(bus_id: &str) -> u64 {
    bus_id
        .trim()
        .bytes()
        .map(|b| b.to_ascii_lowercase())
        .fold(0xcbf2_9ce4_8422_2325, |hash, b| (hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3))
}

#[cfg(test)]
mod tests {
    use super::{bus_id_word, shared_chunk_blocks};

    #[test]
    fn ranks_sharing_a_device_take_half_its_room_for_their_polling_blocks() {
        // One H200: 132 multiprocessors, two blocks each.
        let resident = 264;
        assert_eq!([1, 3, 4, 8].map(|sharing| shared_chunk_blocks(resident, sharing)), [132, 44, 33, 16]);
        for sharing in 1..=8 {
            assert!(sharing * shared_chunk_blocks(resident, sharing) <= resident / 2, "{sharing} ranks");
        }
        assert_eq!(shared_chunk_blocks(4, 8), 1, "at least a block each");
        assert_eq!(shared_chunk_blocks(264, 0), 132, "no count: this rank alone");
    }

    #[test]
    fn a_bus_id_is_one_word_whatever_its_case_and_another_id_is_another() {
        assert_eq!(bus_id_word("0000:1A:00.0"), bus_id_word("0000:1a:00.0 "));
        assert_ne!(bus_id_word("0000:1a:00.0"), bus_id_word("0000:1b:00.0"));
        assert_ne!(bus_id_word("0000:1a:00.0"), bus_id_word(""));
    }
}
