//! The error type of the CLI and its exit codes.

use geforce_p2p::{collectives, comm, cuda, pinned, probe, transport};

/// What can make a `gp2p` command fail.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// A failure of the library, whichever layer.
    #[error(transparent)]
    Library(#[from] geforce_p2p::Error),
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
    /// Reading or parsing an input file failed.
    #[error("reading {path}: {why}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        why: String,
    },
    /// A benchmark computed wrong results.
    #[error("{0}")]
    Wrong(String),
    /// A failure followed, on a line of its own, by what to do next (its exit code is the
    /// failure's).
    #[error("{error}\n{hint}")]
    Hinted {
        /// The failure.
        error: Box<CliError>,
        /// What to do next.
        hint: String,
    },
}

/// The exit code of a failure: it ran and something went wrong (wrong results, a driver
/// error, a file that could not be written).
pub const EXIT_FAILURE: u8 = 1;
/// The exit code of a command typed wrong: a bad flag or value, as clap's own.
pub const EXIT_USAGE: u8 = 2;
/// The exit code of a command that cannot run on this machine: no NVIDIA driver or device.
pub const EXIT_UNAVAILABLE: u8 = 3;

impl CliError {
    /// [`EXIT_UNAVAILABLE`] when there is no driver or device (nothing to do here),
    /// [`EXIT_USAGE`] for a bad value, [`EXIT_FAILURE`] for any other failure.
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Hinted { error, .. } => error.exit_code(),
            CliError::Library(e) if e.is_unavailable() => EXIT_UNAVAILABLE,
            CliError::Usage(_) => EXIT_USAGE,
            _ => EXIT_FAILURE,
        }
    }

    /// Whether the failure is that this machine has no driver or device.
    pub fn is_unavailable(&self) -> bool {
        self.exit_code() == EXIT_UNAVAILABLE
    }
}

/// The layers' errors go through the facade's one [`geforce_p2p::Error`].
macro_rules! library_error_from {
    ($($t:ty),*) => {$(
        impl From<$t> for CliError {
            fn from(e: $t) -> CliError {
                CliError::Library(e.into())
            }
        }
    )*};
}
library_error_from!(cuda::Error, pinned::Error, transport::Error, collectives::Error, probe::Error, comm::Error);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_driver_exits_3_from_every_layer() {
        let none = || cuda::Error::NoDriver;
        assert_eq!(CliError::from(none()).exit_code(), 3);
        assert_eq!(CliError::from(collectives::Error::Cuda(none())).exit_code(), 3);
        let pinned_inside = collectives::Error::Pinned(pinned::Error::Cuda(none()));
        assert_eq!(CliError::from(pinned_inside).exit_code(), 3, "through the pinned layer too");
        assert_eq!(CliError::from(probe::Error::Cuda(none())).exit_code(), 3);
        assert_eq!(CliError::from(transport::Error::Cuda(none())).exit_code(), 3);
        assert_eq!(CliError::from(collectives::Error::NoRanks).exit_code(), 1);
        assert_eq!(CliError::Usage("bad".into()).exit_code(), 2, "typed wrong, as clap says it");
        let hinted = CliError::Hinted { error: Box::new(CliError::from(none())), hint: "try this".into() };
        assert_eq!(hinted.exit_code(), 3, "a hint keeps the failure's code");
        assert!(
            hinted.to_string().starts_with("no NVIDIA CUDA driver found") && hinted.to_string().ends_with("\ntry this")
        );
    }
}
