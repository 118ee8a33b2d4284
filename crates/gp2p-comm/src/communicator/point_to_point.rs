//! The communicator's sends and receives: each a one-way transfer through the sender's slots,
//! paired with the peer's call at the same place in both ranks' sequences.

use super::*;

impl Communicator {
    /// Send `buf` to rank `peer`, which makes the matching [`Communicator::recv`] of the same
    /// length and type; ordered after the work queued on `stream`, and `buf` may be written
    /// by work queued there afterwards. Between two ranks a send pairs with the peer's call at
    /// the same place in its sequence (collectives included). Among more, a rank not in a
    /// transfer makes no call for it, and each writer–reader pair meets in its own order; a
    /// rank's slots serve every reader, so a send may wait until the reader of this rank's
    /// previous send has taken its data: any order works that would work if every send waited
    /// for its receive (NCCL's rule, less its buffering of small sends).
    pub fn send<T: Element>(&mut self, buf: &DeviceView<'_, T>, stream: &Stream, peer: usize) -> Result<()> {
        self.check_call(stream, &[("buf", buf.device())])?;
        self.check_peer(peer)?;
        if self.world() != 2 {
            let rounds = Rounds::send(self.world(), buf.bytes(), self.rank(), peer);
            return self.rounds_one_way(stream, rounds, (buf.raw_ptr(), T::DTYPE), |point| buf.note_use(point));
        }
        self.one_way(stream, (buf.raw_ptr(), buf.bytes(), T::DTYPE), true, |point| buf.note_use(point))
    }

    /// Receive into `buf` what rank `peer` sends with [`Communicator::send`]; ordered after
    /// the work queued on `stream`, and later work there sees it.
    pub fn recv<T: Element>(&mut self, buf: &mut DeviceViewMut<'_, T>, stream: &Stream, peer: usize) -> Result<()> {
        self.check_call(stream, &[("buf", buf.device())])?;
        self.check_peer(peer)?;
        if self.world() != 2 {
            let rounds = Rounds::send(self.world(), buf.bytes(), peer, self.rank());
            return self.rounds_one_way(stream, rounds, (buf.raw_ptr(), T::DTYPE), |point| buf.note_use(point));
        }
        self.one_way(stream, (buf.raw_ptr(), buf.bytes(), T::DTYPE), false, |point| buf.note_use(point))
    }

    /// A checked one-way call (broadcast, send, recv) through the pipeline: this rank sends
    /// the `bytes` at `ptr` when `sends`, else lands the peer's there. Nothing is enqueued
    /// for zero bytes, on either rank.
    pub(super) fn one_way(
        &mut self,
        stream: &Stream,
        (ptr, bytes, dtype): (RawDevicePtr, usize, DType),
        sends: bool,
        note: impl FnOnce(&StreamPoint),
    ) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        let (send, receive) = if sends { (Some(ptr), None) } else { (None, Some((ptr, Landing::Copy))) };
        self.enqueue(stream, Transfer { bytes, dtype, send, receive, local: None }, note)
    }

    /// A broadcast, send or recv among more than two ranks: `rounds` over the buffer at `ptr`.
    /// Nothing is enqueued for zero bytes, on any rank.
    pub(super) fn rounds_one_way(
        &mut self,
        stream: &Stream,
        rounds: Rounds,
        (main, dtype): (RawDevicePtr, DType),
        note: impl FnOnce(&StreamPoint),
    ) -> Result<()> {
        if rounds.legs.is_empty() {
            return Ok(());
        }
        let transfer =
            ManyTransfer { rounds, dtype, main, part: 0, op: ReduceOp::Sum, divide_by: 1, local: None, wires: None };
        self.enqueue_many(stream, transfer, note)
    }

    /// Refuses a peer outside the world, or this rank itself.
    fn check_peer(&self, peer: usize) -> Result<()> {
        if peer >= self.world() || peer == self.rank() {
            return Err(Error::Peer { peer, rank: self.rank(), world: self.world() });
        }
        Ok(())
    }
}
