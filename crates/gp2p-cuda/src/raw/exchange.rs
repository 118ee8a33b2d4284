//! The exchanges on addresses: the line exchange between two ranks and among 2 to 8, and the
//! flagged-chunk exchange, each a kernel per rank that waits for its peers' data in mapped
//! host memory (`kernels/exchange.cu`, `kernels/exchange_many.cu`, `kernels/chunks.cu`).

use gp2p_kernels::{
    DType, EXCHANGE_MANY_MAX_WORLD, KernelFamily, ReduceOp, chunk_area_layout, chunks_kernel_name,
    exchange_kernel_name, exchange_many_kernel_name,
};

use super::{InOut, check_aligned, check_in_out, checked_bytes};
use crate::driver::RawDevicePtr;
use crate::launch::{
    ChunksArgs, ExchangeArgs, ExchangeManyArgs, KernelArgs, check_divisor, chunks_launch_config,
    exchange_launch_config, launch_kernel, launch_params,
};
use crate::replay::{LaunchCache, Params};
use crate::{Device, Error, Function, LaunchConfig, Module, Result, Stream};

/// The addresses one rank's exchange kernel works on (see [`exchange`] and
/// [`gp2p_kernels::exchange_kernel_name`]).
#[derive(Debug, Clone, Copy)]
pub struct ExchangeLines {
    /// This rank's lines, as the stream's device maps them.
    pub out_lines: RawDevicePtr,
    /// The peer's lines, as the stream's device maps them.
    pub in_lines: RawDevicePtr,
    /// A `u32` the kernel sets to 1 when it gives up waiting, as the device maps it.
    pub failed: RawDevicePtr,
    /// A `u32` every rank's waits share, or 0 for none: a wait returns at once once it is 1,
    /// and a wait that gives up sets it.
    pub broken: RawDevicePtr,
    /// Where the call's sequence number comes from: the `seq` argument, or the count in
    /// device memory that the kernel advances (so a captured graph numbers its replays).
    pub numbering: Numbering,
}

/// How an exchange kernel numbers its call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Numbering {
    /// The `seq` passed, with the lines given used as they are.
    Given,
    /// The next number after a count in device memory, which the kernel stores back.
    Counted {
        /// The `u32` count, in device memory of the stream's device.
        counter: RawDevicePtr,
        /// Odd numbers use the lines this many bytes after those given (a multiple of 16).
        half_stride: u64,
    },
}

/// Enqueue one rank's exchange kernel on `stream`: publish `buf.src` tagged `seq` in its
/// lines, wait (at most `timeout_ns`) for the peer's lines tagged `seq`, and fold
/// `buf.dst = op(own, peer)`. Refuses `divide_by` = 0, misaligned addresses and a `dst` that
/// overlaps `src` without being it, before launching.
///
/// # Safety
/// - `buf.src` is `len` readable and `buf.dst` `len` writable elements of `dtype` in device
///   memory on the stream's device (the same ones in place), and nothing else writes them
///   until the kernel completes;
/// - `lines.out_lines` and `lines.in_lines` each address at least
///   [`gp2p_kernels::exchange_line_bytes`]`(len * dtype.size_bytes())` bytes of mapped
///   pinned host memory as this device maps it, 16-byte aligned; nobody but this kernel
///   writes `out_lines` until it completes;
/// - `lines.failed` and (unless 0) `lines.broken` are writable `u32`s of mapped pinned host
///   memory, 4-byte aligned;
/// - with [`Numbering::Counted`], `counter` is a `u32` of device memory on the stream's
///   device that only this rank's exchange kernels and its flagged-chunk kernels on the same
///   counter ([`plan_exchange_chunks`]) touch, in stream order, and the lines
///   `half_stride` bytes on obey what is said of the lines above;
/// - all of them stay allocated until the kernel completes on `stream`;
/// - the peer's kernel for the same `seq` is enqueued too, on a stream that can run at the
///   same time as this one; otherwise this kernel waits `timeout_ns`, sets `failed` and
///   leaves `buf.dst` partly folded;
/// - with `launches` given, this launch may run after every earlier launch through that
///   cache (a replay is ordered after the earlier launches of its graph, see
///   [`crate::LaunchCache`]): the cache is this rank's alone, never shared with the peer's.
#[allow(clippy::too_many_arguments)]
pub unsafe fn exchange(
    stream: &Stream,
    buf: InOut,
    len: usize,
    dtype: DType,
    op: ReduceOp,
    lines: ExchangeLines,
    seq: u32,
    divide_by: u32,
    timeout_ns: u64,
    launches: Option<&mut LaunchCache>,
) -> Result<()> {
    check_divisor(divide_by)?;
    let (counter, half_stride) = match lines.numbering {
        Numbering::Given => (0, 0),
        Numbering::Counted { counter, half_stride } => (counter, half_stride),
    };
    check_in_out(buf, len.saturating_mul(dtype.size_bytes()), dtype.size_bytes())?;
    check_aligned(&[("out_lines", lines.out_lines), ("in_lines", lines.in_lines), ("half_stride", half_stride)], 16)?;
    check_aligned(&[("failed", lines.failed), ("broken", lines.broken), ("counter", counter)], 4)?;
    if len == 0 {
        return Ok(());
    }
    let function =
        Module::kernels(stream.device(), KernelFamily::Exchange)?.function(exchange_kernel_name(op, dtype))?;
    let config = exchange_launch_config(len, dtype);
    if counter != 0 && config.grid != 1 {
        // Every thread reads the count before thread 0 stores it back: one block only.
        return Err(Error::InvalidArgument {
            name: "numbering",
            reason: format!("a counted exchange runs in one block, this launch has {}", config.grid),
        });
    }
    let args = ExchangeArgs {
        buf,
        len: len as u64,
        out_lines: lines.out_lines,
        in_lines: lines.in_lines,
        seq,
        divisor: divide_by,
        timeout_ns,
        failed: lines.failed,
        seq_counter: counter,
        half_stride,
        broken: lines.broken,
    };
    // SAFETY: an exchange kernel of `dtype`; the addresses are the caller's contract.
    unsafe { launch_kernel(&function, stream, config, &args, launches) }
}

