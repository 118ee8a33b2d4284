//! The error type of the CLI and its exit codes.

use geforce_p2p::{cuda, pinned};

/// What can make a `gp2p` command fail.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// A CUDA-layer failure.
    #[error(transparent)]
    Cuda(#[from] cuda::Error),
    /// A pinned-memory failure.
    #[error(transparent)]
    Pinned(#[from] pinned::Error),
    /// A transport failure.
    #[error(transparent)]
    Transport(#[from] geforce_p2p::Error),
    /// A collective failure.
    #[error(transparent)]
    Collective(#[from] geforce_p2p::collectives::Error),
    /// A bad command-line value.
    #[error("{0}")]
    Usage(String),
    /// Writing output failed.
    #[error("writing {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// A benchmark computed wrong results.
    #[error("{0}")]
    Wrong(String),
}

impl CliError {
    /// 2 when there is no driver or device (nothing to do here), 1 for any other failure.
    pub fn exit_code(&self) -> u8 {
        let unavailable = match self {
            CliError::Cuda(e) => e.is_unavailable(),
            CliError::Pinned(e) => e.is_unavailable(),
            CliError::Transport(e) => e.is_unavailable(),
            CliError::Collective(geforce_p2p::collectives::Error::Cuda(e)) => e.is_unavailable(),
            _ => false,
        };
        if unavailable { 2 } else { 1 }
    }
}
