//! Benchmark aids, not the package's API: the library's own calls on buffers and streams made
//! here, timed in Rust as `gp2p bench` times its enqueue, so `benches/python/overhead_parts.py`
//! sets the Python layer beside the Rust call call by call, in one window of the machine's
//! (drifting) speed, rather than beside a separate `gp2p bench` run seconds later.

use std::time::Instant;

use geforce_p2p::collectives::{self, Rank, Receive};
use geforce_p2p::{CopyOptions, Device, DeviceBuffer, ReduceOp, Route, Stream};
use pyo3::prelude::*;

use crate::error::Raised;

/// One f32 per device with a stream each, and the copy and all-reduce `gp2p bench` times on
/// them: `copy` a staged copy from the first device to the second, `all_reduce` a sum over all.
#[pyclass(module = "geforce_p2p._native")]
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
