//! `FanOut`: one writer's pinned slots, each chunk copied in once and landed by every reader
//! that needs it (an all-gather's part, a broadcast, a folded share), where a
//! [`crate::StagingRing`] has one consumer.
#![allow(unsafe_code)]

use gp2p_cuda::raw::memcpy_dtoh_async;
use gp2p_cuda::{Device, DeviceView, DeviceViewMut, HostAllocation, RawDevicePtr, Stream, StreamPoint};
use gp2p_kernels::Element;

use crate::ring::{MAX_SLOTS, SLOT_ALIGN, check_fold, fold_staged};
use crate::{Error, Fold, Result};

/// Pinned host slots of one writer device, mapped into every reader's device, with a
/// [`StreamPoint`] per slot where its chunk landed and one per slot and reader where that
/// reader was last done with it.
///
/// [`FanOut::fill`] waits (on the GPU) until the slot's last fill is done and every reader
/// that landed a chunk of the slot is done with it, then copies the new chunk in;
/// [`FanOut::land`] waits until the slot's chunk is in (and this reader's last landing of the
/// slot is done), then copies or folds it into the reader's buffer. A fill replaces the
/// slot's chunk whether or not every reader landed it: readers land what is meant for them
/// before the writer comes round to the slot again. So the host never blocks,
/// the slot's bytes never change under a reader, and a later call that comes round to a slot
/// waits for the earlier call's readers. The points are the last uses of the views passed in
/// and of the slots' memory, so dropping any of them (or the fan-out) right after a call is
/// safe and does not block.
///
/// Readers are numbered `0..readers.len()` (ranks, in the engine); several may share a
/// device. Not `Sync` in use: filling and landing take `&mut self`, since the order in which
/// the host enqueues them is what the points encode.
pub struct FanOut {
    memory: HostAllocation,
    writer: Device,
    readers: Vec<Device>,
    /// The slots' base address as each reader's device sees it (zero-copy folds).
    reader_bases: Vec<RawDevicePtr>,
    slot_bytes: usize,
    /// Per slot: the point after the last fill and the bytes it put there, once there was one.
    landed: Vec<Option<(StreamPoint, usize)>>,
    /// Per slot and reader: the point after that reader last landed the slot.
    free: Vec<Vec<Option<StreamPoint>>>,
}

impl FanOut {
    /// `slots` slots of at least `slot_bytes` bytes (rounded up to 256) that `writer` fills
    /// and `readers` land.
    pub fn new(writer: &Device, readers: &[Device], slots: usize, slot_bytes: usize) -> Result<Self> {
        if slots == 0 || slots > MAX_SLOTS || slot_bytes == 0 {
            return Err(Error::InvalidArgument {
                name: "slots",
                reason: format!(
                    "a fan-out takes 1 to {MAX_SLOTS} slots of at least one byte, got {slots} x {slot_bytes}"
                ),
            });
        }
        let too_big = || Error::InvalidArgument {
            name: "slot_bytes",
            reason: format!("{slots} slots of {slot_bytes} bytes overflow the address space"),
        };
        let slot_bytes = slot_bytes.checked_next_multiple_of(SLOT_ALIGN).ok_or_else(too_big)?;
        let total = slots.checked_mul(slot_bytes).ok_or_else(too_big)?;
        for reader in readers {
            reader.require_host_mapping()?;
        }
        let memory = HostAllocation::new(writer, total)?;
        // Every reader's mapping now, not mid-pipeline.
        let reader_bases = readers.iter().map(|d| memory.device_ptr(d)).collect::<Result<Vec<_>, _>>()?;
        Ok(FanOut {
            memory,
            writer: writer.clone(),
            readers: readers.to_vec(),
            reader_bases,
            slot_bytes,
            landed: vec![None; slots],
            free: vec![vec![None; readers.len()]; slots],
        })
    }

    /// Slots.
    pub fn slots(&self) -> usize {
        self.landed.len()
    }

    /// Bytes a slot holds.
    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// Whether these slots serve `writer` and `readers`, at least `slots` of at least
    /// `slot_bytes` (a caller that uses fewer slots or shorter chunks keeps them).
    pub fn fits(&self, writer: &Device, readers: &[Device], slots: usize, slot_bytes: usize) -> bool {
        &self.writer == writer && self.readers == readers && self.slots() >= slots && self.slot_bytes >= slot_bytes
    }

