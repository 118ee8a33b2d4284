//! `raw`: the one door to the driver for the crates above. Operations on addresses rather
//! than typed views, which the layers built on this crate wrap in safe, checked APIs.
//!
//! What it is for: `gp2p-pinned` moves data between device memory and pinned host memory
//! it owns (or that a framework hands it by address), and launches the reduce and exchange
//! kernels on mapped host memory; it does that through these functions and nothing else, so
//! every raw driver call of the workspace lives in this crate. Application code should not
//! need it: the typed views of this crate and of `gp2p-pinned` check bounds, devices and
//! pinning, and keep memory alive until the GPU is done with it (the lifetime rule of
//! [`crate::lifetime`]).
//!
//! What the unsafe functions here do not do: they note no last use (the caller notes the
//! point after the call on whatever it must keep alive), check no bounds (an address has
//! none), and do not check that host memory is pinned. Each says in `# Safety` exactly what
//! its caller guarantees. The safe functions only look addresses up; they never dereference.
//!
//! Where it sits in this crate: at the bottom of what it serves. It builds on the driver
//! calls (`driver`), the kernels' launches (`launch`, `replay`) and the devices, streams and
//! modules it launches on; the typed layers built on it (`memory`, `reduce`, `host`,
//! `registered`) are never imported here. xtask's tidy test (`cargo test -p xtask`) fails if
//! the modules of a crate import each other in a circle.
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::ops::Range;

use cudarc::driver::sys::{self, CUmemorytype, CUpointer_attribute};
use gp2p_kernels::{
    DType, EXCHANGE_MANY_MAX_WORLD, KernelFamily, ReduceOp, WAIT_FLAG_KERNEL, WAIT_FLAGS_KERNEL, chunk_area_layout,
    chunks_kernel_name, exchange_kernel_name, exchange_many_kernel_name, reduce_kernel_name,
};

use crate::driver::{RawDevicePtr, check};
pub use crate::launch::InOut;
use crate::launch::{
    ChunksArgs, ExchangeArgs, ExchangeManyArgs, KernelArgs, ONE_THREAD, ReduceArgs, SourceMemory, WaitFlagArgs,
    WaitFlagsArgs, check_divisor, chunks_launch_config, exchange_launch_config, launch_kernel, launch_params,
    reduce_launch_config,
};
use crate::replay::{LaunchCache, Params};
use crate::{Device, Error, Function, LaunchConfig, Module, Result, Stream};

mod codec;
pub(crate) use codec::launch_each_empty as launch_each_codec_kernel_empty;
pub use codec::{Codec, WIRE_ALIGN, compress_decode, compress_encode, compress_fold_encode};

/// Enqueue an asynchronous copy of `bytes` bytes between the memories of two devices on
/// `stream` (a stream of either device): one peer DMA where peer access is enabled, else
/// the driver stages it through host memory itself.
///
/// # Safety
/// - `src` is `bytes` readable bytes of device memory on `src_device`, and `dst` `bytes`
///   writable bytes on `dst_device`;
/// - both stay allocated, and nothing else writes `src` or touches `dst`, until the copy
///   completes on `stream` (order a free after it, or synchronise);
/// - the two ranges do not overlap.
pub unsafe fn memcpy_peer_async(
    stream: &Stream,
    dst_device: &Device,
    dst: RawDevicePtr,
    src_device: &Device,
    src: RawDevicePtr,
    bytes: usize,
) -> Result<()> {
    stream.device().bind()?;
    let (dst_ctx, src_ctx) = (dst_device.ctx(), src_device.ctx());
    // SAFETY: the ranges are the caller's contract; both contexts are retained primary
    // contexts, alive as long as their devices.
    let code = unsafe { sys::cuMemcpyPeerAsync(dst, dst_ctx, src, src_ctx, bytes, stream.raw()) };
    check(code, "cuMemcpyPeerAsync")
}

