//! The host's DRAM rate for `gp2p plan --measure` and `gp2p bench comm`'s model column: the
//! host memory traffic of every core copying (a STREAM-style copy over buffers far larger
//! than a last-level cache) while the first card's DMAs run both ways through pinned memory,
//! both counted over the same window.
//!
//! Why both at once: the staging traffic the model's DRAM term prices is DMA reads and writes
//! of pinned slots, which go through the same memory controllers as the cores' copies but
//! are not limited by the cores' outstanding misses. On one H100 host
//! (`benches/results/h10080gbhbm3/dram-rate.txt`, `benches/probes/dram_rate.py`) the cores
//! alone reached 61–102 GB/s, differing from run to run and by buffer size, the card's DMAs
//! alone 69, and both together 115–118: the cores alone had set the model's figure (65–101
//! in `gp2p bench comm`'s runs there), and with it the model priced two and four processes
//! at 64–256 MiB DRAM-bound, 17–37 % slow, where the rows ran at the link's rate.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use geforce_p2p::ops::{copy_from_host, copy_to_host};
use geforce_p2p::{Device, DeviceBuffer, PinnedBuffer, Stream};

use crate::error::CliError;

/// Bytes of each of the two buffers the cores copy between: past any last-level cache this
/// side of a gigabyte.
pub(super) const BUFFER_BYTES: usize = 512 << 20;

/// Bytes a core copies between looks at the clock and the stop flag.
const PIECE_BYTES: usize = 1 << 20;

/// Bytes of each of the card's DMAs, and how many go each way: about 0.3 s at 50 GB/s.
const DMA_BYTES: usize = 64 << 20;
const DMA_ROUNDS: usize = 256;

/// How long the copiers may take to fill their shares and copy a first piece.
const START_DEADLINE: Duration = Duration::from_secs(30);

/// Sets the flag it holds when dropped: the copiers stop however the measuring ends.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// GB/s of DRAM traffic while `threads` threads each copy their share of one buffer of
/// `bytes` into another for as long as `load` runs: bytes read plus bytes written per second
/// over the window `load` takes, with the bytes `load` itself moved through host memory (its
/// return value) counted in. Each thread first writes its own shares of both buffers (so
/// their pages sit by the cores that copy them) and copies a piece before `load` starts; the
/// copies are checked, so none can be optimised away.
///
/// # Errors
/// `load`'s error; [`CliError::Wrong`] where a copier cannot start (or start in time) or the
/// rate comes out not finite and positive.
pub(super) fn copy_beside_gbps(
    bytes: usize,
    threads: usize,
    load: impl FnOnce() -> Result<u64, CliError>,
) -> Result<f64, CliError> {
    let threads = threads.max(1);
    // Zeroed pages that nothing has touched yet: each copier's first writes place its shares.
    let mut from = vec![0u8; bytes];
    let mut to = vec![0u8; bytes];
    let share = bytes.div_ceil(threads).max(1);
    let copiers = bytes.div_ceil(share) as u64;
    let (copied, started, stop) = (AtomicU64::new(0), AtomicU64::new(0), AtomicBool::new(false));
    let result = std::thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        for (to, from) in to.chunks_mut(share).zip(from.chunks_mut(share)) {
            let (copied, started, stop) = (&copied, &started, &stop);
            std::thread::Builder::new()
                .spawn_scoped(s, move || {
                    from.fill(0x5a);
                    to.fill(0xa5);
                    let mut first = true;
                    while !stop.load(Ordering::Relaxed) {
                        for (to, from) in to.chunks_mut(PIECE_BYTES).zip(from.chunks(PIECE_BYTES)) {
                            to.copy_from_slice(from);
                            copied.fetch_add(from.len() as u64, Ordering::Relaxed);
                            if first {
                                started.fetch_add(1, Ordering::Release);
                                first = false;
                            }
                            if stop.load(Ordering::Relaxed) {
                                break;
                            }
                        }
                    }
                })
                .map_err(|e| CliError::Wrong(format!("measuring DRAM: a copying thread could not start: {e}")))?;
        }
        let deadline = Instant::now() + START_DEADLINE;
        while started.load(Ordering::Acquire) < copiers {
            if Instant::now() > deadline {
                return Err(CliError::Wrong(format!(
                    "measuring DRAM: {} of {copiers} copying threads started within {START_DEADLINE:?}",
                    started.load(Ordering::Acquire)
                )));
            }
            std::thread::yield_now();
        }
        let (before, start) = (copied.load(Ordering::Relaxed), Instant::now());
        let load_bytes = load()?;
        let (after, seconds) = (copied.load(Ordering::Relaxed), start.elapsed().as_secs_f64());
        let gbps = (2 * (after - before) + load_bytes) as f64 / seconds / 1e9;
        if gbps.is_finite() && gbps > 0.0 {
            Ok(gbps)
        } else {
            Err(CliError::Wrong(format!("measuring DRAM: {gbps} GB/s over {seconds} s is no rate")))
        }
    });
    if result.is_ok() {
        // Checked where every copier has been: the first piece of each share.
        for (to, from) in to.chunks(share).zip(from.chunks(share)) {
            let n = to.len().min(PIECE_BYTES);
            assert_eq!(to[..n], from[..n], "every copier copied its first piece");
        }
    }
    result
}

