//! The host exchange: every rank publishes a few words in its slot of the segment and reads
//! everyone's, round by round, on the host. For what must be agreed on the host once a
//! communicator exists (NCCL's `ncclCommSplit` gathers every rank's colour and key); never on
//! a call's path.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::{LONGEST_TIMEOUT, Segment, poll_until};
use crate::error::{Error, Result};

/// Words each rank publishes a round.
pub const WORDS: usize = 6;

impl Segment {
    /// Round `round` (1, 2, ... in order, the same on every rank) of the host exchange: publish
    /// `mine` and return every rank's words, in rank order, once all have published, waiting
    /// (on the host, polling) at most `timeout`. A rank publishes a round only once every rank
    /// has read the one before, so nobody's words are overwritten under a reader.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] for round 0; [`Error::PeersMissing`] naming the ranks that did
    /// not take part in time.
    pub fn exchange_host(&self, round: u32, mine: [u64; WORDS], timeout: Duration) -> Result<Vec<[u64; WORDS]>> {
        if round == 0 {
            return Err(Error::InvalidOption { name: "round", reason: String::from("rounds count from 1") });
        }
        let start = Instant::now();
        let deadline = start + timeout.min(LONGEST_TIMEOUT);
        let slots = self.slots()?;
        let missing =
            |late: Vec<usize>| Error::PeersMissing { missing: late, world: self.world, waited: start.elapsed() };
        let behind = |done: &dyn Fn(usize) -> bool| (0..self.world).filter(|&r| !done(r)).collect::<Vec<_>>();
        // Everyone has read the last round: this rank's words are free to overwrite.
        let read_last = || Ok(behind(&|r| slots[r].read.load(Ordering::Acquire) >= round - 1).is_empty().then_some(()));
        if poll_until(deadline, read_last)?.is_none() {
            return Err(missing(behind(&|r| slots[r].read.load(Ordering::Acquire) >= round - 1)));
        }
        let own = &slots[self.rank];
        for (word, value) in own.words.iter().zip(mine) {
            word.store(value, Ordering::Relaxed);
        }
        own.round.store(round, Ordering::Release);
        let published = || Ok(behind(&|r| slots[r].round.load(Ordering::Acquire) >= round).is_empty().then_some(()));
        if poll_until(deadline, published)?.is_none() {
            return Err(missing(behind(&|r| slots[r].round.load(Ordering::Acquire) >= round)));
        }
        let all = slots.iter().map(|slot| std::array::from_fn(|i| slot.words[i].load(Ordering::Relaxed))).collect();
        own.read.store(round, Ordering::Release);
        Ok(all)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::UniqueId;

    #[test]
    fn ranks_exchange_words_round_after_round() {
        let Ok(id) = UniqueId::new() else { return }; // no /dev/shm here
        let world = 3;
        let results: Vec<Vec<Vec<[u64; WORDS]>>> = std::thread::scope(|s| {
            let ranks: Vec<_> = (0..world)
                .map(|rank| {
                    s.spawn(move || {
                        let segment = Segment::join(&id, rank, world, 4096, Duration::from_secs(10)).expect("joins");
                        (1..=4u32)
                            .map(|round| {
                                let mine = [rank as u64, u64::from(round), 7, 7, 7, u64::MAX];
                                segment.exchange_host(round, mine, Duration::from_secs(10)).expect("exchanges")
                            })
                            .collect()
                    })
                })
                .collect();
            ranks.into_iter().map(|h| h.join().expect("rank")).collect()
        });
        for per_rank in &results {
            for (round, all) in per_rank.iter().enumerate() {
                for (rank, words) in all.iter().enumerate() {
                    assert_eq!(words[..2], [rank as u64, round as u64 + 1], "round {} rank {rank}", round + 1);
                }
            }
        }
    }

    #[test]
    fn a_rank_that_never_comes_is_named() {
        let Ok(id) = UniqueId::new() else { return };
        let segments: Vec<Segment> = std::thread::scope(|s| {
            let ranks: Vec<_> = (0..2)
                .map(|rank| s.spawn(move || Segment::join(&id, rank, 2, 4096, Duration::from_secs(10))))
                .collect();
            ranks.into_iter().map(|h| h.join().expect("rank").expect("joins")).collect()
        });
        let e = segments[0].exchange_host(1, [0; WORDS], Duration::from_millis(50)).expect_err("rank 1 never comes");
        assert!(matches!(e, Error::PeersMissing { ref missing, .. } if missing == &[1]), "{e}");
        assert!(segments[0].exchange_host(0, [0; WORDS], Duration::from_millis(50)).is_err());
    }
}
