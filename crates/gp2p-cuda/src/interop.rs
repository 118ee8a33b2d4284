//! Memory and streams of `cudarc`, used in place and safely (feature `cudarc`).
//!
//! cudarc tracks, per allocation, a read and a write event: taking a pointer makes the stream
//! wait for earlier writes (and, to write, reads), and a guard records the event on that
//! stream when dropped, which cudarc's own later work and its `Drop` (a stream-ordered free)
//! wait for. The views here hold that guard for as long as they live, so everything enqueued
//! through them before they drop is covered: keep a view until the operations using it have
//! been enqueued (they are asynchronous: enqueueing is enough), then drop it.
//!
//! ```no_run
//! # fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use cudarc::driver::CudaContext;
//! use gp2p_cuda::interop::{CudarcStream, CudarcView, CudarcViewMut};
//! use gp2p_cuda::reduce;
//! use gp2p_kernels::ReduceOp;
//!
//! let ctx = CudaContext::new(0)?;
//! let cu = ctx.new_stream()?;
//! let a = cu.clone_htod(&[1.0f32, 2.0, 3.0])?;
//! let mut b = cu.clone_htod(&[10.0f32, 20.0, 30.0])?;
//! let stream = CudarcStream::new(&cu)?;
//! {
//!     let src = CudarcView::new(&a, &cu)?;
//!     let mut dst = CudarcViewMut::new(&mut b, &cu)?;
//!     reduce(&stream, &mut dst, &src, ReduceOp::Sum, 1)?; // b += a, on cudarc's stream
//! } // the guards record cudarc's events here, after the reduce was enqueued
//! assert_eq!(cu.clone_dtoh(&b)?, [11.0, 22.0, 33.0]);
//! # Ok(()) }
//! ```
#![allow(unsafe_code)]

use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};

use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, SyncOnDrop};
use gp2p_kernels::Element;

use crate::{Device, DeviceView, DeviceViewMut, Error, Result, Stream};

/// A [`Stream`] borrowing a cudarc [`CudaStream`] for `'a`: work enqueued through it goes on
/// cudarc's stream, ordered with cudarc's own work there. Never destroys it.
pub struct CudarcStream<'a> {
    stream: Stream,
    _borrow: PhantomData<&'a CudaStream>,
}

impl<'a> CudarcStream<'a> {
    /// Borrow `stream`, of the primary context of its device (cudarc's contexts are).
    pub fn new(stream: &'a CudaStream) -> Result<Self> {
        let device = Device::open(stream.context().ordinal())?;
        // SAFETY: cudarc's contexts are their devices' primary contexts, which `device`
        // holds too; the borrow keeps the stream alive for 'a, and nothing of this crate
        // uses a borrowed stream's handle after the call that enqueued on it returns
        // (completion is tracked with events; a borrowed stream is never destroyed).
        let stream = unsafe { Stream::borrow_raw(&device, stream.cu_stream()) };
        Ok(CudarcStream { stream, _borrow: PhantomData })
    }
}

impl Deref for CudarcStream<'_> {
    type Target = Stream;
    fn deref(&self) -> &Stream {
        &self.stream
    }
}

/// A read-only [`DeviceView`] of cudarc memory, ordered on `stream` after cudarc's earlier
/// writes; when dropped, it records cudarc's read event there, so cudarc's later writes and
/// its free wait for whatever was enqueued through the view.
pub struct CudarcView<'a, T: Element> {
    view: DeviceView<'a, T>,
    _guard: SyncOnDrop<'a>,
}

impl<'a, T: Element> CudarcView<'a, T> {
    /// View all of `memory` (a `cudarc::driver::CudaSlice`, or a `CudaView` of one) for work
    /// on `stream`.
    pub fn new<M: DevicePtr<T>>(memory: &'a M, stream: &'a CudaStream) -> Result<Self> {
        let device = Device::open(stream.context().ordinal())?;
        let len = memory.len();
        let (ptr, guard) = memory.device_ptr(stream);
        check_alignment::<T>(ptr)?;
        // SAFETY: cudarc owns `len` elements of T at `ptr` on this device, borrowed for 'a;
        // no one writes them meanwhile through cudarc (its writes wait for the read event
        // the guard records) or safely through this crate (the borrow is shared); the guard
        // makes cudarc's free of the memory wait for the work enqueued through the view.
        let view = unsafe { DeviceView::from_raw(&device, ptr, len) };
        Ok(CudarcView { view, _guard: guard })
    }
}

impl<'a, T: Element> Deref for CudarcView<'a, T> {
    type Target = DeviceView<'a, T>;
    fn deref(&self) -> &DeviceView<'a, T> {
        &self.view
    }
}

/// A writable [`DeviceViewMut`] of cudarc memory, ordered on `stream` after cudarc's earlier
/// reads and writes; when dropped, it records cudarc's write event there.
pub struct CudarcViewMut<'a, T: Element> {
    view: DeviceViewMut<'a, T>,
    _guard: SyncOnDrop<'a>,
}

impl<'a, T: Element> CudarcViewMut<'a, T> {
    /// View all of `memory` (a `cudarc::driver::CudaSlice`, or a `CudaViewMut` of one) for
    /// work on `stream`.
    pub fn new<M: DevicePtrMut<T>>(memory: &'a mut M, stream: &'a CudaStream) -> Result<Self> {
        let device = Device::open(stream.context().ordinal())?;
        let len = memory.len();
        let (ptr, guard) = memory.device_ptr_mut(stream);
        check_alignment::<T>(ptr)?;
        // SAFETY: as in CudarcView::new, with the borrow exclusive: nobody else reads or
        // writes the memory while the view lives, and cudarc's later work waits for the
        // write event the guard records.
        let view = unsafe { DeviceViewMut::from_raw(&device, ptr, len) };
        Ok(CudarcViewMut { view, _guard: guard })
    }
}

impl<'a, T: Element> Deref for CudarcViewMut<'a, T> {
    type Target = DeviceViewMut<'a, T>;
    fn deref(&self) -> &DeviceViewMut<'a, T> {
        &self.view
    }
}

impl<'a, T: Element> DerefMut for CudarcViewMut<'a, T> {
    fn deref_mut(&mut self) -> &mut DeviceViewMut<'a, T> {
        &mut self.view
    }
}

/// cudarc hands out any `T`; the kernels need `T`'s alignment.
fn check_alignment<T: Element>(ptr: crate::RawDevicePtr) -> Result<()> {
    let align = align_of::<T>() as u64;
    if ptr % align != 0 {
        return Err(Error::InvalidArgument {
            name: "memory",
            reason: format!("cudarc memory at {ptr:#x} is not aligned to {align} bytes for {}", T::DTYPE),
        });
    }
    Ok(())
}
