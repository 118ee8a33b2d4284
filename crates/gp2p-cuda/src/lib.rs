//! The safe CUDA layer of geforce-p2p, over the CUDA driver API that `cudarc` loads at run
//! time.
//!
//! What it gives you:
//! - [`Device`]: count, open by ordinal (the device's primary context, shared with the CUDA
//!   runtime and with frameworks such as PyTorch), name, compute capability, memory, PCI bus.
//!   Cards below compute capability 7.5 are refused: the kernels are built for `compute_80`
//!   and, for Turing, `compute_75` (see [`Device::ptx_target`]).
//! - [`Stream`]: created here, or borrowed from a foreign `CUstream` so other frameworks can
//!   pass theirs in; [`StreamFork`] runs work on internal streams that start after a caller's
//!   stream and rejoin it.
//! - [`Event`]: timing and non-timing events.
//! - [`DeviceBuffer`] and the views [`DeviceView`] / [`DeviceViewMut`]: typed device memory.
//! - [`HostAllocation`]: pinned, portable, device-mapped host memory (typed in `gp2p-pinned`),
//!   kept for reuse once dropped ([`release_cached_host_memory`] hands it back).
//! - [`lifetime`]: the one lifetime rule — every operation notes where its GPU work on a
//!   buffer ends ([`StreamPoint`], [`LastUses`]); dropping a buffer, pinned allocation or
//!   stream never blocks and never frees what the GPU may still use.
//! - [`Module`] / [`Function`]: PTX from `gp2p-kernels`, loaded once per device and cached.
//! - [`reduce`]: the checked launch of the reduce kernel family.
//! - [`LaunchCache`]: kernel launches of one serialised caller replayed from CUDA graphs
//!   (a launch costs the host about twice a replay's time).
//! - [`Captured`]: work enqueued once by stream capture, launched again as one driver call.
//! - [`trace`]: a per-thread host-time trace of the driver calls, for finding where an
//!   enqueue's time goes; [`Timeline`]: its GPU side, the device's clock stamped after each
//!   step on the stream it ran on.
//! - [`raw`]: the one door to the driver for the crates above: copies and kernel launches on
//!   addresses (unsafe, each with its contract), and address lookups.
//! - `interop` (feature `cudarc`): cudarc's memory and streams as views and streams of this
//!   crate, in place, holding cudarc's synchronisation guards.
//!
//! What it does not do: pinned host memory (that is `gp2p-pinned`), moving data between
//! devices (`gp2p-transport`), or anything needing more than one device at a time.
//!
//! With no CUDA driver on the machine every entry point returns [`Error::NoDriver`]; nothing
//! panics. That is what lets the workspace build and test on machines without a GPU.
//!
//! ```
//! use gp2p_cuda::{Device, DeviceBuffer, Error, Stream, reduce};
//! use gp2p_kernels::ReduceOp;
//!
//! fn add_in_place() -> Result<Vec<f32>, Error> {
//!     let device = Device::open(0)?;
//!     let stream = Stream::new(&device)?;
//!     let mut dst = DeviceBuffer::from_host(&stream, &[1.0f32, 2.0, 3.0])?;
//!     let src = DeviceBuffer::from_host(&stream, &[10.0f32, 20.0, 30.0])?;
//!     reduce(&stream, &mut dst.view_mut(..), &src.view(..), ReduceOp::Sum, 1)?;
//!     dst.to_host_vec(&stream)
//! }
//!
//! match add_in_place() {
//!     Ok(v) => assert_eq!(v, [11.0, 22.0, 33.0]),
//!     // On a machine without a driver or GPU this is what comes back, never a panic.
//!     Err(Error::NoDriver | Error::NoDevice { .. }) => {}
//!     Err(e) => panic!("{e}"),
//! }
//! ```
//!
//! Thread safety: every type here is `Send + Sync`; the driver API is thread-safe, and each
//! call binds the device's primary context to the calling thread first.

mod captured;
pub mod codec;
mod device;
mod driver;
mod error;
mod event;
mod gate;
mod host;
mod host_cache;
#[cfg(feature = "cudarc")]
pub mod interop;
mod launch;
pub mod lifetime;
mod memory;
mod module;
mod pool;
pub mod raw;
mod reduce;
mod registered;
mod replay;
mod stream;
mod timeline;
pub mod trace;

pub use captured::Captured;
pub use device::{CurrentContext, Device, DeviceInfo, MIN_COMPUTE_CAPABILITY, P2pAttributes, PTX_TARGET_ENV};
pub use driver::{RawDevicePtr, driver_version, is_driver_present, take_deferred_error};
pub use error::{Error, Result};
pub use event::{Event, EventKind};
pub use gate::HostGate;
pub use gp2p_kernels::PtxTarget;
pub use host::HostAllocation;
pub use host_cache::{cached_host_bytes, release_cached_host_memory};
pub use launch::{SourceMemory, check_divisor, exchange_launch_config, reduce_launch_config};
pub use lifetime::{LastUses, ReleasesPaused, ReservedPoint, StreamPoint, pause_releases};
pub use memory::{
    DeviceBuffer, DeviceView, DeviceViewMut, byte_ranges_overlap, checked_range, index_range, out_of_bounds,
};
pub use module::{Function, LaunchConfig, Module};
pub use reduce::{load_all_reduce_kernels, reduce};
pub use registered::{HostRegistration, MappingOwner};
pub use replay::LaunchCache;
pub use stream::{RawStream, Stream, StreamFork};
pub use timeline::{Mark, Stamp, Stamps, Timeline};
