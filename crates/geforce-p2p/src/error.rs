//! The one error of the facade: every facade function returns it, whichever layer failed.

/// Shorthand for results of the facade.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can go wrong in geforce-p2p, by the layer that refused or failed. Messages are the
/// layer's own (they name the argument and the fix); [`Error::is_unavailable`] says whether
/// there is simply no NVIDIA driver or device here.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The CUDA layer: devices, streams, device memory, kernel launches.
    #[error(transparent)]
    Cuda(#[from] gp2p_cuda::Error),
    /// Pinned host memory and staging rings.
    #[error(transparent)]
    Pinned(#[from] gp2p_pinned::Error),
    /// The copy engine.
    #[error(transparent)]
    Transport(#[from] gp2p_transport::Error),
    /// The collectives.
    #[error(transparent)]
    Collectives(#[from] gp2p_collectives::Error),
    /// The probe.
    #[error(transparent)]
    Probe(#[from] gp2p_probe::Error),
}

impl Error {
    /// Whether this error means "no CUDA here" (no driver, or no such device), as opposed to
    /// a failure of a device that exists.
    pub fn is_unavailable(&self) -> bool {
        match self {
            Error::Cuda(e) => e.is_unavailable(),
            Error::Pinned(e) => e.is_unavailable(),
            Error::Transport(e) => e.is_unavailable(),
            Error::Collectives(e) => e.is_unavailable(),
            Error::Probe(e) => e.is_unavailable(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_driver_is_unavailable_from_every_layer_with_the_same_message() {
        let none = || gp2p_cuda::Error::NoDriver;
        let all: [Error; 5] = [
            none().into(),
            gp2p_pinned::Error::Cuda(none()).into(),
            gp2p_transport::Error::Pinned(gp2p_pinned::Error::Cuda(none())).into(),
            gp2p_collectives::Error::Transport(gp2p_transport::Error::Cuda(none())).into(),
            gp2p_probe::Error::Cuda(none()).into(),
        ];
        for e in all {
            assert!(e.is_unavailable(), "{e:?}");
            assert!(e.to_string().starts_with("no NVIDIA CUDA driver found"), "{e}");
        }
        let refused: Error = gp2p_collectives::Error::NoRanks.into();
        assert!(!refused.is_unavailable());
        assert!(refused.to_string().contains("at least one rank"), "{refused}");
    }
}
