//! Executing a pipeline on GPUs: each rank sends on one internal stream and receives on
//! another (so its link carries both directions). The ring's schedules go through a staging
//! ring per ring edge; the legs ([`crate::legs::steps`], the communicator's pipeline) through
//! a fan-out of slots per writer that every reader lands from. Stream points carry the
//! chunk-level dependencies — a rank forwards a chunk as soon as that chunk has arrived, not
//! when the whole step is done.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::Arc;

use gp2p_cuda::{Device, DeviceBuffer, DeviceViewMut, Stream, StreamFork, StreamPoint};
use gp2p_kernels::{Element, ReduceOp};
use gp2p_pinned::{
    ChunkExchange, DEFAULT_PEER_TIMEOUT, FanOut, Fold, LineExchange, PairExchange, PinnedBuffer, RingCache, StagingRing,
};
use gp2p_transport::plan::{Chunking, DEFAULT_SLOTS, SINGLE_CHUNK_MAX_BYTES, pipelined_chunk_bytes};
use parking_lot::Mutex;

use crate::calibrate::choose;
use crate::cost::Algorithm;
use crate::env::parse_byte_limit;
use crate::legs::steps::{Lane, LaneWaits, LegStep, chunk_range, keyed_steps};
use crate::legs::{Buf, LegLanding, Rounds};
use crate::schedule::step_divisor;
use crate::schedule::{Action, Schedule};
use crate::{Error, Receive, Result, spans_devices};

mod compressed;
mod rounds;
mod transfers;

use rounds::{check_runnable, run_legs};
use transfers::{plan_waits, run_transfers};

/// Two-rank all-reduces of up to this many bytes, between two devices, go through the line
/// exchange ([`LineExchange`]) by default: none, for now. It is experimental and opt-in
/// ([`Engine::with_line_exchange_max`]). Measured on two H200s (f32 sum, medians): 15-23 us
/// up to 4 KiB against 25-30 us for the DMA exchange, but 29 us at 8 KiB and 55-134 us from
/// 16 to 128 KiB (too few reads in flight across PCIe per polling thread). Its GPU test of
/// 300 back-to-back calls gave a wrong result once on that machine (unexplained: a kernel
/// that gives up waiting after its timeout leaves its buffer unfolded, and only the next
/// call reports it), so it stays off until that is understood. Ranks on one device never
/// take it: the two kernels must run at once, and two streams of one device may share a
/// hardware queue, which runs them one after the other.
pub const LINE_EXCHANGE_MAX_BYTES: usize = 0;

/// Two-rank all-reduces of up to this many bytes, between two devices, go through the chunk
/// exchange ([`ChunkExchange`]: one kernel per rank, flagged 4 KiB chunks of mapped host
/// memory) by default, unless the environment variable `GP2P_CHUNK_EXCHANGE_MAX_BYTES` gives
/// another limit (0 turns it off: under compute-sanitizer, which runs one kernel at a time,
/// each call would wait out the exchange's queue timeout, a minute) or
/// [`Engine::with_chunk_exchange_max`] does; either is at most
/// [`gp2p_pinned::CHUNK_EXCHANGE_LIMIT`]. See [`ChunkExchange`] for what its kernels' waits
/// for each other can cost.
/// Two H200s, `gp2p bench all-reduce --ranks 2` against NCCL's shared-memory path in the same
/// call (`benches/results/x2/run-a70c2c6-inproc-x2.txt` at fe6bbb0): 15.6-19.4 us up to 64 KiB (NCCL
/// 18.7-26.1), 26.3 at 256 KiB (43.7), 57.4 at 1 MiB (72.3), 164.1 at 4 MiB (175.3); where the
/// DMA exchange took 22.1-34.7, 41.8, 68.3 and 167.2 (run-55a8f63-inproc-x2.txt); at 8 MiB the
/// ring matches the kernel. (In another call NCCL took 12.8-15.8 us up to 32 KiB and the
/// kernel 16.2-19.3: run-b733047-inproc-x2.txt.)
pub const CHUNK_EXCHANGE_MAX_BYTES: usize = 4 << 20;

/// The environment variable that overrides [`CHUNK_EXCHANGE_MAX_BYTES`] (a byte count).
pub const CHUNK_EXCHANGE_MAX_VAR: &str = "GP2P_CHUNK_EXCHANGE_MAX_BYTES";

