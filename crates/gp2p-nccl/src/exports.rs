//! NCCL's C interface: every function of NCCL 2.28's `nccl.h` (and the device API's host
//! functions `libtorch_cuda.so` links), each under its name and its `pncclX` alias, as the
//! real library exports them. This file and `exports/ops.rs` are the door's boundary with C:
//! each entry point runs inside [`boundary`] (a panic becomes `ncclInternalError`, an error a
//! code and the message `ncclGetLastError` returns), checks every pointer for null before it
//! reads or writes through it, and either serves the call or passes it, arguments untouched,
//! to the real NCCL.
//!
//! # Safety
//! Callers keep `nccl.h`'s contract: every non-null pointer argument points at what the
//! header says (an `int`, a communicator slot, a config made with `NCCL_CONFIG_INITIALIZER`,
//! `ndev` devices, `excludeRanksCount` ranks, a C string), valid for the call; buffers and
//! streams as `crate::memory` states.
#![allow(unsafe_code)]

use std::ffi::{CStr, c_char, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use geforce_p2p::Device;

use crate::abi::{Code, RawComm, RawConfig, RawResult, RawUniqueId, SPLIT_NOCOLOR};
use crate::config::Config;
use crate::error::{self, Error, Result};
use crate::handles::{self, Live, State, Target};
use crate::init::{self, ConfigArg, Made, Request};
use crate::real::{self, Real};
use crate::served::Served;

mod ending;
mod ops;

/// Export `$name` and its alias `$alias`, both running `$body` over the arguments (counted
/// and timed while `GP2P_NCCL_TRACE` traces served calls: `crate::host_trace::entry`).
macro_rules! export {
    ($name:ident / $alias:ident ($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty => $body:expr) => {
        #[unsafe(no_mangle)]
        unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            crate::host_trace::entry(stringify!($name), || $body)
        }

        #[unsafe(no_mangle)]
        unsafe extern "C" fn $alias($($arg: $ty),*) -> $ret {
            // SAFETY: the same contract as the function it stands for.
            unsafe { $name($($arg),*) }
        }
    };
}
pub(crate) use export;

/// The door's mark (`crate::real::DOOR_MARK`): its version, for tools that ask which door
/// is loaded, and how a loader tells a copy of the door from the real NCCL.
#[unsafe(no_mangle)]
#[allow(non_upper_case_globals)] // the exported name is what other loaders look up
static gp2p_nccl_door: [u8; 16] = door_version();

/// The crate's version as a NUL-padded C string.
const fn door_version() -> [u8; 16] {
    let v = env!("CARGO_PKG_VERSION").as_bytes();
    let mut out = [0u8; 16];
    let mut i = 0;
    while i < v.len() && i < 15 {
        out[i] = v[i];
        i += 1;
    }
    out
}

/// Run an entry point's work: its code as is, or an error's code with the message kept for
/// `ncclGetLastError`; a panic becomes `ncclInternalError`, never an unwind into C.
pub(crate) fn boundary(work: impl FnOnce() -> Result<RawResult>) -> RawResult {
    // The library binds the contexts it works in; the caller's current device is put back,
    // as NCCL leaves it.
    let _caller_context = geforce_p2p::cuda::CurrentContext::save();
    match catch_unwind(AssertUnwindSafe(work)) {
        Ok(Ok(code)) => code,
        Ok(Err(e)) => {
            error::remember(&e.to_string());
            e.code().raw()
        }
        Err(panic) => {
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| String::from("a panic without a message"));
            let e = Error::Panic { message };
            error::remember(&e.to_string());
            e.code().raw()
        }
    }
}

/// `work`'s result; its error, inside an open group, fails the group too ([`crate::group::fail`]),
/// as NCCL's calls that move data or make communicators do.
pub(crate) fn failing_group(work: impl FnOnce() -> Result<RawResult>) -> Result<RawResult> {
    let result = work();
    if let Err(e) = &result {
        crate::group::fail(e);
    }
    result
}

/// Success.
pub(crate) fn ok() -> Result<RawResult> {
    Ok(Code::Success.raw())
}

/// A real NCCL call's code, as the caller gets it; a failure leaves the real NCCL's message
/// as the last error.
pub(crate) fn forwarded(code: RawResult) -> Result<RawResult> {
    crate::host_trace::handed_over();
    if code != Code::Success.raw() && code != Code::InProgress.raw() {
        error::clear();
    }
    Ok(code)
}

/// The real NCCL, for a call handed over.
pub(crate) fn real() -> Result<&'static Real> {
    real::real()
}

