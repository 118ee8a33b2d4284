//! The compressed all-reduce's block codec on addresses: encode a range into a wire, fold
//! every rank's wire of one shard into a new wire, decode a wire, fold every rank's wire into
//! the result (the one-shot), and a wire's crossing
//! between device and pinned host memory (`kernels/compress.cu`; the
//! wire's layout is [`gp2p_kernels::compress::WireLayout`]). The bits are those of the CPU
//! reference, [`gp2p_kernels::compress`].

use gp2p_kernels::compress::{BlockSize, Format, WireLayout};
use gp2p_kernels::{CODEC_MAX_RANKS, COPY_EXACT_BLOCKS_KERNEL, CodecKernel, DType, KernelFamily, compress_kernel_name};

use super::{check_aligned, memcpy_dtoh_async, memcpy_htod_async};
use crate::driver::RawDevicePtr;
use crate::launch::{KernelArgs, launch_kernel};
use crate::replay::Params;
use crate::{Error, LaunchConfig, Module, Result, Stream};

/// Threads per CUDA block of the codec kernels: eight warps, a warp per value block.
const THREADS: u32 = 256;
/// The most CUDA blocks a codec launch takes per multiprocessor (the kernels loop over the
/// value blocks beyond).
const BLOCKS_PER_SM: u32 = 16;

/// A wire's alignment: its parts start on 16 bytes from its start.
pub const WIRE_ALIGN: usize = 16;

/// What every codec call shares: the values' type, the format and the block size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Codec {
    /// f32, f16 or bf16.
    pub dtype: DType,
    /// How scaled blocks travel.
    pub format: Format,
    /// Values per block.
    pub block: BlockSize,
}

impl Codec {
    /// The layout of a wire of `len` values.
    pub fn layout(self, len: usize) -> WireLayout {
        WireLayout { values: len, block: self.block }
    }

    fn function(self, stream: &Stream, kernel: CodecKernel) -> Result<crate::Function> {
        let name = compress_kernel_name(kernel, self.format, self.dtype).ok_or_else(|| Error::InvalidArgument {
            name: "dtype",
            reason: format!("the compressed all-reduce takes f32, f16 or bf16, not {}", self.dtype),
        })?;
        Module::kernels(stream.device(), KernelFamily::Compress)?.function(name)
    }

    fn config(self, stream: &Stream, len: usize) -> LaunchConfig {
        let warps_per_block = (THREADS / 32) as usize;
        let blocks = self.layout(len).blocks().div_ceil(warps_per_block).max(1);
        let cap = (stream.device().info().multiprocessors * BLOCKS_PER_SM) as usize;
        LaunchConfig { grid: blocks.min(cap) as u32, block: THREADS, shared_bytes: 0 }
    }
}

struct EncodeArgs {
    src: RawDevicePtr,
    len: u64,
    block: u32,
    wire: RawDevicePtr,
}

impl KernelArgs for EncodeArgs {
    fn params(&self) -> Params {
        Params::default().u64(self.src).u64(self.len).u32(self.block).u64(self.wire)
    }
}

struct FoldArgs {
    own: RawDevicePtr,
    len: u64,
    block: u32,
    wires: [RawDevicePtr; CODEC_MAX_RANKS],
    ranks: u32,
    owner: u32,
    average: u32,
    out: RawDevicePtr,
}

impl KernelArgs for FoldArgs {
    fn params(&self) -> Params {
        let head = Params::default().u64(self.own).u64(self.len).u32(self.block);
        let with_wires = self.wires.iter().fold(head, |p, &w| p.u64(w));
        with_wires.u32(self.ranks).u32(self.owner).u32(self.average).u64(self.out)
    }
}

struct FoldDecodeArgs {
    len: u64,
    block: u32,
    wires: [RawDevicePtr; CODEC_MAX_RANKS],
    ranks: u32,
    average: u32,
    dst: RawDevicePtr,
}

impl KernelArgs for FoldDecodeArgs {
    fn params(&self) -> Params {
        let head = Params::default().u64(self.len).u32(self.block);
        let with_wires = self.wires.iter().fold(head, |p, &w| p.u64(w));
        with_wires.u32(self.ranks).u32(self.average).u64(self.dst)
    }
}

struct DecodeArgs {
    wire: RawDevicePtr,
    len: u64,
    block: u32,
    dst: RawDevicePtr,
}

