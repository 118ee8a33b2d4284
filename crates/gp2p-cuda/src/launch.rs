//! The kernels' launches, below `raw` (the checked launches on addresses) and `reduce.rs`
//! (the typed reduce and the warm-up): each kernel family's arguments, in the order of its
//! parameters, with its launch, and the launch shapes.
#![allow(unsafe_code)]

use gp2p_kernels::{
    CHUNK_BLOCK_THREADS, CHUNK_BLOCKS_PER_SM, CHUNK_BYTES, CHUNK_MAX_BLOCKS, DType, EXCHANGE_GROUP_BYTES,
    REDUCE_BLOCK_THREADS, REDUCE_VECTOR_BYTES,
};

use crate::driver::RawDevicePtr;
use crate::replay::{LaunchCache, Params};
use crate::{Error, Function, LaunchConfig, Result, Stream};

/// Vectors each thread handles per loop step (the kernels' UNROLL).
const VECTORS_PER_THREAD_STEP: usize = 4;
/// Resident blocks per multiprocessor the grid is sized for: 8 × 256 threads fills an SM,
/// and a grid-stride loop covers the rest, so large launches do not pay for block start-up.
const BLOCKS_PER_SM: u32 = 8;
/// The same for a zero-copy source (mapped host memory). Every outstanding read is a request sent up
/// the PCIe link, sharing that direction with the device-to-host DMAs of a pipeline; a full
/// grid keeps so many in flight that those DMAs starve. Measured on an H200, a kernel reading
/// 8 MiB chunks beside a D2H stream, per direction: 35.9/37.5 GB/s in/out at 1 block per SM,
/// 35.6/35.8 at 2, 44.2/31.1 at 4, 45.4/31.4 at 8. Several such kernels may run at once
/// (logical ranks on one GPU), so one block per SM each; 256 threads × 64 bytes per SM still
/// keep far more bytes in flight than the link's latency needs.
const ZERO_COPY_BLOCKS_PER_SM: u32 = 1;

/// Where a reduce kernel's `src` lives, which sets how many reads it keeps in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceMemory {
    /// Device memory: a full grid.
    Device,
    /// Zero-copy: mapped pinned host memory, read in place across PCIe. A smaller grid, so
    /// the link's other direction keeps room for outgoing DMAs.
    ZeroCopy,
}

/// The reduce kernels' parameters `(T* dst, const T* src, u64 n, u32 divisor)`, in order.
#[derive(Default)]
pub(crate) struct ReduceArgs {
    pub(crate) dst: RawDevicePtr,
    pub(crate) src: RawDevicePtr,
    pub(crate) len: u64,
    pub(crate) divisor: u32,
}

impl KernelArgs for ReduceArgs {
    fn params(&self) -> Params {
        Params::default().u64(self.dst).u64(self.src).u64(self.len).u32(self.divisor)
    }
}

/// A kernel family's arguments, as one struct in parameter order.
pub(crate) trait KernelArgs {
    /// The arguments in the order the kernels take them.
    fn params(&self) -> Params;
}

/// One thread: the wait kernels' launch shape.
pub(crate) const ONE_THREAD: LaunchConfig = LaunchConfig { grid: 1, block: 1, shared_bytes: 0 };

/// Launch `function` with `args` (its family's), replayed through `cache` where one is given.
///
/// # Safety
/// `function` is a kernel of the family `args` belong to; their addresses are valid for what
/// it does with them until it completes (each family's contract is its `raw` function's);
/// launches through `cache` follow [`LaunchCache::launch`]'s contract.
pub(crate) unsafe fn launch_kernel(
    function: &Function,
    stream: &Stream,
    config: LaunchConfig,
    args: &impl KernelArgs,
    cache: Option<&mut LaunchCache>,
) -> Result<()> {
    // SAFETY: the arguments match the parameters; addresses and the cache: the caller's.
    unsafe { launch_params(function, stream, config, args.params(), cache) }
}

