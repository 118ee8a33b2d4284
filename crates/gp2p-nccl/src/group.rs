//! `ncclGroupStart` / `ncclGroupEnd` on the calling thread: calls on served communicators
//! between them are checked at once and enqueued together at the outermost end, each
//! communicator's in the order every rank agrees on (`crate::plan::order_group`), and
//! creations asked for inside (inits, and splits and shrinks of served communicators) run
//! together there, each on a thread of its own, so one thread can drive every rank of a
//! clique. Nothing waits for another rank on the host except those creations, and not even
//! they where the group holds non-blocking inits only: its end then returns
//! `ncclInProgress` at once, as NCCL's does, and each handle settles when its rank is made.

use std::cell::RefCell;
use std::sync::Arc;

use crate::abi::{Code, RawStream, RawUniqueId};
use crate::error::{Error, Result};
use crate::handles::{Handle, State};
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
    derived: Vec<Derived>,
    /// The first call of the open group that failed (its code and message): the group then
    /// fails as a whole at its end, as NCCL's does.
    failed: Option<(Code, String)>,
}

/// Makes a communicator from a served one (`ncclCommSplit`, `ncclCommShrink`), waiting for
/// the other ranks of the parent: `None` where this rank takes part but gets none
/// (`NCCL_SPLIT_NOCOLOR`).
pub type Derive = Box<dyn FnOnce() -> Result<Option<Served>> + Send>;

/// A creation from a served communicator held until the group ends, and the pending handle it
/// settles (none for a rank that gets no communicator).
struct Derived {
    /// The parent (its address): one parent's derivations run one after another, in the order
    /// they were asked for, which every rank keeps (each takes the parent's next number and
    /// exchange round, as NCCL numbers a communicator's splits when they are called).
    parent: usize,
    derive: Derive,
    handle: Option<Arc<Handle>>,
    /// Its communicator was destroyed inside the group: it still takes part (the parent's
    /// other ranks wait for it), and what it makes is dropped.
    destroyed: bool,
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

/// Hold a creation from the served communicator whose address is `parent` until the group
/// ends; `handle` (pending, already handed out) is settled with what it makes.
pub fn hold_derived(parent: usize, derive: Derive, handle: Option<Arc<Handle>>) {
    GROUP.with(|g| g.borrow_mut().derived.push(Derived { parent, derive, handle, destroyed: false }));
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
/// group ended): `true` where it was one, and its handle is then settled as destroyed. An
/// init is dropped (no creation thread ever runs for it); a split or shrink still runs at the
/// group's end, since the parent's other ranks wait for this one, and what it makes is
/// dropped there.
pub fn drop_init(handle: &Arc<Handle>) -> bool {
    let held = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        let before = g.inits.len();
        g.inits.retain(|(_, _, h)| !Arc::ptr_eq(h, handle));
        let mine = |d: &&mut Derived| !d.destroyed && d.handle.as_ref().is_some_and(|h| Arc::ptr_eq(h, handle));
        let derived = g.derived.iter_mut().find(mine).map(|d| d.destroyed = true).is_some();
        before != g.inits.len() || derived
    });
    if held {
        handle.settle(State::Destroyed);
    }
    held
}

/// `ncclGroupEnd`: at the outermost end, run the held creations, then enqueue the held
/// calls, communicator by communicator; where a call of the group failed ([`fail`]), neither:
/// the group fails with that call's error.
///
/// Returns `ncclInProgress` where the group held non-blocking inits only ([`ends_in_progress`]),
/// which go on being made; else the real NCCL's group end's code where it opened one too
/// (`ncclInProgress` for a non-blocking communicator of its own still making its calls); else
/// success.
///
/// # Errors
/// [`Error::Usage`] without a matching start; the first call of the group that failed; else
/// the first failure (the calls of the other communicators are still enqueued).
pub fn end() -> Result<Code> {
    let (started_real, outermost) = close("ncclGroupEnd")?;
    let mut result = Ok(());
    let mut in_progress = false;
    if outermost {
        let (calls, inits, derived, failed) = GROUP.with(|g| {
            let mut g = g.borrow_mut();
            let g = &mut *g;
            (
                std::mem::take(&mut g.calls),
                std::mem::take(&mut g.inits),
                std::mem::take(&mut g.derived),
                g.failed.take(),
            )
        });
        if let Some((code, message)) = failed {
            let why = format!("created inside a group that a failed call ended: {message}");
            fail_creations(inits, derived, code, &why);
            let message = format!("a call of this group failed, so none of its calls ran: {message}");
            result = Err(Error::Failed { code, message });
        } else if ends_in_progress(&calls, &inits, &derived) {
            result = create_in_background(inits);
            in_progress = result.is_ok();
        } else {
            result = run_group(calls, &inits, derived);
        }
    }
    let code = match crate::real::loaded() {
        Some(real) if started_real => result.and(real.group_end()),
        _ => result.map(|()| Code::Success),
    };
    code.map(|c| if in_progress { Code::InProgress } else { c })
}

