//! The two-shot all-reduce among 3 to 8 ranks in one flagged-chunk kernel per rank
//! (`kernels/chunks.cu`, `chunks_many`), on addresses.

use gp2p_kernels::{
    CHUNK_BYTES, CHUNKS_MANY_WORLD, DType, KernelFamily, ReduceOp, chunks_many_area, chunks_many_kernel_name,
};

use super::{ChunkWaits, ChunksLaunch, InOut, check_aligned, checked_bytes};
use crate::driver::RawDevicePtr;
use crate::launch::{ChunksManyArgs, KernelArgs, check_divisor, chunks_launch_config};
use crate::{Device, Error, Module, Result};

/// Every rank's areas for the many-rank flagged-chunk kernel (see
/// [`gp2p_kernels::chunks_many_kernel_name`]), as the stream's device maps them.
#[derive(Debug, Clone, Copy)]
pub struct ManyChunkAreas {
    /// Rank 0's area; rank r's lies `r * area_stride` bytes on.
    pub areas: RawDevicePtr,
    /// Bytes from one rank's area to the next.
    pub area_stride: u64,
    /// Odd call numbers use each area this many bytes on.
    pub half_stride: u64,
    /// The chunks an area has room for ([`gp2p_kernels::chunks_many_area`] of
    /// `area_chunks * CHUNK_BYTES` bytes lays it out).
    pub area_chunks: u64,
    /// This rank.
    pub rank: usize,
    /// The ranks.
    pub world: usize,
    /// Two `u32`s in device memory of the stream's device: the call count, then the last
    /// block's ticket (0 between calls).
    pub counter: RawDevicePtr,
    /// A `u32` the kernel sets to 1 when it gives up waiting.
    pub failed: RawDevicePtr,
    /// A `u32` every rank's waits share, or 0 for none.
    pub broken: RawDevicePtr,
}

/// One rank's many-rank flagged-chunk kernel on `device`, to enqueue with
/// [`ChunksLaunch::enqueue`], whose contract holds with `areas` for the two-rank kernel's
/// areas: every rank's area (both halves) is mapped pinned host memory of
/// [`gp2p_kernels::chunks_many_area`]'s size for `area_chunks` chunks, each written by its own
/// rank's kernels only, and every rank of `world` enqueues the same call. `None` for an empty
/// buffer. Refuses a world outside 3 to 8 or a rank outside it, areas of more than 2^20
/// chunks, `divide_by` = 0, misaligned
/// addresses, a `dst` that overlaps `src` without being it, a buffer of fewer chunks than
/// ranks (each must own one) or more than an area holds, and strides that would make areas
/// or halves overlap. At most `max_blocks` blocks run, and no more than one per chunk or two
/// per multiprocessor.
#[allow(clippy::too_many_arguments)]
pub fn plan_chunks_many(
    device: &Device,
    buf: InOut,
    len: usize,
    dtype: DType,
    op: ReduceOp,
    areas: ManyChunkAreas,
    divide_by: u32,
    waits: ChunkWaits,
    max_blocks: usize,
) -> Result<Option<ChunksLaunch>> {
    let invalid = |name: &'static str, reason: String| Error::InvalidArgument { name, reason };
    if !CHUNKS_MANY_WORLD.contains(&areas.world) || areas.rank >= areas.world {
        return Err(invalid(
            "world",
            format!("rank {} of {}: the kernel takes 3 to 8 ranks (two have their own)", areas.rank, areas.world),
        ));
    }
    check_divisor(divide_by)?;
    let bytes = checked_bytes(buf, len, dtype)?;
    check_aligned(
        &[("areas", areas.areas), ("area_stride", areas.area_stride), ("half_stride", areas.half_stride)],
        64,
    )?;
    check_aligned(&[("failed", areas.failed), ("broken", areas.broken), ("counter", areas.counter)], 4)?;
    // Far above any communicator's (16 MiB), and far from overflowing the layout's sums.
    const MAX_AREA_CHUNKS: u64 = 1 << 20;
    if areas.area_chunks > MAX_AREA_CHUNKS {
        return Err(invalid("area_chunks", format!("{} is above {MAX_AREA_CHUNKS}", areas.area_chunks)));
    }
    let half = chunks_many_area(areas.area_chunks as usize * CHUNK_BYTES, areas.world).bytes as u64;
    if areas.half_stride < half {
        return Err(invalid("half_stride", format!("{} bytes: one half takes {half}", areas.half_stride)));
    }
    if areas.area_stride < 2 * areas.half_stride {
        return Err(invalid(
            "area_stride",
            format!("{} bytes: an area's two halves take {}", areas.area_stride, 2 * areas.half_stride),
        ));
    }
    if len == 0 {
        return Ok(None);
    }
    let chunks = bytes.div_ceil(CHUNK_BYTES);
    if chunks < areas.world || chunks as u64 > areas.area_chunks {
        return Err(invalid(
            "len",
            format!(
                "{bytes} bytes are {chunks} chunks of {CHUNK_BYTES}: the kernel takes from one a rank ({}) to an area's {}",
                areas.world, areas.area_chunks
            ),
        ));
    }
    let function = Module::kernels(device, KernelFamily::Chunks)?.function(chunks_many_kernel_name(op, dtype))?;
    let config = chunks_launch_config(bytes, device.info().multiprocessors, max_blocks);
    let args = ChunksManyArgs {
        buf,
        len: len as u64,
        areas: areas.areas,
        area_stride: areas.area_stride,
        rank: areas.rank as u32,
        world: areas.world as u32,
        divisor: divide_by,
        timeout_ns: waits.timeout_ns,
        queue_timeout_ns: waits.queue_timeout_ns,
        failed: areas.failed,
        seq_counter: areas.counter,
        half_stride: areas.half_stride,
        area_chunks: areas.area_chunks,
        broken: areas.broken,
    };
    Ok(Some(ChunksLaunch::new(function, config, args.params())))
}