/// Launch `function` with `params`, replayed through `cache` where one is given.
///
/// # Safety
/// `params` match the kernel's parameters, and its addresses are valid for what it does with
/// them until it completes; launches through `cache` follow [`LaunchCache::launch`]'s
/// contract.
pub(crate) unsafe fn launch_params(
    function: &Function,
    stream: &Stream,
    config: LaunchConfig,
    mut params: Params,
    cache: Option<&mut LaunchCache>,
) -> Result<()> {
    match cache {
        // SAFETY: the caller's contract.
        Some(cache) => unsafe { cache.launch(function, stream, config, params) },
        None => {
            let (mut pointers, len) = (params.pointers(), params.len());
            // SAFETY: the caller's contract; the pointers point into `params`, alive and
            // unmoved through the call (the driver copies the arguments at launch).
            unsafe { function.launch(stream, config, &mut pointers[..len]) }
        }
    }
}

/// The buffers of an all-reduce kernel that folds peers' data into this rank's: it reads
/// `src` and writes `dst`, which is `src` itself in place ([`InOut::in_place`]) or memory
/// that does not overlap it (out of place: a server's custom all-reduce returns a new tensor,
/// and folding into it straight saves copying the input there first).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InOut {
    /// What this rank contributes.
    pub src: RawDevicePtr,
    /// Where the result goes.
    pub dst: RawDevicePtr,
}

impl InOut {
    /// One buffer, read and then overwritten with the result.
    pub fn in_place(buf: RawDevicePtr) -> InOut {
        InOut { src: buf, dst: buf }
    }
}

/// The flagged-chunk kernels' parameters `(const T* src, T* dst, u64 n, char* out_area,
/// const char* in_area, u32 divisor, u64 timeout_ns, u64 queue_timeout_ns, u32* failed,
/// u32* seq_counter, u64 half_stride, u64 flags_offset, u32* broken)`, in order.
#[derive(Default)]
pub(crate) struct ChunksArgs {
    pub(crate) buf: InOut,
    pub(crate) len: u64,
    pub(crate) out_area: RawDevicePtr,
    pub(crate) in_area: RawDevicePtr,
    pub(crate) divisor: u32,
    pub(crate) timeout_ns: u64,
    pub(crate) queue_timeout_ns: u64,
    pub(crate) failed: RawDevicePtr,
    pub(crate) seq_counter: RawDevicePtr,
    pub(crate) half_stride: u64,
    pub(crate) flags_offset: u64,
    pub(crate) broken: RawDevicePtr,
}

impl KernelArgs for ChunksArgs {
    fn params(&self) -> Params {
        // The kernels take (const T*, T*, u64, char*, const char*, u32, u64, u64, u32*, u32*,
        // u64, u64, u32*), in this order.
        Params::default()
            .u64(self.buf.src)
            .u64(self.buf.dst)
            .u64(self.len)
            .u64(self.out_area)
            .u64(self.in_area)
            .u32(self.divisor)
            .u64(self.timeout_ns)
            .u64(self.queue_timeout_ns)
            .u64(self.failed)
            .u64(self.seq_counter)
            .u64(self.half_stride)
            .u64(self.flags_offset)
            .u64(self.broken)
    }
}

/// The many-rank flagged-chunk kernels' parameters `(const T* src, T* dst, u64 n, char* areas,
/// u64 area_stride, u32 rank, u32 world, u32 divisor, u64 timeout_ns, u64 queue_timeout_ns,
/// u32* failed, u32* seq_counter, u64 half_stride, u64 area_chunks, u32* broken)`, in order.
#[derive(Default)]
pub(crate) struct ChunksManyArgs {
    pub(crate) buf: InOut,
    pub(crate) len: u64,
    pub(crate) areas: RawDevicePtr,
    pub(crate) area_stride: u64,
    pub(crate) rank: u32,
    pub(crate) world: u32,
    pub(crate) divisor: u32,
    pub(crate) timeout_ns: u64,
    pub(crate) queue_timeout_ns: u64,
    pub(crate) failed: RawDevicePtr,
    pub(crate) seq_counter: RawDevicePtr,
    pub(crate) half_stride: u64,
    pub(crate) area_chunks: u64,
    pub(crate) broken: RawDevicePtr,
}

