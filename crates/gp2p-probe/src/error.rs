//! The error type of gp2p-probe.

/// What can stop a probe. Missing sources are not errors: they lower what the report says.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The CUDA layer failed, or there is no driver at all.
    #[error(transparent)]
    Cuda(#[from] gp2p_cuda::Error),
    /// Saved facts could not be read.
    #[error("reading facts from {path}: {reason}")]
    Facts {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// Saved facts were read but contradict themselves (see [`crate::Facts::check`]).
    #[error("facts in {path} do not hold together: {reason}; save them again with `gp2p probe --json`")]
    Inconsistent {
        /// The file.
        path: String,
        /// What is wrong.
        reason: String,
    },
}

impl Error {
    /// Whether this means "no NVIDIA driver here".
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Error::Cuda(e) if e.is_unavailable())
    }
}

/// Shorthand for results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
