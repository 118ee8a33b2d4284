//! Ring collectives over pinned host memory, for GPUs that cannot reach each other.
//!
//! - [`schedule`]: ring reduce-scatter, all-gather, all-reduce and broadcast as plain data
//!   (Thakur, Rabenseifner, Gropp 2005), each segment cut into chunks that flow around the
//!   ring as a pipeline, and for two ranks and small buffers an all-reduce that exchanges
//!   them in one step; proven on host buffers, and the same data drives the GPU.
//! - [`legs`]: collectives as legs (one rank hands a byte range to one or every other rank,
//!   in rounds): the two-shot all-reduce, reduce-scatter, all-gather, broadcast and send,
//!   proven on host buffers, and [`legs::steps`], the pipeline both executors run: the
//!   one-process-per-GPU communicator (`gp2p-comm`, flags in shared memory) and the
//!   [`Engine`] here (stream points). The ring's schedules convert to legs
//!   ([`schedule::Schedule::to_rounds`]), which is how the model prices them.
//! - [`pipeline`]: which one an in-process collective runs, the ring's transfers or the
//!   legs, by the cost model (from three ranks the legs).
//! - [`cost`]: the cost model that picks ring, one-shot or two-shot per size from the
//!   machine's rates (`GP2P_ALGORITHM` forces one). `gp2p plan` prints it, and the
//!   one-process-per-GPU communicator (`gp2p-comm`) takes its choice between its one-shot and
//!   two-shot among 3 to 8 ranks, the in-process engine ([`pipeline`]) between the ring and
//!   the two-shot legs.
//! - [`hosts`]: the cost of an all-reduce across several hosts, two-level against one flat
//!   ring, from the same rates and the network's (`gp2p plan --hosts`).
//! - [`Engine`]: runs a pipeline on GPUs — per rank a send stream and a receive stream, a
//!   staging ring per ring edge or a fan-out of slots per writer (legs), and stream points at
//!   chunk granularity.
//! - [`all_reduce`], [`all_gather`], [`reduce_scatter`], [`broadcast`]: checked entry points.
//!   The receive path ([`Receive`]) folds chunks in through a VRAM scratch
//!   ([`Receive::Scratch`]) or with a kernel that reads the staged chunk from mapped host
//!   memory ([`Receive::ZeroCopy`]); [`Receive::Auto`] measures both once per device and
//!   takes the faster.
//!
//! Not here: reading peers directly where every pair has P2P; every collective stages
//! through pinned host memory. With the `testing` feature, several logical ranks may share
//! one GPU.
//!
//! Stream semantics: each rank's part starts after the work already enqueued on its stream,
//! work enqueued there later sees the result, and the host does not wait (the first call
//! on a device with [`Receive::Auto`] measures the two receive paths once, blocking).
//!
//! (The example needs a CUDA GPU, so `cargo test` compiles it without running it.)
//! ```no_run
//! use gp2p_collectives::{Engine, Rank, Receive, all_reduce};
//! use gp2p_cuda::{Device, DeviceBuffer, Stream};
//! use gp2p_kernels::ReduceOp;
//!
//! // Sum one buffer per GPU in place, on every GPU there is.
//! fn sum_everywhere() -> Result<Vec<Vec<f32>>, gp2p_collectives::Error> {
//!     let devices: Vec<Device> = (0..Device::count()?).map(Device::open).collect::<Result<_, _>>()?;
//!     if devices.is_empty() {
//!         return Ok(Vec::new());
//!     }
//!     let streams: Vec<Stream> = devices.iter().map(Stream::new).collect::<Result<_, _>>()?;
//!     let mut buffers: Vec<DeviceBuffer<f32>> = streams
//!         .iter()
//!         .enumerate()
//!         .map(|(r, s)| DeviceBuffer::from_host(s, &vec![r as f32 + 1.0; 1000]))
//!         .collect::<Result<_, _>>()?;
//!     let engine = Engine::new();
//!     let mut ranks: Vec<Rank<'_, f32>> =
//!         buffers.iter_mut().zip(&streams).map(|(b, s)| Rank { buffer: b.view_mut(..), stream: s }).collect();
//!     all_reduce(&engine, &mut ranks, ReduceOp::Sum, Receive::Auto)?;
//!     drop(ranks);
//!     Ok(buffers.iter().zip(&streams).map(|(b, s)| b.to_host_vec(s)).collect::<Result<_, _>>()?)
//! }
//! match sum_everywhere() {
//!     // n GPUs holding 1, 2, ..., n: every element becomes n(n + 1)/2 everywhere.
//!     Ok(all) => {
//!         let n = all.len() as f32;
//!         assert!(all.iter().flatten().all(|&v| v == n * (n + 1.0) / 2.0));
//!     }
//!     Err(e) if e.is_unavailable() => println!("no GPU here: {e}"),
//!     Err(e) => panic!("{e}"),
//! }
//! ```
//!
//! The schedules alone, on the host:
//!
//! ```
//! use gp2p_collectives::schedule::Schedule;
//!
//! // Three ranks sum their buffers; every rank ends with the total.
//! let schedule = Schedule::all_reduce(3, 10, 4);
//! let mut buffers = vec![vec![1u64; 10], vec![2; 10], vec![4; 10]];
//! schedule.run_on_host(&mut buffers, |d, s, _last| d + s);
//! assert!(buffers.iter().all(|b| b.iter().all(|&v| v == 7)));
//! ```