impl KernelArgs for ChunksManyArgs {
    fn params(&self) -> Params {
        Params::default()
            .u64(self.buf.src)
            .u64(self.buf.dst)
            .u64(self.len)
            .u64(self.areas)
            .u64(self.area_stride)
            .u32(self.rank)
            .u32(self.world)
            .u32(self.divisor)
            .u64(self.timeout_ns)
            .u64(self.queue_timeout_ns)
            .u64(self.failed)
            .u64(self.seq_counter)
            .u64(self.half_stride)
            .u64(self.area_chunks)
            .u64(self.broken)
    }
}

/// The launch shape of a flagged-chunk kernel over `bytes` bytes: a block per chunk, at
/// most `max_blocks` (itself at most [`CHUNK_MAX_BLOCKS`], at least 1) and
/// [`CHUNK_BLOCKS_PER_SM`] per multiprocessor of the device (each then takes several), so
/// that on an otherwise idle device every block can be resident and polling at once (the
/// kernels' launch bounds hold them to 64 registers a thread).
pub fn chunks_launch_config(bytes: usize, multiprocessors: u32, max_blocks: usize) -> LaunchConfig {
    let cap = max_blocks.clamp(1, CHUNK_MAX_BLOCKS).min((multiprocessors.max(1) * CHUNK_BLOCKS_PER_SM) as usize);
    let blocks = bytes.div_ceil(CHUNK_BYTES).clamp(1, cap);
    LaunchConfig { grid: blocks as u32, block: CHUNK_BLOCK_THREADS, shared_bytes: 0 }
}

/// The exchange kernels' parameters `(const T* src, T* dst, u64 n, u64* out_lines, const u64* in_lines,
/// u32 seq, u32 divisor, u64 timeout_ns, u32* failed, u32* seq_counter, u64 half_stride,
/// u32* broken)`, in order.
#[derive(Default)]
pub(crate) struct ExchangeArgs {
    pub(crate) buf: InOut,
    pub(crate) len: u64,
    pub(crate) out_lines: RawDevicePtr,
    pub(crate) in_lines: RawDevicePtr,
    pub(crate) seq: u32,
    pub(crate) divisor: u32,
    pub(crate) timeout_ns: u64,
    pub(crate) failed: RawDevicePtr,
    pub(crate) seq_counter: RawDevicePtr,
    pub(crate) half_stride: u64,
    pub(crate) broken: RawDevicePtr,
}

impl KernelArgs for ExchangeArgs {
    fn params(&self) -> Params {
        // The kernels take (const T*, T*, u64, u64*, const u64*, u32, u32, u64, u32*, u32*,
        // u64, u32*), in this order.
        Params::default()
            .u64(self.buf.src)
            .u64(self.buf.dst)
            .u64(self.len)
            .u64(self.out_lines)
            .u64(self.in_lines)
            .u32(self.seq)
            .u32(self.divisor)
            .u64(self.timeout_ns)
            .u64(self.failed)
            .u64(self.seq_counter)
            .u64(self.half_stride)
            .u64(self.broken)
    }
}

/// The many-rank exchange kernels' parameters `(const T* src, T* dst, u64 n, u64* lines, u64 area_stride,
/// u32 rank, u32 world, u32 divisor, u64 timeout_ns, u32* failed, u32* seq_counter,
/// u64 half_stride, u32* broken)`, in order.
#[derive(Default)]
pub(crate) struct ExchangeManyArgs {
    pub(crate) buf: InOut,
    pub(crate) len: u64,
    pub(crate) lines: RawDevicePtr,
    pub(crate) area_stride: u64,
    pub(crate) rank: u32,
    pub(crate) world: u32,
    pub(crate) divisor: u32,
    pub(crate) timeout_ns: u64,
    pub(crate) failed: RawDevicePtr,
    pub(crate) seq_counter: RawDevicePtr,
    pub(crate) half_stride: u64,
    pub(crate) broken: RawDevicePtr,
}

