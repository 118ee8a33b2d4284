//! Making communicators: `ncclGetUniqueId` (a door id naming a fresh rendezvous, with the
//! real NCCL's id inside), and the one creation every init function comes down to
//! ([`create`]): this rank's facts to the rendezvous, the verdict back, then the served
//! communicator joined or the real one made. Creation blocks its thread (as NCCL's blocking
//! init does); where the caller must not be blocked (non-blocking config, inside a group) it
//! runs on a thread of its own and settles a pending handle.

use std::ffi::c_int;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use geforce_p2p::Device;
use geforce_p2p::comm::{CommOptions, Communicator, UniqueId};

use crate::abi::{Code, RawComm, RawUniqueId};
pub use crate::config::ConfigArg;
use crate::decision::Decision;
use crate::env::{self, Mode};
use crate::error::{Error, Result};
use crate::handles::{self, Handle, State};
use crate::id::{DoorId, fresh_secret, real_root_address};
use crate::rendezvous::{self, Maker, RealIdMaker};
use crate::served::Served;

/// `ncclGetUniqueId`: with the door off, the real NCCL's id; else a door id naming a new
/// rendezvous in this process, which makes the real NCCL's id only for a communicator handed
/// over (`crate::id` says why).
///
/// # Errors
/// [`Error::Environment`] for a bad `GP2P_NCCL`; [`Error::Rendezvous`] where no listener can
/// be opened; the real NCCL's error where it is off and fails.
pub fn unique_id() -> Result<RawUniqueId> {
    let mode = Mode::current()?;
    if mode == Mode::Off {
        // Off: the real id untouched, so every rank hands over without a rendezvous.
        return crate::real::real()?.unique_id();
    }
    // Serving needs no real NCCL: without one, a hand-over fails, saying so.
    let real = match crate::real::real() {
        Ok(real) => Some(real),
        Err(e) => {
            crate::log::info(&format!("no real NCCL to hand communicators of this unique id to: {e}"));
            None
        }
    };
    let ip = real.and_then(root_interface).unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
    let secret = fresh_secret()?;
    let maker = Maker {
        secret,
        host: geforce_p2p::comm::host_id(),
        timeout: env::timeout()?,
        comm_id: Box::new(|| UniqueId::new().map(|id| id.to_string()).map_err(|e| e.to_string())),
        real_id: real.map(|real| -> RealIdMaker {
            Box::new(move || real.unique_id().map(|id| id.internal.to_vec()).map_err(|e| e.to_string()))
        }),
    };
    let addr = rendezvous::listen(ip, maker)?;
    Ok(DoorId { rendezvous: addr, secret }.to_raw())
}

/// The interface the real NCCL reaches other hosts on (the address its bootstrap root would
/// listen on), which the door's rendezvous listens on too: read from one real id, made once a
/// process (its bootstrap thread, which waits for ever, is the one this costs), whatever it
/// names; made again only where making it failed (no thread was left then). Under a lock, so
/// threads asking at once make one.
fn root_interface(real: &crate::real::Real) -> Option<IpAddr> {
    static ROOT: std::sync::Mutex<Option<Option<IpAddr>>> = std::sync::Mutex::new(None);
    let mut root = ROOT.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(ip) = *root {
        return ip;
    }
    let id = real.unique_id().ok()?;
    let ip = real_root_address(&id);
    *root = Some(ip);
    ip
}

/// How one creation is asked for.
#[derive(Clone)]
pub struct Request {
    /// The world size.
    pub nranks: usize,
    /// This rank.
    pub rank: usize,
    /// The device to create it on (the caller's current device when it was asked).
    pub ordinal: Option<usize>,
    /// The caller's config, for the real NCCL.
    pub config: ConfigArg,
    /// Whether creation runs on a thread of the door's own (non-blocking, in a group,
    /// `ncclCommInitAll`), which must make `ordinal` current for the real NCCL; on the
    /// caller's thread its current device is left as the caller set it.
    pub on_worker: bool,
}

/// What a creation made.
pub enum Made {
    /// A served communicator.
    Served(Arc<Served>),
    /// The real NCCL's communicator.
    Real(RawComm),
}

