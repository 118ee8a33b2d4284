//! `Transport`: the cross-device copy engine — route choice, the staged pipeline, and the
//! per-pair state (staging ring, internal streams) it reuses across calls.

use std::collections::HashMap;
use std::sync::Arc;

use gp2p_cuda::{Device, DeviceView, DeviceViewMut, Event, EventKind, Stream, StreamFork};
use gp2p_kernels::Element;
use gp2p_pinned::{Fold, RingCache};
use parking_lot::Mutex;

use crate::plan::{Chunking, SINGLE_CHUNK_MAX_BYTES};
use crate::route::choose;
use crate::{Error, PeerPolicy, Result, Route};

/// Options of one copy. `Default` is what most callers want.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CopyOptions {
    /// Which way to go; [`Route::Auto`] by default.
    pub route: Route,
    /// Override the chunk size of the staged pipeline (bytes).
    pub chunk_bytes: Option<usize>,
    /// Override the number of staging slots.
    pub slots: Option<usize>,
}

/// The copy engine. Holds, per ordered device pair, a staging ring and internal streams,
/// created on first use and reused by later calls; `Send + Sync`, and calls on one pair are
/// serialised (their order is what the ring's events encode).
///
/// Stream semantics of [`Transport::copy`]: the copy starts after the work enqueued so far
/// on both callers' streams, work enqueued later on either stream sees its result, the host
/// is not blocked, and back-to-back copies need no host synchronisation (slot reuse is
/// fenced on the GPU).
///
/// `Route::Auto` leaves P2P alone on pairs its [`PeerPolicy`] distrusts
/// ([`Transport::peer_policy`]).
#[derive(Default)]
pub struct Transport {
    pairs: Mutex<PairMap>,
    pub(crate) policy: PeerPolicy,
}

/// Per ordered (source, destination) ordinal pair, its state, locked per call.
type PairMap = HashMap<(usize, usize), Arc<Mutex<Pair>>>;

/// What a pair of devices keeps between calls.
struct Pair {
    ring: RingCache,
    /// On one device: one fork of two streams (up, down). Across two: one stream each.
    src_fork: StreamFork,
    dst_fork: Option<StreamFork>,
    /// Recorded on the destination caller's stream before the copy, so reading `src` also
    /// waits for that stream's earlier work.
    dst_started: Event,
    /// Recorded on the source caller's stream before a direct copy, which runs on the
    /// destination caller's stream (and before an empty one).
    src_ready: Event,
    peer_both_ways: Option<bool>,
}

