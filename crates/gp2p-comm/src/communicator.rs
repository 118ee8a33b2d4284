//! `Communicator`: one rank of a group of processes, one GPU each, that share a [`Segment`]
//! registered with the driver. This version runs the small-message all-reduce of two ranks:
//! one kernel per rank that writes its buffer into its lines of the segment, each 8-byte line
//! carrying 4 bytes of data and the call's sequence number, and folds the peer's lines in as
//! they arrive (NCCL's LL idea, the kernel the single-process line exchange uses).
#![allow(unsafe_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use gp2p_cuda::raw::{ExchangeLines, exchange};
use gp2p_cuda::{Device, DeviceViewMut, HostRegistration, RawDevicePtr, Stream, StreamPoint};
use gp2p_kernels::{Element, ReduceOp, exchange_line_bytes, next_exchange_seq};

use crate::segment::{LONGEST_TIMEOUT, poll_until};
use crate::{Error, Result, Segment, UniqueId};

/// How a communicator is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommOptions {
    /// The largest buffer, in bytes, a small-message call takes (its lines are sized for it).
    pub small_max_bytes: usize,
    /// How long a rank's kernel waits for its peer's data before it gives up (the next call
    /// then says so). It must exceed how far one rank's stream may fall behind another's.
    pub peer_timeout: Duration,
    /// How long creation waits for every rank to join and register.
    pub join_timeout: Duration,
}

impl Default for CommOptions {
    fn default() -> Self {
        CommOptions {
            small_max_bytes: 64 << 10,
            peer_timeout: Duration::from_secs(5),
            join_timeout: crate::DEFAULT_JOIN_TIMEOUT,
        }
    }
}

/// Where things sit in the staging area: the same offsets in every process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Layout {
    /// Bytes of one half of one rank's lines (calls alternate halves).
    half: usize,
    /// Offset of rank 0's lines; rank r's follow at `r * 2 * half`.
    lines: usize,
    world: usize,
}

/// The turn counter of the serialised registration, at the start of the staging area.
const REGISTRATION_TURN: usize = 0;
/// How many ranks have published how their registration went.
const REGISTERED: usize = 4;
/// Set by a rank whose collective gave up waiting: every rank's calls then fail.
const BROKEN: usize = 8;
/// One cache line per rank after the counters' line: its give-up flag (written by its
/// kernel), then how its registration went ([`REGISTERED_OK`] or [`REGISTRATION_FAILED`]).
const FLAGS: usize = 64;
const STATUS: usize = 4;
const REGISTERED_OK: u32 = 1;
const REGISTRATION_FAILED: u32 = 2;
/// Lines start on this alignment (the kernel needs 16; a page keeps them apart from flags).
const LINES_ALIGN: usize = 4096;
/// The largest small-message size a communicator is made for: the line path is for small
/// messages, and the bound keeps the layout's arithmetic far from overflow.
const MAX_SMALL_BYTES: usize = 16 << 20;
/// The longest peer timeout taken (the kernel adds it to a nanosecond clock).
const MAX_PEER_TIMEOUT: Duration = Duration::from_secs(3600);

impl Layout {
    fn new(world: usize, small_max_bytes: usize) -> Result<Layout> {
        if world == 0 || world > crate::MAX_WORLD {
            return Err(Error::World { world, max: crate::MAX_WORLD });
        }
        if small_max_bytes == 0 || small_max_bytes > MAX_SMALL_BYTES {
            return Err(Error::InvalidOption {
                name: "small_max_bytes",
                reason: format!(
                    "{small_max_bytes} is outside 1..={MAX_SMALL_BYTES}; the line path is for small messages"
                ),
            });
        }
        // Bounded above, so none of this overflows.
        let half = exchange_line_bytes(small_max_bytes).next_multiple_of(256);
        let lines = (FLAGS + 64 * world).next_multiple_of(LINES_ALIGN);
        Ok(Layout { half, lines, world })
    }

    /// The staging area's size: whole multiples of the alignment that covers every page size,
    /// so the registered range ends on a page boundary.
    fn staging_bytes(&self) -> usize {
        (self.lines + self.world * 2 * self.half).next_multiple_of(crate::STAGING_ALIGN)
    }

    fn flag(&self, rank: usize) -> usize {
        FLAGS + 64 * rank
    }

    /// Offset of `rank`'s lines for the call tagged `seq`.
    fn lines_of(&self, rank: usize, seq: u32) -> usize {
        self.lines + rank * 2 * self.half + (seq & 1) as usize * self.half
    }
}

