//! The error type of gp2p-cuda.

/// Shorthand for results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can go wrong in the CUDA layer.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// No CUDA driver library (libcuda) could be loaded on this machine.
    #[error(
        "no NVIDIA CUDA driver found (libcuda could not be loaded): install the NVIDIA driver, or run on a machine with an NVIDIA GPU"
    )]
    NoDriver,
    /// The driver is there, but the ordinal names no device.
    #[error("device {ordinal} does not exist: {count} CUDA device(s) visible (check CUDA_VISIBLE_DEVICES)")]
    NoDevice {
        /// The ordinal asked for.
        ordinal: usize,
        /// How many devices the driver reports.
        count: usize,
    },
    /// The device is older than the kernels support.
    #[error(
        "device {ordinal} ({name}) has compute capability {major}.{minor}; geforce-p2p needs 7.5 (Turing) or newer"
    )]
    Unsupported {
        /// Device ordinal.
        ordinal: usize,
        /// Device name.
        name: String,
        /// Compute capability, major.
        major: u32,
        /// Compute capability, minor.
        minor: u32,
    },
    /// A device cannot map pinned host memory into its address space (every staging path
    /// needs that).
    #[error("device {ordinal} cannot map pinned host memory (CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY is 0)")]
    NoHostMapping {
        /// Device ordinal.
        ordinal: usize,
    },
    /// A driver call failed.
    #[error("{call} failed: {name} ({code})")]
    Driver {
        /// The driver API function that failed.
        call: &'static str,
        /// The CUDA error name, such as `CUDA_ERROR_OUT_OF_MEMORY`.
        name: String,
        /// The numeric `CUresult`.
        code: u32,
    },
    /// Two buffers that must have the same length do not.
    #[error("{what}: {got} elements, expected {expected}")]
    LengthMismatch {
        /// Which argument, in words.
        what: &'static str,
        /// Its length.
        got: usize,
        /// The length it must have.
        expected: usize,
    },
    /// An operation was enqueued on a borrowed stream that is capturing a CUDA graph: its
    /// last-use records would describe the capture, not the graph's launches, so replays
    /// could touch memory already freed or reused. Found once the work is enqueued, the
    /// capture is invalidated too; [`crate::Stream::refuse_capture`] finds it before.
    #[error(
        "stream: capturing a CUDA graph; this operation cannot be captured (its buffers are kept per call, not per graph launch): run it outside the capture (the one-process-per-GPU communicator's calls can be captured)"
    )]
    Capturing,
    /// A buffer or event lives on another device than the stream it is used with.
    #[error("{what} is on device {got}, but the stream is on device {expected}: use a stream of device {got}")]
    WrongDevice {
        /// Which argument, in words.
        what: &'static str,
        /// The device it is on.
        got: usize,
        /// The device it must be on.
        expected: usize,
    },
    /// An argument is out of its valid range.
    #[error("invalid argument {name}: {reason}")]
    InvalidArgument {
        /// The argument's name.
        name: &'static str,
        /// What is wrong and what is expected.
        reason: String,
    },
    /// A kernel name is not in its module.
    #[error("kernel {name} not found in PTX module {module}: the committed PTX is stale, run `cargo xtask ptx`")]
    KernelNotFound {
        /// Kernel name.
        name: &'static str,
        /// Module name.
        module: &'static str,
    },
}

impl Error {
    /// Whether this error means "no CUDA here" (no driver, or no such device), as opposed
    /// to a failure of a device that exists.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Error::NoDriver | Error::NoDevice { .. })
    }
}