/// Enqueue an asynchronous copy of `bytes` bytes within the memory of the stream's device.
///
/// # Safety
/// - `src` is `bytes` readable and `dst` `bytes` writable bytes of device memory of the
///   stream's device;
/// - both stay allocated, nothing else writes `src` or touches `dst`, until the copy
///   completes on `stream`;
/// - the two ranges do not overlap.
pub unsafe fn memcpy_dtod_async(stream: &Stream, dst: RawDevicePtr, src: RawDevicePtr, bytes: usize) -> Result<()> {
    stream.device().bind()?;
    // SAFETY: the ranges are the caller's contract; the stream belongs to the bound context.
    check(unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, stream.raw()) }, "cuMemcpyDtoDAsync")
}

/// Enqueue, on `stream`, `count` elements of `element_bytes` (1, 2, 4 or 8) at `dst` set to
/// the low `element_bytes` bytes of `pattern` (each element the same value): one memset for
/// 1, 2 and 4 bytes, two strided ones (the low and the high words) for 8. Capturable into a
/// CUDA graph.
///
/// # Safety
/// `dst` is `count * element_bytes` writable bytes of device memory of the stream's device,
/// aligned to `element_bytes`, kept allocated and untouched by other work until the memset
/// completes on `stream`.
pub unsafe fn memset_elements_async(
    stream: &Stream,
    dst: RawDevicePtr,
    element_bytes: usize,
    pattern: u64,
    count: usize,
) -> Result<()> {
    if count == 0 {
        return Ok(());
    }
    stream.device().bind()?;
    let raw = stream.raw();
    let code = match element_bytes {
        // SAFETY: `count` bytes at `dst`, the caller's contract.
        1 => unsafe { sys::cuMemsetD8Async(dst, pattern as u8, count, raw) },
        // SAFETY: `count` 2-byte elements at `dst`, aligned, the caller's contract.
        2 => unsafe { sys::cuMemsetD16Async(dst, pattern as u16, count, raw) },
        // SAFETY: `count` 4-byte elements at `dst`, aligned, the caller's contract.
        4 => unsafe { sys::cuMemsetD32Async(dst, pattern as u32, count, raw) },
        8 => {
            // Each 8-byte element as a row of one 32-bit word at an 8-byte pitch: the low
            // words, then (4 bytes in) the high words.
            // SAFETY: `count` rows of 8 bytes at `dst`, 8-aligned, the caller's contract; the
            // memset writes the first word of each.
            let low = unsafe { sys::cuMemsetD2D32Async(dst, 8, pattern as u32, 1, count, raw) };
            check(low, "cuMemsetD2D32Async")?;
            // SAFETY: as above, the second word of each row.
            unsafe { sys::cuMemsetD2D32Async(dst + 4, 8, (pattern >> 32) as u32, 1, count, raw) }
        }
        other => {
            return Err(Error::InvalidArgument {
                name: "element_bytes",
                reason: format!("{other}: elements of 1, 2, 4 or 8 bytes are set"),
            });
        }
    };
    check(code, "cuMemset")
}

/// Enqueue an asynchronous device → host copy of `bytes` bytes on `stream`.
///
/// # Safety
/// - `src` is `bytes` readable bytes of device memory addressable from the stream's device;
/// - `dst` is `bytes` writable bytes of host memory, page-locked (the copy is asynchronous
///   only then: from pageable memory the driver copies synchronously, or reads memory the
///   caller has since freed);
/// - both stay allocated, nothing else reads or writes `dst` and nothing writes `src`, until
///   the copy completes on `stream`.
pub unsafe fn memcpy_dtoh_async(stream: &Stream, dst: *mut c_void, src: RawDevicePtr, bytes: usize) -> Result<()> {
    stream.device().bind()?;
    // SAFETY: the ranges are the caller's contract; the stream belongs to the bound context.
    check(unsafe { sys::cuMemcpyDtoHAsync_v2(dst, src, bytes, stream.raw()) }, "cuMemcpyDtoHAsync")
}

