//! Benchmark aids, not the package's API: the library's own calls on buffers and streams made
//! here, timed in Rust as `gp2p bench` times its enqueue, so `benches/python/overhead_parts.py`
//! sets the Python layer beside the Rust call call by call, in one window of the machine's
//! (drifting) speed, rather than beside a separate `gp2p bench` run seconds later.

use std::time::Instant;

use geforce_p2p::collectives::{self, Rank, Receive};
use geforce_p2p::{CopyOptions, DType, Device, DeviceBuffer, ReduceOp, Route, Stream};
use pyo3::prelude::*;

use crate::args::{self, Memory, MemoryArg};
use crate::error::Raised;
use crate::fast::{Torch, TorchParts, cuda_tensor};
use crate::ffi::{copy_checked, copy_named};

/// One f32 per device with a stream each, and the copy and all-reduce `gp2p bench` times on
/// them: `copy` a staged copy from the first device to the second, `all_reduce` a sum over all.
#[pyclass(module = "geforce_p2p._native.bench")]
pub(crate) struct RustCalls {
    streams: Vec<Stream>,
    buffers: Vec<DeviceBuffer<f32>>,
}

impl RustCalls {
    fn make(devices: &[usize], legacy: bool) -> Result<RustCalls, Raised> {
        if devices.len() < 2 {
            return Err(Raised::argument("devices", "give two device ordinals (they may be equal)"));
        }
        let mut streams = Vec::new();
        let mut buffers = Vec::new();
        for &ordinal in devices {
            let device = Device::open(ordinal)?;
            streams.push(if legacy { Stream::legacy(&device) } else { Stream::new(&device)? });
            buffers.push(DeviceBuffer::alloc(&device, 1)?);
        }
        Ok(RustCalls { streams, buffers })
    }

    /// Seconds `call` took, on the host.
    fn timed(&mut self, call: impl FnOnce(&mut Self) -> Result<(), Raised>) -> Result<f64, Raised> {
        let t0 = Instant::now();
        call(self)?;
        Ok(t0.elapsed().as_secs_f64())
    }
}

#[pymethods]
impl RustCalls {
    /// Over `devices` (two ordinals or more: `copy` uses the first two), on new non-blocking
    /// streams or, with `legacy`, each device's legacy default stream.
    #[new]
    #[pyo3(signature = (devices, legacy=false))]
    fn new(py: Python<'_>, devices: Vec<usize>, legacy: bool) -> PyResult<RustCalls> {
        RustCalls::make(&devices, legacy).map_err(|e| e.into_pyerr(py))
    }

    /// The first stream's handle, for `Gate` (which holds it closed as `gp2p bench` does).
    fn first_stream(&self) -> u64 {
        self.streams[0].raw() as usize as u64
    }

    /// Enqueue the staged copy; returns the seconds the library call took.
    fn copy(&mut self, py: Python<'_>) -> PyResult<f64> {
        let options = CopyOptions { route: Route::Staged, chunk_bytes: None, slots: None };
        self.timed(|me| {
            let (first, rest) = me.buffers.split_at_mut(1);
            geforce_p2p::transport().copy(
                &first[0].view(..),
                &me.streams[0],
                &mut rest[0].view_mut(..),
                &me.streams[1],
                options,
            )?;
            Ok(())
        })
        .map_err(|e| e.into_pyerr(py))
    }

    /// Enqueue the same staged copy as `copy` through the native call's own path
    /// (`ffi::copy_checked`: the buffers and streams given as raw values, the streams
    /// borrowed for the call) without the interpreter; returns the seconds it took. Set
    /// beside `copy`, it is what borrowing costs; beside `_native.copy`, what the interpreter
    /// and the argument conversion cost.
    fn copy_borrowed(&mut self, py: Python<'_>) -> PyResult<f64> {
        let memory = |i: usize| Memory {
            device: self.buffers[i].device().ordinal(),
            ptr: self.buffers[i].raw_ptr(),
            stream: self.streams[i].raw() as usize as u64,
        };
        let (src, dst) = (memory(0), memory(1));
        let options = CopyOptions { route: Route::Staged, chunk_bytes: None, slots: None };
        let run = || -> Result<f64, Raised> {
            // Contract of `crate::ffi`: the buffers are this object's, alive for the call,
            // and their last uses are noted below whatever the copy's outcome (it may have
            // enqueued work before failing), so dropping the object frees them only after
            // that work. A point that cannot be taken waits for its stream instead.
            let t0 = Instant::now();
            let copied = copy_checked(DType::F32, 1, &src, &dst, options);
            let seconds = t0.elapsed().as_secs_f64();
            let mut noted = Ok(());
            for (buffer, stream) in self.buffers.iter().zip(&self.streams).take(2) {
                match stream.point() {
                    Ok(point) => buffer.view(..).note_use(&point),
                    Err(e) => noted = noted.and(Err(e)),
                }
            }
            copied?;
            noted?;
            Ok(seconds)
        };
        run().map_err(|e| e.into_pyerr(py))
    }

    /// Enqueue the sum all-reduce; returns the seconds the library call took.
    fn all_reduce(&mut self, py: Python<'_>) -> PyResult<f64> {
        self.timed(|me| {
            let mut ranks: Vec<Rank<'_, f32>> = me
                .buffers
                .iter_mut()
                .zip(&me.streams)
                .map(|(b, stream)| Rank { buffer: b.view_mut(..), stream })
                .collect();
            collectives::all_reduce(geforce_p2p::collectives(), &mut ranks, ReduceOp::Sum, Receive::Auto)?;
            Ok(())
        })
        .map_err(|e| e.into_pyerr(py))
    }

