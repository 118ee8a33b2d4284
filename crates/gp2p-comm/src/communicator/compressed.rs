//! The communicator's compressed all-reduce: sum or avg of f32, f16 or bf16 with each value
//! sent as a one-byte code in blocks that share a scale, `gp2p_kernels::compress::all_reduce`'s
//! result bit for bit on every rank among more than two ranks, and between two above two
//! million values or where the two-shot is forced (`crate::compression::compressed_shots`),
//! below; otherwise between two ranks the one-shot, `all_reduce_one_shot`'s ([`one_shot`]).
//!
//! The blocks are dealt to the ranks as that reference's shards, each shard cut into pieces
//! whose wire fits a slot, and into up to four even pieces where it is long enough, so that in
//! each run one piece goes up while the one before comes down
//! ([`crate::compression::PIPELINED_PIECES`]). A call
//! is two runs of the rounds module's legs, chained on the pipeline's streams with no join
//! between (`Pipeline::run_chained`):
//! 1. every rank hands each other rank its pieces of that rank's shard, encoded in device
//!    memory and copied into its slots, and each owner copies the wires it gets into its
//!    device memory; once the last wire of a piece has landed, the owner folds the piece on
//!    its receive stream (its own values exact and the others' wires), encodes the fold once
//!    and decodes its own result from it, while later pieces cross the link (`PieceFold`);
//! 2. each owner hands its folded wires to every other rank through its slots, which copy
//!    them into device memory and decode them into their output. A fold's copy out waits for
//!    that fold alone (`WireLegs::after_fold`), so the second run's first pieces go up while
//!    the first run's last ones still come down.
//!
//! A wire crosses the link as a DMA of its scales and codes and a kernel that copies the
//! values of blocks that travel exact, only where there are such blocks (`WireLegs`).
//!
//! So each link carries (N − 1)/N·W up and down in the first run and W/N up, (N − 1)/N·W down
//! in the second, W being the buffer's wire: about half the buffer's bytes from f16 or bf16,
//! a quarter from f32. A wire's room also holds 4 bytes a value for blocks that travel exact
//! (NaN, infinities, tiny values), written and read only for those blocks: the slots and the
//! device memory the wires take (about 5 bytes a value and two slots, kept between calls)
//! make room for them, the link carries them only where they occur.
#![allow(unsafe_code)]

use std::ops::Range;

use gp2p_collectives::legs::{Buf, Leg, LegLanding, Readers};
use gp2p_cuda::codec::{WireFormat, fold_wire_addresses};
use gp2p_cuda::raw::Codec;
use gp2p_kernels::compress::shard_blocks;

#[cfg(test)]
use crate::compression::{MIN_PIECE_VALUES, PIPELINED_PIECES};
use crate::compression::{compressed_shots, piece_blocks};
use gp2p_kernels::compress::Shots;
use one_shot::OneShotPieces;

use super::*;
use crate::pipeline::{FoldInto, PieceFold, WireLand, WireLegs, WireOut};

/// Wires start on this many bytes in device memory (the codec's alignment).
const WIRE_ALIGN: usize = gp2p_cuda::raw::WIRE_ALIGN;

/// The pieces of one call and where their wires sit in the wire memory: the wire rank r
/// sent of piece p of this rank's shard at `got(r, p)`, this rank's fold of its piece p at
/// `folded(p)`, each in a room of `room` bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WirePieces {
    /// Per shard, its pieces' values as element indices, in order.
    pub(crate) pieces: Vec<Vec<Range<usize>>>,
    /// Bytes of the widest piece's wire, on the wire alignment: at most a slot.
    pub(crate) room: usize,
    /// The most pieces a shard has.
    pub(crate) most: usize,
    format: WireFormat,
    slot_bytes: usize,
}

