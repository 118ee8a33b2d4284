//! `ChunkExchange`: a two-rank all-reduce of up to a few MiB in one kernel per rank, through
//! flagged chunks of mapped pinned host memory (no DMA, no event between ranks).
#![allow(unsafe_code)]

use std::time::Duration;

use gp2p_cuda::raw::{self, ChunkAreas, ChunkWaits};
use gp2p_cuda::{Device, DeviceBuffer, DeviceViewMut, LaunchCache, Stream, StreamPoint};
use gp2p_kernels::{CHUNK_MAX_BLOCKS, Element, ReduceOp, chunk_area_layout};

use crate::Result;
use crate::pair::{Pair, kernel_wait_ns};

/// The largest buffer a chunk exchange is made for (its areas take four times as much pinned
/// memory): 16 MiB, where the DMA pipeline has long since won.
pub const CHUNK_EXCHANGE_LIMIT: usize = 16 << 20;

/// How long a chunk exchange's kernel waits for a peer it has not yet seen begin the call,
/// by default: the peer's stream may be working through queued work.
pub const DEFAULT_QUEUE_TIMEOUT: Duration = Duration::from_secs(60);

/// The state of two-rank all-reduces through flagged chunks between two devices: each rank's
/// area (two halves, for calls of odd and even numbers) and, in each device's memory, its
/// call count.
///
/// One call launches one kernel per rank (`gp2p_kernels::chunks_kernel_name`). Rank r
/// stores its buffer into its area in 4 KiB chunks and flags each with the call's number
/// once its stores are out; it waits for the peer's flag of each chunk, reads the chunk and
/// folds `buf = op(own, peer)` (own first on both ranks). Storing one chunk overlaps folding
/// the one before. The kernels number their calls from their device's counter, so nothing on
/// the host numbers a call. Alternating halves keep a call from overwriting an area the peer
/// may still be reading: rank r writes a half again only two calls later, after its previous
/// kernel saw all of the peer's flags of the call between, which the peer set only after its
/// kernel of the call before had finished reading.
///
/// Waits are bounded twice: once a kernel has seen its peer begin the call, it waits at most
/// the timeout for each of the peer's chunks; until then, while the peer's stream may still
/// be working through what was queued before the call, at most the queue timeout
/// ([`DEFAULT_QUEUE_TIMEOUT`] unless set). So the two kernels need not start together
/// (starting them together, as [`crate::LineExchange`] does, costs a wait across devices on
/// each side: on two H200s, a call up to 64 KiB took 21.9-28.3 us with it and 15.6-20.0
/// without, in two other calls of `gp2p bench`), and a peer that never comes still ends in
/// [`crate::Error::PeerTimeout`] at the next call. The two kernels must run at the same time:
/// a tool that runs one kernel at a time (compute-sanitizer) makes every call wait out the
/// queue timeout. And a kernel waiting for its peer holds its device's multiprocessors (at
/// 4 MiB, two blocks of 512 threads on each, all its registers): if the peer's stream waits
/// for work on this device that is not yet running, that work waits for the kernel, and the
/// call ends in the queue timeout (NCCL's kernels share this hazard, without a bound).
///
/// After a timeout, calls enqueued before the next call reported it may have folded a half
/// the late rank was still rewriting: [`crate::Error::PeerTimeout`] says so.
///
/// Lifetime: the areas and counters outlive the kernels by the lifetime rule (each call
/// notes its points). `Send`; calls take `&mut self`.
pub struct ChunkExchange {
    /// The devices, and per rank its area (data, then flags at `flags_offset`), both halves.
    pair: Pair,
    /// Per rank, in its device's memory: the call count and the kernels' ticket.
    counters: [DeviceBuffer<u32>; 2],
    flags_offset: usize,
    queue_timeout: Duration,
    /// Per rank, its kernels replayed from graphs (a launch costs the host about twice a
    /// replay's time); each rank's calls run one after another (`Pair::order`), which is what
    /// replaying one graph imposes, and the ranks' caches are apart, as their kernels wait
    /// for each other. Both ranks' graphs are made or set before either kernel is enqueued.
    launches: [LaunchCache; 2],
}

