//! What the ranks of a communicator agree on, on the host, once it exists: its id, the ids of
//! communicators made from it ([`UniqueId::derive`]), and a few words from every rank
//! ([`Communicator::exchange_host`]): what NCCL's `ncclCommSplit` and `ncclCommShrink` need.

use super::Communicator;
use crate::segment::HOST_WORDS;
use crate::{Error, Result, UniqueId};

impl Communicator {
    /// The id every rank joined with.
    pub fn id(&self) -> &UniqueId {
        self.segment.id()
    }

    /// Publish `mine` and return every rank's words, in rank order: a collective on the host
    /// that every rank makes, in the same order as its other host exchanges, waiting at most
    /// the join timeout. Nothing is enqueued on the GPU.
    ///
    /// # Errors
    /// [`Error::PeersMissing`] naming the ranks that did not take part in time.
    pub fn exchange_host(&mut self, mine: [u64; HOST_WORDS]) -> Result<Vec<[u64; HOST_WORDS]>> {
        let round = self.host_rounds.checked_add(1).ok_or_else(|| Error::InvalidOption {
            name: "host exchange",
            reason: String::from("more than 2^32 rounds on one communicator"),
        })?;
        let all = self.segment.exchange_host(round, mine, self.join_timeout)?;
        self.host_rounds = round;
        Ok(all)
    }
}