impl WirePieces {
    /// The pieces of `len` values among `world` ranks: each shard cut as
    /// [`piece_blocks`] says.
    pub(crate) fn new(len: usize, world: usize, format: WireFormat, slot_bytes: usize) -> WirePieces {
        let size = format.block.get();
        let blocks = len.div_ceil(size);
        let piece_blocks = piece_blocks(len, world, format, slot_bytes);
        let pieces: Vec<Vec<Range<usize>>> =
            (0..world).map(|s| cut_into_pieces(shard_blocks(blocks, world, s), piece_blocks, size, len)).collect();
        let room = widest_room(pieces.iter().flatten(), format);
        let most = pieces.iter().map(Vec::len).max().unwrap_or(0);
        WirePieces { pieces, room, most, format, slot_bytes }
    }

    /// Bytes of wire memory a rank needs: a room per other rank and piece of its shard, one
    /// per piece of its fold, then the two stages (a slot each) at [`WirePieces::stages`].
    pub(crate) fn bytes(&self) -> usize {
        self.stages() + 2 * self.slot_bytes
    }

    /// Offset of the send stage; the receive stage follows a slot later.
    pub(crate) fn stages(&self) -> usize {
        (self.pieces.len() + 1) * self.most * self.room
    }

    /// Offset of the wire rank `writer` sent of piece `piece` of this rank's shard.
    pub(crate) fn got(&self, writer: usize, piece: usize) -> usize {
        (writer * self.most + piece) * self.room
    }

    /// Offset of this rank's fold of piece `piece` of its shard.
    pub(crate) fn folded(&self, piece: usize) -> usize {
        (self.pieces.len() * self.most + piece) * self.room
    }

    /// The first run: in round p(N − 1) + k − 1 each rank r encodes piece p of shard r + k from
    /// its input ([`Buf::Main`]) into its slot, and that shard's owner copies the wire to
    /// `got(r, p)` of its wire memory ([`Buf::Part`]).
    pub(crate) fn to_owners(&self, dtype_size: usize) -> (Rounds, Vec<usize>) {
        let world = self.pieces.len();
        let mut legs = Vec::new();
        for p in 0..self.most {
            for k in 1..world {
                for writer in 0..world {
                    let owner = (writer + k) % world;
                    let Some(values) = self.pieces[owner].get(p) else { continue };
                    let (src, dst) = ((Buf::Main, values.start * dtype_size), (Buf::Part, self.got(writer, p)));
                    let round = p * (world - 1) + k - 1;
                    legs.push(wire_leg(round, writer, Readers::One(owner), src, dst, values, self.format));
                }
            }
        }
        rounds_of(world, legs)
    }

    /// For each piece of `rank`'s shard, the leg of the first run (`rounds`, from
    /// [`WirePieces::to_owners`]) whose landing completes it: of the legs that bring `rank`
    /// the others' wires of the piece, the one of the latest round, whose landing comes last
    /// in `rank`'s steps (they land round by round).
    pub(crate) fn completing_legs(&self, rounds: &Rounds, rank: usize) -> Vec<usize> {
        let world = self.pieces.len();
        let lands = |leg: &Leg, p: usize| {
            leg.is_read_by(rank) && (0..world).any(|r| r != rank && leg.dst == (Buf::Part, self.got(r, p)))
        };
        (0..self.pieces[rank].len())
            .filter_map(|p| {
                let legs = rounds.legs.iter().enumerate().filter(|(_, leg)| lands(leg, p));
                legs.max_by_key(|(_, leg)| leg.round).map(|(i, _)| i)
            })
            .collect()
    }

    /// The second run: in round p each owner copies its fold of piece p from `folded(p)` of
    /// its wire memory ([`Buf::Part`]) into its slot, and every other rank decodes it into
    /// that piece of its output ([`Buf::Main`]).
    pub(crate) fn to_all(&self, dtype_size: usize) -> (Rounds, Vec<usize>) {
        let world = self.pieces.len();
        let mut legs = Vec::new();
        for p in 0..self.most {
            for (owner, pieces) in self.pieces.iter().enumerate() {
                let Some(values) = pieces.get(p) else { continue };
                let (src, dst) = ((Buf::Part, self.folded(p)), (Buf::Main, values.start * dtype_size));
                legs.push(wire_leg(p, owner, Readers::Others, src, dst, values, self.format));
            }
        }
        rounds_of(world, legs)
    }
}

