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
    DType, KernelFamily, ReduceOp, STAMP_KERNEL, WAIT_FLAG_KERNEL, WAIT_FLAGS_KERNEL, reduce_kernel_name,
};

use crate::driver::{RawDevicePtr, check};
pub use crate::launch::InOut;
use crate::launch::{
    ONE_THREAD, ReduceArgs, SourceMemory, StampArgs, WaitFlagArgs, WaitFlagsArgs, check_divisor, launch_kernel,
    reduce_launch_config,
};
use crate::{Device, Error, Module, Result, Stream};

mod chunks_many;
mod codec;
mod exchange;
mod mem_ops;
pub use chunks_many::{ManyChunkAreas, plan_chunks_many};
pub(crate) use codec::launch_each_empty as launch_each_codec_kernel_empty;
pub use codec::{
    Codec, WIRE_ALIGN, compress_decode, compress_encode, compress_fold_decode, compress_fold_encode, wire_from_host,
    wire_to_host,
};
pub use exchange::{
    ChunkAreas, ChunkWaits, ChunksLaunch, ExchangeLines, ManyLines, Numbering, exchange, exchange_many,
    plan_exchange_chunks,
};
pub use mem_ops::{
    MAX_FLAG_BATCH, MAX_MEM_OPS, MemOp, Note, Until, mem_ops, wait_flags_stream, write_flag, write_flags,
};

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
    check_words("a wait", &[("flag", flag), ("failed", give_up.failed), ("broken", give_up.broken)], 4)?;
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
    check_words("a wait", &[("flags", flags), ("failed", give_up.failed), ("broken", give_up.broken)], 4)?;
    let count = u32::try_from(count).map_err(|_| Error::InvalidArgument {
        name: "count",
        reason: format!("{count} flags is more than one wait takes"),
    })?;
    let function = Module::kernels(stream.device(), KernelFamily::Flags)?.function(WAIT_FLAGS_KERNEL)?;
    let args = WaitFlagsArgs { flags, count, value, timeout_ns, failed: give_up.failed, broken: give_up.broken };
    // SAFETY: the wait kernel; the addresses are the caller's contract.
    unsafe { launch_kernel(&function, stream, ONE_THREAD, &args, None) }
}

/// Enqueue a stamp of the GPU's global clock into the `u64` at `at` on `stream` (one thread of
/// [`gp2p_kernels::STAMP_KERNEL`]): nanoseconds, read once the work queued there before it is
/// done, on the clock every context of the device reads. What [`crate::Timeline`] marks with.
///
/// # Safety
/// `at` is a writable, 8-byte aligned `u64` of the stream's device that stays allocated until
/// the kernel completes on `stream`, and that nothing else touches meanwhile.
pub unsafe fn stamp(stream: &Stream, at: RawDevicePtr) -> Result<()> {
    check_words("a stamp", &[("at", at)], 8)?;
    let function = Module::kernels(stream.device(), KernelFamily::Flags)?.function(STAMP_KERNEL)?;
    // SAFETY: the stamp kernel; the address is the caller's contract.
    unsafe { launch_kernel(&function, stream, ONE_THREAD, &StampArgs { at }, None) }
}

/// The bytes of `len` elements of `dtype` at `buf`, after [`check_in_out`]'s checks; refuses a
/// length whose bytes do not fit in the address space.
fn checked_bytes(buf: InOut, len: usize, dtype: DType) -> Result<usize> {
    let bytes = len.checked_mul(dtype.size_bytes()).ok_or_else(|| Error::InvalidArgument {
        name: "len",
        reason: format!("{len} elements of {} do not fit in the address space", dtype.name()),
    })?;
    check_in_out(buf, bytes, dtype.size_bytes())?;
    Ok(bytes)
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

/// Refuse any of `words` (each named by its argument) at address 0 or not aligned to
/// `align` bytes: `what` (a wait, a stamp, ...) needs them all.
pub(crate) fn check_words(what: &str, words: &[(&'static str, RawDevicePtr)], align: usize) -> Result<()> {
    if let Some(&(name, _)) = words.iter().find(|(_, ptr)| *ptr == 0) {
        return Err(Error::InvalidArgument { name, reason: format!("{what} needs this word; got address 0") });
    }
    check_aligned(words, align)
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
