//! The native calls that take tensors' raw addresses and streams: the one module of this
//! crate that builds views and borrowed streams from raw values (through the facade's `unsafe`
//! entry points) and hands them to the safe library. The copies and the reduce are here, the
//! in-process collectives in [`collective_calls`], on this module's callers and views.
//!
//! # The contract with the Python layer
//!
//! These functions are private to the package (`geforce_p2p._native`); only the Python layer
//! (`python/geforce_p2p/_tensors.py` and its callers), the native fast paths that read torch
//! tensors in its stead ([`crate::fast`]) and the benchmark aids ([`crate::bench`], on
//! tensors and buffers the benchmark scripts hold) call them, and they guarantee, for each
//! call:
//! 1. Every device address with its length and dtype describes the contiguous memory of a
//!    tensor that Python code holds for the whole call (read from torch's own attributes, or
//!    from `__cuda_array_interface__` / DLPack), on the CUDA device whose ordinal is given,
//!    aligned to the element; every host address, the memory of a CPU tensor of that length.
//!    Lengths, dtypes, devices and contiguity were checked there before the call; the
//!    cheap part is checked again here ([`crate::args`]), and the library checks devices,
//!    lengths, overlap on one device and pinning itself.
//! 2. Every stream handle is a stream of that device's primary context (torch's current
//!    stream of the tensor's device, or the stream the array's producer named; 0 is the legacy
//!    default stream) that outlives the work enqueued on it: torch never destroys the
//!    streams of its pools, and a producer's stream is the producer's to keep.
//! 3. The memory stays allocated while the enqueued work runs. geforce-p2p records no last
//!    use for foreign memory; what protects it is stream order: every op here is ordered
//!    after the work already queued on the caller streams and before anything queued there
//!    later (the library's internal streams join back into them before it returns). Torch's
//!    caching allocator reuses a freed tensor's memory in the order of the stream the tensor
//!    was allocated on, which is the current stream the op runs on unless the caller switched
//!    streams since the allocation; then, as for torch's own ops, the caller must
//!    `record_stream` the tensor (the Python API says so). Memory not owned by torch must be
//!    kept by its owner until the streams' work is done.
//! 4. Nothing else writes memory an op reads, or touches memory it writes, while the op
//!    runs, except through work ordered on the same streams. Inputs and outputs of one call
//!    do not overlap: the library refuses an overlapping source and destination on one
//!    device, and [`check_disjoint`] refuses the rest before any work.
//! 5. A call of the one-process-per-GPU communicator made while torch captures a CUDA graph
//!    on its stream is replayed by every launch of that graph. The tensors such a call uses
//!    come from torch's graph memory pool, which keeps them for as long as the graph lives,
//!    and are touched during a launch only through work ordered on the launch's stream; every
//!    rank captures and launches the same graphs in the same order (what torchrun, vLLM and
//!    sglang do, each rank running the same program). Only `crate::comm` relies on this.
//! 6. No capture begins or ends on a stream while a call that borrowed it runs: torch begins
//!    and ends a capture on the capturing thread, between calls. So a call asks the driver
//!    once, before it enqueues anything, whether each stream captures
//!    ([`Stream::borrow_raw_for_call`]), and drops its borrows before it returns. (A capture
//!    that another Python thread begins on the same stream during the call, which this
//!    excludes, is still caught where the call records its points: those ask the driver.)
#![allow(unsafe_code)]

use geforce_p2p::collectives::Rank;
use geforce_p2p::cuda::RawStream;
use geforce_p2p::{CopyOptions, DType, Device, DeviceView, DeviceViewMut, Element, ReduceOp, Route, Stream, ops};
use pyo3::prelude::*;

use crate::args::{self, Memory, MemoryArg};
use crate::error::Raised;

pub(crate) mod collective_calls;

/// A caller per rank, in rank order: what every collective opens first.
fn open_all(memories: &[Memory]) -> Result<Vec<Caller>, Raised> {
    memories.iter().map(Caller::open).collect()
}

/// The inputs of a gather or scatter as views of `len` elements, input r on caller r's device.
fn sources_of<'c, T: Element>(callers: &'c [Caller], inputs: &[u64], len: usize) -> Vec<DeviceView<'c, T>> {
    callers.iter().zip(inputs).map(|(c, &p)| c.view::<T>(p, len)).collect()
}

