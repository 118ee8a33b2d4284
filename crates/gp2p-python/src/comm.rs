//! `geforce_p2p.distributed`'s native side: the one-process-per-GPU communicator.

use std::sync::Mutex;
use std::time::Duration;

use geforce_p2p::comm::{CommOptions, Communicator, UniqueId};
use geforce_p2p::{DType, Device, Element, ReduceOp};
use pyo3::prelude::*;

use crate::args::{self, Memory, MemoryArg};
use crate::error::Raised;
use crate::ffi::{Caller, by_dtype};

/// A new unique id for a communicator, as text to hand to every rank.
#[pyfunction]
pub(crate) fn unique_id(py: Python<'_>) -> PyResult<String> {
    Raised::detached(py, || UniqueId::new().map(|id| id.to_string()).map_err(Raised::from))
}

/// One rank of a communicator (see `geforce_p2p.distributed.Communicator`).
#[pyclass(name = "Communicator", module = "geforce_p2p._native")]
pub(crate) struct PyCommunicator {
    /// `None` once closed.
    inner: Mutex<Option<Communicator>>,
    rank: usize,
    world: usize,
    device: usize,
    max_bytes: usize,
}

fn seconds(name: &str, value: f64) -> Result<Duration, Raised> {
    Duration::try_from_secs_f64(value)
        .map_err(|_| Raised::argument(name, format!("{value} is not a number of seconds >= 0")))
}

#[pymethods]
impl PyCommunicator {
    /// Join communicator `id` as `rank` of `world` on CUDA device `device`; waits (with the
    /// GIL released) until every rank joined, at most `join_timeout` seconds.
    #[new]
    #[pyo3(signature = (id, rank, world, device, max_bytes, peer_timeout, join_timeout))]
    #[allow(clippy::too_many_arguments)] // the Python constructor's keywords, passed through
    fn new(
        py: Python<'_>,
        id: &str,
        rank: usize,
        world: usize,
        device: usize,
        max_bytes: usize,
        peer_timeout: f64,
        join_timeout: f64,
    ) -> PyResult<Self> {
        let run = || -> Result<PyCommunicator, Raised> {
            let id: UniqueId = id.parse().map_err(Raised::from)?;
            let options = CommOptions {
                small_max_bytes: max_bytes,
                peer_timeout: seconds("peer_timeout", peer_timeout)?,
                join_timeout: seconds("join_timeout", join_timeout)?,
                ..CommOptions::default()
            };
            // The device first: without a driver this fails at once, not after the join.
            let dev = Device::open(device)?;
            let mut comm = Communicator::new(&id, rank, world, &dev, options)?;
            crate::ffi::allow_torch_graphs(&mut comm);
            let max_bytes = comm.small_max_bytes();
            Ok(PyCommunicator { inner: Mutex::new(Some(comm)), rank, world, device, max_bytes })
        };
        Raised::detached(py, run)
    }

    #[getter]
    fn rank(&self) -> usize {
        self.rank
    }

    #[getter]
    fn world(&self) -> usize {
        self.world
    }

    #[getter]
    fn device(&self) -> usize {
        self.device
    }

    #[getter]
    fn max_bytes(&self) -> usize {
        self.max_bytes
    }

    /// In place: `len` elements of `dtype` at `buf` (device, address, stream) become `op`
    /// over every rank's, ordered on the stream.
    fn all_reduce(&self, py: Python<'_>, dtype: &str, len: usize, buf: MemoryArg, op: &str) -> PyResult<()> {
        let buf = Memory::from(buf);
        let run = || -> Result<(), Raised> {
            let (dtype, op) = (args::dtype(dtype)?, args::op(op)?);
            args::check_range("tensor", buf.ptr, len, dtype)?;
            self.with(|comm| by_dtype!(dtype, all_reduce_t(comm, &buf, len, op)))
        };
        Raised::detached(py, run)
    }