/// The blocks `blocks` of a buffer of `len` values in blocks of `size`, cut into pieces of
/// `piece_blocks` blocks (the last may be shorter), as value ranges: a shard's pieces in the
/// two-shot, the whole buffer's in the one-shot.
fn cut_into_pieces(blocks: Range<usize>, piece_blocks: usize, size: usize, len: usize) -> Vec<Range<usize>> {
    let end = blocks.end;
    blocks
        .step_by(piece_blocks.max(1))
        .map(|first| (first * size).min(len)..((first + piece_blocks).min(end) * size).min(len))
        .collect()
}

/// The room every piece's wire gets: the widest of `pieces`' wires in `format`, on the wire
/// alignment.
fn widest_room<'a>(pieces: impl IntoIterator<Item = &'a Range<usize>>, format: WireFormat) -> usize {
    let widest = pieces.into_iter().map(|p| format.wire_bytes(p.len())).max().unwrap_or(0);
    widest.next_multiple_of(WIRE_ALIGN)
}

/// A leg of round `round` carrying `writer`'s wire of the piece `values` in `format` from
/// `src` to `dst`, landed as it is; with the piece's value count, as the runs take them.
fn wire_leg(
    round: usize,
    writer: usize,
    readers: Readers,
    src: (Buf, usize),
    dst: (Buf, usize),
    values: &Range<usize>,
    format: WireFormat,
) -> (Leg, usize) {
    let bytes = format.wire_bytes(values.len());
    (Leg { round, writer, readers, src, dst, bytes, landing: LegLanding::Copy }, values.len())
}

/// The rounds of `legs` among `world` ranks, and each leg's value count.
fn rounds_of(world: usize, legs: Vec<(Leg, usize)>) -> (Rounds, Vec<usize>) {
    let (legs, values) = legs.into_iter().unzip();
    (Rounds { world, legs }, values)
}

impl Communicator {
    /// How this communicator's compressed all-reduce of `len` values runs
    /// ([`crate::compression::compressed_shots`]): between two ranks the one-shot up to
    /// [`crate::compression::ONE_SHOT_MAX_VALUES`] (at every size where forced), the two-shot
    /// above and among more. Its result is `gp2p_kernels::compress::all_reduce_by`'s for these
    /// shots.
    pub fn compressed_shots(&self, len: usize) -> Shots {
        compressed_shots(self.world(), self.many.forced, len)
    }

    /// In place on every rank, compressed: `buf` becomes the sum (or for avg the average) of
    /// every rank's `buf`, each value crossing host memory as a code of one byte in blocks
    /// of `format.block` values sharing a scale (int8 or fp8 e4m3). The result is
    /// `gp2p_kernels::compress::all_reduce_by`'s bit for bit for the communicator's
    /// [`Communicator::compressed_shots`] (between two ranks up to two million values the
    /// one-shot, each input quantized once; above and among more the two-shot, each rank's own
    /// shard exact and the fold quantized once more), the same on every rank, each element within
    /// `gp2p_kernels::compress::error_bound` of the exact result; blocks with a NaN or an
    /// infinity, and tiny ones, travel exact (docs/compression.md has the scheme and its
    /// bound). Sum and avg of f32, f16 and bf16 only ([`Error::NotCompressible`] otherwise),
    /// and never chosen by itself: call it where that error is acceptable. Every rank must
    /// make the same call (length, op and format). One rank keeps its buffer as it is.
    ///
    /// Each link carries the buffer's wire (about half of bf16's bytes) up once and down
    /// once between two ranks, twice (N − 1)/N of it down among more; the wires take about
    /// 10 bytes a value of device memory in the one-shot (a room of about 5 bytes a value for
    /// each rank's wire), and in the two-shot N + 1 rooms for each piece of this rank's shard
    /// (the other ranks' wires of it and its fold's; 5.6 to 7.5 bytes a value in all) and two
    /// slots, kept for later calls. Capturable into a CUDA graph as the exact calls are.
    pub fn all_reduce_compressed<T: Element>(
        &mut self,
        buf: &mut DeviceViewMut<'_, T>,
        stream: &Stream,
        op: ReduceOp,
        format: WireFormat,
    ) -> Result<()> {
        check_compressible::<T>(op)?;
        self.check_call(stream, &[("buf", buf.device())])?;
        let (ptr, len) = (buf.raw_ptr(), buf.len());
        self.compressed_checked::<T>(InOut::in_place(ptr), len, stream, op, format, |point| buf.note_use(point))
    }