impl KernelArgs for ExchangeManyArgs {
    fn params(&self) -> Params {
        Params::default()
            .u64(self.buf.src)
            .u64(self.buf.dst)
            .u64(self.len)
            .u64(self.lines)
            .u64(self.area_stride)
            .u32(self.rank)
            .u32(self.world)
            .u32(self.divisor)
            .u64(self.timeout_ns)
            .u64(self.failed)
            .u64(self.seq_counter)
            .u64(self.half_stride)
            .u64(self.broken)
    }
}

/// The wait-on-several kernel's parameters `(const u32* flags, u32 count, u32 value,
/// u64 timeout_ns, u32* failed, u32* broken)`, in order.
#[derive(Clone, Copy, Default)]
pub(crate) struct WaitFlagsArgs {
    pub(crate) flags: RawDevicePtr,
    pub(crate) count: u32,
    pub(crate) value: u32,
    pub(crate) timeout_ns: u64,
    pub(crate) failed: RawDevicePtr,
    pub(crate) broken: RawDevicePtr,
}

impl KernelArgs for WaitFlagsArgs {
    fn params(&self) -> Params {
        Params::default()
            .u64(self.flags)
            .u32(self.count)
            .u32(self.value)
            .u64(self.timeout_ns)
            .u64(self.failed)
            .u64(self.broken)
    }
}

/// The wait kernel's parameters `(const u32* flag, u32 value, u64 timeout_ns, u32* failed,
/// u32* broken)`, in order (see [`gp2p_kernels::WAIT_FLAG_KERNEL`]).
#[derive(Clone, Copy, Default)]
pub(crate) struct WaitFlagArgs {
    pub(crate) flag: RawDevicePtr,
    pub(crate) value: u32,
    pub(crate) timeout_ns: u64,
    pub(crate) failed: RawDevicePtr,
    pub(crate) broken: RawDevicePtr,
}

impl KernelArgs for WaitFlagArgs {
    fn params(&self) -> Params {
        // The kernel takes (const u32*, u32, u64, u32*, u32*), in this order.
        Params::default().u64(self.flag).u32(self.value).u64(self.timeout_ns).u64(self.failed).u64(self.broken)
    }
}

/// The stamp kernel's one parameter `(u64* at)` (see [`gp2p_kernels::STAMP_KERNEL`]).
#[derive(Clone, Copy, Default)]
pub(crate) struct StampArgs {
    pub(crate) at: RawDevicePtr,
}

impl KernelArgs for StampArgs {
    fn params(&self) -> Params {
        Params::default().u64(self.at)
    }
}

/// Refuses a divisor of 0 (avg divides by the number of contributions): what every reduce
/// launch checks, for callers that refuse it before enqueueing anything.
pub fn check_divisor(divide_by: u32) -> Result<()> {
    if divide_by == 0 {
        return Err(Error::InvalidArgument {
            name: "divide_by",
            reason: "must be at least 1 (the number of contributions)".into(),
        });
    }
    Ok(())
}

/// The launch shape for `len` elements of `dtype` read from `source` on a device with
/// `multiprocessors` SMs.
pub fn reduce_launch_config(len: usize, dtype: DType, multiprocessors: u32, source: SourceMemory) -> LaunchConfig {
    let lanes = REDUCE_VECTOR_BYTES / dtype.size_bytes();
    let threads = len.div_ceil(lanes * VECTORS_PER_THREAD_STEP).max(1);
    let blocks = threads.div_ceil(REDUCE_BLOCK_THREADS as usize);
    let per_sm = match source {
        SourceMemory::Device => BLOCKS_PER_SM,
        SourceMemory::ZeroCopy => ZERO_COPY_BLOCKS_PER_SM,
    };
    let cap = (multiprocessors.max(1) * per_sm) as usize;
    LaunchConfig { grid: blocks.clamp(1, cap) as u32, block: REDUCE_BLOCK_THREADS, shared_bytes: 0 }
}