/// The lines of every rank of a many-rank exchange (see [`exchange_many`] and
/// [`gp2p_kernels::exchange_many_kernel_name`]), as the stream's device maps them.
#[derive(Debug, Clone, Copy)]
pub struct ManyLines {
    /// Rank 0's lines; rank r's are `r * area_stride` bytes on.
    pub lines: RawDevicePtr,
    /// Bytes from one rank's lines to the next's (a multiple of 16).
    pub area_stride: u64,
    /// This rank, which writes only its own lines.
    pub rank: usize,
    /// How many ranks fold, 2..=[`EXCHANGE_MANY_MAX_WORLD`].
    pub world: usize,
    /// A `u32` the kernel sets to 1 when it gives up waiting.
    pub failed: RawDevicePtr,
    /// A `u32` every rank's waits share, or 0 for none (as in [`ExchangeLines::broken`]).
    pub broken: RawDevicePtr,
    /// The call count in device memory the kernel numbers its call from and stores back.
    pub counter: RawDevicePtr,
    /// Odd numbers use the lines this many bytes on (a multiple of 16).
    pub half_stride: u64,
}

/// Enqueue one rank's many-rank exchange kernel on `stream`: publish `buf.src` in its lines
/// tagged with the next number after the count at `lines.counter`, wait (each wait at most
/// `timeout_ns`) for every other rank's lines so tagged, and fold all of them in rank order
/// into `buf.dst`, dividing by `divide_by` at the last step. One block. Refuses a world
/// outside 2..=[`EXCHANGE_MANY_MAX_WORLD`], a rank outside it, `divide_by` = 0, misaligned
/// addresses and a `dst` that overlaps `src` without being it, before launching.
///
/// # Safety
/// - `buf` is as for [`exchange`];
/// - each rank's lines (`lines.lines + r * area_stride`, and `half_stride` bytes on) are at
///   least [`gp2p_kernels::exchange_line_bytes`]`(len * dtype.size_bytes())` bytes of mapped
///   pinned host memory as this device maps it, apart from each other; nobody but this
///   kernel writes this rank's until it completes;
/// - `failed`, `broken` (unless 0) and `counter` are as for [`exchange`] with
///   [`Numbering::Counted`]; all stay allocated until the kernel completes on `stream`;
/// - every other rank enqueues its kernel for the same call (else this one waits out
///   `timeout_ns`, sets `failed` and leaves `buf.dst` partly folded);
/// - with `launches`, as for [`exchange`].
#[allow(clippy::too_many_arguments)]
pub unsafe fn exchange_many(
    stream: &Stream,
    buf: InOut,
    len: usize,
    dtype: DType,
    op: ReduceOp,
    lines: ManyLines,
    divide_by: u32,
    timeout_ns: u64,
    launches: Option<&mut LaunchCache>,
) -> Result<()> {
    check_divisor(divide_by)?;
    if !(2..=EXCHANGE_MANY_MAX_WORLD).contains(&lines.world) || lines.rank >= lines.world {
        return Err(Error::InvalidArgument {
            name: "lines",
            reason: format!(
                "rank {} of {} ranks: the many-rank exchange folds 2..={EXCHANGE_MANY_MAX_WORLD}",
                lines.rank, lines.world
            ),
        });
    }
    check_in_out(buf, len.saturating_mul(dtype.size_bytes()), dtype.size_bytes())?;
    let strides = [("lines", lines.lines), ("area_stride", lines.area_stride), ("half_stride", lines.half_stride)];
    check_aligned(&strides, 16)?;
    check_aligned(&[("failed", lines.failed), ("broken", lines.broken), ("counter", lines.counter)], 4)?;
    if lines.counter == 0 || lines.failed == 0 {
        return Err(Error::InvalidArgument { name: "lines", reason: "the counter and failed words are needed".into() });
    }
    if len == 0 {
        return Ok(());
    }
    let function =
        Module::kernels(stream.device(), KernelFamily::ExchangeMany)?.function(exchange_many_kernel_name(op, dtype))?;
    // One block: every thread reads the count before thread 0 stores it back.
    let config = LaunchConfig { grid: 1, ..exchange_launch_config(len, dtype) };
    let args = ExchangeManyArgs {
        buf,
        len: len as u64,
        lines: lines.lines,
        area_stride: lines.area_stride,
        rank: lines.rank as u32,
        world: lines.world as u32,
        divisor: divide_by,
        timeout_ns,
        failed: lines.failed,
        seq_counter: lines.counter,
        half_stride: lines.half_stride,
        broken: lines.broken,
    };
    // SAFETY: a many-rank exchange kernel of `dtype`; the addresses are the caller's contract.
    unsafe { launch_kernel(&function, stream, config, &args, launches) }
}

