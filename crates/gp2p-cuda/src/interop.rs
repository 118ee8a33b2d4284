//! Memory and streams of `cudarc`, used in place and safely (feature `cudarc`).
//!
//! cudarc tracks, per allocation, a read and a write event: taking a pointer makes a stream
//! wait for earlier writes (and, to write, reads), and a guard records the event on that
//! stream, which cudarc's own later work and its `Drop` (a stream-ordered free) wait for.
//! [`CudarcView`] and [`CudarcViewMut`] hold that guard, and every operation done through
//! their views (on whatever streams, internal ones included), as it notes its last use, makes
//! cudarc's stream wait (on the GPU) for it and records cudarc's event after that wait. So
//! cudarc never frees or overwrites the memory under our work, even if a wrapper is leaked
//! (`mem::forget` is safe): nothing waits for the wrapper's drop.
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
//!     reduce(&stream, &mut dst.view_mut(), &src.view(), ReduceOp::Sum, 1)?; // b += a
//! } // cudarc's stream already waits for the reduce, and cudarc's event is recorded after it
//! assert_eq!(cu.clone_dtoh(&b)?, [11.0, 22.0, 33.0]);
//! # Ok(()) }
//! ```
#![allow(unsafe_code)]

use std::marker::PhantomData;
use std::ops::Deref;

use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, SyncOnDrop};
use gp2p_kernels::Element;

use crate::Error;
use crate::driver::defer_error;
use crate::lifetime::UseSink;
use crate::{Device, DeviceView, DeviceViewMut, RawDevicePtr, Result, Stream, StreamPoint};

/// A [`Stream`] borrowing a cudarc [`CudaStream`] for `'a`: work enqueued through it goes on
/// cudarc's stream, ordered with cudarc's own work there. Never destroys it.
pub struct CudarcStream<'a> {
    stream: Stream,
    _borrow: PhantomData<&'a CudaStream>,
}

impl<'a> CudarcStream<'a> {
    /// Borrow `stream`, of the primary context of its device (`CudaContext::new` makes those;
    /// a non-primary context's stream is refused).
    pub fn new(stream: &'a CudaStream) -> Result<Self> {
        Ok(CudarcStream { stream: borrow(stream)?, _borrow: PhantomData })
    }
}

impl Deref for CudarcStream<'_> {
    type Target = Stream;
    fn deref(&self) -> &Stream {
        &self.stream
    }
}

/// A [`Stream`] over cudarc's stream, for a wrapper that lives no longer than its borrow.
/// A stream (and so memory) of a context other than the device's primary one is refused:
/// this crate's kernels run in the primary context, where another context's memory is not
/// mapped.
fn borrow(stream: &CudaStream) -> Result<Stream> {
    let ordinal = stream.context().ordinal();
    if !stream.context().is_primary() {
        return Err(Error::InvalidArgument {
            name: "stream",
            reason: format!(
                "cudarc's context of device {ordinal} is not its primary context (CudaContext::new_non_primary); \
                 geforce-p2p works in primary contexts: make the context with CudaContext::new"
            ),
        });
    }
    let device = Device::open(ordinal)?;
    // SAFETY: the context is its device's primary context (checked above), which `device`
    // holds too; every caller keeps the CudaStream borrowed for as long as the returned Stream
    // lives, and nothing of this crate uses a borrowed stream's handle after that (completion
    // is tracked with events; a borrowed stream is never destroyed).
    Ok(unsafe { Stream::borrow_raw(&device, stream.cu_stream()) })
}

/// What both wrappers hold: the memory's address, the cudarc stream the guard records on
/// (borrowed as a [`Stream`]), and the guard.
struct Foreign<'a> {
    ptr: RawDevicePtr,
    len: usize,
    stream: Stream,
    guard: SyncOnDrop<'a>,
}

