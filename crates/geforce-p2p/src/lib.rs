//! geforce-p2p: move data between NVIDIA GPUs whose driver refuses peer-to-peer access.
//!
//! This facade re-exports the layers an application needs; each also stands alone:
//! - [`cuda`] (`gp2p-cuda`): devices, streams, events, device memory, the reduce launch;
//! - [`pinned`] (`gp2p-pinned`): pinned, device-mapped host memory and staging rings;
//! - [`kernels`] (`gp2p-kernels`): [`DType`], [`ReduceOp`] and the committed PTX;
//! - [`ops`]: the public primitives for building your own schedules.
//!
//! The staged copy, the collectives and the P2P probe join this facade as their crates land.
//!
//! ```
//! use geforce_p2p::{Device, DeviceBuffer, PinnedBuffer, ReduceOp, Stream, ops};
//!
//! fn demo() -> Result<Vec<f32>, geforce_p2p::pinned::Error> {
//!     let device = Device::open(0)?;
//!     let stream = Stream::new(&device)?;
//!     let mut staged = PinnedBuffer::<f32>::alloc(&device, 3)?;
//!     staged.as_mut_slice()?.copy_from_slice(&[1.0, 2.0, 3.0]);
//!     let mut acc = DeviceBuffer::from_host(&stream, &[1.0f32, 1.0, 1.0])?;
//!     ops::reduce_from_host(&stream, &mut acc.view_mut(..), &staged.view(..), ReduceOp::Sum, 1)?;
//!     Ok(acc.to_host_vec(&stream)?)
//! }
//! match demo() {
//!     Ok(v) => assert_eq!(v, [2.0, 3.0, 4.0]),
//!     Err(e) if e.is_unavailable() => println!("no GPU here: {e}"),
//!     Err(e) => panic!("{e}"),
//! }
//! ```

pub use gp2p_cuda as cuda;
pub use gp2p_kernels as kernels;
pub use gp2p_pinned as pinned;

pub use gp2p_cuda::{
    Device, DeviceBuffer, DeviceInfo, DeviceView, DeviceViewMut, Event, EventKind, Stream, StreamFork,
};
pub use gp2p_kernels::{DType, Element, ReduceOp, half};
pub use gp2p_pinned::{PinnedBuffer, PinnedView, PinnedViewMut, StagingRing, is_pinned};

/// The public primitives, for users who build their own schedules.
///
/// `staged_copy` joins them with the transport crate.
pub mod ops {
    pub use gp2p_cuda::reduce;
    pub use gp2p_pinned::{copy_from_host, copy_to_host, reduce_from_host};
}