/// Whether a group's end leaves its creations running and says `ncclInProgress`: it holds
/// inits only, each with a non-blocking config. A group that also holds calls or splits
/// still ends once everything is made, since its calls need their communicators.
fn ends_in_progress(calls: &[Held], inits: &[(RawUniqueId, Request, Arc<Handle>)], derived: &[Derived]) -> bool {
    calls.is_empty() && derived.is_empty() && !inits.is_empty() && inits.iter().all(|(_, r, _)| !r.config.blocking())
}

/// Make `inits` together on a thread of their own, which settles their handles; where it
/// cannot start, they are settled as failed.
///
/// # Errors
/// [`Error::Failed`] (a system error) where the thread cannot start.
fn create_in_background(inits: Vec<(RawUniqueId, Request, Arc<Handle>)>) -> Result<()> {
    let handles: Vec<Arc<Handle>> = inits.iter().map(|(_, _, h)| Arc::clone(h)).collect();
    init::spawn_detached(&handles, move || init::create_all(&inits))
}

/// The outermost end of a group none of whose calls failed: its creations, all at once (a
/// thread for each init, one for each parent's splits and shrinks in turn), then its calls.
fn run_group(calls: Vec<Held>, inits: &[(RawUniqueId, Request, Arc<Handle>)], derived: Vec<Derived>) -> Result<()> {
    let by_parent = batches(derived, |d| d.parent);
    let derived_failed = std::thread::scope(|s| {
        // Where no thread starts, the handle is settled as failed, which is seen below.
        init::spawn_inits(s, inits);
        let started: Vec<_> = by_parent
            .into_iter()
            .map(|list| {
                let handles: Vec<Arc<Handle>> =
                    list.iter().filter(|d| !d.destroyed).filter_map(|d| d.handle.clone()).collect();
                // Every one runs (the other ranks wait for each); the first error is kept.
                init::spawn_creation(s, &handles, move || list.into_iter().map(derive).fold(None, Option::or))
            })
            .collect();
        // Every thread joined (a fold, not a search: the scope waits for them anyway); the
        // first error kept.
        let errors = started.into_iter().map(|started| match started {
            Ok(running) => running.join().unwrap_or_else(|_| Some(panicked())),
            Err(e) => Some(e),
        });
        errors.fold(None, Option::or)
    });
    // A creation that failed fails the group with its own code, as NCCL's group end does.
    let failed = inits.iter().find_map(|(_, _, h)| h.state().failure());
    let ran = run_held(calls);
    match failed.or(derived_failed) {
        Some(e) => Err(e),
        None => ran,
    }
}

/// Run a held split or shrink and settle its handle with what it made (unless it was
/// destroyed meanwhile: then what it made is dropped); its error, where it failed.
fn derive(Derived { derive, handle, destroyed, .. }: Derived) -> Option<Error> {
    let made = std::panic::catch_unwind(std::panic::AssertUnwindSafe(derive)).unwrap_or_else(|_| Err(panicked()));
    let state = match made {
        Ok(None) => State::Destroyed,
        Ok(Some(served)) => init::settled(Ok(init::Made::Served(Arc::new(served)))),
        Err(e) => init::settled(Err(e)),
    };
    let error = state.failure();
    if let Some(handle) = handle.filter(|_| !destroyed) {
        handle.settle(state);
    }
    error
}

