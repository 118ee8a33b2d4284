//! Typed device memory: `DeviceBuffer` owns an allocation, `DeviceView` / `DeviceViewMut`
//! borrow a range of one (or describe foreign memory, for interop).
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};

use cudarc::driver::sys::{self, CUdeviceptr};
use gp2p_kernels::Element;

use crate::driver::{check, defer_error};
use crate::{Device, Error, Result, Stream};

/// A raw device address.
pub type RawDevicePtr = CUdeviceptr;

/// An owned, typed device allocation. Its contents start undefined.
///
/// Stream ordering: freeing waits for nothing, as with `cuMemFree`; the driver keeps the
/// memory alive until kernels already enqueued on it have finished reading it only when
/// the free happens after them in a synchronised order. Drop buffers after synchronising
/// the streams that use them, as with any CUDA allocation.
pub struct DeviceBuffer<T: Element> {
    device: Device,
    ptr: CUdeviceptr,
    len: usize,
    _marker: PhantomData<T>,
}

impl<T: Element> DeviceBuffer<T> {
    /// Allocate `len` elements on `device`. A zero length allocates nothing.
    pub fn alloc(device: &Device, len: usize) -> Result<Self> {
        let bytes = bytes_of::<T>(len)?;
        let mut ptr: CUdeviceptr = 0;
        if bytes > 0 {
            device.bind()?;
            // SAFETY: the context is current; out-pointer to a local.
            check(unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes) }, "cuMemAlloc")?;
        }
        Ok(DeviceBuffer { device: device.clone(), ptr, len, _marker: PhantomData })
    }

    /// Allocate on the stream's device and upload `data`; blocks until the upload is done.
    pub fn from_host(stream: &Stream, data: &[T]) -> Result<Self> {
        let mut buffer = Self::alloc(stream.device(), data.len())?;
        buffer.upload(stream, data)?;
        Ok(buffer)
    }

    /// Copy `data` into this buffer on `stream` (after earlier work there) and block until
    /// it is done. For set-up and tests; the pipelines use pinned memory instead.
    pub fn upload(&mut self, stream: &Stream, data: &[T]) -> Result<()> {
        self.check_stream(stream)?;
        check_len("host data", data.len(), self.len)?;
        if self.len > 0 {
            // SAFETY: the destination holds len elements, the source slice as many; the host
            // memory stays borrowed until the stream is synchronised below.
            unsafe { memcpy_htod_async(stream, self.ptr, data.as_ptr().cast(), self.bytes())? };
        }
        stream.synchronize()
    }

    /// Copy this buffer into `out` on `stream` (after earlier work there) and block until
    /// it is done.
    pub fn download(&self, stream: &Stream, out: &mut [T]) -> Result<()> {
        self.check_stream(stream)?;
        check_len("host output", out.len(), self.len)?;
        if self.len > 0 {
            // SAFETY: both sides hold len elements; `out` stays borrowed until the sync.
            unsafe { memcpy_dtoh_async(stream, out.as_mut_ptr().cast(), self.ptr, self.bytes())? };
        }
        stream.synchronize()
    }

    /// [`DeviceBuffer::download`] into a new vector.
    pub fn to_host_vec(&self, stream: &Stream) -> Result<Vec<T>> {
        self.check_stream(stream)?;
        self.view(..).to_host_vec(stream)
    }

    /// Set every byte to `byte` on `stream`, asynchronously (poisoning outputs in tests).
    pub fn fill_bytes(&mut self, stream: &Stream, byte: u8) -> Result<()> {
        self.view_mut(..).fill_bytes(stream, byte)
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.len * size_of::<T>()
    }

    /// The device it lives on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The raw device address of the first element.
    pub fn raw_ptr(&self) -> RawDevicePtr {
        self.ptr
    }

    /// Borrow a range of elements for reading.
    pub fn view(&self, range: impl RangeBounds<usize>) -> DeviceView<'_, T> {
        let (ptr, len) = subrange::<T>(self.ptr, self.len, range);
        DeviceView { device: self.device.clone(), ptr, len, _marker: PhantomData }
    }

    /// Borrow a range of elements for writing.
    pub fn view_mut(&mut self, range: impl RangeBounds<usize>) -> DeviceViewMut<'_, T> {
        let (ptr, len) = subrange::<T>(self.ptr, self.len, range);
        DeviceViewMut { device: self.device.clone(), ptr, len, _marker: PhantomData }
    }

    fn check_stream(&self, stream: &Stream) -> Result<()> {
        if stream.device() != &self.device {
            return Err(Error::WrongDevice {
                what: "buffer",
                got: self.device.ordinal(),
                expected: stream.device().ordinal(),
            });
        }
        Ok(())
    }
}