/// `pointer`, refused by `name` where null.
pub(crate) fn non_null<T>(name: &'static str, pointer: *mut T) -> Result<*mut T> {
    if pointer.is_null() { Err(Error::argument(name, "null")) } else { Ok(pointer) }
}

/// The served communicator `comm` names, or its real one: where `serve` is not given, every
/// door handle must be real.
fn live(comm: RawComm) -> Result<Live> {
    handles::target(comm)
}

/// What `comm` names, ready for a call, or `None` for null (what NCCL's finalize takes).
fn live_or_null(comm: RawComm) -> Result<Option<Live>> {
    if comm.is_null() { Ok(None) } else { live(comm).map(Some) }
}

/// Store `value` through the non-null `out`.
fn put<T>(out: *mut T, value: T) {
    // SAFETY: `out` was checked non-null by the caller and points at a `T` (nccl.h).
    unsafe { out.write(value) }
}

// ---- Version, ids, errors --------------------------------------------------------------

export!(ncclGetVersion / pncclGetVersion(version: *mut c_int) -> RawResult => boundary(|| {
    let out = non_null("version", version)?;
    put(out, real::real().map_or(crate::abi::HEADER_VERSION_CODE, |r| r.version));
    ok()
}));

export!(ncclGetUniqueId / pncclGetUniqueId(unique_id: *mut RawUniqueId) -> RawResult => boundary(|| {
    let out = non_null("uniqueId", unique_id)?;
    put(out, init::unique_id()?);
    ok()
}));

export!(ncclGetErrorString / pncclGetErrorString(result: RawResult) -> *const c_char => error::describe(result).as_ptr());

export!(ncclGetLastError / pncclGetLastError(comm: RawComm) -> *const c_char => {
    let forward = || -> Option<*const c_char> {
        let real = real::loaded()?;
        // torch asks with null: the real NCCL's last error of any of its communicators.
        let inner = match handles::resolve(comm) {
            Ok(Target::Real(c)) => c,
            Ok(Target::Door(h)) => match h.state() {
                State::Real(c) => std::ptr::with_exposed_provenance_mut(c),
                _ => std::ptr::null_mut(),
            },
            Err(_) => std::ptr::null_mut(),
        };
        let get = real.functions.ncclGetLastError?;
        // SAFETY: the real ncclGetLastError takes any communicator or null and returns its
        // own static message.
        Some(unsafe { get(inner) })
    };
    let ours = error::has_last();
    catch_unwind(AssertUnwindSafe(|| if ours { None } else { forward() })).ok().flatten().unwrap_or_else(error::last)
});

export!(ncclResetDebugInit / pncclResetDebugInit() -> () => {
    if let Some(reset) = real::loaded().and_then(|r| r.functions.ncclResetDebugInit) {
        // SAFETY: no arguments.
        unsafe { reset() }
    }
});

// ---- Creation ----------------------------------------------------------------------------

/// Read a caller's config into one the door owns (`None` for null).
fn read_config(config: *mut RawConfig) -> Result<Option<Arc<Config>>> {
    if config.is_null() {
        return Ok(None);
    }
    // SAFETY: non-null, and per nccl.h a config made with NCCL_CONFIG_INITIALIZER, whose first
    // field is its size in bytes (a size_t).
    let size = unsafe { config.cast::<usize>().read_unaligned() };
    if size < std::mem::offset_of!(RawConfig, blocking) {
        return Err(Error::argument("config", format!("size {size}: initialise it with NCCL_CONFIG_INITIALIZER")));
    }
    // SAFETY: as above: `size` bytes are the caller's config, of which no more than the
    // door's own layout are read.
    let raw = unsafe {
        let mut raw = RawConfig::undefined();
        let n = size.min(size_of::<RawConfig>());
        std::ptr::copy_nonoverlapping(config.cast::<u8>(), (&raw mut raw).cast::<u8>(), n);
        raw.size = size;
        if n < std::mem::offset_of!(RawConfig, net_name) + size_of::<*const c_char>() {
            raw.net_name = std::ptr::null();
        }
        if n < std::mem::offset_of!(RawConfig, comm_name) + size_of::<*const c_char>() {
            raw.comm_name = std::ptr::null();
        }
        raw
    };
    let string = |p: *const c_char| {
        // SAFETY: a config's strings are null or NUL-terminated C strings, valid for the call.
        (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_owned())
    };
    Ok(Some(Arc::new(Config::new(&raw, string(raw.net_name), string(raw.comm_name))?)))
}