impl KernelArgs for DecodeArgs {
    fn params(&self) -> Params {
        Params::default().u64(self.wire).u64(self.len).u32(self.block).u64(self.dst)
    }
}

/// Enqueue `wire = encode(src)` for `len` values of `codec.dtype` on `stream`.
///
/// # Safety
/// - `src` is `len` readable values and `wire` `codec.layout(len).bytes()` writable bytes,
///   each addressable from the stream's device (device memory or mapped pinned host
///   memory), apart;
/// - both stay allocated, nothing else writes `src` or touches `wire`, until the kernel
///   completes on `stream`.
pub unsafe fn compress_encode(
    stream: &Stream,
    codec: Codec,
    src: RawDevicePtr,
    len: usize,
    wire: RawDevicePtr,
) -> Result<()> {
    check_aligned(&[("src", src)], codec.dtype.size_bytes())?;
    check_aligned(&[("wire", wire)], WIRE_ALIGN)?;
    if len == 0 {
        return Ok(());
    }
    let function = codec.function(stream, CodecKernel::Encode)?;
    let args = EncodeArgs { src, len: len as u64, block: codec.block.get() as u32, wire };
    // SAFETY: an encode kernel of the codec's type and format; the ranges: the caller's.
    unsafe { launch_kernel(&function, stream, codec.config(stream, len), &args, None) }
}

/// Enqueue `out = encode(fold)` on `stream`, the fold in rank order over `wires.len()` ranks
/// of `len` values each: rank `owner`'s values are `own` as they are, every other rank r's
/// are decoded from `wires[r]` (`wires[owner]` is not read); for `average` the fold is
/// multiplied by the f32 reciprocal of the ranks.
///
/// # Safety
/// - `own` is `len` readable values, `out` `codec.layout(len).bytes()` writable bytes, and
///   each `wires[r]` but the owner's a wire of `len` values that [`compress_encode`] wrote
///   with the same codec, each addressable from the stream's device; `out` apart from the
///   rest;
/// - all stay allocated, nothing writes what the kernel reads and nothing else touches `out`,
///   until the kernel completes on `stream`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn compress_fold_encode(
    stream: &Stream,
    codec: Codec,
    own: RawDevicePtr,
    len: usize,
    wires: &[RawDevicePtr],
    owner: usize,
    average: bool,
    out: RawDevicePtr,
) -> Result<()> {
    let (ranks, all) = fold_wires(wires)?;
    if owner >= ranks {
        return Err(Error::InvalidArgument { name: "owner", reason: format!("rank {owner} of {ranks}") });
    }
    check_aligned(&[("own", own)], codec.dtype.size_bytes())?;
    check_aligned(&[("out", out)], WIRE_ALIGN)?;
    // The owner's entry is not read (its values are `own`): checked as 0.
    let mut others = all.map(|w| ("wires", w));
    others[owner].1 = 0;
    check_aligned(&others[..ranks], WIRE_ALIGN)?;
    if len == 0 {
        return Ok(());
    }
    let function = codec.function(stream, CodecKernel::FoldEncode)?;
    let args = FoldArgs {
        own,
        len: len as u64,
        block: codec.block.get() as u32,
        wires: all,
        ranks: ranks as u32,
        owner: owner as u32,
        average: u32::from(average),
        out,
    };
    // SAFETY: a fold kernel of the codec's type and format; the ranges: the caller's.
    unsafe { launch_kernel(&function, stream, codec.config(stream, len), &args, None) }
}

/// A fold's wires as its kernels take them, eight addresses (0 past the ranks), with the
/// number of ranks: 1 to [`CODEC_MAX_RANKS`].
fn fold_wires(wires: &[RawDevicePtr]) -> Result<(usize, [RawDevicePtr; CODEC_MAX_RANKS])> {
    let ranks = wires.len();
    if !(1..=CODEC_MAX_RANKS).contains(&ranks) {
        return Err(Error::InvalidArgument {
            name: "wires",
            reason: format!("{ranks} ranks: a fold takes 1 to {CODEC_MAX_RANKS}"),
        });
    }
    let mut all = [0; CODEC_MAX_RANKS];
    all[..ranks].copy_from_slice(wires);
    Ok((ranks, all))
}