/// The callers' memories as ranks of `len` elements, each on its caller's stream.
fn ranks_of<'c, T: Element>(callers: &'c [Caller], memories: &[Memory], len: usize) -> Vec<Rank<'c, T>> {
    callers.iter().zip(memories).map(|(c, m)| Rank { buffer: c.view_mut::<T>(m.ptr, len), stream: &c.stream }).collect()
}

/// Run `f::<T>(args...)` with `T` the element type of a [`DType`].
macro_rules! by_dtype {
    ($dtype:expr, $f:ident($($arg:expr),* $(,)?)) => {
        ::geforce_p2p::with_element!($dtype, |T| $f::<T>($($arg),*))
    };
}
pub(crate) use by_dtype;

/// The `CUstream` a handle from Python stands for (an opaque value, never dereferenced here).
fn stream_handle(raw: u64) -> RawStream {
    std::ptr::without_provenance_mut(raw as usize)
}

/// A host address from Python as a pointer for the driver (it came from a live allocation
/// of the CPU tensor, so its provenance is that of exposed memory).
fn host_ptr<T>(addr: u64) -> *mut T {
    std::ptr::with_exposed_provenance_mut(addr as usize)
}

/// A device and the caller's stream on it, borrowed for one call.
pub(crate) struct Caller {
    pub(crate) device: Device,
    pub(crate) stream: Stream,
}

impl Caller {
    /// The caller's device and stream, for an operation that cannot be captured into a CUDA
    /// graph: a stream that is capturing (torch.cuda.graph) is refused here, before anything
    /// is enqueued, so torch's capture stays valid.
    pub(crate) fn open(memory: &Memory) -> Result<Caller, Raised> {
        let caller = Caller::open_capturable(memory)?;
        caller.stream.refuse_capture()?;
        Ok(caller)
    }

    /// The caller's device and stream, capturing or not: for the communicator, whose calls
    /// can be captured.
    pub(crate) fn open_capturable(memory: &Memory) -> Result<Caller, Raised> {
        let device = Device::open(memory.device)?;
        // SAFETY: by the module's contract (2), `memory.stream` is a stream of this device's
        // primary context that outlives the work enqueued through it, and (6) no capture
        // begins or ends on it during the call, which drops the caller before it returns;
        // it is borrowed, never destroyed.
        let stream = unsafe { Stream::borrow_raw_for_call(&device, stream_handle(memory.stream))? };
        Ok(Caller { device, stream })
    }

    /// The tensor's memory, for reading.
    pub(crate) fn view<T: Element>(&self, ptr: u64, len: usize) -> DeviceView<'_, T> {
        // SAFETY: by the module's contract (1, 3, 4): `ptr` addresses `len` aligned elements
        // of `T` on this device, kept allocated until the work ordered on the caller streams
        // is done and not written meanwhile except in that order. The view borrows the
        // caller, so it is dropped before the call returns.
        unsafe { DeviceView::from_raw(&self.device, ptr, len) }
    }

    /// The tensor's memory, for writing.
    pub(crate) fn view_mut<T: Element>(&self, ptr: u64, len: usize) -> DeviceViewMut<'_, T> {
        // SAFETY: as in `view`, and nothing else reads or writes the memory while the op
        // runs except in the caller streams' order (contract 4).
        unsafe { DeviceViewMut::from_raw(&self.device, ptr, len) }
    }
}

/// Let `comm`'s calls be captured into torch's CUDA graphs.
pub(crate) fn allow_torch_graphs(comm: &mut geforce_p2p::comm::Communicator) {
    // SAFETY: contract (5): the tensors of captured calls live as long as their graph (torch's
    // graph pool), and every rank launches the same graphs in the same order.
    unsafe { comm.allow_graph_capture() }
}

/// A caller's stream held closed, for benchmarks (`benches/python/overhead_parts.py`): work
/// enqueued on it waits until [`Gate::open`], or until the deadline, as `gp2p bench` holds
/// its stream while it times an enqueue. Not part of the package's API. A stream capturing a
/// CUDA graph is refused.
#[pyclass(module = "geforce_p2p._native")]
pub(crate) struct Gate {
    gate: Option<geforce_p2p::cuda::HostGate>,
    /// Whether the deadline, not `open`, opened it (known once open).
    expired: bool,
}