/// Every init with one id: check, then create now, later on a thread (non-blocking), or at
/// the group's end.
fn init_rank(
    out: *mut RawComm,
    nranks: c_int,
    id: RawUniqueId,
    rank: c_int,
    config: *mut RawConfig,
) -> Result<RawResult> {
    let out = non_null("comm", out)?;
    let (nranks, rank) = init::check_rank(nranks, rank)?;
    let ordinal = Device::current_ordinal().ok().flatten();
    let owned = read_config(config)?;
    let blocking = owned.as_ref().is_none_or(|c| c.blocking());
    let deferred = crate::group::open() || !blocking;
    // A creation on this thread, during this call, passes the caller's config untouched; one
    // that outlives the call takes the door's copy.
    let config = match owned {
        None => ConfigArg::None,
        Some(_) if !deferred => ConfigArg::Caller(config.expose_provenance()),
        Some(owned) => ConfigArg::Owned(owned),
    };
    let request = Request { nranks, rank, ordinal, config, on_worker: false };
    if crate::group::open() {
        let (comm, handle) = handles::register(State::Pending);
        crate::group::hold_init(id, request, handle);
        put(out, comm);
        return ok();
    }
    if !blocking {
        let comm = init::create_later(id, request);
        put(out, comm);
        return Ok(Code::InProgress.raw());
    }
    match init::create(&id, &request)? {
        Made::Served(served) => put(out, handles::register(State::Served(served)).0),
        Made::Real(comm) => put(out, comm),
    }
    ok()
}

export!(ncclCommInitRank / pncclCommInitRank(comm: *mut RawComm, nranks: c_int, comm_id: RawUniqueId, rank: c_int) -> RawResult
    => boundary(|| failing_group(|| init_rank(comm, nranks, comm_id, rank, std::ptr::null_mut()))));

export!(ncclCommInitRankConfig / pncclCommInitRankConfig(
    comm: *mut RawComm, nranks: c_int, comm_id: RawUniqueId, rank: c_int, config: *mut RawConfig,
) -> RawResult => boundary(|| failing_group(|| init_rank(comm, nranks, comm_id, rank, config))));

export!(ncclCommInitRankScalable / pncclCommInitRankScalable(
    comm: *mut RawComm, nranks: c_int, rank: c_int, n_id: c_int, comm_ids: *mut RawUniqueId, config: *mut RawConfig,
) -> RawResult => boundary(|| failing_group(|| {
    let ids = non_null("commIds", comm_ids)?;
    if n_id < 1 {
        return Err(Error::argument("nId", format!("{n_id}: pass at least 1")));
    }
    // SAFETY: non-null, and per nccl.h `nId` ids.
    let first = unsafe { ids.read() };
    if crate::id::DoorId::from_raw(&first)?.is_none() {
        // Ids of the real NCCL (made with the door off): its own scalable init, untouched.
        let init = real()?.get("ncclCommInitRankScalable", |f| f.ncclCommInitRankScalable)?;
        // SAFETY: the caller's arguments, passed on unchanged (nccl.h's contract).
        return forwarded(unsafe { init(comm, nranks, rank, n_id, comm_ids, config) });
    }
    // The door's rendezvous needs one listener: the first id's. Every rank passes the same
    // ids, in the same order (nccl.h), so all meet there; the others' listeners, in whichever
    // process made them, stop.
    for i in 1..usize::try_from(n_id).unwrap_or(1) {
        // SAFETY: per nccl.h `nId` ids.
        if let Ok(Some(unused)) = crate::id::DoorId::from_raw(&unsafe { ids.add(i).read() }) {
            crate::rendezvous::stop_unused(unused.rendezvous, &unused.secret);
        }
    }
    init_rank(comm, nranks, first, rank, config)
})));

