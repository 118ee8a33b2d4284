//! The error type of gp2p-comm.

use std::time::Duration;

/// Shorthand for results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can go wrong while ranks create a communicator.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A unique id that is not one [`UniqueId::to_bytes`](crate::UniqueId::to_bytes) or its
    /// `Display` made, or one made by another layout version.
    #[error("malformed unique id: {problem}; pass the id one rank made with UniqueId::new, unchanged")]
    MalformedId {
        /// What is wrong with it.
        problem: String,
    },
    /// `/dev/shm` cannot be used on this machine.
    #[error(
        "shared memory: {path} is not usable ({source}); mount a tmpfs there (containers: --ipc=host or a shared /dev/shm)"
    )]
    NoSharedMemory {
        /// The path looked at.
        path: &'static str,
        /// Why it is not usable.
        source: std::io::Error,
    },
    /// This rank sees another `/dev/shm` than the rank that made the id.
    #[error(
        "shared memory: this rank sees /dev/shm as device {here_dev:#x} inode {here_ino}, the unique id was made where it is device {id_dev:#x} inode {id_ino}; every rank must run on one host and share one /dev/shm (containers: --ipc=host or mount the same /dev/shm)"
    )]
    OtherSharedMemory {
        /// Device number of `/dev/shm` seen by this rank.
        here_dev: u64,
        /// Inode number of `/dev/shm` seen by this rank.
        here_ino: u64,
        /// Device number recorded in the id.
        id_dev: u64,
        /// Inode number recorded in the id.
        id_ino: u64,
    },
    /// This rank runs on another host (or boot) than the rank that made the id.
    #[error(
        "host: this rank runs on boot id {here}, the unique id was made on boot id {id}; every rank must run on the host that made the id"
    )]
    OtherHost {
        /// Boot id of this host.
        here: String,
        /// Boot id recorded in the id.
        id: String,
    },
    /// A world size this crate does not accept.
    #[error("world: {world} ranks; pass between 1 and {max} ranks")]
    World {
        /// The world size passed.
        world: usize,
        /// The largest world size supported.
        max: usize,
    },
    /// A rank outside `0..world`.
    #[error("rank: {rank} is not below the world size {world}; pass a rank in 0..{world}")]
    Rank {
        /// The rank passed.
        rank: usize,
        /// The world size passed.
        world: usize,
    },
    /// A staging size whose segment would not fit in the address space.
    #[error("staging bytes: {bytes} plus the {header} bytes of header do not fit in a mapping; pass fewer bytes")]
    StagingTooLarge {
        /// The staging size passed.
        bytes: usize,
        /// The bytes before the staging area.
        header: usize,
    },
    /// This rank and the segment's creator disagree on the world size.
    #[error(
        "world: this rank says {here}, the segment was created for {segment} ranks; every rank must pass the same world size"
    )]
    WorldMismatch {
        /// The world size this rank passed.
        here: usize,
        /// The world size the segment was created for.
        segment: usize,
    },
    /// This rank and the segment's creator disagree on the staging size.
    #[error(
        "staging bytes: this rank says {here}, the segment was created with {segment}; every rank must pass the same staging size (the same CommOptions, GP2P_COMPRESS and GP2P_MANY_CHUNKS, and one /dev/shm)"
    )]
    BytesMismatch {
        /// The staging size this rank passed.
        here: usize,
        /// The staging size the segment was created with.
        segment: usize,
    },
    /// Another live process already joined with this rank.
    #[error(
        "rank: {rank} already joined this communicator from live process {pid}; every rank must pass a different rank"
    )]
    RankTaken {
        /// The rank passed.
        rank: usize,
        /// The process that holds it.
        pid: i32,
    },
    /// Some ranks did not join before the timeout.
    #[error(
        "ranks {missing:?} of {world} never joined within {waited:?}; start every rank with the same unique id and world size, or raise the timeout"
    )]
    PeersMissing {
        /// The ranks that never came, in increasing order.
        missing: Vec<usize>,
        /// The world size.
        world: usize,
        /// How long this rank waited.
        waited: Duration,
    },
    /// The segment exists but its creator never finished setting it up.
    #[error(
        "segment {name}: created but not set up within {waited:?}; its creator may have died: restart every rank with a new unique id"
    )]
    CreatorStalled {
        /// The segment's name.
        name: String,
        /// How long this rank waited.
        waited: Duration,
    },
    /// A segment of this name holds something this version does not understand.
    #[error(
        "segment {name}: {problem}; it was not made by this version of gp2p-comm: restart every rank with a new unique id"
    )]
    Foreign {
        /// The segment's name.
        name: String,
        /// What does not match.
        problem: String,
    },
    /// /dev/shm cannot hold the segment (a container's default is 64 MiB).
    #[error(
        "segment {name}: /dev/shm has no room for its {bytes} bytes; give it more (docker run --shm-size=1g, or --ipc=host) or make the communicator with fewer or smaller slots (slot_bytes, slots)"
    )]
    NoRoom {
        /// The segment's name.
        name: String,
        /// The segment's size.
        bytes: usize,
    },
    /// A system call on the segment failed.
    #[error("segment {name}: {call} failed: {source}")]
    Os {
        /// The segment's name.
        name: String,
        /// The call that failed.
        call: &'static str,
        /// The error it returned.
        source: std::io::Error,
    },
    /// The CUDA layer refused or failed (registering the segment, a launch).
    #[error(transparent)]
    Cuda(#[from] gp2p_cuda::Error),
    /// Part of the communicator that is not built yet.
    #[error("{what} is not built yet; this version runs {supported}")]
    NotBuiltYet {
        /// What was asked for.
        what: String,
        /// What this version does run.
        supported: &'static str,
    },
    /// A rank made its communicator with other options than this one.
    #[error(
        "rank {rank} made its communicator with other options (one-kernel max bytes, slot bytes, slots, line kernel max bytes, forced algorithm (0 none, 1 one-shot, 2 two-shot) + 256 if the waits are watched + 512 with the many-rank flagged chunks, compression (format + 256 x block, 0 off), its minimum in KiB, chunk bytes (0 by the message): {theirs:?}, here {ours:?}); make every rank's with the same CommOptions, GP2P_ALGORITHM, GP2P_COMPRESS and GP2P_MANY_CHUNKS"
    )]
    OptionsMismatch {
        /// The rank whose options differ.
        rank: usize,
        /// This rank's.
        ours: [u32; crate::layout::OPTION_WORDS],
        /// Theirs.
        theirs: [u32; crate::layout::OPTION_WORDS],
    },
    /// A call on a stream that is capturing a CUDA graph, without the caller's promise.
    #[error(
        "stream: capturing a CUDA graph; call the unsafe Communicator::allow_graph_capture first (its contract: the captured buffers outlive every launch, and every rank launches in the same order)"
    )]
    CaptureRefused,
    /// A collective's buffers whose lengths do not fit each other.
    #[error(
        "{what}: {got} elements, but the call needs {expected} (the collective's other buffer times the world size {world}); pass buffers of matching lengths"
    )]
    LengthMismatch {
        /// Which argument.
        what: &'static str,
        /// Its length.
        got: usize,
        /// The length the call needs.
        expected: usize,
        /// The world size.
        world: usize,
    },
    /// An out-of-place all-reduce whose output's length is not its input's.
    #[error(
        "output: {output} elements, but input has {input}; an all-reduce's output holds as many elements as its input"
    )]
    OutputLength {
        /// The output's length.
        output: usize,
        /// The input's.
        input: usize,
    },
    /// An input and output that share memory, in a collective that reads one while it
    /// writes the other.
    #[error(
        "input and output overlap (device bytes {input:#x?} and {output:#x?}); pass separate buffers, or use all_reduce for an in-place reduction"
    )]
    Overlap {
        /// The input's device byte range.
        input: std::ops::Range<u64>,
        /// The output's.
        output: std::ops::Range<u64>,
    },
    /// A compressed all-reduce of an op or element type it does not take.
    #[error(
        "a compressed all-reduce takes sum or avg of f32, f16 or bf16, not {op} of {dtype}: use all_reduce for this one"
    )]
    NotCompressible {
        /// The op given.
        op: gp2p_kernels::ReduceOp,
        /// The element type given.
        dtype: gp2p_kernels::DType,
    },
    /// A buffer or stream on another device than the communicator's.
    #[error("{what} is on device {got}, but this rank's communicator is on device {expected}; use this rank's device")]
    WrongDevice {
        /// Which argument.
        what: &'static str,
        /// Its device.
        got: usize,
        /// The communicator's device.
        expected: usize,
    },
    /// A send or receive whose peer is this rank or outside the world.
    #[error(
        "peer: {peer} is not another rank of this communicator (this is rank {rank} of {world}); pass one of the others"
    )]
    Peer {
        /// The peer asked for.
        peer: usize,
        /// This rank.
        rank: usize,
        /// The world size.
        world: usize,
    },
    /// A communicator option out of range.
    #[error("{name}: {reason}")]
    InvalidOption {
        /// Which option.
        name: &'static str,
        /// What is wrong, and the fix.
        reason: String,
    },
    /// A rank failed while the communicator was being made, after this rank had joined.
    #[error("rank {rank} failed to register the shared segment with the driver; make a new communicator on every rank")]
    PeerFailed {
        /// The rank that failed.
        rank: usize,
    },
    /// Ranks of the communicator whose processes have exited.
    #[error(
        "rank {rank}: rank(s) {gone:?} of this communicator exited, so its calls can no longer complete; make a new communicator on the ranks left"
    )]
    PeerGone {
        /// This rank.
        rank: usize,
        /// The ranks gone.
        gone: Vec<usize>,
    },
    /// The ranks' calls no longer pair up: a collective gave up waiting on some rank.
    #[error(
        "rank {rank}: the communicator is broken (a collective on some rank gave up waiting for its peer, so the ranks' calls no longer pair up); make a new communicator on every rank"
    )]
    Broken {
        /// This rank.
        rank: usize,
    },
    /// An earlier call's kernel gave up waiting for the peer: its result is wrong.
    #[error(
        "rank {rank}: a collective before this call waited {timeout:?} for {peers} and gave up, so its result is wrong (a rank that died, or that made another call); every rank must make the same calls in the same order, and no rank's stream may fall behind by more than the timeout (CommOptions::peer_timeout)"
    )]
    PeerTimeout {
        /// This rank.
        rank: usize,
        /// Whom it waited for: "rank 1" between two, "another rank" among more (a wait
        /// does not tell which).
        peers: String,
        /// How long it waited.
        timeout: Duration,
    },
}

impl Error {
    /// Whether this error means "no CUDA here" (no driver, or no such device).
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Error::Cuda(e) if e.is_unavailable())
    }
}