/// Check an init's `nranks` and `rank`.
///
/// # Errors
/// [`Error::InvalidArgument`] naming the argument.
pub fn check_rank(nranks: c_int, rank: c_int) -> Result<(usize, usize)> {
    let nranks = usize::try_from(nranks)
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| Error::argument("nranks", format!("{nranks}: pass at least 1")))?;
    let rank = usize::try_from(rank)
        .ok()
        .filter(|&r| r < nranks)
        .ok_or_else(|| Error::argument("rank", format!("{rank} is not in 0..{nranks}")))?;
    Ok((nranks, rank))
}

/// Create one rank's communicator with `id` (a door id, or the real NCCL's).
///
/// # Errors
/// Whatever the rendezvous, the communicator's join or the real NCCL's init returns.
pub fn create(id: &RawUniqueId, request: &Request) -> Result<Made> {
    let Some(door) = DoorId::from_raw(id)? else {
        return real_init(id, request);
    };
    let mode = Mode::current()?;
    let (facts, ordinal) = crate::facts::local(request.rank, request.nranks, mode, request.ordinal);
    let verdict = rendezvous::join(door.rendezvous, &door.secret, &facts, env::timeout()?)?;
    crate::log::decision(&describe(&verdict.decision, request.rank, request.nranks));
    match verdict.decision {
        Decision::Serve { .. } => {
            let comm_id: UniqueId = verdict
                .comm_id
                .as_deref()
                .unwrap_or_default()
                .parse()
                .map_err(|e: geforce_p2p::comm::Error| Error::Library(e.into()))?;
            let ordinal = ordinal.ok_or_else(|| Error::Usage { what: String::from("no CUDA device to serve on") })?;
            serve(&comm_id, request, ordinal)
        }
        Decision::HandOver { .. } => {
            let bytes = verdict.real_id.unwrap_or_default();
            let internal = <[u8; crate::abi::UNIQUE_ID_BYTES]>::try_from(bytes.as_slice()).map_err(|_| {
                Error::RealNccl { problem: format!("the rendezvous sent a real unique id of {} bytes", bytes.len()) }
            })?;
            real_init(&RawUniqueId { internal }, request)
        }
    }
}

/// Join the served communicator `comm_id` as `request`'s rank on device `ordinal`.
pub fn serve(comm_id: &UniqueId, request: &Request, ordinal: usize) -> Result<Made> {
    let lib = |e: geforce_p2p::Error| Error::Library(e);
    let device = Device::open(ordinal).map_err(|e| lib(e.into()))?;
    let options = CommOptions {
        join_timeout: env::timeout()?,
        peer_timeout: env::peer_timeout()?,
        ..CommOptions::for_world(request.nranks)
    };
    let comm = Communicator::new(comm_id, request.rank, request.nranks, &device, options).map_err(|e| lib(e.into()))?;
    Ok(Made::Served(Arc::new(Served::new(comm))))
}

/// The log line of a decision.
fn describe(decision: &Decision, rank: usize, nranks: usize) -> String {
    match decision {
        Decision::Serve { reason } => {
            format!("on: serving a communicator of {nranks} rank(s) ({reason}) [rank {rank}]")
        }
        Decision::HandOver { reason } => {
            let real = crate::real::loaded().map(|r| format!(" {}", r.path.display())).unwrap_or_default();
            format!("on: handing a communicator of {nranks} rank(s) to the real NCCL{real} ({reason}) [rank {rank}]")
        }
    }
}

/// Make the real NCCL's communicator with the real `id`, on `request`'s device.
fn real_init(id: &RawUniqueId, request: &Request) -> Result<Made> {
    let real = crate::real::real()?;
    if let (true, Some(ordinal)) = (request.on_worker, request.ordinal) {
        // The real NCCL takes the calling thread's current device: this thread's is set as
        // the caller's was (with no check of the card: the real NCCL runs every card).
        Device::make_current_ordinal(ordinal).map_err(|e| Error::Library(e.into()))?;
    }
    let (nranks, rank) =
        (c_int::try_from(request.nranks).unwrap_or(c_int::MAX), c_int::try_from(request.rank).unwrap_or(0));
    Ok(Made::Real(real.init_rank(nranks, id, rank, &request.config)?))
}

