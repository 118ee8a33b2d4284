//! The error type of gp2p-pinned.

/// Shorthand for results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can go wrong with pinned memory.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A failure of the CUDA layer below.
    #[error(transparent)]
    Cuda(#[from] gp2p_cuda::Error),
    /// A view or stream on another device than the one it is used with.
    #[error("{what} is on device {got}, but {of} is on device {expected}: pass {what} on device {expected}")]
    WrongDevice {
        /// Which argument.
        what: &'static str,
        /// The device it is on.
        got: usize,
        /// What fixes the device it must be on.
        of: &'static str,
        /// The device it must be on.
        expected: usize,
    },
    /// Two views that must have the same length do not.
    #[error("{what} has {got} elements, but {of} has {expected}: pass views of equal length")]
    LengthMismatch {
        /// Which argument.
        what: &'static str,
        /// Its length.
        got: usize,
        /// The argument whose length it must have.
        of: &'static str,
        /// The length it must have.
        expected: usize,
    },
    /// A scratch view shorter than the chunk it must hold ([`crate::Fold::Scratch`]).
    #[error("scratch has {got} elements, but the chunk has {needed}: pass a scratch at least as long as the chunk")]
    ScratchTooShort {
        /// The scratch's length.
        got: usize,
        /// The chunk's length.
        needed: usize,
    },
    /// A receive into a view of another size than the chunk that was sent.
    #[error("dst has {got} bytes, but the chunk sent has {sent}: receive into a view as long as the one sent")]
    ReceiveSize {
        /// Bytes of the destination view.
        got: usize,
        /// Bytes of the chunk.
        sent: usize,
    },
    /// An argument out of its valid range.
    #[error("invalid argument {name}: {reason}")]
    InvalidArgument {
        /// The argument's name.
        name: &'static str,
        /// What is wrong and what is expected.
        reason: String,
    },
    /// A slot index past the ring's end.
    #[error("slot {slot} does not exist: the ring has {slots} slots")]
    NoSuchSlot {
        /// The slot asked for.
        slot: usize,
        /// How many the ring has.
        slots: usize,
    },
    /// A host range handed to a DMA is not page-locked.
    #[error(
        "{what}: the host range of {bytes} bytes at {ptr:#x} is not pinned memory: allocate it with gp2p_pinned::PinnedBuffer (or cudaHostAlloc, torch's pin_memory), or register it with cudaHostRegister"
    )]
    NotPinned {
        /// Which argument.
        what: &'static str,
        /// Its address.
        ptr: usize,
        /// Its size.
        bytes: usize,
    },
    /// A fill of a staging slot whose chunk was never received.
    #[error(
        "staging slot {slot} still holds a chunk that was sent but never received: receive (drain) it before the ring comes round to the slot again"
    )]
    SlotBusy {
        /// The slot.
        slot: usize,
    },
    /// A drain of a staging slot that holds no chunk.
    #[error("staging slot {slot} holds no chunk: fill (send) it before draining (receiving) it")]
    SlotEmpty {
        /// The slot.
        slot: usize,
    },
    /// A chunk handed to a ring that did not send it.
    #[error("the chunk in slot {slot} was sent by another staging ring: receive it on the ring that sent it")]
    ForeignChunk {
        /// The slot it was sent through.
        slot: usize,
    },
    /// A small exchange's kernel gave up waiting for its peer in an earlier call.
    #[error(
        "an earlier small all-reduce was abandoned: rank {rank} waited {timeout:?} (or, for a peer not yet seen in the call, the exchange's queue timeout) for rank {peer}, whose stream never reached the collective, so that call's results are wrong, and those of calls enqueued before this one may be; this call was not run"
    )]
    PeerTimeout {
        /// The rank whose kernel gave up.
        rank: usize,
        /// The rank it waited for.
        peer: usize,
        /// How long it waited.
        timeout: std::time::Duration,
    },
    /// A one-kernel exchange whose two ranks no longer number their calls alike: an earlier
    /// call enqueued rank 0's kernel and failed before rank 1's.
    #[error(
        "this exchange is out of step: an earlier call enqueued rank 0's kernel but not rank 1's ({cause}), so its later calls would pair the wrong data and it refuses them: make a new exchange"
    )]
    OutOfStep {
        /// The error that stopped the earlier call.
        cause: String,
    },
    /// A chunk larger than a slot.
    #[error("{bytes} bytes do not fit a staging slot of {slot_bytes} bytes: cut the transfer into chunks")]
    ChunkTooLarge {
        /// Bytes asked for.
        bytes: usize,
        /// Capacity of one slot.
        slot_bytes: usize,
    },
}

impl Error {
    /// Whether this error means "no CUDA here" (no driver, or no such device).
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Error::Cuda(e) if e.is_unavailable())
    }
}