/// [`CHUNK_EXCHANGE_MAX_BYTES`], or the byte count in [`CHUNK_EXCHANGE_MAX_VAR`] (read once).
/// A value that is not a byte count, or is above [`gp2p_pinned::CHUNK_EXCHANGE_LIMIT`], is
/// ignored, with a note on stderr.
fn default_chunk_exchange_max() -> usize {
    static MAX: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MAX.get_or_init(|| parse_chunk_exchange_max(std::env::var(CHUNK_EXCHANGE_MAX_VAR).ok().as_deref()))
}

/// The limit a value of [`CHUNK_EXCHANGE_MAX_VAR`] sets (unset: the default).
fn parse_chunk_exchange_max(value: Option<&str>) -> usize {
    let limit = gp2p_pinned::CHUNK_EXCHANGE_LIMIT;
    parse_byte_limit(CHUNK_EXCHANGE_MAX_VAR, value, CHUNK_EXCHANGE_MAX_BYTES, limit, "0 turns the chunk exchange off")
}

/// The largest buffer the line exchange was measured to win at (see
/// [`LINE_EXCHANGE_MAX_BYTES`]), for callers that opt in.
pub const LINE_EXCHANGE_WINS_UP_TO: usize = 4 << 10;

/// Chunks of the ring pipeline between several devices are at most this big, and then a
/// ring edge has [`CACHED_SLOTS`] slots: each staged byte is written into host memory by one
/// DMA and read by another, and four such DMAs at once (two cards, both ways) outrun host
/// DRAM unless the staging footprint stays in the CPU's cache. Measured on two H200s, f32
/// all_reduce at 64 MiB / 256 MiB / 1 GiB, ratio of duplex by chunk x slots: 1 MiB x 2:
/// 0.59-0.60, 1 MiB x 4: 0.64-0.65, 2 MiB x 2: 0.73-0.74, 2 MiB x 4: 0.78-0.80, 4 MiB x 2:
/// 0.825/0.850/0.858, 4 MiB x 4: 0.80-0.83; the one-device chunking (up to 16 MiB x 4):
/// 0.70-0.76 from 256 MiB up. Later, one run of the scratch transport (b79dc4d,
/// `benches/results/x2/chunk-sync-probe-x2.txt` at d411c5d): 4 MiB x 2: 0.811/0.851/0.845, x 3:
/// 0.844/0.871/0.864, x 4: 0.833/0.869/0.830, 8 MiB x 3: 0.849/0.836/0.865 — and the
/// probe there moves 4 MiB chunks at 45.8 GB/s per direction from three slots, 43.4 from two.
pub const MULTI_DEVICE_MAX_CHUNK_BYTES: usize = 4 << 20;
/// Chunks a collective across several devices is cut into, about (up to the largest chunk).
pub const MULTI_DEVICE_TARGET_CHUNKS: usize = 16;
/// Slots per ring edge with [`MULTI_DEVICE_MAX_CHUNK_BYTES`] chunks: three, the best of the
/// counts measured above at every size (a third chunk in flight covers the handoff between
/// chunks, about 6.5 us each, without outgrowing the cache).
pub const CACHED_SLOTS: usize = 3;

/// Staging slots per ring edge: the transport's default.
const SLOTS: usize = DEFAULT_SLOTS;
/// Index of the send and the receive stream in a rank's fork.
const SEND: usize = 0;
const RECV: usize = 1;

/// One rank of a collective: its buffer and the stream the collective is ordered on.
pub struct Rank<'a, T: Element> {
    /// The rank's buffer (input and output of in-place collectives).
    pub buffer: DeviceViewMut<'a, T>,
    /// The caller's stream on the buffer's device: the collective starts after work already
    /// enqueued there, and work enqueued later sees its result.
    pub stream: &'a Stream,
}

/// What a group of ranks (an ordered list of devices) keeps between calls.
struct Group {
    forks: Vec<StreamFork>,
    /// Per rank: the staging ring of its outgoing ring edge.
    rings: Vec<RingCache>,
    /// Per rank, per use (scratch, work) and element type: a device buffer, reused while
    /// big enough. A replaced one is just dropped: the lifetime rule frees it after its work.
    buffers: Vec<BufferCache>,
    /// Two ranks only: the lines of small all-reduces, made on first use.
    lines: Option<LineExchange>,
    /// Two ranks only: the chunks of small and middling all-reduces, made on first use.
    chunks: Option<ChunkExchange>,
    /// Per rank: the slots it writes its legs' chunks through, which every other rank reads
    /// (more than two ranks), made on first use.
    fanouts: Vec<Option<FanOut>>,
    /// The compressed all-reduce's up and down wire areas, made on first use.
    wires: [Option<PinnedBuffer<u8>>; 2],
}