impl Transport {
    /// An engine with no pairs yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Copy `src` into `dst`: on one device or between two, by the route `options` asks
    /// for. `src_stream` must be on `src`'s device and `dst_stream` on `dst`'s (they may be
    /// the same stream on one device). Bad input is refused before any work is enqueued.
    /// Returns the route taken.
    pub fn copy<T: Element>(
        &self,
        src: &DeviceView<'_, T>,
        src_stream: &Stream,
        dst: &mut DeviceViewMut<'_, T>,
        dst_stream: &Stream,
        options: CopyOptions,
    ) -> Result<Route> {
        let (src_dev, dst_dev) = (src.device().clone(), dst.device().clone());
        let sides = [("src_stream", "src", &src_dev, src_stream), ("dst_stream", "dst", &dst_dev, dst_stream)];
        for (what, view, view_dev, stream) in sides {
            if stream.device() != view_dev {
                return Err(Error::StreamDevice {
                    stream: what,
                    got: stream.device().ordinal(),
                    view,
                    expected: view_dev.ordinal(),
                });
            }
        }
        if src.len() != dst.len() {
            return Err(Error::LengthMismatch { src: src.len(), dst: dst.len() });
        }
        let same_device = src_dev == dst_dev;
        if same_device {
            let (s, d) = (src.byte_range(), dst.byte_range());
            if gp2p_cuda::byte_ranges_overlap(&s, &d) {
                return Err(Error::Overlap { device: src_dev.ordinal(), src: s, dst: d });
            }
        }
        Chunking::check_overrides(options.chunk_bytes, options.slots)?;
        // Before anything is enqueued: a staged copy captured into a CUDA graph would replay
        // its DMAs into ring slots reused since (or handed to another owner once the
        // transport is dropped), with no record of the replays.
        src_stream.refuse_capture()?;
        if !src_stream.is_same_as(dst_stream) {
            dst_stream.refuse_capture()?;
        }
        let pair = self.pair(&src_dev, &dst_dev)?;
        let mut pair = pair.lock();
        let distrusted = self.policy.is_distrusted(src_dev.ordinal(), dst_dev.ordinal());
        let route = choose(options.route, same_device, distrusted, || pair.peer_both_ways(&src_dev, &dst_dev))?
            .ok_or(Error::NoPeerAccess { src: src_dev.ordinal(), dst: dst_dev.ordinal() })?;
        if src.is_empty() {
            // Nothing moves, but the call still orders the two streams like any copy: each
            // one's later work follows the other's earlier work.
            if !src_stream.is_same_as(dst_stream) {
                order_after(dst_stream, src_stream, &pair.src_ready)?;
                order_after(src_stream, dst_stream, &pair.dst_started)?;
            }
            return Ok(route);
        }
        match route {
            Route::Staged => pair.staged(src, src_stream, dst, dst_stream, options)?,
            _ => pair.direct(src, src_stream, dst, dst_stream)?,
        }
        Ok(route)
    }

    fn pair(&self, src: &Device, dst: &Device) -> Result<Arc<Mutex<Pair>>> {
        let mut pairs = self.pairs.lock();
        if let Some(p) = pairs.get(&(src.ordinal(), dst.ordinal())) {
            return Ok(p.clone());
        }
        let (src_fork, dst_fork) = if src == dst {
            (StreamFork::new(src, 2)?, None)
        } else {
            (StreamFork::new(src, 1)?, Some(StreamFork::new(dst, 1)?))
        };
        let pair = Arc::new(Mutex::new(Pair {
            ring: RingCache::new(),
            src_fork,
            dst_fork,
            dst_started: Event::new(dst, EventKind::Sync)?,
            src_ready: Event::new(src, EventKind::Sync)?,
            peer_both_ways: None,
        }));
        pairs.insert((src.ordinal(), dst.ordinal()), pair.clone());
        Ok(pair)
    }
}

impl Pair {
    fn peer_both_ways(&mut self, a: &Device, b: &Device) -> Result<bool> {
        if let Some(known) = self.peer_both_ways {
            return Ok(known);
        }
        let both = a.can_access_peer(b)? && b.can_access_peer(a)?;
        if both {
            a.enable_peer_access(b)?;
            b.enable_peer_access(a)?;
        }
        self.peer_both_ways = Some(both);
        Ok(both)
    }

    /// One DMA: device-to-device on one card, peer-to-peer across two. Runs on dst_stream,
    /// after src_stream's earlier work; src_stream's later work waits for it.
    fn direct<T: Element>(
        &mut self,
        src: &DeviceView<'_, T>,
        src_stream: &Stream,
        dst: &mut DeviceViewMut<'_, T>,
        dst_stream: &Stream,
    ) -> Result<()> {
        let distinct = !src_stream.is_same_as(dst_stream);
        if distinct {
            order_after(dst_stream, src_stream, &self.src_ready)?;
        }
        let copied = dst.copy_from(dst_stream, src)?;
        if distinct {
            // An empty copy enqueues nothing, but orders the two streams all the same.
            let point = match copied {
                Some(point) => point,
                None => dst_stream.point()?,
            };
            src_stream.wait_point(&point)?;
        }
        Ok(())
    }