#[pymethods]
impl Gate {
    /// Close `stream` (a handle, as the Python layer passes them) of device `device`, for at
    /// most `deadline` seconds.
    #[new]
    fn new(py: Python<'_>, device: usize, stream: u64, deadline: f64) -> PyResult<Gate> {
        let run = || -> Result<Gate, Raised> {
            let deadline = args::seconds("deadline", deadline)?;
            let device = Device::open(device)?;
            // SAFETY: by the module's contract (2), `stream` is a stream of this device's
            // primary context that outlives the work enqueued on it (the gate's host function
            // among it): torch's current stream, or a stream of `RustCalls`, which the bench
            // script keeps; it is borrowed, never destroyed. The gate's close refuses a
            // capturing stream; the stream is dropped before `new` returns (contract 6).
            let stream = unsafe { Stream::borrow_raw_for_call(&device, stream_handle(stream))? };
            let gate = geforce_p2p::cuda::HostGate::close_until(&stream, deadline)?;
            Ok(Gate { gate: Some(gate), expired: false })
        };
        run().map_err(|e| e.into_pyerr(py))
    }

    /// Let the stream run (again a no-op once open).
    fn open(&mut self) {
        if let Some(gate) = self.gate.take() {
            self.expired = gate.expired();
        }
    }

    /// Whether the deadline opened the gate before `open` did: the host waited for the held
    /// stream meanwhile, and a time taken under the gate includes that wait.
    fn expired(&self) -> bool {
        self.expired || self.gate.as_ref().is_some_and(geforce_p2p::cuda::HostGate::expired)
    }
}

/// A device ordinal and an address on it.
pub(crate) type Placed = (usize, u64);

/// Refuse any overlap between the byte ranges of `a` and `b` on one device: a shared and a
/// mutable view of the same memory would break the views' contract.
pub(crate) fn check_disjoint(
    a_name: &str,
    a: &[Placed],
    a_len: usize,
    b_name: &str,
    b: &[Placed],
    b_len: usize,
    dtype: DType,
) -> Result<(), Raised> {
    let size = dtype.size_bytes() as u64;
    for (i, &(da, pa)) in a.iter().enumerate() {
        for (j, &(db, pb)) in b.iter().enumerate() {
            let (ra, rb) = (pa..pa + a_len as u64 * size, pb..pb + b_len as u64 * size);
            if da == db && geforce_p2p::cuda::byte_ranges_overlap(&ra, &rb) {
                return Err(Raised::argument(
                    a_name,
                    format!("{a_name}[{i}] overlaps {b_name}[{j}] on cuda:{da}: give separate tensors"),
                ));
            }
        }
    }
    Ok(())
}

fn copy_t<T: Element>(src: &Memory, dst: &Memory, len: usize, options: CopyOptions) -> Result<Route, Raised> {
    let (from, to) = (Caller::open(src)?, Caller::open(dst)?);
    let source = from.view::<T>(src.ptr, len);
    let mut target = to.view_mut::<T>(dst.ptr, len);
    Ok(geforce_p2p::transport().copy(&source, &from.stream, &mut target, &to.stream, options)?)
}

/// Copy `len` elements of `dtype` from `src` to `dst` (device memory, any two devices) by
/// `route`, ordered on both streams. Returns the route taken.
#[pyfunction]
#[pyo3(signature = (dtype, len, src, dst, route="auto", chunk_bytes=None, slots=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn copy(
    py: Python<'_>,
    dtype: &str,
    len: usize,
    src: MemoryArg,
    dst: MemoryArg,
    route: &str,
    chunk_bytes: Option<usize>,
    slots: Option<usize>,
) -> PyResult<&'static str> {
    let (src, dst) = (Memory::from(src), Memory::from(dst));
    let run = || copy_named(dtype, len, &src, &dst, (route, chunk_bytes, slots)).map(Route::name);
    Raised::detached(py, run)
}

/// The copy of [`copy`] with its names parsed: `(route, chunk_bytes, slots)` are the options.
pub(crate) fn copy_named(
    dtype: &str,
    len: usize,
    src: &Memory,
    dst: &Memory,
    (route, chunk_bytes, slots): (&str, Option<usize>, Option<usize>),
) -> Result<Route, Raised> {
    let options = CopyOptions { route: args::route(route)?, chunk_bytes, slots };
    copy_checked(args::dtype(dtype)?, len, src, dst, options)
}

