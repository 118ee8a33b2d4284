//! The one file of the door that turns the raw addresses and streams of NCCL's calls into the
//! library's views and borrowed streams.
//!
//! # The contract with NCCL's callers
//!
//! NCCL's own contract, which every program that calls it already keeps:
//! 1. A buffer argument addresses `count` elements of the call's type (times the world size
//!    where the call says so) in device memory of the communicator's device (or memory mapped
//!    into it), aligned to the element, and stays allocated until the work the call enqueues
//!    on its stream is done.
//! 2. The stream is a stream of the communicator's device in its primary context (or null,
//!    the legacy default stream), alive until that work is done; no capture begins or ends
//!    on it during the call.
//! 3. Nothing reads what a call writes, or writes what it reads or writes, until its work is
//!    done, except work ordered after it on the same stream.
//! 4. Calls captured into a CUDA graph keep their buffers for as long as the graph may be
//!    launched, and every rank launches its graphs, and makes its other calls, in the same
//!    order.
//!
//! The door checks what it can before anything is enqueued (null buffers, ranks, counts,
//! overlaps: `crate::plan`); the rest, as with NCCL, is the caller's.
#![allow(unsafe_code)]

use geforce_p2p::comm::Communicator;
use geforce_p2p::cuda::RawStream;
use geforce_p2p::{Device, DeviceView, DeviceViewMut, Element, Stream};

use crate::abi::RawStream as CStream;
use crate::error::Result;

/// A communicator's device and the caller's stream on it, borrowed for one call.
pub struct Caller {
    /// The communicator's device.
    pub device: Device,
    /// The caller's stream.
    pub stream: Stream,
}

impl Caller {
    /// The caller's stream `raw` on `device`, for the duration of one call.
    pub fn open(device: &Device, raw: CStream) -> Result<Caller> {
        let raw: RawStream = raw.cast();
        // SAFETY: by the module's contract (2), `raw` is null or a stream of this device's
        // primary context that outlives the work enqueued on it, and no capture begins or ends
        // on it during the call, which drops the caller before it returns.
        let stream =
            unsafe { Stream::borrow_raw_for_call(device, raw) }.map_err(|e| crate::error::Error::Library(e.into()))?;
        Ok(Caller { device: device.clone(), stream })
    }

    /// `len` elements at `address`, for reading.
    pub fn view<T: Element>(&self, address: u64, len: usize) -> DeviceView<'_, T> {
        // SAFETY: by the module's contract (1, 3): `address` holds `len` aligned elements of
        // `T` on this device, kept until the work ordered on the stream is done and not
        // written meanwhile. Scratch the door allocated keeps its own buffer until the points
        // the served module notes on it. The view borrows the caller, so it ends with the call.
        unsafe { DeviceView::from_raw(&self.device, address, len) }
    }

    /// `len` elements at `address`, for writing.
    pub fn view_mut<T: Element>(&self, address: u64, len: usize) -> DeviceViewMut<'_, T> {
        // SAFETY: as in `view`; nothing else touches the memory while the call's work runs
        // except in the stream's order (contract 3), and the plans never hand one step two
        // views of one range (checked overlaps, `crate::plan`).
        unsafe { DeviceViewMut::from_raw(&self.device, address, len) }
    }
}

impl Caller {
    /// Set `count` elements of `element_bytes` at `address`, scratch of the communicator's own,
    /// to the value whose bits are `bits`, on the caller's stream.
    ///
    /// # Errors
    /// The driver's.
    pub fn fill(&self, address: u64, element_bytes: usize, bits: u64, count: usize) -> Result<()> {
        // SAFETY: `address` is scratch the served communicator allocated on this device with at
        // least `count * element_bytes` bytes (the step asked for that many), aligned as every
        // allocation is; it is kept until the point noted after this call's work, and nothing
        // else touches it meanwhile (calls using it are ordered on their streams).
        let set =
            unsafe { geforce_p2p::cuda::raw::memset_elements_async(&self.stream, address, element_bytes, bits, count) };
        set.map_err(|e| crate::error::Error::Library(e.into()))
    }
}

/// Let a served communicator's calls be captured into CUDA graphs, as NCCL's are.
pub fn allow_graphs(comm: &mut Communicator) {
    // SAFETY: contract (4): captured calls' buffers live as long as their graphs, and every
    // rank launches its graphs and makes its calls in the same order.
    unsafe { comm.allow_graph_capture() }
}