    /// On the writer's `stream`: wait until every reader is done with `slot`, copy `src` into
    /// it, and take the slot's *landed* point, which this returns.
    pub fn fill<T: Element>(&mut self, slot: usize, stream: &Stream, src: &DeviceView<'_, T>) -> Result<StreamPoint> {
        self.check(slot, src.bytes())?;
        for (what, got) in [("the writer stream", stream.device()), ("src", src.device())] {
            if got != &self.writer {
                return Err(Error::WrongDevice {
                    what,
                    got: got.ordinal(),
                    of: "the fan-out's writer",
                    expected: self.writer.ordinal(),
                });
            }
        }
        // After the slot's last fill (on whatever stream it ran) and every reader's last
        // landing of it: each point then covers all the slot's earlier ones.
        for point in self.landed[slot].iter().map(|(p, _)| p).chain(self.free[slot].iter().flatten()) {
            stream.wait_point(point)?;
        }
        if !src.is_empty() {
            let to = self.memory.host_ptr().wrapping_add(slot * self.slot_bytes);
            // SAFETY: the slot holds slot_bytes >= src.bytes() pinned bytes (checked) that no
            // reader still reads and no earlier fill still writes: the stream waited for the
            // slot's last fill and every reader's last landing of it, and the memory outlives
            // the point noted below. src is on the stream's device.
            unsafe { memcpy_dtoh_async(stream, to.cast(), src.raw_ptr(), src.bytes())? };
        }
        let point = stream.point()?;
        src.note_use(&point);
        self.memory.uses().note(&point);
        self.landed[slot] = Some((point.clone(), src.bytes()));
        Ok(point)
    }

    /// On reader `reader`'s `stream`: wait until `slot`'s chunk is in, fold its first
    /// `dst.len()` elements into `dst` as `fold` says, and take the reader's point for the
    /// slot, which this returns (once it completes, `dst` holds the result). Refused for a
    /// slot never filled.
    pub fn land<T: Element>(
        &mut self,
        slot: usize,
        reader: usize,
        stream: &Stream,
        dst: &mut DeviceViewMut<'_, T>,
        fold: Fold<'_, T>,
    ) -> Result<StreamPoint> {
        self.check(slot, dst.bytes())?;
        let Some(device) = self.readers.get(reader) else {
            return Err(Error::InvalidArgument {
                name: "reader",
                reason: format!("reader {reader} of a fan-out to {}", self.readers.len()),
            });
        };
        for (what, got) in [("the reader stream", stream.device()), ("dst", dst.device())] {
            if got != device {
                return Err(Error::WrongDevice {
                    what,
                    got: got.ordinal(),
                    of: "the reader",
                    expected: device.ordinal(),
                });
            }
        }
        check_fold(&fold, dst.len(), device)?;
        let Some((landed, filled)) = &self.landed[slot] else { return Err(Error::SlotEmpty { slot }) };
        if dst.bytes() > *filled {
            return Err(Error::ReceiveSize { got: dst.bytes(), sent: *filled });
        }
        stream.wait_point(landed)?;
        // After this reader's last landing of the slot too, so that its point, which the next
        // fill waits for, covers that one as well.
        if let Some(free) = &self.free[slot][reader] {
            stream.wait_point(free)?;
        }
        let offset = slot * self.slot_bytes;
        let host = self.memory.host_ptr().wrapping_add(offset).cast_const();
        let mapped = self.reader_bases[reader] + offset as u64;
        // SAFETY: the slot's first dst.bytes() bytes hold the chunk (no more than the fill
        // put there, checked; the stream waited for the fill) and do not change until this
        // reader's point, taken below, completes (the next fill waits for it); `mapped` is the
        // slot as the reader's device maps it; dst is on the stream's device (checked) and the
        // fold was checked.
        let folded = unsafe { fold_staged(stream, dst, host, mapped, &fold) };
        // Taken even if a launch failed: whatever was enqueued before it must be noted. (A
        // point that cannot be taken waits for the stream before it errs.)
        let taken = stream.point();
        if let Ok(point) = &taken {
            dst.note_use(point);
            if let Fold::Scratch { scratch, .. } = &fold {
                scratch.note_use(point);
            }
            self.memory.uses().note(point);
            self.free[slot][reader] = Some(point.clone());
        }
        folded?;
        taken.map_err(Into::into)
    }

    /// Refuses a slot past the end and a chunk larger than a slot.
    fn check(&self, slot: usize, bytes: usize) -> Result<()> {
        if slot >= self.slots() {
            return Err(Error::NoSuchSlot { slot, slots: self.slots() });
        }
        if bytes > self.slot_bytes {
            return Err(Error::ChunkTooLarge { bytes, slot_bytes: self.slot_bytes });
        }
        Ok(())
    }
}

impl std::fmt::Debug for FanOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FanOut")
            .field("writer", &self.writer.ordinal())
            .field("readers", &self.readers.len())
            .field("slots", &self.slots())
            .field("slot_bytes", &self.slot_bytes)
            .finish()
    }
}