    /// `world * len` elements at `output` (device, address, stream) become every rank's
    /// `len` elements at `input` (same device) in rank order, ordered on the stream.
    fn all_gather(&self, py: Python<'_>, dtype: &str, len: usize, input: u64, output: MemoryArg) -> PyResult<()> {
        let output = Memory::from(output);
        let run = || -> Result<(), Raised> {
            let dtype = args::dtype(dtype)?;
            let out_len = args::times("output", self.world, len)?;
            args::check_range("input", input, len, dtype)?;
            args::check_range("output", output.ptr, out_len, dtype)?;
            check_apart(input, len, output.ptr, out_len, dtype)?;
            self.with(|comm| by_dtype!(dtype, all_gather_t(comm, input, len, &output)))
        };
        Raised::detached(py, run)
    }

    /// `len` elements at `output` (device, address, stream) become `op` over every rank's
    /// part `rank` of the `world * len` elements at `input` (same device), ordered on the
    /// stream.
    fn reduce_scatter(
        &self,
        py: Python<'_>,
        dtype: &str,
        len: usize,
        input: u64,
        output: MemoryArg,
        op: &str,
    ) -> PyResult<()> {
        let output = Memory::from(output);
        let run = || -> Result<(), Raised> {
            let (dtype, op) = (args::dtype(dtype)?, args::op(op)?);
            let in_len = args::times("input", self.world, len)?;
            args::check_range("input", input, in_len, dtype)?;
            args::check_range("output", output.ptr, len, dtype)?;
            check_apart(input, in_len, output.ptr, len, dtype)?;
            self.with(|comm| by_dtype!(dtype, reduce_scatter_t(comm, input, &output, len, op)))
        };
        Raised::detached(py, run)
    }

    /// In place: the `world * len` elements at `buf` (device, address, stream), this rank's
    /// input in part `rank`, become every rank's part in rank order.
    fn all_gather_in_place(&self, py: Python<'_>, dtype: &str, len: usize, buf: MemoryArg) -> PyResult<()> {
        let buf = Memory::from(buf);
        let run = || -> Result<(), Raised> {
            let dtype = args::dtype(dtype)?;
            let whole = args::times("output", self.world, len)?;
            args::check_range("output", buf.ptr, whole, dtype)?;
            self.with(|comm| by_dtype!(dtype, in_place_t(comm, &buf, whole, InPlace::AllGather)))
        };
        Raised::detached(py, run)
    }

    /// In place: part `rank` of the `world * len` elements at `buf` (device, address, stream)
    /// becomes `op` over every rank's part `rank`.
    fn reduce_scatter_in_place(
        &self,
        py: Python<'_>,
        dtype: &str,
        len: usize,
        buf: MemoryArg,
        op: &str,
    ) -> PyResult<()> {
        let buf = Memory::from(buf);
        let run = || -> Result<(), Raised> {
            let (dtype, op) = (args::dtype(dtype)?, args::op(op)?);
            let whole = args::times("input", self.world, len)?;
            args::check_range("input", buf.ptr, whole, dtype)?;
            self.with(|comm| by_dtype!(dtype, in_place_t(comm, &buf, whole, InPlace::ReduceScatter(op))))
        };
        Raised::detached(py, run)
    }

    /// `len` elements at `buf` (device, address, stream) become rank `root`'s, ordered on
    /// the stream.
    fn broadcast(&self, py: Python<'_>, dtype: &str, len: usize, buf: MemoryArg, root: usize) -> PyResult<()> {
        let buf = Memory::from(buf);
        let run = || -> Result<(), Raised> {
            let dtype = args::dtype(dtype)?;
            args::check_range("tensor", buf.ptr, len, dtype)?;
            self.with(|comm| by_dtype!(dtype, broadcast_t(comm, &buf, len, root)))
        };
        Raised::detached(py, run)
    }

