//! Timing with CUDA events, and the ceilings every benchmark is compared against.

use geforce_p2p::cuda::Error as CudaError;
use geforce_p2p::ops::copy_from_host;
use geforce_p2p::pinned::copy_to_host;
use geforce_p2p::{Device, DeviceBuffer, Event, EventKind, PinnedBuffer, Stream};

use crate::error::CliError;

/// How many runs to time, after how many untimed ones.
#[derive(Debug, Clone, Copy)]
pub struct Repeats {
    pub warmup: usize,
    pub timed: usize,
}

/// Run `body` `warmup + timed` times on `stream`, each after an untimed `setup`, and return
/// the median GPU time of the timed runs in seconds. Everything is enqueued first and read
/// back once, so host-side gaps do not inflate small timings.
pub fn median_seconds(
    stream: &Stream,
    repeats: Repeats,
    mut setup: impl FnMut() -> Result<(), CliError>,
    mut body: impl FnMut() -> Result<(), CliError>,
) -> Result<f64, CliError> {
    let device = stream.device();
    let mut marks = Vec::with_capacity(repeats.timed);
    for i in 0..repeats.warmup + repeats.timed {
        setup()?;
        if i < repeats.warmup {
            body()?;
            continue;
        }
        let (start, end) = (Event::new(device, EventKind::Timing)?, Event::new(device, EventKind::Timing)?);
        start.record(stream)?;
        body()?;
        end.record(stream)?;
        marks.push((start, end));
    }
    stream.synchronize()?;
    let mut times = marks
        .iter()
        .map(|(s, e)| Event::elapsed_ms(s, e).map(|ms| f64::from(ms) / 1e3))
        .collect::<Result<Vec<f64>, CudaError>>()?;
    Ok(median(&mut times))
}

/// The median of `values` (the mean of the middle two for an even count).
pub fn median(values: &mut [f64]) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 { values[mid] } else { (values[mid - 1] + values[mid]) / 2.0 }
}

/// Rates measured in this run, in GB/s (1e9 bytes per second).
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Ceilings {
    /// Device-to-device copy in VRAM, bytes read plus bytes written per second.
    pub d2d: f64,
    /// Pinned host to device DMA, one direction.
    pub h2d: f64,
    /// Device to pinned host DMA, one direction.
    pub d2h: f64,
    /// Bytes per transfer the ceilings were measured with.
    pub bytes: usize,
}

/// Measure the ceilings with `bytes`-sized transfers (fresh, non-zero data).
pub fn ceilings(device: &Device, stream: &Stream, bytes: usize, repeats: Repeats) -> Result<Ceilings, CliError> {
    let mut host = PinnedBuffer::<u8>::alloc(device, bytes)?;
    geforce_p2p::kernels::reference::fill_random(host.as_mut_slice()?, 0xCE11);
    let mut a = DeviceBuffer::<u8>::alloc(device, bytes)?;
    let mut b = DeviceBuffer::<u8>::alloc(device, bytes)?;
    copy_from_host(stream, &host.view(..), &mut a.view_mut(..))?;
    let none = || Ok(());
    let d2d = median_seconds(stream, repeats, none, || Ok(b.view_mut(..).copy_from(stream, &a.view(..))?))?;
    let h2d =
        median_seconds(stream, repeats, none, || Ok(copy_from_host(stream, &host.view(..), &mut a.view_mut(..))?))?;
    let d2h = median_seconds(stream, repeats, none, || Ok(copy_to_host(stream, &a.view(..), &mut host.view_mut(..))?))?;
    let gbps = |moved: usize, seconds: f64| moved as f64 / seconds / 1e9;
    Ok(Ceilings { d2d: gbps(2 * bytes, d2d), h2d: gbps(bytes, h2d), d2h: gbps(bytes, d2h), bytes })
}
