//! Typed device memory: `DeviceBuffer` owns an allocation, `DeviceView` / `DeviceViewMut`
//! borrow a range of one (or describe foreign memory, for interop).
#![allow(unsafe_code)]

use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};

use cudarc::driver::sys::{self, CUdeviceptr};
use gp2p_kernels::Element;

use crate::driver::{RawDevicePtr, check};
use crate::lifetime::{LastUses, Release, UseSink, release_after};
use crate::raw;
use crate::{Device, Error, Result, Stream, StreamPoint};

/// An owned, typed device allocation. Its contents start undefined.
///
/// Lifetime: every operation of geforce-p2p that enqueues work on the buffer (through its
/// views) records where that work ends ([`LastUses`]). Dropping the buffer never blocks and
/// never frees memory the GPU may still use: it is freed by the reclaimer once that work is
/// done (see [`crate::lifetime`]). Work enqueued through raw pointers is not recorded.
///
/// Ranges: [`DeviceBuffer::view`] and its kin index like slices and panic on a range out of
/// bounds; [`DeviceBuffer::get`] and [`DeviceBuffer::get_mut`] return `None` instead.
pub struct DeviceBuffer<T: Element> {
    device: Device,
    ptr: CUdeviceptr,
    len: usize,
    uses: LastUses,
    _marker: PhantomData<T>,
}

impl<T: Element> DeviceBuffer<T> {
    /// Allocate `len` elements on `device`. A zero length allocates nothing.
    pub fn alloc(device: &Device, len: usize) -> Result<Self> {
        let bytes = bytes_of::<T>(len)?;
        let ptr: CUdeviceptr = if bytes > 0 { device.alloc_memory(bytes)? } else { 0 };
        Ok(DeviceBuffer { device: device.clone(), ptr, len, uses: LastUses::new(), _marker: PhantomData })
    }

    /// Allocate `len` elements on `device`, every byte zero, and block until they are: for
    /// state that kernels on other streams read from their first launch (call counters).
    pub fn zeroed(device: &Device, len: usize) -> Result<Self> {
        let stream = Stream::new(device)?;
        let mut buffer = Self::alloc(device, len)?;
        buffer.fill_bytes(&stream, 0)?;
        // A point, not Stream::synchronize, which would take an error some destructor
        // deferred; noted first, so the buffer is not freed under the fill if the wait fails.
        let point = stream.point()?;
        buffer.view(..).note_use(&point);
        point.synchronize()?;
        Ok(buffer)
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
            unsafe { raw::memcpy_htod_async(stream, self.ptr, data.as_ptr().cast(), self.bytes())? };
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
            unsafe { raw::memcpy_dtoh_async(stream, out.as_mut_ptr().cast(), self.ptr, self.bytes())? };
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

    /// Where GPU work last used the buffer.
    pub fn uses(&self) -> &LastUses {
        &self.uses
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
    ///
    /// # Panics
    /// Like slice indexing, when the range is out of bounds or decreasing.
    pub fn view(&self, range: impl RangeBounds<usize> + std::fmt::Debug) -> DeviceView<'_, T> {
        let (start, len) = index_range(&range, self.len);
        self.view_at(start, len)
    }

    /// Borrow a range of elements for writing.
    ///
    /// # Panics
    /// Like slice indexing, when the range is out of bounds or decreasing.
    pub fn view_mut(&mut self, range: impl RangeBounds<usize> + std::fmt::Debug) -> DeviceViewMut<'_, T> {
        let (start, len) = index_range(&range, self.len);
        self.view_mut_at(start, len)
    }