    /// Raise if a wait of any rank gave up on its peer (calls check this themselves; launches
    /// of captured graphs do not).
    fn check(&self, py: Python<'_>) -> PyResult<()> {
        Raised::detached(py, || self.with(|comm| comm.check().map_err(Raised::from)))
    }

    /// Let go of the communicator: its segment is unregistered and unmapped once the GPU
    /// work of its calls is done (never blocking). Later calls raise.
    fn close(&self) {
        if let Ok(mut guard) = self.inner.lock() {
            guard.take();
        }
    }
}

impl PyCommunicator {
    /// Run `call` on the communicator, unless it was closed.
    fn with(&self, call: impl FnOnce(&mut Communicator) -> Result<(), Raised>) -> Result<(), Raised> {
        let mut guard = self.inner.lock().map_err(|_| Raised::argument("self", "a call on it panicked"))?;
        let comm = guard.as_mut().ok_or_else(|| Raised::argument("self", "closed; make a new communicator"))?;
        call(comm)
    }
}

fn all_reduce_t<T: Element>(comm: &mut Communicator, buf: &Memory, len: usize, op: ReduceOp) -> Result<(), Raised> {
    let caller = Caller::open(buf)?;
    let mut view = caller.view_mut::<T>(buf.ptr, len);
    comm.all_reduce(&mut view, &caller.stream, op).map_err(Raised::from)
}

/// Refuse an input and output that share memory before any view is made of them (a shared
/// and a mutable view of the same bytes would break the views' contract). The ranges were
/// checked not to overflow.
fn check_apart(input: u64, in_len: usize, output: u64, out_len: usize, dtype: DType) -> Result<(), Raised> {
    let size = dtype.size_bytes() as u64;
    let (in_end, out_end) = (input + in_len as u64 * size, output + out_len as u64 * size);
    if in_len > 0 && out_len > 0 && input < out_end && output < in_end {
        return Err(Raised::argument(
            "output",
            "shares memory with input; pass separate tensors (all_reduce works in place)",
        ));
    }
    Ok(())
}

fn all_gather_t<T: Element>(comm: &mut Communicator, input: u64, len: usize, output: &Memory) -> Result<(), Raised> {
    let caller = Caller::open(output)?;
    let input = caller.view::<T>(input, len);
    let mut out = caller.view_mut::<T>(output.ptr, len * comm.world());
    comm.all_gather(&input, &mut out, &caller.stream).map_err(Raised::from)
}

fn reduce_scatter_t<T: Element>(
    comm: &mut Communicator,
    input: u64,
    output: &Memory,
    len: usize,
    op: ReduceOp,
) -> Result<(), Raised> {
    let caller = Caller::open(output)?;
    let input = caller.view::<T>(input, len * comm.world());
    let mut out = caller.view_mut::<T>(output.ptr, len);
    comm.reduce_scatter(&input, &mut out, &caller.stream, op).map_err(Raised::from)
}

fn broadcast_t<T: Element>(comm: &mut Communicator, buf: &Memory, len: usize, root: usize) -> Result<(), Raised> {
    let caller = Caller::open(buf)?;
    let mut view = caller.view_mut::<T>(buf.ptr, len);
    comm.broadcast(&mut view, &caller.stream, root).map_err(Raised::from)
}

/// The in-place collectives of [`in_place_t`].
#[derive(Clone, Copy)]
enum InPlace {
    AllGather,
    ReduceScatter(ReduceOp),
}

fn in_place_t<T: Element>(comm: &mut Communicator, buf: &Memory, len: usize, what: InPlace) -> Result<(), Raised> {
    let caller = Caller::open(buf)?;
    let mut view = caller.view_mut::<T>(buf.ptr, len);
    match what {
        InPlace::AllGather => comm.all_gather_in_place(&mut view, &caller.stream),
        InPlace::ReduceScatter(op) => comm.reduce_scatter_in_place(&mut view, &caller.stream, op),
    }
    .map_err(Raised::from)
}
