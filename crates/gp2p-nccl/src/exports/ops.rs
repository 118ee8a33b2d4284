//! NCCL's calls that move data (collectives, point-to-point), the reduction ops made at run
//! time, buffer registration, groups, and the device API's host functions: served through
//! `crate::plan` and `crate::group`, or passed to the real NCCL untouched.

use std::ffi::{c_int, c_void};

use super::{boundary, export, failing_group, forwarded, live, non_null, ok, put, real};
use crate::abi::{DataType, RawComm, RawResult, RawSimInfo, RawStream, RawTeam, RawWindow, Residence, SIM_INFO_MAGIC};
use crate::error::{Error, Result};
use crate::group;
use crate::handles::Live;
use crate::plan::Call;
use crate::served::{ScalarArg, Served};

/// A raw `ncclDataType_t`, refused by name where it is none.
fn data_type(raw: c_int) -> Result<DataType> {
    DataType::from_raw(raw)
        .ok_or_else(|| Error::argument("datatype", format!("{raw} is not an ncclDataType_t (0 to 11)")))
}

/// A buffer's address (0 for null).
fn address<T>(buffer: *const T) -> u64 {
    buffer.expose_provenance() as u64
}

/// A rank argument (root, peer) as an index; a negative one can never be in range.
fn rank_arg(name: &'static str, raw: c_int) -> Result<usize> {
    usize::try_from(raw).map_err(|_| Error::argument(name, format!("{raw} is negative")))
}

/// Serve `call` built from the served communicator, or run `forward` on the real one. A call
/// refused inside a group fails the group too ([`group::fail`]), as NCCL's do.
fn dispatch(
    comm: RawComm,
    stream: RawStream,
    call: impl FnOnce(&Served) -> Result<Call>,
    forward: impl FnOnce(RawComm) -> Result<RawResult>,
) -> Result<RawResult> {
    failing_group(|| match live(comm)? {
        Live::Served(served) => crate::host_trace::served(|| {
            let call = call(&served)?;
            group::call(served, call, stream)?;
            ok()
        }),
        Live::Real(inner) => forward(inner),
    })
}

/// The real NCCL's entry point of that name.
macro_rules! real_fn {
    ($name:ident) => {
        real()?.get(stringify!($name), |f| f.$name)?
    };
}

export!(ncclAllReduce / pncclAllReduce(
    sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, op: c_int, comm: RawComm, stream: RawStream,
) -> RawResult => boundary(|| dispatch(comm, stream, |s| {
    let dtype = data_type(datatype)?;
    Ok(Call::AllReduce { send: address(sendbuff), recv: address(recvbuff), count, dtype, op: s.op(op, dtype)? })
}, |inner| {
    let f = real_fn!(ncclAllReduce);
    // SAFETY: the caller's arguments, the real NCCL's own communicator (nccl.h's contract).
    forwarded(unsafe { f(sendbuff, recvbuff, count, datatype, op, inner, stream) })
})));

export!(ncclReduce / pncclReduce(
    sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, op: c_int, root: c_int, comm: RawComm, stream: RawStream,
) -> RawResult => boundary(|| dispatch(comm, stream, |s| {
    let dtype = data_type(datatype)?;
    let (op, root) = (s.op(op, dtype)?, rank_arg("root", root)?);
    Ok(Call::Reduce { send: address(sendbuff), recv: address(recvbuff), count, dtype, op, root })
}, |inner| {
    let f = real_fn!(ncclReduce);
    // SAFETY: as for ncclAllReduce.
    forwarded(unsafe { f(sendbuff, recvbuff, count, datatype, op, root, inner, stream) })
})));

export!(ncclBroadcast / pncclBroadcast(
    sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, root: c_int, comm: RawComm, stream: RawStream,
) -> RawResult => boundary(|| dispatch(comm, stream, |_| {
    let (dtype, root) = (data_type(datatype)?, rank_arg("root", root)?);
    Ok(Call::Broadcast { send: address(sendbuff), recv: address(recvbuff), count, dtype, root })
}, |inner| {
    let f = real_fn!(ncclBroadcast);
    // SAFETY: as for ncclAllReduce.
    forwarded(unsafe { f(sendbuff, recvbuff, count, datatype, root, inner, stream) })
})));