/// The copy of [`copy`] (and of the torch fast path) once its arguments are parsed: the
/// ranges checked, then the copy enqueued.
pub(crate) fn copy_checked(
    dtype: DType,
    len: usize,
    src: &Memory,
    dst: &Memory,
    options: CopyOptions,
) -> Result<Route, Raised> {
    args::check_range("src", src.ptr, len, dtype)?;
    args::check_range("dst", dst.ptr, len, dtype)?;
    // Before any view is made: a shared and a mutable view of one memory would break the
    // views' contract, whatever the library refuses later.
    check_disjoint("src", &[(src.device, src.ptr)], len, "dst", &[(dst.device, dst.ptr)], len, dtype)?;
    by_dtype!(dtype, copy_t(src, dst, len, options))
}

fn copy_to_host_t<T: Element>(src: &Memory, dst: u64, len: usize) -> Result<(), Raised> {
    let from = Caller::open(src)?;
    let source = from.view::<T>(src.ptr, len);
    // SAFETY: by the module's contract (1, 3), `dst` addresses `len` elements of a CPU
    // tensor the caller keeps until the copy is done on the stream; the call refuses it
    // unless it is page-locked, and device and host memory never overlap.
    unsafe { ops::copy_to_host_raw(&from.stream, &source, host_ptr::<T>(dst), len)? };
    Ok(())
}

/// Copy `len` elements from device memory `src` into the pinned host memory at `dst`,
/// ordered on `src`'s stream. Refused unless `dst` is page-locked.
#[pyfunction]
pub(crate) fn copy_to_host(py: Python<'_>, dtype: &str, len: usize, src: MemoryArg, dst: u64) -> PyResult<()> {
    let src = Memory::from(src);
    let run = || -> Result<(), Raised> {
        let dtype = args::dtype(dtype)?;
        args::check_range("src", src.ptr, len, dtype)?;
        args::check_range("dst", dst, len, dtype)?;
        by_dtype!(dtype, copy_to_host_t(&src, dst, len))
    };
    Raised::detached(py, run)
}

fn copy_from_host_t<T: Element>(src: u64, dst: &Memory, len: usize) -> Result<(), Raised> {
    let to = Caller::open(dst)?;
    let mut target = to.view_mut::<T>(dst.ptr, len);
    // SAFETY: by the module's contract (1, 3, 4), `src` addresses `len` elements of a CPU
    // tensor the caller keeps, unwritten, until the copy is done on the stream; the call
    // refuses it unless it is page-locked.
    unsafe { ops::copy_from_host_raw(&to.stream, host_ptr::<T>(src).cast_const(), len, &mut target)? };
    Ok(())
}

/// Copy `len` elements from the pinned host memory at `src` into device memory `dst`,
/// ordered on `dst`'s stream. Refused unless `src` is page-locked.
#[pyfunction]
pub(crate) fn copy_from_host(py: Python<'_>, dtype: &str, len: usize, src: u64, dst: MemoryArg) -> PyResult<()> {
    let dst = Memory::from(dst);
    let run = || -> Result<(), Raised> {
        let dtype = args::dtype(dtype)?;
        args::check_range("src", src, len, dtype)?;
        args::check_range("dst", dst.ptr, len, dtype)?;
        by_dtype!(dtype, copy_from_host_t(src, &dst, len))
    };
    Raised::detached(py, run)
}

fn reduce_from_host_t<T: Element>(
    dst: &Memory,
    src: u64,
    len: usize,
    op: ReduceOp,
    divide_by: u32,
) -> Result<(), Raised> {
    let to = Caller::open(dst)?;
    let mut target = to.view_mut::<T>(dst.ptr, len);
    // SAFETY: by the module's contract (1, 3, 4), `src` addresses `len` elements of a CPU
    // tensor the caller keeps, unwritten, until the kernel is done on the stream; the call
    // refuses it unless it is page-locked.
    unsafe { ops::reduce_from_host_raw(&to.stream, &mut target, host_ptr::<T>(src).cast_const(), len, op, divide_by)? };
    Ok(())
}

