//! `ncclGroupStart` / `ncclGroupEnd` on the calling thread: calls on served communicators
//! between them are checked at once and enqueued together at the outermost end, each
//! communicator's in the order every rank agrees on (`crate::plan::order_group`), and
//! creations asked for inside run together there, so one thread can drive every rank of a
//! clique. Nothing waits for another rank on the host except those creations.

use std::cell::RefCell;
use std::sync::Arc;

use crate::abi::{Code, RawStream, RawUniqueId};
use crate::error::{Error, Result};
use crate::handles::Handle;
use crate::init::{self, Request};
use crate::plan::{Call, order_group};
use crate::served::Served;

/// A call held until the group ends.
struct Held {
    served: Arc<Served>,
    call: Call,
    /// The caller's stream (its address).
    stream: usize,
}

#[derive(Default)]
struct Group {
    /// For each open `ncclGroupStart`, whether it also started a group of the real NCCL.
    opened: Vec<bool>,
    calls: Vec<Held>,
    inits: Vec<(RawUniqueId, Request, Arc<Handle>)>,
    /// The first call of the open group that failed (its code and message): the group then
    /// fails as a whole at its end, as NCCL's does.
    failed: Option<(Code, String)>,
}

thread_local! {
    static GROUP: RefCell<Group> = RefCell::new(Group::default());
}

/// Whether a group is open on this thread.
pub fn open() -> bool {
    GROUP.with(|g| !g.borrow().opened.is_empty())
}

/// `ncclGroupStart`.
///
/// # Errors
/// The real NCCL's, where it is loaded and refuses.
pub fn start() -> Result<()> {
    let real = crate::real::loaded();
    if let Some(real) = real {
        real.group_start()?;
    }
    GROUP.with(|g| g.borrow_mut().opened.push(real.is_some()));
    Ok(())
}

/// Note that a call made inside this thread's open group failed (it returned `e` at once):
/// the group's end then enqueues none of its calls, fails its creations and returns the first
/// such error, as NCCL's `ncclGroupEnd` does. Outside a group, nothing.
pub fn fail(e: &Error) {
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if !g.opened.is_empty() && g.failed.is_none() {
            g.failed = Some((e.code(), e.to_string()));
        }
    });
}

/// Hold `call` of `served` on `stream` until the group ends.
pub fn hold(served: Arc<Served>, call: Call, stream: RawStream) {
    GROUP.with(|g| g.borrow_mut().calls.push(Held { served, call, stream: stream.expose_provenance() }));
}

/// Hold a creation until the group ends.
pub fn hold_init(id: RawUniqueId, request: Request, handle: Arc<Handle>) {
    GROUP.with(|g| g.borrow_mut().inits.push((id, request, handle)));
}

/// Close the innermost open group for `call`: whether it started one of the real NCCL's too,
/// and whether it was the outermost.
fn close(call: &str) -> Result<(bool, bool)> {
    let (started_real, outermost) = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        let started = g.opened.pop();
        (started, g.opened.is_empty())
    });
    let started_real = started_real.ok_or_else(|| Error::Usage { what: format!("{call} without ncclGroupStart") })?;
    Ok((started_real, outermost))
}

/// Forget a creation held in this thread's open group (its communicator destroyed before the
/// group ended): `true` where it was one, which is then settled as destroyed (no creation
/// thread ever runs for it).
pub fn drop_init(handle: &Arc<Handle>) -> bool {
    let held = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        let before = g.inits.len();
        g.inits.retain(|(_, _, h)| !Arc::ptr_eq(h, handle));
        before != g.inits.len()
    });
    if held {
        handle.settle(crate::handles::State::Destroyed);
    }
    held
}

/// `ncclGroupEnd`: at the outermost end, run the held creations, then enqueue the held
/// calls, communicator by communicator; where a call of the group failed ([`fail`]), neither:
/// the group fails with that call's error.
///
/// Returns the real NCCL's group end's code where it opened one too: `ncclInProgress` for a
/// non-blocking communicator of its own still making its calls; else success.
///
/// # Errors
/// [`Error::Usage`] without a matching start; the first call of the group that failed; else
/// the first failure (the calls of the other communicators are still enqueued).
pub fn end() -> Result<Code> {
    let (started_real, outermost) = close("ncclGroupEnd")?;
    let mut result = Ok(());
    if outermost {
        let (calls, inits, failed) = GROUP.with(|g| {
            let mut g = g.borrow_mut();
            (std::mem::take(&mut g.calls), std::mem::take(&mut g.inits), g.failed.take())
        });
        if let Some((code, message)) = failed {
            for (_, _, handle) in inits {
                let why = format!("created inside a group that a failed call ended: {message}");
                handle.settle(crate::handles::State::Failed(code, why));
            }
            let message = format!("a call of this group failed, so none of its calls ran: {message}");
            result = Err(Error::Failed { code, message });
        } else {
            result = run_group(calls, &inits);
        }
    }
    match crate::real::loaded() {
        Some(real) if started_real => result.and(real.group_end()),
        _ => result.map(|()| Code::Success),
    }
}

