//! The error type of gp2p-collectives.

/// Shorthand for results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can go wrong in a collective. Bad input is refused before any work is enqueued.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A failure of the CUDA layer.
    #[error(transparent)]
    Cuda(#[from] gp2p_cuda::Error),
    /// A failure of the pinned-memory layer.
    #[error(transparent)]
    Pinned(#[from] gp2p_pinned::Error),
    /// A failure of the transport layer (its option checks, too).
    #[error(transparent)]
    Transport(#[from] gp2p_transport::Error),
    /// No ranks were given.
    #[error("a collective needs at least one rank, got none")]
    NoRanks,
    /// Two ranks' buffers are on one device.
    #[error(
        "ranks {first} and {second} both have their buffer on device {device}: a collective takes one buffer per device (logical ranks on one GPU are a test-only feature, `testing`)"
    )]
    SharedDevice {
        /// The device.
        device: usize,
        /// First rank on it.
        first: usize,
        /// Second rank on it.
        second: usize,
    },
    /// A buffer of the wrong size.
    #[error("rank {rank}: {what} has {got} elements, expected {expected}")]
    WrongLength {
        /// The rank.
        rank: usize,
        /// Which buffer.
        what: &'static str,
        /// Its length.
        got: usize,
        /// The length it must have.
        expected: usize,
    },
    /// A rank's stream is on another device than its buffer.
    #[error("rank {rank}: the stream is on device {stream}, the buffer on device {buffer}")]
    StreamDevice {
        /// The rank.
        rank: usize,
        /// The stream's device.
        stream: usize,
        /// The buffer's device.
        buffer: usize,
    },
    /// An input on another device than its rank's output.
    #[error(
        "rank {rank}: the input is on device {input}, the output on device {output}: give each rank its input on its own device"
    )]
    InputDevice {
        /// The rank.
        rank: usize,
        /// The input's device.
        input: usize,
        /// The output's device.
        output: usize,
    },
    /// A schedule whose transfer waits for one not yet enqueued: a fault of the planning in
    /// this crate (`plan_waits`), never of the caller's input. The call stops there; what it
    /// enqueued before is joined back into the callers' streams, as after any failure.
    #[error(
        "internal error: transfer {transfer} of the schedule is waited on before it is enqueued (a bug in gp2p-collectives, please report it)"
    )]
    ScheduleOrder {
        /// The transfer waited on.
        transfer: usize,
    },
    /// Legs' steps whose record or wait of a lane's mark comes out of order: a fault of the
    /// steps in this crate (`crate::legs::steps`), never of the caller's input. The call stops
    /// there, as for [`Error::ScheduleOrder`].
    #[error(
        "internal error: mark {mark} of rank {rank}'s {lane} lane is {what} (a bug in gp2p-collectives, please report it)"
    )]
    MarkOrder {
        /// The rank whose steps these are.
        rank: usize,
        /// `send` or `receive`.
        lane: &'static str,
        /// The mark.
        mark: usize,
        /// What is wrong: recorded out of turn or before a chunk, or waited on unrecorded.
        what: &'static str,
    },
    /// The environment variable that forces an all-reduce algorithm names none
    /// ([`crate::cost::ALGORITHM_VAR`]).
    #[error(
        "{var}={given:?} names no all-reduce algorithm: expected ring, one-shot or two-shot (or unset it to let the cost model choose)"
    )]
    UnknownAlgorithm {
        /// The variable.
        var: &'static str,
        /// Its value.
        given: String,
    },
    /// The one-shot all-reduce was forced on the in-process engine, which runs the ring or
    /// the two-shot legs (one-shot is the one-process-per-GPU communicator's).
    #[error(
        "{forced_by}: one-shot is not an in-process pipeline (the engine runs ring or two-shot; one-shot is gp2p-comm's, among processes): force ring or two-shot, or leave it unset for the cost model's choice"
    )]
    OneShotInProcess {
        /// What forced it: the environment variable or `Engine::with_algorithm`.
        forced_by: &'static str,
    },
    /// Legs the in-process engine cannot run (see `Engine`'s legs executor).
    #[error("leg {leg} {reason}")]
    UnrunnableLegs {
        /// The leg's index.
        leg: usize,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A root rank out of range.
    #[error("root {root} is out of range: there are {ranks} ranks")]
    BadRoot {
        /// The root given.
        root: usize,
        /// The number of ranks.
        ranks: usize,
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
}

impl Error {
    /// Whether this error means "no CUDA here" (no driver, or no such device).
    pub fn is_unavailable(&self) -> bool {
        match self {
            Error::Cuda(e) => e.is_unavailable(),
            Error::Pinned(e) => e.is_unavailable(),
            Error::Transport(e) => e.is_unavailable(),
            _ => false,
        }
    }
}
