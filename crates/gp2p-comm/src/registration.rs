//! Creation's one host-side meeting of the ranks: each registers the shared segment with its
//! driver in turn, publishes how that went with the options it was made with, and waits for
//! every other rank to have done the same. After this nothing on the host waits for a peer.
#![allow(unsafe_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use gp2p_cuda::{Device, HostRegistration};

use crate::layout::{
    Layout, OPTION_WORDS, OPTIONS, REGISTERED, REGISTERED_OK, REGISTRATION_FAILED, REGISTRATION_TURN, STATUS,
};
use crate::segment::{LONGEST_TIMEOUT, poll_until};
use crate::{Error, Result, Segment};

/// The shared `u32` at `offset` of the staging area (the layout keeps them in range).
pub(crate) fn word(segment: &Segment, offset: usize) -> Result<&AtomicU32> {
    segment.staging_u32(offset).ok_or(Error::NotBuiltYet {
        what: format!("a staging area without room for its word at {offset}"),
        supported: "the layout it was made with",
    })
}

/// Register the whole segment on `device`, ranks in order: concurrent registrations of the
/// same shared pages by several processes have been seen to fail now and then. The turn
/// counter lives in the segment; a rank whose registration fails still passes the turn on,
/// so the others are not held up, and returns its error.
pub(crate) fn register_in_turn(segment: &Arc<Segment>, device: &Device, timeout: Duration) -> Result<HostRegistration> {
    let turn = word(segment, REGISTRATION_TURN)?;
    let rank = segment.rank() as u32;
    let missing = || (turn.load(Ordering::Acquire) as usize..segment.rank()).collect();
    wait_until(timeout, segment.world(), || turn.load(Ordering::Acquire) >= rank, missing)?;
    let (ptr, len) = segment.mapping();
    let owner: gp2p_cuda::MappingOwner = segment.clone();
    // SAFETY: the mapping is this process's, page aligned at both ends (the segment's size is
    // a multiple of STAGING_ALIGN), and stays mapped while `owner` (the segment) lives;
    // nothing else registers it (one communicator per segment, and the ranks of other
    // processes register their own mappings, one at a time).
    let registered = unsafe { HostRegistration::new(device, ptr, len, owner) };
    turn.fetch_add(1, Ordering::AcqRel);
    Ok(registered?)
}

/// Publish whether this rank registered, and wait until every rank has: a communicator is
/// only handed out where every rank has one, so no rank's first call waits out its timeout
/// for a peer that already failed.
pub(crate) fn all_registered(segment: &Segment, layout: &Layout, ok: bool, timeout: Duration) -> Result<()> {
    let options = |rank: usize| -> Result<[&AtomicU32; OPTION_WORDS]> {
        let at = |i: usize| word(segment, layout.flag(rank) + OPTIONS + 4 * i);
        let mut words = [at(0)?; OPTION_WORDS];
        for (i, w) in words.iter_mut().enumerate() {
            *w = at(i)?;
        }
        Ok(words)
    };
    for (w, value) in options(segment.rank())?.into_iter().zip(layout.options()) {
        w.store(value, Ordering::Relaxed);
    }
    // Release: whoever sees the status sees the options too.
    let status = if ok { REGISTERED_OK } else { REGISTRATION_FAILED };
    word(segment, layout.flag(segment.rank()) + STATUS)?.store(status, Ordering::Release);
    let done = word(segment, REGISTERED)?;
    done.fetch_add(1, Ordering::AcqRel);
    let world = segment.world();
    let statuses = || (0..world).map(|r| word(segment, layout.flag(r) + STATUS).map(|w| w.load(Ordering::Acquire)));
    wait_until(
        timeout,
        world,
        || done.load(Ordering::Acquire) as usize >= world,
        || {
            statuses()
                .enumerate()
                .filter(|(_, s)| !matches!(s, Ok(REGISTERED_OK | REGISTRATION_FAILED)))
                .map(|(r, _)| r)
                .collect()
        },
    )?;
    for (rank, s) in statuses().enumerate() {
        if rank != segment.rank() && s? != REGISTERED_OK {
            return Err(Error::PeerFailed { rank });
        }
    }
    // Layouts of one size can still differ (sizes round up to whole pages): every rank must
    // have made its communicator with the same options, or calls would take different paths
    // and read slots at different offsets.
    let ours = layout.options();
    for rank in (0..world).filter(|&r| r != segment.rank()) {
        let theirs = options(rank)?.map(|w| w.load(Ordering::Relaxed));
        if theirs != ours {
            return Err(Error::OptionsMismatch { rank, ours, theirs });
        }
    }
    Ok(())
}

/// Wait until `ready` (see [`crate::segment::poll_until`]) for at most `timeout`; on timeout
/// the error names the ranks of `world` that `missing` gives.
fn wait_until(
    timeout: Duration,
    world: usize,
    ready: impl Fn() -> bool,
    missing: impl Fn() -> Vec<usize>,
) -> Result<()> {
    let started = Instant::now();
    match poll_until(started + timeout.min(LONGEST_TIMEOUT), || Ok(ready().then_some(())))? {
        Some(()) => Ok(()),
        None => Err(Error::PeersMissing { missing: missing(), world, waited: started.elapsed() }),
    }
}