    /// [`Communicator::all_reduce_compressed`] out of place: `output` becomes the result,
    /// `input` stays as it was. `output` must have `input`'s length and lie apart from it.
    pub fn all_reduce_compressed_into<T: Element>(
        &mut self,
        input: &DeviceView<'_, T>,
        output: &mut DeviceViewMut<'_, T>,
        stream: &Stream,
        op: ReduceOp,
        format: WireFormat,
    ) -> Result<()> {
        check_compressible::<T>(op)?;
        let buf = self.check_into(stream, input, output)?;
        self.compressed_checked::<T>(buf, input.len(), stream, op, format, |point| {
            input.note_use(point);
            output.note_use(point);
        })
    }

    /// Both once their buffers are checked: `len` elements at `buf.src` and `buf.dst`, on
    /// this device, the same or apart.
    pub(super) fn compressed_checked<T: Element>(
        &mut self,
        buf: InOut,
        len: usize,
        stream: &Stream,
        op: ReduceOp,
        format: WireFormat,
        note: impl FnOnce(&StreamPoint),
    ) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        super::watchdog::refuse_capture(self.waits, stream)?;
        if self.world() == 1 {
            // Nothing travels: the input is the result, copied where it goes elsewhere.
            return self.all_reduce_checked::<T>(buf, len, stream, op, note);
        }
        let codec = Codec { dtype: T::DTYPE, format: format.format, block: format.block };
        let average = op == ReduceOp::Avg;
        let (world, slot_bytes) = (self.world(), self.layout.slot_bytes());
        let plan = match self.compressed_shots(len) {
            Shots::One => Plan::One(OneShotPieces::new(len, world, format, slot_bytes)),
            Shots::Two => Plan::Two(WirePieces::new(len, world, format, slot_bytes)),
        };
        let wires = self.take_wires(match &plan {
            Plan::One(plan) => plan.bytes(),
            Plan::Two(plan) => plan.bytes(),
        })?;
        let memory = wires.raw_ptr();
        let launch = |comm: &mut Self| {
            // SAFETY: `buf` is `len` elements of `T` on this device, its two addresses the
            // same or apart (the callers checked); `memory` is `wires`, device memory of this
            // device holding the plan's bytes, apart from `buf`, noted with the call's point
            // below (captured: kept for the process's life, see `take_wires`). Every rank
            // makes the same call, so the same plan.
            unsafe {
                match &plan {
                    Plan::Two(plan) => comm.enqueue_compressed(stream, buf, plan, memory, codec, average),
                    Plan::One(plan) => comm.enqueue_one_shot(stream, buf, plan, memory, codec, average),
                }
            }
        };
        let result = self.call(stream, launch, |point| {
            note(point);
            wires.view(..).note_use(point);
        });
        self.wires = Some(wires);
        result
    }

    /// The call's two runs on `stream` (see the module's doc).
    ///
    /// # Safety
    /// - `buf` is the plan's values of `codec.dtype` in this device's memory, its two
    ///   addresses the same or apart, held until the work completes;
    /// - `memory` is `plan.bytes()` of this device's memory, apart from `buf` and held
    ///   likewise, that nothing else touches meanwhile;
    /// - every other rank enqueues the same call.
    unsafe fn enqueue_compressed(
        &self,
        stream: &Stream,
        buf: InOut,
        plan: &WirePieces,
        memory: RawDevicePtr,
        codec: Codec,
        average: bool,
    ) -> Result<()> {
        let (rank, world) = (self.rank(), self.world());
        let size = codec.dtype.size_bytes();
        let at = |base: RawDevicePtr, offset: usize| base + offset as u64;
        let format = WireFormat { format: codec.format, block: codec.block };
        let side = self.side();
        let (rounds, values) = plan.to_owners(size);
        let stages = [at(memory, plan.stages()), at(memory, plan.stages() + self.layout.slot_bytes())];
        // Each piece of this rank's shard folds once its last wire has landed: its own values
        // exact and the wires the others sent of it, into its fold's room, which no leg reads
        // until the second run; then decoded into that piece of the output.
        let mut folds = Vec::with_capacity(plan.pieces[rank].len());
        let completing = plan.completing_legs(&rounds, rank);
        for ((p, values), after_leg) in plan.pieces[rank].iter().enumerate().zip(completing) {
            let placed: Vec<Option<(RawDevicePtr, usize)>> =
                (0..world).map(|r| (r != rank).then(|| (at(memory, plan.got(r, p)), plan.room))).collect();
            let wires = fold_wire_addresses(format, values.len(), rank, &placed)?;
            let (own, out) = (at(buf.src, values.start * size), at(memory, plan.folded(p)));
            folds.push(PieceFold {
                piece: p,
                after_leg,
                values: values.len(),
                wires,
                dst: at(buf.dst, values.start * size),
                average,
                into: FoldInto::Gather { own, owner: rank, out },
            });
        }
        let (out, land, after_fold) = (WireOut::Encode, WireLand::Copy, Vec::new());
        let wires = Some(WireLegs { codec, out, land, values, stages, folds, after_fold });
        let to_owners = wire_run(rounds, codec, buf.src, memory, wires);
        let (rounds, values) = plan.to_all(size);
        // This rank's legs copy out its folds, piece p in round p: each after that fold.
        let after_fold = rounds.legs.iter().map(|leg| (leg.writer == rank).then_some(leg.round)).collect();
        let (out, land, folds) = (WireOut::Copy, WireLand::Decode, Vec::new());
        let wires = Some(WireLegs { codec, out, land, values, stages, folds, after_fold });
        let to_all = wire_run(rounds, codec, buf.dst, memory, wires);
        // SAFETY: the first run's legs encode pieces of the input into slots and land their
        // wires in rooms of `memory` (the plan's offsets, each wire at most its room and a
        // slot), and each piece of this rank's shard folds from its rooms into its own room and
        // its piece of the output. The second run's legs copy each fold out of `memory`, after
        // that fold (`after_fold`), and decode the others' into their pieces of the output:
        // ranges the first run only read, and read on this rank's send stream before its
        // copies out, which every owner's fold (hence every fold the second run lands) waits
        // for through the flags. Every rank runs the same legs.
        unsafe { self.pipeline.run_chained(stream, side, &[to_owners, to_all]) }
    }

    /// The one-shot's run on `stream` (see [`one_shot`]).
    ///
    /// # Safety
    /// As for [`Communicator::enqueue_compressed`], with `memory` holding `plan.bytes()`.
    unsafe fn enqueue_one_shot(
        &self,
        stream: &Stream,
        buf: InOut,
        plan: &OneShotPieces,
        memory: RawDevicePtr,
        codec: Codec,
        average: bool,
    ) -> Result<()> {
        let (rank, world) = (self.rank(), self.world());
        let size = codec.dtype.size_bytes();
        let at = |base: RawDevicePtr, offset: usize| base + offset as u64;
        let (rounds, values) = plan.legs(size);
        let Some(completing) = plan.completing_legs(&rounds, rank) else {
            let what = format!("the one-shot compressed all-reduce among {world} ranks");
            return Err(Error::NotBuiltYet { what, supported: "it between two ranks (the two-shot among more)" });
        };
        // Each piece folds once the other rank's wire of it has landed: every rank's wire, this
        // rank's own as its encode left it, into that piece of the output.
        let folds = plan
            .pieces
            .iter()
            .zip(completing)
            .enumerate()
            .map(|(p, (values, after_leg))| PieceFold {
                piece: p,
                after_leg,
                values: values.len(),
                wires: (0..world).map(|r| at(memory, plan.got(r, p))).collect(),
                dst: at(buf.dst, values.start * size),
                average,
                into: FoldInto::Result,
            })
            .collect();
        // The stages go unused: each wire is encoded into its kept room and landed into its
        // own, both device memory of `memory`.
        let (out, land, stages) = (WireOut::EncodeKept, WireLand::Copy, [memory, memory]);
        let wires = Some(WireLegs { codec, out, land, values, stages, folds, after_fold: Vec::new() });
        let transfer = wire_run(rounds, codec, buf.src, memory, wires);
        // SAFETY: the legs encode pieces of the input (`buf.src`) into this rank's rooms of
        // `memory` and land the other rank's wires into its rooms (the plan's offsets, each
        // wire at most its room and a slot, the rooms apart); each piece folds every room of
        // it into its piece of `buf.dst` once its wire landed and after this rank's encode of
        // it (the piece's event), so in place the input is read before it is overwritten, and
        // no leg reads the output. Every rank runs the same legs.
        unsafe { self.pipeline.run_many(stream, self.side(), &transfer) }
    }

    /// The wires' memory for a call of `bytes`: the kept buffer if it holds them, else a new
    /// one. A buffer too small is dropped (freed once its noted work is done) or, once a
    /// call was captured into a graph that may still replay with it, kept for the process's
    /// life.
    fn take_wires(&mut self, bytes: usize) -> Result<DeviceBuffer<u8>> {
        match self.wires.take() {
            Some(kept) if kept.len() >= bytes => Ok(kept),
            kept => {
                if self.capture == Capture::Used {
                    std::mem::forget(kept);
                }
                Ok(DeviceBuffer::alloc(&self.device, bytes)?)
            }
        }
    }
}