/// Enqueue an asynchronous host → device copy of `bytes` bytes on `stream`.
///
/// # Safety
/// - `src` is `bytes` readable bytes of host memory, page-locked (as for
///   [`memcpy_dtoh_async`]);
/// - `dst` is `bytes` writable bytes of device memory addressable from the stream's device;
/// - both stay allocated, nothing writes `src` and nothing else touches `dst`, until the copy
///   completes on `stream`.
pub unsafe fn memcpy_htod_async(stream: &Stream, dst: RawDevicePtr, src: *const c_void, bytes: usize) -> Result<()> {
    stream.device().bind()?;
    // SAFETY: the ranges are the caller's contract; the stream belongs to the bound context.
    check(unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src, bytes, stream.raw()) }, "cuMemcpyHtoDAsync")
}

/// Enqueue `dst[i] = op(dst[i], src[i])` for `len` elements of `dtype` on `stream`: the
/// checked [`crate::reduce`] on addresses, for views the caller checked itself (a pinned
/// slot, a framework's tensor). `source` says where `src` lives, which sets only the launch
/// shape ([`SourceMemory::ZeroCopy`] for mapped host memory read in place). Refuses
/// `divide_by` = 0 and misaligned addresses before launching.
///
/// # Safety
/// - `dst` is `len` writable elements of `dtype`, and `src` `len` readable ones, both
///   addressable from the stream's device (device memory, or mapped pinned host memory at
///   the address this device maps it: see [`mapped_device_ptr`]);
/// - both stay allocated, nothing else writes `dst` or `src`, until the kernel completes on
///   `stream`;
/// - the two ranges are the same range or do not overlap at all.
#[allow(clippy::too_many_arguments)]
pub unsafe fn reduce(
    stream: &Stream,
    dst: RawDevicePtr,
    src: RawDevicePtr,
    len: usize,
    dtype: DType,
    op: ReduceOp,
    divide_by: u32,
    source: SourceMemory,
) -> Result<()> {
    check_divisor(divide_by)?;
    check_aligned(&[("dst", dst), ("src", src)], dtype.size_bytes())?;
    if len == 0 {
        return Ok(());
    }
    let function = Module::kernels(stream.device(), KernelFamily::Reduce)?.function(reduce_kernel_name(op, dtype))?;
    let config = reduce_launch_config(len, dtype, stream.device().info().multiprocessors, source);
    let args = ReduceArgs { dst, src, len: len as u64, divisor: divide_by };
    // SAFETY: a reduce kernel of `dtype`; the addresses are the caller's contract.
    unsafe { launch_kernel(&function, stream, config, &args, None) }
}

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
    check_in_out(buf, len.saturating_mul(dtype.size_bytes()), dtype.size_bytes())?;
    check_aligned(&[("out_area", areas.out_area), ("in_area", areas.in_area), ("half_stride", areas.half_stride)], 64)?;
    check_aligned(&[("flags_offset", areas.flags_offset)], 64)?;
    let bytes = len.checked_mul(dtype.size_bytes()).ok_or_else(|| Error::InvalidArgument {
        name: "len",
        reason: format!("{len} elements of {} do not fit in the address space", dtype.name()),
    })?;
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

/// Enqueue a write of `value` to the `u32` at `flag` on `stream`, after the work queued
/// there so far has completed and its writes are visible (a stream memory operation, with
/// its default memory barrier): the signal half of a pipeline between processes.
///
/// # Safety
/// `flag` is a writable, 4-byte aligned `u32` addressable from the stream's device (mapped
/// pinned host memory as this device maps it, say) that stays allocated until the write
/// completes on `stream`.
pub unsafe fn write_flag(stream: &Stream, flag: RawDevicePtr, value: u32) -> Result<()> {
    check_aligned(&[("flag", flag)], 4)?;
    stream.device().bind()?;
    let flags = sys::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32;
    // SAFETY: the address is the caller's contract; the stream belongs to the bound context.
    check(unsafe { sys::cuStreamWriteValue32_v2(stream.raw(), flag, value, flags) }, "cuStreamWriteValue32")
}

/// Where a [`wait_flag`] reports giving up, and learns that another wait did.
#[derive(Debug, Clone, Copy)]
pub struct GiveUp {
    /// This rank's `u32`, set to 1 by a wait that gives up.
    pub failed: RawDevicePtr,
    /// A `u32` every rank's waits read and set: once it is 1, waits return at once.
    pub broken: RawDevicePtr,
}

