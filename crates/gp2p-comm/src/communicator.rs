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
/// One cache line per rank for its give-up flag, after the turn counter's line.
const FLAGS: usize = 64;
/// Lines start on this alignment (the kernel needs 16; a page keeps them apart from flags).
const LINES_ALIGN: usize = 4096;

impl Layout {
    fn new(world: usize, small_max_bytes: usize) -> Layout {
        let half = exchange_line_bytes(small_max_bytes.max(1)).next_multiple_of(256);
        let lines = (FLAGS + 64 * world).next_multiple_of(LINES_ALIGN);
        Layout { half, lines, world }
    }

    fn staging_bytes(&self) -> usize {
        self.lines + self.world * 2 * self.half
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
    rank: usize,
    world: usize,
    segment: Arc<Segment>,
    registration: HostRegistration,
    /// The staging area's start as this device maps it.
    staging: RawDevicePtr,
    layout: Layout,
    counter: u64,
    timeout: Duration,
    /// The end of this rank's last kernel, for a call on another stream to wait for.
    last: Option<StreamPoint>,
}

impl Communicator {
    /// Join the communicator `id` as `rank` of `world`, on `device`.
    pub fn new(id: &UniqueId, rank: usize, world: usize, device: &Device, options: CommOptions) -> Result<Self> {
        let layout = Layout::new(world, options.small_max_bytes);
        let segment = Arc::new(Segment::join(id, rank, world, layout.staging_bytes(), options.join_timeout)?);
        let registration = register_in_turn(&segment, device, options.join_timeout)?;
        let base = registration.device_ptr(device)?;
        let staging = base + segment.staging_offset() as u64;
        Ok(Communicator {
            device: device.clone(),
            rank,
            world,
            segment,
            registration,
            staging,
            layout,
            counter: 0,
            timeout: options.peer_timeout,
            last: None,
        })
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// How many ranks there are.
    pub fn world(&self) -> usize {
        self.world
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
        self.take_failure()?;
        for (what, got) in [("buf", buf.device()), ("stream", stream.device())] {
            if got != &self.device {
                return Err(Error::WrongDevice { what, got: got.ordinal(), expected: self.device.ordinal() });
            }
        }
        if self.world != 2 {
            return Err(Error::NotBuiltYet {
                what: format!("all_reduce over {} ranks", self.world),
                supported: "the all_reduce of two ranks",
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
        let peer = 1 - self.rank;
        let at = |offset: usize| self.staging + offset as u64;
        let lines = ExchangeLines {
            out_lines: at(self.layout.lines_of(self.rank, seq)),
            in_lines: at(self.layout.lines_of(peer, seq)),
            failed: at(self.layout.flag(self.rank)),
        };
        let divide_by = if op == ReduceOp::Avg { self.world as u32 } else { 1 };
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

    /// Report (once) a kernel of an earlier call that gave up waiting for its peer.
    fn take_failure(&mut self) -> Result<()> {
        let flag = self.flag(self.rank)?;
        if flag.swap(0, Ordering::AcqRel) != 0 {
            return Err(Error::PeerTimeout { rank: self.rank, peer: 1 - self.rank, timeout: self.timeout });
        }
        Ok(())
    }

    fn flag(&self, rank: usize) -> Result<&AtomicU32> {
        self.segment.staging_u32(self.layout.flag(rank)).ok_or(Error::NotBuiltYet {
            what: "a staging area without room for the flags".into(),
            supported: "the layout it was made with",
        })
    }
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Communicator(rank {} of {} on device {}, segment {}, call {})",
            self.rank,
            self.world,
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
    let turn = segment.staging_u32(REGISTRATION_TURN).ok_or(Error::NotBuiltYet {
        what: "a staging area without room for the registration turn".into(),
        supported: "the layout it was made with",
    })?;
    let started = Instant::now();
    let rank = segment.rank() as u32;
    while turn.load(Ordering::Acquire) < rank {
        if started.elapsed() > timeout {
            return Err(Error::PeersMissing {
                missing: (turn.load(Ordering::Acquire) as usize..segment.rank()).collect(),
                world: segment.world(),
                waited: started.elapsed(),
            });
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    let (ptr, len) = segment.mapping();
    let owner: gp2p_cuda::MappingOwner = segment.clone();
    // SAFETY: the mapping is this process's, page aligned at both ends, and stays mapped while
    // `owner` (the segment) lives; nothing else registers it (one communicator per segment,
    // and the ranks of other processes register their own mappings, one at a time).
    let registered = unsafe { HostRegistration::new(device, ptr, len, owner) };
    turn.fetch_add(1, Ordering::AcqRel);
    Ok(registered?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layout_keeps_flags_and_lines_apart_and_aligned() {
        let layout = Layout::new(2, 64 << 10);
        assert_eq!(layout.half, 128 << 10, "lines carry half data");
        assert_eq!(layout.lines % LINES_ALIGN, 0);
        assert!(layout.flag(1) + 4 <= layout.lines);
        assert_eq!(layout.lines_of(0, 1), layout.lines + layout.half, "odd calls use the second half");
        assert_eq!(layout.lines_of(1, 2), layout.lines + 2 * layout.half);
        assert_eq!(layout.staging_bytes(), layout.lines_of(1, 1) + layout.half);
        for rank in 0..2 {
            assert_eq!(layout.flag(rank) % 64, 0);
            assert_eq!(layout.lines_of(rank, 7) % 256, 0);
        }
        assert_eq!(Layout::new(2, 1).half, 256, "at least one aligned block");
    }
}