impl<T: Element> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        if self.ptr != 0 {
            let result = self.device.bind().and_then(|()| {
                // SAFETY: we own the allocation and free it once.
                check(unsafe { sys::cuMemFree_v2(self.ptr) }, "cuMemFree")
            });
            defer_error(result);
        }
    }
}

impl<T: Element> std::fmt::Debug for DeviceBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceBuffer<{}>({} elements on device {})", T::DTYPE, self.len, self.device.ordinal())
    }
}

/// A read-only range of typed device memory.
#[derive(Clone)]
pub struct DeviceView<'a, T: Element> {
    device: Device,
    ptr: CUdeviceptr,
    len: usize,
    _marker: PhantomData<&'a T>,
}

/// A writable range of typed device memory.
pub struct DeviceViewMut<'a, T: Element> {
    device: Device,
    ptr: CUdeviceptr,
    len: usize,
    _marker: PhantomData<&'a mut T>,
}

macro_rules! view_common {
    ($name:ident) => {
        impl<'a, T: Element> $name<'a, T> {
            /// Describe foreign device memory (from another framework) as a view.
            ///
            /// # Safety
            /// `ptr` must address `len` elements of `T`, suitably aligned, on `device`, valid
            /// (and, for a mutable view, not accessed by anyone else) for lifetime `'a` and for
            /// as long as any GPU work enqueued through the view runs.
            pub unsafe fn from_raw(device: &Device, ptr: RawDevicePtr, len: usize) -> Self {
                $name { device: device.clone(), ptr, len, _marker: PhantomData }
            }

            /// Number of elements.
            pub fn len(&self) -> usize {
                self.len
            }

            /// Whether the view is empty.
            pub fn is_empty(&self) -> bool {
                self.len == 0
            }

            /// Size in bytes.
            pub fn bytes(&self) -> usize {
                self.len * size_of::<T>()
            }

            /// The device the memory is on.
            pub fn device(&self) -> &Device {
                &self.device
            }

            /// The raw address of the first element.
            pub fn raw_ptr(&self) -> RawDevicePtr {
                self.ptr
            }

            /// The byte range `[start, end)` the view covers, for overlap checks.
            pub fn byte_range(&self) -> std::ops::Range<u64> {
                self.ptr..self.ptr + self.bytes() as u64
            }
        }

        impl<T: Element> std::fmt::Debug for $name<'_, T> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(
                    f,
                    "{}<{}>({} elements at {:#x} on device {})",
                    stringify!($name),
                    T::DTYPE,
                    self.len,
                    self.ptr,
                    self.device.ordinal()
                )
            }
        }
    };
}
view_common!(DeviceView);
view_common!(DeviceViewMut);

