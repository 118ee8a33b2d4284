//! What the one-kernel two-rank exchanges ([`crate::LineExchange`], [`crate::ChunkExchange`])
//! share: the two devices, each rank's give-up flag, the checks of a call's arguments, and the
//! ordering of a call after the one before and, when either stream has work queued, of the
//! two kernels' starts.
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use gp2p_cuda::{Device, DeviceViewMut, HostAllocation, RawDevicePtr, Stream, StreamPoint};
use gp2p_kernels::{Element, ReduceOp};

use crate::{Error, Result};

/// The longest wait a kernel is given, in ns (2^62, about 146 years): longer timeouts are
/// cut to it, so the deadline (the GPU's nanosecond global timer plus the wait) fits in 64
/// bits as long as the timer reads below 3 * 2^62.
const MAX_TIMEOUT_NS: u64 = 1 << 62;

/// The kernels' wait for `timeout`, in ns, capped at [`MAX_TIMEOUT_NS`].
pub(crate) fn kernel_wait_ns(timeout: Duration) -> u64 {
    u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX).min(MAX_TIMEOUT_NS)
}

/// A two-rank all-reduce in one kernel per device, between two devices:
/// [`crate::LineExchange`] and [`crate::ChunkExchange`], for code that keeps either.
pub trait PairExchange: Sized {
    /// An exchange between `devices[0]` (rank 0) and `devices[1]` for buffers of up to
    /// `max_bytes`, whose kernels wait at most `timeout` for a peer that began the call.
    fn create(devices: [&Device; 2], max_bytes: usize, timeout: Duration) -> Result<Self>;

    /// The largest buffer, in bytes, a call may exchange.
    fn max_bytes(&self) -> usize;

    /// Whether calls can still run: false once the exchange is out of step
    /// ([`crate::Error::OutOfStep`]), when only a new one will do.
    fn is_in_step(&self) -> bool;

    /// Whether a call whose streams have work queued starts both kernels only once both
    /// streams reached it.
    fn set_start_together(&mut self, together: bool);

