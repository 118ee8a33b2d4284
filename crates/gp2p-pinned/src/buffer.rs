//! `PinnedBuffer`: page-locked, portable, device-mapped host memory, and `is_pinned`.
#![allow(unsafe_code)]

use std::marker::PhantomData;
use std::ops::RangeBounds;

use gp2p_cuda::raw;
use gp2p_cuda::{Device, HostAllocation, RawDevicePtr, Stream, StreamPoint, index_range};
use gp2p_kernels::Element;

use crate::{Error, Result};

/// Page-locked host memory that every device can DMA to and from and address directly.
///
/// Allocated with `CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP`: pinned for every
/// context and mapped into every device's address space. Not write-combined, so the CPU
/// reads it at full speed. Starts zeroed.
///
/// Lifetime and stream ordering: the operations of geforce-p2p note where their GPU work on
/// the buffer ends. Dropping never blocks; the memory is freed by the reclaimer once that
/// work is done (see `gp2p_cuda::lifetime`). [`PinnedBuffer::as_slice`] and
/// [`PinnedBuffer::as_mut_slice`] are the one place that waits: they block the host until
/// that work is done, so the host never reads or writes under a running DMA. Views index
/// like slices (and panic out of bounds). `Send + Sync`.
pub struct PinnedBuffer<T: Element> {
    alloc: HostAllocation,
    len: usize,
    _marker: PhantomData<T>,
}

impl<T: Element> PinnedBuffer<T> {
    /// Allocate `len` zeroed elements. `device` supplies the context for the call; the memory
    /// is usable from every device.
    pub fn alloc(device: &Device, len: usize) -> Result<Self> {
        let bytes = len.checked_mul(size_of::<T>()).ok_or_else(|| Error::InvalidArgument {
            name: "len",
            reason: format!("{len} elements of {} overflow the address space", T::DTYPE),
        })?;
        Ok(PinnedBuffer { alloc: HostAllocation::new(device, bytes)?, len, _marker: PhantomData })
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.len * size_of::<T>()
    }

    /// Block until the GPU work noted on the buffer is done.
    pub fn wait_for_gpu(&self) -> Result<()> {
        Ok(self.alloc.uses().synchronize()?)
    }

    /// Make `stream` wait (on the GPU, the host going on) for all GPU work noted on the
    /// buffer, so that what is enqueued there next may overwrite it: for reusing a buffer that
    /// other streams, of any device, read or wrote.
    pub fn wait_last_uses(&self, stream: &Stream) -> Result<()> {
        Ok(self.alloc.uses().wait_on(stream)?)
    }

    /// The contents, after waiting for GPU work on the buffer (see the type's docs).
    pub fn as_slice(&self) -> Result<&[T]> {
        self.wait_for_gpu()?;
        // SAFETY: len initialised elements (zeroed at allocation, T valid for any bits,
        // suitably aligned: page-aligned or dangling-aligned); no GPU work of ours is in
        // flight on them, and writers need &mut self.
        Ok(unsafe { std::slice::from_raw_parts(self.host_ptr(), self.len) })
    }

    /// The contents, writable, after waiting for GPU work on the buffer.
    pub fn as_mut_slice(&mut self) -> Result<&mut [T]> {
        self.wait_for_gpu()?;
        // SAFETY: as in as_slice, and &mut self makes the access exclusive.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.alloc.host_ptr().cast::<T>(), self.len) })
    }

    /// Borrow a range for reading by the GPU.
    ///
    /// # Panics
    /// Like slice indexing, when the range is out of bounds or decreasing.
    pub fn view(&self, range: impl RangeBounds<usize> + std::fmt::Debug) -> PinnedView<'_, T> {
        let (start, len) = index_range(&range, self.len);
        PinnedView { alloc: &self.alloc, offset: start * size_of::<T>(), len, _marker: PhantomData }
    }

    /// Borrow a range for writing by the GPU.
    ///
    /// # Panics
    /// Like slice indexing, when the range is out of bounds or decreasing.
    pub fn view_mut(&mut self, range: impl RangeBounds<usize> + std::fmt::Debug) -> PinnedViewMut<'_, T> {
        let (start, len) = index_range(&range, self.len);
        PinnedViewMut { alloc: &self.alloc, offset: start * size_of::<T>(), len, _marker: PhantomData }
    }

    /// The host address of the first element.
    pub fn host_ptr(&self) -> *const T {
        self.alloc.host_ptr().cast::<T>()
    }

    /// The address `device` uses for the first element (the mapping of this memory into its
    /// address space; equal to the host address wherever unified addressing is on).
    pub fn device_ptr(&self, device: &Device) -> Result<RawDevicePtr> {
        Ok(self.alloc.device_ptr(device)?)
    }
}

