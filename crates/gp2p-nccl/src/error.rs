//! The door's one error type, the NCCL result code each variant becomes, and the message
//! `ncclGetLastError` returns.

use std::cell::RefCell;
use std::ffi::{CStr, CString};

use crate::abi::Code;

/// Shorthand for results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What the door turns down or fails at. Every message names the argument or the step, says
/// what was expected, and, where the door itself is the obstacle, how to turn it off.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An argument NCCL would refuse too: a null pointer, a rank out of range, an unknown
    /// type or op, a count whose bytes overflow.
    #[error("{argument}: {problem}")]
    InvalidArgument {
        /// The argument, by its name in `nccl.h`.
        argument: &'static str,
        /// What is wrong and what was expected.
        problem: String,
    },
    /// A call the door does not serve on a communicator it serves.
    #[error(
        "{what} is not served by geforce-p2p's NCCL door on a communicator without P2P; run with GP2P_NCCL=off to hand every communicator to the real NCCL"
    )]
    NotServed {
        /// The call, and why where it helps.
        what: String,
    },
    /// A call made in an order or a state it cannot be: a group ended that was never
    /// started, a call on an aborted communicator.
    #[error("{what}")]
    Usage {
        /// What was wrong with the order of calls.
        what: String,
    },
    /// `GP2P_NCCL` (or another variable of the door) holds a value it does not know.
    #[error("{name}={value}: {expected}")]
    Environment {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
        /// What it may hold.
        expected: &'static str,
    },
    /// The real NCCL was needed and could not be loaded or lacks the function.
    #[error("the real NCCL: {problem}")]
    RealNccl {
        /// What was looked for and where.
        problem: String,
    },
    /// The ranks could not agree on a communicator: the rendezvous named by the unique id
    /// failed, timed out or found them inconsistent.
    #[error("rendezvous: {problem}")]
    Rendezvous {
        /// What happened.
        problem: String,
    },
    /// The library below failed (CUDA, the communicator, a peer).
    #[error(transparent)]
    Library(#[from] geforce_p2p::Error),
    /// A call returned a code from the real NCCL (only its code crosses back).
    #[error("the real NCCL returned {code:?} from {call}")]
    Real {
        /// The function called.
        call: &'static str,
        /// Its result.
        code: Code,
    },
    /// A panic inside the door, caught at its boundary (a bug: please report it).
    #[error("internal error in geforce-p2p's NCCL door: {message}; please report it")]
    Panic {
        /// The panic's message.
        message: String,
    },
    /// A failure kept from earlier (a creation that failed on another thread), with its code.
    #[error("{message}")]
    Failed {
        /// The code it failed with.
        code: Code,
        /// What failed.
        message: String,
    },
}

impl Error {
    /// The `ncclResult_t` a C caller gets for it.
    pub fn code(&self) -> Code {
        match self {
            Error::InvalidArgument { .. } | Error::Environment { .. } => Code::InvalidArgument,
            Error::NotServed { .. } | Error::Usage { .. } => Code::InvalidUsage,
            Error::RealNccl { .. } | Error::Rendezvous { .. } => Code::SystemError,
            Error::Real { code, .. } | Error::Failed { code, .. } => *code,
            Error::Panic { .. } => Code::InternalError,
            Error::Library(e) => library_code(e),
        }
    }

    /// A bad argument, by its name in `nccl.h`.
    pub fn argument(argument: &'static str, problem: impl Into<String>) -> Error {
        Error::InvalidArgument { argument, problem: problem.into() }
    }
}

