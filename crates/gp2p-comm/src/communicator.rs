//! `Communicator`: one rank of a group of processes, one GPU each, that share a [`Segment`]
//! registered with the driver. Among more than two ranks see the `rounds` module; between two,
//! the small all-reduce is one kernel per rank. Up to
//! [`CommOptions::lines_max_bytes`] (2 KiB by default) it writes its buffer into its lines of
//! the segment, each 8-byte line carrying 4 bytes of data and the call's sequence number
//! (NCCL's LL idea); above, it stores the buffer in 4 KiB chunks and flags each with the
//! number (see `gp2p_kernels::chunks_kernel_name`). It folds the peer's data in as it arrives.
//! Every other call goes through the staged pipeline of [`crate::pipeline`].
#![allow(unsafe_code)]

use std::sync::Arc;
use std::sync::atomic::AtomicU32;
use std::time::Duration;

use std::mem::ManuallyDrop;

use gp2p_collectives::Receive;
use gp2p_collectives::cost::Algorithm;
use gp2p_cuda::raw::{
    ChunkAreas, ChunkWaits, ExchangeLines, InOut, ManyLines, Numbering, exchange, exchange_many, plan_exchange_chunks,
};
use gp2p_cuda::{
    Device, DeviceBuffer, DeviceView, DeviceViewMut, HostRegistration, LaunchCache, RawDevicePtr, Stream, StreamPoint,
};
use gp2p_kernels::{DType, Element, ReduceOp};

use crate::choice::{self, AllReducePaths, ManyChoice, ManyPath};
use crate::layout::{CommOptions, FlagWaits, Layout, chunk_grid};
use crate::pipeline::{Landing, ManyTransfer, Pipeline, RankSide, SlotWaits, Staging, Traced, Transfer, Waits};
use crate::registration::{all_registered, register_in_turn};
use crate::rounds::Rounds;
use crate::{Error, Result, Segment, UniqueId};

mod all_reduce;
mod by_sum;
mod compressed;
mod failure;
mod host;
mod point_to_point;
mod shm_fit;
mod split;
mod timeline;
mod watchdog;

pub use host::Control;

/// The longest peer timeout taken (the kernel adds it to a nanosecond clock).
const MAX_PEER_TIMEOUT: Duration = Duration::from_secs(3600);

