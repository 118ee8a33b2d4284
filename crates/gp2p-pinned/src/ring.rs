//! `StagingRing`: pinned slots and the events that let a pipeline reuse them safely.
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering};

use gp2p_cuda::SourceMemory;
use gp2p_cuda::raw::{self, memcpy_dtoh_async, memcpy_htod_async};
use gp2p_cuda::{Device, DeviceView, DeviceViewMut, HostAllocation, RawDevicePtr, Stream, StreamPoint};
use gp2p_kernels::{Element, ReduceOp};

use crate::{Error, Result};

/// Slot starts are aligned to this many bytes, so every slot suits the 16-byte vector path
/// of the kernels and any element type.
pub(crate) const SLOT_ALIGN: usize = 256;
/// More slots than this buys no overlap and only costs events and pinned memory.
pub const MAX_SLOTS: usize = 64;

/// How the consumer folds a staged chunk into its destination ([`StagingRing::pass`]).
pub enum Fold<'s, T: Element> {
    /// `dst = chunk`: a host-to-device DMA.
    Copy,
    /// Zero-copy: `dst = op(dst, chunk)` by a kernel that reads the slot across PCIe.
    ZeroCopy {
        /// The reduction.
        op: ReduceOp,
        /// Divisor for avg (1 on every step but the last).
        divide_by: u32,
    },
    /// A host-to-device DMA of the slot into `scratch` (at least the chunk's length), then
    /// `dst = op(dst, scratch)` on the device.
    Scratch {
        /// Device memory on the consumer's device for the chunk.
        scratch: DeviceViewMut<'s, T>,
        /// The reduction.
        op: ReduceOp,
        /// Divisor for avg (1 on every step but the last).
        divide_by: u32,
    },
}

/// A chunk in a slot, filled by [`StagingRing::send`] and waiting for
/// [`StagingRing::receive`].
#[must_use = "a sent chunk must be received, or its slot's data is never used"]
#[derive(Debug)]
pub struct Sent {
    /// The ring that sent it ([`StagingRing`]'s id): only that ring may receive it.
    ring: u64,
    slot: usize,
    bytes: usize,
    landed: StreamPoint,
}

impl Sent {
    /// The point after the DMA into the slot on the producer's stream: once it completes,
    /// the source range was read (it may be overwritten) and the chunk is in the slot.
    pub fn landed(&self) -> &StreamPoint {
        &self.landed
    }
}

/// Refuse a fold that could not run, before anything is enqueued: a scratch too short or on
/// another device than `consumer`, or an avg divisor of 0.
pub(crate) fn check_fold<T: Element>(fold: &Fold<'_, T>, len: usize, consumer: &Device) -> Result<()> {
    let divide_by = match fold {
        Fold::Copy => return Ok(()),
        Fold::ZeroCopy { divide_by, .. } => *divide_by,
        Fold::Scratch { scratch, divide_by, .. } => {
            if scratch.len() < len {
                return Err(Error::ScratchTooShort { got: scratch.len(), needed: len });
            }
            if scratch.device() != consumer {
                return Err(Error::WrongDevice {
                    what: "the scratch",
                    got: scratch.device().ordinal(),
                    of: "the ring's consumer",
                    expected: consumer.ordinal(),
                });
            }
            *divide_by
        }
    };
    Ok(gp2p_cuda::check_divisor(divide_by)?)
}

/// Enqueue on `stream` what `fold` says with a staged chunk: `dst` becomes the chunk (a
/// host-to-device DMA from `host`), or `op(dst, chunk)` by a kernel that reads it through
/// `mapped` (zero-copy) or from the scratch it was first copied into. The one place the
/// staging types (the ring, the fan-out) touch a slot's bytes on the way in; they take the
/// point that notes `dst`, the scratch and the slot afterwards.
///
/// # Safety
/// `host` (as the host sees it) and `mapped` (as `stream`'s device maps it, aligned to 256
/// bytes) address the same pinned slot, holding at least `dst.bytes()` bytes of the chunk
/// once `stream` reaches this work and unchanged until the point taken after it completes;
/// `dst` and the scratch are on `stream`'s device; `fold` passed [`check_fold`].
pub(crate) unsafe fn fold_staged<T: Element>(
    stream: &Stream,
    dst: &mut DeviceViewMut<'_, T>,
    host: *const u8,
    mapped: RawDevicePtr,
    fold: &Fold<'_, T>,
) -> Result<()> {
    if dst.is_empty() {
        return Ok(());
    }
    let (len, dtype) = (dst.len(), T::DTYPE);
    match fold {
        // SAFETY: the caller's contract: the slot holds the chunk, dst is device memory on the
        // stream's device, and host memory never overlaps it.
        Fold::Copy => unsafe { memcpy_htod_async(stream, dst.raw_ptr(), host.cast(), dst.bytes())? },
        Fold::ZeroCopy { op, divide_by } => {
            // SAFETY: as above; `mapped` is the slot as this device maps it.
            unsafe { raw::reduce(stream, dst.raw_ptr(), mapped, len, dtype, *op, *divide_by, SourceMemory::ZeroCopy)? }
        }
        Fold::Scratch { scratch, op, divide_by } => {
            let tmp = scratch.raw_ptr();
            // SAFETY: as above; the scratch holds at least `len` elements (check_fold), apart
            // from dst.
            unsafe { memcpy_htod_async(stream, tmp, host.cast(), dst.bytes())? };
            // SAFETY: dst and the scratch, `len` elements each on the stream's device, apart.
            unsafe { raw::reduce(stream, dst.raw_ptr(), tmp, len, dtype, *op, *divide_by, SourceMemory::Device)? }
        }
    }
    Ok(())
}

