//! The door's communicator handles: an `ncclComm_t` the door made points at a registered
//! [`Handle`]; any other non-null value is the real NCCL's own communicator (handed over
//! without a wrapper where it was made in one call) and goes to the real NCCL untouched.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, LazyLock, Mutex, PoisonError};

use crate::abi::{Code, RawComm};
use crate::error::{Error, Result};
use crate::served::Served;

/// What a door-made communicator is now.
#[derive(Clone)]
pub enum State {
    /// Being created (non-blocking, or in a group until `ncclGroupEnd`).
    Pending,
    /// Served by the door.
    Served(Arc<Served>),
    /// Handed over: the real NCCL's communicator (its address).
    Real(usize),
    /// Creation failed: the code and message every later call returns.
    Failed(Code, String),
    /// Destroyed or aborted: the handle is kept (so its address is never reused for another
    /// communicator) and every call on it is refused.
    Destroyed,
}

impl State {
    /// A failed creation's error, with its code and message; `None` for any other state.
    pub fn failure(&self) -> Option<Error> {
        match self {
            State::Failed(code, message) => Some(Error::Failed { code: *code, message: message.clone() }),
            _ => None,
        }
    }
}

/// A door-made communicator.
pub struct Handle {
    state: Mutex<State>,
    settled: Condvar,
    /// Aborted while still being created: what the creation makes is aborted at once.
    abandoned: std::sync::atomic::AtomicBool,
}

impl Handle {
    /// Its state now.
    pub fn state(&self) -> State {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Settle a pending handle; where it was abandoned meanwhile, abort what was made. The
    /// flag is read under the state's lock, which [`Handle::abandon`] sets it under: an abort
    /// that comes while the creation ends either finds the handle settled (and aborts what it
    /// holds) or leaves the abort to this.
    pub fn settle(&self, made: State) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if self.abandoned.load(std::sync::atomic::Ordering::Acquire) {
            *state = State::Destroyed;
            drop(state);
            abort_made(&made);
        } else {
            *state = made;
        }
        self.settled.notify_all();
    }

    /// Abort what a finished creation made, and retire the handle; a creation still running
    /// aborts what it makes when it ends.
    pub fn abandon_made(&self) {
        if let Some(made) = self.abandon() {
            abort_made(&made);
        }
    }

    /// Give the handle up: a creation still running aborts what it makes when it ends. Returns
    /// what a finished creation had made (dropped here unless the caller aborts it), `None`
    /// while one is still running.
    pub fn abandon(&self) -> Option<State> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        self.abandoned.store(true, std::sync::atomic::Ordering::Release);
        match *state {
            State::Pending => None,
            _ => Some(std::mem::replace(&mut *state, State::Destroyed)),
        }
    }

    /// Its state once it is no longer pending (creation always ends: the rendezvous and the
    /// joins are bounded).
    pub fn wait_settled(&self) -> State {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        while matches!(*state, State::Pending) {
            state = self.settled.wait(state).unwrap_or_else(PoisonError::into_inner);
        }
        state.clone()
    }
}

/// Abort a communicator a creation made after its handle was given up.
fn abort_made(state: &State) {
    match state {
        State::Served(served) => served.abort(),
        State::Real(comm) => {
            if let Some(real) = crate::real::loaded() {
                let _ = real.abort_made(*comm);
            }
        }
        State::Pending | State::Failed(..) | State::Destroyed => {}
    }
}

/// Every door-made handle, by address, live or destroyed (kept, so no address is reused).
static HANDLES: LazyLock<Mutex<HashMap<usize, Arc<Handle>>>> = LazyLock::new(Mutex::default);

fn handles() -> std::sync::MutexGuard<'static, HashMap<usize, Arc<Handle>>> {
    HANDLES.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Register a new handle in `state`; its address is the `ncclComm_t` to hand out.
pub fn register(state: State) -> (RawComm, Arc<Handle>) {
    let handle = Arc::new(Handle {
        state: Mutex::new(state),
        settled: Condvar::new(),
        abandoned: std::sync::atomic::AtomicBool::new(false),
    });
    let address = Arc::as_ptr(&handle) as usize;
    handles().insert(address, Arc::clone(&handle));
    (std::ptr::without_provenance_mut(address), handle)
}

