//! `Communicator`: one rank of a group of processes, one GPU each, that share a [`Segment`]
//! registered with the driver. Two ranks: the small all-reduce is one kernel per rank. Up to
//! [`CommOptions::lines_max_bytes`] (2 KiB by default) it writes its buffer into its lines of
//! the segment, each 8-byte line carrying 4 bytes of data and the call's sequence number
//! (NCCL's LL idea); above, it stores the buffer in 4 KiB chunks and flags each with the
//! number (see `gp2p_kernels::chunks_kernel_name`). It folds the peer's data in as it arrives.
//! Every other call goes through the staged pipeline of [`crate::pipeline`].
#![allow(unsafe_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use std::mem::ManuallyDrop;

use gp2p_cuda::raw::{ChunkAreas, ChunkWaits, ExchangeLines, Numbering, exchange, plan_exchange_chunks, write_flag};
use gp2p_cuda::{
    Device, DeviceBuffer, DeviceView, DeviceViewMut, HostRegistration, LaunchCache, RawDevicePtr, Stream, StreamPoint,
};
use gp2p_kernels::{CHUNK_MAX_BLOCKS, DType, Element, ReduceOp, chunk_area_layout, exchange_line_bytes};

use crate::pipeline::{Landing, Pipeline, RankSide, Staging, Transfer};
use crate::segment::{LONGEST_TIMEOUT, poll_until};
use crate::{Error, Result, Segment, UniqueId};

/// How a communicator is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommOptions {
    /// The largest buffer, in bytes, a small-message call takes (its areas are sized for it).
    pub small_max_bytes: usize,
    /// How long a rank's kernel waits for its peer's data before it gives up (the next call
    /// then says so). It must exceed how far one rank's stream may fall behind another's.
    pub peer_timeout: Duration,
    /// How long creation waits for every rank to join and register.
    pub join_timeout: Duration,
    /// Bytes of one slot of the pipeline that carries larger messages: a chunk's DMA copy.
    /// A multiple of 4096 in 64 KiB..=256 MiB.
    pub slot_bytes: usize,
    /// Slots per rank of that pipeline: chunks in flight at once, 2..=16.
    pub slots: usize,
    /// The most blocks the one-kernel path's flagged-chunk kernel runs, 1..=256 (default 128:
    /// a block per 4 KiB chunk up to 32, up to 64 with 4 chunks each, more only with 8 each,
    /// see `chunk_grid`). Each rank may pick its own.
    pub chunk_blocks: usize,
    /// All-reduces of up to this many bytes take the line kernel (8-byte lines of 4 data
    /// bytes and the call's number, one block: no fence, one read of the peer's data), larger
    /// ones up to `small_max_bytes` the flagged chunks. 0..=64 KiB, default 2 KiB; every rank
    /// must give the same. For tuning: since the lines lie in two planes (7774b2d) the two
    /// kernels came within half a microsecond of each other at 4-8 KiB on one H200, and
    /// where they cross between two GPUs is not measured yet.
    pub lines_max_bytes: usize,
}

impl Default for CommOptions {
    fn default() -> Self {
        CommOptions {
            // Two H200s, one process each, NCCL's shared-memory path in the same processes
            // (benches/results/README.md, tenth session): one kernel took 15.8 us at 128 KiB
            // (NCCL 23.6-32.0), 20.1-22.7 at 256 KiB (35.8-37.7), 48.1-50.0 at 1 MiB (63.2-64.5)
            // and 147.4-152.1 at 4 MiB with 128 blocks (171.5-173.0), where the pipeline took
            // 36-40, 70 and 190-194 in earlier runs. The chunk kernel's block cap
            // (`chunk_grid`) keeps it out of the two-mode timing seen above 128 KiB before.
            small_max_bytes: 4 << 20,
            peer_timeout: Duration::from_secs(5),
            join_timeout: crate::DEFAULT_JOIN_TIMEOUT,
            // Measured on two H200s, one process each, f32 all-reduce at 16 MiB / 64 MiB /
            // 256 MiB / 1 GiB, ratio of the duplex ceiling (one call): 8 MiB x 3 slots
            // 0.80/0.88/0.88/0.94, 16 MiB x 2 0.68/0.87/0.90/0.93, 4 MiB x 3 (the single-process
            // engine's best) 0.63/0.76/0.81/0.79, 4 MiB x 4 0.75/0.79/0.82/0.79; 1-2 MiB slots
            // 0.55-0.70 (benches/results/README.md, sixth session).
            slot_bytes: 8 << 20,
            slots: 3,
            chunk_blocks: DEFAULT_CHUNK_BLOCKS,
            lines_max_bytes: DEFAULT_LINES_MAX_BYTES,
        }
    }
}

/// Where things sit in the staging area: the same offsets in every process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    /// The largest all-reduce of the one-kernel path, in bytes.
    small_max: usize,
    /// The largest all-reduce of that path that takes the line kernel, in bytes.
    lines_max: usize,
    /// Bytes of one half of one rank's area for that path (calls alternate halves): the
    /// lines of the smallest calls (`lines_bytes`), then the flagged chunks' data, then
    /// their flags at `flags_offset` from the chunks' start.
    half: usize,
    lines_bytes: usize,
    flags_offset: usize,
    /// Offset of rank 0's area; rank r's follows at `r * 2 * half`.
    areas: usize,
    world: usize,
    /// The pipeline's flags, after the ranks' flag lines: a u32 per rank and slot.
    chunk_flags: usize,
    /// The pipeline's slots: `slot_count` per rank of `slot_bytes` each, rank 0's first,
    /// from offset `slots`.
    slots: usize,
    slot_bytes: usize,
    slot_count: usize,
}