/// A ring of pinned host slots between a producer device (which fills a slot by D2H DMA)
/// and a consumer device (which drains it by H2D DMA, or reads it in a reduce kernel). On
/// one card both are the same device and the two sides run on different streams.
///
/// Each slot keeps two [`StreamPoint`]s: *landed* (taken on the producer's stream after its
/// DMA into the slot) and *free* (taken on the consumer's stream once done with it).
/// [`StagingRing::fill`] makes the producer stream wait for *free* and
/// [`StagingRing::drain`] makes the consumer stream wait for *landed* — both on the GPU, so
/// the host never blocks, and a later call that comes round to a slot waits for the earlier
/// call's consumer to be done with it. The same points are the last uses of the views
/// passed in and of the ring's memory, so dropping any of them (or the ring) right after
/// the call is safe and does not block.
///
/// A slot is filled, then drained, then filled again: a fill of a slot whose chunk was not
/// drained yet ([`Error::SlotBusy`]), a drain of a slot that holds no chunk
/// ([`Error::SlotEmpty`]) and a [`Sent`] of another ring ([`Error::ForeignChunk`]) are
/// refused before any work is enqueued.
///
/// Not `Sync` in use: filling and draining take `&mut self`, since the order in which the
/// host enqueues them is what the points encode.
pub struct StagingRing {
    memory: HostAllocation,
    /// The slots' base address as the consumer device sees it (zero-copy reads).
    consumer_base: RawDevicePtr,
    slot_bytes: usize,
    /// Per slot: the point where its chunk landed, while it holds one (filled and not yet
    /// drained).
    landed: Vec<Option<StreamPoint>>,
    free: Vec<Option<StreamPoint>>,
    cursor: usize,
    producer: Device,
    consumer: Device,
    /// Unique per ring for the life of the process, so a [`Sent`] names its ring.
    id: u64,
}

fn next_ring_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

impl StagingRing {
    /// `slots` slots of at least `slot_bytes` bytes (rounded up to 256) between `producer`
    /// and `consumer`.
    pub fn new(producer: &Device, consumer: &Device, slots: usize, slot_bytes: usize) -> Result<Self> {
        if slots == 0 || slot_bytes == 0 {
            return Err(Error::InvalidArgument {
                name: "slots",
                reason: format!("a ring needs at least one slot of at least one byte, got {slots} x {slot_bytes}"),
            });
        }
        let too_big = || Error::InvalidArgument {
            name: "slot_bytes",
            reason: format!("{slots} slots of {slot_bytes} bytes overflow the address space"),
        };
        let slot_bytes = slot_bytes.checked_next_multiple_of(SLOT_ALIGN).ok_or_else(too_big)?;
        let total = slots.checked_mul(slot_bytes).ok_or_else(too_big)?;
        if slots > MAX_SLOTS {
            return Err(Error::InvalidArgument {
                name: "slots",
                reason: format!("{slots} slots; at most {MAX_SLOTS} (more buy no overlap)"),
            });
        }
        // The producer's is checked by the allocation; the consumer reads through its own.
        consumer.require_host_mapping()?;
        let memory = HostAllocation::new(producer, total)?;
        // Consumers read the slots through their own mapping; fail now, not mid-pipeline.
        let consumer_base = memory.device_ptr(consumer)?;
        Ok(StagingRing {
            memory,
            consumer_base,
            slot_bytes,
            landed: vec![None; slots],
            free: vec![None; slots],
            cursor: 0,
            producer: producer.clone(),
            consumer: consumer.clone(),
            id: next_ring_id(),
        })
    }