impl<T: Element> std::fmt::Debug for PinnedBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PinnedBuffer<{}>({} elements at {:p})", T::DTYPE, self.len, self.alloc.host_ptr())
    }
}

/// A range of pinned memory that GPU work reads.
#[derive(Clone, Copy)]
pub struct PinnedView<'a, T: Element> {
    alloc: &'a HostAllocation,
    offset: usize,
    len: usize,
    _marker: PhantomData<&'a T>,
}

/// A range of pinned memory that GPU work writes.
pub struct PinnedViewMut<'a, T: Element> {
    alloc: &'a HostAllocation,
    offset: usize,
    len: usize,
    _marker: PhantomData<&'a mut T>,
}

macro_rules! pinned_view_common {
    ($name:ident) => {
        impl<T: Element> $name<'_, T> {
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

            /// The host address of the first element.
            pub fn host_ptr(&self) -> *const T {
                self.alloc.host_ptr().wrapping_add(self.offset).cast::<T>()
            }

            /// The address `device` uses for the first element.
            pub fn device_ptr(&self, device: &Device) -> Result<RawDevicePtr> {
                Ok(self.alloc.device_ptr(device)? + self.offset as u64)
            }

            /// Record that work up to `point` uses this memory, so the buffer is not freed
            /// (nor handed to the host) before it is done. Every operation of geforce-p2p
            /// does this itself; callers that enqueue their own work on the view (through
            /// its addresses) must too: a dropped buffer's memory is handed to the next
            /// allocation as soon as the noted work is done.
            pub fn note_use(&self, point: &StreamPoint) {
                self.alloc.uses().note(point);
            }
        }

        impl<T: Element> std::fmt::Debug for $name<'_, T> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "{}<{}>({} elements at byte {})", stringify!($name), T::DTYPE, self.len, self.offset)
            }
        }
    };
}
pinned_view_common!(PinnedView);
pinned_view_common!(PinnedViewMut);

impl<T: Element> PinnedViewMut<'_, T> {
    /// The writable host address of the first element.
    pub fn host_mut_ptr(&mut self) -> *mut T {
        self.alloc.host_ptr().wrapping_add(self.offset).cast::<T>()
    }
}

/// Whether `[ptr, ptr + len)` is page-locked host memory known to CUDA (allocated by
/// `cuMemHostAlloc`/`cudaHostAlloc` or registered with `cuMemHostRegister`), inside one
/// allocation. An empty range is trivially pinned.
///
/// A "yes" says nothing about ownership: the memory of a dropped [`PinnedBuffer`] stays
/// pinned (kept for the next allocation), so a stale pointer into it still passes.
///
/// A "no" is an answer, not a failure: the lookups used return success for unknown
/// addresses, so no CUDA error is raised or left behind (compute-sanitizer stays quiet too),
/// and later launches work as before. Needs a driver and device 0 usable (for a context);
/// [`is_pinned_on`] asks through a device of the caller's.
pub fn is_pinned(ptr: *const u8, len: usize) -> Result<bool> {
    is_pinned_on(&Device::open(0)?, ptr, len)
}

/// [`is_pinned`], asked in `device`'s context: what the copies that take raw host pointers
/// use, with their stream's device, so they open no other device and need no device 0.
pub fn is_pinned_on(device: &Device, ptr: *const u8, len: usize) -> Result<bool> {
    if len == 0 {
        return Ok(true);
    }
    if ptr.is_null() {
        return Ok(false);
    }
    let first = ptr as u64;
    let Some(last) = first.checked_add(len as u64 - 1) else {
        return Ok(false);
    };
    let (head, tail) = (raw::lookup_host(device, first)?, raw::lookup_host(device, last)?);
    if !head.pinned || !tail.pinned {
        return Ok(false);
    }
    // Both ends are pinned; make sure they are one allocation, not two with a gap between.
    Ok(match head.allocation {
        Some(allocation) => allocation.contains(&first) && allocation.contains(&last),
        None => true, // no range reported for host memory: the two ends are what we know
    })
}