// No unsafe here: raw driver calls go through gp2p_cuda::raw and the safe APIs above it.
#![forbid(unsafe_code)]

mod calibrate;
mod compressed;
pub mod cost;
mod env;
mod error;
mod exec;
/// One-shot and two-shot as moves through each rank's host area, phase by phase: no executor
/// runs them; they are the oracle the cost model's byte and phase counts are tested against.
#[cfg(test)]
mod host_schedule;
pub mod hosts;
pub mod legs;
pub mod pipeline;
pub mod reference;
pub mod schedule;

pub use gp2p_cuda::codec::WireFormat;
use gp2p_cuda::{Device, DeviceView};
use gp2p_kernels::{DType, Element, ReduceOp};
use gp2p_pinned::LineExchange;

pub use error::{Error, Result};
pub use exec::{
    CACHED_SLOTS, CHUNK_EXCHANGE_MAX_BYTES, CHUNK_EXCHANGE_MAX_VAR, Engine, LINE_EXCHANGE_MAX_BYTES,
    LINE_EXCHANGE_WINS_UP_TO, MULTI_DEVICE_MAX_CHUNK_BYTES, MULTI_DEVICE_TARGET_CHUNKS, Rank,
};
use pipeline::Pipeline;
use schedule::segment;
pub use schedule::{Collective, EXCHANGE_MAX_BYTES, EXCHANGE_MAX_VAR};

/// The receive path: how a receiving rank folds a staged chunk into its buffer.
///
/// The chunk sits in a slot of pinned, device-mapped host memory. [`Receive::Scratch`] lands
/// it in VRAM by DMA and folds it there; [`Receive::ZeroCopy`] has the kernel read the slot
/// across PCIe itself (the *zero-copy* path, named so from here down to the kernels' launch
/// shape: `gp2p_pinned::Fold::ZeroCopy`, `gp2p_cuda::SourceMemory::ZeroCopy`). Copy-only
/// collectives (all-gather, broadcast) always land by DMA and ignore it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Receive {
    /// The library's choice: the in-process engine measures both paths once per device and
    /// uses the faster; the one-process-per-GPU communicator folds landings of at most 256 KiB
    /// in place and larger ones from a scratch (`gp2p_comm::ZERO_COPY_MAX_LANDING`).
    #[default]
    Auto,
    /// Host-to-device DMA into a VRAM scratch, then the reduce kernel.
    Scratch,
    /// Zero-copy: the reduce kernel reads the staged chunk from mapped pinned host memory.
    ZeroCopy,
}

impl Receive {
    /// Every receive path, in the order the CLI lists them.
    pub const ALL: [Receive; 3] = [Receive::Auto, Receive::Scratch, Receive::ZeroCopy];