/// The outermost end of a group none of whose calls failed: its creations, then its calls.
fn run_group(calls: Vec<Held>, inits: &[(RawUniqueId, Request, Arc<Handle>)]) -> Result<()> {
    if !inits.is_empty() {
        init::create_all(inits);
    }
    // A creation that failed fails the group with its own code, as NCCL's group end does.
    let failed = inits.iter().find_map(|(_, _, h)| match h.state() {
        crate::handles::State::Failed(code, message) => Some(Error::Failed { code, message }),
        _ => None,
    });
    let ran = run_held(calls);
    failed.map_or(ran, Err)
}

/// `ncclGroupSimulateEnd`: end the group as [`end`] does but enqueue nothing: held calls are
/// dropped, held creations fail. Returns whether this group also started one of the real
/// NCCL's, which the caller then simulates there.
///
/// # Errors
/// [`Error::Usage`] without a matching start.
pub fn simulate_end() -> Result<bool> {
    let (started_real, outermost) = close("ncclGroupSimulateEnd")?;
    if outermost {
        let inits = GROUP.with(|g| {
            let mut g = g.borrow_mut();
            g.calls.clear();
            g.failed = None;
            std::mem::take(&mut g.inits)
        });
        for (_, _, handle) in inits {
            let why = String::from("created inside a group that ncclGroupSimulateEnd ended: nothing was created");
            handle.settle(crate::handles::State::Failed(crate::abi::Code::InvalidUsage, why));
        }
    }
    Ok(started_real && crate::real::loaded().is_some())
}

/// Enqueue held calls: each communicator's together, communicators in the order first used.
fn run_held(calls: Vec<Held>) -> Result<()> {
    /// One communicator's held calls, each with its stream.
    type PerComm = (Arc<Served>, Vec<(Call, RawStream)>);
    let mut by_comm: Vec<PerComm> = Vec::new();
    for held in calls {
        let stream: RawStream = std::ptr::with_exposed_provenance_mut(held.stream);
        match by_comm.iter_mut().find(|(s, _)| Arc::ptr_eq(s, &held.served)) {
            Some((_, list)) => list.push((held.call, stream)),
            None => by_comm.push((held.served, vec![(held.call, stream)])),
        }
    }
    let mut first_error = Ok(());
    for (served, calls) in by_comm {
        let ran = order_group(&calls, served.rank).and_then(|ordered| served.run(&ordered));
        if let Err(e) = ran
            && first_error.is_ok()
        {
            first_error = Err(e);
        }
    }
    first_error
}

/// Run one call of `served` now, or hold it where a group is open.
///
/// # Errors
/// Its check's error at once (in a group too); outside a group, its enqueue's.
pub fn call(served: Arc<Served>, call: Call, stream: RawStream) -> Result<()> {
    call.check(served.rank, served.world)?;
    if open() {
        hold(served, call, stream);
        return Ok(());
    }
    let ordered = order_group(&[(call, stream)], served.rank)?;
    served.run(&ordered)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ConfigArg;
    use crate::handles::{State, register};

    fn request() -> Request {
        Request { nranks: 2, rank: 0, ordinal: None, config: ConfigArg::None, on_worker: true }
    }

    fn id() -> RawUniqueId {
        RawUniqueId { internal: [0; crate::abi::UNIQUE_ID_BYTES] }
    }

    #[test]
    fn a_call_that_failed_inside_a_group_fails_the_group_and_its_creations() {
        assert!(crate::real::loaded().is_none(), "no real NCCL in the unit tests");
        start().unwrap();
        start().unwrap();
        let (_, handle) = register(State::Pending);
        hold_init(id(), request(), Arc::clone(&handle));
        fail(&Error::argument("peer", "7 is not a rank of 2"));
        fail(&Error::argument("root", "a later failure is not the one reported"));
        assert_eq!(end().unwrap(), Code::Success, "an inner end runs nothing");
        assert!(matches!(handle.state(), State::Pending), "still held");
        let e = end().unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(
            e.to_string().contains("7 is not a rank of 2") && e.to_string().contains("none of its calls ran"),
            "{e}"
        );
        match handle.state() {
            State::Failed(Code::InvalidArgument, why) => assert!(why.contains("7 is not a rank"), "{why}"),
            _ => panic!("the held creation fails with the group"),
        }
        start().unwrap();
        assert_eq!(end().unwrap(), Code::Success, "the next group starts clean");
        fail(&Error::argument("comm", "outside a group"));
        start().unwrap();
        assert_eq!(end().unwrap(), Code::Success, "a failure outside any group fails none");
    }

    #[test]
    fn a_creation_destroyed_inside_its_group_is_settled_destroyed_and_never_made() {
        start().unwrap();
        let (_, handle) = register(State::Pending);
        hold_init(id(), request(), Arc::clone(&handle));
        assert!(drop_init(&handle));
        assert!(matches!(handle.wait_settled(), State::Destroyed), "settled, so a waiter never hangs");
        assert!(!drop_init(&handle), "held once");
        assert_eq!(end().unwrap(), Code::Success, "nothing left to create");
        assert!(end().is_err_and(|e| e.code() == Code::InvalidUsage), "an end without a start");
    }
}