export!(ncclBcast / pncclBcast(
    buff: *mut c_void, count: usize, datatype: c_int, root: c_int, comm: RawComm, stream: RawStream,
) -> RawResult => boundary(|| dispatch(comm, stream, |_| {
    let (dtype, root) = (data_type(datatype)?, rank_arg("root", root)?);
    Ok(Call::Broadcast { send: address(buff), recv: address(buff), count, dtype, root })
}, |inner| {
    // The in-place broadcast, as NCCL's own ncclBcast is.
    let f = real_fn!(ncclBroadcast);
    // SAFETY: as for ncclAllReduce.
    forwarded(unsafe { f(buff, buff, count, datatype, root, inner, stream) })
})));

export!(ncclAllGather / pncclAllGather(
    sendbuff: *const c_void, recvbuff: *mut c_void, sendcount: usize, datatype: c_int, comm: RawComm, stream: RawStream,
) -> RawResult => boundary(|| dispatch(comm, stream, |_| {
    Ok(Call::AllGather { send: address(sendbuff), recv: address(recvbuff), count: sendcount, dtype: data_type(datatype)? })
}, |inner| {
    let f = real_fn!(ncclAllGather);
    // SAFETY: as for ncclAllReduce.
    forwarded(unsafe { f(sendbuff, recvbuff, sendcount, datatype, inner, stream) })
})));

export!(ncclReduceScatter / pncclReduceScatter(
    sendbuff: *const c_void, recvbuff: *mut c_void, recvcount: usize, datatype: c_int, op: c_int, comm: RawComm, stream: RawStream,
) -> RawResult => boundary(|| dispatch(comm, stream, |s| {
    let dtype = data_type(datatype)?;
    Ok(Call::ReduceScatter { send: address(sendbuff), recv: address(recvbuff), count: recvcount, dtype, op: s.op(op, dtype)? })
}, |inner| {
    let f = real_fn!(ncclReduceScatter);
    // SAFETY: as for ncclAllReduce.
    forwarded(unsafe { f(sendbuff, recvbuff, recvcount, datatype, op, inner, stream) })
})));

export!(ncclAlltoAll / pncclAlltoAll(
    sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, comm: RawComm, stream: RawStream,
) -> RawResult => boundary(|| dispatch(comm, stream, |_| {
    Ok(Call::AlltoAll { send: address(sendbuff), recv: address(recvbuff), count, dtype: data_type(datatype)? })
}, |inner| {
    let f = real_fn!(ncclAlltoAll);
    // SAFETY: as for ncclAllReduce.
    forwarded(unsafe { f(sendbuff, recvbuff, count, datatype, inner, stream) })
})));

export!(ncclGather / pncclGather(
    sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, root: c_int, comm: RawComm, stream: RawStream,
) -> RawResult => boundary(|| dispatch(comm, stream, |_| {
    let (dtype, root) = (data_type(datatype)?, rank_arg("root", root)?);
    Ok(Call::Gather { send: address(sendbuff), recv: address(recvbuff), count, dtype, root })
}, |inner| {
    let f = real_fn!(ncclGather);
    // SAFETY: as for ncclAllReduce.
    forwarded(unsafe { f(sendbuff, recvbuff, count, datatype, root, inner, stream) })
})));

export!(ncclScatter / pncclScatter(
    sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, root: c_int, comm: RawComm, stream: RawStream,
) -> RawResult => boundary(|| dispatch(comm, stream, |_| {
    let (dtype, root) = (data_type(datatype)?, rank_arg("root", root)?);
    Ok(Call::Scatter { send: address(sendbuff), recv: address(recvbuff), count, dtype, root })
}, |inner| {
    let f = real_fn!(ncclScatter);
    // SAFETY: as for ncclAllReduce.
    forwarded(unsafe { f(sendbuff, recvbuff, count, datatype, root, inner, stream) })
})));

export!(ncclSend / pncclSend(
    sendbuff: *const c_void, count: usize, datatype: c_int, peer: c_int, comm: RawComm, stream: RawStream,
) -> RawResult => boundary(|| dispatch(comm, stream, |_| {
    let (dtype, peer) = (data_type(datatype)?, rank_arg("peer", peer)?);
    Ok(Call::Send { send: address(sendbuff), count, dtype, peer })
}, |inner| {
    let f = real_fn!(ncclSend);
    // SAFETY: as for ncclAllReduce.
    forwarded(unsafe { f(sendbuff, count, datatype, peer, inner, stream) })
})));

