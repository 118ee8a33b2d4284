//! geforce-p2p: move data between NVIDIA GPUs whose driver refuses peer-to-peer access.
//!
//! This facade re-exports the layers an application needs; each also stands alone:
//! - [`cuda`] (`gp2p-cuda`): devices, streams, events, device memory, the reduce launch;
//! - [`pinned`] (`gp2p-pinned`): pinned, device-mapped host memory and staging rings;
//! - [`kernels`] (`gp2p-kernels`): [`DType`], [`ReduceOp`] and the committed PTX;
//! - [`mod@transport`] (`gp2p-transport`): the cross-device copy engine, and [`transport()`],
//!   the one engine this facade shares, which the probe's verdicts keep off unsafe P2P
//!   ([`guard_peer_routes`]);
//! - [`copy`] / [`copy_into`]: copies between devices through one shared engine, by P2P
//!   where the pair has it safely, else staged through pinned host memory;
//! - [`ops`]: the public primitives for building your own schedules.
//!
//! - [`probe()`] (`gp2p-probe`): for every pair of devices, whether P2P is on and, if not,
//!   the exact reason and whether the driver patch in PATCH.md would turn it on.
//! - [`mod@collectives`] (`gp2p-collectives`): all_reduce, all_gather, reduce_scatter and
//!   broadcast over pinned host memory (the ring between two devices, from three the legs the
//!   communicator runs too), with a VRAM-scratch and a zero-copy receive path;
//!   [`all_reduce`], [`all_gather`], [`reduce_scatter`], [`broadcast`] run them on one
//!   shared engine ([`collectives()`]).
//! - [`comm`] (`gp2p-comm`): one process per GPU (torchrun, vLLM, sglang): a unique id, the
//!   shared segment every rank maps, and a communicator of 1 to 8 ranks that runs
//!   all_reduce, all_gather, reduce_scatter, broadcast, sends and receives on the caller's
//!   stream.
//!
//! Every facade function returns one [`Error`], whichever layer failed. Memory the GPU may
//! still use is never freed and drops never block (the lifetime rule of [`cuda::lifetime`]).
//!
//! (The example needs a CUDA GPU, so `cargo test` compiles it without running it.)
//! ```no_run
//! use geforce_p2p::{Device, DeviceBuffer, PinnedBuffer, ReduceOp, Stream, ops};
//!
//! fn demo() -> Result<Vec<f32>, geforce_p2p::Error> {
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

// No unsafe here: raw driver calls go through gp2p_cuda::raw and the safe APIs above it.
#![forbid(unsafe_code)]

use std::sync::LazyLock;

mod error;

pub use error::{Error, Result};
pub use gp2p_collectives as collectives;
pub use gp2p_comm as comm;
pub use gp2p_cuda as cuda;
pub use gp2p_kernels as kernels;
pub use gp2p_pinned as pinned;
pub use gp2p_probe as probe;
pub use gp2p_transport as transport;

pub use gp2p_cuda::{
    Device, DeviceBuffer, DeviceInfo, DeviceView, DeviceViewMut, Event, EventKind, Stream, StreamFork,
};
pub use gp2p_kernels::{DType, Element, ReduceOp, half, with_element};
pub use gp2p_pinned::{PinnedBuffer, PinnedView, PinnedViewMut, StagingRing, is_pinned};

pub use gp2p_collectives::{Engine, Rank, Receive};
pub use gp2p_transport::{CopyOptions, Route, Transport};

/// The engine behind [`copy`], [`copy_into`] and [`ops::staged_copy`]: one per process, so
/// its staging rings and internal streams are shared by every caller.
///
/// On first use it reads this machine's facts without opening any device
/// ([`probe::collect_host`]: NVML, `/proc`, `/sys`) and keeps `Route::Auto` off the pairs
/// whose P2P the probe finds on but unsafe ([`guard_peer_routes`]): there a patched driver
/// forces P2P over a BAR1 smaller than VRAM or through a translating IOMMU, and copies
/// would fail or corrupt data silently. Those pairs copy staged; `Route::Peer` still
/// forces P2P. Without a driver the policy stays empty.
pub fn transport() -> &'static Transport {
    static TRANSPORT: LazyLock<Transport> = LazyLock::new(|| {
        let transport = Transport::new();
        if let Ok(facts) = gp2p_probe::collect_host() {
            guard_peer_routes(&transport, &facts);
        }
        transport
    });
    &TRANSPORT
}

