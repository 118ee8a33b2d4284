//! The host-side primitives: DMA to and from pinned memory, and the zero-copy reduce.
#![allow(unsafe_code)]

use gp2p_cuda::SourceMemory;
use gp2p_cuda::raw::{self, memcpy_dtoh_async, memcpy_htod_async};
use gp2p_cuda::{Device, DeviceView, DeviceViewMut, Stream};
use gp2p_kernels::{Element, ReduceOp};

use crate::{Error, PinnedView, PinnedViewMut, Result, is_pinned_on};

/// Enqueue a DMA of `src` (device memory) into `dst` (pinned host memory) on `stream`.
/// Asynchronous: the host is not blocked; `dst`'s buffer waits for it before host access.
pub fn copy_to_host<T: Element>(
    stream: &Stream,
    src: &DeviceView<'_, T>,
    dst: &mut PinnedViewMut<'_, T>,
) -> Result<()> {
    check_pair(stream, src.device().ordinal(), "src", src.len(), dst.len())?;
    if dst.is_empty() {
        return Ok(());
    }
    // SAFETY: src is len device elements on the stream's device, dst len pinned host
    // elements; both note the point below, so neither is freed (nor dst handed to the host)
    // before the DMA is done.
    unsafe { memcpy_dtoh_async(stream, dst.host_mut_ptr().cast(), src.raw_ptr(), dst.bytes())? };
    let point = stream.point()?;
    src.note_use(&point);
    dst.note_use(&point);
    Ok(())
}

/// Enqueue a DMA of `src` (pinned host memory) into `dst` (device memory) on `stream`.
/// Asynchronous: the host is not blocked; `src`'s buffer waits for it before host writes.
pub fn copy_from_host<T: Element>(
    stream: &Stream,
    src: &PinnedView<'_, T>,
    dst: &mut DeviceViewMut<'_, T>,
) -> Result<()> {
    check_pair(stream, dst.device().ordinal(), "dst", dst.len(), src.len())?;
    if src.is_empty() {
        return Ok(());
    }
    // SAFETY: as in copy_to_host, directions swapped.
    unsafe { memcpy_htod_async(stream, dst.raw_ptr(), src.host_ptr().cast(), src.bytes())? };
    let point = stream.point()?;
    src.note_use(&point);
    dst.note_use(&point);
    Ok(())
}

/// Enqueue `dst[i] = op(dst[i], src[i])` on `stream`, where the kernel reads `src` straight
/// out of pinned host memory across PCIe (no copy into device memory first).
///
/// `divide_by` is as in [`gp2p_cuda::reduce`]: for [`ReduceOp::Avg`], the divisor of the last
/// step (1 otherwise); it must be ≥ 1.
pub fn reduce_from_host<T: Element>(
    stream: &Stream,
    dst: &mut DeviceViewMut<'_, T>,
    src: &PinnedView<'_, T>,
    op: ReduceOp,
    divide_by: u32,
) -> Result<()> {
    check_pair(stream, dst.device().ordinal(), "dst", dst.len(), src.len())?;
    let mapped = src.device_ptr(stream.device())?;
    // SAFETY: dst is len device elements on the stream's device; `mapped` addresses src's len
    // elements as this device sees them; device and host memory cannot overlap. Both note
    // the point below, so host writes and frees wait for the kernel.
    unsafe { raw::reduce(stream, dst.raw_ptr(), mapped, dst.len(), T::DTYPE, op, divide_by, SourceMemory::ZeroCopy)? };
    if !src.is_empty() {
        let point = stream.point()?;
        src.note_use(&point);
        dst.note_use(&point);
    }
    Ok(())
}

/// Enqueue a round trip through pinned host memory on one stream: a DMA of `src` (device
/// memory) into `host`, then a DMA of `host` into `dst` (device memory), with one stream
/// point noted on all three after both. Nothing else is enqueued between or around the two
/// DMAs (no event in between), so timing it measures what a one-chunk staged copy on one
/// device cannot beat: the CLI's small-copy latency reference. `src`, `dst` and the stream
/// are on one device; all three views have equal lengths. Asynchronous, like
/// [`copy_to_host`].
pub fn round_trip<T: Element>(
    stream: &Stream,
    src: &DeviceView<'_, T>,
    host: &mut PinnedViewMut<'_, T>,
    dst: &mut DeviceViewMut<'_, T>,
) -> Result<()> {
    check_pair(stream, src.device().ordinal(), "src", src.len(), host.len())?;
    check_pair(stream, dst.device().ordinal(), "dst", dst.len(), host.len())?;
    if host.is_empty() {
        return Ok(());
    }
    // SAFETY: src is len device elements on the stream's device, host len pinned host
    // elements; all three note the point below, so none is freed (nor host handed to the
    // CPU) before both DMAs are done.
    unsafe { memcpy_dtoh_async(stream, host.host_mut_ptr().cast(), src.raw_ptr(), host.bytes())? };
    // SAFETY: as above, directions swapped; the stream orders this DMA after the first, so
    // it reads what that one wrote.
    let second =
        unsafe { memcpy_htod_async(stream, dst.raw_ptr(), host.host_mut_ptr().cast_const().cast(), host.bytes()) };
    // Noted even if the second DMA failed: the first is enqueued.
    let point = stream.point()?;
    src.note_use(&point);
    host.note_use(&point);
    dst.note_use(&point);
    Ok(second?)
}