export!(ncclRecv / pncclRecv(
    recvbuff: *mut c_void, count: usize, datatype: c_int, peer: c_int, comm: RawComm, stream: RawStream,
) -> RawResult => boundary(|| dispatch(comm, stream, |_| {
    let (dtype, peer) = (data_type(datatype)?, rank_arg("peer", peer)?);
    Ok(Call::Recv { recv: address(recvbuff), count, dtype, peer })
}, |inner| {
    let f = real_fn!(ncclRecv);
    // SAFETY: as for ncclAllReduce.
    forwarded(unsafe { f(recvbuff, count, datatype, peer, inner, stream) })
})));

// ---- Reduction ops made at run time -------------------------------------------------------

export!(ncclRedOpCreatePreMulSum / pncclRedOpCreatePreMulSum(
    op: *mut c_int, scalar: *mut c_void, datatype: c_int, residence: c_int, comm: RawComm,
) -> RawResult => boundary(|| {
    let out = non_null("op", op)?;
    match live(comm)? {
        Live::Served(served) => {
            let dtype = data_type(datatype)?;
            let residence = Residence::from_raw(residence)
                .ok_or_else(|| Error::argument("residence", format!("{residence} is not an ncclScalarResidence_t")))?;
            let scalar = non_null("scalar", scalar)?;
            let scalar = match residence {
                Residence::Device => ScalarArg::Device(address(scalar)),
                Residence::HostImmediate => {
                    // SAFETY: non-null, and per nccl.h one element of `datatype` in host
                    // memory, read before this returns.
                    let bytes = unsafe { std::slice::from_raw_parts(scalar.cast::<u8>(), dtype.size_bytes()) };
                    ScalarArg::Host(bytes.to_vec())
                }
            };
            put(out, served.create_premul(scalar, dtype)?);
            ok()
        }
        Live::Real(inner) => {
            let f = real_fn!(ncclRedOpCreatePreMulSum);
            // SAFETY: as for ncclAllReduce.
            forwarded(unsafe { f(out, scalar, datatype, residence, inner) })
        }
    }
}));

export!(ncclRedOpDestroy / pncclRedOpDestroy(op: c_int, comm: RawComm) -> RawResult => boundary(|| match live(comm)? {
    Live::Served(served) => {
        served.destroy_op(op)?;
        ok()
    }
    Live::Real(inner) => {
        let f = real_fn!(ncclRedOpDestroy);
        // SAFETY: the real NCCL's own communicator and op.
        forwarded(unsafe { f(op, inner) })
    }
}));

// ---- Registration --------------------------------------------------------------------------

/// What a served communicator hands out for a registered buffer: it stages every byte through
/// host memory whatever the buffer, so registration has nothing to keep, and the handle only
/// has to be non-null and distinct per buffer.
fn registration_handle(buff: *mut c_void) -> *mut c_void {
    if buff.is_null() { std::ptr::dangling_mut::<c_void>() } else { buff }
}

export!(ncclCommRegister / pncclCommRegister(comm: RawComm, buff: *mut c_void, size: usize, handle: *mut *mut c_void) -> RawResult
    => boundary(|| {
    let out = non_null("handle", handle)?;
    match live(comm)? {
        Live::Served(_) => {
            put(out, registration_handle(buff));
            ok()
        }
        Live::Real(inner) => {
            let f = real_fn!(ncclCommRegister);
            // SAFETY: as for ncclAllReduce.
            forwarded(unsafe { f(inner, buff, size, out) })
        }
    }
}));

export!(ncclCommDeregister / pncclCommDeregister(comm: RawComm, handle: *mut c_void) -> RawResult => boundary(|| match live(comm)? {
    Live::Served(_) => ok(),
    Live::Real(inner) => {
        let f = real_fn!(ncclCommDeregister);
        // SAFETY: the real NCCL's own communicator and handle.
        forwarded(unsafe { f(inner, handle) })
    }
}));

/// What a served communicator says to a call it does not serve.
fn not_served(what: &str) -> Result<RawResult> {
    Err(Error::NotServed { what: what.to_owned() })
}

export!(ncclCommWindowRegister / pncclCommWindowRegister(
    comm: RawComm, buff: *mut c_void, size: usize, win: *mut RawWindow, win_flags: c_int,
) -> RawResult => boundary(|| match live(comm)? {
    Live::Served(_) => not_served("ncclCommWindowRegister (symmetric memory needs P2P between the devices)"),
    Live::Real(inner) => {
        let f = real_fn!(ncclCommWindowRegister);
        // SAFETY: as for ncclAllReduce.
        forwarded(unsafe { f(inner, buff, size, win, win_flags) })
    }
}));

