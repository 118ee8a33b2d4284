//! NCCL's calls that end a communicator: destroy (which waits for the communicator's
//! releases, as NCCL's does), abort, finalize and revoke, served or passed to the real NCCL.

use std::ffi::c_int;
use std::sync::Arc;

use super::{boundary, export, forwarded, live, live_or_null, ok, real};
use crate::abi::{RawComm, RawResult};
use crate::error::{Error, Result};
use crate::handles::{self, Live, State, Target};
use crate::real::Real;
use crate::served::Served;

/// Destroy or abort: a served communicator is dropped, a real one passed to `real_end`.
/// Destroy returns once the communicator's streams and memory are released (after its GPU
/// work), as NCCL's does: a program may reset the device next, and nccl-tests does
/// (`cudaDeviceReset`), which faulted the release thread's `cuStreamDestroy` and
/// `cuMemFreeAsync` still under way in 5 of 11 runs among 4 processes on one H100. Abort
/// does not wait: it ends the communicator's waits, and its memory goes once its work has.
fn end(
    comm: RawComm,
    abort: bool,
    real_end: fn(&Real) -> Result<unsafe extern "C" fn(RawComm) -> RawResult>,
) -> Result<RawResult> {
    let call = |inner: RawComm| -> Result<RawResult> {
        let f = real_end(real()?)?;
        // SAFETY: the real NCCL's own communicator.
        forwarded(unsafe { f(inner) })
    };
    if comm.is_null() {
        // NCCL ends a null communicator without complaint.
        return ok();
    }
    match handles::resolve(comm)? {
        Target::Real(inner) => call(inner),
        Target::Door(handle) => {
            if crate::group::drop_init(&handle) {
                return ok();
            }
            if !abort {
                handle.wait_settled();
            }
            // Taken as the handle is given up, under its lock: a creation that ends meanwhile
            // either settled first (its communicator is here) or aborts what it makes itself.
            let state = handle.abandon().unwrap_or(State::Pending);
            match state {
                State::Served(served) => {
                    if abort {
                        served.abort();
                    } else {
                        destroy_and_wait(served);
                    }
                    ok()
                }
                State::Real(inner) => call(std::ptr::with_exposed_provenance_mut(inner)),
                State::Pending | State::Failed(..) => ok(),
                State::Destroyed => {
                    Err(Error::argument("comm", "destroyed already (ncclCommDestroy or ncclCommAbort)"))
                }
            }
        }
    }
}

/// Drop `served` once this is its last holder, and wait for the releases that drop hands
/// over: its own only (a mark before, [`wait_for_releases_since`] after), since another
/// communicator's pending work may wait on a peer, which NCCL's destroy would not wait for.
/// Another thread's call holds it for microseconds; a holder that keeps it for a second (a
/// group not yet ended) keeps it, and its resources go when that one lets go.
///
/// [`wait_for_releases_since`]: geforce_p2p::cuda::lifetime::wait_for_releases_since
fn destroy_and_wait(mut served: Arc<Served>) {
    use geforce_p2p::cuda::lifetime::{releases_queued, wait_for_releases_since};
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
    loop {
        match Arc::try_unwrap(served) {
            Ok(last) => {
                let mark = releases_queued();
                drop(last);
                wait_for_releases_since(mark);
                return;
            }
            Err(shared) if std::time::Instant::now() < deadline => {
                served = shared;
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            Err(_) => return,
        }
    }
}

export!(ncclCommDestroy / pncclCommDestroy(comm: RawComm) -> RawResult
    => boundary(|| end(comm, false, |r| r.get("ncclCommDestroy", |f| f.ncclCommDestroy))));

export!(ncclCommAbort / pncclCommAbort(comm: RawComm) -> RawResult
    => boundary(|| end(comm, true, |r| r.get("ncclCommAbort", |f| f.ncclCommAbort))));

export!(ncclCommFinalize / pncclCommFinalize(comm: RawComm) -> RawResult => boundary(|| match live_or_null(comm)? {
    None => ok(),
    Some(live) => match live {
    // Every call is enqueued when it returns: nothing is left to flush.
    Live::Served(_) => ok(),
    Live::Real(inner) => {
        let f = real()?.get("ncclCommFinalize", |f| f.ncclCommFinalize)?;
        // SAFETY: the real NCCL's own communicator.
        forwarded(unsafe { f(inner) })
    }
}}));

export!(ncclCommRevoke / pncclCommRevoke(comm: RawComm, revoke_flags: c_int) -> RawResult => boundary(|| match live(comm)? {
    Live::Served(served) => {
        if revoke_flags != 0 {
            return Err(Error::argument("revokeFlags", format!("{revoke_flags}: must be NCCL_REVOKE_DEFAULT (0)")));
        }
        served.abort();
        ok()
    }
    Live::Real(inner) => {
        let f = real()?.get("ncclCommRevoke", |f| f.ncclCommRevoke)?;
        // SAFETY: the real NCCL's own communicator and the caller's flags.
        forwarded(unsafe { f(inner, revoke_flags) })
    }
}));
