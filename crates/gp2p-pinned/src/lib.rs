//! Pinned host memory for geforce-p2p.
//!
//! - [`PinnedBuffer`]: page-locked host memory, allocated portable (usable from every
//!   device's context) and device-mapped (every device can address it, which is what lets a
//!   kernel read it across PCIe), and not write-combined, so the CPU reads it at full speed.
//! - [`is_pinned`]: whether a host range is page-locked memory CUDA knows about.
//! - [`copy_to_host`] / [`copy_from_host`]: asynchronous DMA between device memory and a
//!   pinned buffer; [`reduce_from_host`]: `dst = op(dst, src)` with `src` read by the kernel
//!   straight out of pinned host memory (the zero-copy path); [`round_trip`]: a DMA out to
//!   pinned memory and back in, for latency measurements.
//! - [`StagingRing`]: slots of pinned memory with the events a copy pipeline needs, fenced on
//!   the GPU so back-to-back calls never overwrite a slot still in use.
//! - [`LineExchange`]: a small two-rank all-reduce in one kernel per rank, through lines of
//!   mapped memory that carry their own sequence number (no DMA engine on the critical path).
//! - [`ChunkExchange`]: the same for buffers of up to a few MiB, in flagged 4 KiB chunks.
//!
//! Not here: deciding chunk sizes or routes (that is `gp2p-transport`), or collectives.
//!
//! Feature `testing` (the GPU suite's, never a library's): hidden constructors that put both
//! ranks of a [`LineExchange`] or [`ChunkExchange`] on one device, so their kernels run where
//! one GPU is all there is; [`ChunkExchange::new`] and [`LineExchange::new`] still refuse it.
//!
//! (The example needs a CUDA GPU, so `cargo test` compiles it without running it.)
//! ```no_run
//! use gp2p_cuda::{Device, DeviceBuffer, Stream};
//! use gp2p_kernels::ReduceOp;
//! use gp2p_pinned::{PinnedBuffer, reduce_from_host};
//!
//! fn demo() -> Result<Vec<f32>, gp2p_pinned::Error> {
//!     let device = Device::open(0)?;
//!     let stream = Stream::new(&device)?;
//!     let mut host = PinnedBuffer::<f32>::alloc(&device, 4)?;
//!     host.as_mut_slice()?.copy_from_slice(&[1.0, 2.0, 3.0, 4.0]);
//!     let mut dst = DeviceBuffer::from_host(&stream, &[10.0f32; 4])?;
//!     // The kernel reads `host` across PCIe: no copy into device memory first.
//!     reduce_from_host(&stream, &mut dst.view_mut(..), &host.view(..), ReduceOp::Max, 1)?;
//!     Ok(dst.to_host_vec(&stream)?)
//! }
//!
//! match demo() {
//!     Ok(v) => assert_eq!(v, [10.0; 4]),
//!     Err(e) if e.is_unavailable() => {} // no driver or no GPU here
//!     Err(e) => panic!("{e}"),
//! }
//! ```

mod buffer;
mod chunks;
mod codec;
mod error;
mod exchange;
mod fanout;
mod ops;
mod pair;
mod ring;

pub use buffer::{PinnedBuffer, PinnedView, PinnedViewMut, is_pinned, is_pinned_on};
pub use chunks::{CHUNK_EXCHANGE_LIMIT, ChunkExchange, DEFAULT_QUEUE_TIMEOUT};
pub use codec::{copy_wire_from_host, copy_wire_to_host};
pub use error::{Error, Result};
pub use exchange::{DEFAULT_PEER_TIMEOUT, LineExchange};
pub use fanout::FanOut;
pub use ops::{
    copy_from_host, copy_from_host_raw, copy_to_host, copy_to_host_raw, reduce_from_host, reduce_from_host_raw,
    require_pinned, round_trip,
};
pub use pair::PairExchange;
pub use ring::{Fold, MAX_SLOTS, RingCache, Sent, StagingRing};