export!(ncclCommWindowDeregister / pncclCommWindowDeregister(comm: RawComm, win: RawWindow) -> RawResult => boundary(|| match live(comm)? {
    Live::Served(_) => not_served("ncclCommWindowDeregister (no window was registered)"),
    Live::Real(inner) => {
        let f = real_fn!(ncclCommWindowDeregister);
        // SAFETY: the real NCCL's own communicator and window.
        forwarded(unsafe { f(inner, win) })
    }
}));

// ---- Groups --------------------------------------------------------------------------------

export!(ncclGroupStart / pncclGroupStart() -> RawResult => boundary(|| {
    group::start()?;
    ok()
}));

export!(ncclGroupEnd / pncclGroupEnd() -> RawResult => boundary(|| Ok(group::end()?.raw())));

export!(ncclGroupSimulateEnd / pncclGroupSimulateEnd(sim_info: *mut RawSimInfo) -> RawResult => boundary(|| {
    let info = non_null("simInfo", sim_info)?;
    // SAFETY: non-null, and per nccl.h an ncclSimInfo_t made with NCCL_SIM_INFO_INITIALIZER.
    let magic = unsafe { (*info).magic };
    if magic != SIM_INFO_MAGIC {
        return Err(Error::argument("simInfo", format!("magic {magic:#x}: initialise it with NCCL_SIM_INFO_INITIALIZER")));
    }
    if group::simulate_end()? {
        let f = real_fn!(ncclGroupSimulateEnd);
        // SAFETY: the caller's sim info, checked above.
        return forwarded(unsafe { f(info) });
    }
    // Nothing estimates the door's calls yet: NCCL_UNDEF_FLOAT, as NCCL leaves what it cannot.
    // SAFETY: non-null and an ncclSimInfo_t (checked above).
    unsafe { (*info).estimated_time = -1.0 };
    ok()
}));

// ---- The device API's host functions ---------------------------------------------------------

/// What a served communicator says to the device API: its kernels need P2P or a network.
const DEVICE_API: &str = "the device API (ncclDevComm: kernels that load and store peers' memory)";

export!(ncclDevCommCreate / pncclDevCommCreate(comm: RawComm, reqs: *const c_void, out_dev_comm: *mut c_void) -> RawResult
    => boundary(|| match live(comm)? {
    Live::Served(_) => not_served(DEVICE_API),
    Live::Real(inner) => {
        let f = real_fn!(ncclDevCommCreate);
        // SAFETY: as for ncclAllReduce.
        forwarded(unsafe { f(inner, reqs, out_dev_comm) })
    }
}));

export!(ncclDevCommDestroy / pncclDevCommDestroy(comm: RawComm, dev_comm: *const c_void) -> RawResult => boundary(|| match live(comm)? {
    Live::Served(_) => not_served(DEVICE_API),
    Live::Real(inner) => {
        let f = real_fn!(ncclDevCommDestroy);
        // SAFETY: as for ncclAllReduce.
        forwarded(unsafe { f(inner, dev_comm) })
    }
}));

export!(ncclGinBarrierCreateRequirement / pncclGinBarrierCreateRequirement(
    comm: RawComm, team: RawTeam, n_barriers: c_int, out_handle: *mut c_void, out_req: *mut c_void,
) -> RawResult => boundary(|| match live(comm)? {
    Live::Served(_) => not_served(DEVICE_API),
    Live::Real(inner) => {
        let f = real_fn!(ncclGinBarrierCreateRequirement);
        // SAFETY: as for ncclAllReduce.
        forwarded(unsafe { f(inner, team, n_barriers, out_handle, out_req) })
    }
}));

export!(ncclLLA2ACreateRequirement / pncclLLA2ACreateRequirement(
    n_blocks: c_int, n_slots: c_int, out_handle: *mut c_void, out_req: *mut c_void,
) -> RawResult => boundary(|| {
    let f = real_fn!(ncclLLA2ACreateRequirement);
    // SAFETY: the caller's arguments, unchanged.
    forwarded(unsafe { f(n_blocks, n_slots, out_handle, out_req) })
}));