    /// This ring's number, unique for the life of the process (what a [`Sent`] names).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Number of slots.
    pub fn slots(&self) -> usize {
        self.landed.len()
    }

    /// Capacity of each slot in bytes.
    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// Whether some slot was filled and not yet drained.
    fn holds_any_chunk(&self) -> bool {
        self.landed.iter().any(Option::is_some)
    }

    /// The next slot in round-robin order; the rotation continues across calls, so
    /// consecutive transfers spread over all slots.
    pub fn next_slot(&mut self) -> usize {
        let slot = self.cursor;
        self.cursor = (self.cursor + 1) % self.slots();
        slot
    }

    /// Move one chunk through the next slot: on `producer`, a DMA of `src` into the slot; on
    /// `consumer`, `dst` folded from it as `fold` says. The one pipeline step of every staged
    /// transfer — the copy engine's chunks and the collectives' ring edges alike — so slot
    /// rotation and fencing live here only. `src` and `dst` must have equal lengths.
    pub fn pass<T: Element>(
        &mut self,
        producer: &Stream,
        src: &DeviceView<'_, T>,
        consumer: &Stream,
        dst: &mut DeviceViewMut<'_, T>,
        fold: Fold<'_, T>,
    ) -> Result<StreamPoint> {
        if src.len() != dst.len() {
            return Err(Error::LengthMismatch { what: "src", got: src.len(), of: "dst", expected: dst.len() });
        }
        // Refuse bad input before the slot is filled: nothing is enqueued then.
        check_fold(&fold, dst.len(), &self.consumer)?;
        self.check(self.cursor, dst.bytes(), consumer, dst.device(), Side::Consumer)?;
        let sent = self.send(producer, src)?;
        self.receive(sent, consumer, dst, fold)
    }

    /// The first half of [`StagingRing::pass`]: fill the next slot from `src` on `producer`.
    /// Hand the result to [`StagingRing::receive`] before the ring comes round to that slot
    /// again (an exchange sends on several rings before any receives, one slot each).
    pub fn send<T: Element>(&mut self, producer: &Stream, src: &DeviceView<'_, T>) -> Result<Sent> {
        let slot = self.cursor;
        let landed = self.fill(slot, producer, src)?;
        self.next_slot();
        Ok(Sent { ring: self.id, slot, bytes: src.bytes(), landed })
    }

    /// The second half of [`StagingRing::pass`]: fold the chunk `sent` into `dst` on
    /// `consumer`, as `fold` says; `dst` must be as long as the chunk was. Returns the point
    /// after the fold on `consumer`: once it completes, `dst` holds the result.
    pub fn receive<T: Element>(
        &mut self,
        sent: Sent,
        consumer: &Stream,
        dst: &mut DeviceViewMut<'_, T>,
        fold: Fold<'_, T>,
    ) -> Result<StreamPoint> {
        if sent.ring != self.id {
            return Err(Error::ForeignChunk { slot: sent.slot });
        }
        if dst.bytes() != sent.bytes {
            return Err(Error::ReceiveSize { got: dst.bytes(), sent: sent.bytes });
        }
        self.drain_with(sent.slot, consumer, dst, fold)
    }

    /// On the producer's `stream`: wait until `slot` is free, DMA `src` into it, and mark it
    /// landed. Refused if the slot still holds a chunk nobody drained. Returns the slot's
    /// *landed* point.
    pub fn fill<T: Element>(&mut self, slot: usize, stream: &Stream, src: &DeviceView<'_, T>) -> Result<StreamPoint> {
        self.check(slot, src.bytes(), stream, src.device(), Side::Producer)?;
        self.claim(slot, stream)?;
        if !src.is_empty() {
            // SAFETY: the slot holds slot_bytes >= src.bytes() pinned bytes, not in use by
            // anyone: the stream waited for its `free` point, and the memory outlives every
            // noted point. src is on the stream's device (checked).
            unsafe { memcpy_dtoh_async(stream, self.slot_host(slot).cast(), src.raw_ptr(), src.bytes())? };
        }
        let point = stream.point()?;
        src.note_use(&point);
        self.memory.uses().note(&point);
        self.landed[slot] = Some(point.clone());
        Ok(point)
    }

    /// On the consumer's `stream`: wait until `slot` has landed, DMA its first `dst.len()`
    /// elements into `dst`, and mark the slot free. Refused if the slot holds no chunk.
    /// Returns the slot's *free* point, which completes with the DMA into `dst`.
    pub fn drain<T: Element>(
        &mut self,
        slot: usize,
        stream: &Stream,
        dst: &mut DeviceViewMut<'_, T>,
    ) -> Result<StreamPoint> {
        self.drain_with(slot, stream, dst, Fold::Copy)
    }