impl ChunkExchange {
    /// Areas for buffers of up to `max_bytes` between `devices[0]` (rank 0) and `devices[1]`.
    /// The two devices must differ, as for [`crate::LineExchange::new`].
    pub fn new(devices: [&Device; 2], max_bytes: usize, timeout: Duration) -> Result<Self> {
        Pair::refuse_shared_device(devices, "chunk exchange")?;
        Self::on(devices, max_bytes, timeout)
    }

    /// Both ranks on `device`, for tests of the kernels where there is one GPU: each rank's
    /// grid takes at most one block per multiprocessor (so both fit at once), which limits
    /// `max_bytes` to 4 KiB per multiprocessor. Calls must use two streams created one after
    /// the other (hardware queues are handed out in turn), and nothing else may occupy the
    /// device; a pair that cannot run at once still ends in the timeouts, not a hang.
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn sharing_a_device_for_tests(device: &Device, max_bytes: usize, timeout: Duration) -> Result<Self> {
        let fits = Self::max_bytes_sharing_a_device(device);
        if max_bytes > fits {
            return Err(crate::Error::InvalidArgument {
                name: "max_bytes",
                reason: format!(
                    "{max_bytes} bytes is above {fits}: both ranks' grids must fit on device {} at once",
                    device.ordinal()
                ),
            });
        }
        Self::on([device, device], max_bytes, timeout)
    }

    /// The largest `max_bytes` [`Self::sharing_a_device_for_tests`] takes on `device`: one
    /// chunk per multiprocessor, so that each rank's grid keeps to one block on each.
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn max_bytes_sharing_a_device(device: &Device) -> usize {
        device.info().multiprocessors as usize * gp2p_kernels::CHUNK_BYTES
    }

    fn on(devices: [&Device; 2], max_bytes: usize, timeout: Duration) -> Result<Self> {
        if max_bytes > CHUNK_EXCHANGE_LIMIT {
            return Err(crate::Error::InvalidArgument {
                name: "max_bytes",
                reason: format!(
                    "{max_bytes} bytes is above the chunk exchange's {CHUNK_EXCHANGE_LIMIT}: larger all-reduces belong to the DMA pipeline"
                ),
            });
        }
        let (flags_offset, area_bytes) = chunk_area_layout(max_bytes.max(1));
        // Halves on their own pages: the kernels need 64-byte alignment.
        let half_bytes = area_bytes.next_multiple_of(4096);
        let mut pair = Pair::new(devices, timeout, "chunk exchange", (max_bytes, half_bytes))?;
        pair.start_together = false;
        pair.counted = true;
        let counters = [DeviceBuffer::zeroed(devices[0], 2)?, DeviceBuffer::zeroed(devices[1], 2)?];
        let launches = [LaunchCache::new(devices[0]), LaunchCache::new(devices[1])];
        Ok(ChunkExchange { pair, counters, flags_offset, queue_timeout: DEFAULT_QUEUE_TIMEOUT.max(timeout), launches })
    }

    /// Whether a call whose streams have work queued starts both kernels only once both
    /// streams reached it (off by default: the queue timeout covers queued work); see
    /// [`crate::LineExchange::set_start_together`].
    pub fn set_start_together(&mut self, together: bool) {
        self.pair.start_together = together;
    }

    /// How long a kernel waits for a peer it has not yet seen begin the call (at least the
    /// timeout given at creation; shorter values are raised to it).
    pub fn set_queue_timeout(&mut self, queue_timeout: Duration) {
        self.queue_timeout = queue_timeout.max(self.pair.timeout);
    }

    /// The largest buffer, in bytes, a call may exchange.
    pub fn max_bytes(&self) -> usize {
        self.pair.max_bytes
    }