/// Join the probe to a copy engine: distrust, in `transport`'s [`PeerPolicy`](transport::PeerPolicy),
/// every pair whose P2P the probe judges unsafe or unchecked were CUDA to offer it
/// ([`probe::verdicts_if_on`]), so its `Route::Auto` copies those pairs staged. Touches no
/// GPU; [`transport()`] does this for the shared engine, call it for an engine of your own.
pub fn guard_peer_routes(transport: &Transport, facts: &gp2p_probe::Facts) {
    for verdict in gp2p_probe::verdicts_if_on(facts) {
        if let Some(why) = verdict.peer_distrust() {
            transport.peer_policy().distrust(verdict.a, verdict.b, why);
        }
    }
}

/// Copy `src` (on `src_stream`'s device) into a new buffer on `dst_stream`'s device, by the
/// best route the pair allows. Stream-ordered on both streams; the host is not blocked.
pub fn copy<T: Element>(src: &DeviceView<'_, T>, src_stream: &Stream, dst_stream: &Stream) -> Result<DeviceBuffer<T>> {
    let mut dst = DeviceBuffer::alloc(dst_stream.device(), src.len())?;
    copy_into(src, src_stream, &mut dst.view_mut(..), dst_stream)?;
    Ok(dst)
}

/// Copy `src` into `dst` (same length, any devices) by the best route; returns the route.
pub fn copy_into<T: Element>(
    src: &DeviceView<'_, T>,
    src_stream: &Stream,
    dst: &mut DeviceViewMut<'_, T>,
    dst_stream: &Stream,
) -> Result<Route> {
    Ok(transport().copy(src, src_stream, dst, dst_stream, CopyOptions::default())?)
}

/// Probe this machine: facts from CUDA, NVML and Linux, and a verdict per device pair.
/// Fails only without a CUDA driver; missing sources lower what the report says.
pub fn probe() -> Result<gp2p_probe::Report> {
    Ok(gp2p_probe::collect().map(gp2p_probe::Report::new)?)
}

/// The collectives engine behind [`all_reduce`], [`all_gather`], [`reduce_scatter`] and
/// [`broadcast`]: one per process, so its staging rings, streams and scratch buffers are
/// shared by every caller (calls on one group of devices are serialised).
pub fn collectives() -> &'static Engine {
    static ENGINE: LazyLock<Engine> = LazyLock::new(Engine::new);
    &ENGINE
}