impl<T: Element> DeviceView<'_, T> {
    /// A sub-range of this view (clamped like [`DeviceBuffer::view`]).
    pub fn slice(&self, range: impl RangeBounds<usize>) -> DeviceView<'_, T> {
        let (ptr, len) = subrange::<T>(self.ptr, self.len, range);
        DeviceView { device: self.device.clone(), ptr, len, _marker: PhantomData }
    }

    /// Copy this view into a new vector on `stream` (after earlier work there) and block
    /// until it is done.
    pub fn to_host_vec(&self, stream: &Stream) -> Result<Vec<T>> {
        if stream.device() != &self.device {
            return Err(Error::WrongDevice {
                what: "view",
                got: self.device.ordinal(),
                expected: stream.device().ordinal(),
            });
        }
        let mut out: Vec<T> = Vec::with_capacity(self.len);
        if self.len > 0 {
            // SAFETY: the spare capacity holds len elements; the DMA writes all of them and
            // the stream is synchronised before the vector is used.
            unsafe { memcpy_dtoh_async(stream, out.spare_capacity_mut().as_mut_ptr().cast(), self.ptr, self.bytes())? };
        }
        stream.synchronize()?;
        // SAFETY: capacity is len and the completed DMA initialised all len elements (T is
        // plain data valid for any bit pattern).
        unsafe { out.set_len(self.len) };
        Ok(out)
    }
}

impl<'a, T: Element> DeviceViewMut<'a, T> {
    /// Reborrow as read-only.
    pub fn as_view(&self) -> DeviceView<'_, T> {
        DeviceView { device: self.device.clone(), ptr: self.ptr, len: self.len, _marker: PhantomData }
    }

    /// A writable sub-range of this view (clamped like [`DeviceBuffer::view_mut`]).
    pub fn slice_mut(&mut self, range: impl RangeBounds<usize>) -> DeviceViewMut<'_, T> {
        let (ptr, len) = subrange::<T>(self.ptr, self.len, range);
        DeviceViewMut { device: self.device.clone(), ptr, len, _marker: PhantomData }
    }

    /// Copy `src` into this view on `stream`, asynchronously: a device-to-device copy when
    /// both are on one device, else one peer DMA (enable peer access first for a direct
    /// path; without it the driver stages the copy itself). `stream` may belong to either
    /// device.
    pub fn copy_from(&mut self, stream: &Stream, src: &DeviceView<'_, T>) -> Result<()> {
        if stream.device() != &self.device && stream.device() != src.device() {
            return Err(Error::WrongDevice {
                what: "copy",
                got: self.device.ordinal(),
                expected: stream.device().ordinal(),
            });
        }
        check_len("src view", src.len(), self.len)?;
        let same_device = src.device() == &self.device;
        let (d, s) = (self.byte_range(), src.byte_range());
        if same_device && d.start < s.end && s.start < d.end && self.len > 0 {
            return Err(Error::InvalidArgument {
                name: "src",
                reason: format!("overlaps dst ({s:#x?} and {d:#x?}): copy through a temporary"),
            });
        }
        if self.len == 0 {
            return Ok(());
        }
        if !same_device {
            // SAFETY: both views cover len elements on their devices; different devices'
            // memories never overlap.
            return unsafe { memcpy_peer_async(stream, &self.device, self.ptr, src.device(), src.ptr, self.bytes()) };
        }
        self.device.bind()?;
        // SAFETY: both views cover len elements on the stream's device and do not overlap.
        check(unsafe { sys::cuMemcpyDtoDAsync_v2(self.ptr, src.ptr, self.bytes(), stream.raw()) }, "cuMemcpyDtoDAsync")
    }

    /// Set every byte to `byte` on `stream`, asynchronously.
    pub fn fill_bytes(&mut self, stream: &Stream, byte: u8) -> Result<()> {
        if stream.device() != &self.device {
            return Err(Error::WrongDevice {
                what: "view",
                got: self.device.ordinal(),
                expected: stream.device().ordinal(),
            });
        }
        if self.len == 0 {
            return Ok(());
        }
        self.device.bind()?;
        // SAFETY: the view covers bytes() writable bytes on the stream's device.
        check(unsafe { sys::cuMemsetD8Async(self.ptr, byte, self.bytes(), stream.raw()) }, "cuMemsetD8Async")
    }
}