/// Refuses a device view `what` off the stream's device, and a host range of another length.
fn check_pair(stream: &Stream, device: usize, what: &'static str, device_len: usize, host_len: usize) -> Result<()> {
    let expected = stream.device().ordinal();
    if device != expected {
        return Err(Error::WrongDevice { what, got: device, of: "the stream", expected });
    }
    if device_len != host_len {
        return Err(Error::LengthMismatch { what: "the host memory", got: host_len, of: what, expected: device_len });
    }
    Ok(())
}

/// Refuse a host range that is not page-locked, before any work: an async DMA from
/// pageable memory would silently turn synchronous (or touch memory the caller frees).
pub fn require_pinned(device: &Device, what: &'static str, ptr: *const u8, bytes: usize) -> Result<()> {
    if is_pinned_on(device, ptr, bytes)? { Ok(()) } else { Err(Error::NotPinned { what, ptr: ptr as usize, bytes }) }
}

/// [`copy_to_host`] into host memory from elsewhere (a framework's pinned tensor), given by
/// address. Refused with [`Error::NotPinned`] unless the range is page-locked; the refusal
/// leaves no CUDA error behind.
///
/// # Safety
/// `dst` must point to `len` elements of `T` of page-locked host memory (the call checks
/// that much and refuses otherwise), and the caller guarantees that the memory stays
/// allocated, and that nothing else reads or writes it, until the copy completes on
/// `stream` (synchronise it, or order the free after it). `src`'s own buffer is protected
/// by the lifetime rule; `dst` is not, since geforce-p2p does not own it.
pub unsafe fn copy_to_host_raw<T: Element>(
    stream: &Stream,
    src: &DeviceView<'_, T>,
    dst: *mut T,
    len: usize,
) -> Result<()> {
    check_pair(stream, src.device().ordinal(), "src", src.len(), len)?;
    require_pinned(stream.device(), "dst", dst.cast_const().cast(), src.bytes())?;
    if len == 0 {
        return Ok(());
    }
    // SAFETY: the caller's contract, plus the checks above (pinned, same length, device).
    unsafe { memcpy_dtoh_async(stream, dst.cast(), src.raw_ptr(), src.bytes())? };
    src.note_use(&stream.point()?);
    Ok(())
}

/// [`copy_from_host`] from host memory given by address. Refused with [`Error::NotPinned`]
/// unless the range is page-locked.
///
/// # Safety
/// `src` must point to `len` elements of `T` of page-locked host memory (checked, as for
/// [`copy_to_host_raw`]), and the caller guarantees that it stays allocated and unwritten
/// until the copy completes on `stream`.
pub unsafe fn copy_from_host_raw<T: Element>(
    stream: &Stream,
    src: *const T,
    len: usize,
    dst: &mut DeviceViewMut<'_, T>,
) -> Result<()> {
    check_pair(stream, dst.device().ordinal(), "dst", dst.len(), len)?;
    require_pinned(stream.device(), "src", src.cast(), dst.bytes())?;
    if len == 0 {
        return Ok(());
    }
    // SAFETY: the caller's contract, plus the checks above (pinned, same length, device).
    unsafe { memcpy_htod_async(stream, dst.raw_ptr(), src.cast(), dst.bytes())? };
    dst.note_use(&stream.point()?);
    Ok(())
}

/// [`reduce_from_host`] with `src` in page-locked host memory from elsewhere (a framework's
/// pinned tensor), given by address: the kernel reads it across PCIe where the stream's
/// device maps it, with the zero-copy launch shape. Refused with [`Error::NotPinned`] unless
/// the range is page-locked; the refusal leaves no CUDA error behind.
///
/// # Safety
/// `src` must point to `len` elements of `T` of page-locked host memory (checked), which
/// stay allocated and unwritten until the kernel completes on `stream`; this crate does not
/// own it, so the lifetime rule does not cover it.
pub unsafe fn reduce_from_host_raw<T: Element>(
    stream: &Stream,
    dst: &mut DeviceViewMut<'_, T>,
    src: *const T,
    len: usize,
    op: ReduceOp,
    divide_by: u32,
) -> Result<()> {
    check_pair(stream, dst.device().ordinal(), "dst", dst.len(), len)?;
    require_pinned(stream.device(), "src", src.cast(), dst.bytes())?;
    if len == 0 {
        return Ok(());
    }
    let mapped = raw::mapped_device_ptr(stream.device(), src.cast())?;
    // SAFETY: dst is len device elements on the stream's device (checked); `mapped` addresses
    // the caller's len pinned elements as this device sees them, valid per the contract;
    // host memory never overlaps device memory.
    unsafe { raw::reduce(stream, dst.raw_ptr(), mapped, len, T::DTYPE, op, divide_by, SourceMemory::ZeroCopy)? };
    dst.note_use(&stream.point()?);
    Ok(())
}