    /// Whether calls can still run: false once a call enqueued rank 0's kernel and failed
    /// before rank 1's (the kernels count calls on their devices, so the ranks would pair the
    /// wrong calls from then on); later calls return [`crate::Error::OutOfStep`].
    pub fn is_in_step(&self) -> bool {
        self.pair.is_in_step()
    }

    /// In place on both ranks: `buf = op(own, peer)` (for avg, `divide_by` divides the sum:
    /// pass 2). Rank r's kernel runs on `streams[r]`, after the work queued there, and later
    /// work there sees the result. The two streams must differ (each kernel waits for the
    /// other), and each must be on its rank's device.
    pub fn all_reduce<T: Element>(
        &mut self,
        bufs: [&mut DeviceViewMut<'_, T>; 2],
        streams: [&Stream; 2],
        op: ReduceOp,
        divide_by: u32,
    ) -> Result<()> {
        let len = self.pair.begin(&bufs, streams)?;
        if len == 0 {
            return Ok(());
        }
        let waits = ChunkWaits {
            timeout_ns: kernel_wait_ns(self.pair.timeout),
            queue_timeout_ns: kernel_wait_ns(self.queue_timeout),
        };
        let (counters, mapped, failed) = (&self.counters, self.pair.mapped, self.pair.failed_mapped);
        let (half_stride, flags_offset) = (self.pair.half_bytes as u64, self.flags_offset as u64);
        let raw_bufs = [bufs[0].raw_ptr(), bufs[1].raw_ptr()];
        let plan = |r: usize| {
            let (own, peer) = mapped[r];
            let chunk_areas = ChunkAreas {
                out_area: own,
                in_area: peer,
                half_stride,
                flags_offset,
                counter: counters[r].raw_ptr(),
                failed: failed[r],
                broken: 0,
            };
            let device = streams[r].device();
            raw::plan_exchange_chunks(
                device,
                raw::InOut::in_place(raw_bufs[r]),
                len,
                T::DTYPE,
                op,
                chunk_areas,
                divide_by,
                waits,
                CHUNK_MAX_BLOCKS,
            )
        };
        let mut planned = [plan(0)?, plan(1)?];
        // Both ranks' graphs are made (or set) before either kernel is enqueued: between the two
        // launches nothing may wait for a device (see `Pair::launch_both`), and rank 0's kernel
        // waits for rank 1's from its launch on.
        for (kernel, cache) in planned.iter().zip(&mut self.launches) {
            if let Some(kernel) = kernel {
                kernel.prepare(cache)?;
            }
        }
        let caches = &mut self.launches;
        let launch = |r: usize| {
            let Some(kernel) = planned[r].take() else { return Ok(()) };
            // SAFETY: the buffer is `len` elements on the stream's device, at most
            // `max_bytes` (checked above); each half of each area is
            // chunk_area_layout(max_bytes).1 bytes or more of page-aligned, mapped pinned
            // memory laid out with that flags_offset, which only rank r's kernels write
            // (`own`); the counter is rank r's own, in its device's memory, touched only by
            // this exchange's kernels on rank r, in the order `Pair::begin` keeps; `failed` is
            // rank r's own u32; all of them outlive the kernels by the points `launch_both`
            // notes right after each launch. `launch_both` enqueues both kernels (should the
            // second fail, the first gives up at its queue timeout, and the pair, out of
            // step, refuses every later call). Rank r's launch cache is its own, and its
            // launches are rank r's calls, each ordered after the last by `Pair::begin`.
            unsafe { kernel.enqueue(streams[r], Some(&mut caches[r])) }.map_err(Into::into)
        };
        let note = |r: usize, point: &StreamPoint| counters[r].view(..).note_use(point);
        self.pair.launch_both(streams, bufs, launch, note)
    }
}

crate::pair::pair_exchange!(ChunkExchange);

impl std::fmt::Debug for ChunkExchange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ChunkExchange(devices {} and {}, up to {} bytes)",
            self.pair.devices[0].ordinal(),
            self.pair.devices[1].ordinal(),
            self.pair.max_bytes
        )
    }
}