fn panicked() -> Error {
    Error::Panic { message: String::from("while making a communicator from another at a group's end") }
}

/// Settle every held creation of a group that ends without making them as failed, `why`.
fn fail_creations(inits: Vec<(RawUniqueId, Request, Arc<Handle>)>, derived: Vec<Derived>, code: Code, why: &str) {
    let live = derived.into_iter().filter(|d| !d.destroyed);
    let handles = inits.into_iter().map(|(_, _, h)| h).chain(live.filter_map(|d| d.handle));
    for handle in handles {
        handle.settle(State::Failed(code, why.to_owned()));
    }
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
        let (inits, derived) = GROUP.with(|g| {
            let mut g = g.borrow_mut();
            g.calls.clear();
            g.failed = None;
            (std::mem::take(&mut g.inits), std::mem::take(&mut g.derived))
        });
        let why = "created inside a group that ncclGroupSimulateEnd ended: nothing was created";
        fail_creations(inits, derived, Code::InvalidUsage, why);
    }
    Ok(started_real && crate::real::loaded().is_some())
}

/// `items` in batches of equal `key`, each in the order given, batches in the order their
/// key first came (a group's calls by communicator, its derivations by parent).
fn batches<T, K: PartialEq>(items: Vec<T>, key: impl Fn(&T) -> K) -> Vec<Vec<T>> {
    let mut batches: Vec<Vec<T>> = Vec::new();
    for item in items {
        match batches.iter_mut().find(|batch| key(&batch[0]) == key(&item)) {
            Some(batch) => batch.push(item),
            None => batches.push(vec![item]),
        }
    }
    batches
}