/// Enqueue a bounded wait on `stream` (one thread of the wait kernel,
/// [`gp2p_kernels::WAIT_FLAG_KERNEL`]): later work there starts once the `u32` at `flag`
/// equals `value`, or once the wait gave up after `timeout_ns` (then both words of `give_up`
/// are 1 and what follows reads whatever the flag guards, as it is). A wait that finds either
/// word set returns at once.
///
/// # Safety
/// - `flag` is a readable `u32` and the words of `give_up` writable ones, 4-byte aligned,
///   addressable from the stream's device (mapped pinned host memory as this device maps
///   it, say) and allocated until the kernel completes on `stream`;
/// - the kernel occupies one thread until then: whoever sets the flag must not need this
///   stream's later work, or the wait ends only at its timeout.
pub unsafe fn wait_flag(
    stream: &Stream,
    flag: RawDevicePtr,
    value: u32,
    give_up: GiveUp,
    timeout_ns: u64,
) -> Result<()> {
    let words = [("flag", flag), ("failed", give_up.failed), ("broken", give_up.broken)];
    if let Some((name, _)) = words.iter().find(|(_, ptr)| *ptr == 0) {
        return Err(Error::InvalidArgument { name, reason: "a wait needs this word; got address 0".into() });
    }
    check_aligned(&words, 4)?;
    let function = Module::kernels(stream.device(), KernelFamily::Flags)?.function(WAIT_FLAG_KERNEL)?;
    let args = WaitFlagArgs { flag, value, timeout_ns, failed: give_up.failed, broken: give_up.broken };
    // SAFETY: the wait kernel; the addresses are the caller's contract.
    unsafe { launch_kernel(&function, stream, ONE_THREAD, &args, None) }
}

/// Enqueue a bounded wait on `count` consecutive `u32` flags from `flags` (one thread of
/// [`gp2p_kernels::WAIT_FLAGS_KERNEL`]): later work on `stream` starts once every one equals
/// `value`, or once the wait gave up (as [`wait_flag`]'s does).
///
/// # Safety
/// As for [`wait_flag`], for each of the `count` flags.
pub unsafe fn wait_flags(
    stream: &Stream,
    flags: RawDevicePtr,
    count: usize,
    value: u32,
    give_up: GiveUp,
    timeout_ns: u64,
) -> Result<()> {
    let words = [("flags", flags), ("failed", give_up.failed), ("broken", give_up.broken)];
    if let Some((name, _)) = words.iter().find(|(_, ptr)| *ptr == 0) {
        return Err(Error::InvalidArgument { name, reason: "a wait needs this word; got address 0".into() });
    }
    check_aligned(&words, 4)?;
    let count = u32::try_from(count).map_err(|_| Error::InvalidArgument {
        name: "count",
        reason: format!("{count} flags is more than one wait takes"),
    })?;
    let function = Module::kernels(stream.device(), KernelFamily::Flags)?.function(WAIT_FLAGS_KERNEL)?;
    let args = WaitFlagsArgs { flags, count, value, timeout_ns, failed: give_up.failed, broken: give_up.broken };
    // SAFETY: the wait kernel; the addresses are the caller's contract.
    unsafe { launch_kernel(&function, stream, ONE_THREAD, &args, None) }
}

/// Refuse `buf`'s addresses misaligned for elements of `align` bytes, and a `dst` that
/// overlaps `src` without being it: each thread of a kernel reads its own elements before it
/// writes them, so the same buffer is safe, but a shifted one would have threads overwrite
/// what others have yet to read.
fn check_in_out(buf: InOut, bytes: usize, align: usize) -> Result<()> {
    check_aligned(&[("src", buf.src), ("dst", buf.dst)], align)?;
    let end = |p: RawDevicePtr| p.saturating_add(bytes as u64);
    if buf.src != buf.dst && bytes > 0 && buf.src < end(buf.dst) && buf.dst < end(buf.src) {
        return Err(Error::InvalidArgument {
            name: "dst",
            reason: format!(
                "{:#x} overlaps src {:#x} ({bytes} bytes each): pass the same address (in place) or memory apart",
                buf.dst, buf.src
            ),
        });
    }
    Ok(())
}

