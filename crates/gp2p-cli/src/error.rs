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
    /// A probe failure (no driver, or saved facts that cannot be read).
    #[error(transparent)]
    Probe(#[from] geforce_p2p::probe::Error),
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
            CliError::Collective(e) => e.is_unavailable(),
            CliError::Probe(e) => e.is_unavailable(),
            _ => false,
        };
        if unavailable { 2 } else { 1 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use geforce_p2p::collectives;

    #[test]
    fn no_driver_exits_2_from_every_layer() {
        let none = || cuda::Error::NoDriver;
        assert_eq!(CliError::Cuda(none()).exit_code(), 2);
        assert_eq!(CliError::Collective(collectives::Error::Cuda(none())).exit_code(), 2);
        let pinned_inside = collectives::Error::Pinned(pinned::Error::Cuda(none()));
        assert_eq!(CliError::Collective(pinned_inside).exit_code(), 2, "through the pinned layer too");
        assert_eq!(CliError::Probe(geforce_p2p::probe::Error::Cuda(none())).exit_code(), 2);
        assert_eq!(CliError::Collective(collectives::Error::NoRanks).exit_code(), 1);
        assert_eq!(CliError::Usage("bad".into()).exit_code(), 1);
    }
}