/// Enqueue `dst = fold` on `stream`, the fold in rank order over `wires.len()` ranks of `len`
/// values each, every rank r's decoded from `wires[r]`, multiplied by the f32 reciprocal of
/// the ranks for `average`, each value rounded once to `codec.dtype`: the one-shot
/// compressed all-reduce's result (`gp2p_kernels::compress::all_reduce_one_shot`).
///
/// # Safety
/// - each `wires[r]` is a wire of `len` values that [`compress_encode`] wrote with the same
///   codec and `dst` `len` writable values, each addressable from the stream's device, `dst`
///   apart from the wires;
/// - all stay allocated, nothing writes the wires and nothing else touches `dst`, until the
///   kernel completes on `stream`.
pub unsafe fn compress_fold_decode(
    stream: &Stream,
    codec: Codec,
    wires: &[RawDevicePtr],
    len: usize,
    average: bool,
    dst: RawDevicePtr,
) -> Result<()> {
    let (ranks, all) = fold_wires(wires)?;
    check_aligned(&[("dst", dst)], codec.dtype.size_bytes())?;
    check_aligned(&all.map(|w| ("wires", w))[..ranks], WIRE_ALIGN)?;
    if len == 0 {
        return Ok(());
    }
    let function = codec.function(stream, CodecKernel::FoldDecode)?;
    let args = FoldDecodeArgs {
        len: len as u64,
        block: codec.block.get() as u32,
        wires: all,
        ranks: ranks as u32,
        average: u32::from(average),
        dst,
    };
    // SAFETY: a fold kernel of the codec's type and format; the ranges: the caller's.
    unsafe { launch_kernel(&function, stream, codec.config(stream, len), &args, None) }
}

/// Enqueue `dst = decode(wire)` for `len` values on `stream`, each rounded once to
/// `codec.dtype`.
///
/// # Safety
/// - `wire` is a wire of `len` values that [`compress_encode`] or [`compress_fold_encode`]
///   wrote with the same codec, and `dst` `len` writable values, each addressable from the
///   stream's device, apart;
/// - both stay allocated, nothing writes `wire` and nothing else touches `dst`, until the
///   kernel completes on `stream`.
pub unsafe fn compress_decode(
    stream: &Stream,
    codec: Codec,
    wire: RawDevicePtr,
    len: usize,
    dst: RawDevicePtr,
) -> Result<()> {
    check_aligned(&[("dst", dst)], codec.dtype.size_bytes())?;
    check_aligned(&[("wire", wire)], WIRE_ALIGN)?;
    if len == 0 {
        return Ok(());
    }
    let function = codec.function(stream, CodecKernel::Decode)?;
    let args = DecodeArgs { wire, len: len as u64, block: codec.block.get() as u32, dst };
    // SAFETY: a decode kernel of the codec's type and format; the ranges: the caller's.
    unsafe { launch_kernel(&function, stream, codec.config(stream, len), &args, None) }
}

/// Enqueue on `stream` the crossing of the wire of `len` values in blocks of `block` at
/// `wire` (device memory) into pinned host memory, `host` as the host sees it and `mapped` as
/// this device maps it: a DMA of its words and codes (its first `WireLayout::exact_offset`
/// bytes), then a kernel that copies the values of the blocks that travel exact (nothing
/// where there are none). So about 1 + 4/block bytes a value cross the link, not the room's
/// 5 + 4/block; the rest of the host room is left as it is, and a reader never looks there.
/// `after_dma` runs once the DMA is enqueued, before the kernel is, with the bytes the DMA
/// moves (a timeline's stamp between the two, say; `|_| Ok(())` for nothing).
///
/// # Safety
/// - `wire` is a wire of `len` values that [`compress_encode`] or [`compress_fold_encode`]
///   wrote with this block size, on the stream's device; `host` and `mapped` are one range of
///   pinned host memory of `WireLayout::bytes` writable bytes for it, apart from `wire`;
/// - both stay allocated, nothing writes `wire` and nothing else touches the host range,
///   until the work completes on `stream`.
pub unsafe fn wire_to_host(
    stream: &Stream,
    block: BlockSize,
    wire: RawDevicePtr,
    len: usize,
    host: *mut u8,
    mapped: RawDevicePtr,
    after_dma: impl FnOnce(usize) -> Result<()>,
) -> Result<()> {
    let dense = WireLayout { values: len, block }.exact_offset();
    // SAFETY: the caller's ranges; the kernel reads the words from `wire` itself.
    unsafe { memcpy_dtoh_async(stream, host.cast(), wire, dense)? };
    after_dma(dense)?;
    // SAFETY: as for the DMA.
    unsafe { copy_exact_blocks(stream, block, wire, len, mapped, wire) }
}

