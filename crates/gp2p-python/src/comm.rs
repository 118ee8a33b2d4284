//! `geforce_p2p.distributed`'s native side: the one-process-per-GPU communicator.

use std::sync::Mutex;

use geforce_p2p::comm::{Algorithm, CommOptions, Communicator, Compression, Receive, UniqueId, compression_from};
use geforce_p2p::cuda::trace;
use geforce_p2p::{DType, Device, Element, ReduceOp};
use pyo3::intern;
use pyo3::prelude::*;

use crate::args::{self, Memory, MemoryArg};
use crate::error::Raised;
use crate::fast::{Fields, Torch, TorchParts, choice, cuda_tensor, tensor_fields};
use crate::ffi::{Caller, by_dtype, check_disjoint};
use crate::outputs::{self, Outputs};

/// A new unique id for a communicator, as text to hand to every rank.
#[pyfunction]
pub(crate) fn unique_id(py: Python<'_>) -> PyResult<String> {
    Raised::detached(py, || UniqueId::new().map(|id| id.to_string()).map_err(Raised::from))
}

/// One rank of a communicator (see `geforce_p2p.distributed.Communicator`, which keeps its
/// rank, world size and device from its own arguments).
#[pyclass(name = "Communicator", module = "geforce_p2p._native")]
pub(crate) struct PyCommunicator {
    /// `None` once closed.
    inner: Mutex<Option<Communicator>>,
    /// The largest all-reduce the one-kernel path takes, read once (the Python layer asks at
    /// every `should_custom_ar`).
    max_bytes: usize,
    /// This rank's device ordinal.
    device: usize,
    /// The servers' all-reduce's outputs made ahead (see [`crate::outputs`]).
    outputs: Mutex<Outputs>,
}

#[pymethods]
impl PyCommunicator {
    /// Join communicator `id` as `rank` of `world` on CUDA device `device`; waits (with the
    /// GIL released) until every rank joined, at most `join_timeout` seconds.
    #[new]
    #[pyo3(signature = (id, rank, world, device, max_bytes, peer_timeout, join_timeout, slot_bytes=None, slots=None, chunk_blocks=None, lines_max_bytes=None, algorithm=None, compress=None, receive=None))]
    #[allow(clippy::too_many_arguments)] // the Python constructor's keywords, passed through
    fn new(
        py: Python<'_>,
        id: &str,
        rank: usize,
        world: usize,
        device: usize,
        max_bytes: Option<usize>,
        peer_timeout: f64,
        join_timeout: f64,
        slot_bytes: Option<usize>,
        slots: Option<usize>,
        chunk_blocks: Option<usize>,
        lines_max_bytes: Option<usize>,
        algorithm: Option<&str>,
        compress: Option<&str>,
        receive: Option<&str>,
    ) -> PyResult<Self> {
        let run = || -> Result<PyCommunicator, Raised> {
            let id: UniqueId = id.parse().map_err(Raised::from)?;
            // The defaults for this many ranks (the line kernel and slot sizes differ past two).
            let defaults = CommOptions::for_world(world);
            let options = CommOptions {
                small_max_bytes: max_bytes.unwrap_or(defaults.small_max_bytes),
                peer_timeout: args::seconds("peer_timeout", peer_timeout)?,
                join_timeout: args::seconds("join_timeout", join_timeout)?,
                slot_bytes: slot_bytes.unwrap_or(defaults.slot_bytes),
                slots: slots.unwrap_or(defaults.slots),
                chunk_blocks: chunk_blocks.unwrap_or(defaults.chunk_blocks),
                chunk_bytes: defaults.chunk_bytes,
                replay_calls: defaults.replay_calls,
                waits: defaults.waits,
                lines_max_bytes: lines_max_bytes.unwrap_or(defaults.lines_max_bytes),
                many_chunks: defaults.many_chunks,
                algorithm: algorithm
                    .map(|name| name.parse::<Algorithm>().map_err(|e| Raised::argument("algorithm", e)))
                    .transpose()?,
                // None leaves it to GP2P_COMPRESS; "off" turns it off whatever that says.
                compress: match compress {
                    None => None,
                    Some(value) => Some(compression_from(Some(value))?.unwrap_or_else(Compression::off)),
                },
                // None: auto, which takes GP2P_RECEIVE's, else picks by the landing's size.
                receive: match receive {
                    None => defaults.receive,
                    Some(name) => name.parse::<Receive>().map_err(|e| Raised::argument("receive", e))?,
                },
            };
            // The device first: without a driver this fails at once, not after the join.
            let dev = Device::open(device)?;
            let mut comm = Communicator::new(&id, rank, world, &dev, options)?;
            crate::ffi::allow_torch_graphs(&mut comm);
            let max_bytes = comm.small_max_bytes();
            Ok(PyCommunicator { inner: Mutex::new(Some(comm)), max_bytes, device, outputs: Mutex::default() })
        };
        Raised::detached(py, run)
    }