    /// The name the CLI (`--transport`), Python (`transport=`) and reports use: `auto`,
    /// `scratch`, `zero-copy`.
    pub fn name(self) -> &'static str {
        match self {
            Receive::Auto => "auto",
            Receive::Scratch => "scratch",
            Receive::ZeroCopy => "zero-copy",
        }
    }
}

impl std::fmt::Display for Receive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A string that names no [`Receive`] path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown receive path {given:?}: expected auto, scratch or zero-copy")]
pub struct UnknownReceive {
    /// What was given.
    pub given: String,
}

impl std::str::FromStr for Receive {
    type Err = UnknownReceive;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Receive::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| UnknownReceive { given: s.to_owned() })
    }
}

/// In place: every rank's buffer becomes `op` over all ranks' buffers (avg divides by the
/// number of ranks), the same value on every rank. One buffer per device, equal lengths;
/// n = 1 and empty buffers are valid no-ops. Two ranks with a small buffer (up to
/// [`EXCHANGE_MAX_BYTES`]) exchange it in one step (rank 0 folds `op(x0, x1)`, rank 1
/// `op(x1, x0)`: bitwise the same, as IEEE sums and products commute, except that a float
/// min or max of +0 and -0 may keep a different zero on each rank); otherwise the pipeline
/// [`pipeline::choose`] picks runs: the ring (reduce-scatter, then all-gather) for two ranks,
/// and from three the cheaper of the ring and the legs of two-shot (`GP2P_ALGORITHM` or
/// [`Engine::with_algorithm`] forces one).
pub fn all_reduce<T: Element>(
    engine: &Engine,
    ranks: &mut [Rank<'_, T>],
    op: ReduceOp,
    receive: Receive,
) -> Result<()> {
    let (len, devices) = check_ranks(ranks, "buffer")?;
    let bytes = len * size_of::<T>();
    // A forced algorithm runs as forced: the exchanges are neither the ring nor the legs.
    let forced = engine.forced_algorithm()?.is_some();
    if ranks.len() == 2
        && bytes > 0
        && !forced
        && spans_devices(&devices)
        && devices.iter().all(LineExchange::supported_on)
    {
        if bytes <= engine.line_exchange_max() {
            return engine.exchange_lines(ranks, &devices, op);
        }
        if bytes <= engine.chunk_exchange_max() {
            return engine.exchange_chunks(ranks, &devices, op);
        }
    }
    run(engine, ranks, &devices, Collective::AllReduce, op, receive)
}

/// Every rank's `output` (n × input length) becomes the concatenation of all ranks' inputs,
/// in rank order.
pub fn all_gather<T: Element>(
    engine: &Engine,
    inputs: &[DeviceView<'_, T>],
    outputs: &mut [Rank<'_, T>],
    receive: Receive,
) -> Result<()> {
    let n = outputs.len();
    let (out_len, devices) = check_ranks(outputs, "output")?;
    check_inputs(inputs, outputs, out_len / n.max(1), "input")?;
    if out_len != n * inputs.first().map_or(0, DeviceView::len) {
        return Err(Error::WrongLength { rank: 0, what: "output", got: out_len, expected: n * inputs[0].len() });
    }
    // Each rank's own input goes into its own segment, on its own stream, first.
    for (r, (input, out)) in inputs.iter().zip(outputs.iter_mut()).enumerate() {
        let own = segment(n, out_len, r);
        out.buffer.slice_mut(own).copy_from(out.stream, input)?;
    }
    run(engine, outputs, &devices, Collective::AllGather, ReduceOp::Sum, receive)
}

/// Rank r's `output` becomes `op` over segment r of all ranks' `inputs` (input length =
/// n × output length). Inputs are left unchanged (the ring works in an engine-held copy).
pub fn reduce_scatter<T: Element>(
    engine: &Engine,
    inputs: &[DeviceView<'_, T>],
    outputs: &mut [Rank<'_, T>],
    op: ReduceOp,
    receive: Receive,
) -> Result<()> {
    let n = outputs.len();
    let (out_len, devices) = check_ranks(outputs, "output")?;
    check_inputs(inputs, outputs, n * out_len, "input")?;
    let in_len = n * out_len;
    let mut work = Vec::with_capacity(n);
    for (r, (input, out)) in inputs.iter().zip(outputs.iter()).enumerate() {
        let mut buf = engine.take_work::<T>(&devices, r, in_len, out.stream)?;
        buf.view_mut(..in_len).copy_from(out.stream, input)?;
        work.push(buf);
    }
    {
        let mut ranks: Vec<Rank<'_, T>> = work
            .iter_mut()
            .zip(outputs.iter())
            .map(|(buf, out)| Rank { buffer: buf.view_mut(..in_len), stream: out.stream })
            .collect();
        run(engine, &mut ranks, &devices, Collective::ReduceScatter, op, receive)?;
    }
    for (r, (buf, out)) in work.iter().zip(outputs.iter_mut()).enumerate() {
        out.buffer.copy_from(out.stream, &buf.view(segment(n, in_len, r)))?;
    }
    for (r, buf) in work.into_iter().enumerate() {
        engine.put_work(&devices, r, buf)?;
    }
    Ok(())
}

/// In place, compressed: every rank's buffer becomes the sum (or average) of all ranks'
/// buffers with fewer bytes through host memory, each value sent as a code of one byte in
/// blocks that share a scale (`format`: int8 or fp8 e4m3, 32 to 256 values a block). The
/// result is `gp2p_kernels::compress::all_reduce`'s, bit for bit, the same on every rank, and
/// each element is within `gp2p_kernels::compress::error_bound` of the exact sum; blocks with
/// NaN or an infinity, and tiny ones, travel exact (docs/compression.md has the scheme and its
/// bound). Sum and avg of f32, f16 and bf16 only; never chosen by itself: call it where the
/// error is acceptable. One rank keeps its buffer as it is (nothing travels). Not capturable
/// into a CUDA graph, like the engine's other collectives.
///
/// Each rank's link carries its wire up and the folded wires down, about a quarter (from f32)
/// or half (from f16, bf16) of [`all_reduce`]'s bytes, in rounds that overlap both
/// directions; the wires sit in pinned host memory the group keeps (about N + 1 times a
/// buffer's wire in all).
pub fn all_reduce_compressed<T: Element>(
    engine: &Engine,
    ranks: &mut [Rank<'_, T>],
    op: ReduceOp,
    format: WireFormat,
) -> Result<()> {
    let compressible = matches!(T::DTYPE, DType::F32 | DType::F16 | DType::BF16);
    if !compressible || !matches!(op, ReduceOp::Sum | ReduceOp::Avg) {
        return Err(Error::NotCompressible { op, dtype: T::DTYPE });
    }
    let (len, devices) = check_ranks(ranks, "buffer")?;
    if ranks.len() == 1 || len == 0 {
        return Ok(());
    }
    engine.run_compressed(ranks, &devices, op, format)
}

/// Every rank's buffer becomes a copy of the `root` rank's.
pub fn broadcast<T: Element>(engine: &Engine, ranks: &mut [Rank<'_, T>], root: usize, receive: Receive) -> Result<()> {
    let (_, devices) = check_ranks(ranks, "buffer")?;
    if root >= ranks.len() {
        return Err(Error::BadRoot { root, ranks: ranks.len() });
    }
    run(engine, ranks, &devices, Collective::Broadcast { root }, ReduceOp::Sum, receive)
}

/// Whether the ranks' buffers are on more than one device (several cards' DMAs then run
/// through host memory at once; logical ranks share one).
pub(crate) fn spans_devices(devices: &[Device]) -> bool {
    devices.iter().any(|d| d != &devices[0])
}

/// Run `collective` in place over `ranks` (checked, of one length, on `devices`): the
/// schedule of the engine's staging for it, executed. What every entry point ends with.
fn run<T: Element>(
    engine: &Engine,
    ranks: &mut [Rank<'_, T>],
    devices: &[Device],
    collective: Collective,
    op: ReduceOp,
    receive: Receive,
) -> Result<()> {
    let len = ranks.first().map_or(0, |r| r.buffer.len());
    let staging = engine.staging_for(len * size_of::<T>(), devices);
    let forced = engine.forced_algorithm()?;
    match pipeline::choose::<T>(collective, ranks.len(), len, Some(staging.chunk_bytes), forced) {
        Pipeline::Ring(schedule) => engine.execute(ranks, devices, &schedule, staging.slots, op, receive),
        Pipeline::Legs(rounds) => engine.execute_rounds(ranks, devices, &rounds, staging, op, receive),
    }
}

/// Same length everywhere, streams on their buffers' devices, one buffer per device (unless
/// logical ranks are enabled for tests). Returns the common length and the devices, in rank
/// order.
fn check_ranks<T: Element>(ranks: &[Rank<'_, T>], what: &'static str) -> Result<(usize, Vec<Device>)> {
    let first = ranks.first().ok_or(Error::NoRanks)?;
    let len = first.buffer.len();
    for (r, rank) in ranks.iter().enumerate() {
        let (stream, buffer) = (rank.stream.device().ordinal(), rank.buffer.device().ordinal());
        if stream != buffer {
            return Err(Error::StreamDevice { rank: r, stream, buffer });
        }
        if rank.buffer.len() != len {
            return Err(Error::WrongLength { rank: r, what, got: rank.buffer.len(), expected: len });
        }
    }
    // Before anything is enqueued: a collective captured into a CUDA graph would replay its
    // DMAs into staging slots the engine has since reused (or, once the engine is dropped,
    // handed to another owner), with no record of the replays.
    for rank in ranks {
        rank.stream.refuse_capture()?;
    }
    let devices: Vec<Device> = ranks.iter().map(|r| r.buffer.device().clone()).collect();
    if !cfg!(feature = "testing") {
        one_rank_per_device(&devices.iter().map(Device::ordinal).collect::<Vec<_>>())?;
    }
    Ok((len, devices))
}

/// Refuses a device that holds two ranks' buffers (the ring would run two ranks' traffic
/// over one link and count it as two).
fn one_rank_per_device(ordinals: &[usize]) -> Result<()> {
    for (second, device) in ordinals.iter().enumerate() {
        if let Some(first) = ordinals[..second].iter().position(|d| d == device) {
            return Err(Error::SharedDevice { device: *device, first, second });
        }
    }
    Ok(())
}

/// `n` inputs of `len` elements, each on the device of the rank with its index.
fn check_inputs<T: Element>(
    inputs: &[DeviceView<'_, T>],
    outputs: &[Rank<'_, T>],
    len: usize,
    what: &'static str,
) -> Result<()> {
    let n = outputs.len();
    if inputs.len() != n {
        return Err(Error::WrongLength {
            rank: inputs.len().min(n),
            what: "inputs (count)",
            got: inputs.len(),
            expected: n,
        });
    }
    for (r, (input, output)) in inputs.iter().zip(outputs).enumerate() {
        if input.len() != len {
            return Err(Error::WrongLength { rank: r, what, got: input.len(), expected: len });
        }
        if input.device() != output.buffer.device() {
            return Err(Error::InputDevice {
                rank: r,
                input: input.device().ordinal(),
                output: output.buffer.device().ordinal(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn receive_names_round_trip() {
        for t in Receive::ALL {
            assert_eq!(t.to_string().parse::<Receive>(), Ok(t));
        }
        assert_eq!("Zero-Copy".parse::<Receive>(), Ok(Receive::ZeroCopy));
        let err = "zerocopy".parse::<Receive>().unwrap_err();
        assert!(err.to_string().contains("zero-copy"), "{err}");
    }

    #[test]
    fn two_ranks_on_one_device_are_refused() {
        assert_eq!(one_rank_per_device(&[0, 1, 2]), Ok(()));
        let err = one_rank_per_device(&[3, 1, 3]).unwrap_err();
        assert_eq!(err, Error::SharedDevice { device: 3, first: 0, second: 2 });
        assert!(err.to_string().contains("testing"), "the message names the test-only way out: {err}");
    }
}