/// A compressed call's plan, as its shots say.
enum Plan {
    One(OneShotPieces),
    Two(WirePieces),
}

/// A run of wire legs on `main` (this rank's input or output) and the wire memory `part`: their
/// folds are the wires' own, so no op, divisor or local copy of the exact rounds.
fn wire_run(
    rounds: Rounds,
    codec: Codec,
    main: RawDevicePtr,
    part: RawDevicePtr,
    wires: Option<WireLegs>,
) -> ManyTransfer {
    ManyTransfer { rounds, dtype: codec.dtype, main, part, op: ReduceOp::Sum, divide_by: 1, local: None, wires }
}

/// Whether the compressed all-reduce takes `op` on `T`: sum or avg of f32, f16 or bf16.
pub(super) fn compressible<T: Element>(op: ReduceOp) -> bool {
    matches!(T::DTYPE, DType::F32 | DType::F16 | DType::BF16) && matches!(op, ReduceOp::Sum | ReduceOp::Avg)
}

/// Refuses what the compressed all-reduce does not take.
fn check_compressible<T: Element>(op: ReduceOp) -> Result<()> {
    if !compressible::<T>(op) {
        return Err(Error::NotCompressible { op, dtype: T::DTYPE });
    }
    Ok(())
}

mod one_shot;
#[cfg(test)]
mod tests;