fn reduce_t<T: Element>(dst: &Memory, src: u64, len: usize, op: ReduceOp, divide_by: u32) -> Result<(), Raised> {
    let at = Caller::open(dst)?;
    let mut target = at.view_mut::<T>(dst.ptr, len);
    let source = at.view::<T>(src, len);
    Ok(ops::reduce(&at.stream, &mut target, &source, op, divide_by)?)
}

/// `dst[i] = op(dst[i], src[i])` ordered on `dst`'s stream, `src` either device memory of
/// `dst`'s device or (`src_on_host`) pinned host memory the kernel reads across PCIe.
/// `divide_by` (≥ 1) divides the result of avg.
#[pyfunction]
#[pyo3(signature = (dtype, len, dst, src, op, divide_by=1, src_on_host=false))]
#[allow(clippy::too_many_arguments)] // the Python call's arguments, passed through
pub(crate) fn reduce(
    py: Python<'_>,
    dtype: &str,
    len: usize,
    dst: MemoryArg,
    src: u64,
    op: &str,
    divide_by: u32,
    src_on_host: bool,
) -> PyResult<()> {
    let dst = Memory::from(dst);
    let run = || -> Result<(), Raised> {
        let (dtype, op) = reduce_args(dtype, op, &dst, src, len)?;
        if src_on_host {
            return by_dtype!(dtype, reduce_from_host_t(&dst, src, len, op, divide_by));
        }
        check_disjoint("src", &[(dst.device, src)], len, "dst", &[(dst.device, dst.ptr)], len, dtype)?;
        by_dtype!(dtype, reduce_t(&dst, src, len, op, divide_by))
    };
    Raised::detached(py, run)
}

/// The reduce's checks before any work: dtype and op known, `dst` and `src` valid ranges of
/// `len` elements.
fn reduce_args(dtype: &str, op: &str, dst: &Memory, src: u64, len: usize) -> Result<(DType, ReduceOp), Raised> {
    let (dtype, op) = (args::dtype(dtype)?, args::op(op)?);
    args::check_range("dst", dst.ptr, len, dtype)?;
    args::check_range("src", src, len, dtype)?;
    Ok((dtype, op))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlaps_on_one_device_are_refused_and_elsewhere_allowed() {
        let f = DType::F32;
        // 4 f32 at 0x100 end at 0x110; 0x110 starts right after.
        assert_eq!(check_disjoint("a", &[(0, 0x100)], 4, "b", &[(0, 0x110)], 4, f), Ok(()));
        assert_eq!(check_disjoint("a", &[(0, 0x100)], 4, "b", &[(1, 0x100)], 4, f), Ok(()), "other device");
        assert_eq!(check_disjoint("a", &[(0, 0x100)], 0, "b", &[(0, 0x100)], 4, f), Ok(()), "empty");
        let err = check_disjoint("inputs", &[(0, 0x100), (1, 0x10c)], 4, "outputs", &[(1, 0x100)], 8, f)
            .expect_err("inputs[1] lies inside outputs[0]");
        assert!(err.message.contains("inputs[1] overlaps outputs[0] on cuda:1"), "{}", err.message);
    }

    #[test]
    fn reduces_check_dtype_op_and_both_ranges() {
        let dst = Memory { device: 0, ptr: 0x1000, stream: 0 };
        assert!(reduce_args("f32", "sum", &dst, 0x2000, 4).is_ok());
        assert!(reduce_args("f31", "sum", &dst, 0x2000, 4).is_err(), "unknown dtype");
        assert!(reduce_args("f32", "plus", &dst, 0x2000, 4).is_err(), "unknown op");
        let src = reduce_args("f32", "sum", &dst, 0x2001, 4).expect_err("src not aligned to f32");
        assert!(src.message.contains("src"), "{}", src.message);
        let dst = Memory { ptr: 0x1001, ..dst };
        let refused = reduce_args("f32", "sum", &dst, 0x2000, 4).expect_err("dst not aligned to f32");
        assert!(refused.message.contains("dst"), "{}", refused.message);
    }

    #[test]
    fn stream_handles_keep_their_value() {
        assert!(stream_handle(0).is_null(), "0 is the legacy default stream");
        assert_eq!(stream_handle(0x2) as usize, 2, "per-thread default stream");
    }
}
