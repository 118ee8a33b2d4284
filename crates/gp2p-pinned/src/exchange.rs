//! `LineExchange`: a small two-rank all-reduce in one kernel per rank, through lines of mapped
//! pinned host memory that carry their own sequence number (no DMA, no event between ranks).
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use gp2p_cuda::raw::{self, ExchangeLines};
use gp2p_cuda::{Device, DeviceViewMut, HostAllocation, RawDevicePtr, Stream, StreamPoint};
use gp2p_kernels::{Element, ReduceOp, exchange_line_bytes, next_exchange_seq};

use crate::{Error, Result};

/// How long a rank's kernel waits for its peer's data before it gives up, by default.
pub const DEFAULT_PEER_TIMEOUT: Duration = Duration::from_secs(5);

/// The longest wait a kernel is given, in ns (2^62, about 146 years): longer timeouts are
/// cut to it, so the deadline (the GPU's nanosecond global timer plus the wait) fits in 64
/// bits as long as the timer reads below 3 * 2^62.
const MAX_TIMEOUT_NS: u64 = 1 << 62;

/// The kernels' wait for `timeout`, in ns, capped at [`MAX_TIMEOUT_NS`].
fn kernel_wait_ns(timeout: Duration) -> u64 {
    u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX).min(MAX_TIMEOUT_NS)
}

/// The state of small two-rank all-reduces between two devices: each rank's lines (two halves,
/// used by calls of odd and even sequence numbers) and the sequence counter.
///
/// One call launches one kernel per rank. Rank r writes its buffer into its lines as 8-byte
/// lines of 4 data bytes and the call's number, reads the peer's lines until their numbers
/// match, and folds `buf = op(own, peer)` (own first on both ranks, as the ring's two-rank
/// exchange does). Alternating halves keep a call from overwriting lines the peer may still
/// be reading from the call before: rank r writes a half again only two calls later, after
/// its previous kernel saw the peer's data of the call between, which the peer published
/// only after finishing the read.
///
/// Waits are bounded: a kernel that waits longer than the timeout for its peer (a peer whose
/// stream never reaches the collective) stops, leaving that call's buffer partly folded, and
/// the next call returns [`Error::PeerTimeout`]. When either stream has work queued, the
/// two kernels start only once both streams reached the call, so queued work never counts
/// against the timeout.
///
/// Lifetime: the lines outlive the kernels by the lifetime rule (each call notes its points).
/// `Send`; calls take `&mut self`.
pub struct LineExchange {
    devices: [Device; 2],
    /// Per rank: its lines, both halves.
    lines: [HostAllocation; 2],
    /// Per rank: its own lines and its peer's, as its device maps them.
    mapped: [(RawDevicePtr, RawDevicePtr); 2],
    /// Two `u32` flags, one per rank, set by a kernel that gave up.
    failed: HostAllocation,
    failed_mapped: [RawDevicePtr; 2],
    half_bytes: usize,
    max_bytes: usize,
    counter: u64,
    timeout: Duration,
    /// Per rank: the end of its last kernel, for a call on another stream to wait for.
    last: [Option<StreamPoint>; 2],
    start_together: bool,
}

impl LineExchange {
    /// Lines for buffers of up to `max_bytes` between `devices[0]` (rank 0) and `devices[1]`.
    /// The two devices must differ: each rank's kernel waits for the other's, and two
    /// streams of one device may share a hardware queue that runs them one after the other.
    pub fn new(devices: [&Device; 2], max_bytes: usize, timeout: Duration) -> Result<Self> {
        if devices[0] == devices[1] {
            return Err(Error::InvalidArgument {
                name: "devices",
                reason: format!(
                    "both ranks on device {}: a line exchange needs two devices (its two kernels must run at once)",
                    devices[0].ordinal()
                ),
            });
        }
        if let Some(device) = devices.iter().find(|d| !LineExchange::supported_on(d)) {
            return Err(Error::InvalidArgument {
                name: "devices",
                reason: format!(
                    "device {} runs the {} build of the kernels, on which the line exchange is not offered; \
                     use the DMA exchange (the collectives' default)",
                    device.ordinal(),
                    device.ptx_target().name()
                ),
            });
        }
        let half_bytes = exchange_line_bytes(max_bytes.max(1));
        for device in devices {
            device.require_host_mapping()?;
            // No kernel may be loaded lazily between the two ranks' launches.
            gp2p_cuda::load_all_reduce_kernels(device)?;
        }
        let lines =
            [HostAllocation::new(devices[0], 2 * half_bytes)?, HostAllocation::new(devices[1], 2 * half_bytes)?];
        let failed = HostAllocation::new(devices[0], 2 * size_of::<u32>())?;
        let mut mapped = [(0, 0); 2];
        let mut failed_mapped = [0; 2];
        for r in 0..2 {
            let device = devices[r];
            mapped[r] = (lines[r].device_ptr(device)?, lines[1 - r].device_ptr(device)?);
            failed_mapped[r] = failed.device_ptr(device)? + (r * size_of::<u32>()) as u64;
        }
        Ok(LineExchange {
            devices: [devices[0].clone(), devices[1].clone()],
            lines,
            mapped,
            failed,
            failed_mapped,
            half_bytes,
            max_bytes,
            counter: 0,
            timeout,
            last: [None, None],
            start_together: true,
        })
    }

