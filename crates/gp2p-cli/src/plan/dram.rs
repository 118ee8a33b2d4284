//! The host's DRAM rate for `gp2p plan --measure`: what the memory controllers deliver with
//! every core copying at once (a STREAM-style copy), over buffers far larger than a
//! last-level cache, so the model's DRAM term is this machine's and not a figure from
//! another. The staging traffic the term prices (DMA reads and writes of pinned slots) goes
//! through the same controllers; one card alone cannot load them as several do, the cores can.

use std::time::Instant;

/// Bytes of each of the two buffers `gp2p plan --measure` copies between: past any
/// last-level cache this side of a gigabyte.
pub(super) const BUFFER_BYTES: usize = 512 << 20;

/// Timed copies; the fastest counts (the first also faults the pages in).
pub(super) const REPEATS: usize = 4;

/// GB/s of DRAM traffic while `threads` threads each copy their share of one buffer of
/// `bytes` into another: bytes read plus bytes written per second, the fastest of `repeats`
/// copies. Both buffers are written before timing, so no copy pays for first touches.
pub(super) fn copy_gbps(bytes: usize, threads: usize, repeats: usize) -> f64 {
    let threads = threads.max(1);
    let from = vec![0x5au8; bytes];
    let mut to = vec![0xa5u8; bytes];
    let share = bytes.div_ceil(threads);
    let mut best = f64::INFINITY;
    for _ in 0..repeats.max(1) {
        let start = Instant::now();
        std::thread::scope(|s| {
            for (to, from) in to.chunks_mut(share).zip(from.chunks(share)) {
                s.spawn(move || to.copy_from_slice(from));
            }
        });
        best = best.min(start.elapsed().as_secs_f64());
    }
    // Checked, so the copies cannot be optimised away and a wrong split would show.
    assert!(to.iter().all(|&b| b == 0x5a), "every byte copied");
    2.0 * bytes as f64 / best / 1e9
}

/// [`copy_gbps`] over [`BUFFER_BYTES`] with a thread per core.
pub(crate) fn dram_gbps() -> f64 {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    copy_gbps(BUFFER_BYTES, cores, REPEATS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_by_several_threads_is_a_finite_positive_rate() {
        for threads in [1, 3] {
            let gbps = copy_gbps((8 << 20) + 5, threads, 2);
            assert!(gbps.is_finite() && gbps > 0.0, "{threads} threads: {gbps}");
        }
    }
}
