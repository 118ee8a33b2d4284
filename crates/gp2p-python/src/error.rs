//! Library errors as Python exceptions: which class of `geforce_p2p._errors` each error of
//! the layers below is raised as, with the library's own message.
//!
//! The classes live in Python (`python/geforce_p2p/_errors.py`) so that a refusal can be both
//! a `geforce_p2p.Error` and a `ValueError`. Errors are plain data ([`Raised`]) until they
//! reach the Python boundary, since the native calls run with the GIL released.

use geforce_p2p::{collectives, comm, cuda, pinned, probe, transport};
use pyo3::prelude::*;

/// The Python module of this package that holds the exception classes.
const ERRORS_MODULE: &str = "_errors";

/// The exception class an error is raised as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    /// `Error`: anything not more specific below.
    Error,
    /// `UnavailableError`: no NVIDIA driver, or no such device.
    Unavailable,
    /// `UnsupportedDeviceError`: a device geforce-p2p cannot use (compute capability, no
    /// host mapping).
    UnsupportedDevice,
    /// `InvalidArgumentError` (also a `ValueError`): bad input, refused before any GPU work.
    InvalidArgument,
    /// `NotPinnedError` (an `InvalidArgumentError`): host memory that is not page-locked.
    NotPinned,
    /// `CudaError`: a CUDA driver call failed.
    Cuda,
}

impl Class {
    /// The class's name in `geforce_p2p._errors`.
    pub(crate) const fn name(self) -> &'static str {
        match self {
            Class::Error => "Error",
            Class::Unavailable => "UnavailableError",
            Class::UnsupportedDevice => "UnsupportedDeviceError",
            Class::InvalidArgument => "InvalidArgumentError",
            Class::NotPinned => "NotPinnedError",
            Class::Cuda => "CudaError",
        }
    }

    /// Every class, for the test that the Python module defines each.
    pub(crate) const ALL: [Class; 6] = [
        Class::Error,
        Class::Unavailable,
        Class::UnsupportedDevice,
        Class::InvalidArgument,
        Class::NotPinned,
        Class::Cuda,
    ];
}

/// An error on its way to Python: its class and the library's message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Raised {
    pub(crate) class: Class,
    pub(crate) message: String,
}

impl Raised {
    /// A refusal of argument `name` by the checks of this crate.
    pub(crate) fn argument(name: &str, reason: impl std::fmt::Display) -> Raised {
        Raised { class: Class::InvalidArgument, message: format!("invalid argument {name}: {reason}") }
    }

    /// Run `work` with the GIL released (it may enqueue GPU work or wait on a lock), and
    /// raise its error as the Python exception: how every native call runs.
    pub(crate) fn detached<T: Send>(py: Python<'_>, work: impl FnOnce() -> Result<T, Raised> + Send) -> PyResult<T> {
        py.detach(work).map_err(|e| e.into_pyerr(py))
    }

    /// The Python exception. Falls back to `RuntimeError` only if the package's own error
    /// module cannot be imported (a broken install).
    pub(crate) fn into_pyerr(self, py: Python<'_>) -> PyErr {
        let made = crate::package::import(py, ERRORS_MODULE)
            .and_then(|m| m.getattr(self.class.name()))
            .and_then(|class| class.call1((self.message.clone(),)));
        match made {
            Ok(instance) => PyErr::from_value(instance),
            Err(_) => pyo3::exceptions::PyRuntimeError::new_err(self.message),
        }
    }
}

/// Which class an error of a layer below is raised as.
pub(crate) trait Classify: std::fmt::Display {
    /// The class.
    fn class(&self) -> Class;
}

impl Classify for cuda::Error {
    fn class(&self) -> Class {
        use cuda::Error as E;
        match self {
            E::NoDriver | E::NoDevice { .. } => Class::Unavailable,
            E::Unsupported { .. } | E::NoHostMapping { .. } => Class::UnsupportedDevice,
            E::Driver { .. } => Class::Cuda,
            E::LengthMismatch { .. } | E::WrongDevice { .. } | E::InvalidArgument { .. } | E::Capturing => {
                Class::InvalidArgument
            }
            _ => Class::Error,
        }
    }
}

impl Classify for pinned::Error {
    fn class(&self) -> Class {
        use pinned::Error as E;
        match self {
            E::Cuda(e) => e.class(),
            E::NotPinned { .. } => Class::NotPinned,
            E::WrongDevice { .. }
            | E::LengthMismatch { .. }
            | E::ScratchTooShort { .. }
            | E::ReceiveSize { .. }
            | E::InvalidArgument { .. } => Class::InvalidArgument,
            _ => Class::Error,
        }
    }
}

impl Classify for transport::Error {
    fn class(&self) -> Class {
        use transport::Error as E;
        match self {
            E::Cuda(e) => e.class(),
            E::Pinned(e) => e.class(),
            E::StreamDevice { .. }
            | E::LengthMismatch { .. }
            | E::NoPeerAccess { .. }
            | E::Overlap { .. }
            | E::InvalidOption { .. } => Class::InvalidArgument,
            _ => Class::Error,
        }
    }
}

impl Classify for geforce_p2p::Error {
    fn class(&self) -> Class {
        use geforce_p2p::Error as E;
        match self {
            E::Cuda(e) => e.class(),
            E::Pinned(e) => e.class(),
            E::Transport(e) => e.class(),
            E::Collectives(e) => e.class(),
            E::Probe(e) => e.class(),
            E::Comm(e) => e.class(),
            _ => Class::Error,
        }
    }
}