    #[getter]
    fn max_bytes(&self) -> usize {
        self.max_bytes
    }

    /// In place: `len` elements of `dtype` at `buf` (device, address, stream) become `op`
    /// over every rank's, ordered on the stream.
    fn all_reduce(&self, py: Python<'_>, dtype: &str, len: usize, buf: MemoryArg, op: &str) -> PyResult<()> {
        let op = args::op(op);
        self.single(py, dtype, len, buf, move || Ok(Single::AllReduce(op?)))
    }

    /// `all_reduce` of a torch tensor read here (see [`crate::fast`]; `parts` as for
    /// `copy_torch`): `False` where the Python layer must read it or `op` (not a contiguous
    /// CUDA tensor of a kernel dtype on this rank's device; nothing was enqueued then), `True`
    /// once the all-reduce is enqueued on the device's current torch stream. With the one
    /// capture query per borrow, it took a small all-reduce's host time from 9.9 to 8.1 us a
    /// call on one H200 (`git show faab767:benches/results/ab-6376a46-h200/README.md`).
    #[pyo3(signature = (tensor, op, parts=None))]
    fn all_reduce_torch<'py>(
        &self,
        py: Python<'py>,
        tensor: &Bound<'py, PyAny>,
        op: &Bound<'py, PyAny>,
        parts: Option<TorchParts>,
    ) -> PyResult<bool> {
        let Some(op) = choice(op, args::op) else {
            return Ok(false);
        };
        let Some(torch) = Torch::find(py, parts)? else {
            return Ok(false);
        };
        let Some(t) = cuda_tensor(tensor, &torch, None)? else {
            return Ok(false);
        };
        if t.memory.device != self.device {
            return Ok(false);
        }
        let (dtype, len, buf) = (t.dtype, t.len, t.memory);
        // `tensor` is held by the caller's frame for the whole call (contract 1).
        let run = || self.run_single(dtype, len, &buf, Single::AllReduce(op));
        Raised::detached(py, run).map(|()| true)
    }

    /// Whether `tensor` is what [`PyCommunicator::all_reduce_new_torch`] takes with this
    /// `max_bytes` (default and most: the one kernel's, [`PyCommunicator::max_bytes`]): a
    /// contiguous CUDA torch tensor of a kernel dtype on this rank's device, of 16-byte
    /// multiples up to `max_bytes`, read as the fast path reads it (a server's
    /// `should_custom_ar`, asked before every call: no GPU work, no exception for anything).
    #[pyo3(signature = (tensor, max_bytes=None))]
    fn serves_torch<'py>(
        &self,
        py: Python<'py>,
        tensor: &Bound<'py, PyAny>,
        max_bytes: Option<usize>,
    ) -> PyResult<bool> {
        Ok(self.served(py, tensor, max_bytes.unwrap_or(self.max_bytes))?.is_some())
    }

    /// A new tensor holding the `op` all-reduce of `tensor` over every rank, `tensor` left as it
    /// was, or None where [`PyCommunicator::serves_torch`] says no (nothing enqueued then):
    /// `empty_like` (default: torch's) makes the output, and the all-reduce is enqueued on the
    /// device's current stream, reading `tensor` and writing the output (no copy first). A
    /// server's `custom_all_reduce` in one native call: it cost 3 reads of the tensor, a clone
    /// and an in-place call from Python before. With the defaults it takes the tensor alone,
    /// as servers call `custom_all_reduce`, and is bound as that member itself (no Python
    /// frame between); small outputs are then made a batch at a time where no gradients are
    /// recorded (see [`crate::outputs`]).
    #[pyo3(signature = (tensor, empty_like=None, max_bytes=None, op="sum"))]
    fn all_reduce_new_torch<'py>(
        &self,
        py: Python<'py>,
        tensor: &Bound<'py, PyAny>,
        empty_like: Option<&Bound<'py, PyAny>>,
        max_bytes: Option<usize>,
        op: &str,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let op = args::op(op).map_err(|e| e.into_pyerr(py))?;
        let Some((torch, (dtype, dims, len, device, ptr))) =
            self.served(py, tensor, max_bytes.unwrap_or(self.max_bytes))?
        else {
            return Ok(None);
        };
        // Marks for a driver-call trace (benches/probes/trace_calls.py): where the reads go.
        trace::mark("read input");
        let stream = torch.current_stream(py, device)?;
        trace::mark("current stream");
        let bytes = len * dtype.size_bytes();
        let memory = Memory { device, ptr: 0, stream };
        // Borrowed for this call only; torch's allocation below begins no capture (contract 6).
        let caller = Caller::open_capturable(&memory).map_err(|e| e.into_pyerr(py))?;
        let ahead = empty_like.is_none()
            && bytes <= outputs::MAX_BYTES
            && !caller.stream.is_capturing().unwrap_or(true)
            && torch.grad_off(py);
        let made = if ahead { self.output_made_ahead(tensor, &dims, bytes, stream)? } else { None };
        let (output, out_ptr) = match made {
            Some(made) => made,
            None => new_output(tensor, &torch, empty_like, bytes, device)?,
        };
        trace::mark("output");
        // `tensor` and `output` are held by this frame for the whole call (contract 1).
        let run = move || {
            args::check_range("tensor", ptr, len, dtype)?;
            args::check_range("output", out_ptr, len, dtype)?;
            self.with(|comm| by_dtype!(dtype, all_reduce_into_t(comm, &caller, (ptr, out_ptr), len, op)))
        };
        Raised::detached(py, run)?;
        Ok(Some(output))
    }

    /// How many outputs of the servers' all-reduce are made and not handed out yet (see
    /// [`crate::outputs`]; for the tests).
    #[getter]
    fn outputs_ready(&self) -> usize {
        self.outputs.lock().map(|o| o.held()).unwrap_or(0)
    }

    /// `len` elements at `buf` (device, address, stream) become rank `root`'s, ordered on
    /// the stream.
    fn broadcast(&self, py: Python<'_>, dtype: &str, len: usize, buf: MemoryArg, root: usize) -> PyResult<()> {
        self.single(py, dtype, len, buf, move || Ok(Single::Broadcast(root)))
    }

    /// Send `len` elements of `dtype` at `buf` (device, address, stream) to rank `peer`,
    /// ordered on the stream; the peer receives them with `recv`.
    fn send(&self, py: Python<'_>, dtype: &str, len: usize, buf: MemoryArg, peer: usize) -> PyResult<()> {
        self.single(py, dtype, len, buf, move || Ok(Single::Send(peer)))
    }

    /// `len` elements at `buf` (device, address, stream) become what rank `peer` sends,
    /// ordered on the stream.
    fn recv(&self, py: Python<'_>, dtype: &str, len: usize, buf: MemoryArg, peer: usize) -> PyResult<()> {
        self.single(py, dtype, len, buf, move || Ok(Single::Recv(peer)))
    }

    /// `world * len` elements at `output` (device, address, stream) become every rank's
    /// `len` elements at `input` (same device) in rank order, ordered on the stream. An
    /// input that is exactly this rank's part of the output runs in place (NCCL's form).
    fn all_gather(&self, py: Python<'_>, dtype: &str, len: usize, input: u64, output: MemoryArg) -> PyResult<()> {
        self.split(py, dtype, len, (input, Memory::from(output)), || Ok(Split::Gather))
    }

    /// `len` elements at `output` (device, address, stream) become `op` over every rank's
    /// part `rank` of the `world * len` elements at `input` (same device), ordered on the
    /// stream. An output that is exactly this rank's part of the input runs in place.
    fn reduce_scatter(
        &self,
        py: Python<'_>,
        dtype: &str,
        len: usize,
        input: u64,
        output: MemoryArg,
        op: &str,
    ) -> PyResult<()> {
        let op = args::op(op);
        self.split(py, dtype, len, (input, Memory::from(output)), move || Ok(Split::Scatter(op?)))
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
        let ready = self.outputs.lock().map(|mut o| o.clear()).unwrap_or_default();
        drop(ready); // outside the lock: letting go of tensors may run Python code
    }
}