/// The host memory's rate, GB/s: every core copying ([`copy_beside_gbps`] over
/// [`BUFFER_BYTES`], a thread per core) while card `ordinal` copies [`DMA_ROUNDS`] DMAs of
/// [`DMA_BYTES`] into one pinned buffer and as many out of another, on two streams.
pub(crate) fn dram_gbps(ordinal: usize) -> Result<f64, CliError> {
    let device = Device::open(ordinal)?;
    let (up, down) = (Stream::new(&device)?, Stream::new(&device)?);
    let mut landed = PinnedBuffer::<u8>::alloc(&device, DMA_BYTES)?;
    let mut sent = PinnedBuffer::<u8>::alloc(&device, DMA_BYTES)?;
    sent.as_mut_slice()?.fill(0x3c);
    let source = DeviceBuffer::<u8>::alloc(&device, DMA_BYTES)?;
    let mut target = DeviceBuffer::<u8>::alloc(&device, DMA_BYTES)?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    copy_beside_gbps(BUFFER_BYTES, cores, || {
        for _ in 0..DMA_ROUNDS {
            copy_to_host(&up, &source.view(..), &mut landed.view_mut(..))?;
            copy_from_host(&down, &sent.view(..), &mut target.view_mut(..))?;
        }
        up.synchronize()?;
        down.synchronize()?;
        Ok(2 * (DMA_ROUNDS * DMA_BYTES) as u64)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_beside_a_load_count_the_load_s_bytes_over_its_window() {
        for threads in [1, 3] {
            let cores_only = copy_beside_gbps((8 << 20) + 5, threads, || {
                std::thread::sleep(std::time::Duration::from_millis(20));
                Ok(0)
            })
            .unwrap();
            assert!(cores_only.is_finite() && cores_only > 0.0, "{threads} threads: {cores_only}");
            // The load's 2^50 bytes count over a window no longer than the whole call: far
            // above what any copy reaches.
            let outside = Instant::now();
            let with_load = copy_beside_gbps(4 << 20, threads, || {
                std::thread::sleep(std::time::Duration::from_millis(20));
                Ok(1 << 50)
            })
            .unwrap();
            let at_least = (1u64 << 50) as f64 / 1e9 / outside.elapsed().as_secs_f64();
            assert!(with_load >= at_least, "{threads} threads: {with_load} < {at_least}");
        }
        let err = copy_beside_gbps(1 << 20, 2, || Err(CliError::Usage("no card".into()))).unwrap_err();
        assert!(err.to_string().contains("no card"), "{err}");
    }
}