    /// On the consumer's `stream`: wait until `slot` has landed, fold it into `dst` as `fold`
    /// says ([`fold_staged`]), and mark the slot free (noting `dst` and the scratch).
    fn drain_with<T: Element>(
        &mut self,
        slot: usize,
        stream: &Stream,
        dst: &mut DeviceViewMut<'_, T>,
        fold: Fold<'_, T>,
    ) -> Result<StreamPoint> {
        self.check(slot, dst.bytes(), stream, dst.device(), Side::Consumer)?;
        check_fold(&fold, dst.len(), &self.consumer)?;
        self.wait_landed(slot, stream)?;
        let (host, mapped) = (self.slot_host(slot).cast_const(), self.consumer_base + (slot * self.slot_bytes) as u64);
        // SAFETY: the slot's chunk landed (the stream waited for the producer's DMA) and stays
        // until `free`, taken below, completes; `mapped` is the slot as the consumer maps it;
        // dst is on the stream's device (checked) and the fold was checked.
        let folded = unsafe { fold_staged(stream, dst, host, mapped, &fold) };
        // Taken even if a launch failed: whatever was enqueued before it must be noted.
        let marked = self.mark_free(slot, stream, dst);
        if let (Ok(point), Fold::Scratch { scratch, .. }) = (&marked, &fold) {
            scratch.note_use(point);
        }
        folded?;
        marked
    }

    /// Fill `slot` from `src` and drain it into `dst`, both on one stream (one device): the
    /// stream's own order makes the upload follow the download, so *landed* is neither
    /// taken nor waited for — a one-chunk copy's latency is mostly such GPU-side event
    /// work. Returns the slot's new *free* point, which completes with the relay, so another
    /// stream can wait on it without a point of its own.
    pub fn relay<T: Element>(
        &mut self,
        slot: usize,
        stream: &Stream,
        src: &DeviceView<'_, T>,
        dst: &mut DeviceViewMut<'_, T>,
    ) -> Result<StreamPoint> {
        if src.len() != dst.len() {
            return Err(Error::LengthMismatch { what: "src", got: src.len(), of: "dst", expected: dst.len() });
        }
        self.check(slot, dst.bytes(), stream, dst.device(), Side::Consumer)?;
        self.check(slot, src.bytes(), stream, src.device(), Side::Producer)?;
        self.claim(slot, stream)?;
        let slot_host = self.slot_host(slot);
        let relayed = if dst.is_empty() {
            Ok(())
        } else {
            // SAFETY: as in fill: the slot is free (waited for above) and big enough.
            unsafe { memcpy_dtoh_async(stream, slot_host.cast(), src.raw_ptr(), src.bytes()) }.and_then(|()| {
                // SAFETY: as in drain; the DMA into the slot was enqueued just before on this
                // same stream, so it has landed when this one starts.
                unsafe { memcpy_htod_async(stream, dst.raw_ptr(), slot_host.cast_const().cast(), dst.bytes()) }
            })
        };
        // Noted even if the second DMA failed: the first is enqueued.
        let free = self.mark_free(slot, stream, dst)?;
        src.note_use(&free);
        relayed?;
        Ok(free)
    }

    /// On the consumer's `stream`: wait until `slot` has landed, fold its first `dst.len()`
    /// elements into `dst` with a kernel that reads the slot across PCIe (zero-copy), and
    /// mark the slot free. Returns the slot's *free* point, which completes with the fold.
    pub fn drain_zero_copy<T: Element>(
        &mut self,
        slot: usize,
        stream: &Stream,
        dst: &mut DeviceViewMut<'_, T>,
        op: ReduceOp,
        divide_by: u32,
    ) -> Result<StreamPoint> {
        self.drain_with(slot, stream, dst, Fold::ZeroCopy { op, divide_by })
    }

    /// Before a fill: refuse a slot that still holds a chunk, and make the producer's
    /// `stream` wait until the slot's last consumer is done with it (nothing to enqueue where
    /// the consumer ran on the same stream). On one device the host does not ask first
    /// whether it is done: the query costs it about 2 us, the wait 0.4, and the GPU's time of
    /// small staged copies did not change measurably without the query (one H200,
    /// `benches/results/queries-h200/` at 9fbcbfe). Across devices it still asks, sparing the GPU a wait
    /// between devices in a small copy's critical path.
    fn claim(&self, slot: usize, stream: &Stream) -> Result<()> {
        if self.landed[slot].is_some() {
            return Err(Error::SlotBusy { slot });
        }
        if let Some(free) = &self.free[slot]
            && (free.device() == stream.device() || !free.is_complete()?)
        {
            stream.wait_point(free)?;
        }
        Ok(())
    }

