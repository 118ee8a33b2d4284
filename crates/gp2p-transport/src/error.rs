//! The error type of gp2p-transport.

/// Shorthand for results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can go wrong moving data.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A failure of the CUDA layer.
    #[error(transparent)]
    Cuda(#[from] gp2p_cuda::Error),
    /// A failure of the pinned-memory layer.
    #[error(transparent)]
    Pinned(#[from] gp2p_pinned::Error),
    /// A stream on another device than the view it orders.
    #[error("{stream} is on device {got}, but {view} is on device {expected}: pass a stream of device {expected}")]
    StreamDevice {
        /// Which stream argument.
        stream: &'static str,
        /// The stream's device.
        got: usize,
        /// The view it must share a device with.
        view: &'static str,
        /// The view's device.
        expected: usize,
    },
    /// Source and destination of a copy differ in length.
    #[error("src has {src} elements, but dst has {dst}: copy between views of equal length")]
    LengthMismatch {
        /// Elements of the source.
        src: usize,
        /// Elements of the destination.
        dst: usize,
    },
    /// `Route::Peer` was forced on a pair that cannot access each other.
    #[error(
        "route Peer forced, but devices {src} and {dst} cannot access each other's memory (no P2P): use Route::Auto or Route::Staged, and see `gp2p probe` for why"
    )]
    NoPeerAccess {
        /// Source device.
        src: usize,
        /// Destination device.
        dst: usize,
    },
    /// Source and destination overlap on one device.
    #[error("src and dst overlap on device {device} (src {src:#x?}, dst {dst:#x?}): copy through a separate buffer")]
    Overlap {
        /// The device.
        device: usize,
        /// The source byte range.
        src: std::ops::Range<u64>,
        /// The destination byte range.
        dst: std::ops::Range<u64>,
    },
    /// An option out of range.
    #[error("invalid option {name}: {reason}")]
    InvalidOption {
        /// The option.
        name: &'static str,
        /// What is wrong and what is expected.
        reason: String,
    },
}

impl Error {
    /// Whether this error means "no CUDA here" (no driver, or no such device).
    pub fn is_unavailable(&self) -> bool {
        match self {
            Error::Cuda(e) => e.is_unavailable(),
            Error::Pinned(e) => e.is_unavailable(),
            _ => false,
        }
    }
}