export!(ncclCommInitAll / pncclCommInitAll(comm: *mut RawComm, ndev: c_int, devlist: *const c_int) -> RawResult => boundary(|| {
    let out = non_null("comm", comm)?;
    let n = usize::try_from(ndev).ok().filter(|&n| n > 0).ok_or_else(|| Error::argument("ndev", format!("{ndev}: pass at least 1")))?;
    let ordinals: Vec<usize> = if devlist.is_null() {
        (0..n).collect()
    } else {
        // SAFETY: non-null, and per nccl.h `ndev` device numbers.
        let list = unsafe { std::slice::from_raw_parts(devlist, n) };
        list.iter()
            .map(|&d| usize::try_from(d).map_err(|_| Error::argument("devlist", format!("device {d}"))))
            .collect::<Result<_>>()?
    };
    let id = init::unique_id()?;
    let jobs: Vec<_> = ordinals
        .iter()
        .enumerate()
        .map(|(rank, &ordinal)| {
            let (comm, handle) = handles::register(State::Pending);
            let request = Request { nranks: n, rank, ordinal: Some(ordinal), config: ConfigArg::None, on_worker: true };
            (comm, (id, request, handle))
        })
        .collect();
    let comms: Vec<RawComm> = jobs.iter().map(|(c, _)| *c).collect();
    let jobs: Vec<_> = jobs.into_iter().map(|(_, job)| job).collect();
    init::create_all(&jobs);
    let failed = jobs.iter().find_map(|(_, _, h)| match h.state() {
        State::Failed(code, message) => Some(Error::Failed { code, message: format!("a rank's creation failed: {message}") }),
        _ => None,
    });
    if let Some(e) = failed {
        // None of the clique is handed out: what was made goes.
        jobs.iter().for_each(|(_, _, h)| h.abandon_made());
        return Err(e);
    }
    for (i, c) in comms.into_iter().enumerate() {
        // SAFETY: per nccl.h, `comm` has room for `ndev` communicators.
        put(unsafe { out.add(i) }, c);
    }
    ok()
}));

// ---- Communicators from communicators ------------------------------------------------------

/// Hand out a communicator made from a served one (null for none).
fn hand_out(out: *mut RawComm, made: Option<Served>) -> Result<RawResult> {
    let comm = made.map_or(std::ptr::null_mut(), |s| handles::register(State::Served(Arc::new(s))).0);
    put(out, comm);
    ok()
}

/// Make a communicator from a served one with `derive`: now, or inside a group at its end (as
/// NCCL does: one thread may split every rank of a clique in one group), handing out a pending
/// communicator at once, or null where this rank gets none (`gets_one` false).
fn derive_now_or_held(
    out: *mut RawComm,
    parent: &Served,
    gets_one: bool,
    derive: impl FnOnce() -> Result<Option<Served>> + Send + 'static,
) -> Result<RawResult> {
    if !crate::group::open() {
        return hand_out(out, derive()?);
    }
    let pending = gets_one.then(|| handles::register(State::Pending));
    put(out, pending.as_ref().map_or(std::ptr::null_mut(), |(comm, _)| *comm));
    let parent = std::ptr::from_ref(parent).expose_provenance();
    crate::group::hold_derived(parent, Box::new(derive), pending.map(|(_, handle)| handle));
    ok()
}

export!(ncclCommSplit / pncclCommSplit(comm: RawComm, color: c_int, key: c_int, newcomm: *mut RawComm, config: *mut RawConfig) -> RawResult
    => boundary(|| failing_group(|| {
    let out = non_null("newcomm", newcomm)?;
    match live(comm)? {
        Live::Served(served) => {
            if color < SPLIT_NOCOLOR {
                return Err(Error::argument("color", format!("{color}: pass a colour of 0 or more, or NCCL_SPLIT_NOCOLOR")));
            }
            read_config(config)?;
            let parent = Arc::clone(&served);
            derive_now_or_held(out, &parent, color != SPLIT_NOCOLOR, move || served.split(color, key))
        }
        Live::Real(inner) => {
            let f = real()?.get("ncclCommSplit", |f| f.ncclCommSplit)?;
            // SAFETY: the real NCCL's own communicator; the caller's other arguments unchanged.
            forwarded(unsafe { f(inner, color, key, out, config) })
        }
    }
})));

export!(ncclCommShrink / pncclCommShrink(
    comm: RawComm, exclude_ranks_list: *mut c_int, exclude_ranks_count: c_int, newcomm: *mut RawComm, config: *mut RawConfig, shrink_flags: c_int,
) -> RawResult => boundary(|| failing_group(|| {
    let out = non_null("newcomm", newcomm)?;
    match live(comm)? {
        Live::Served(served) => {
            let count = usize::try_from(exclude_ranks_count)
                .map_err(|_| Error::argument("excludeRanksCount", format!("{exclude_ranks_count}")))?;
            let excluded: Vec<usize> = if count == 0 {
                Vec::new()
            } else {
                let list = non_null("excludeRanksList", exclude_ranks_list)?;
                // SAFETY: non-null, and per nccl.h `excludeRanksCount` ranks.
                let list = unsafe { std::slice::from_raw_parts(list, count) };
                list.iter().map(|&r| usize::try_from(r).map_err(|_| Error::argument("excludeRanksList", format!("rank {r}")))).collect::<Result<_>>()?
            };
            read_config(config)?;
            served.check_shrink(&excluded)?;
            let abort = shrink_flags & 1 != 0;
            let parent = Arc::clone(&served);
            derive_now_or_held(out, &parent, true, move || served.shrink(&excluded, abort).map(Some))
        }
        Live::Real(inner) => {
            let f = real()?.get("ncclCommShrink", |f| f.ncclCommShrink)?;
            // SAFETY: the real NCCL's own communicator; the caller's other arguments unchanged.
            forwarded(unsafe { f(inner, exclude_ranks_list, exclude_ranks_count, out, config, shrink_flags) })
        }
    }
})));

