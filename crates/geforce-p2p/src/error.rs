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
    /// The one-process-per-GPU communicator.
    #[error(transparent)]
    Comm(#[from] gp2p_comm::Error),
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
            Error::Comm(e) => e.is_unavailable(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_driver_is_unavailable_from_every_layer_with_the_same_message() {
        let none = || gp2p_cuda::Error::NoDriver;
        let all: [Error; 6] = [
            none().into(),
            gp2p_pinned::Error::Cuda(none()).into(),
            gp2p_transport::Error::Pinned(gp2p_pinned::Error::Cuda(none())).into(),
            gp2p_collectives::Error::Transport(gp2p_transport::Error::Cuda(none())).into(),
            gp2p_probe::Error::Cuda(none()).into(),
            gp2p_comm::Error::Cuda(none()).into(),
        ];
        for e in all {
            assert!(e.is_unavailable(), "{e:?}");
            assert!(e.to_string().starts_with("no NVIDIA CUDA driver found"), "{e}");
        }
        let refused: Error = gp2p_collectives::Error::NoRanks.into();
        assert!(!refused.is_unavailable());
        assert!(refused.to_string().contains("at least one rank"), "{refused}");
    }

    #[test]
    fn a_refusal_keeps_its_layer_and_message() {
        use std::error::Error as _;
        // A pinned-layer refusal seen through the transport: the message is the pinned
        // layer's own, naming the argument and the fix, and no CUDA error sits in between.
        let short = gp2p_pinned::Error::LengthMismatch { what: "the host memory", got: 3, of: "dst", expected: 4 };
        let e: Error = gp2p_transport::Error::Pinned(short.clone()).into();
        assert!(!e.is_unavailable());
        assert_eq!(e.to_string(), "the host memory has 3 elements, but dst has 4: pass views of equal length");
        assert!(matches!(e, Error::Transport(gp2p_transport::Error::Pinned(ref p)) if *p == short));
        // Wrapping is transparent: message and source() are the refusing layer's own.
        assert_eq!(e.source().map(ToString::to_string), short.source().map(ToString::to_string));
    }

    /// Each crate raises its own variants: outside tests,
    /// no crate above gp2p-cuda builds a lower crate's error variant, so a refusal arrives
    /// from the layer that made it, not as `Cuda(..)` from one layer and `Pinned(Cuda(..))`
    /// from another.
    #[test]
    fn no_crate_builds_a_lower_crates_error() {
        let crates = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let lower = ["gp2p_cuda::Error::", "gp2p_pinned::Error::", "gp2p_transport::Error::", "Error as CudaError"];
        let mut found = Vec::new();
        for krate in ["gp2p-pinned", "gp2p-transport", "gp2p-collectives", "gp2p-probe", "geforce-p2p"] {
            let src = crates.join(krate).join("src");
            let Ok(entries) = std::fs::read_dir(&src) else { continue };
            for entry in entries.flatten() {
                let Ok(text) = std::fs::read_to_string(entry.path()) else { continue };
                // Tests may build any layer's errors to check how they travel.
                let code = text.split("#[cfg(test)]").next().unwrap_or_default();
                for (n, line) in code.lines().enumerate() {
                    if lower.iter().any(|l| line.contains(l)) {
                        found.push(format!("{}:{}: {}", entry.path().display(), n + 1, line.trim()));
                    }
                }
            }
        }
        assert!(
            found.is_empty(),
            "a lower crate's error built here; add a variant of this crate's own:\n{}",
            found.join("\n")
        );
    }
}