    /// A range for reading, or `None` if it is out of bounds (like `slice::get`).
    pub fn get(&self, range: impl RangeBounds<usize>) -> Option<DeviceView<'_, T>> {
        let (start, len) = checked_range(&range, self.len)?;
        Some(self.view_at(start, len))
    }

    /// A range for writing, or `None` if it is out of bounds (like `slice::get_mut`).
    pub fn get_mut(&mut self, range: impl RangeBounds<usize>) -> Option<DeviceViewMut<'_, T>> {
        let (start, len) = checked_range(&range, self.len)?;
        Some(self.view_mut_at(start, len))
    }

    fn view_at(&self, start: usize, len: usize) -> DeviceView<'_, T> {
        let ptr = offset::<T>(self.ptr, start);
        DeviceView { device: self.device.clone(), ptr, len, uses: Some(&self.uses), _marker: PhantomData }
    }

    fn view_mut_at(&mut self, start: usize, len: usize) -> DeviceViewMut<'_, T> {
        let ptr = offset::<T>(self.ptr, start);
        DeviceViewMut { device: self.device.clone(), ptr, len, uses: Some(&self.uses), _marker: PhantomData }
    }

    /// Make `stream` wait (on the GPU) for all recorded work on this buffer, so that what is
    /// enqueued there next may overwrite it: for reusing a buffer on another stream.
    pub fn wait_last_uses(&self, stream: &Stream) -> Result<()> {
        self.uses.wait_on(stream)
    }

    /// Whether all recorded work on this buffer is done (non-blocking).
    pub fn is_idle(&self) -> Result<bool> {
        self.uses.is_idle()
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
            let release = Release::DeviceMemory { device: self.device.clone(), ptr: self.ptr };
            release_after(self.uses.take(), release);
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
    /// The owning buffer's use record; `None` for foreign memory.
    uses: Option<&'a dyn UseSink>,
    _marker: PhantomData<&'a T>,
}

/// A writable range of typed device memory.
pub struct DeviceViewMut<'a, T: Element> {
    device: Device,
    ptr: CUdeviceptr,
    len: usize,
    /// The owning buffer's use record; `None` for foreign memory.
    uses: Option<&'a dyn UseSink>,
    _marker: PhantomData<&'a mut T>,
}