    /// In place on both ranks: `buf = op(own, peer)` (for avg, `divide_by` divides the sum),
    /// rank r's kernel on `streams[r]`.
    fn all_reduce<T: Element>(
        &mut self,
        bufs: [&mut DeviceViewMut<'_, T>; 2],
        streams: [&Stream; 2],
        op: ReduceOp,
        divide_by: u32,
    ) -> Result<()>;
}

/// Implements [`PairExchange`] for a type with inherent methods of the same names.
macro_rules! pair_exchange {
    ($t:ty) => {
        impl $crate::pair::PairExchange for $t {
            fn create(
                devices: [&gp2p_cuda::Device; 2],
                max_bytes: usize,
                timeout: std::time::Duration,
            ) -> $crate::Result<Self> {
                <$t>::new(devices, max_bytes, timeout)
            }
            fn max_bytes(&self) -> usize {
                <$t>::max_bytes(self)
            }
            fn is_in_step(&self) -> bool {
                <$t>::is_in_step(self)
            }
            fn set_start_together(&mut self, together: bool) {
                <$t>::set_start_together(self, together)
            }
            fn all_reduce<T: gp2p_kernels::Element>(
                &mut self,
                bufs: [&mut gp2p_cuda::DeviceViewMut<'_, T>; 2],
                streams: [&gp2p_cuda::Stream; 2],
                op: gp2p_kernels::ReduceOp,
                divide_by: u32,
            ) -> $crate::Result<()> {
                <$t>::all_reduce(self, bufs, streams, op, divide_by)
            }
        }
    };
}
pub(crate) use pair_exchange;

/// Two ranks on two devices whose kernels wait for each other, each with an area of mapped
/// pinned memory in two halves (calls alternate them) that only its kernels write.
pub(crate) struct Pair {
    pub(crate) devices: [Device; 2],
    /// Per rank: its area, both halves.
    areas: [HostAllocation; 2],
    /// Per rank: its own area and its peer's, as its device maps them.
    pub(crate) mapped: [(RawDevicePtr, RawDevicePtr); 2],
    /// Bytes of one half of an area.
    pub(crate) half_bytes: usize,
    /// The largest buffer, in bytes, a call may exchange.
    pub(crate) max_bytes: usize,
    /// Two `u32` flags, one per rank, set by a kernel that gave up.
    pub(crate) failed: HostAllocation,
    pub(crate) failed_mapped: [RawDevicePtr; 2],
    pub(crate) timeout: Duration,
    /// Per rank: the end of its last kernel, for a call on another stream to wait for.
    last: [Option<StreamPoint>; 2],
    pub(crate) start_together: bool,
    /// Whether the kernels number calls themselves, each from its device's counter: a call
    /// that enqueues one rank's kernel only then leaves the ranks out of step for good.
    pub(crate) counted: bool,
    /// Why the pair is out of step, once it is.
    out_of_step: Option<String>,
}

impl Pair {
    /// Refuses two ranks on one device for an exchange called `what`: two streams of one
    /// device may share a hardware queue that runs the two kernels one after the other, and a
    /// kernel of the other rank's grid may not fit beside the first, so each would wait out
    /// its timeout for the other.
    pub(crate) fn refuse_shared_device(devices: [&Device; 2], what: &str) -> Result<()> {
        if devices[0] == devices[1] {
            return Err(Error::InvalidArgument {
                name: "devices",
                reason: format!(
                    "both ranks on device {}: a {what} needs two devices (its two kernels must run at once)",
                    devices[0].ordinal()
                ),
            });
        }
        Ok(())
    }

    /// The pair of `devices` for an exchange called `what` (in messages) of buffers up to
    /// `max_bytes`, with areas of two `half_bytes` halves: devices that run a build of the
    /// kernels offering it, with host mapping, their kernels loaded (none may load lazily
    /// between the two ranks' launches). The caller has refused a shared device, or (tests)
    /// made sure both ranks' grids fit on it at once.
    pub(crate) fn new(
        devices: [&Device; 2],
        timeout: Duration,
        what: &str,
        (max_bytes, half_bytes): (usize, usize),
    ) -> Result<Pair> {
        if let Some(device) = devices.iter().find(|d| !d.ptx_target().runs_line_exchange()) {
            return Err(Error::InvalidArgument {
                name: "devices",
                reason: format!(
                    "device {} runs the {} build of the kernels, on which the {what} is not offered; \
                     use the DMA exchange (the collectives' default)",
                    device.ordinal(),
                    device.ptx_target().name()
                ),
            });
        }
        for device in devices {
            device.require_host_mapping()?;
            gp2p_cuda::load_all_reduce_kernels(device)?;
        }
        let failed = HostAllocation::new(devices[0], 2 * size_of::<u32>())?;
        let areas =
            [HostAllocation::new(devices[0], 2 * half_bytes)?, HostAllocation::new(devices[1], 2 * half_bytes)?];
        let (mut failed_mapped, mut mapped) = ([0; 2], [(0, 0); 2]);
        for (r, device) in devices.into_iter().enumerate() {
            failed_mapped[r] = failed.device_ptr(device)? + (r * size_of::<u32>()) as u64;
            mapped[r] = (areas[r].device_ptr(device)?, areas[1 - r].device_ptr(device)?);
        }
        Ok(Pair {
            devices: [devices[0].clone(), devices[1].clone()],
            areas,
            mapped,
            half_bytes,
            max_bytes,
            failed,
            failed_mapped,
            timeout,
            last: [None, None],
            start_together: true,
            counted: false,
            out_of_step: None,
        })
    }

    /// Whether calls can still run (see [`Error::OutOfStep`]).
    pub(crate) fn is_in_step(&self) -> bool {
        self.out_of_step.is_none()
    }

    /// Begin a call: check its arguments, and unless the buffers are empty (then it returns
    /// 0, and nothing is to be enqueued) order it with [`Pair::order`]. Returns the length.
    pub(crate) fn begin<T: Element>(
        &self,
        bufs: &[&mut DeviceViewMut<'_, T>; 2],
        streams: [&Stream; 2],
    ) -> Result<usize> {
        let len = self.check(bufs, streams)?;
        if len > 0 {
            self.order(streams)?;
        }
        Ok(len)
    }

    /// Check a call's arguments (after reporting a kernel of an earlier call that gave up,
    /// or a pair out of step): each rank's buffer and stream on its device, equal lengths,
    /// two streams, neither capturing a CUDA graph (the call takes events, which a capture
    /// refuses, and it must not enqueue one rank's kernel only), at most `max_bytes`. Returns
    /// the length.
    fn check<T: Element>(&self, bufs: &[&mut DeviceViewMut<'_, T>; 2], streams: [&Stream; 2]) -> Result<usize> {
        self.take_failure()?;
        if let Some(cause) = &self.out_of_step {
            return Err(Error::OutOfStep { cause: cause.clone() });
        }
        let len = bufs[0].len();
        const BUFFER: [&str; 2] = ["rank 0's buffer", "rank 1's buffer"];
        const STREAM: [&str; 2] = ["rank 0's stream", "rank 1's stream"];
        const RANK: [&str; 2] = ["rank 0 of the exchange", "rank 1 of the exchange"];
        for r in 0..2 {
            let (buf, stream, device) = (&bufs[r], streams[r], &self.devices[r]);
            for (what, got) in [(BUFFER[r], buf.device()), (STREAM[r], stream.device())] {
                if got != device {
                    return Err(Error::WrongDevice {
                        what,
                        got: got.ordinal(),
                        of: RANK[r],
                        expected: device.ordinal(),
                    });
                }
            }
            if buf.len() != len {
                return Err(Error::LengthMismatch { what: BUFFER[r], got: buf.len(), of: BUFFER[0], expected: len });
            }
        }
        if streams[0].is_same_as(streams[1]) {
            return Err(Error::InvalidArgument {
                name: "streams",
                reason: "both ranks on one stream: each rank's kernel waits for the other's, so they need two streams"
                    .into(),
            });
        }
        let bytes = len * size_of::<T>();
        if bytes > self.max_bytes {
            return Err(Error::ChunkTooLarge { bytes, slot_bytes: self.max_bytes });
        }
        for stream in streams {
            stream.refuse_capture()?;
        }
        Ok(len)
    }

    /// Order a call's kernels after the pair's previous call (which may have run on other
    /// streams) and, if either stream has work queued, start both only once both streams
    /// reached the call: a kernel may wait for its peer at most the timeout.
    fn order(&self, streams: [&Stream; 2]) -> Result<()> {
        for (stream, last) in streams.iter().zip(&self.last) {
            if let Some(last) = last {
                stream.wait_point(last)?;
            }
        }
        if self.start_together && !(streams[0].is_idle()? && streams[1].is_idle()?) {
            let reached = [streams[0].point()?, streams[1].point()?];
            streams[0].wait_point(&reached[1])?;
            streams[1].wait_point(&reached[0])?;
        }
        Ok(())
    }

    /// Enqueue rank 0's kernel, then rank 1's (`launch(r)` on `streams[r]`), and note where
    /// each ends on its buffer, on both areas, on the give-up flags and (`note(r, point)`) on
    /// whatever else it touches.
    ///
    /// The events of both ends are taken first: between the two launches nothing may wait
    /// for a device (creating an event can, on some drivers, wait for the device to go idle,
    /// which rank 0's kernel does only once rank 1's runs or its timeout passes). Nor may the
    /// reclaimer free memory between them (see `gp2p_cuda::pause_releases`). Should the
    /// second launch fail (or the first point not be taken), the first kernel gives up at its
    /// timeout (the queue timeout of a [`crate::ChunkExchange`]), its uses noted (or its
    /// stream waited for, by `point_from`); a pair whose kernels count calls is then out of
    /// step.
    pub(crate) fn launch_both<T: Element>(
        &mut self,
        streams: [&Stream; 2],
        bufs: [&mut DeviceViewMut<'_, T>; 2],
        mut launch: impl FnMut(usize) -> Result<()>,
        note: impl Fn(usize, &StreamPoint),
    ) -> Result<()> {
        let reserved = [streams[0].reserve_point()?, streams[1].reserve_point()?];
        let _paused = gp2p_cuda::pause_releases();
        for (r, reserved) in reserved.into_iter().enumerate() {
            if let Err(e) = launch(r) {
                if r == 1 {
                    self.fell_out_of_step(&e);
                }
                return Err(e);
            }
            let point = match streams[r].point_from(reserved) {
                Ok(point) => point,
                Err(e) => {
                    let e = Error::from(e);
                    if r == 0 {
                        self.fell_out_of_step(&e);
                    }
                    return Err(e);
                }
            };
            bufs[r].note_use(&point);
            note(r, &point);
            for used in [&self.areas[0], &self.areas[1], &self.failed] {
                used.uses().note(&point);
            }
            self.last[r] = Some(point);
        }
        Ok(())
    }

    /// A call enqueued rank 0's kernel and not rank 1's: if the kernels count calls, the
    /// ranks are out of step from now on.
    fn fell_out_of_step(&mut self, cause: &Error) {
        if self.counted {
            self.out_of_step = Some(cause.to_string());
        }
    }

    /// Report (once) a kernel of an earlier call that gave up waiting for its peer.
    fn take_failure(&self) -> Result<()> {
        let flags = self.failed.host_ptr().cast::<AtomicU32>();
        for rank in 0..2 {
            // SAFETY: `failed` holds two aligned u32 of pinned memory that kernels write
            // with plain stores; atomics on the host side read them without tearing.
            let flag = unsafe { &*flags.add(rank) };
            if flag.swap(0, Ordering::AcqRel) != 0 {
                return Err(Error::PeerTimeout { rank, peer: 1 - rank, timeout: self.timeout });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_waits_are_exact_up_to_the_cap_and_capped_beyond() {
        assert_eq!(kernel_wait_ns(Duration::from_secs(5)), 5_000_000_000);
        assert_eq!(kernel_wait_ns(Duration::from_nanos(1)), 1);
        assert_eq!(kernel_wait_ns(Duration::MAX), MAX_TIMEOUT_NS, "Duration::MAX would wrap the deadline");
        assert_eq!(kernel_wait_ns(Duration::from_secs(400 * 365 * 24 * 3600)), MAX_TIMEOUT_NS);
    }
}