    /// Make the consumer's `stream` wait until the slot's chunk has landed; refuses a slot
    /// that holds none.
    fn wait_landed(&self, slot: usize, stream: &Stream) -> Result<()> {
        let Some(landed) = &self.landed[slot] else { return Err(Error::SlotEmpty { slot }) };
        stream.wait_point(landed)?;
        Ok(())
    }

    /// After the consumer's work on `slot`: take the *free* point, note it as the last use
    /// of `dst` and of the ring's memory, and mark the slot empty.
    fn mark_free<T: Element>(
        &mut self,
        slot: usize,
        stream: &Stream,
        dst: &DeviceViewMut<'_, T>,
    ) -> Result<StreamPoint> {
        let point = stream.point()?;
        dst.note_use(&point);
        self.memory.uses().note(&point);
        self.free[slot] = Some(point.clone());
        self.landed[slot] = None;
        Ok(point)
    }

    /// The host address of a slot.
    fn slot_host(&mut self, slot: usize) -> *mut u8 {
        self.memory.host_ptr().wrapping_add(slot * self.slot_bytes)
    }

    /// Refuses a slot past the end, a chunk larger than a slot, and a stream or a view
    /// (`view`: its device) off the device of `side` of the ring.
    fn check(&self, slot: usize, bytes: usize, stream: &Stream, view: &Device, side: Side) -> Result<()> {
        if slot >= self.slots() {
            return Err(Error::NoSuchSlot { slot, slots: self.slots() });
        }
        if bytes > self.slot_bytes {
            return Err(Error::ChunkTooLarge { bytes, slot_bytes: self.slot_bytes });
        }
        let (device, stream_is, view_is, of) = match side {
            Side::Producer => (&self.producer, "the producer stream", "src", "the ring's producer"),
            Side::Consumer => (&self.consumer, "the consumer stream", "dst", "the ring's consumer"),
        };
        for (what, got) in [(stream_is, stream.device()), (view_is, view)] {
            if got != device {
                return Err(Error::WrongDevice { what, got: got.ordinal(), of, expected: device.ordinal() });
            }
        }
        Ok(())
    }
}

/// Which end of a ring a stream works for.
#[derive(Debug, Clone, Copy)]
enum Side {
    /// Fills slots by device-to-host DMA.
    Producer,
    /// Drains slots into its device.
    Consumer,
}

/// The staging rings kept across calls for one device pair or ring edge: one per slot count,
/// since callers pick the count by transfer size (a collective's large and small calls use
/// two), and a cache of one ring would replace it at every alternation, each time a pinned
/// allocation and a free. A ring is replaced only when a call needs bigger slots than its
/// count's ring has. A replaced ring is simply dropped: its memory outlives its GPU work by
/// the lifetime rule, so replacing never blocks the host.
#[derive(Default)]
pub struct RingCache {
    rings: Vec<StagingRing>,
}

/// Slot counts a cache keeps a ring for at once; a further count evicts the oldest.
const KEPT_SLOT_COUNTS: usize = 4;

impl RingCache {
    /// A cache with no ring yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The cached ring of `slots` slots if its slots hold at least `slot_bytes`, else a new
    /// one between `producer` and `consumer` (replacing that count's ring). If making the new
    /// one fails, the cache stays as it was.
    pub fn ensure(
        &mut self,
        producer: &Device,
        consumer: &Device,
        slots: usize,
        slot_bytes: usize,
    ) -> Result<&mut StagingRing> {
        let same_count = self.rings.iter().position(|r| r.slots() == slots);
        // A ring left holding a chunk (a call that failed between send and receive) would
        // refuse that slot for good: it is replaced like a ring with too small slots.
        let reusable =
            same_count.filter(|&i| self.rings[i].slot_bytes() >= slot_bytes && !self.rings[i].holds_any_chunk());
        let at = match (reusable, same_count) {
            (Some(i), _) => i,
            (None, Some(i)) => {
                self.rings[i] = StagingRing::new(producer, consumer, slots, slot_bytes)?;
                i
            }
            (None, None) => {
                let ring = StagingRing::new(producer, consumer, slots, slot_bytes)?;
                if self.rings.len() == KEPT_SLOT_COUNTS {
                    self.rings.remove(0);
                }
                self.rings.push(ring);
                self.rings.len() - 1
            }
        };
        Ok(&mut self.rings[at])
    }
}