macro_rules! view_common {
    ($name:ident) => {
        impl<'a, T: Element> $name<'a, T> {
            /// Describe foreign device memory (from another framework) as a view.
            ///
            /// # Safety
            /// The caller guarantees, for lifetime `'a` and for as long as any GPU work
            /// enqueued through the view runs (geforce-p2p records no last use for foreign
            /// memory, so the memory's owner must keep it until that work is done, e.g. by
            /// ordering its free after the streams used):
            /// - `ptr` addresses `len` elements of `T` in memory `device` can access,
            ///   aligned to `T` (device memory of `device`, or memory mapped into it);
            /// - for a mutable view, nothing else reads or writes that memory meanwhile, and
            ///   for a shared one, nothing writes it;
            /// - `len * size_of::<T>()` does not overflow the address space.
            pub unsafe fn from_raw(device: &Device, ptr: RawDevicePtr, len: usize) -> Self {
                $name { device: device.clone(), ptr, len, uses: None, _marker: PhantomData }
            }

            /// As [`Self::from_raw`], with the operations' last uses noted in `uses`, for
            /// wrappers of foreign memory that order its owner after them.
            ///
            /// # Safety
            /// As [`Self::from_raw`].
            #[cfg(feature = "cudarc")]
            pub(crate) unsafe fn from_raw_tracked(
                device: &Device,
                ptr: RawDevicePtr,
                len: usize,
                uses: &'a dyn UseSink,
            ) -> Self {
                $name { device: device.clone(), ptr, len, uses: Some(uses), _marker: PhantomData }
            }

            /// Record that work up to `point` uses this memory, so the owning buffer is not
            /// freed before it is done. Every operation of geforce-p2p does this itself;
            /// callers that enqueue their own work on the view's raw pointer use it too.
            /// Does nothing for foreign memory.
            pub fn note_use(&self, point: &StreamPoint) {
                if let Some(uses) = self.uses {
                    uses.note(point);
                }
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

impl<'a, T: Element> DeviceView<'a, T> {
    /// A sub-range of this view.
    ///
    /// # Panics
    /// Like slice indexing, when the range is out of bounds or decreasing.
    pub fn slice(&self, range: impl RangeBounds<usize> + std::fmt::Debug) -> DeviceView<'a, T> {
        let (start, len) = index_range(&range, self.len);
        DeviceView {
            device: self.device.clone(),
            ptr: offset::<T>(self.ptr, start),
            len,
            uses: self.uses,
            _marker: PhantomData,
        }
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
            unsafe {
                raw::memcpy_dtoh_async(stream, out.spare_capacity_mut().as_mut_ptr().cast(), self.ptr, self.bytes())?
            };
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
        DeviceView { device: self.device.clone(), ptr: self.ptr, len: self.len, uses: self.uses, _marker: PhantomData }
    }

    /// A writable sub-range of this view.
    ///
    /// # Panics
    /// Like slice indexing, when the range is out of bounds or decreasing.
    pub fn slice_mut(&mut self, range: impl RangeBounds<usize> + std::fmt::Debug) -> DeviceViewMut<'_, T> {
        let (start, len) = index_range(&range, self.len);
        DeviceViewMut {
            device: self.device.clone(),
            ptr: offset::<T>(self.ptr, start),
            len,
            uses: self.uses,
            _marker: PhantomData,
        }
    }

    /// Split into two disjoint writable views, `[0, mid)` and `[mid, len)`, like
    /// `slice::split_at_mut`.
    ///
    /// # Panics
    /// When `mid > len`.
    pub fn split_at_mut(self, mid: usize) -> (DeviceViewMut<'a, T>, DeviceViewMut<'a, T>) {
        assert!(mid <= self.len, "split_at_mut: mid {mid} is past the end of a view of {} elements", self.len);
        let head = DeviceViewMut {
            device: self.device.clone(),
            ptr: self.ptr,
            len: mid,
            uses: self.uses,
            _marker: PhantomData,
        };
        let tail = DeviceViewMut {
            device: self.device,
            ptr: offset::<T>(self.ptr, mid),
            len: self.len - mid,
            uses: self.uses,
            _marker: PhantomData,
        };
        (head, tail)
    }

    /// Copy `src` into this view on `stream`, asynchronously: a device-to-device copy when
    /// both are on one device, else one peer DMA (enable peer access first for a direct
    /// path; without it the driver stages the copy itself). `stream` may belong to either
    /// device. Returns the point after the copy, noted on both views (`None` for an empty
    /// copy, which enqueues nothing), for another stream to wait on.
    pub fn copy_from(&mut self, stream: &Stream, src: &DeviceView<'_, T>) -> Result<Option<StreamPoint>> {
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
        if same_device && byte_ranges_overlap(&d, &s) {
            return Err(Error::InvalidArgument {
                name: "src",
                reason: format!("overlaps dst ({s:#x?} and {d:#x?}): copy through a temporary"),
            });
        }
        if self.len == 0 {
            return Ok(None);
        }
        if same_device {
            // SAFETY: both views cover len elements on the stream's device and do not overlap.
            unsafe { raw::memcpy_dtod_async(stream, self.ptr, src.ptr, self.bytes())? };
        } else {
            // SAFETY: both views cover len elements on their devices; different devices'
            // memories never overlap.
            unsafe { raw::memcpy_peer_async(stream, &self.device, self.ptr, src.device(), src.ptr, self.bytes())? };
        }
        let point = stream.point()?;
        self.note_use(&point);
        src.note_use(&point);
        Ok(Some(point))
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
        check(unsafe { sys::cuMemsetD8Async(self.ptr, byte, self.bytes(), stream.raw()) }, "cuMemsetD8Async")?;
        self.note_use(&stream.point()?);
        Ok(())
    }
}

fn bytes_of<T>(len: usize) -> Result<usize> {
    len.checked_mul(size_of::<T>()).ok_or_else(|| Error::InvalidArgument {
        name: "len",
        reason: format!("{len} elements overflow the address space"),
    })
}

/// The address of element `start` of `T`s at `ptr`.
fn offset<T>(ptr: CUdeviceptr, start: usize) -> CUdeviceptr {
    ptr + (start * size_of::<T>()) as u64
}

fn check_len(what: &'static str, got: usize, expected: usize) -> Result<()> {
    if got == expected { Ok(()) } else { Err(Error::LengthMismatch { what, got, expected }) }
}

/// Whether two byte ranges (of one device's memory) share a byte; an empty one shares none.
/// The one overlap test of every operation that refuses a source overlapping its destination.
pub fn byte_ranges_overlap(a: &std::ops::Range<u64>, b: &std::ops::Range<u64>) -> bool {
    !a.is_empty() && !b.is_empty() && a.start < b.end && b.start < a.end
}

/// Resolve `range` against `len` elements as slice indexing does: `Some((start, count))`
/// when it lies within `0..len` and does not decrease, else `None`.
pub fn checked_range(range: &impl RangeBounds<usize>, len: usize) -> Option<(usize, usize)> {
    let start = match range.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => s.checked_add(1)?,
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e.checked_add(1)?,
        Bound::Excluded(&e) => e,
        Bound::Unbounded => len,
    };
    (start <= end && end <= len).then(|| (start, end - start))
}

/// Resolve `range` against `len` elements as slice indexing does, panicking like it (with
/// [`out_of_bounds`]) when the range is out of bounds or decreasing: the one range check of
/// every `view`/`slice` of device and pinned memory.
#[track_caller]
pub fn index_range(range: &(impl RangeBounds<usize> + std::fmt::Debug), len: usize) -> (usize, usize) {
    checked_range(range, len).unwrap_or_else(|| out_of_bounds(range, len))
}

/// The panic of an out-of-bounds range, worded like the standard library's.
#[track_caller]
pub fn out_of_bounds(range: &impl std::fmt::Debug, len: usize) -> ! {
    panic!("range {range:?} out of bounds for a buffer or view of {len} elements")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_ranges_overlap_when_they_share_a_byte() {
        assert!(byte_ranges_overlap(&(0x100..0x110), &(0x10f..0x200)));
        assert!(byte_ranges_overlap(&(0x100..0x200), &(0x140..0x150)), "one inside the other");
        assert!(!byte_ranges_overlap(&(0x100..0x110), &(0x110..0x120)), "adjacent");
        assert!(!byte_ranges_overlap(&(0x100..0x100), &(0x0..0x200)), "empty");
    }

    #[test]
    fn ranges_resolve_like_slice_indexing() {
        assert_eq!(checked_range(&.., 10), Some((0, 10)));
        assert_eq!(checked_range(&(3..7), 10), Some((3, 4)));
        assert_eq!(checked_range(&(3..=7), 10), Some((3, 5)));
        assert_eq!(checked_range(&(8..), 10), Some((8, 2)));
        assert_eq!(checked_range(&(10..), 10), Some((10, 0)), "an empty range at the end is valid");
        assert_eq!(checked_range(&(12..), 10), None, "start past the end");
        assert_eq!(checked_range(&(90..200), 100), None, "end past the end: refused, not clamped to 10");
        assert_eq!(checked_range(&(..=10), 10), None);
        assert_eq!(checked_range(&(..=usize::MAX), 10), None, "no overflow");
        #[allow(clippy::reversed_empty_ranges)] // a reversed range is exactly the case tested
        let reversed = 5..2;
        assert_eq!(checked_range(&reversed, 10), None);
        let sliced = [0u8; 10];
        for (range, ours) in [(3..7, checked_range(&(3..7), 10)), (0..10, checked_range(&(0..10), 10))] {
            assert_eq!(ours.map(|(s, n)| s..s + n), sliced.get(range.clone()).map(|_| range));
        }
    }

    #[test]
    #[should_panic(expected = "range 90..200 out of bounds for a buffer or view of 100 elements")]
    fn out_of_bounds_names_the_range_and_the_length() {
        out_of_bounds(&(90..200), 100);
    }

    #[test]
    fn index_range_resolves_what_checked_range_accepts() {
        assert_eq!(index_range(&(3..7), 10), (3, 4));
        assert_eq!(index_range(&(10..), 10), (10, 0));
        assert_eq!(index_range(&.., 0), (0, 0));
    }

    #[test]
    #[should_panic(expected = "range 4..=10 out of bounds for a buffer or view of 10 elements")]
    fn index_range_panics_on_what_checked_range_refuses() {
        index_range(&(4..=10), 10);
    }
}
