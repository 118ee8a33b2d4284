//! Which receive path is faster on a device: DMA into a VRAM scratch and reduce there, or a
//! kernel reading the staged chunk straight from mapped host memory. Measured once per
//! device (it differs by card: on an H200 a plain kernel reads mapped host memory at 0.92 of
//! the DMA rate; on an RTX 6000 Ada it was reported under half).

use gp2p_cuda::{Device, DeviceBuffer, Event, EventKind, Stream, reduce};
use gp2p_kernels::ReduceOp;
use gp2p_pinned::{PinnedBuffer, copy_from_host, copy_to_host, reduce_from_host};

use crate::{Receive, Result};

/// Elements (f32) of the calibration transfer: 64 MiB, long enough for steady state.
const CALIBRATION_ELEMENTS: usize = 16 << 20;
/// Timed runs per path.
const RUNS: usize = 5;

/// Time both receive paths on `device` and return the faster ([`Receive::Scratch`] or
/// [`Receive::ZeroCopy`], never `Auto`). Blocks the host for the measurement
/// (tens of milliseconds), once per device and process.
///
/// Each path is timed as the ring runs it: beside a device-to-host DMA of the same size on
/// another stream, until both are done. Alone, a kernel reading mapped memory looks almost
/// as fast as the DMA on an H200; beside the outgoing DMA it is slower, because its many
/// small read requests share the upstream direction with that DMA's writes.
pub(crate) fn choose(device: &Device) -> Result<Receive> {
    let stream = Stream::new(device)?;
    let up = Stream::new(device)?;
    let mut host = PinnedBuffer::<f32>::alloc(device, CALIBRATION_ELEMENTS)?;
    host.as_mut_slice()?.iter_mut().enumerate().for_each(|(i, v)| *v = (i % 97) as f32);
    let mut outgoing = PinnedBuffer::<f32>::alloc(device, CALIBRATION_ELEMENTS)?;
    let mut dst = DeviceBuffer::<f32>::alloc(device, CALIBRATION_ELEMENTS)?;
    let mut scratch = DeviceBuffer::<f32>::alloc(device, CALIBRATION_ELEMENTS)?;
    dst.fill_bytes(&stream, 0)?;
    let sent = DeviceBuffer::<f32>::alloc(device, CALIBRATION_ELEMENTS)?;
    let (start, end) = (Event::new(device, EventKind::Timing)?, Event::new(device, EventKind::Timing)?);
    let up_done = Event::new(device, EventKind::Sync)?;
    let mut best = [f32::INFINITY; 2];
    for _round in 0..=RUNS {
        for (i, path) in [Receive::Scratch, Receive::ZeroCopy].into_iter().enumerate() {
            start.record(&stream)?;
            up.wait(&start)?;
            copy_to_host(&up, &sent.view(..), &mut outgoing.view_mut(..))?;
            up_done.record(&up)?;
            if path == Receive::Scratch {
                copy_from_host(&stream, &host.view(..), &mut scratch.view_mut(..))?;
                reduce(&stream, &mut dst.view_mut(..), &scratch.view(..), ReduceOp::Max, 1)?;
            } else {
                reduce_from_host(&stream, &mut dst.view_mut(..), &host.view(..), ReduceOp::Max, 1)?;
            }
            stream.wait(&up_done)?;
            end.record(&stream)?;
            best[i] = best[i].min(Event::elapsed_ms(&start, &end)?);
        }
    }
    Ok(if best[1] < best[0] { Receive::ZeroCopy } else { Receive::Scratch })
}