impl<'a> Foreign<'a> {
    fn new<T: Element>(
        stream: &'a CudaStream,
        len: usize,
        (ptr, guard): (RawDevicePtr, SyncOnDrop<'a>),
    ) -> Result<Self> {
        crate::raw::check_aligned(&[("memory", ptr)], align_of::<T>())?;
        Ok(Foreign { ptr, len, stream: borrow(stream)?, guard })
    }

    fn device(&self) -> &Device {
        self.stream.device()
    }
}

impl UseSink for Foreign<'_> {
    /// cudarc's stream waits for the use (a GPU-side wait, the host does not block), then
    /// cudarc's event is recorded after it, as the guard would at its drop: cudarc's later
    /// work and its free wait for the use from now on.
    fn note(&self, point: &StreamPoint) {
        defer_error(self.stream.wait_point(point));
        if let SyncOnDrop::Record(Some((event, stream))) = &self.guard {
            if stream.context().is_managing_stream_synchronization() {
                stream.context().record_err(event.record(stream));
            }
        }
    }
}

/// Read-only access to cudarc memory through [`CudarcView::view`], ordered on the given
/// cudarc stream after cudarc's earlier writes; cudarc's later writes and its free wait for
/// whatever is enqueued through the views (each operation orders them as it is enqueued).
pub struct CudarcView<'a, T: Element> {
    foreign: Foreign<'a>,
    _memory: PhantomData<&'a T>,
}

impl<'a, T: Element> CudarcView<'a, T> {
    /// Wrap all of `memory` (a `cudarc::driver::CudaSlice`, or a `CudaView` of one), with
    /// `stream` the cudarc stream that orders it against cudarc's work.
    pub fn new<M: DevicePtr<T>>(memory: &'a M, stream: &'a CudaStream) -> Result<Self> {
        let foreign = Foreign::new::<T>(stream, memory.len(), memory.device_ptr(stream))?;
        Ok(CudarcView { foreign, _memory: PhantomData })
    }

    /// The memory as a view. Only the cudarc stream given to [`CudarcView::new`] is ordered
    /// after cudarc's earlier writes (and its allocation): an operation on another stream must
    /// first wait for that one (`other.wait_point(&cudarc_stream.point()?)`). Its uses, on any
    /// stream, are waited for before cudarc's later work.
    pub fn view(&self) -> DeviceView<'_, T> {
        let f = &self.foreign;
        // SAFETY: cudarc owns `len` aligned elements of T at `ptr` on this device (checked in
        // new), borrowed shared for 'a; cudarc's writes wait for the read event recorded
        // after every use as it is noted (`Foreign::note`), and the view cannot outlive `self`.
        unsafe { DeviceView::from_raw_tracked(f.device(), f.ptr, f.len, f) }
    }
}

/// Writable access to cudarc memory through [`CudarcViewMut::view_mut`], ordered on the
/// given cudarc stream after cudarc's earlier reads and writes; cudarc's later work and its
/// free wait for whatever is enqueued through the views (each operation orders them as it is
/// enqueued).
pub struct CudarcViewMut<'a, T: Element> {
    foreign: Foreign<'a>,
    _memory: PhantomData<&'a mut T>,
}

impl<'a, T: Element> CudarcViewMut<'a, T> {
    /// Wrap all of `memory` (a `cudarc::driver::CudaSlice`, or a `CudaViewMut` of one), with
    /// `stream` the cudarc stream that orders it against cudarc's work.
    pub fn new<M: DevicePtrMut<T>>(memory: &'a mut M, stream: &'a CudaStream) -> Result<Self> {
        let len = memory.len();
        let foreign = Foreign::new::<T>(stream, len, memory.device_ptr_mut(stream))?;
        Ok(CudarcViewMut { foreign, _memory: PhantomData })
    }

    /// The memory as a writable view; ordering as in [`CudarcView::view`] (and after
    /// cudarc's earlier reads too).
    pub fn view_mut(&mut self) -> DeviceViewMut<'_, T> {
        let f = &self.foreign;
        // SAFETY: as in CudarcView::view, with the borrow exclusive: nobody else reads or
        // writes the memory while the wrapper lives, and `&mut self` makes the view unique.
        unsafe { DeviceViewMut::from_raw_tracked(f.device(), f.ptr, f.len, f) }
    }

    /// The memory as a read-only view.
    pub fn view(&self) -> DeviceView<'_, T> {
        let f = &self.foreign;
        // SAFETY: as in view_mut; a shared borrow of self excludes view_mut meanwhile.
        unsafe { DeviceView::from_raw_tracked(f.device(), f.ptr, f.len, f) }
    }
}