/// Enqueue held calls: each communicator's together, communicators in the order first used.
fn run_held(calls: Vec<Held>) -> Result<()> {
    let mut first_error = Ok(());
    for batch in batches(calls, |held| Arc::as_ptr(&held.served)) {
        let served = Arc::clone(&batch[0].served);
        let calls: Vec<(Call, RawStream)> =
            batch.into_iter().map(|held| (held.call, std::ptr::with_exposed_provenance_mut(held.stream))).collect();
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

    /// Two held derivations that each wait for the other, as two ranks of one parent split by
    /// one thread do: they run at once at the group's end, or neither would finish.
    fn meeting(ran: &Arc<std::sync::atomic::AtomicUsize>) -> (Derive, Derive) {
        let (to_b, from_a) = std::sync::mpsc::channel::<()>();
        let (to_a, from_b) = std::sync::mpsc::channel::<()>();
        let patience = std::time::Duration::from_secs(20);
        let (ran_a, ran_b) = (Arc::clone(ran), Arc::clone(ran));
        let a: Derive = Box::new(move || {
            ran_a.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            to_b.send(()).expect("b is there");
            from_b.recv_timeout(patience).map_err(|_| Error::argument("a", "b never came"))?;
            Ok(None)
        });
        let b: Derive = Box::new(move || {
            ran_b.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            to_a.send(()).expect("a is there");
            from_a.recv_timeout(patience).map_err(|_| Error::argument("b", "a never came"))?;
            Err(Error::argument("color", "made up: b's split fails"))
        });
        (a, b)
    }

    /// Open a group and hold [`meeting`]'s two derivations in it, of parents 1 and 2, settling
    /// `a_settles` and `b_settles`.
    fn hold_meeting(
        ran: &Arc<std::sync::atomic::AtomicUsize>,
        a_settles: Option<&Arc<Handle>>,
        b_settles: Option<&Arc<Handle>>,
    ) {
        let (a, b) = meeting(ran);
        start().unwrap();
        hold_derived(1, a, a_settles.cloned());
        hold_derived(2, b, b_settles.cloned());
    }

    #[test]
    fn splits_held_in_a_group_run_together_at_its_end_and_settle_their_handles() {
        let ran = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (_, first) = register(State::Pending);
        let (_, second) = register(State::Pending);
        hold_meeting(&ran, Some(&first), Some(&second));
        assert_eq!(ran.load(std::sync::atomic::Ordering::SeqCst), 0, "held, not run");
        let e = end().expect_err("b's failure fails the group");
        assert!(e.to_string().contains("b's split fails") && e.code() == Code::InvalidArgument, "{e}");
        assert_eq!(ran.load(std::sync::atomic::Ordering::SeqCst), 2);
        assert!(matches!(first.state(), State::Destroyed), "a rank that gets no communicator");
        assert!(matches!(second.state(), State::Failed(Code::InvalidArgument, _)));
    }

    #[test]
    fn a_held_split_is_not_run_where_the_group_fails_and_still_runs_where_its_child_was_destroyed() {
        let ran = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (_, child) = register(State::Pending);
        hold_meeting(&ran, Some(&child), None);
        fail(&Error::argument("count", "made up"));
        assert!(end().is_err());
        assert_eq!(ran.load(std::sync::atomic::Ordering::SeqCst), 0, "a failed group makes nothing");
        assert!(matches!(child.state(), State::Failed(Code::InvalidArgument, _)));

        let (_, child) = register(State::Pending);
        hold_meeting(&ran, Some(&child), None);
        assert!(drop_init(&child), "destroyed inside the group");
        assert!(matches!(child.state(), State::Destroyed), "at once: a call on it is refused as destroyed");
        assert!(!drop_init(&child), "a second destroy is the ordinary one, which says destroyed already");
        assert!(end().is_err(), "b still fails: the parent's ranks met");
        assert_eq!(ran.load(std::sync::atomic::Ordering::SeqCst), 2, "both ran: the other rank waits for this one");
        assert!(matches!(child.state(), State::Destroyed));
    }

    #[test]
    fn one_parent_s_splits_run_one_after_another_in_the_order_asked() {
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        start().unwrap();
        for (i, pause) in [(1, 40), (2, 0), (3, 10)] {
            let order = Arc::clone(&order);
            let derive: Derive = Box::new(move || {
                std::thread::sleep(std::time::Duration::from_millis(pause));
                order.lock().unwrap().push(i);
                Ok(None)
            });
            hold_derived(7, derive, None);
        }
        assert_eq!(end().unwrap(), Code::Success);
        assert_eq!(*order.lock().unwrap(), [1, 2, 3], "each takes the parent's next round in turn");
    }

    fn non_blocking() -> Request {
        let mut raw = crate::abi::RawConfig::undefined();
        raw.blocking = 0;
        let config = crate::config::Config::new(&raw, None, None).expect("a valid config");
        Request { config: ConfigArg::Owned(Arc::new(config)), ..request() }
    }

    /// A door id of another version: its creation fails before any rendezvous or real NCCL.
    fn stale_door_id() -> RawUniqueId {
        let mut raw = id();
        raw.internal[..8].copy_from_slice(b"gp2pDOOR");
        raw.internal[8] = 1;
        raw
    }

    #[test]
    fn a_group_of_non_blocking_inits_ends_in_progress_and_its_handles_settle_later() {
        start().unwrap();
        let (_, handle) = register(State::Pending);
        hold_init(stale_door_id(), non_blocking(), Arc::clone(&handle));
        assert_eq!(end().unwrap(), Code::InProgress, "NCCL's answer for non-blocking creations");
        // The creation fails on its own thread, and says why.
        match handle.wait_settled() {
            State::Failed(_, why) => assert!(why.contains("id version 1"), "{why}"),
            _ => panic!("the creation settles its handle"),
        }
        // One blocking init among them, or a call, or a split: the end waits, as before.
        start().unwrap();
        let (_, other) = register(State::Pending);
        let (_, blocked) = register(State::Pending);
        hold_init(stale_door_id(), non_blocking(), Arc::clone(&other));
        hold_init(stale_door_id(), request(), Arc::clone(&blocked));
        assert!(end().is_err(), "the group waits for its creations and fails with them");
        assert!(matches!(blocked.state(), State::Failed(..)), "settled before the end returned");
        assert!(matches!(other.state(), State::Failed(..)), "made beside it, at the end");
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