/// One rank of a one-process-per-GPU communicator on this host.
///
/// Made by every rank with the same [`UniqueId`] (one rank makes it and the caller hands it
/// to the others, as with NCCL) and the same world size and options. Creation waits, on the
/// host, for every rank to join and register the shared segment (one rank at a time); after
/// that nothing on the host waits for another process: each call is one kernel on the
/// caller's stream, whose waits for the peer are bounded by [`CommOptions::peer_timeout`].
///
/// Every rank must make the same calls (same op, dtype and length) in the same order: the
/// calls are matched by their sequence number, counted by each rank.
///
/// Lifetime: the segment stays mapped and registered until the GPU work of every call is
/// done, whenever the communicator is dropped (see `gp2p_cuda::lifetime`).
pub struct Communicator {
    device: Device,
    segment: Arc<Segment>,
    registration: HostRegistration,
    /// The staging area's start as this device maps it.
    staging: RawDevicePtr,
    layout: Layout,
    counter: u64,
    timeout: Duration,
    /// The end of this rank's last kernel, for a call on another stream to wait for.
    last: Option<StreamPoint>,
    /// Once a call gave up waiting, the ranks' sequence numbers may disagree: every later
    /// call fails instead of pairing with the wrong peer call.
    broken: bool,
}

impl Communicator {
    /// Join the communicator `id` as `rank` of `world`, on `device`. Returns once every rank
    /// has joined and registered the segment (or with the error of the first that failed).
    pub fn new(id: &UniqueId, rank: usize, world: usize, device: &Device, options: CommOptions) -> Result<Self> {
        let layout = Layout::new(world, options.small_max_bytes)?;
        if options.peer_timeout.is_zero() || options.peer_timeout > MAX_PEER_TIMEOUT {
            return Err(Error::InvalidOption {
                name: "peer_timeout",
                reason: format!("{:?} is outside (0, {MAX_PEER_TIMEOUT:?}]", options.peer_timeout),
            });
        }
        if !device.ptx_target().runs_line_exchange() {
            return Err(Error::NotBuiltYet {
                what: format!("the small all-reduce on the {} build of the kernels", device.ptx_target().name()),
                supported: "cards that run the compute_80 build (Ampere and newer)",
            });
        }
        // Loaded now, before any peer waits: a kernel loaded lazily at its first launch may
        // wait for the device to go idle, while the peer's kernel waits for this one.
        gp2p_cuda::load_all_reduce_kernels(device)?;
        let segment = Arc::new(Segment::join(id, rank, world, layout.staging_bytes(), options.join_timeout)?);
        let registered =
            register_in_turn(&segment, device, options.join_timeout).and_then(|r| Ok((r.device_ptr(device)?, r)));
        let everyone = all_registered(&segment, &layout, registered.is_ok(), options.join_timeout);
        // This rank's own failure first: it says why, where a peer's can only say who.
        let (base, registration) = registered?;
        everyone?;
        Ok(Communicator {
            device: device.clone(),
            staging: base + segment.staging_offset() as u64,
            segment,
            registration,
            layout,
            counter: 0,
            timeout: options.peer_timeout,
            last: None,
            broken: false,
        })
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.segment.rank()
    }

    /// How many ranks there are.
    pub fn world(&self) -> usize {
        self.segment.world()
    }

    /// The device this rank runs on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The shared segment's name (`/gp2p-<token>`), unlinked once every rank joined.
    pub fn segment_name(&self) -> &str {
        self.segment.name()
    }

    /// The largest buffer, in bytes, [`Communicator::all_reduce`] takes.
    pub fn small_max_bytes(&self) -> usize {
        // exchange_line_bytes doubles the data bytes: lines carry half data.
        self.layout.half / 2
    }

    /// In place on every rank: `buf = op(every rank's buf)`, ordered after the work queued
    /// on `stream` so far; later work there sees the result. For avg the sum is divided by
    /// the world size. Two ranks, buffers of at most [`Communicator::small_max_bytes`].
    pub fn all_reduce<T: Element>(
        &mut self,
        buf: &mut DeviceViewMut<'_, T>,
        stream: &Stream,
        op: ReduceOp,
    ) -> Result<()> {
        if self.world() != 2 {
            return Err(Error::NotBuiltYet {
                what: format!("all_reduce over {} ranks", self.world()),
                supported: "the all_reduce of two ranks",
            });
        }
        self.take_failure()?;
        for (what, got) in [("buf", buf.device()), ("stream", stream.device())] {
            if got != &self.device {
                return Err(Error::WrongDevice { what, got: got.ordinal(), expected: self.device.ordinal() });
            }
        }
        if stream.is_capturing()? {
            // The call's sequence number is a kernel argument: a replayed graph would pair
            // with the peer's lines of an earlier replay.
            return Err(Error::NotBuiltYet {
                what: "an all_reduce captured into a CUDA graph".into(),
                supported: "calls outside graph capture",
            });
        }
        let bytes = buf.len() * size_of::<T>();
        if bytes > self.small_max_bytes() {
            return Err(Error::TooLarge { bytes, max: self.small_max_bytes() });
        }
        if buf.is_empty() {
            return Ok(());
        }
        if let Some(last) = &self.last {
            stream.wait_point(last)?;
        }
        // Taken before the launch: nothing after it may wait for the device (see
        // gp2p_cuda::ReservedPoint).
        let reserved = stream.reserve_point()?;
        let seq = next_exchange_seq(&mut self.counter);
        let peer = 1 - self.rank();
        let at = |offset: usize| self.staging + offset as u64;
        let lines = ExchangeLines {
            out_lines: at(self.layout.lines_of(self.rank(), seq)),
            in_lines: at(self.layout.lines_of(peer, seq)),
            failed: at(self.layout.flag(self.rank())),
        };
        let divide_by = if op == ReduceOp::Avg { self.world() as u32 } else { 1 };
        let timeout_ns = u64::try_from(self.timeout.as_nanos()).unwrap_or(u64::MAX);
        // SAFETY: `buf` is `len` elements on this device (checked above); both lines lie in
        // the registered staging area, 256-aligned, sized by the layout for
        // `small_max_bytes` (checked above), and only this rank's kernels write its own
        // lines (the peer writes its own); `failed` is this rank's aligned u32 of it; the
        // registration outlives the kernel by the point noted right after the launch, and
        // keeps the segment mapped until then. Calls alternate halves and each rank's calls
        // run in order (the wait on `last` above), so a half is rewritten only after the peer
        // finished reading it (the peer's next call, which this rank's waited for, starts
        // after its previous one ended). The peer enqueues the same call on its own device.
        unsafe {
            exchange(stream, buf.raw_ptr(), buf.len(), T::DTYPE, op, lines, seq, divide_by, timeout_ns)?;
        }
        let point = stream.point_from(reserved)?;
        buf.note_use(&point);
        self.registration.uses().note(&point);
        self.last = Some(point);
        Ok(())
    }