impl Classify for collectives::Error {
    fn class(&self) -> Class {
        use collectives::Error as E;
        match self {
            E::Cuda(e) => e.class(),
            E::Pinned(e) => e.class(),
            E::Transport(e) => e.class(),
            E::NoRanks
            | E::SharedDevice { .. }
            | E::WrongLength { .. }
            | E::StreamDevice { .. }
            | E::InputDevice { .. }
            | E::BadRoot { .. }
            | E::UnknownAlgorithm { .. } => Class::InvalidArgument,
            _ => Class::Error,
        }
    }
}

impl Classify for probe::Error {
    fn class(&self) -> Class {
        match self {
            probe::Error::Cuda(e) => e.class(),
            _ => Class::Error,
        }
    }
}

impl Classify for comm::Error {
    fn class(&self) -> Class {
        use comm::Error as E;
        match self {
            E::Cuda(e) => e.class(),
            E::MalformedId { .. }
            | E::World { .. }
            | E::Rank { .. }
            | E::StagingTooLarge { .. }
            | E::WorldMismatch { .. }
            | E::BytesMismatch { .. }
            | E::RankTaken { .. }
            | E::LengthMismatch { .. }
            | E::Overlap { .. }
            | E::CaptureRefused
            | E::OptionsMismatch { .. }
            | E::WrongDevice { .. }
            | E::Peer { .. }
            | E::InvalidOption { .. } => Class::InvalidArgument,
            _ => Class::Error,
        }
    }
}

impl Classify for gp2p_cli::CliError {
    fn class(&self) -> Class {
        match self {
            gp2p_cli::CliError::Library(e) => e.class(),
            _ => Class::Error,
        }
    }
}

macro_rules! raised_from {
    ($($t:ty),*) => {$(
        impl From<$t> for Raised {
            fn from(e: $t) -> Raised {
                Raised { class: e.class(), message: e.to_string() }
            }
        }
    )*};
}
raised_from!(
    cuda::Error,
    pinned::Error,
    transport::Error,
    geforce_p2p::Error,
    collectives::Error,
    probe::Error,
    comm::Error,
    gp2p_cli::CliError
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_driver_is_unavailable_through_every_layer() {
        let none = || cuda::Error::NoDriver;
        let all: [Raised; 6] = [
            none().into(),
            pinned::Error::Cuda(none()).into(),
            transport::Error::Pinned(pinned::Error::Cuda(none())).into(),
            collectives::Error::Transport(transport::Error::Cuda(none())).into(),
            probe::Error::Cuda(none()).into(),
            geforce_p2p::Error::Collectives(collectives::Error::Cuda(none())).into(),
        ];
        for raised in all {
            assert_eq!(raised.class, Class::Unavailable);
            assert!(raised.message.starts_with("no NVIDIA CUDA driver found"), "same message: {}", raised.message);
        }
        let missing: Raised = cuda::Error::NoDevice { ordinal: 3, count: 2 }.into();
        assert_eq!(missing.class, Class::Unavailable);
    }

    #[test]
    fn refusals_are_invalid_arguments_and_failures_are_not() {
        let shared = collectives::Error::SharedDevice { device: 0, first: 0, second: 1 };
        assert_eq!(Raised::from(shared).class, Class::InvalidArgument);
        let unpinned = pinned::Error::NotPinned { what: "src", ptr: 0x1000, bytes: 64 };
        let raised = Raised::from(geforce_p2p::Error::Pinned(unpinned));
        assert_eq!(raised.class, Class::NotPinned);
        assert!(raised.message.starts_with("src: "), "names the argument: {}", raised.message);
        let overlap = geforce_p2p::Error::Transport(transport::Error::Overlap { device: 0, src: 0..8, dst: 4..12 });
        assert_eq!(Raised::from(overlap).class, Class::InvalidArgument);
        // Each layer's own refusals, wherever they arrive from.
        let short = transport::Error::Pinned(pinned::Error::LengthMismatch {
            what: "the host memory",
            got: 3,
            of: "dst",
            expected: 4,
        });
        assert_eq!(Raised::from(short).class, Class::InvalidArgument);
        let lengths = geforce_p2p::Error::Transport(transport::Error::LengthMismatch { src: 3, dst: 4 });
        assert_eq!(Raised::from(lengths).class, Class::InvalidArgument);
        let stream = transport::Error::StreamDevice { stream: "src_stream", got: 1, view: "src", expected: 0 };
        assert_eq!(Raised::from(stream).class, Class::InvalidArgument);
        let driver = cuda::Error::Driver { call: "cuMemAlloc", name: "CUDA_ERROR_OUT_OF_MEMORY".into(), code: 2 };
        assert_eq!(Raised::from(driver).class, Class::Cuda);
        let old = cuda::Error::Unsupported { ordinal: 0, name: "T4".into(), major: 7, minor: 5 };
        assert_eq!(Raised::from(old).class, Class::UnsupportedDevice);
        assert_eq!(Raised::argument("len", "too long").message, "invalid argument len: too long");
        // A communicator option out of range is the caller's to fix (ValueError in Python).
        let option = comm::Error::InvalidOption { name: "small_max_bytes", reason: "0 is outside 1..=65536".into() };
        assert_eq!(Raised::from(option).class, Class::InvalidArgument);
    }

    #[test]
    fn class_names_are_distinct() {
        let mut names: Vec<&str> = Class::ALL.iter().map(|c| c.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Class::ALL.len());
    }
}