/// The turn counter of the serialised registration, at the start of the staging area.
const REGISTRATION_TURN: usize = 0;
/// How many ranks have published how their registration went.
const REGISTERED: usize = 4;
/// Set by a rank whose collective gave up waiting: every rank's calls then fail.
const BROKEN: usize = 8;
/// One cache line per rank after the counters' line: its give-up flag (written by its
/// kernel), then how its registration went ([`REGISTERED_OK`] or [`REGISTRATION_FAILED`]),
/// then the options that set the layout, which every rank checks against its own.
const FLAGS: usize = 64;
const STATUS: usize = 4;
const OPTIONS: usize = 8;
/// The options' words, after `OPTIONS` in each rank's cache line.
pub(crate) const OPTION_WORDS: usize = 4;
const _: () = assert!(OPTIONS + 4 * OPTION_WORDS <= 64, "a rank's words fit in its cache line");
const REGISTERED_OK: u32 = 1;
const REGISTRATION_FAILED: u32 = 2;
/// Lines and slots start on this alignment (the kernels need 16; a page keeps them apart
/// from flags and from each other).
const LINES_ALIGN: usize = 4096;
/// [`CommOptions::chunk_blocks`] by default (see [`chunk_grid`]).
const DEFAULT_CHUNK_BLOCKS: usize = 128;

/// The blocks the chunk kernel runs for `bytes`, at most `chunk_blocks`: a block per 4 KiB
/// chunk up to 32 blocks, up to 64 only with 4 chunks each or more, and more only with 8 or
/// more. Between processes on two H200s (benches/results/README.md, tenth session), grids of
/// many blocks with few chunks each ran in two modes that switch from one 50-call loop to the
/// next: 256 blocks of 1 chunk (1 MiB) took 50 us or 225-280, 256 of 4 (4 MiB) 152 or
/// 307-363, 128 of 2 (1 MiB) 49 or 124-143, 64 of 1 (256 KiB) 20 or 55-61. These did not:
/// 32 of 2 (256 KiB, 22-24 us, a few loops to 40), 64 of 4 (1 MiB, 48-52 in 35 of 36 loops),
/// 128 of 8 (4 MiB, 147-153 in 18 of 18); fewer blocks are slower (256 KiB: 16 blocks 29 us,
/// 8 blocks 43). Never seen with both ranks in one process, which keeps 256.
fn chunk_grid(bytes: usize, chunk_blocks: usize) -> usize {
    let chunks = bytes.div_ceil(gp2p_kernels::CHUNK_BYTES);
    let one_each = chunks.min(32);
    let four_each = (chunks / 4).min(64);
    let eight_each = chunks / 8;
    one_each.max(four_each).max(eight_each).min(chunk_blocks)
}

/// The bounds of [`CommOptions::slot_bytes`] and [`CommOptions::slots`].
const SLOT_BYTES: std::ops::RangeInclusive<usize> = (64 << 10)..=(256 << 20);
const SLOTS: std::ops::RangeInclusive<usize> = 2..=16;
/// [`CommOptions::lines_max_bytes`] by default. Two H200s, one kernel per rank per call
/// (benches/probes/small_exchange.py), with the lines side by side as they were until
/// 7774b2d: lines 6.0 us at 64 B and 6.5 at 2 KiB, chunks 7.7 and 8.3 (their fence); at 8 KiB
/// lines 20 us, chunks 8.3.
const DEFAULT_LINES_MAX_BYTES: usize = 2 << 10;
/// The bound of [`CommOptions::lines_max_bytes`]: one block of the line kernel for the whole
/// buffer, each thread a few batches of groups.
const MAX_LINES_BYTES: usize = 64 << 10;
/// The largest small-message size a communicator is made for: the one-kernel path is for small
/// messages, and the bound keeps the layout's arithmetic far from overflow.
const MAX_SMALL_BYTES: usize = 16 << 20;
/// The longest peer timeout taken (the kernel adds it to a nanosecond clock).
const MAX_PEER_TIMEOUT: Duration = Duration::from_secs(3600);

impl Layout {
    fn new(world: usize, options: &CommOptions) -> Result<Layout> {
        let CommOptions { small_max_bytes, slot_bytes, slots: slot_count, .. } = *options;
        if world == 0 || world > crate::MAX_WORLD {
            return Err(Error::World { world, max: crate::MAX_WORLD });
        }
        if !(1..=CHUNK_MAX_BLOCKS).contains(&options.chunk_blocks) {
            return Err(Error::InvalidOption {
                name: "chunk_blocks",
                reason: format!("{} is outside 1..={CHUNK_MAX_BLOCKS}", options.chunk_blocks),
            });
        }
        if small_max_bytes == 0 || small_max_bytes > MAX_SMALL_BYTES {
            return Err(Error::InvalidOption {
                name: "small_max_bytes",
                reason: format!(
                    "{small_max_bytes} is outside 1..={MAX_SMALL_BYTES}; the one-kernel path is for small messages"
                ),
            });
        }
        if !SLOT_BYTES.contains(&slot_bytes) || slot_bytes % LINES_ALIGN != 0 {
            return Err(Error::InvalidOption {
                name: "slot_bytes",
                reason: format!("{slot_bytes} is not a multiple of {LINES_ALIGN} in {SLOT_BYTES:?}"),
            });
        }
        if !SLOTS.contains(&slot_count) {
            return Err(Error::InvalidOption { name: "slots", reason: format!("{slot_count} is outside {SLOTS:?}") });
        }
        let lines_max = options.lines_max_bytes;
        if lines_max > MAX_LINES_BYTES {
            return Err(Error::InvalidOption {
                name: "lines_max_bytes",
                reason: format!("{lines_max} is outside 0..={MAX_LINES_BYTES}; the line kernel runs in one block"),
            });
        }
        // Bounded above, so none of this overflows.
        let lines_max = lines_max.min(small_max_bytes);
        let lines_bytes = exchange_line_bytes(lines_max).next_multiple_of(256);
        let (flags_offset, chunks) = chunk_area_layout(small_max_bytes);
        let half = (lines_bytes + chunks).next_multiple_of(256);
        let chunk_flags = FLAGS + 64 * world;
        let areas = (chunk_flags + 4 * slot_count * world).next_multiple_of(LINES_ALIGN);
        let slots = areas + world * 2 * half;
        Ok(Layout {
            small_max: small_max_bytes,
            lines_max,
            half,
            lines_bytes,
            flags_offset,
            areas,
            world,
            chunk_flags,
            slots,
            slot_bytes,
            slot_count,
        })
    }