/// The areas one rank's flagged-chunk kernel works on (see [`plan_exchange_chunks`] and
/// [`gp2p_kernels::chunks_kernel_name`]), each as the stream's device maps it.
#[derive(Debug, Clone, Copy)]
pub struct ChunkAreas {
    /// This rank's area for even call numbers: its data, then its flags at `flags_offset`.
    pub out_area: RawDevicePtr,
    /// The peer's area for even call numbers.
    pub in_area: RawDevicePtr,
    /// Odd call numbers use the areas this many bytes on (a multiple of 64).
    pub half_stride: u64,
    /// Bytes from an area's start to its flags: at least the data's bytes rounded up to 16,
    /// a multiple of 64 ([`gp2p_kernels::chunk_area_layout`] gives it for the largest size).
    pub flags_offset: u64,
    /// Two `u32`s in device memory of the stream's device: the call count, then the last
    /// block's ticket (0 between calls).
    pub counter: RawDevicePtr,
    /// A `u32` the kernel sets to 1 when it gives up waiting.
    pub failed: RawDevicePtr,
    /// A `u32` every rank's waits share, or 0 for none (as in [`ExchangeLines::broken`]).
    pub broken: RawDevicePtr,
}

/// How long a flagged-chunk kernel waits for its peer, in ns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkWaits {
    /// Once the peer was seen in this call (its first chunk's flag): the wait for each of
    /// its other flags.
    pub timeout_ns: u64,
    /// From the start of a wait, whether or not the peer was seen: a peer still behind work
    /// queued before the call gets this long (at least `timeout_ns` makes sense).
    pub queue_timeout_ns: u64,
}

/// One rank's flagged-chunk kernel, its arguments checked by [`plan_exchange_chunks`], not
/// yet enqueued: a caller that launches two ranks' kernels makes both ranks' graphs
/// ([`ChunksLaunch::prepare`]) before it enqueues either.
#[must_use = "a planned launch does nothing until it is enqueued"]
pub struct ChunksLaunch {
    function: Function,
    config: LaunchConfig,
    params: Params,
}

impl std::fmt::Debug for ChunksLaunch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ChunksLaunch({} on device {}, {:?})",
            self.function.name(),
            self.function.device().ordinal(),
            self.config
        )
    }
}

impl ChunksLaunch {
    /// A planned launch of `function` (a flagged-chunk kernel) with `params`.
    pub(super) fn new(function: Function, config: LaunchConfig, params: Params) -> ChunksLaunch {
        ChunksLaunch { function, config, params }
    }

    /// Have `cache` hold this launch's graph now, so that [`ChunksLaunch::enqueue`] through it
    /// makes no driver call that may wait for a device (the capture question, the bind, the
    /// replay), provided nothing else launches or prepares through `cache` in between.
    pub fn prepare(&self, cache: &mut LaunchCache) -> Result<()> {
        cache.prepare(&self.function, self.config, self.params).map(drop)
    }