export!(ncclLsaBarrierCreateRequirement / pncclLsaBarrierCreateRequirement(
    team: RawTeam, n_barriers: c_int, out_handle: *mut c_void, out_req: *mut c_void,
) -> RawResult => boundary(|| {
    let f = real_fn!(ncclLsaBarrierCreateRequirement);
    // SAFETY: the caller's arguments, unchanged.
    forwarded(unsafe { f(team, n_barriers, out_handle, out_req) })
}));

export!(ncclLLA2ACalcSlots / pncclLLA2ACalcSlots(max_elts: c_int, max_elt_size: c_int) -> c_int => {
    match crate::real::real().ok().and_then(|r| r.functions.ncclLLA2ACalcSlots) {
        // SAFETY: two integers.
        Some(f) => unsafe { f(max_elts, max_elt_size) },
        None => -1,
    }
});

/// A team of a served communicator: the world, or this rank alone (no rank of it reaches
/// another's memory by load and store, and it spans one host: one rail).
fn team(
    comm: RawComm,
    whole: bool,
    real_pick: fn(&crate::real::Functions) -> Option<unsafe extern "C" fn(RawComm) -> RawTeam>,
) -> RawTeam {
    let none = RawTeam { n_ranks: 0, rank: 0, stride: 0 };
    let work = || -> Option<RawTeam> {
        match live(comm).ok()? {
            Live::Served(s) if whole => Some(RawTeam { n_ranks: s.world as c_int, rank: s.rank as c_int, stride: 1 }),
            Live::Served(_) => Some(RawTeam { n_ranks: 1, rank: 0, stride: 1 }),
            Live::Real(inner) => {
                let f = real_pick(&crate::real::loaded()?.functions)?;
                // SAFETY: the real NCCL's own communicator.
                Some(unsafe { f(inner) })
            }
        }
    };
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).ok().flatten().unwrap_or(none)
}

export!(ncclTeamWorld / pncclTeamWorld(comm: RawComm) -> RawTeam => team(comm, true, |f| f.ncclTeamWorld));
export!(ncclTeamLsa / pncclTeamLsa(comm: RawComm) -> RawTeam => team(comm, false, |f| f.ncclTeamLsa));
export!(ncclTeamRail / pncclTeamRail(comm: RawComm) -> RawTeam => team(comm, true, |f| f.ncclTeamRail));

/// A team rank as a world (`to_world`) or load-store-team rank, for a served communicator:
/// a world team's ranks are world ranks, a one-rank team's only rank is this rank.
fn team_rank(comm: RawComm, team: RawTeam, rank: c_int, to_world: bool) -> c_int {
    let work = || -> Option<c_int> {
        match live(comm).ok()? {
            Live::Served(s) => {
                let own = s.rank as c_int;
                Some(match (to_world, team.n_ranks == 1) {
                    (true, true) => own,
                    (true, false) => rank,
                    (false, _) => {
                        if (team.n_ranks == 1 && rank == 0) || rank == own {
                            0
                        } else {
                            -1
                        }
                    }
                })
            }
            Live::Real(inner) => {
                let functions = &crate::real::loaded()?.functions;
                let f = if to_world { functions.ncclTeamRankToWorld? } else { functions.ncclTeamRankToLsa? };
                // SAFETY: the real NCCL's own communicator, the caller's team and rank.
                Some(unsafe { f(inner, team, rank) })
            }
        }
    };
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).ok().flatten().unwrap_or(-1)
}

export!(ncclTeamRankToWorld / pncclTeamRankToWorld(comm: RawComm, team: RawTeam, rank: c_int) -> c_int => team_rank(comm, team, rank, true));
export!(ncclTeamRankToLsa / pncclTeamRankToLsa(comm: RawComm, team: RawTeam, rank: c_int) -> c_int => team_rank(comm, team, rank, false));

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_types_and_negative_ranks_are_refused_by_name() {
        assert_eq!(data_type(7).ok(), Some(DataType::Float32));
        let e = data_type(12).expect_err("ncclNumTypes is no type").to_string();
        assert_eq!(e, "datatype: 12 is not an ncclDataType_t (0 to 11)");
        assert!(data_type(-1).is_err());
        assert_eq!(rank_arg("root", 3).ok(), Some(3));
        assert_eq!(rank_arg("peer", -2).expect_err("negative").to_string(), "peer: -2 is negative");
    }
}
