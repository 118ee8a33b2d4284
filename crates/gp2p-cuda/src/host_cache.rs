//! Freed pinned host memory, kept for reuse instead of handed back to the driver.
//!
//! `cuMemFreeHost` waits until every stream of the device is idle, and while it waits other
//! threads' driver calls (launches, event records, the next allocation) wait behind it: a
//! release made the host stall behind a held stream for as long as it was held (0.98 s
//! behind a 1 s gate on two H200s), and dropped buffers made unrelated drops and calls take
//! milliseconds. So the reclaimer never frees pinned memory: once the GPU work on a dropped
//! allocation is done, its block goes here, and the next allocation of the same size class
//! takes it without a driver call. PyTorch's pinned-memory allocator keeps freed blocks for
//! the same reason.
//!
//! The blocks stay pinned until [`release_cached_host_memory`] frees them, which an
//! allocation that finds the driver out of memory also does before it retries.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::ptr::NonNull;

use cudarc::driver::sys;
use parking_lot::Mutex;

use crate::driver::check;
use crate::{Device, Result};

/// The smallest block: the driver pins whole pages anyway.
const PAGE: usize = 4096;

/// The block size that serves a request of `bytes` (not zero): `bytes` rounded up to an
/// eighth of the power of two at or above it, and to at least a page. At most a quarter is
/// wasted, and requests of nearly one size share blocks (a bench's or a training loop's
/// repeated sizes always do).
pub(crate) fn block_bytes(bytes: usize) -> usize {
    let step = bytes.checked_next_power_of_two().map_or(PAGE, |p| (p / 8).max(PAGE));
    // Past the address space the driver refuses the size anyway: leave it as asked.
    bytes.checked_next_multiple_of(step).unwrap_or(bytes)
}

/// A block's address; owned by the cache while it is there.
struct Block(NonNull<u8>);

// SAFETY: the address of pinned memory no one else holds; the cache hands it to one owner.
unsafe impl Send for Block {}

/// Cached blocks by size.
type HostCache = Mutex<HashMap<usize, Vec<Block>>>;

fn cache() -> &'static HostCache {
    static CACHE: std::sync::OnceLock<HostCache> = std::sync::OnceLock::new();
    CACHE.get_or_init(Default::default)
}

/// A block of `block` bytes (a [`block_bytes`] size) freed earlier, if there is one.
pub(crate) fn take(block: usize) -> Option<NonNull<u8>> {
    cache().lock().get_mut(&block).and_then(Vec::pop).map(|found| found.0)
}

/// Keep `ptr`, a block of `block` bytes from `cuMemHostAlloc` that no GPU work and no owner
/// uses any more, for a later [`take`]. Makes no driver call.
pub(crate) fn put(block: usize, ptr: NonNull<u8>) {
    cache().lock().entry(block).or_default().push(Block(ptr));
}

/// Bytes of pinned host memory kept for reuse: dropped by their buffers, their GPU work
/// done, not yet handed back to the driver.
pub fn cached_host_bytes() -> usize {
    cache().lock().iter().map(|(size, blocks)| size * blocks.len()).sum()
}

/// Hand the pinned host memory kept for reuse back to the driver, returning how many bytes
/// that was. `device` supplies the context for the calls.
///
/// This blocks: each `cuMemFreeHost` waits until every stream of the device is idle (and
/// other threads' driver calls wait behind it meanwhile). Call it where the process can
/// afford that, e.g. after a phase that used large buffers it will not use again. Memory
/// that cannot be freed stays in the cache, and the first error is returned.
///
/// ```
/// let device = match gp2p_cuda::Device::open(0) {
///     Ok(device) => device,
///     Err(_) => return, // no driver or GPU here
/// };
/// let freed = gp2p_cuda::release_cached_host_memory(&device).unwrap();
/// println!("{freed} bytes of pinned memory handed back");
/// ```
pub fn release_cached_host_memory(device: &Device) -> Result<usize> {
    device.bind()?;
    let blocks: Vec<(usize, Block)> =
        cache().lock().drain().flat_map(|(size, blocks)| blocks.into_iter().map(move |b| (size, b))).collect();
    // Outside the cache's lock, so drops and allocations go on meanwhile; and not between two
    // launches that must both be queued (see `pause_releases`).
    let _not_paused = crate::lifetime::not_paused();
    let (mut freed, mut first_error) = (0, None);
    for (size, block) in blocks {
        // SAFETY: a block from cuMemHostAlloc that the cache owned (no GPU work, no owner),
        // freed once; a context is current (bound above).
        match check(unsafe { sys::cuMemFreeHost(block.0.as_ptr().cast()) }, "cuMemFreeHost") {
            Ok(()) => freed += size,
            Err(e) => {
                put(size, block.0);
                first_error.get_or_insert(e);
            }
        }
    }
    first_error.map_or(Ok(freed), Err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_sizes_round_up_to_an_eighth_of_their_power_of_two_and_a_page() {
        assert_eq!(block_bytes(1), PAGE);
        assert_eq!(block_bytes(PAGE), PAGE);
        assert_eq!(block_bytes(PAGE + 1), 2 * PAGE); // an eighth of 8 KiB is below a page
        assert_eq!(block_bytes(1 << 20), 1 << 20);
        assert_eq!(block_bytes((1 << 20) + 1), (1 << 20) + (1 << 18)); // step 2 MiB / 8
        assert_eq!(block_bytes(100 << 20), 112 << 20); // step 16 MiB
        assert_eq!(block_bytes(usize::MAX), usize::MAX);
        for bytes in [1, 4095, 4097, 65_537, 3 << 20, (1 << 30) + 7] {
            let block = block_bytes(bytes);
            assert!(block >= bytes && block % PAGE == 0, "{bytes} -> {block}");
            assert!(block - bytes <= (bytes / 4).max(PAGE), "{bytes} -> {block}: more than a quarter wasted");
        }
    }

    #[test]
    fn a_put_block_is_taken_by_its_size_class_once() {
        // A size no other test uses: the cache is process-wide.
        let size = block_bytes(777 << 20);
        let mut owned = vec![0u8; 16];
        let ptr = NonNull::new(owned.as_mut_ptr()).unwrap();
        let before = cached_host_bytes();
        put(size, ptr);
        assert_eq!(cached_host_bytes(), before + size);
        assert!(take(size + PAGE).is_none(), "another size class");
        assert_eq!(take(size), Some(ptr));
        assert!(take(size).is_none(), "taken twice");
        assert_eq!(cached_host_bytes(), before);
    }
}
