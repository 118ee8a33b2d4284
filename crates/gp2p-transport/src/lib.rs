//! Data movement between devices for geforce-p2p.
//!
//! - [`Transport::copy`]: a device-to-device copy. Where the pair has P2P both ways it is one
//!   peer DMA (on one card, a device copy); otherwise a pipeline through a ring of pinned host
//!   slots — chunk k's device-to-host DMA on the source's stream, its host-to-device DMA on
//!   the destination's, so both directions of the links run at once. [`Route`] forces a way.
//! - Host copies: [`copy_to_host`], [`copy_from_host`] for [`gp2p_pinned`] buffers, and the
//!   `_raw` forms for pinned memory from elsewhere (refused unless it is pinned).
//! - [`plan`]: the chunk plans, pure and tested without a GPU.
//! - [`PeerPolicy`]: pairs whose P2P `Route::Auto` must not use although the driver offers
//!   it (on but unsafe); [`choose`] is the pure route choice the engine makes with it.
//!
//! Not here: judging whether a pair's P2P is safe (the probe does that; the facade hands
//! its verdicts in as a [`PeerPolicy`]), collectives.
//!
//! (The example needs a CUDA GPU, so `cargo test` compiles it without running it.)
//! ```no_run
//! use gp2p_cuda::{Device, DeviceBuffer, Stream};
//! use gp2p_transport::{CopyOptions, Route, Transport};
//!
//! fn demo() -> Result<Vec<u32>, gp2p_transport::Error> {
//!     let device = Device::open(0)?;
//!     let stream = Stream::new(&device)?;
//!     let src = DeviceBuffer::from_host(&stream, &[1u32, 2, 3, 4])?;
//!     let mut dst = DeviceBuffer::<u32>::alloc(&device, 4)?;
//!     let transport = Transport::new();
//!     let options = CopyOptions { route: Route::Staged, ..CopyOptions::default() };
//!     transport.copy(&src.view(..), &stream, &mut dst.view_mut(..), &stream, options)?;
//!     Ok(dst.to_host_vec(&stream)?)
//! }
//! match demo() {
//!     Ok(v) => assert_eq!(v, [1, 2, 3, 4]),
//!     Err(e) if e.is_unavailable() => {} // no driver or GPU here
//!     Err(e) => panic!("{e}"),
//! }
//! ```

// No unsafe here: raw driver calls go through gp2p_cuda::raw and the safe APIs above it.
#![forbid(unsafe_code)]

mod copy;
mod error;
pub mod plan;
mod policy;
mod route;

pub use copy::{CopyOptions, Transport};
pub use error::{Error, Result};
pub use gp2p_pinned::{copy_from_host, copy_from_host_raw, copy_to_host, copy_to_host_raw};
pub use policy::PeerPolicy;
pub use route::{Route, UnknownRoute, choose, resolve};