    /// The staging area's size: whole multiples of the alignment that covers every page size,
    /// so the registered range ends on a page boundary.
    fn staging_bytes(&self) -> usize {
        (self.slots + self.world * self.slot_count * self.slot_bytes).next_multiple_of(crate::STAGING_ALIGN)
    }

    /// Offset of `rank`'s give-up flag (set by its kernels when a wait times out).
    pub(crate) fn flag(&self, rank: usize) -> usize {
        FLAGS + 64 * rank
    }

    /// What the layout was made from, as every rank publishes it to be compared: the
    /// one-kernel path's largest size, the slot size, the slot count and the line kernel's
    /// largest size (each bounded well below `u32::MAX`).
    fn options(&self) -> [u32; OPTION_WORDS] {
        [self.small_max as u32, self.slot_bytes as u32, self.slot_count as u32, self.lines_max as u32]
    }

    /// Offset of the communicator's broken flag, which every rank's host and pipeline waits
    /// read, and set when they give up.
    pub(crate) fn broken(&self) -> usize {
        BROKEN
    }

    /// Bytes of one pipeline slot.
    pub(crate) fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// Offset of `rank`'s pipeline slot `slot`.
    pub(crate) fn slot(&self, rank: usize, slot: usize) -> usize {
        self.slots + (rank * self.slot_count + slot) * self.slot_bytes
    }

    /// Offset of the handshake flag of `rank`'s pipeline slot `slot` (1: it holds a chunk
    /// for the peer; 0: the peer has read it).
    pub(crate) fn full(&self, rank: usize, slot: usize) -> usize {
        self.chunk_flags + 4 * (rank * self.slot_count + slot)
    }

    /// Offset of `rank`'s one-kernel area for the call numbered `seq`.
    fn area_of(&self, rank: usize, seq: u32) -> usize {
        self.areas + rank * 2 * self.half + (seq & 1) as usize * self.half
    }
}

/// One rank of a one-process-per-GPU communicator on this host.
///
/// Made by every rank with the same [`UniqueId`] (one rank makes it and the caller hands it
/// to the others, as with NCCL) and the same world size and options. Creation waits, on the
/// host, for every rank to join and register the shared segment (one rank at a time); after
/// that nothing on the host waits for another process: each call is enqueued on the
/// caller's stream, and its waits for the peer run on the GPU, each bounded by
/// [`CommOptions::peer_timeout`].
///
/// Two paths: an all-reduce of at most [`CommOptions::small_max_bytes`] is one kernel per
/// rank that hands its buffer over in mapped host memory (8-byte lines of data and number up
/// to [`CommOptions::lines_max_bytes`], flagged 4 KiB chunks above), numbered in device
/// memory; everything else goes through a pipeline of DMA copies via slots of the segment,
/// flagged chunk by chunk (see the `pipeline` module). Two ranks; more are not built yet.
///
/// Every rank must make the same calls (same collective, op, dtype and lengths, and root)
/// in the same order: the calls are matched by sequence numbers each rank counts.
///
/// Lifetime: the segment stays mapped and registered until the GPU work of every call is
/// done, whenever the communicator is dropped (see `gp2p_cuda::lifetime`).
///
/// CUDA graphs: calls on a capturing stream are refused unless
/// [`Communicator::allow_graph_capture`] was called; then they are captured, and the graph
/// can be replayed with whatever the captured buffers hold by then (no call keeps a count
/// on the host). A communicator that captured a call keeps its segment and device memory
/// for the rest of the process, since a graph may be replayed after it is dropped.
pub struct Communicator {
    device: Device,
    segment: Arc<Segment>,
    /// Dropped in `Drop` unless a call was captured into a graph (then kept: see above).
    registration: ManuallyDrop<HostRegistration>,
    /// The small path's call count, in device memory: its kernel numbers its call from it,
    /// so a replayed graph's calls are numbered too. Kept like `registration`.
    seq_counter: ManuallyDrop<DeviceBuffer<u32>>,
    /// The staging area's start as this device maps it.
    staging: RawDevicePtr,
    layout: Layout,
    /// Calls made, for `Debug`.
    calls: u64,
    pipeline: Pipeline,
    timeout: Duration,
    /// [`CommOptions::chunk_blocks`].
    chunk_blocks: usize,
    /// The end of this rank's last call, for a call on another stream to wait for.
    last: Option<StreamPoint>,
    /// Once a call gave up waiting, the ranks' calls may no longer pair up: every later call
    /// fails instead of pairing with the wrong peer call.
    broken: bool,
    capture: Capture,
    /// The small path's kernels, replayed from graphs (a launch costs the host twice a
    /// replay's time). Its launches are this rank's calls, which run one after another.
    launches: LaunchCache,
}

/// Which way an all-gather or reduce-scatter moves its parts (see `Communicator::split`).
#[derive(Debug, Clone, Copy)]
enum Split {
    Gather,
    Scatter(ReduceOp),
}

/// Whether calls may be captured into CUDA graphs, and whether one was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Capture {
    Refused,
    Allowed,
    Used,
}