/// In place on every rank (one buffer per device): `op` over all ranks' buffers, through
/// the shared engine and the receive path it measures fastest. Stream-ordered on each
/// rank's stream; see [`collectives::all_reduce`].
pub fn all_reduce<T: Element>(ranks: &mut [Rank<'_, T>], op: ReduceOp) -> Result<()> {
    Ok(gp2p_collectives::all_reduce(collectives(), ranks, op, Receive::Auto)?)
}

/// Every rank's output becomes all ranks' inputs in rank order; see
/// [`collectives::all_gather`].
pub fn all_gather<T: Element>(inputs: &[DeviceView<'_, T>], outputs: &mut [Rank<'_, T>]) -> Result<()> {
    Ok(gp2p_collectives::all_gather(collectives(), inputs, outputs, Receive::Auto)?)
}

/// Rank r's output becomes `op` over segment r of all inputs; see
/// [`collectives::reduce_scatter`].
pub fn reduce_scatter<T: Element>(
    inputs: &[DeviceView<'_, T>],
    outputs: &mut [Rank<'_, T>],
    op: ReduceOp,
) -> Result<()> {
    Ok(gp2p_collectives::reduce_scatter(collectives(), inputs, outputs, op, Receive::Auto)?)
}

/// Every rank's buffer becomes a copy of rank `root`'s; see [`collectives::broadcast`].
pub fn broadcast<T: Element>(ranks: &mut [Rank<'_, T>], root: usize) -> Result<()> {
    Ok(gp2p_collectives::broadcast(collectives(), ranks, root, Receive::Auto)?)
}

/// The public primitives, for users who build their own schedules. Each returns the
/// facade's [`Error`], except the three raw-pointer primitives re-exported from
/// `gp2p-pinned` (unsafe functions, which this crate does not define: it has no `unsafe`),
/// whose error converts into it with `?`.
pub mod ops {
    pub use gp2p_pinned::{copy_from_host_raw, copy_to_host_raw, reduce_from_host_raw};

    use crate::{
        CopyOptions, DeviceView, DeviceViewMut, Element, PinnedView, PinnedViewMut, ReduceOp, Result, Route, Stream,
    };

    /// The pipelined copy through pinned host slots, whatever P2P the pair has: device to
    /// host on `src_stream`'s device, host to device on `dst_stream`'s, both directions of
    /// the links busy at once. `chunk_bytes` / `slots` override the automatic chunking.
    pub fn staged_copy<T: Element>(
        src: &DeviceView<'_, T>,
        src_stream: &Stream,
        dst: &mut DeviceViewMut<'_, T>,
        dst_stream: &Stream,
        chunk_bytes: Option<usize>,
        slots: Option<usize>,
    ) -> Result<()> {
        let options = CopyOptions { route: Route::Staged, chunk_bytes, slots };
        crate::transport().copy(src, src_stream, dst, dst_stream, options)?;
        Ok(())
    }

    /// `dst[i] = op(dst[i], src[i])` on `stream`, both in device memory; see
    /// [`gp2p_cuda::reduce`].
    pub fn reduce<T: Element>(
        stream: &Stream,
        dst: &mut DeviceViewMut<'_, T>,
        src: &DeviceView<'_, T>,
        op: ReduceOp,
        divide_by: u32,
    ) -> Result<()> {
        Ok(gp2p_cuda::reduce(stream, dst, src, op, divide_by)?)
    }

    /// `dst[i] = op(dst[i], src[i])` with the kernel reading `src` from pinned host memory
    /// across PCIe (zero-copy); see [`gp2p_pinned::reduce_from_host`].
    pub fn reduce_from_host<T: Element>(
        stream: &Stream,
        dst: &mut DeviceViewMut<'_, T>,
        src: &PinnedView<'_, T>,
        op: ReduceOp,
        divide_by: u32,
    ) -> Result<()> {
        Ok(gp2p_pinned::reduce_from_host(stream, dst, src, op, divide_by)?)
    }

    /// A DMA of device memory into pinned host memory on `stream`; see
    /// [`gp2p_pinned::copy_to_host`].
    pub fn copy_to_host<T: Element>(
        stream: &Stream,
        src: &DeviceView<'_, T>,
        dst: &mut PinnedViewMut<'_, T>,
    ) -> Result<()> {
        Ok(gp2p_pinned::copy_to_host(stream, src, dst)?)
    }

    /// A DMA of pinned host memory into device memory on `stream`; see
    /// [`gp2p_pinned::copy_from_host`].
    pub fn copy_from_host<T: Element>(
        stream: &Stream,
        src: &PinnedView<'_, T>,
        dst: &mut DeviceViewMut<'_, T>,
    ) -> Result<()> {
        Ok(gp2p_pinned::copy_from_host(stream, src, dst)?)
    }
}

/// The README's Rust examples, compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeExamples;

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    /// A saved-facts fixture of the probe.
    fn fixture(name: &str) -> gp2p_probe::Facts {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../gp2p-probe/tests/fixtures").join(name);
        gp2p_probe::load(&path).unwrap_or_else(|e| panic!("{e}"))
    }

    /// The route the engine takes between devices 0 and 1 when the driver offers P2P.
    fn route_0_to_1(transport: &Transport, asked: Route) -> Option<Route> {
        let distrusted = transport.peer_policy().is_distrusted(0, 1);
        gp2p_transport::choose(asked, false, distrusted, || Ok::<_, gp2p_transport::Error>(true)).unwrap()
    }

    #[test]
    fn auto_copies_staged_where_the_probe_finds_forced_p2p_unsafe() {
        // A patched 4090 pair with the IOMMU translating: CUDA offers P2P, copies would be zeros.
        let transport = Transport::new();
        guard_peer_routes(&transport, &fixture("4090-pair-patched-iommu-translated.json"));
        let why = transport.peer_policy().distrusted(1, 0).unwrap();
        assert!(why.contains("[UNSAFE]") && why.contains("IOMMU translates"), "{why}");
        assert_eq!(route_0_to_1(&transport, Route::Auto), Some(Route::Staged));
        assert_eq!(route_0_to_1(&transport, Route::Peer), Some(Route::Peer), "forcing Peer is the caller's call");
        // The same with a 48 GB 4090 D whose BAR1 tops out at 32 GiB.
        let transport = Transport::new();
        guard_peer_routes(&transport, &fixture("4090d-48g-pair-patched.json"));
        assert_eq!(route_0_to_1(&transport, Route::Auto), Some(Route::Staged));
    }

    #[test]
    fn auto_keeps_p2p_the_driver_enabled_itself() {
        // H100s on NixOS's stock module, IOMMU translating: the driver remaps peer MMIO itself.
        let transport = Transport::new();
        guard_peer_routes(&transport, &fixture("h100-pair-nixos-stock-iommu-translated.json"));
        assert_eq!(transport.peer_policy().distrusted(0, 1), None);
        assert_eq!(route_0_to_1(&transport, Route::Auto), Some(Route::Peer));
        // And a safe patched pair (BAR1 covers VRAM, IOMMU passthrough) keeps P2P too.
        let transport = Transport::new();
        guard_peer_routes(&transport, &fixture("4090-pair-patched-565.json"));
        assert_eq!(route_0_to_1(&transport, Route::Auto), Some(Route::Peer));
    }
}