// ---- Questions -----------------------------------------------------------------------------

export!(ncclCommGetAsyncError / pncclCommGetAsyncError(comm: RawComm, async_error: *mut RawResult) -> RawResult => boundary(|| {
    let out = non_null("asyncError", async_error)?;
    let Target::Door(handle) = handles::resolve(comm)? else {
        let Target::Real(inner) = handles::resolve(comm)? else { return ok() };
        let f = real()?.get("ncclCommGetAsyncError", |f| f.ncclCommGetAsyncError)?;
        // SAFETY: the real NCCL's own communicator and the caller's out-pointer.
        return forwarded(unsafe { f(inner, out) });
    };
    let code = match handle.state() {
        State::Pending => Code::InProgress,
        State::Failed(code, message) => {
            error::keep(&message);
            code
        }
        State::Destroyed => return Err(Error::argument("comm", "destroyed already (ncclCommDestroy or ncclCommAbort)")),
        State::Served(served) => match served.async_error() {
            Some((e, first)) => {
                if first { error::remember(&e.to_string()) } else { error::keep(&e.to_string()) }
                e.code()
            }
            None => Code::Success,
        },
        State::Real(inner) => {
            let f = real()?.get("ncclCommGetAsyncError", |f| f.ncclCommGetAsyncError)?;
            // SAFETY: the real NCCL's own communicator and the caller's out-pointer.
            return forwarded(unsafe { f(std::ptr::with_exposed_provenance_mut(inner), out) });
        }
    };
    put(out, code.raw());
    ok()
}));

/// A question every communicator answers: the served one's `answer`, or the real `ask`.
fn question(
    comm: RawComm,
    out: *mut c_int,
    name: &'static str,
    answer: fn(&Served) -> usize,
    ask: fn(&Real) -> Result<unsafe extern "C" fn(RawComm, *mut c_int) -> RawResult>,
) -> Result<RawResult> {
    let out = non_null(name, out)?;
    match live(comm)? {
        Live::Served(served) => {
            put(out, c_int::try_from(answer(&served)).unwrap_or(c_int::MAX));
            ok()
        }
        Live::Real(inner) => {
            let f = ask(real()?)?;
            // SAFETY: the real NCCL's own communicator and the caller's out-pointer.
            forwarded(unsafe { f(inner, out) })
        }
    }
}

export!(ncclCommCount / pncclCommCount(comm: RawComm, count: *mut c_int) -> RawResult
    => boundary(|| question(comm, count, "count", |s| s.world, |r| r.get("ncclCommCount", |f| f.ncclCommCount))));

export!(ncclCommCuDevice / pncclCommCuDevice(comm: RawComm, device: *mut c_int) -> RawResult
    => boundary(|| question(comm, device, "device", |s| s.device.ordinal(), |r| r.get("ncclCommCuDevice", |f| f.ncclCommCuDevice))));

export!(ncclCommUserRank / pncclCommUserRank(comm: RawComm, rank: *mut c_int) -> RawResult
    => boundary(|| question(comm, rank, "rank", |s| s.rank, |r| r.get("ncclCommUserRank", |f| f.ncclCommUserRank))));

// ---- Memory --------------------------------------------------------------------------------

export!(ncclMemAlloc / pncclMemAlloc(ptr: *mut *mut c_void, size: usize) -> RawResult => boundary(|| {
    let out = non_null("ptr", ptr)?;
    if let Ok(real) = real::real() {
        let f = real.get("ncclMemAlloc", |f| f.ncclMemAlloc)?;
        // SAFETY: the caller's out-pointer and size, unchanged.
        return forwarded(unsafe { f(out, size) });
    }
    put(out, crate::memory_pool::alloc(size)?);
    ok()
}));

export!(ncclMemFree / pncclMemFree(ptr: *mut c_void) -> RawResult => boundary(|| {
    if ptr.is_null() {
        return ok();
    }
    if crate::memory_pool::free(ptr) {
        return ok();
    }
    let f = real()?.get("ncclMemFree", |f| f.ncclMemFree)?;
    // SAFETY: memory the real ncclMemAlloc gave (the door's own was found above).
    forwarded(unsafe { f(ptr) })
}));