    /// Fail if a kernel of an earlier call, on this rank or another, gave up waiting for its
    /// peer: from then on the ranks' calls may no longer pair up, so every call fails (the
    /// first on this rank with the timeout, later ones as broken) and the other ranks learn
    /// it from the segment.
    fn take_failure(&mut self) -> Result<()> {
        if self.broken {
            return Err(Error::Broken { rank: self.rank() });
        }
        let gave_up = self.word(self.layout.flag(self.rank()))?.swap(0, Ordering::AcqRel) != 0;
        let shared = self.word(BROKEN)?;
        if gave_up {
            shared.store(1, Ordering::Release);
        }
        let peer_broke = shared.load(Ordering::Acquire) != 0;
        if gave_up {
            self.broken = true;
            return Err(Error::PeerTimeout { rank: self.rank(), peer: 1 - self.rank(), timeout: self.timeout });
        }
        if peer_broke {
            self.broken = true;
            return Err(Error::Broken { rank: self.rank() });
        }
        Ok(())
    }

    fn word(&self, offset: usize) -> Result<&AtomicU32> {
        word(&self.segment, offset)
    }
}

/// The shared `u32` at `offset` of the staging area (the layout keeps them in range).
fn word(segment: &Segment, offset: usize) -> Result<&AtomicU32> {
    segment.staging_u32(offset).ok_or(Error::NotBuiltYet {
        what: format!("a staging area without room for its word at {offset}"),
        supported: "the layout it was made with",
    })
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Communicator(rank {} of {} on device {}, segment {}, call {})",
            self.rank(),
            self.world(),
            self.device.ordinal(),
            self.segment.name(),
            self.counter
        )
    }
}

/// Register the whole segment on `device`, ranks in order: concurrent registrations of the
/// same shared pages by several processes have been seen to fail now and then. The turn
/// counter lives in the segment; a rank whose registration fails still passes the turn on,
/// so the others are not held up, and returns its error.
fn register_in_turn(segment: &Arc<Segment>, device: &Device, timeout: Duration) -> Result<HostRegistration> {
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
fn all_registered(segment: &Segment, layout: &Layout, ok: bool, timeout: Duration) -> Result<()> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layout_keeps_flags_and_lines_apart_and_aligned() {
        let layout = Layout::new(2, 64 << 10).unwrap();
        assert_eq!(layout.half, 128 << 10, "lines carry half data");
        assert_eq!(layout.lines % LINES_ALIGN, 0);
        assert!(layout.flag(1) + 4 <= layout.lines);
        assert_eq!(layout.lines_of(0, 1), layout.lines + layout.half, "odd calls use the second half");
        assert_eq!(layout.lines_of(1, 2), layout.lines + 2 * layout.half);
        assert!(layout.staging_bytes() >= layout.lines_of(1, 1) + layout.half);
        assert_eq!(layout.staging_bytes() % crate::STAGING_ALIGN, 0, "ends on a page boundary");
        for rank in 0..2 {
            assert_eq!(layout.flag(rank) % 64, 0);
            assert_eq!(layout.lines_of(rank, 7) % 256, 0);
        }
        assert_eq!(Layout::new(2, 1).unwrap().half, 256, "at least one aligned block");
        for (name, layout) in [("0 bytes", Layout::new(2, 0)), ("1 << 61 bytes", Layout::new(2, 1 << 61))] {
            assert!(matches!(layout, Err(Error::InvalidOption { name: "small_max_bytes", .. })), "{name}");
        }
        assert!(matches!(Layout::new(0, 1024), Err(Error::World { .. })));
        assert!(matches!(Layout::new(crate::MAX_WORLD + 1, 1024), Err(Error::World { .. })));
    }
}