impl PyCommunicator {
    /// An output for the all-reduce of `tensor` (`dims`, `bytes`) on `stream` made ahead, with
    /// its address, or None where none can be (see [`crate::outputs`]): the caller makes one.
    fn output_made_ahead<'py>(
        &self,
        tensor: &Bound<'py, PyAny>,
        dims: &[i64],
        bytes: usize,
        stream: u64,
    ) -> PyResult<Option<(Bound<'py, PyAny>, u64)>> {
        let py = tensor.py();
        let dtype = tensor.getattr(intern!(py, "dtype"))?;
        let Ok(taken) = self.outputs.lock().map(|mut o| o.take(dims, &dtype, stream)) else {
            return Ok(None);
        };
        let count = match taken {
            Ok((output, ptr)) => return Ok(Some((output.into_bound(py), ptr))),
            Err(count) => outputs::batch_count(count, bytes),
        };
        if count < 2 {
            return Ok(None);
        }
        // Where torch cannot make the batch (out of memory, say), one output is made as usual.
        let Some(mut made) = soft_none(py, outputs::make(tensor, dims, bytes, count, self.device))? else {
            return Ok(None);
        };
        let Some((output, ptr)) = made.pop() else {
            return Ok(None);
        };
        let gone = self.outputs.lock().map(|mut o| o.keep(dims, &dtype, stream, made, count)).unwrap_or_default();
        drop(gone); // outside the lock: letting go of tensors may run Python code
        Ok(Some((output.into_bound(py), ptr)))
    }

    /// Run `call` on the communicator, unless it was closed.
    fn with(&self, call: impl FnOnce(&mut Communicator) -> Result<(), Raised>) -> Result<(), Raised> {
        let mut guard = self.inner.lock().map_err(|_| Raised::argument("self", "a call on it panicked"))?;
        let comm = guard.as_mut().ok_or_else(|| Raised::argument("self", "closed; make a new communicator"))?;
        call(comm)
    }

    /// `tensor` read by the fast path (no stream: nothing is enqueued on a check), with the
    /// torch parts that read it, where this communicator's out-of-place all-reduce serves it
    /// (see `serves_torch`).
    fn served(&self, py: Python<'_>, tensor: &Bound<'_, PyAny>, max_bytes: usize) -> PyResult<Option<(Torch, Fields)>> {
        let Some(torch) = Torch::find(py, None)? else {
            return Ok(None);
        };
        let Some(fields) = tensor_fields(tensor, &torch)? else {
            return Ok(None);
        };
        let (dtype, _, len, device, _) = fields;
        let bytes = len * dtype.size_bytes();
        let fits = bytes <= max_bytes.min(self.max_bytes) && bytes % 16 == 0;
        let open = self.inner.lock().map(|inner| inner.is_some()).unwrap_or(false);
        Ok((device == self.device && fits && open).then_some((torch, fields)))
    }

    /// A call on one buffer of `len` elements: checked, then `what()` run on it.
    fn single(
        &self,
        py: Python<'_>,
        dtype: &str,
        len: usize,
        buf: MemoryArg,
        what: impl FnOnce() -> Result<Single, Raised> + Send,
    ) -> PyResult<()> {
        let buf = Memory::from(buf);
        let run = || self.run_single(args::dtype(dtype)?, len, &buf, what()?);
        Raised::detached(py, run)
    }

    /// `what` on the `len` elements of `dtype` at `buf`, once their range is checked.
    fn run_single(&self, dtype: DType, len: usize, buf: &Memory, what: Single) -> Result<(), Raised> {
        args::check_range("tensor", buf.ptr, len, dtype)?;
        self.with(|comm| by_dtype!(dtype, single_t(comm, buf, len, what)))
    }

    /// An all-gather or reduce-scatter of parts of `len` elements between `input` (an
    /// address on the output's device) and `output`, in place where the part is exactly this
    /// rank's part of the whole, else over two buffers that must not overlap.
    fn split(
        &self,
        py: Python<'_>,
        dtype: &str,
        len: usize,
        (input, output): (u64, Memory),
        how: impl FnOnce() -> Result<Split, Raised> + Send,
    ) -> PyResult<()> {
        let run = || -> Result<(), Raised> {
            let (dtype, how) = (args::dtype(dtype)?, how()?);
            self.with(|comm| {
                let ((whole_name, whole), (part_name, part)) = match how {
                    Split::Gather => (("output", output.ptr), ("input", input)),
                    Split::Scatter(_) => (("input", input), ("output", output.ptr)),
                };
                let whole_len = args::times(whole_name, comm.world(), len)?;
                args::check_range(whole_name, whole, whole_len, dtype)?;
                args::check_range(part_name, part, len, dtype)?;
                let device = output.device;
                let parts =
                    Parts { device, whole: (whole_name, whole), part: (part_name, part), len, whole_len, dtype };
                if parts.in_place(comm.rank())? {
                    let what = match how {
                        Split::Gather => Single::AllGatherInPlace,
                        Split::Scatter(op) => Single::ReduceScatterInPlace(op),
                    };
                    return by_dtype!(dtype, single_t(comm, &Memory { ptr: whole, ..output }, whole_len, what));
                }
                by_dtype!(dtype, split_t(comm, &output, (input, output.ptr), (len, whole_len), how))
            })
        };
        Raised::detached(py, run)
    }
}

