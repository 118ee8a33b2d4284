//! `LineExchange`: a small two-rank all-reduce in one kernel per rank, through lines of mapped
//! pinned host memory that carry their own sequence number (no DMA, no event between ranks).
#![allow(unsafe_code)]

use std::time::Duration;

use gp2p_cuda::raw::{self, ExchangeLines};
use gp2p_cuda::{Device, DeviceViewMut, Stream};
use gp2p_kernels::{Element, ReduceOp, exchange_line_bytes, next_exchange_seq};

use crate::Result;
use crate::pair::{Pair, kernel_wait_ns};

/// How long a rank's kernel waits for its peer's data before it gives up, by default.
pub const DEFAULT_PEER_TIMEOUT: Duration = Duration::from_secs(5);

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
/// the next call returns [`crate::Error::PeerTimeout`]. When either stream has work queued, the
/// two kernels start only once both streams reached the call, so queued work never counts
/// against the timeout.
///
/// Lifetime: the lines outlive the kernels by the lifetime rule (each call notes its points).
/// `Send`; calls take `&mut self`.
pub struct LineExchange {
    /// The devices, and per rank its lines (the pair's area), both halves.
    pair: Pair,
    counter: u64,
}

impl LineExchange {
    /// Lines for buffers of up to `max_bytes` between `devices[0]` (rank 0) and `devices[1]`.
    /// The two devices must differ: each rank's kernel waits for the other's, and two
    /// streams of one device may share a hardware queue that runs them one after the other.
    pub fn new(devices: [&Device; 2], max_bytes: usize, timeout: Duration) -> Result<Self> {
        Pair::refuse_shared_device(devices, "line exchange")?;
        Self::on(devices, max_bytes, timeout)
    }

    /// Both ranks on `device`, for tests of the kernels where there is one GPU (each rank's
    /// kernel is one block). Calls must use two streams created one after the other
    /// (hardware queues are handed out in turn), and should not start together
    /// ([`Self::set_start_together`]); a pair that cannot run at once still ends in the
    /// timeout, not a hang.
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn sharing_a_device_for_tests(device: &Device, max_bytes: usize, timeout: Duration) -> Result<Self> {
        Self::on([device, device], max_bytes, timeout)
    }

    fn on(devices: [&Device; 2], max_bytes: usize, timeout: Duration) -> Result<Self> {
        let half_bytes = exchange_line_bytes(max_bytes.max(1));
        let pair = Pair::new(devices, timeout, "line exchange", (max_bytes, half_bytes))?;
        Ok(LineExchange { pair, counter: 0 })
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
        self.pair.start_together = together;
    }

    /// The largest buffer, in bytes, a call may exchange.
    pub fn max_bytes(&self) -> usize {
        self.pair.max_bytes
    }

    /// Always true: the host numbers the calls, so a call that enqueued one kernel only
    /// costs that kernel a timeout and leaves later calls in step.
    pub fn is_in_step(&self) -> bool {
        self.pair.is_in_step()
    }

    /// The devices of rank 0 and rank 1.
    pub fn devices(&self) -> [&Device; 2] {
        [&self.pair.devices[0], &self.pair.devices[1]]
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
        let len = self.pair.begin(&bufs, streams)?;
        if len == 0 {
            return Ok(());
        }
        let seq = next_exchange_seq(&mut self.counter);
        let half = ((seq & 1) as usize * self.pair.half_bytes) as u64;
        let timeout_ns = kernel_wait_ns(self.pair.timeout);
        let (mapped, failed) = (self.pair.mapped, self.pair.failed_mapped);
        let raw_bufs = [bufs[0].raw_ptr(), bufs[1].raw_ptr()];
        let launch = |r: usize| {
            let (own, peer) = mapped[r];
            let lines = ExchangeLines {
                out_lines: own + half,
                in_lines: peer + half,
                failed: failed[r],
                broken: 0,
                numbering: raw::Numbering::Given,
            };
            // SAFETY: the buffer is `len` elements on the stream's device (checked above);
            // both halves hold exchange_line_bytes(max_bytes) >= what `len` needs, are
            // 256-aligned mapped pinned memory that only rank r writes (`own`), and outlive
            // the kernels by the points `launch_both` notes right after each launch; `failed`
            // is rank r's own u32.
            unsafe {
                raw::exchange(
                    streams[r],
                    raw::InOut::in_place(raw_bufs[r]),
                    len,
                    T::DTYPE,
                    op,
                    lines,
                    seq,
                    divide_by,
                    timeout_ns,
                    None,
                )
            }
            .map_err(Into::into)
        };
        self.pair.launch_both(streams, bufs, launch, |_, _| ())?;
        Ok(())
    }
}

crate::pair::pair_exchange!(LineExchange);

impl std::fmt::Debug for LineExchange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "LineExchange(devices {} and {}, up to {} bytes, call {})",
            self.pair.devices[0].ordinal(),
            self.pair.devices[1].ordinal(),
            self.pair.max_bytes,
            self.counter
        )
    }
}