/// The collective engine: per group of devices, internal streams, staging rings, scratch
/// buffers and events, created on first use and reused. `Send + Sync`; calls on one group
/// are serialised.
#[derive(Default)]
pub struct Engine {
    groups: Mutex<HashMap<Vec<usize>, Arc<Mutex<Group>>>>,
    /// Per device ordinal: the receive path `Receive::Auto` measured fastest there.
    paths: Mutex<HashMap<usize, Receive>>,
    chunk_bytes: Option<usize>,
    slots: Option<usize>,
    line_max: Option<usize>,
    chunk_max: Option<usize>,
    /// Ring or two-shot, where the caller forced one ([`Engine::with_algorithm`]).
    algorithm: Option<Algorithm>,
}

impl Engine {
    /// An engine with nothing cached yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// An engine whose schedules cut buffers into chunks of `chunk_bytes` (rounded to whole,
    /// 16-byte aligned elements) instead of sizing them by the buffer: for tuning and
    /// benchmarks. Zero is refused.
    pub fn with_chunk_bytes(chunk_bytes: usize) -> Result<Self> {
        Self::with_staging(Some(chunk_bytes), None)
    }

    /// An engine with either or both of the chunk size ([`Engine::with_chunk_bytes`]) and the
    /// number of staging slots per ring edge overridden: for tuning and benchmarks. Zeros are
    /// refused.
    pub fn with_staging(chunk_bytes: Option<usize>, slots: Option<usize>) -> Result<Self> {
        Chunking::check_overrides(chunk_bytes, slots)?;
        Ok(Engine { chunk_bytes, slots, ..Self::default() })
    }

    /// This engine with two-rank all-reduces of up to `bytes` between two devices going
    /// through the one-kernel line exchange (experimental, off by default: see
    /// [`LINE_EXCHANGE_MAX_BYTES`]; [`LINE_EXCHANGE_WINS_UP_TO`] is where it was measured to
    /// win; 0 turns it off).
    pub fn with_line_exchange_max(mut self, bytes: usize) -> Self {
        self.line_max = Some(bytes);
        self
    }

    /// This engine running `algorithm` for every collective ([`Algorithm::Ring`]: the ring's
    /// transfers; [`Algorithm::TwoShot`]: the legs, [`crate::legs`]) instead of the cost
    /// model's choice ([`crate::pipeline`]) or the one the environment variable
    /// [`crate::cost::ALGORITHM_VAR`] forces. One-shot is refused: it is the
    /// one-process-per-GPU communicator's.
    pub fn with_algorithm(mut self, algorithm: Algorithm) -> Result<Self> {
        if algorithm == Algorithm::OneShot {
            return Err(Error::OneShotInProcess { forced_by: "Engine::with_algorithm" });
        }
        self.algorithm = Some(algorithm);
        Ok(self)
    }

    /// The algorithm forced on this engine: [`Engine::with_algorithm`]'s, else the
    /// environment's ([`crate::pipeline::forced_by_env`], read now: one-shot there is the
    /// communicator's and leaves the engine to the cost model); an error where the variable
    /// names no algorithm.
    pub fn forced_algorithm(&self) -> Result<Option<Algorithm>> {
        if self.algorithm.is_some() {
            return Ok(self.algorithm);
        }
        crate::pipeline::forced_by_env()
    }

    /// The largest two-rank all-reduce, in bytes, that takes the line exchange.
    pub fn line_exchange_max(&self) -> usize {
        self.line_max.unwrap_or(LINE_EXCHANGE_MAX_BYTES)
    }

    /// This engine with two-rank all-reduces of up to `bytes` between two devices going
    /// through the one-kernel chunk exchange (0 turns it off; the default is
    /// [`CHUNK_EXCHANGE_MAX_BYTES`]). Buffers small enough for the line exchange, where that
    /// is on, take it instead.
    pub fn with_chunk_exchange_max(mut self, bytes: usize) -> Self {
        self.chunk_max = Some(bytes);
        self
    }