/// Refuses the first of `addresses` (argument name, address) not aligned to `align` bytes.
pub(crate) fn check_aligned(addresses: &[(&'static str, RawDevicePtr)], align: usize) -> Result<()> {
    match addresses.iter().find(|(_, ptr)| ptr % align as u64 != 0) {
        Some(&(name, ptr)) => {
            Err(Error::InvalidArgument { name, reason: format!("address {ptr:#x} is not aligned to {align} bytes") })
        }
        None => Ok(()),
    }
}

/// The address at which `device` sees the page-locked host memory at `host` (allocated
/// mapped, or registered, with the driver); an error for memory the driver does not know as
/// mapped. Equal to the host address wherever unified addressing is on. Only looks the
/// address up.
pub fn mapped_device_ptr(device: &Device, host: *const u8) -> Result<RawDevicePtr> {
    device.bind()?;
    let mut dptr: RawDevicePtr = 0;
    // SAFETY: the driver only looks the address up (an unknown one is an error, not a
    // dereference); out-pointer to a local.
    let code = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dptr, host.cast_mut().cast::<c_void>(), 0) };
    check(code, "cuMemHostGetDevicePointer")?;
    Ok(dptr)
}

/// What the driver knows about one host address ([`lookup_host`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostLookup {
    /// Whether the address lies in page-locked host memory known to CUDA.
    pub pinned: bool,
    /// The allocation it lies in, where the driver reports one.
    pub allocation: Option<Range<u64>>,
}

/// Ask, in `device`'s context, whether `addr` is page-locked host memory and which
/// allocation holds it. Uses `cuPointerGetAttributes`, which (unlike
/// `cuPointerGetAttribute`) answers zeros rather than an error for addresses it does not
/// know: the common "not pinned" answer raises no CUDA error and leaves none behind. Only
/// looks the address up.
pub fn lookup_host(device: &Device, addr: u64) -> Result<HostLookup> {
    device.bind()?;
    let mut memory_type: u32 = 0;
    let mut start: u64 = 0;
    let mut size: usize = 0;
    let mut attributes = [
        CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
        CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
        CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
    ];
    let mut data: [*mut c_void; 3] = [(&raw mut memory_type).cast(), (&raw mut start).cast(), (&raw mut size).cast()];
    // SAFETY: a context is current (bound above); each data pointer addresses a local of the
    // type its attribute writes (CUmemorytype as u32, CUdeviceptr, size_t); the address is
    // only looked up, never dereferenced.
    let code = unsafe { sys::cuPointerGetAttributes(3, attributes.as_mut_ptr(), data.as_mut_ptr(), addr) };
    check(code, "cuPointerGetAttributes")?;
    Ok(HostLookup {
        pinned: memory_type == CUmemorytype::CU_MEMORYTYPE_HOST as u32,
        allocation: (size > 0).then(|| start..start.saturating_add(size as u64)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kernel_takes_one_buffer_in_place_or_two_apart_but_never_two_that_overlap() {
        let at = |src: u64, dst: u64| check_in_out(InOut { src, dst }, 64, 4);
        assert!(check_in_out(InOut::in_place(0x1000), 64, 4).is_ok());
        assert!(at(0x1000, 0x1040).is_ok(), "dst starts where src ends");
        assert!(at(0x1040, 0x1000).is_ok(), "src starts where dst ends");
        for (src, dst) in [(0x1000, 0x1004), (0x1004, 0x1000), (0x1000, 0x103c)] {
            let err = at(src, dst).expect_err("overlapping buffers must be refused").to_string();
            assert!(err.contains("argument dst: ") && err.contains("in place"), "{err}");
        }
        assert!(at(0x1000, 0x1000 + 2).is_err(), "a dst misaligned for the elements is refused");
        assert!(check_in_out(InOut { src: 0x1000, dst: 0x1004 }, 0, 4).is_ok(), "no bytes, no overlap");
    }
}