/// One rank of a one-process-per-GPU communicator on this host.
///
/// Made by every rank with the same [`UniqueId`] (one rank makes it and the caller hands it
/// to the others, as with NCCL) and the same world size and options. Creation waits, on the
/// host, for every rank to join and register the shared segment (one rank at a time); after
/// that nothing on the host waits for another process: each call is enqueued on the
/// caller's stream, and its waits for the peer run on the GPU, each bounded by
/// [`CommOptions::peer_timeout`].
///
/// Two paths: an all-reduce of at most [`Communicator::small_max_bytes`] (the option's size, or
/// possibly less between two ranks on one GPU, for a room over 4 MiB) is one kernel per
/// rank that hands its buffer over in mapped host memory (8-byte lines of data and number up
/// to [`CommOptions::lines_max_bytes`], flagged 4 KiB chunks above), numbered in device
/// memory; everything else goes through a pipeline of DMA copies via slots of the segment,
/// flagged chunk by chunk (see the `pipeline` module). Among more than two ranks (up to
/// [`crate::MAX_RANKS`]) the one kernel is the line kernel reading every rank's lines, and
/// everything above it the rounds of the `rounds` module.
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
    /// Where chunks land by DMA before their fold, a slot's size, used only by the
    /// pipeline's receive stream ([`Receive::Scratch`], and [`Receive::Auto`] for landings
    /// above [`crate::ZERO_COPY_MAX_LANDING`]); None where folds read the slots in place.
    /// Noted and kept as the counter is.
    scratch: ManuallyDrop<Option<DeviceBuffer<u8>>>,
    /// How this rank lands chunks to fold, as resolved at creation.
    receive: Receive,
    /// The staging area's start as this device maps it.
    staging: RawDevicePtr,
    layout: Layout,
    /// Calls made, for `Debug`.
    calls: u64,
    pipeline: Pipeline,
    timeout: Duration,
    /// [`CommOptions::waits`].
    waits: FlagWaits,
    /// Where the waits are watched, the thread that ends them (see `watchdog`); told to stop
    /// when dropped, it goes on until every wait enqueued has ended.
    _watchdog: Option<watchdog::Watchdog>,
    /// The number each lane's last watched wait took, shared with the watchdog.
    numbers: Arc<[AtomicU32; 2]>,
    /// [`CommOptions::chunk_blocks`].
    chunk_blocks: usize,
    /// Among more than two ranks, which all-reduce a size takes (the cost model's choice,
    /// priced with the rates measured on H200s, or the forced one).
    many: ManyChoice,
    /// The end of this rank's last call, for a call on another stream to wait for.
    last: Option<StreamPoint>,
    /// Once a call gave up waiting, the ranks' calls may no longer pair up: every later call
    /// fails instead of pairing with the wrong peer call.
    broken: bool,
    capture: Capture,
    /// The small path's kernels, replayed from graphs (a launch costs the host twice a
    /// replay's time). Its launches are this rank's calls, which run one after another. None
    /// where a peer rank lives in this process (on this device or another: the segment does
    /// not say which), which then launches plainly and makes no graphs: four ranks as threads
    /// on one device hung with two of them inside `cuGraphInstantiate` while the others'
    /// kernels, running in the same context, waited for theirs.
    launches: Option<LaunchCache>,
    /// What other threads may do without this communicator's lock (host exchanges, abort).
    control: Control,
    /// The compressed all-reduce's wires, kept between calls (see the `compressed` module);
    /// kept like `registration` once a call was captured.
    wires: Option<DeviceBuffer<u8>>,
    /// Which all-reduces `all_reduce` sends compressed (see the `compression` module).
    compress: Option<crate::compression::Resolved>,
    /// Where a small reduce-scatter's one all-reduce kernel writes (see the `by_sum` module):
    /// made with the communicator, as large as such a call gets, so every rank has it; kept
    /// like the wires once a call was captured.
    sums: Option<DeviceBuffer<u8>>,
    /// Where calls stamp their steps while a timeline is on (see the `timeline` module).
    timeline: Option<gp2p_cuda::Timeline>,
    /// Whether the call being enqueued stamps its steps: a timeline is on and the call is
    /// not being captured.
    marking: bool,
    /// Whether the two ranks share one device, hence one link (`AllReducePaths::shared_link`).
    shared_link: bool,
    /// The largest all-reduce run as one kernel: the layout's room for it, or less between two
    /// ranks on one link ([`AllReducePaths::one_kernel_max`]).
    one_kernel_max: usize,
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
        // Resolved before the layout, which every rank compares: the forced algorithm too.
        let options = CommOptions {
            algorithm: choice::forced(options.algorithm, env(crate::ALGORITHM_VAR).as_deref())?,
            ..options
        }
        .with_many_chunks_from(world, env(crate::MANY_CHUNKS_VAR).as_deref())?;
        let env_compress = env(crate::COMPRESS_VAR);
        let (options, compress) = shm_fit::settle(options, world, env_compress.as_deref(), shm_fit::shm_bytes())?;
        let receive = crate::receive::resolve(options.receive, env(crate::RECEIVE_VAR).as_deref())?;
        let mut layout = Layout::new(world, &options)?;
        layout.compress = crate::compression::Resolved::option_words(compress);
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
        let slot_waits = SlotWaits::resolve(env(crate::SLOT_WAITS_VAR).as_deref())?;
        let mut pipeline = Pipeline::new(device, options.slots, slot_waits)?;
        let replay_calls = crate::replay::resolve(options.replay_calls, env(crate::REPLAY_VAR).as_deref())?;
        watchdog::refuse_replays(options.waits, replay_calls)?;
        // The call count and the kernels' ticket (see gp2p_kernels::chunks_kernel_name), zero
        // before any kernel can read them.
        let seq_counter = DeviceBuffer::<u32>::zeroed(device, 2)?;
        // None where every landing (at most a slot) is folded in place: zero-copy, or auto with
        // slots of at most its in-place limit.
        let scratch = if crate::receive::needs_scratch(receive, layout.slot_bytes()) {
            Some(DeviceBuffer::<u8>::alloc(device, layout.slot_bytes())?)
        } else {
            None
        };
        let sums = match Self::largest_by_sum(world, &layout) {
            0 => None,
            bytes => Some(DeviceBuffer::<u8>::alloc(device, bytes)?),
        };
        let segment = Arc::new(Segment::join(id, rank, world, layout.staging_bytes(), options.join_timeout)?);
        if options.waits == FlagWaits::Watched {
            // Before this rank registers: no rank calls before every rank has.
            watchdog::set_own_flags_empty(&segment, &layout, rank)?;
        }
        let registered =
            register_in_turn(&segment, device, options.join_timeout).and_then(|r| Ok((r.device_ptr(device)?, r)));
        let everyone = all_registered(&segment, &layout, registered.is_ok(), options.join_timeout);
        // This rank's own failure first: it says why, where a peer's can only say who.
        let (base, registration) = registered?;
        everyone?;
        // Every rank has joined, so every slot names its process.
        let peers_in_this_process = segment.peers_share_this_process();
        if options.waits.by_stream() && peers_in_this_process {
            return Err(Error::InvalidOption {
                name: "waits",
                reason: format!(
                    "{}: ranks of this communicator are threads of one process, whose streams may share a hardware \
                     queue, where a stream memory wait holds up the work behind it, which may be what would end it; \
                     run a process per rank, or take FlagWaits::Kernel",
                    options.waits.name()
                ),
            });
        }
        let numbers = Arc::new([AtomicU32::new(0), AtomicU32::new(0)]);
        let watchdog = match options.waits {
            FlagWaits::Watched => Some(watchdog::Watchdog::start(
                Arc::clone(&segment),
                &layout,
                rank,
                options.peer_timeout,
                Arc::clone(&numbers),
            )?),
            _ => None,
        };
        if replay_calls && !peers_in_this_process {
            pipeline.replay_calls(device)?;
        }
        let segment_for_control = Arc::clone(&segment);
        let mut comm = Communicator {
            device: device.clone(),
            staging: base + segment.staging_offset() as u64,
            segment,
            registration: ManuallyDrop::new(registration),
            seq_counter: ManuallyDrop::new(seq_counter),
            scratch: ManuallyDrop::new(scratch),
            receive,
            layout,
            calls: 0,
            pipeline,
            timeout: options.peer_timeout,
            waits: options.waits,
            _watchdog: watchdog,
            numbers,
            chunk_blocks: options.chunk_blocks,
            many: layout.many_choice(options.algorithm),
            last: None,
            broken: false,
            capture: Capture::Refused,
            launches: (!peers_in_this_process).then(|| LaunchCache::new(device)),
            control: Control::new(Arc::clone(&segment_for_control), options.join_timeout),
            wires: None,
            compress,
            sums,
            timeline: None,
            marking: false,
            shared_link: false,
            one_kernel_max: layout.small_max,
        };
        comm.learn_device_sharing()?;
        // Every rank alike: the same rates, options and sharing (agreed just above).
        comm.one_kernel_max = comm.all_reduce_paths().one_kernel_max();
        Ok(comm)
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

    /// Bytes of one slot of this rank's pipeline, as made: [`CommOptions::slot_bytes`], or
    /// where that is the default, larger between two ranks that compress and smaller where
    /// /dev/shm has not the room ([`crate::fit_slot_to_shm`]).
    pub fn slot_bytes(&self) -> usize {
        self.layout.slot_bytes()
    }

    /// How this rank's pipeline waits for its peers' flags ([`CommOptions::waits`]).
    pub fn waits(&self) -> FlagWaits {
        self.waits
    }

    /// Slots per rank of this rank's pipeline, as made: [`CommOptions::slots`], or three where
    /// the default four of the default size had not the room in /dev/shm.
    pub fn slots(&self) -> usize {
        self.layout.slot_count
    }

    /// How many ranks there are.
    pub fn world(&self) -> usize {
        self.segment.world()
    }

    /// How this rank folds the chunks that land in its slots ([`CommOptions::receive`] as
    /// resolved at creation, `GP2P_RECEIVE` included): [`Receive::Scratch`],
    /// [`Receive::ZeroCopy`], or [`Receive::Auto`], which folds landings of at most
    /// [`crate::ZERO_COPY_MAX_LANDING`] in place and copies larger ones into the scratch
    /// first. [`crate::describe_receive`] says it in words.
    pub fn receive(&self) -> Receive {
        self.receive
    }

    /// How this rank's pipeline calls ran where they replay from CUDA graphs
    /// ([`CommOptions::replay_calls`] as resolved at creation, off where a peer rank is a
    /// thread of this process): replayed, captured, enqueued, and failed captures with the
    /// first one's error. None where they do not replay.
    pub fn replay_counts(&self) -> Option<crate::ReplayCounts> {
        self.pipeline.replay_counts()
    }

    /// The all-reduce forced by [`CommOptions::algorithm`] or `GP2P_ALGORITHM`, if any.
    pub fn forced_algorithm(&self) -> Option<Algorithm> {
        self.many.forced
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
    /// ones go through the pipeline. [`CommOptions::small_max_bytes`], except between two
    /// ranks that share one device (one link), where the cost model's crossover with the
    /// rounds may stop it sooner ([`AllReducePaths::one_kernel_max`]).
    pub fn small_max_bytes(&self) -> usize {
        self.one_kernel_max
    }

    /// The largest all-reduce, in bytes, that the one-kernel path runs with its line kernel
    /// ([`CommOptions::lines_max_bytes`], at most [`Communicator::small_max_bytes`]).
    pub fn lines_max_bytes(&self) -> usize {
        self.layout.lines_max
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
        if buf.bytes() > 0 && self.by_sum(buf.bytes()) {
            let keep = if sends { 0..buf.bytes() } else { 0..0 };
            // SAFETY: `buf` is this device's; its view notes the point.
            return unsafe { self.sum_bytes(stream, (buf.raw_ptr(), buf.bytes()), keep, None, |p| buf.note_use(p)) };
        }
        if self.world() != 2 {
            let rounds = Rounds::broadcast(self.world(), buf.bytes(), root);
            return self.rounds_one_way(stream, rounds, (buf.raw_ptr(), T::DTYPE), |point| buf.note_use(point));
        }
        self.one_way(stream, (buf.raw_ptr(), buf.bytes(), T::DTYPE), sends, |point| buf.note_use(point))
    }

    /// The checks every collective makes first: built for this world, no earlier failure,
    /// `stream` and every buffer on this rank's device, no graph capture.
    fn check_call(&mut self, stream: &Stream, buffers: &[(&'static str, &Device)]) -> Result<()> {
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
        // Set again for each call (a launch that panicked may have left it set), and never
        // while capturing: the stamps of a captured call would replay after the read.
        self.marking = false;
        if self.capture != Capture::Refused && stream.is_capturing()? {
            self.capture = Capture::Used;
            return launch(self);
        }
        if let Some(last) = &self.last {
            stream.wait_point(last)?;
        }
        let reserved = stream.reserve_point()?;
        self.marking = self.timeline.is_some();
        let launched = self.mark(stream, "start", 0).and_then(|()| launch(&mut *self));
        let launched = launched.and_then(|()| self.mark(stream, "end", 0));
        self.marking = false;
        let point = stream.point_from(reserved)?;
        note(&point);
        if let Some(timeline) = &self.timeline {
            // Every stamp of the call, on any of its streams, is before this point.
            timeline.note_use(&point);
        }
        self.registration.uses().note(&point);
        self.seq_counter.view(..).note_use(&point);
        if let Some(scratch) = self.scratch.as_ref() {
            scratch.view(..).note_use(&point);
        }
        if let Some(sums) = self.sums.as_ref() {
            sums.view(..).note_use(&point);
        }
        self.last = Some(point);
        launched
    }

    /// Enqueue a checked call's pipeline on `stream` (see [`Communicator::call`]).
    fn enqueue(&mut self, stream: &Stream, transfer: Transfer, note: impl FnOnce(&StreamPoint)) -> Result<()> {
        watchdog::refuse_capture(self.waits, stream)?;
        let launch = |comm: &mut Self| {
            let side = comm.side();
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

    /// Enqueue a checked call in rounds on `stream` (see [`Communicator::call`]).
    fn enqueue_many(&mut self, stream: &Stream, transfer: ManyTransfer, note: impl FnOnce(&StreamPoint)) -> Result<()> {
        watchdog::refuse_capture(self.waits, stream)?;
        let launch = |comm: &mut Self| {
            let side = comm.side();
            // SAFETY: as for `enqueue`: the caller checked every buffer of the transfer (on this
            // device, the call's lengths, apart where they must be), the views note the point
            // `call` takes and so does the registration; every rank makes the same call.
            unsafe { comm.pipeline.run_many(stream, side, &transfer) }
        };
        self.call(stream, launch, note)
    }

    /// This rank's view of the staging area, for the pipeline.
    fn side(&self) -> RankSide<'_> {
        RankSide {
            staging: Staging {
                device: self.staging,
                host: self.registration.host_ptr().wrapping_add(self.segment.staging_offset()),
            },
            layout: &self.layout,
            rank: self.rank(),
            waits: match self.waits {
                FlagWaits::Kernel => Waits::Bounded { timeout_ns: self.timeout_ns() },
                FlagWaits::Watched => Waits::Watched {
                    progress: [0, 1].map(|lane| self.staging + self.layout.progress(self.rank(), lane) as u64),
                },
                FlagWaits::Unbounded => Waits::Unbounded,
            },
            numbers: &self.numbers,
            scratch: self.scratch.as_ref().map(|s| s.raw_ptr()),
            receive: self.receive,
            // SAFETY: `marking` is set only while `framed` launches a call, and `framed` notes
            // the call's point on the timeline once the call's streams have joined.
            timeline: self.timeline.as_ref().filter(|_| self.marking).map(|t| unsafe { Traced::new(t) }),
        }
    }

    fn timeout_ns(&self) -> u64 {
        u64::try_from(self.timeout.as_nanos()).unwrap_or(u64::MAX)
    }
}

/// The value of the environment variable `name`, where set (lossily as UTF-8).
fn env(name: &str) -> Option<String> {
    std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
}

/// Refuses an input and output that share memory (the collectives that take both read one
/// while they write the other).
fn check_apart(input: std::ops::Range<u64>, output: std::ops::Range<u64>) -> Result<()> {
    if gp2p_cuda::byte_ranges_overlap(&input, &output) {
        return Err(Error::Overlap { input, output });
    }
    Ok(())
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
            // A captured graph may still be launched: its staging, counter, scratch, wires and
            // sums stay, unfreed. (No graph holds a watched wait: those calls refuse capture,
            // so the watchdog stops as for any other drop.)
            std::mem::forget(self.wires.take());
            std::mem::forget(self.sums.take());
            return;
        }
        // SAFETY: dropped once, here, and not used again; the lifetime rule defers the actual
        // release until the GPU work of every call is done.
        unsafe {
            ManuallyDrop::drop(&mut self.registration);
            ManuallyDrop::drop(&mut self.seq_counter);
            ManuallyDrop::drop(&mut self.scratch);
        }
    }
}