/// What an `ncclComm_t` names.
pub enum Target {
    /// A door-made handle.
    Door(Arc<Handle>),
    /// The real NCCL's communicator.
    Real(RawComm),
}

/// What `comm` names.
///
/// # Errors
/// [`Error::InvalidArgument`] for null, or for a value that is neither a door handle nor
/// possibly the real NCCL's (the real NCCL is not loaded, so none of its communicators
/// exists).
pub fn resolve(comm: RawComm) -> Result<Target> {
    if comm.is_null() {
        return Err(Error::argument("comm", "null: pass a communicator made by ncclCommInitRank or its kin"));
    }
    if let Some(handle) = handles().get(&(comm as usize)) {
        return Ok(Target::Door(Arc::clone(handle)));
    }
    if crate::real::loaded().is_some() {
        return Ok(Target::Real(comm));
    }
    Err(Error::argument("comm", format!("{comm:p} is not a communicator (destroyed already, or never made)")))
}

/// What a handle's calls go to now: the served communicator, or the real one's address.
///
/// # Errors
/// [`Error::InvalidArgument`] while it is being created, as NCCL refuses a communicator
/// whose non-blocking creation has not finished (a caller that got `ncclInProgress` back
/// would take the call as accepted); the creation's error once it failed.
pub fn live(handle: &Handle) -> Result<Live> {
    match handle.state() {
        State::Pending => Err(Error::argument(
            "comm",
            "still being created (non-blocking init): poll ncclCommGetAsyncError until it returns ncclSuccess, then call",
        )),
        State::Served(served) => Ok(Live::Served(served)),
        State::Real(real) => Ok(Live::Real(std::ptr::with_exposed_provenance_mut(real))),
        State::Failed(code, message) => {
            Err(Error::Failed { code, message: format!("this communicator's creation failed: {message}") })
        }
        State::Destroyed => Err(Error::argument("comm", "destroyed already (ncclCommDestroy or ncclCommAbort)")),
    }
}

/// A communicator ready for calls.
pub enum Live {
    /// Served by the door.
    Served(Arc<Served>),
    /// The real NCCL's.
    Real(RawComm),
}

/// What `comm` names, ready for a call.
///
/// # Errors
/// As [`resolve`] and [`live`].
pub fn target(comm: RawComm) -> Result<Live> {
    match resolve(comm)? {
        Target::Door(handle) => live(&handle),
        Target::Real(real) => Ok(Live::Real(real)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::Code;

    fn failed(why: &str) -> State {
        State::Failed(Code::SystemError, why.to_owned())
    }

    #[test]
    fn a_call_on_a_communicator_still_being_created_is_refused_as_an_invalid_argument() {
        let (_, handle) = register(State::Pending);
        match live(&handle) {
            Err(e) => {
                assert_eq!(
                    e.code(),
                    Code::InvalidArgument,
                    "NCCL refuses it so: ncclInProgress would read as accepted"
                );
                assert!(e.to_string().contains("ncclCommGetAsyncError"), "{e}");
            }
            Ok(_) => panic!("a pending communicator took a call"),
        }
    }

    #[test]
    fn a_creation_that_ends_after_its_handle_was_given_up_leaves_it_destroyed() {
        let (_, handle) = register(State::Pending);
        assert!(handle.abandon().is_none(), "nothing made yet");
        handle.settle(failed("made late"));
        assert!(matches!(handle.state(), State::Destroyed));
        assert!(matches!(handle.wait_settled(), State::Destroyed), "waiters are woken");
    }

    #[test]
    fn giving_up_a_settled_handle_hands_back_what_its_creation_made_once() {
        let (_, handle) = register(State::Pending);
        handle.settle(failed("made"));
        match handle.abandon() {
            Some(State::Failed(_, why)) => assert_eq!(why, "made"),
            _ => panic!("the settled state is handed back for the caller to abort"),
        }
        assert!(matches!(handle.state(), State::Destroyed));
        assert!(matches!(handle.abandon(), Some(State::Destroyed)), "a second end finds it destroyed");
    }
}