    /// The largest two-rank all-reduce, in bytes, that takes the chunk exchange.
    pub fn chunk_exchange_max(&self) -> usize {
        self.chunk_max.unwrap_or_else(default_chunk_exchange_max)
    }

    /// How a collective of `bytes` over `devices` is staged: the chunk (the override if one
    /// was given, else for several distinct devices a cache-sized chunk of about
    /// [`MULTI_DEVICE_TARGET_CHUNKS`], at most [`MULTI_DEVICE_MAX_CHUNK_BYTES`], else the
    /// transport's chunking) and the slots per ring edge (the override, else
    /// [`CACHED_SLOTS`] for full cache-sized chunks across devices, else the transport's).
    pub fn staging_for(&self, bytes: usize, devices: &[Device]) -> Chunking {
        self.staging(bytes, spans_devices(devices))
    }

    /// [`Engine::staging_for`] for ranks on one device or (`across`) several.
    fn staging(&self, bytes: usize, across: bool) -> Chunking {
        let chunk_bytes = self.chunk_bytes.unwrap_or_else(|| match across {
            true => pipelined_chunk_bytes(bytes, MULTI_DEVICE_TARGET_CHUNKS, MULTI_DEVICE_MAX_CHUNK_BYTES),
            false => Chunking::for_bytes(bytes, None, None).chunk_bytes,
        });
        let cached = across && chunk_bytes >= MULTI_DEVICE_MAX_CHUNK_BYTES && bytes >= MULTI_DEVICE_MAX_CHUNK_BYTES;
        Chunking { chunk_bytes, slots: self.slots.unwrap_or(if cached { CACHED_SLOTS } else { SLOTS }) }
    }

    /// The chunk size given to [`Engine::with_chunk_bytes`], if any.
    pub fn chunk_bytes(&self) -> Option<usize> {
        self.chunk_bytes
    }