/// Enqueue on `stream` the crossing of a wire of `len` values in pinned host memory (`host`
/// as the host sees it, `mapped` as this device maps it) into `wire` in device memory: what
/// [`wire_to_host`] sent, the exact blocks' kernel reading the words the DMA put in `wire`;
/// `after_dma` as there.
///
/// # Safety
/// - the host range holds a wire of `len` values written as [`wire_to_host`] writes it, with
///   this block size; `wire` is `WireLayout::bytes` writable bytes of the stream's device,
///   apart from it;
/// - both stay allocated, nothing writes the host range and nothing else touches `wire`,
///   until the work completes on `stream`.
pub unsafe fn wire_from_host(
    stream: &Stream,
    block: BlockSize,
    host: *const u8,
    mapped: RawDevicePtr,
    len: usize,
    wire: RawDevicePtr,
    after_dma: impl FnOnce(usize) -> Result<()>,
) -> Result<()> {
    let dense = WireLayout { values: len, block }.exact_offset();
    // SAFETY: the caller's ranges.
    unsafe { memcpy_htod_async(stream, wire, host.cast(), dense)? };
    after_dma(dense)?;
    // SAFETY: the caller's ranges; the kernel reads the words the DMA before it (same stream)
    // put in `wire`.
    unsafe { copy_exact_blocks(stream, block, mapped, len, wire, wire) }
}

/// The exact blocks' kernel ([`COPY_EXACT_BLOCKS_KERNEL`]): their values from the wire at
/// `src` into the wire at `dst`, the blocks told by the words at `words`.
///
/// # Safety
/// `words` holds the words of the wire `src` holds, `src` readable and `dst` writable for
/// `WireLayout::bytes` bytes of `len` values, each addressable from the stream's device, `dst`
/// apart from the other two; all stay allocated, untouched by others, until the kernel ends.
unsafe fn copy_exact_blocks(
    stream: &Stream,
    block: BlockSize,
    src: RawDevicePtr,
    len: usize,
    dst: RawDevicePtr,
    words: RawDevicePtr,
) -> Result<()> {
    check_aligned(&[("src", src), ("dst", dst), ("words", words)], WIRE_ALIGN)?;
    if len == 0 {
        return Ok(());
    }
    let function = Module::kernels(stream.device(), KernelFamily::Compress)?.function(COPY_EXACT_BLOCKS_KERNEL)?;
    // A warp per value block.
    let threads = 32 * WireLayout { values: len, block }.blocks();
    let cap = (stream.device().info().multiprocessors * BLOCKS_PER_SM) as usize;
    let grid = threads.div_ceil(THREADS as usize).clamp(1, cap) as u32;
    let config = LaunchConfig { grid, block: THREADS, shared_bytes: 0 };
    let args = CopyArgs { src, len: len as u64, block: block.get() as u32, dst, words };
    // SAFETY: the copy kernel; the ranges: the caller's.
    unsafe { launch_kernel(&function, stream, config, &args, None) }
}

struct CopyArgs {
    src: RawDevicePtr,
    len: u64,
    block: u32,
    dst: RawDevicePtr,
    words: RawDevicePtr,
}

impl KernelArgs for CopyArgs {
    fn params(&self) -> Params {
        Params::default().u64(self.src).u64(self.len).u32(self.block).u64(self.dst).u64(self.words)
    }
}

