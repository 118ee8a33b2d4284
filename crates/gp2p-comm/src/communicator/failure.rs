//! How a communicator fails and gives up: a call that fails part-way breaks it for every rank
//! (`fail`), a kernel that gave up waiting is reported by the next call (`check`), and the
//! caller can give up on purpose (`abort`, what NCCL's `ncclCommAbort` does) or ask without
//! waiting whether anything went wrong (`async_error`, NCCL's `ncclCommGetAsyncError`).

use std::sync::atomic::{AtomicU32, Ordering};

use gp2p_cuda::Stream;
use gp2p_cuda::raw::write_flag;

use super::Communicator;
use crate::layout::BROKEN;
use crate::registration::word;
use crate::{Error, Result};

impl Communicator {
    /// After an error part-way through a call on `stream`: every later call on every rank
    /// fails, and the waits of this call and later ones stop instead of running to their
    /// timeout (they read the segment's word). The word is written in `stream`'s order,
    /// after what the failed call enqueued: calls that already returned Ok and are still
    /// running would stop at it too, leaving their buffers partly folded. Where that cannot
    /// be enqueued (a broken context, a stream capturing a graph, which would replay it), the
    /// host writes it at once.
    pub(super) fn fail(&mut self, stream: &Stream) {
        self.broken = true;
        let ordered = matches!(stream.is_capturing(), Ok(false))
            && stream
                .reserve_point()
                .and_then(|reserved| {
                    // SAFETY: the communicator's word in the registered area, 4-byte aligned;
                    // the registration notes the point taken after the write (or, should that
                    // fail, the stream was waited for), so it stays mapped until the write.
                    unsafe { write_flag(stream, self.staging + self.layout.broken() as u64, 1)? };
                    stream.point_from(reserved)
                })
                .map(|point| {
                    self.registration.uses().note(&point);
                    self.last = Some(point);
                })
                .is_ok();
        if !ordered && let Ok(shared) = self.word(BROKEN) {
            shared.store(1, Ordering::Release);
        }
    }

    /// Fail if a wait of an earlier call, on any rank, gave up on its peer (then every call
    /// fails: the ranks' calls may no longer pair up). Calls check this themselves; launches
    /// of captured graphs do not, so call it once a graph's launches are synchronised.
    pub fn check(&mut self) -> Result<()> {
        self.take_failure()
    }

    /// Fail if a kernel of an earlier call, on this rank or another, gave up waiting for its
    /// peer: from then on the ranks' calls may no longer pair up, so every call fails (the
    /// first on this rank with the timeout, later ones as broken) and the other ranks learn
    /// it from the segment.
    pub(super) fn take_failure(&mut self) -> Result<()> {
        if self.broken {
            return Err(Error::Broken { rank: self.rank() });
        }
        let gave_up = self.word(self.layout.flag(self.rank()))?.swap(0, Ordering::AcqRel) != 0;
        let shared = self.word(BROKEN)?;
        if gave_up {
            shared.store(1, Ordering::Release);
        }
        let peer_broke = shared.load(Ordering::Acquire) != 0;
        if gave_up {
            self.broken = true;
            let peers = if self.world() == 2 { format!("rank {}", 1 - self.rank()) } else { "another rank".into() };
            return Err(Error::PeerTimeout { rank: self.rank(), peers, timeout: self.timeout });
        }
        if peer_broke {
            self.broken = true;
            return Err(Error::Broken { rank: self.rank() });
        }
        Ok(())
    }

    pub(super) fn word(&self, offset: usize) -> Result<&AtomicU32> {
        word(&self.segment, offset)
    }

    /// Give up on every call of this communicator, on every rank: every wait of an enqueued
    /// call (this rank's and the others') stops at its next look at the shared word instead
    /// of running to its timeout, and every later call fails. What the stopped calls were
    /// folding is left part-done. Nothing here waits for the GPU. (Watched stream waits,
    /// [`crate::FlagWaits::Watched`], end once the communicator's watchdog sees the word, within
    /// milliseconds; [`crate::FlagWaits::Unbounded`] ones never look at it: only their flags
    /// end them.)
    pub fn abort(&mut self) {
        self.broken = true;
        self.control.abort();
    }

    /// What the next call would report, without waiting and without taking it: a wait of this
    /// rank that gave up on its peer ([`Error::PeerTimeout`]), the communicator broken by
    /// another rank, a failed call or [`Communicator::abort`] ([`Error::Broken`]), or another
    /// rank's process gone while this rank's calls still wait ([`Error::PeerGone`]: then call
    /// [`Communicator::abort`], so those waits end now rather than at the peer timeout; a rank
    /// that exits once everything is done is no error; under [`crate::FlagWaits::Unbounded`]
    /// the pipeline's waits end neither way). `None` while all is well.
    pub fn async_error(&self) -> Option<Error> {
        if self.broken {
            return Some(Error::Broken { rank: self.rank() });
        }
        let gave_up = self.word(self.layout.flag(self.rank())).is_ok_and(|w| w.load(Ordering::Acquire) != 0);
        if gave_up {
            let peers = if self.world() == 2 { format!("rank {}", 1 - self.rank()) } else { "another rank".into() };
            return Some(Error::PeerTimeout { rank: self.rank(), peers, timeout: self.timeout });
        }
        let broken = self.word(BROKEN).is_ok_and(|w| w.load(Ordering::Acquire) != 0);
        if broken {
            return Some(Error::Broken { rank: self.rank() });
        }
        // Only a rank whose calls still wait cares who has gone (asked first: one event query
        // where the processes' liveness costs a system call a rank), and asked again once
        // someone has gone: a call that ended in between, and a peer that then exited as it
        // may, is no error.
        let waiting = || self.last.as_ref().is_some_and(|last| !last.is_complete().unwrap_or(true));
        if !waiting() {
            return None;
        }
        let gone = self.segment.gone_ranks();
        (!gone.is_empty() && waiting()).then(|| Error::PeerGone { rank: self.rank(), gone })
    }
}