    /// Enqueue the kernel on `stream` (of the device it was planned for): store `buf.src` into
    /// its area in chunks, flag each with the call's number (the next after the count at
    /// `areas.counter`), wait (as `waits` bounds it) for the peer's flags and fold
    /// `buf.dst = op(own, peer)`; replayed through `launches` where given.
    ///
    /// # Safety
    /// Of the arguments the launch was planned with:
    /// - `buf` is as for [`exchange`];
    /// - `areas.out_area` and `areas.in_area`, and both again `half_stride` bytes on, each
    ///   address `flags_offset + ceil(len * dtype.size_bytes() / CHUNK_BYTES) * CHUNK_FLAG_STRIDE`
    ///   bytes of mapped pinned host memory as this device maps it
    ///   ([`gp2p_kernels::CHUNK_BYTES`], [`gp2p_kernels::CHUNK_FLAG_STRIDE`]); nobody but this
    ///   rank's kernels writes its areas, and the peer runs the same calls in the same order on
    ///   its own, with the same layout;
    /// - `areas.counter` is two `u32`s of this device's memory that only this rank's flagged-chunk
    ///   kernels and its line kernels with [`Numbering::Counted`] on the same counter touch, in
    ///   stream order (the line kernels leave the ticket at 0); `failed` and (unless 0) `broken`
    ///   are writable `u32`s of mapped pinned host memory;
    /// - everything stays allocated until the kernel completes on `stream`;
    /// - the peer's kernel for the same call is enqueued too, on a stream that can run at the
    ///   same time as this one; otherwise this kernel waits `waits.queue_timeout_ns`, sets
    ///   `failed` and leaves `buf.dst` partly folded;
    /// - with `launches` given, this launch may run after every earlier launch through that
    ///   cache (a replay is ordered after the earlier launches of its graph, see
    ///   [`crate::LaunchCache`]): the cache is this rank's alone, never shared with the peer's.
    pub unsafe fn enqueue(self, stream: &Stream, launches: Option<&mut LaunchCache>) -> Result<()> {
        // SAFETY: a flagged-chunk kernel with its arguments in order; the addresses and the
        // cache are the caller's contract.
        unsafe { launch_params(&self.function, stream, self.config, self.params, launches) }
    }
}

/// One rank's flagged-chunk kernel on `device`, to enqueue with [`ChunksLaunch::enqueue`]
/// (`None` for an empty buffer, where nothing is to be enqueued). Refuses `divide_by` = 0,
/// misaligned addresses, a `dst` that overlaps `src` without being it, a `flags_offset` that the data would overrun, and a `half_stride`
/// that would make the two halves overlap. At most `max_blocks` blocks run, and no more than
/// one per 4 KiB chunk or two per multiprocessor; each rank may pick its own.
#[allow(clippy::too_many_arguments)]
pub fn plan_exchange_chunks(
    device: &Device,
    buf: InOut,
    len: usize,
    dtype: DType,
    op: ReduceOp,
    areas: ChunkAreas,
    divide_by: u32,
    waits: ChunkWaits,
    max_blocks: usize,
) -> Result<Option<ChunksLaunch>> {
    check_divisor(divide_by)?;
    let bytes = checked_bytes(buf, len, dtype)?;
    check_aligned(&[("out_area", areas.out_area), ("in_area", areas.in_area), ("half_stride", areas.half_stride)], 64)?;
    check_aligned(&[("flags_offset", areas.flags_offset)], 64)?;
    // The layout every maker of the areas uses: the data in whole 16-byte groups, the flags
    // from a 64-byte boundary after them (flags_offset is a multiple of 64, checked above).
    let (data, area) = chunk_area_layout(bytes);
    let half = areas.flags_offset.saturating_add((area - data) as u64);
    if areas.flags_offset < data as u64 {
        return Err(Error::InvalidArgument {
            name: "flags_offset",
            reason: format!("{} bytes: the data of {len} elements take {data}", areas.flags_offset),
        });
    }
    if areas.half_stride < half {
        return Err(Error::InvalidArgument {
            name: "half_stride",
            reason: format!("{} bytes: one half takes {half}", areas.half_stride),
        });
    }
    check_aligned(&[("failed", areas.failed), ("broken", areas.broken), ("counter", areas.counter)], 4)?;
    if len == 0 {
        return Ok(None);
    }
    let function = Module::kernels(device, KernelFamily::Chunks)?.function(chunks_kernel_name(op, dtype))?;
    let config = chunks_launch_config(bytes, device.info().multiprocessors, max_blocks);
    let args = ChunksArgs {
        buf,
        len: len as u64,
        out_area: areas.out_area,
        in_area: areas.in_area,
        divisor: divide_by,
        timeout_ns: waits.timeout_ns,
        queue_timeout_ns: waits.queue_timeout_ns,
        failed: areas.failed,
        seq_counter: areas.counter,
        half_stride: areas.half_stride,
        flags_offset: areas.flags_offset,
        broken: areas.broken,
    };
    Ok(Some(ChunksLaunch { function, config, params: args.params() }))
}