/// The two buffers of an all-gather or reduce-scatter on one device: the whole (`whole_len`
/// elements, `world` parts) and this rank's part (`len`), each with its argument's name.
struct Parts {
    device: usize,
    whole: (&'static str, u64),
    part: (&'static str, u64),
    len: usize,
    whole_len: usize,
    dtype: DType,
}

impl Parts {
    /// Whether the part is exactly `rank`'s part of the whole (NCCL's in-place form); any
    /// other overlap is refused before a view is made (a shared and a mutable view of the
    /// same bytes would break the views' contract).
    fn in_place(&self, rank: usize) -> Result<bool, Raised> {
        let ((whole_name, whole), (part_name, part)) = (self.whole, self.part);
        if self.len > 0 && part == whole + (rank * self.len * self.dtype.size_bytes()) as u64 {
            return Ok(true);
        }
        let at = |p: u64| [(self.device, p)];
        check_disjoint(part_name, &at(part), self.len, whole_name, &at(whole), self.whole_len, self.dtype)?;
        Ok(false)
    }
}

/// The calls on one buffer.
#[derive(Clone, Copy)]
enum Single {
    AllReduce(ReduceOp),
    Broadcast(usize),
    Send(usize),
    Recv(usize),
    AllGatherInPlace,
    ReduceScatterInPlace(ReduceOp),
}

/// Which way a two-buffer call moves its parts.
#[derive(Clone, Copy)]
enum Split {
    Gather,
    Scatter(ReduceOp),
}

fn single_t<T: Element>(comm: &mut Communicator, buf: &Memory, len: usize, what: Single) -> Result<(), Raised> {
    let caller = Caller::open_capturable(buf)?;
    let stream = &caller.stream;
    // One view per call, shared only where the call only reads.
    let view_mut = || caller.view_mut::<T>(buf.ptr, len);
    match what {
        Single::AllReduce(op) => comm.all_reduce(&mut view_mut(), stream, op),
        Single::Broadcast(root) => comm.broadcast(&mut view_mut(), stream, root),
        Single::Send(peer) => comm.send(&caller.view::<T>(buf.ptr, len), stream, peer),
        Single::Recv(peer) => comm.recv(&mut view_mut(), stream, peer),
        Single::AllGatherInPlace => comm.all_gather_in_place(&mut view_mut(), stream),
        Single::ReduceScatterInPlace(op) => comm.reduce_scatter_in_place(&mut view_mut(), stream, op),
    }
    .map_err(Raised::from)
}

/// An out-of-place all-reduce of `len` elements from `input` into `output` (addresses on the
/// caller's device), on the caller's stream.
fn all_reduce_into_t<T: Element>(
    comm: &mut Communicator,
    caller: &Caller,
    (input, output): (u64, u64),
    len: usize,
    op: ReduceOp,
) -> Result<(), Raised> {
    let mut out = caller.view_mut::<T>(output, len);
    comm.all_reduce_into(&caller.view::<T>(input, len), &mut out, &caller.stream, op).map_err(Raised::from)
}

/// A new output for the all-reduce of `tensor`, made by `empty_like` (default: torch's), with
/// its address; refused unless it is `bytes` contiguous bytes on `device`.
fn new_output<'py>(
    tensor: &Bound<'py, PyAny>,
    torch: &Torch,
    empty_like: Option<&Bound<'py, PyAny>>,
    bytes: usize,
    device: usize,
) -> PyResult<(Bound<'py, PyAny>, u64)> {
    let py = tensor.py();
    let Some(empty_like) = empty_like.or_else(|| torch.empty_like(py)) else {
        let missing = Raised::argument("empty_like", "give one: torch's was not found here");
        return Err(missing.into_pyerr(py));
    };
    let output = empty_like.call1((tensor,))?;
    trace::mark("empty_like");
    // Like its input, a contiguous tensor on its device (torch.empty_like keeps the layout).
    // Read of it: its address, and what makes the kernel's writes land in its memory: its
    // size, its device, and that it is contiguous (an expanded tensor's bytes are more than
    // its storage's). A full read costs twice as much host time.
    let out_ptr: u64 = output.call_method0(intern!(py, "data_ptr"))?.extract()?;
    let out_bytes: usize = output.getattr(intern!(py, "nbytes"))?.extract()?;
    let out_device: i64 = output.call_method0(intern!(py, "get_device"))?.extract()?;
    let contiguous: bool = output.call_method0(intern!(py, "is_contiguous"))?.extract()?;
    if out_bytes != bytes || out_ptr == 0 || out_device != device as i64 || !contiguous {
        let refused = Raised::argument(
            "empty_like",
            format!(
                "gave {out_bytes} bytes at {out_ptr:#x} on device {out_device} (contiguous: {contiguous}), \
                 not {bytes} contiguous bytes on device {device}"
            ),
        );
        return Err(refused.into_pyerr(py));
    }
    Ok((output, out_ptr))
}

/// `r`'s value, `None` for an ordinary exception (dropped), or the exception to raise
/// (KeyboardInterrupt, SystemExit).
fn soft_none<T>(py: Python<'_>, r: PyResult<Option<T>>) -> PyResult<Option<T>> {
    match r {
        Err(e) if e.is_instance_of::<pyo3::exceptions::PyException>(py) => Ok(None),
        other => other,
    }
}

/// A two-buffer call: `input` and `output` addresses on `at`'s device and stream, parts of
/// `len` elements and wholes of `whole` (the gather's input and the scatter's output are
/// one part).
fn split_t<T: Element>(
    comm: &mut Communicator,
    at: &Memory,
    (input, output): (u64, u64),
    (len, whole): (usize, usize),
    how: Split,
) -> Result<(), Raised> {
    let caller = Caller::open_capturable(at)?;
    let stream = &caller.stream;
    match how {
        Split::Gather => {
            let mut out = caller.view_mut::<T>(output, whole);
            comm.all_gather(&caller.view::<T>(input, len), &mut out, stream)
        }
        Split::Scatter(op) => {
            let mut out = caller.view_mut::<T>(output, len);
            comm.reduce_scatter(&caller.view::<T>(input, whole), &mut out, stream, op)
        }
    }
    .map_err(Raised::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_part_is_in_place_only_where_it_is_exactly_this_ranks_part_of_the_whole() {
        let parts = |part: u64| Parts {
            device: 0,
            whole: ("output", 0x1000),
            part: ("input", part),
            len: 4,
            whole_len: 8,
            dtype: DType::F32,
        };
        assert!(parts(0x1000).in_place(0).unwrap(), "rank 0's part starts the whole");
        assert!(parts(0x1010).in_place(1).unwrap(), "rank 1's starts 16 bytes on");
        assert!(!parts(0x2000).in_place(0).unwrap(), "apart: two buffers");
        for (part, rank) in [(0x1010, 0), (0x1004, 1), (0x0ff8, 0)] {
            let err = parts(part).in_place(rank).unwrap_err();
            assert!(err.message.contains("overlaps"), "{part:#x} for rank {rank}: {}", err.message);
        }
        let empty = Parts { len: 0, ..parts(0x1000) };
        assert!(!empty.in_place(0).unwrap(), "nothing to move, nothing overlaps");
    }
}