impl Communicator {
    /// Join the communicator `id` as `rank` of `world`, on `device`. Returns once every rank
    /// has joined and registered the segment (or with the error of the first that failed).
    pub fn new(id: &UniqueId, rank: usize, world: usize, device: &Device, options: CommOptions) -> Result<Self> {
        let layout = Layout::new(world, &options)?;
        if options.peer_timeout.is_zero() || options.peer_timeout > MAX_PEER_TIMEOUT {
            return Err(Error::InvalidOption {
                name: "peer_timeout",
                reason: format!("{:?} is outside (0, {MAX_PEER_TIMEOUT:?}]", options.peer_timeout),
            });
        }
        if !device.ptx_target().runs_line_exchange() {
            return Err(Error::NotBuiltYet {
                what: format!("the communicator on the {} build of the kernels", device.ptx_target().name()),
                supported: "cards that run the compute_80 build (Ampere and newer)",
            });
        }
        // Loaded now, before any peer waits: a kernel loaded lazily at its first launch may
        // wait for the device to go idle, while the peer's kernel waits for this one.
        gp2p_cuda::load_all_reduce_kernels(device)?;
        let pipeline = Pipeline::new(device, options.slots)?;
        // The call count and the kernels' ticket (see gp2p_kernels::chunks_kernel_name), zero
        // before any kernel can read them.
        let seq_counter = DeviceBuffer::<u32>::zeroed(device, 2)?;
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
            registration: ManuallyDrop::new(registration),
            seq_counter: ManuallyDrop::new(seq_counter),
            layout,
            calls: 0,
            pipeline,
            timeout: options.peer_timeout,
            chunk_blocks: options.chunk_blocks,
            last: None,
            broken: false,
            capture: Capture::Refused,
            launches: LaunchCache::new(device),
        })
    }

    /// Let calls on a capturing stream be captured into CUDA graphs (refused otherwise).
    ///
    /// # Safety
    /// For as long as a graph holding a captured call may be launched:
    /// - the buffers of the captured calls stay allocated, and nothing else touches them
    ///   while a launch runs except through work ordered on the launch's stream (what
    ///   torch's graph memory pool gives the tensors a graph captured);
    /// - every rank launches its graphs, and makes its uncaptured calls, in the same order as
    ///   every other rank, each rank on one stream or ordered as if it were (calls pair up by
    ///   their order; a launch on another stream is not ordered after this rank's earlier
    ///   calls by the communicator, which cannot see it);
    /// - while a capture that holds a call of this communicator is open, no other call of it
    ///   is made (its internal streams belong to that capture until it ends).
    pub unsafe fn allow_graph_capture(&mut self) {
        if self.capture == Capture::Refused {
            self.capture = Capture::Allowed;
        }
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

    /// The largest buffer, in bytes, [`Communicator::all_reduce`] runs as one kernel; larger
    /// ones go through the pipeline.
    pub fn small_max_bytes(&self) -> usize {
        self.layout.small_max
    }

    /// The largest all-reduce, in bytes, that the one-kernel path runs with its line kernel
    /// ([`CommOptions::lines_max_bytes`], at most [`Communicator::small_max_bytes`]).
    pub fn lines_max_bytes(&self) -> usize {
        self.layout.lines_max
    }

    /// In place on every rank: `buf = op(every rank's buf)`, ordered after the work queued
    /// on `stream` so far; later work there sees the result. For avg the sum is divided by
    /// the world size.
    pub fn all_reduce<T: Element>(
        &mut self,
        buf: &mut DeviceViewMut<'_, T>,
        stream: &Stream,
        op: ReduceOp,
    ) -> Result<()> {
        self.check_call(stream, &[("buf", buf.device())])?;
        let bytes = buf.bytes();
        if bytes == 0 {
            return Ok(());
        }
        let divide_by = self.divisor(op);
        if bytes > self.small_max_bytes() {
            let ptr = buf.raw_ptr();
            let receive = Some((ptr, Landing::Fold { op, divide_by }));
            let transfer = Transfer { bytes, dtype: T::DTYPE, send: Some(ptr), receive, local: None };
            return self.enqueue(stream, transfer, |point| buf.note_use(point));
        }
        let (timeout_ns, chunk_blocks, lines_max) = (self.timeout_ns(), self.chunk_blocks, self.layout.lines_max);
        let (ptr, len) = (buf.raw_ptr(), buf.len());
        let (lines, areas) = (self.exchange_lines(), self.chunk_areas());
        self.call(
            stream,
            // SAFETY: `buf` is `len` elements on this device (checked above); both ranks'
            // areas (two halves each) lie in the registered staging area, 256-aligned, laid
            // out by Layout::new for `small_max_bytes`, which `len` does not exceed (checked
            // above): the lines for up to the layout's lines_max, then the chunks. Only this
            // rank's kernels write its own area (the peer writes its own); `failed` is this rank's
            // aligned u32 of it, `broken` the communicator's; the counter is this
            // communicator's own two device words, touched only by its small-path kernels,
            // which run in order (each call waits for the last, or a captured graph's
            // launches are ordered by the caller: allow_graph_capture's contract), and both
            // kernels number calls alike (the line kernel leaves the ticket at 0). The
            // registration and counter outlive the kernel: `call` notes its point on them,
            // or, captured, they stay for the process's life. The peer enqueues the same call
            // (it takes the same kernel: the size decides). The launch cache is this rank's,
            // and its launches are these calls, each after the last.
            |comm| unsafe {
                let launches = Some(&mut comm.launches);
                if bytes <= lines_max {
                    Ok(exchange(stream, ptr, len, T::DTYPE, op, lines, 0, divide_by, timeout_ns, launches)?)
                } else {
                    // Between processes a peer that never arrives may have died: the same bound either
                    // way, so every rank hears of it within the peer timeout.
                    let waits = ChunkWaits { timeout_ns, queue_timeout_ns: timeout_ns };
                    let blocks = chunk_grid(bytes, chunk_blocks);
                    let device = stream.device();
                    match plan_exchange_chunks(device, ptr, len, T::DTYPE, op, areas, divide_by, waits, blocks)? {
                        Some(kernel) => Ok(kernel.enqueue(stream, launches)?),
                        None => Ok(()),
                    }
                }
            },
            |point| buf.note_use(point),
        )
    }

    /// The lines of the smallest all-reduces, numbered from the device counter.
    fn exchange_lines(&self) -> ExchangeLines {
        let peer = 1 - self.rank();
        let at = |offset: usize| self.staging + offset as u64;
        ExchangeLines {
            out_lines: at(self.layout.area_of(self.rank(), 0)),
            in_lines: at(self.layout.area_of(peer, 0)),
            failed: at(self.layout.flag(self.rank())),
            broken: at(self.layout.broken()),
            numbering: Numbering::Counted { counter: self.seq_counter.raw_ptr(), half_stride: self.layout.half as u64 },
        }
    }

    /// The flagged chunks of the other small all-reduces, numbered from the device counter.
    fn chunk_areas(&self) -> ChunkAreas {
        let peer = 1 - self.rank();
        let at = |offset: usize| self.staging + offset as u64;
        ChunkAreas {
            out_area: at(self.layout.area_of(self.rank(), 0) + self.layout.lines_bytes),
            in_area: at(self.layout.area_of(peer, 0) + self.layout.lines_bytes),
            half_stride: self.layout.half as u64,
            flags_offset: self.layout.flags_offset as u64,
            counter: self.seq_counter.raw_ptr(),
            failed: at(self.layout.flag(self.rank())),
            broken: at(self.layout.broken()),
        }
    }

    /// Every rank's `input` in rank order into `output` (of `world` times `input`'s length),
    /// on every rank, ordered after the work queued on `stream`.
    pub fn all_gather<T: Element>(
        &mut self,
        input: &DeviceView<'_, T>,
        output: &mut DeviceViewMut<'_, T>,
        stream: &Stream,
    ) -> Result<()> {
        self.split_apart(input, output, stream, Split::Gather)
    }

    /// Every rank's `input` (of `world` times `output`'s length) reduced with `op`, and this
    /// rank's share of the result in `output`: `output = op over ranks of input[rank's part]`,
    /// ordered after the work queued on `stream`.
    pub fn reduce_scatter<T: Element>(
        &mut self,
        input: &DeviceView<'_, T>,
        output: &mut DeviceViewMut<'_, T>,
        stream: &Stream,
        op: ReduceOp,
    ) -> Result<()> {
        self.split_apart(input, output, stream, Split::Scatter(op))
    }

    /// An all-gather or reduce-scatter whose input and output lie apart: the whole (`world`
    /// parts) is the gather's output and the scatter's input, the part the other.
    fn split_apart<T: Element>(
        &mut self,
        input: &DeviceView<'_, T>,
        output: &mut DeviceViewMut<'_, T>,
        stream: &Stream,
        how: Split,
    ) -> Result<()> {
        self.check_call(stream, &[("input", input.device()), ("output", output.device())])?;
        let (whole_name, (whole, whole_len), (part, part_len)) = match how {
            Split::Gather => ("output", (output.raw_ptr(), output.len()), (input.raw_ptr(), input.len())),
            Split::Scatter(_) => ("input", (input.raw_ptr(), input.len()), (output.raw_ptr(), output.len())),
        };
        self.check_lengths(whole_name, whole_len, part_len * self.world())?;
        if part_len == 0 {
            return Ok(());
        }
        check_apart(input.byte_range(), output.byte_range())?;
        let transfer = self.split::<T>(whole, Some(part), part_len, how);
        self.enqueue(stream, transfer, |point| {
            input.note_use(point);
            output.note_use(point);
        })
    }

    /// [`Communicator::all_gather`] in place: `buf` holds `world` parts, this rank's input in
    /// part `rank`; afterwards every part holds its rank's input (NCCL's in-place form,
    /// where the input is the output's own part).
    pub fn all_gather_in_place<T: Element>(&mut self, buf: &mut DeviceViewMut<'_, T>, stream: &Stream) -> Result<()> {
        self.split_in_place(buf, stream, Split::Gather)
    }

    /// [`Communicator::reduce_scatter`] in place: `buf` holds `world` parts; afterwards part
    /// `rank` holds `op` over every rank's part `rank` (the other parts are left as they
    /// were). NCCL's in-place form, where the output is the input's own part.
    pub fn reduce_scatter_in_place<T: Element>(
        &mut self,
        buf: &mut DeviceViewMut<'_, T>,
        stream: &Stream,
        op: ReduceOp,
    ) -> Result<()> {
        self.split_in_place(buf, stream, Split::Scatter(op))
    }

    fn split_in_place<T: Element>(
        &mut self,
        buf: &mut DeviceViewMut<'_, T>,
        stream: &Stream,
        how: Split,
    ) -> Result<()> {
        self.check_call(stream, &[("buf", buf.device())])?;
        let len = self.part_len("buf", buf.len())?;
        if len == 0 {
            return Ok(());
        }
        let transfer = self.split::<T>(buf.raw_ptr(), None, len, how);
        self.enqueue(stream, transfer, |point| buf.note_use(point))
    }

    /// The transfer of an all-gather or reduce-scatter over `whole`, two parts of `len`
    /// elements (the gather's output, the scatter's input), and `part`, this rank's separate
    /// part (the gather's input, the scatter's output), or `None` in place (this rank's part
    /// of `whole`). A gather sends this rank's part and copies the peer's in; a scatter sends
    /// the peer's part and folds the peer's copy of this rank's part into it.
    fn split<T: Element>(&self, whole: RawDevicePtr, part: Option<RawDevicePtr>, len: usize, how: Split) -> Transfer {
        let bytes = len * size_of::<T>();
        let at = |index: usize| whole + (index * bytes) as u64;
        let (own, peer) = (at(self.rank()), at(1 - self.rank()));
        let mine = part.unwrap_or(own);
        let (send, receive, local) = match how {
            Split::Gather => (mine, (peer, Landing::Copy), (own, mine)),
            Split::Scatter(op) => (peer, (mine, Landing::Fold { op, divide_by: self.divisor(op) }), (mine, own)),
        };
        // In place, this rank's part is where it belongs already.
        let local = part.map(|_| (local.0, local.1, bytes));
        Transfer { bytes, dtype: T::DTYPE, send: Some(send), receive: Some(receive), local }
    }

    /// What a reduction's last step divides by: the world size for avg, else 1.
    fn divisor(&self, op: ReduceOp) -> u32 {
        if op == ReduceOp::Avg { self.world() as u32 } else { 1 }
    }

    /// The length of one of `world` equal parts of a buffer of `len` elements.
    fn part_len(&self, what: &'static str, len: usize) -> Result<usize> {
        let part = len / self.world();
        self.check_lengths(what, len, part * self.world())?;
        Ok(part)
    }

    /// `buf` of rank `root` into `buf` of every rank, ordered after the work queued on
    /// `stream`.
    pub fn broadcast<T: Element>(
        &mut self,
        buf: &mut DeviceViewMut<'_, T>,
        stream: &Stream,
        root: usize,
    ) -> Result<()> {
        self.check_call(stream, &[("buf", buf.device())])?;
        if root >= self.world() {
            return Err(Error::Rank { rank: root, world: self.world() });
        }
        let sends = root == self.rank();
        self.one_way(stream, (buf.raw_ptr(), buf.bytes(), T::DTYPE), sends, |point| buf.note_use(point))
    }

    /// Send `buf` to rank `peer`, which makes the matching [`Communicator::recv`] of the same
    /// length and type; ordered after the work queued on `stream`, and `buf` may be written
    /// by work queued there afterwards. Every rank makes its sends and receives, and its
    /// collectives, in the same order as its peer: a send pairs with the peer's call at the
    /// same place in its sequence.
    pub fn send<T: Element>(&mut self, buf: &DeviceView<'_, T>, stream: &Stream, peer: usize) -> Result<()> {
        self.check_call(stream, &[("buf", buf.device())])?;
        self.check_peer(peer)?;
        self.one_way(stream, (buf.raw_ptr(), buf.bytes(), T::DTYPE), true, |point| buf.note_use(point))
    }

    /// Receive into `buf` what rank `peer` sends with [`Communicator::send`]; ordered after
    /// the work queued on `stream`, and later work there sees it.
    pub fn recv<T: Element>(&mut self, buf: &mut DeviceViewMut<'_, T>, stream: &Stream, peer: usize) -> Result<()> {
        self.check_call(stream, &[("buf", buf.device())])?;
        self.check_peer(peer)?;
        self.one_way(stream, (buf.raw_ptr(), buf.bytes(), T::DTYPE), false, |point| buf.note_use(point))
    }

    /// A checked one-way call (broadcast, send, recv) through the pipeline: this rank sends
    /// the `bytes` at `ptr` when `sends`, else lands the peer's there. Nothing is enqueued
    /// for zero bytes, on either rank.
    fn one_way(
        &mut self,
        stream: &Stream,
        (ptr, bytes, dtype): (RawDevicePtr, usize, DType),
        sends: bool,
        note: impl FnOnce(&StreamPoint),
    ) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        let (send, receive) = if sends { (Some(ptr), None) } else { (None, Some((ptr, Landing::Copy))) };
        self.enqueue(stream, Transfer { bytes, dtype, send, receive, local: None }, note)
    }

    /// Refuses a peer outside the world, or this rank itself.
    fn check_peer(&self, peer: usize) -> Result<()> {
        if peer >= self.world() || peer == self.rank() {
            return Err(Error::Peer { peer, rank: self.rank(), world: self.world() });
        }
        Ok(())
    }

    /// The checks every collective makes first: built for this world, no earlier failure,
    /// `stream` and every buffer on this rank's device, no graph capture.
    fn check_call(&mut self, stream: &Stream, buffers: &[(&'static str, &Device)]) -> Result<()> {
        if self.world() != 2 {
            return Err(Error::NotBuiltYet {
                what: format!("collectives over {} ranks", self.world()),
                supported: "the collectives of two ranks",
            });
        }
        self.take_failure()?;
        for &(what, got) in buffers.iter().chain([&("stream", stream.device())]) {
            if got != &self.device {
                return Err(Error::WrongDevice { what, got: got.ordinal(), expected: self.device.ordinal() });
            }
        }
        if self.capture == Capture::Refused && stream.is_capturing()? {
            return Err(Error::CaptureRefused);
        }
        Ok(())
    }

    fn check_lengths(&self, what: &'static str, got: usize, expected: usize) -> Result<()> {
        if got != expected {
            return Err(Error::LengthMismatch { what, got, expected, world: self.world() });
        }
        Ok(())
    }

    /// Run a checked call: ordered after this rank's previous one on `stream`, `launch`
    /// enqueues it, and the point after it (reserved before the launch, so that nothing
    /// after the launch may wait for the device: see `gp2p_cuda::ReservedPoint`) goes to
    /// `note` (the caller's views), the registration and the counter, also when the launch
    /// failed part-way (what was enqueued still runs). Any error marks the communicator
    /// broken: the ranks' calls may no longer pair up. A call on a stream capturing a graph
    /// is ordered and noted by nobody: the graph's launches are ordered by the caller, and
    /// the communicator keeps its memory for the process's life.
    fn call(
        &mut self,
        stream: &Stream,
        launch: impl FnOnce(&mut Self) -> Result<()>,
        note: impl FnOnce(&StreamPoint),
    ) -> Result<()> {
        let result = self.framed(stream, launch, note);
        if result.is_err() {
            self.fail(stream);
        }
        result
    }

    fn framed(
        &mut self,
        stream: &Stream,
        launch: impl FnOnce(&mut Self) -> Result<()>,
        note: impl FnOnce(&StreamPoint),
    ) -> Result<()> {
        self.calls += 1;
        if self.capture != Capture::Refused && stream.is_capturing()? {
            self.capture = Capture::Used;
            return launch(self);
        }
        if let Some(last) = &self.last {
            stream.wait_point(last)?;
        }
        let reserved = stream.reserve_point()?;
        let launched = launch(self);
        let point = stream.point_from(reserved)?;
        note(&point);
        self.registration.uses().note(&point);
        self.seq_counter.view(..).note_use(&point);
        self.last = Some(point);
        launched
    }

    /// Enqueue a checked call's pipeline on `stream` (see [`Communicator::call`]).
    fn enqueue(&mut self, stream: &Stream, transfer: Transfer, note: impl FnOnce(&StreamPoint)) -> Result<()> {
        let launch = |comm: &mut Self| {
            let side = RankSide {
                staging: Staging {
                    device: comm.staging,
                    host: comm.registration.host_ptr().wrapping_add(comm.segment.staging_offset()),
                },
                layout: &comm.layout,
                rank: comm.rank(),
                timeout_ns: comm.timeout_ns(),
            };
            // SAFETY: the caller checked that every range of the transfer is device memory of
            // this rank's device with the call's lengths, apart where they must be; the views
            // they came from note the point `call` takes, and the registration notes it too,
            // so all stay allocated until the work completes (captured: the caller keeps the
            // buffers, and the communicator its registration, for every launch). The staging
            // addresses are this process's mappings of the registered area laid out as
            // `layout`. The peer makes the same call.
            unsafe { comm.pipeline.run(stream, side, transfer) }
        };
        self.call(stream, launch, note)
    }

    /// After an error part-way through a call on `stream`: every later call on every rank
    /// fails, and the waits of this call and later ones stop instead of running to their
    /// timeout (they read the segment's word). The word is written in `stream`'s order,
    /// after what the failed call enqueued: calls that already returned Ok and are still
    /// running would stop at it too, leaving their buffers partly folded. Where that cannot
    /// be enqueued (a broken context, a stream capturing a graph, which would replay it), the
    /// host writes it at once.
    fn fail(&mut self, stream: &Stream) {
        self.broken = true;
        let ordered = matches!(stream.is_capturing(), Ok(false))
            && stream
                .reserve_point()
                .and_then(|reserved| {
                    // SAFETY: the communicator's word in the registered area, 4-byte aligned;
                    // the registration notes the point taken after the write (or, should that
                    // fail, the stream was waited for), so it stays mapped until the write.
                    unsafe { write_flag(stream, self.staging + self.layout.broken() as u64, 1)? };
                    stream.point_from(reserved)
                })
                .map(|point| {
                    self.registration.uses().note(&point);
                    self.last = Some(point);
                })
                .is_ok();
        if !ordered && let Ok(shared) = self.word(BROKEN) {
            shared.store(1, Ordering::Release);
        }
    }

    fn timeout_ns(&self) -> u64 {
        u64::try_from(self.timeout.as_nanos()).unwrap_or(u64::MAX)
    }

    /// Fail if a wait of an earlier call, on any rank, gave up on its peer (then every call
    /// fails: the ranks' calls may no longer pair up). Calls check this themselves; launches
    /// of captured graphs do not, so call it once a graph's launches are synchronised.
    pub fn check(&mut self) -> Result<()> {
        self.take_failure()
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

/// Refuses an input and output that share memory (the collectives that take both read one
/// while they write the other).
fn check_apart(input: std::ops::Range<u64>, output: std::ops::Range<u64>) -> Result<()> {
    if gp2p_cuda::byte_ranges_overlap(&input, &output) {
        return Err(Error::Overlap { input, output });
    }
    Ok(())
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
            "Communicator(rank {} of {} on device {}, segment {}, {} calls)",
            self.rank(),
            self.world(),
            self.device.ordinal(),
            self.segment.name(),
            self.calls
        )
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        if self.capture == Capture::Used {
            // A captured graph may still be launched: its staging and counter stay, unfreed.
            return;
        }
        // SAFETY: dropped once, here, and not used again; the lifetime rule defers the actual
        // release until the GPU work of every call is done.
        unsafe {
            ManuallyDrop::drop(&mut self.registration);
            ManuallyDrop::drop(&mut self.seq_counter);
        }
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
    let options = |rank: usize| -> Result<[&AtomicU32; OPTION_WORDS]> {
        let at = |i: usize| word(segment, layout.flag(rank) + OPTIONS + 4 * i);
        Ok([at(0)?, at(1)?, at(2)?, at(3)?])
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

#[cfg(test)]
mod tests {
    use super::*;

    fn small(small_max_bytes: usize) -> CommOptions {
        CommOptions { small_max_bytes, ..CommOptions::default() }
    }

    #[test]
    fn the_layout_keeps_flags_and_lines_apart_and_aligned() {
        let layout = Layout::new(2, &small(64 << 10)).unwrap();
        assert_eq!(layout.lines_bytes, 4 << 10, "lines for 2 KiB: half data");
        assert_eq!(layout.half, (4 << 10) + (64 << 10) + 16 * 64, "lines, data, then a flag line per 4 KiB chunk");
        assert_eq!(layout.flags_offset, 64 << 10);
        assert_eq!(Layout::new(2, &small(100)).unwrap().lines_bytes, 256, "lines for the one-kernel size only");
        assert_eq!(layout.small_max, 64 << 10);
        assert_eq!(layout.areas % LINES_ALIGN, 0);
        assert!(layout.flag(1) + OPTIONS + 4 * OPTION_WORDS <= layout.full(0, 0), "options end before the chunk flags");
        assert!(layout.full(1, layout.slot_count - 1) + 4 <= layout.areas);
        assert_eq!(layout.area_of(0, 1), layout.areas + layout.half, "odd calls use the second half");
        assert_eq!(layout.area_of(1, 2), layout.areas + 2 * layout.half);
        assert!(layout.staging_bytes() >= layout.area_of(1, 1) + layout.half);
        assert_eq!(layout.staging_bytes() % crate::STAGING_ALIGN, 0, "ends on a page boundary");
        for rank in 0..2 {
            assert_eq!(layout.flag(rank) % 64, 0);
            assert_eq!(layout.area_of(rank, 7) % 256, 0);
        }
        assert_eq!(Layout::new(2, &small(1)).unwrap().half, 512, "an aligned block of lines, one of chunks");
        for (name, layout) in
            [("0 bytes", Layout::new(2, &small(0))), ("1 << 61 bytes", Layout::new(2, &small(1 << 61)))]
        {
            assert!(matches!(layout, Err(Error::InvalidOption { name: "small_max_bytes", .. })), "{name}");
        }
        assert!(matches!(Layout::new(0, &small(1024)), Err(Error::World { .. })));
        assert!(matches!(Layout::new(crate::MAX_WORLD + 1, &small(1024)), Err(Error::World { .. })));
    }

    #[test]
    fn the_line_kernels_size_sets_its_lines_and_is_compared_between_ranks() {
        let lines = |lines_max_bytes: usize, small_max_bytes: usize| {
            Layout::new(2, &CommOptions { lines_max_bytes, small_max_bytes, ..CommOptions::default() })
        };
        let wide = lines(16 << 10, 64 << 10).unwrap();
        assert_eq!((wide.lines_max, wide.lines_bytes), (16 << 10, 32 << 10), "lines for 16 KiB: half data");
        assert_eq!(wide.half, (32 << 10) + (64 << 10) + 16 * 64, "the chunks follow the wider lines");
        assert_eq!(wide.options()[3], 16 << 10, "published beside the other options");
        assert_ne!(wide.options(), lines(2 << 10, 64 << 10).unwrap().options(), "a different size is a mismatch");
        let capped = lines(64 << 10, 4 << 10).unwrap();
        assert_eq!((capped.lines_max, capped.lines_bytes), (4 << 10, 8 << 10), "no lines past the one-kernel size");
        let none = lines(0, 64 << 10).unwrap();
        assert_eq!((none.lines_max, none.lines_bytes), (0, 0), "0: every small call takes the chunks");
        assert!(matches!(lines((64 << 10) + 1, 4 << 20), Err(Error::InvalidOption { name: "lines_max_bytes", .. })));
        assert_eq!(CommOptions::default().lines_max_bytes, 2 << 10);
    }

    #[test]
    fn every_flag_and_slot_has_its_own_aligned_place_after_the_areas() {
        let options = CommOptions { slot_bytes: 1 << 20, slots: 3, ..CommOptions::default() };
        let layout = Layout::new(2, &options).unwrap();
        let mut flags = Vec::new();
        let mut slots = Vec::new();
        for rank in 0..2 {
            for slot in 0..3 {
                flags.push(layout.full(rank, slot));
                slots.push(layout.slot(rank, slot));
            }
        }
        let (flag_count, slot_count) = (flags.len(), slots.len());
        flags.sort_unstable();
        flags.dedup();
        slots.sort_unstable();
        slots.dedup();
        assert_eq!((flags.len(), slots.len()), (flag_count, slot_count), "no two share a place");
        assert!(
            flags
                .iter()
                .all(|f| f % 4 == 0 && *f >= layout.flag(1) + OPTIONS + 4 * OPTION_WORDS && f + 4 <= layout.areas)
        );
        assert!(slots.windows(2).all(|w| w[1] - w[0] >= options.slot_bytes), "slots do not overlap");
        assert!(slots.iter().all(|s| s % LINES_ALIGN == 0 && *s >= layout.area_of(1, 1) + layout.half));
        assert!(layout.slot(1, 2) + options.slot_bytes <= layout.staging_bytes());
        assert_eq!(layout.staging_bytes() % crate::STAGING_ALIGN, 0);
    }

    #[test]
    fn slot_options_out_of_range_are_refused_by_name() {
        for (slot_bytes, slots, name) in [
            (4096, 3, "slot_bytes"),
            ((64 << 10) + 1, 3, "slot_bytes"),
            (512 << 20, 3, "slot_bytes"),
            (1 << 20, 1, "slots"),
            (1 << 20, 17, "slots"),
        ] {
            let options = CommOptions { slot_bytes, slots, ..CommOptions::default() };
            match Layout::new(2, &options) {
                Err(Error::InvalidOption { name: got, .. }) => assert_eq!(got, name, "{slot_bytes} x {slots}"),
                other => panic!("{slot_bytes} x {slots}: {other:?}"),
            }
        }
        let options = CommOptions { slot_bytes: 64 << 10, slots: 16, ..CommOptions::default() };
        assert!(Layout::new(2, &options).is_ok(), "the bounds themselves are taken");
    }

    #[test]
    fn chunk_grids_take_a_block_per_chunk_up_to_32_then_4_chunks_a_block_up_to_64_then_8() {
        let kib = 1 << 10;
        assert_eq!(chunk_grid(4 * kib, DEFAULT_CHUNK_BLOCKS), 1);
        assert_eq!(chunk_grid(128 * kib, DEFAULT_CHUNK_BLOCKS), 32, "one chunk a block");
        assert_eq!(chunk_grid(256 * kib, DEFAULT_CHUNK_BLOCKS), 32, "two a block");
        assert_eq!(chunk_grid(512 * kib, DEFAULT_CHUNK_BLOCKS), 32, "four a block");
        assert_eq!(chunk_grid(1 << 20, DEFAULT_CHUNK_BLOCKS), 64, "1 MiB: 4 chunks a block");
        assert_eq!(chunk_grid(2 << 20, DEFAULT_CHUNK_BLOCKS), 64);
        assert_eq!(chunk_grid(3 << 20, DEFAULT_CHUNK_BLOCKS), 96, "8 chunks a block");
        assert_eq!(chunk_grid(4 << 20, DEFAULT_CHUNK_BLOCKS), 128);
        assert_eq!(chunk_grid(16 << 20, DEFAULT_CHUNK_BLOCKS), 128, "the default cap");
        assert_eq!(chunk_grid(16 << 20, 256), 256);
        assert_eq!(chunk_grid(1 << 20, 16), 16, "a smaller cap wins");
        for bytes in (1..=4096).map(|k| k * kib) {
            let blocks = chunk_grid(bytes, 256);
            let chunks = bytes.div_ceil(4 * kib);
            assert!(blocks >= 1 && blocks <= chunks, "{bytes}: {blocks} blocks for {chunks} chunks");
            assert!(blocks <= 32 || chunks >= 4 * blocks, "{bytes}: {blocks} blocks for {chunks} chunks");
            assert!(blocks <= 64 || chunks >= 8 * blocks, "{bytes}: {blocks} blocks for {chunks} chunks");
        }
    }

    #[test]
    fn chunk_blocks_outside_one_to_the_kernels_cap_are_refused_by_name() {
        for chunk_blocks in [0, CHUNK_MAX_BLOCKS + 1] {
            let options = CommOptions { chunk_blocks, ..CommOptions::default() };
            match Layout::new(2, &options) {
                Err(Error::InvalidOption { name, reason }) => {
                    assert_eq!(name, "chunk_blocks");
                    assert!(reason.contains(&chunk_blocks.to_string()), "{reason}");
                }
                other => panic!("{chunk_blocks}: {other:?}"),
            }
        }
        for chunk_blocks in [1, CHUNK_MAX_BLOCKS] {
            assert!(Layout::new(2, &CommOptions { chunk_blocks, ..CommOptions::default() }).is_ok());
        }
    }
}