/// Launch every codec kernel once on `stream` with no values (each returns before it touches
/// memory), so that none is loaded lazily later (see `crate::reduce::load_all_reduce_kernels`).
pub(crate) fn launch_each_empty(stream: &Stream) -> Result<()> {
    let one = LaunchConfig { grid: 1, block: THREADS, shared_bytes: 0 };
    let block = BlockSize::SMALLEST.get() as u32;
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for format in Format::ALL {
            let codec = Codec { dtype, format, block: BlockSize::SMALLEST };
            let encode = EncodeArgs { src: 0, len: 0, block, wire: 0 };
            let fold =
                FoldArgs { own: 0, len: 0, block, wires: [0; CODEC_MAX_RANKS], ranks: 1, owner: 0, average: 0, out: 0 };
            let decode = DecodeArgs { wire: 0, len: 0, block, dst: 0 };
            let fold_decode =
                FoldDecodeArgs { len: 0, block, wires: [0; CODEC_MAX_RANKS], ranks: 1, average: 0, dst: 0 };
            // SAFETY: no values: every kernel computes zero blocks and returns, reading and
            // writing nothing, so null addresses are fine.
            unsafe {
                launch_kernel(&codec.function(stream, CodecKernel::Encode)?, stream, one, &encode, None)?;
                launch_kernel(&codec.function(stream, CodecKernel::FoldEncode)?, stream, one, &fold, None)?;
                launch_kernel(&codec.function(stream, CodecKernel::Decode)?, stream, one, &decode, None)?;
                launch_kernel(&codec.function(stream, CodecKernel::FoldDecode)?, stream, one, &fold_decode, None)?;
            }
        }
    }
    let copy = CopyArgs { src: 0, len: 0, block, dst: 0, words: 0 };
    let function = Module::kernels(stream.device(), KernelFamily::Compress)?.function(COPY_EXACT_BLOCKS_KERNEL)?;
    // SAFETY: no values: the kernel scans zero blocks and copies nothing.
    unsafe { launch_kernel(&function, stream, one, &copy, None) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fold_passes_fifteen_arguments_in_the_kernels_order() {
        let args = FoldArgs {
            own: 1,
            len: 2,
            block: 32,
            wires: [10, 11, 12, 13, 14, 15, 16, 17],
            ranks: 3,
            owner: 1,
            average: 1,
            out: 99,
        };
        let mut params = args.params();
        assert_eq!(params.len(), 15);
        // SAFETY: reads the slots the pointers point at, alive in `params`.
        let values: Vec<u64> = params.pointers()[..15].iter().map(|&p| unsafe { *p.cast::<u64>() }).collect();
        assert_eq!(values, [1, 2, 32, 10, 11, 12, 13, 14, 15, 16, 17, 3, 1, 1, 99]);
        let count = |name: &str| {
            let ptx = gp2p_kernels::COMPRESS.ptx;
            let start = ptx.find(&format!(".entry {name}(")).expect("the kernel is in the PTX");
            let end = start + ptx[start..].find(')').expect("its parameter list ends");
            ptx[start..end].matches(".param").count()
        };
        let codec = |k| compress_kernel_name(k, Format::Int8, DType::F32).unwrap();
        assert_eq!(count(codec(CodecKernel::FoldEncode)), 15);
        assert_eq!(count(codec(CodecKernel::Encode)), EncodeArgs { src: 0, len: 0, block: 0, wire: 0 }.params().len());
        assert_eq!(count(codec(CodecKernel::Decode)), DecodeArgs { wire: 0, len: 0, block: 0, dst: 0 }.params().len());
    }

    #[test]
    fn the_one_shot_fold_passes_thirteen_arguments_in_the_kernels_order() {
        let args =
            FoldDecodeArgs { len: 2, block: 64, wires: [10, 11, 0, 0, 0, 0, 0, 0], ranks: 2, average: 1, dst: 99 };
        let mut params = args.params();
        assert_eq!(params.len(), 13);
        // SAFETY: reads the slots the pointers point at, alive in `params`.
        let values: Vec<u64> = params.pointers()[..13].iter().map(|&p| unsafe { *p.cast::<u64>() }).collect();
        assert_eq!(values, [2, 64, 10, 11, 0, 0, 0, 0, 0, 0, 2, 1, 99]);
        for ptx in [gp2p_kernels::COMPRESS.ptx, gp2p_kernels::COMPRESS_COMPUTE_75.ptx] {
            for dtype in [DType::F32, DType::F16, DType::BF16] {
                for format in Format::ALL {
                    let name = compress_kernel_name(CodecKernel::FoldDecode, format, dtype).unwrap();
                    let start = ptx.find(&format!(".entry {name}(")).expect("the kernel is in the PTX");
                    let end = start + ptx[start..].find(')').expect("its parameter list ends");
                    assert_eq!(ptx[start..end].matches(".param").count(), 13, "{name}");
                }
            }
        }
    }
}