/// Asynchronous copy between the memories of two devices on `stream` (of either device):
/// one peer DMA where peer access is enabled, else the driver stages it itself.
///
/// # Safety
/// `src` must be `bytes` readable bytes on `src_device` and `dst` `bytes` writable bytes on
/// `dst_device`, both valid until the copy completes, not overlapping.
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
    // SAFETY: forwarded to the caller's contract; both contexts are retained primary contexts.
    let code = unsafe { sys::cuMemcpyPeerAsync(dst, dst_ctx, src, src_ctx, bytes, stream.raw()) };
    check(code, "cuMemcpyPeerAsync")
}

/// Asynchronous device → host copy on `stream`.
///
/// # Safety
/// `dst` must be valid for `bytes` writes and `src` for `bytes` reads on the stream's device,
/// both until the copy completes; nothing else may access `dst` meanwhile. For an
/// asynchronous copy `dst` must be page-locked; pageable memory makes the call synchronous.
pub unsafe fn memcpy_dtoh_async(stream: &Stream, dst: *mut c_void, src: RawDevicePtr, bytes: usize) -> Result<()> {
    stream.device().bind()?;
    // SAFETY: forwarded to the caller's contract.
    check(unsafe { sys::cuMemcpyDtoHAsync_v2(dst, src, bytes, stream.raw()) }, "cuMemcpyDtoHAsync")
}

/// Asynchronous host → device copy on `stream`.
///
/// # Safety
/// `src` must be valid for `bytes` reads and `dst` for `bytes` writes on the stream's device,
/// both until the copy completes; nothing may write `src` meanwhile.
pub unsafe fn memcpy_htod_async(stream: &Stream, dst: RawDevicePtr, src: *const c_void, bytes: usize) -> Result<()> {
    stream.device().bind()?;
    // SAFETY: forwarded to the caller's contract.
    check(unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src, bytes, stream.raw()) }, "cuMemcpyHtoDAsync")
}

fn bytes_of<T>(len: usize) -> Result<usize> {
    len.checked_mul(size_of::<T>()).ok_or_else(|| Error::InvalidArgument {
        name: "len",
        reason: format!("{len} elements overflow the address space"),
    })
}

/// The address and length of `range` (clamped) within `len` elements of `T` at `ptr`.
fn subrange<T>(ptr: CUdeviceptr, len: usize, range: impl RangeBounds<usize>) -> (CUdeviceptr, usize) {
    let (start, count) = clamp_range(range, len);
    (ptr + (start * size_of::<T>()) as u64, count)
}

fn check_len(what: &'static str, got: usize, expected: usize) -> Result<()> {
    if got == expected { Ok(()) } else { Err(Error::LengthMismatch { what, got, expected }) }
}

/// Resolve a range against `len`, clamping like slicing would panic — but without the panic:
/// out-of-range ends are clamped to `len`, and a start past the end yields an empty range.
pub fn clamp_range(range: impl RangeBounds<usize>, len: usize) -> (usize, usize) {
    let start = match range.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => s.saturating_add(1),
        Bound::Unbounded => 0,
    }
    .min(len);
    let end = match range.end_bound() {
        Bound::Included(&e) => e.saturating_add(1),
        Bound::Excluded(&e) => e,
        Bound::Unbounded => len,
    }
    .clamp(start, len);
    (start, end - start)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_clamp_instead_of_panicking() {
        assert_eq!(clamp_range(.., 10), (0, 10));
        assert_eq!(clamp_range(3..7, 10), (3, 4));
        assert_eq!(clamp_range(3..=7, 10), (3, 5));
        assert_eq!(clamp_range(8.., 10), (8, 2));
        assert_eq!(clamp_range(12.., 10), (10, 0));
        #[allow(clippy::reversed_empty_ranges)] // a reversed range is exactly the case tested
        let reversed = 5..2;
        assert_eq!(clamp_range(reversed, 10), (5, 0));
        assert_eq!(clamp_range(..100, 10), (0, 10));
    }
}