    /// Run `schedule` over `ranks` (in place, on `devices`, theirs in rank order) through
    /// rings of `slots` slots per edge, reducing with `op`.
    pub(crate) fn execute<T: Element>(
        &self,
        ranks: &mut [Rank<'_, T>],
        devices: &[Device],
        schedule: &Schedule,
        slots: usize,
        op: ReduceOp,
        receive: Receive,
    ) -> Result<()> {
        let n = ranks.len();
        if schedule.transfers.is_empty() {
            return Ok(());
        }
        let reduces = schedule.transfers.iter().any(|t| matches!(t.action, Action::Reduce { .. }));
        let paths = self.receive_paths(devices, receive, reduces)?;
        let group = self.group(devices)?;
        let mut group = group.lock();
        let chunk = schedule.transfers.iter().map(|t| t.range.len()).max().unwrap_or(1);
        let Group { forks, rings, buffers, .. } = &mut *group;
        // Slots fit the largest chunk, but never less than a small transfer's worth, so a
        // sweep of small collectives does not replace the rings at every size.
        let slot_bytes = (chunk * size_of::<T>()).max(SINGLE_CHUNK_MAX_BYTES);
        let mut edges: Vec<&mut StagingRing> = Vec::with_capacity(n);
        for (r, cache) in rings.iter_mut().enumerate() {
            edges.push(cache.ensure(&devices[r], &devices[(r + 1) % n], slots, slot_bytes)?);
        }
        let waits = plan_waits(schedule);
        let scratch = take_scratch::<T>(buffers, forks, devices, &paths, chunk)?;
        run_forked(ranks, forks, buffers, scratch, |ranks, forks, scratch| {
            run_transfers(ranks, schedule, &waits, op, forks, &mut edges, scratch)
        })
    }

    /// Run `rounds` (legs over every rank's buffer, in place: [`crate::legs::Buf::Main`]
    /// only) over `ranks` on `devices` through each rank's fan-out of `staging.slots` slots
    /// of its chunk (rounded up to 256 bytes, so every chunk of a page-aligned share starts
    /// aligned for any element and the kernels' vectors), reducing with `op`: the steps of
    /// [`crate::legs::steps`], the pipeline the one-process-per-GPU communicator runs, with
    /// stream points where it has flags. Every rank's steps are merged by their key, so each
    /// point is taken before anything waits for it.
    pub(crate) fn execute_rounds<T: Element>(
        &self,
        ranks: &mut [Rank<'_, T>],
        devices: &[Device],
        rounds: &Rounds,
        staging: Chunking,
        op: ReduceOp,
        receive: Receive,
    ) -> Result<()> {
        let (slot_bytes, slots) = (staging.chunk_bytes.next_multiple_of(256), staging.slots);
        if rounds.legs.is_empty() {
            return Ok(());
        }
        check_runnable(rounds)?;
        let reduces = rounds.legs.iter().any(|l| matches!(l.landing, LegLanding::Fold { .. }));
        let paths = self.receive_paths(devices, receive, reduces)?;
        let group = self.group(devices)?;
        let mut group = group.lock();
        let Group { forks, buffers, fanouts, .. } = &mut *group;
        for (w, fanout) in fanouts.iter_mut().enumerate() {
            if !fanout.as_ref().is_some_and(|f| f.fits(&devices[w], devices, slots, slot_bytes)) {
                // Never less than a small transfer's worth, so a sweep of small collectives
                // does not replace them at every size; a replaced one is dropped (its memory
                // outlives its GPU work).
                let bytes = slot_bytes.max(SINGLE_CHUNK_MAX_BYTES);
                *fanout = Some(FanOut::new(&devices[w], devices, slots, bytes)?);
            }
        }
        let mut fanouts: Vec<&mut FanOut> = fanouts.iter_mut().flatten().collect();
        let scratch = take_scratch::<T>(buffers, forks, devices, &paths, slot_bytes / size_of::<T>())?;
        run_forked(ranks, forks, buffers, scratch, |ranks, forks, scratch| {
            run_legs(ranks, rounds, slot_bytes, slots, op, forks, &mut fanouts, scratch)
        })
    }

    /// A two-rank all-reduce of a small buffer through the line exchange: one kernel per
    /// rank, on the ranks' own streams (the caller checked the two devices differ).
    pub(crate) fn exchange_lines<T: Element>(
        &self,
        ranks: &mut [Rank<'_, T>],
        devices: &[Device],
        op: ReduceOp,
    ) -> Result<()> {
        self.exchange_in_one_kernel(ranks, devices, op, self.line_exchange_max(), |g| &mut g.lines)
    }

    /// A two-rank all-reduce through the chunk exchange: one kernel per rank, on the ranks'
    /// own streams (the caller checked the two devices differ).
    pub(crate) fn exchange_chunks<T: Element>(
        &self,
        ranks: &mut [Rank<'_, T>],
        devices: &[Device],
        op: ReduceOp,
    ) -> Result<()> {
        self.exchange_in_one_kernel(ranks, devices, op, self.chunk_exchange_max(), |g| &mut g.chunks)
    }

    /// A two-rank all-reduce through the group's exchange in `slot`, made (or remade, for a
    /// larger limit) for buffers of up to `max` bytes.
    fn exchange_in_one_kernel<T: Element, X: PairExchange>(
        &self,
        ranks: &mut [Rank<'_, T>],
        devices: &[Device],
        op: ReduceOp,
        max: usize,
        slot: impl FnOnce(&mut Group) -> &mut Option<X>,
    ) -> Result<()> {
        let group = self.group(devices)?;
        let mut group = group.lock();
        let exchange = match slot(&mut group) {
            // One out of step (a call that enqueued one rank's kernel only) is replaced; its
            // memory is freed once the kernel it ran is done.
            Some(x) if x.max_bytes() >= max && x.is_in_step() => x,
            empty => empty.insert(X::create([&devices[0], &devices[1]], max, DEFAULT_PEER_TIMEOUT)?),
        };
        let [a, b] = ranks else { unreachable!("the caller checked for two ranks") };
        let divide_by = step_divisor(op, true, 2);
        Ok(exchange.all_reduce([&mut a.buffer, &mut b.buffer], [a.stream, b.stream], op, divide_by)?)
    }

    /// A typed work buffer of at least `len` elements for rank `r` of the group of
    /// `devices`, kept between calls, made safe to overwrite on `stream`: the stream waits
    /// (on the GPU) for every use recorded on it by earlier calls, on whatever streams they
    /// ran. Give it back with [`Engine::put_work`].
    pub(crate) fn take_work<T: Element>(
        &self,
        devices: &[Device],
        r: usize,
        len: usize,
        stream: &Stream,
    ) -> Result<DeviceBuffer<T>> {
        let group = self.group(devices)?;
        let mut group = group.lock();
        take_buffer(&mut group.buffers[r], "work", &devices[r], len, stream)
    }

    /// Return a work buffer taken with [`Engine::take_work`]. Its uses were noted by the
    /// operations that touched it, so it needs no event of its own; if a concurrent call put
    /// one back meanwhile, that one is dropped (freed once its own work is done).
    pub(crate) fn put_work<T: Element>(&self, devices: &[Device], r: usize, buffer: DeviceBuffer<T>) -> Result<()> {
        let group = self.group(devices)?;
        group.lock().buffers[r].insert(("work", TypeId::of::<T>()), Box::new(buffer));
        Ok(())
    }

    fn group(&self, devices: &[Device]) -> Result<Arc<Mutex<Group>>> {
        let key: Vec<usize> = devices.iter().map(Device::ordinal).collect();
        let mut groups = self.groups.lock();
        if let Some(g) = groups.get(&key) {
            return Ok(g.clone());
        }
        let group = Group {
            forks: devices.iter().map(|d| StreamFork::new(d, 2)).collect::<Result<Vec<_>, _>>()?,
            rings: devices.iter().map(|_| RingCache::new()).collect(),
            buffers: devices.iter().map(|_| HashMap::new()).collect(),
            lines: None,
            chunks: None,
            fanouts: devices.iter().map(|_| None).collect(),
            wires: [None, None],
        };
        let group = Arc::new(Mutex::new(group));
        groups.insert(key, group.clone());
        Ok(group)
    }

    /// The receive path of `device`: as asked, or for Auto the faster one measured on it
    /// (once per device and process). Never `Auto`.
    /// Each rank's receive path for a collective that `reduces` (the measured or given one);
    /// copy-only collectives land every chunk by DMA, so no path is chosen for them.
    fn receive_paths(&self, devices: &[Device], receive: Receive, reduces: bool) -> Result<Vec<Receive>> {
        if !reduces {
            return Ok(vec![Receive::ZeroCopy; devices.len()]);
        }
        devices.iter().map(|d| self.receive_path(d, receive)).collect()
    }

    fn receive_path(&self, device: &Device, receive: Receive) -> Result<Receive> {
        match receive {
            Receive::Scratch | Receive::ZeroCopy => Ok(receive),
            Receive::Auto => {
                // Calibrate under the lock: a concurrent first call waits for the result
                // instead of timing its own run beside this one (each would skew the other).
                let mut paths = self.paths.lock();
                if let Some(&p) = paths.get(&device.ordinal()) {
                    return Ok(p);
                }
                let p = choose(device)?;
                paths.insert(device.ordinal(), p);
                Ok(p)
            }
        }
    }
}

/// Cached buffers, by use and element type.
type BufferCache = HashMap<(&'static str, TypeId), Box<dyn Any + Send>>;

/// A scratch buffer of `chunk` elements for each rank whose receive path is
/// [`Receive::Scratch`] (from its cache, ordered after its last uses on the rank's receive
/// stream), `None` for the others.
fn take_scratch<T: Element>(
    buffers: &mut [BufferCache],
    forks: &[StreamFork],
    devices: &[Device],
    paths: &[Receive],
    chunk: usize,
) -> Result<Vec<Option<DeviceBuffer<T>>>> {
    let mut scratch = Vec::with_capacity(buffers.len());
    for (r, cache) in buffers.iter_mut().enumerate() {
        let recv = &forks[r].streams()[RECV];
        let wanted = paths[r] == Receive::Scratch;
        scratch.push(if wanted { Some(take_buffer(cache, "scratch", &devices[r], chunk, recv)?) } else { None });
    }
    Ok(scratch)
}

/// Fork every rank's stream into its internal streams, `run` the collective's work there,
/// then join and give the scratch buffers back to their caches whatever `run` returned: the
/// callers' later work (freeing their buffers, say) must still wait for what was enqueued.
fn run_forked<'a, T: Element>(
    ranks: &mut [Rank<'a, T>],
    forks: &[StreamFork],
    buffers: &mut [BufferCache],
    mut scratch: Vec<Option<DeviceBuffer<T>>>,
    run: impl FnOnce(&mut [Rank<'a, T>], &[StreamFork], &mut [Option<DeviceBuffer<T>>]) -> Result<()>,
) -> Result<()> {
    for (r, rank) in ranks.iter().enumerate() {
        forks[r].fork(rank.stream)?;
    }
    let result = run(ranks, forks, &mut scratch);
    let mut joined = Ok(());
    for (r, rank) in ranks.iter().enumerate() {
        joined = joined.and(forks[r].join(rank.stream));
    }
    for (cache, buf) in buffers.iter_mut().zip(scratch) {
        if let Some(buf) = buf {
            cache.insert(("scratch", TypeId::of::<T>()), Box::new(buf));
        }
    }
    result?;
    Ok(joined?)
}

/// A cached typed buffer of at least `len` elements, or a new one, made safe to overwrite on
/// `user`: it waits for the buffer's recorded uses. A cached one that is too small is
/// dropped (the lifetime rule frees it once its work is done).
fn take_buffer<T: Element>(
    cache: &mut BufferCache,
    key: &'static str,
    device: &Device,
    len: usize,
    user: &Stream,
) -> Result<DeviceBuffer<T>> {
    if let Some(boxed) = cache.remove(&(key, TypeId::of::<T>()))
        && let Ok(buf) = boxed.downcast::<DeviceBuffer<T>>()
        && buf.len() >= len
    {
        buf.wait_last_uses(user)?;
        return Ok(*buf);
    }
    Ok(DeviceBuffer::alloc(device, len.max(1))?)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::transfers::Waits;
    use super::{
        CACHED_SLOTS, CHUNK_EXCHANGE_MAX_BYTES, Chunking, Engine, MULTI_DEVICE_MAX_CHUNK_BYTES, SLOTS, check_runnable,
        parse_chunk_exchange_max, plan_waits,
    };
    use crate::Error;
    use crate::legs::Rounds;
    use crate::schedule::Schedule;

    #[test]
    fn the_legs_executor_takes_in_place_legs_of_one_per_writer_and_round_only() {
        for world in 2..=8 {
            for rounds in [
                Rounds::all_reduce(world, 100_000),
                Rounds::all_gather(world, 4096, true),
                Rounds::reduce_scatter(world, 4096, true),
                Rounds::broadcast(world, 5000, world - 1),
            ] {
                assert_eq!(check_runnable(&rounds), Ok(()), "{world} ranks: {rounds:?}");
            }
        }
        // The out-of-place all-gather reads Buf::Part; the ring's schedule as legs gives a
        // writer a leg per chunk in one round.
        let err = check_runnable(&Rounds::all_gather(3, 4096, false)).unwrap_err();
        assert!(matches!(err, Error::UnrunnableLegs { leg: 0, .. }) && err.to_string().contains("in place"), "{err}");
        let err = check_runnable(&Schedule::all_reduce(3, 300, 10).to_rounds(4)).unwrap_err();
        assert!(err.to_string().contains("second leg of its round"), "{err}");
    }

    #[test]
    fn a_zero_chunk_override_is_refused_by_the_transport_check() {
        let err = Engine::with_chunk_bytes(0).err().expect("zero refused");
        assert!(err.to_string().contains("chunk_bytes"), "{err}");
        assert_eq!(Engine::with_chunk_bytes(4096).map(|e| e.chunk_bytes()).ok(), Some(Some(4096)));
        assert!(Engine::with_staging(None, Some(0)).is_err(), "zero slots refused");
    }

    #[test]
    fn forwarding_waits_for_arrival_and_overwriting_for_the_send() {
        // Two ranks, one chunk per segment: rank r sends segment A (reduce-scatter), receives
        // and reduces B, sends the reduced B (all-gather) and receives the final A.
        let waits = plan_waits(&Schedule::all_reduce(2, 8, 4));
        assert_eq!(waits.len(), 4);
        assert!(waits[..2].iter().all(|w| *w == Waits::default()), "the first step waits for nothing");
        for (later, w) in waits[2..].iter().enumerate() {
            assert!(w.send_after_fold.is_some_and(|j| j < 2), "all-gather send {later} forwards a fold");
            assert!(w.receive_after_send.is_some_and(|j| j < 2), "all-gather receive {later} overwrites a sent range");
        }
        // A broadcast chain only forwards what arrived.
        let chain = plan_waits(&Schedule::broadcast(3, 8, 8, 0));
        assert_eq!(chain[0], Waits::default());
        assert_eq!(chain[1], Waits { send_after_fold: Some(0), receive_after_send: None });
    }

    #[test]
    fn the_chunk_exchange_limit_comes_from_the_environment_or_the_default() {
        assert_eq!(parse_chunk_exchange_max(None), CHUNK_EXCHANGE_MAX_BYTES);
        assert_eq!(parse_chunk_exchange_max(Some("0")), 0, "0 turns it off");
        assert_eq!(parse_chunk_exchange_max(Some(" 65536 ")), 65536);
        assert_eq!(parse_chunk_exchange_max(Some("4 MiB")), CHUNK_EXCHANGE_MAX_BYTES, "not a byte count");
        let limit = gp2p_pinned::CHUNK_EXCHANGE_LIMIT;
        assert_eq!(parse_chunk_exchange_max(Some(&limit.to_string())), limit);
        assert_eq!(
            parse_chunk_exchange_max(Some(&(limit + 1).to_string())),
            CHUNK_EXCHANGE_MAX_BYTES,
            "above the limit"
        );
        assert_eq!(parse_chunk_exchange_max(Some(&usize::MAX.to_string())), CHUNK_EXCHANGE_MAX_BYTES);
        assert_eq!(Engine::new().with_chunk_exchange_max(7).chunk_exchange_max(), 7);
    }

    #[test]
    fn an_exchange_receives_only_after_the_receiver_sent() {
        // Rank r overwrites the chunk its own send reads: each receive waits for that send.
        let schedule = Schedule::all_reduce_exchange(100, 32, 4);
        let waits = plan_waits(&schedule);
        for (t, w) in schedule.transfers.iter().zip(&waits) {
            let j = w.receive_after_send.expect("every receive waits");
            let sender = &schedule.transfers[j];
            assert!(sender.from == t.to && sender.range == t.range, "{t:?} waits for {sender:?}");
            assert_eq!(w.send_after_fold, None, "nothing arrives before a rank sends");
        }
    }

    proptest! {
        /// Every wait names an earlier transfer in the order the executor enqueues (a group's
        /// sends, then its receives): a send waits for a fold into its own rank and range, a
        /// receive for a send from its own rank and range.
        #[test]
        fn waits_name_earlier_transfers_of_the_same_rank_and_range(ranks in 1usize..6, len in 0usize..200, chunk in 1usize..30) {
            let schedules = [
                Schedule::all_reduce(ranks, len, chunk),
                Schedule::broadcast(ranks, len, chunk, 0),
                Schedule::all_reduce_exchange(len, chunk, 1),
            ];
            for schedule in schedules {
                let waits = plan_waits(&schedule);
                let mut enqueued_sends = vec![false; waits.len()];
                let mut enqueued_folds = vec![false; waits.len()];
                let mut first = 0;
                for group in schedule.groups() {
                    let indices = first..first + group.len();
                    first = indices.end;
                    for i in indices.clone() {
                        let t = &schedule.transfers[i];
                        if let Some(j) = waits[i].send_after_fold {
                            prop_assert!(enqueued_folds[j], "send {i} waits for fold {j} not yet enqueued");
                            let f = &schedule.transfers[j];
                            prop_assert!(f.to == t.from && f.range.start == t.range.start);
                        }
                        enqueued_sends[i] = true;
                    }
                    for i in indices {
                        let t = &schedule.transfers[i];
                        if let Some(j) = waits[i].receive_after_send {
                            prop_assert!(enqueued_sends[j], "receive {i} waits for send {j} not yet enqueued");
                            let s = &schedule.transfers[j];
                            prop_assert!(s.from == t.to && s.range.start == t.range.start);
                        }
                        enqueued_folds[i] = true;
                    }
                }
            }
        }
    }

    #[test]
    fn staging_takes_cache_sized_chunks_and_three_slots_only_across_devices() {
        let engine = Engine::new();
        let across = engine.staging(1 << 30, true);
        assert_eq!((across.chunk_bytes, across.slots), (MULTI_DEVICE_MAX_CHUNK_BYTES, CACHED_SLOTS));
        let mid = engine.staging(16 << 20, true);
        assert_eq!((mid.chunk_bytes, mid.slots), (1 << 20, SLOTS), "16 chunks of 1 MiB, not cached-sized");
        let one_device = engine.staging(1 << 30, false);
        assert_eq!(one_device, Chunking::for_bytes(1 << 30, None, None), "the transport's chunking");
        let forced = Engine::with_staging(Some(8 << 20), Some(5)).unwrap().staging(1 << 30, true);
        assert_eq!((forced.chunk_bytes, forced.slots), (8 << 20, 5));
    }
}