/// Blocks an exchange kernel may use. One: each thread keeps a batch of loads in flight
/// (the kernel's EXCHANGE_BATCH), and more pollers only slow the peer's writes they wait
/// for. Two H200s, one process per GPU, 64 KiB f32 sum: 29 us with one block, 58 with two,
/// 82 with four, 88 with eight (a two-H200 run whose files were not kept).
const EXCHANGE_MAX_BLOCKS: usize = 1;

/// Threads of an exchange's block past 4 KiB (256 16-byte groups): its threads each keep a
/// batch of loads in flight, so more threads read more at once. Both ranks on one H200, the
/// probe's copy of the kernel with planar lines in one block (benches/probes/small_exchange.py,
/// `benches/results/small-exchange-llp-h200.txt` at 7774b2d, batches of 4 as the kernel's): 8 KiB 8.70 us
/// with 256 threads, 7.69 with 512; 16 KiB 12.73 and 9.84; 32 KiB 19.97 and 15.35. (The
/// kernels' launch bounds allow 512 at one block per multiprocessor, which leaves the
/// two-rank kernels 66-76 registers and the many-rank ones 112-128, none spilling:
/// `benches/results/h200/exchange-registers.txt`.)
const EXCHANGE_WIDE_THREADS: u32 = 512;

/// The launch shape of an exchange of `len` elements of `dtype`: a thread per 16-byte group,
/// up to one block of 256 threads, or of 512 past that (each thread takes one group or more).
pub fn exchange_launch_config(len: usize, dtype: DType) -> LaunchConfig {
    let groups = (len * dtype.size_bytes()).div_ceil(EXCHANGE_GROUP_BYTES).max(1);
    let block = if groups > REDUCE_BLOCK_THREADS as usize { EXCHANGE_WIDE_THREADS } else { REDUCE_BLOCK_THREADS };
    let blocks = groups.div_ceil(block as usize).clamp(1, EXCHANGE_MAX_BLOCKS);
    LaunchConfig { grid: blocks as u32, block, shared_bytes: 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How many parameters the PTX entry `name` declares in `ptx`.
    fn ptx_params(ptx: &str, name: &str) -> usize {
        let start = ptx.find(&format!(".entry {name}(")).unwrap_or_else(|| panic!("{name} is not in the PTX"));
        let body = &ptx[start..];
        let end = body.find(')').expect("an entry's parameter list ends");
        body[..end].matches(".param ").count()
    }

    #[test]
    fn every_kernel_family_is_launched_with_as_many_arguments_as_its_ptx_declares() {
        use gp2p_kernels::{
            CHUNKS, EXCHANGE, EXCHANGE_MANY, FLAGS, REDUCE, STAMP_KERNEL, WAIT_FLAG_KERNEL, WAIT_FLAGS_KERNEL,
            chunks_kernel_name, exchange_kernel_name, exchange_many_kernel_name, reduce_kernel_name,
        };
        let (op, dtype) = (gp2p_kernels::ReduceOp::Avg, DType::BF16);
        let families = [
            (REDUCE.ptx, reduce_kernel_name(op, dtype), ReduceArgs::default().params().len()),
            (CHUNKS.ptx, chunks_kernel_name(op, dtype), ChunksArgs::default().params().len()),
            (EXCHANGE.ptx, exchange_kernel_name(op, dtype), ExchangeArgs::default().params().len()),
            (EXCHANGE_MANY.ptx, exchange_many_kernel_name(op, dtype), ExchangeManyArgs::default().params().len()),
            (FLAGS.ptx, WAIT_FLAG_KERNEL, WaitFlagArgs::default().params().len()),
            (FLAGS.ptx, WAIT_FLAGS_KERNEL, WaitFlagsArgs::default().params().len()),
            (FLAGS.ptx, STAMP_KERNEL, StampArgs::default().params().len()),
        ];
        for (ptx, name, launched) in families {
            assert_eq!(launched, ptx_params(ptx, name), "{name}: arguments launched against parameters declared");
        }
    }

    #[test]
    fn launch_shape_covers_small_and_caps_large() {
        let dev = SourceMemory::Device;
        let one = reduce_launch_config(1, DType::F32, 132, dev);
        assert_eq!((one.grid, one.block), (1, 256));
        let mid = reduce_launch_config(256 * 16, DType::F32, 132, dev);
        assert_eq!(mid.grid, 1, "256 threads x 4 vectors x 4 lanes fit in one block");
        let big = reduce_launch_config(1 << 28, DType::F32, 132, dev);
        assert_eq!(big.grid, 132 * BLOCKS_PER_SM);
        let bytes = reduce_launch_config(256 * 64 + 1, DType::I8, 132, dev);
        assert_eq!(bytes.grid, 2);
        let host = reduce_launch_config(1 << 28, DType::F32, 132, SourceMemory::ZeroCopy);
        assert_eq!(host.grid, 132 * ZERO_COPY_BLOCKS_PER_SM, "fewer reads in flight across PCIe");
        let small_host = reduce_launch_config(256 * 64 + 1, DType::I8, 132, SourceMemory::ZeroCopy);
        assert_eq!(small_host.grid, 2, "a small launch is not capped");
        assert!(host.grid < big.grid);
    }

    #[test]
    fn chunks_shape_is_a_block_per_chunk_up_to_the_cap() {
        assert_eq!(chunks_launch_config(1, 132, CHUNK_MAX_BLOCKS).grid, 1);
        assert_eq!(chunks_launch_config(CHUNK_BYTES, 132, CHUNK_MAX_BLOCKS).grid, 1);
        assert_eq!(chunks_launch_config(CHUNK_BYTES + 1, 132, CHUNK_MAX_BLOCKS).grid, 2);
        assert_eq!(chunks_launch_config(1 << 30, 132, CHUNK_MAX_BLOCKS).grid as usize, CHUNK_MAX_BLOCKS);
        assert_eq!(chunks_launch_config(1 << 30, 132, 64).grid, 64);
        assert_eq!(chunks_launch_config(1 << 30, 132, 0).grid, 1);
        assert_eq!(chunks_launch_config(1 << 30, 132, usize::MAX).grid as usize, CHUNK_MAX_BLOCKS);
        assert_eq!(chunks_launch_config(3 * CHUNK_BYTES, 132, 64).grid, 3);
        assert_eq!(chunks_launch_config(1 << 30, 28, CHUNK_MAX_BLOCKS).grid, 28 * CHUNK_BLOCKS_PER_SM);
        assert_eq!(chunks_launch_config(1 << 30, 0, CHUNK_MAX_BLOCKS).grid, CHUNK_BLOCKS_PER_SM);
        assert_eq!(chunks_launch_config(1, 132, CHUNK_MAX_BLOCKS).block, CHUNK_BLOCK_THREADS);
    }

    #[test]
    fn exchange_shape_is_one_block_whatever_the_size() {
        for (len, threads) in [(1, 256), (1024, 256), (1025, 512), (16 << 10, 512), (1 << 24, 512)] {
            let shape = exchange_launch_config(len, DType::F32);
            assert_eq!((shape.grid, shape.block), (1, threads), "{len} elements");
        }
        assert_eq!(exchange_launch_config(4096, DType::U8).block, 256, "4 KiB: a thread per group");
        assert_eq!(exchange_launch_config(4097, DType::U8).block, EXCHANGE_WIDE_THREADS);
    }
}