/// The code of a failure below: a dead or timed-out peer is NCCL's remote error, bad input
/// its invalid argument, anything of the driver an unhandled CUDA error.
fn library_code(e: &geforce_p2p::Error) -> Code {
    use geforce_p2p::comm::Error as Comm;
    match e {
        geforce_p2p::Error::Comm(Comm::PeerTimeout { .. } | Comm::Broken { .. } | Comm::PeerGone { .. }) => {
            Code::RemoteError
        }
        geforce_p2p::Error::Comm(
            Comm::World { .. }
            | Comm::Rank { .. }
            | Comm::Peer { .. }
            | Comm::LengthMismatch { .. }
            | Comm::OutputLength { .. }
            | Comm::Overlap { .. }
            | Comm::WrongDevice { .. },
        ) => Code::InvalidArgument,
        geforce_p2p::Error::Comm(Comm::CaptureRefused) => Code::InvalidUsage,
        geforce_p2p::Error::Comm(Comm::Cuda(_)) | geforce_p2p::Error::Cuda(_) => Code::UnhandledCudaError,
        _ => Code::SystemError,
    }
}

thread_local! {
    /// This thread's last error message (NCCL keeps one per process; per thread, a message
    /// never changes under a reader on another thread).
    static LAST: RefCell<CString> = RefCell::new(CString::default());
}

/// Keep `message` as this thread's last error, for `ncclGetLastError`, and say it on stderr
/// where `NCCL_DEBUG` asks for warnings.
pub fn remember(message: &str) {
    crate::log::warn(&format!("geforce-p2p NCCL door: {message}"));
    keep(message);
}

/// Keep `message` as this thread's last error without saying it (a repeat).
pub fn keep(message: &str) {
    let text = format!("geforce-p2p NCCL door: {message}");
    // Interior NULs cannot cross into C: cut the message there.
    let text = CString::new(text).unwrap_or_else(|e| {
        let end = e.nul_position();
        let mut bytes = e.into_vec();
        bytes.truncate(end);
        CString::new(bytes).unwrap_or_default()
    });
    LAST.with(|last| *last.borrow_mut() = text);
}

/// Forget this thread's last error: the real NCCL's is newer (a call handed over failed).
pub fn clear() {
    LAST.with(|last| *last.borrow_mut() = CString::default());
}

/// Whether this thread has an error message of the door's.
pub fn has_last() -> bool {
    LAST.with(|last| !last.borrow().is_empty())
}

/// This thread's last error message, valid until this thread's next error.
pub fn last() -> *const std::ffi::c_char {
    LAST.with(|last| last.borrow().as_ptr())
}

/// [`last`] as text, for tests.
#[cfg(test)]
pub fn last_text() -> String {
    LAST.with(|last| last.borrow().to_string_lossy().into_owned())
}

/// `ncclGetErrorString` of a raw code: NCCL's wording, or "unknown result code".
pub fn describe(raw: crate::abi::RawResult) -> &'static CStr {
    Code::from_raw(raw).map_or(c"unknown result code", Code::describe)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_follow_nccl() {
        assert_eq!(Error::argument("count", "too big").code(), Code::InvalidArgument);
        assert_eq!(Error::NotServed { what: "ncclCommWindowRegister".into() }.code(), Code::InvalidUsage);
        let peer = geforce_p2p::comm::Error::Broken { rank: 1 };
        assert_eq!(Error::Library(peer.into()).code(), Code::RemoteError);
        assert_eq!(Error::Real { call: "ncclAllReduce", code: Code::InvalidUsage }.code(), Code::InvalidUsage);
    }

    #[test]
    fn the_last_message_is_kept_per_thread_and_cut_at_a_nul() {
        remember("rank: 3 is not below 2");
        assert_eq!(last_text(), "geforce-p2p NCCL door: rank: 3 is not below 2");
        std::thread::spawn(|| assert_eq!(last_text(), "")).join().expect("thread");
        remember("a\0b");
        assert_eq!(last_text(), "geforce-p2p NCCL door: a");
        assert_eq!(describe(99), c"unknown result code");
        assert_eq!(describe(0), c"no error");
    }

    #[test]
    fn a_message_not_served_says_how_to_turn_the_door_off() {
        let e = Error::NotServed { what: "ncclCommWindowRegister".into() };
        assert!(e.to_string().contains("GP2P_NCCL=off"), "{e}");
    }
}