    /// Set the buffers to `values`, one per device (waits for the copies).
    fn fill(&mut self, py: Python<'_>, values: Vec<f32>) -> PyResult<()> {
        let mut run = || -> Result<(), Raised> {
            if values.len() != self.buffers.len() {
                let why = format!("{} values for {} devices; give one per device", values.len(), self.buffers.len());
                return Err(Raised::argument("values", why));
            }
            for ((b, s), v) in self.buffers.iter_mut().zip(&self.streams).zip(&values) {
                *b = DeviceBuffer::from_host(s, &[*v])?;
                s.synchronize()?;
            }
            Ok(())
        };
        run().map_err(|e| e.into_pyerr(py))
    }

    /// The buffers' values, one per device (waits for the streams).
    fn read(&self, py: Python<'_>) -> PyResult<Vec<f32>> {
        let run = || -> Result<Vec<f32>, Raised> {
            let mut out = Vec::new();
            for (b, s) in self.buffers.iter().zip(&self.streams) {
                out.extend(b.view(..).to_host_vec(s)?);
            }
            Ok(out)
        };
        run().map_err(|e| e.into_pyerr(py))
    }
}

/// Read `dst` and `src` as `_native.copy_torch` reads them, and nothing more: whether both
/// are tensors it takes. Its time, beside `copy_torch`'s, is what reading costs; with
/// `by_attributes`, what reading a plain tensor attribute by attribute would cost instead.
#[pyfunction]
#[pyo3(signature = (dst, src, parts=None, by_attributes=false))]
pub(crate) fn read_torch_pair<'py>(
    py: Python<'py>,
    dst: &Bound<'py, PyAny>,
    src: &Bound<'py, PyAny>,
    parts: Option<TorchParts>,
    by_attributes: bool,
) -> PyResult<bool> {
    let Some(mut torch) = Torch::find(py, parts)? else {
        return Ok(false);
    };
    if by_attributes {
        torch.read_by_attributes();
    }
    let Some(d) = cuda_tensor(dst, &torch, None)? else {
        return Ok(false);
    };
    Ok(cuda_tensor(src, &torch, Some(&d))?.is_some())
}

/// Nothing but what `_native.copy` does around the copy: its arguments converted as it
/// converts them and, with `detach`, the GIL released and taken back as every native call
/// does; returns a route's name (always "staged") as it returns the route taken. Its time
/// is the native call's own cost.
#[pyfunction]
#[pyo3(signature = (dtype, len, src, dst, route="auto", chunk_bytes=None, slots=None, detach=true))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn copy_call_only(
    py: Python<'_>,
    dtype: &str,
    len: usize,
    src: MemoryArg,
    dst: MemoryArg,
    route: &str,
    chunk_bytes: Option<usize>,
    slots: Option<usize>,
    detach: bool,
) -> PyResult<&'static str> {
    let (src, dst) = (Memory::from(src), Memory::from(dst));
    let run = || -> Result<&'static str, Raised> {
        let _ = (args::route(route)?, args::dtype(dtype)?, len, src, dst, chunk_bytes, slots);
        Ok("staged")
    };
    if detach { Raised::detached(py, run) } else { run().map_err(|e| e.into_pyerr(py)) }
}

/// `_native.copy` with the copy timed in Rust: the seconds `copy_named` took (the names
/// parsed, the ranges checked, the streams borrowed, the library's call), with the GIL
/// released around it as `_native.copy` releases it. Beside `_native.copy`'s time taken in
/// Python it is what the interpreter's call costs; beside `RustCalls.copy_borrowed`, what
/// the memory and streams being torch's rather than the library's cost. The module contract
/// of [`crate::ffi`] holds for its arguments as for `_native.copy`'s.
#[pyfunction]
#[pyo3(signature = (dtype, len, src, dst, route="auto"))]
pub(crate) fn copy_timed(
    py: Python<'_>,
    dtype: &str,
    len: usize,
    src: MemoryArg,
    dst: MemoryArg,
    route: &str,
) -> PyResult<f64> {
    let (src, dst) = (Memory::from(src), Memory::from(dst));
    let run = || -> Result<f64, Raised> {
        let t0 = Instant::now();
        copy_named(dtype, len, &src, &dst, (route, None, None))?;
        Ok(t0.elapsed().as_secs_f64())
    };
    Raised::detached(py, run)
}

/// Start tracing this thread's driver calls (see `gp2p_cuda::trace`): every call the
/// library makes on it from now on leaves its name and time, until `trace_finish`.
#[pyfunction]
pub(crate) fn trace_start() {
    geforce_p2p::cuda::trace::start();
}

/// Stop tracing and return `(name, microseconds since the previous mark)` for each driver
/// call since `trace_start`, the last one named `finish` (the Python code after the last call).
/// The first call's time includes everything since `trace_start` before it: the Python layer
/// and the native argument reading.
#[pyfunction]
pub(crate) fn trace_finish() -> Vec<(&'static str, f64)> {
    geforce_p2p::cuda::trace::finish().into_iter().map(|call| (call.name, call.gap_ns as f64 / 1e3)).collect()
}