/// The state a finished creation leaves its handle in.
pub fn settled(made: Result<Made>) -> State {
    match made {
        Ok(Made::Served(served)) => State::Served(served),
        Ok(Made::Real(comm)) => State::Real(comm.expose_provenance()),
        Err(e) => {
            crate::error::remember(&e.to_string());
            State::Failed(e.code(), e.to_string())
        }
    }
}

/// Create on a door's thread and settle `handle` with what it made; a panic settles it as
/// failed, so nobody waits for it forever.
pub fn create_on_worker(id: &RawUniqueId, request: &Request, handle: &Handle) {
    let request = Request { on_worker: true, ..request.clone() };
    let made = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| create(id, &request)))
        .unwrap_or_else(|_| Err(Error::Panic { message: String::from("while creating a communicator") }));
    handle.settle(settled(made));
}

/// Create on a thread of its own, returning a pending handle at once.
pub fn create_later(id: RawUniqueId, request: Request) -> RawComm {
    let (comm, handle) = handles::register(State::Pending);
    let worker = Arc::clone(&handle);
    // Where no thread starts, the handle is settled as failed, which its caller polls.
    let _ = spawn_detached(&[handle], move || create_on_worker(&id, &request, &worker));
    comm
}

/// Start `work`, creations that settle `handles`, on a thread of its own that nobody joins.
/// Where no thread starts, `handles` are settled as failed, so nobody waits for them.
///
/// # Errors
/// [`Error::Failed`] (a system error) where the thread cannot start.
pub fn spawn_detached(handles: &[Arc<Handle>], work: impl FnOnce() + Send + 'static) -> Result<()> {
    let started = std::thread::Builder::new().name("gp2p-nccl-init".into()).spawn(work);
    started.map(drop).map_err(|e| unstarted(handles, &e))
}

/// Settle `handles`, whose creation thread could not start (`e`), as failed; the error.
fn unstarted(handles: &[Arc<Handle>], e: &std::io::Error) -> Error {
    let message = format!("cannot start a creation thread: {e}");
    for handle in handles {
        handle.settle(State::Failed(Code::SystemError, message.clone()));
    }
    Error::Failed { code: Code::SystemError, message }
}

/// Create several ranks at once (each on a thread, as they wait for each other), for
/// `ncclCommInitAll`. Returns when all are made or failed.
pub fn create_all(jobs: &[(RawUniqueId, Request, Arc<Handle>)]) {
    std::thread::scope(|s| spawn_inits(s, jobs));
}

/// Start each of `jobs` on a thread of scope `s`, settling its handle with what it makes
/// ([`create_on_worker`]); where no thread starts, the handle is settled as failed.
pub fn spawn_inits<'scope>(
    s: &'scope std::thread::Scope<'scope, '_>,
    jobs: &'scope [(RawUniqueId, Request, Arc<Handle>)],
) {
    for (id, request, handle) in jobs {
        // Where no thread starts, the handle is settled as failed: nothing more to do.
        let _ = spawn_creation(s, std::slice::from_ref(handle), move || create_on_worker(id, request, handle));
    }
}

/// Start `work`, a creation that waits for other ranks, on a thread of scope `s`. Where no
/// thread starts, `handles` (what the creation would have settled) are settled as failed, so
/// nobody waits for them, and the error says why.
///
/// # Errors
/// [`Error::Failed`] (a system error) where the thread cannot start.
pub fn spawn_creation<'scope, T: Send + 'scope>(
    s: &'scope std::thread::Scope<'scope, '_>,
    handles: &[Arc<Handle>],
    work: impl FnOnce() -> T + Send + 'scope,
) -> Result<std::thread::ScopedJoinHandle<'scope, T>> {
    std::thread::Builder::new().name("gp2p-nccl-init".into()).spawn_scoped(s, work).map_err(|e| unstarted(handles, &e))
}