    /// The pipelined copy through the staging ring.
    fn staged<T: Element>(
        &mut self,
        src: &DeviceView<'_, T>,
        src_stream: &Stream,
        dst: &mut DeviceViewMut<'_, T>,
        dst_stream: &Stream,
        options: CopyOptions,
    ) -> Result<()> {
        let chunking = Chunking::for_bytes(src.bytes(), options.chunk_bytes, options.slots);
        let plan = chunking.plan(src.len(), size_of::<T>());
        // Slots fit the largest chunk, but never less than a small copy's worth, so a sweep
        // of small copies does not replace the ring at every size.
        let chunk_bytes = (plan.per_chunk().min(src.len()) * size_of::<T>()).max(SINGLE_CHUNK_MAX_BYTES);
        let ring = self.ring.ensure(src.device(), dst.device(), chunking.slots, chunk_bytes)?;
        let distinct = !src_stream.is_same_as(dst_stream);
        if plan.count() == 1 {
            // One chunk: no pipeline to overlap, so no fork either — the two DMAs go on the
            // callers' own streams, the least latency a small copy can have.
            if src.device() == dst.device() {
                // Both DMAs on the source stream: a GPU-side hop between streams costs about
                // as much as a 4 KiB DMA. The destination stream's earlier work is waited
                // for only if some is still pending, and it waits for the copy through the
                // slot's own `free` event rather than one more record.
                if distinct {
                    order_after(src_stream, dst_stream, &self.dst_started)?;
                }
                let slot = ring.next_slot();
                let done = ring.relay(slot, src_stream, src, dst)?;
                if distinct {
                    dst_stream.wait_point(&done)?;
                }
                return Ok(());
            }
            // Across two cards: the D2H on the source stream, the H2D on the destination's,
            // and the source stream's later work waits for the slot's *free* point, which
            // completes with the H2D (no record of its own).
            order_after(src_stream, dst_stream, &self.dst_started)?;
            let done = ring.pass(src_stream, src, dst_stream, dst, Fold::Copy)?;
            src_stream.wait_point(&done)?;
            return Ok(());
        }
        // Up (D2H) and down (H2D) on different streams, so the copy engines run both ways.
        let callers: Vec<&Stream> = if distinct { vec![src_stream, dst_stream] } else { vec![src_stream] };
        let (up, down) = match &self.dst_fork {
            None => {
                let streams = self.src_fork.fork_after(&callers)?;
                (&streams[0], &streams[1])
            }
            Some(dst_fork) => {
                let down = &dst_fork.fork(dst_stream)?[0];
                let up = &self.src_fork.fork(src_stream)?[0];
                // Reading src also waits for the destination caller's earlier work.
                order_after(up, dst_stream, &self.dst_started)?;
                (up, down)
            }
        };
        let mut result = Ok(());
        for chunk in plan.chunks() {
            result = ring.pass(up, &src.slice(chunk.clone()), down, &mut dst.slice_mut(chunk), Fold::Copy).map(drop);
            if result.is_err() {
                break;
            }
        }
        // Join even after a failure, so the callers' later work (freeing the buffers, say)
        // still waits for whatever was enqueued.
        let joined = self.src_fork.join_into(&callers);
        let joined_dst = self.dst_fork.as_ref().map_or(Ok(()), |f| f.join_into(&callers));
        result?;
        joined?;
        joined_dst?;
        Ok(())
    }
}

/// Make `later` wait for the work enqueued on `earlier` so far, through `event` (of
/// `earlier`'s device). Across devices, not if that work is already done: there the GPU-side
/// hop is the dearer, and the host's query (about 2 us) the cheaper. On one device the hop is
/// always taken: it added 0.1-0.2 us of GPU time to a small staged copy on one H200, where
/// the query cost the host 1.2-1.6 us more than the hop's record and wait
/// (`benches/results/queries-h200/` at 9fbcbfe).
fn order_after(later: &Stream, earlier: &Stream, event: &Event) -> Result<()> {
    if later.device() == earlier.device() || !earlier.is_idle()? {
        event.record(earlier)?;
        later.wait(event)?;
    }
    Ok(())
}
