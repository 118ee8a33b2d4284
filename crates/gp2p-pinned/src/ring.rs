//! `StagingRing`: pinned slots and the events that let a pipeline reuse them safely.

use gp2p_cuda::{Device, DeviceView, DeviceViewMut, Event, EventKind, Stream};
use gp2p_kernels::{Element, ReduceOp};

use crate::{Error, PinnedBuffer, Result, copy_from_host, copy_to_host, reduce_from_host};

/// Slot starts are aligned to this many bytes, so every slot suits the 16-byte vector path
/// of the kernels and any element type.
const SLOT_ALIGN: usize = 256;

/// A ring of pinned host slots between a producer device (which fills a slot by D2H DMA)
/// and a consumer device (which drains it by H2D DMA, or reads it in a reduce kernel). On
/// one card both are the same device and the two sides run on different streams.
///
/// Each slot has two events: *landed* (recorded by the producer after its DMA into the
/// slot) and *free* (recorded by the consumer once done with it). [`StagingRing::fill`]
/// makes the producer stream wait for *free* and [`StagingRing::drain`] makes the consumer
/// stream wait for *landed* — both on the GPU, so the host never blocks, and a later call
/// that comes round to a slot waits for the earlier call's consumer to be done with it.
///
/// Not `Sync` in use: filling and draining take `&mut self`, since the order in which the
/// host enqueues them is what the events encode.
pub struct StagingRing {
    memory: PinnedBuffer<u8>,
    slot_bytes: usize,
    landed: Vec<Event>,
    free: Vec<Event>,
    cursor: usize,
    producer: Device,
    consumer: Device,
}

impl StagingRing {
    /// `slots` slots of at least `slot_bytes` bytes (rounded up to 256) between `producer`
    /// and `consumer`.
    pub fn new(producer: &Device, consumer: &Device, slots: usize, slot_bytes: usize) -> Result<Self> {
        if slots == 0 || slot_bytes == 0 {
            return Err(gp2p_cuda::Error::InvalidArgument {
                name: "slots",
                reason: format!("a ring needs at least one slot of at least one byte, got {slots} x {slot_bytes}"),
            }
            .into());
        }
        let slot_bytes = slot_bytes.next_multiple_of(SLOT_ALIGN);
        let memory = PinnedBuffer::alloc(producer, slots * slot_bytes)?;
        // Consumers read the slots through their own mapping; fail now, not mid-pipeline.
        memory.device_ptr(consumer)?;
        let landed = (0..slots).map(|_| Event::new(producer, EventKind::Sync)).collect::<Result<Vec<_>, _>>()?;
        let free = (0..slots).map(|_| Event::new(consumer, EventKind::Sync)).collect::<Result<Vec<_>, _>>()?;
        Ok(StagingRing {
            memory,
            slot_bytes,
            landed,
            free,
            cursor: 0,
            producer: producer.clone(),
            consumer: consumer.clone(),
        })
    }

    /// Number of slots.
    pub fn slots(&self) -> usize {
        self.landed.len()
    }

    /// Capacity of each slot in bytes.
    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// The next slot in round-robin order; the rotation continues across calls, so
    /// consecutive transfers spread over all slots.
    pub fn next_slot(&mut self) -> usize {
        let slot = self.cursor;
        self.cursor = (self.cursor + 1) % self.slots();
        slot
    }

    /// On the producer's `stream`: wait until `slot` is free, DMA `src` into it, and mark it
    /// landed.
    pub fn fill<T: Element>(&mut self, slot: usize, stream: &Stream, src: &DeviceView<'_, T>) -> Result<()> {
        self.check(slot, src.bytes(), stream, &self.producer, "producer stream")?;
        stream.wait(&self.free[slot])?;
        let offset = slot * self.slot_bytes;
        copy_to_host(stream, src, &mut self.memory.typed_view_mut(offset, src.len()))?;
        Ok(self.landed[slot].record(stream)?)
    }

    /// On the consumer's `stream`: wait until `slot` has landed, DMA its first `dst.len()`
    /// elements into `dst`, and mark the slot free.
    pub fn drain<T: Element>(&mut self, slot: usize, stream: &Stream, dst: &mut DeviceViewMut<'_, T>) -> Result<()> {
        self.check(slot, dst.bytes(), stream, &self.consumer, "consumer stream")?;
        stream.wait(&self.landed[slot])?;
        copy_from_host(stream, &self.memory.typed_view(slot * self.slot_bytes, dst.len()), dst)?;
        Ok(self.free[slot].record(stream)?)
    }

    /// On the consumer's `stream`: wait until `slot` has landed, fold its first `dst.len()`
    /// elements into `dst` with a kernel that reads the slot across PCIe (zero-copy), and
    /// mark the slot free.
    pub fn drain_reduce<T: Element>(
        &mut self,
        slot: usize,
        stream: &Stream,
        dst: &mut DeviceViewMut<'_, T>,
        op: ReduceOp,
        divide_by: u32,
    ) -> Result<()> {
        self.check(slot, dst.bytes(), stream, &self.consumer, "consumer stream")?;
        stream.wait(&self.landed[slot])?;
        let src = self.memory.typed_view(slot * self.slot_bytes, dst.len());
        reduce_from_host(stream, dst, &src, op, divide_by)?;
        Ok(self.free[slot].record(stream)?)
    }

    fn check(&self, slot: usize, bytes: usize, stream: &Stream, side: &Device, what: &'static str) -> Result<()> {
        if slot >= self.slots() {
            return Err(Error::NoSuchSlot { slot, slots: self.slots() });
        }
        if bytes > self.slot_bytes {
            return Err(Error::ChunkTooLarge { bytes, slot_bytes: self.slot_bytes });
        }
        if stream.device() != side {
            return Err(gp2p_cuda::Error::WrongDevice {
                what,
                got: stream.device().ordinal(),
                expected: side.ordinal(),
            }
            .into());
        }
        Ok(())
    }
}