    /// Whether `device` may take part in a line exchange: only where it runs a build of the
    /// kernels that offers it ([`gp2p_cuda::PtxTarget::runs_line_exchange`]).
    pub fn supported_on(device: &Device) -> bool {
        device.ptx_target().runs_line_exchange()
    }

    /// Whether a call whose streams have work queued starts both kernels only once both
    /// streams reached it (the default). With `false` each kernel starts when its own stream
    /// gets there, saving two GPU-side waits, and the timeout bounds how long it may wait for
    /// the other: for callers that know both streams arrive together, and for tests.
    pub fn set_start_together(&mut self, together: bool) {
        self.start_together = together;
    }

    /// The largest buffer, in bytes, a call may exchange.
    pub fn max_bytes(&self) -> usize {
        self.max_bytes
    }

    /// The devices of rank 0 and rank 1.
    pub fn devices(&self) -> [&Device; 2] {
        [&self.devices[0], &self.devices[1]]
    }

    /// In place on both ranks: `buf = op(own, peer)` (for avg, `divide_by` divides the sum:
    /// pass 2). Rank r's kernel runs on `streams[r]`, after the work queued there, and later
    /// work there sees the result. The two streams must differ (each kernel waits for the
    /// other), and each must be on its rank's device.
    pub fn all_reduce<T: Element>(
        &mut self,
        bufs: [&mut DeviceViewMut<'_, T>; 2],
        streams: [&Stream; 2],
        op: ReduceOp,
        divide_by: u32,
    ) -> Result<()> {
        self.take_failure()?;
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
        if len == 0 {
            return Ok(());
        }
        for (stream, last) in streams.iter().zip(&self.last) {
            if let Some(last) = last {
                stream.wait_point(last)?;
            }
        }
        // A kernel may wait for its peer at most the timeout: if either stream has work
        // queued, start both only once both reached this point.
        if self.start_together && !(streams[0].is_idle()? && streams[1].is_idle()?) {
            let reached = [streams[0].point()?, streams[1].point()?];
            streams[0].wait_point(&reached[1])?;
            streams[1].wait_point(&reached[0])?;
        }
        let seq = next_exchange_seq(&mut self.counter);
        let half = ((seq & 1) as usize * self.half_bytes) as u64;
        let timeout_ns = kernel_wait_ns(self.timeout);
        // Events for the two points, taken now: between the two launches nothing may wait
        // for a device (creating an event can, on some drivers, wait for the device to go
        // idle, which rank 0's kernel does only once rank 1's runs or its timeout passes).
        let reserved = [streams[0].reserve_point()?, streams[1].reserve_point()?];
        // Nor may the reclaimer free memory between them: see `pause_releases`.
        let _paused = gp2p_cuda::pause_releases();
        for (r, reserved) in reserved.into_iter().enumerate() {
            let (own, peer) = self.mapped[r];
            let lines = ExchangeLines {
                out_lines: own + half,
                in_lines: peer + half,
                failed: self.failed_mapped[r],
                broken: 0,
                numbering: raw::Numbering::Given,
            };
            // SAFETY: the buffer is `len` elements on the stream's device (checked above);
            // both halves hold exchange_line_bytes(max_bytes) >= what `len` needs, are
            // 256-aligned mapped pinned memory that only rank r writes (`own`), and outlive
            // the kernels by the points noted right after each launch; `failed` is rank r's
            // own u32. Both ranks' kernels are enqueued in this loop (should the second
            // launch fail, the first gives up at its timeout, its uses already noted).
            unsafe {
                raw::exchange(streams[r], bufs[r].raw_ptr(), len, T::DTYPE, op, lines, seq, divide_by, timeout_ns)?
            };
            let point = streams[r].point_from(reserved)?;
            bufs[r].note_use(&point);
            self.lines[0].uses().note(&point);
            self.lines[1].uses().note(&point);
            self.failed.uses().note(&point);
            self.last[r] = Some(point);
        }
        Ok(())
    }

    /// Report (once) a kernel of an earlier call that gave up waiting for its peer.
    fn take_failure(&mut self) -> Result<()> {
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

impl std::fmt::Debug for LineExchange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "LineExchange(devices {} and {}, up to {} bytes, call {})",
            self.devices[0].ordinal(),
            self.devices[1].ordinal(),
            self.max_bytes,
            self.counter
        )
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
