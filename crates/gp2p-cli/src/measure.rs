//! Timing with CUDA events, and the ceilings every benchmark is compared against.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use geforce_p2p::cuda::trace::{self, TracedCall};
use geforce_p2p::cuda::{Error as CudaError, HostGate};
use geforce_p2p::kernels::reference::fill_random;
use geforce_p2p::ops::{copy_from_host, copy_to_host};
use geforce_p2p::pinned::round_trip;
use geforce_p2p::transport::plan::{DEFAULT_SLOTS, MAX_CHUNK_BYTES};
use geforce_p2p::{Device, DeviceBuffer, Event, EventKind, PinnedBuffer, ReduceOp, Stream, StreamFork};

/// Kernel, D2H and H2D triples in one timed run of [`Ceilings::op_latency_us`].
pub const OP_TRIPLES: usize = 16;

use crate::error::CliError;

/// Transfers per direction of the duplex ceiling: enough that its middle half is steady.
pub const DUPLEX_TRANSFERS: usize = 64;

/// How many runs to time, after how many untimed ones.
#[derive(Debug, Clone, Copy)]
pub struct Repeats {
    pub warmup: usize,
    pub timed: usize,
}

/// How long a timed run's stream is held while its body is enqueued, at most: an enqueue
/// that blocks longer (the driver's queue full behind the held stream) would otherwise
/// never finish. Such a run is reported (its GPU time then includes host time).
const GATE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(2);

/// Run `body` `warmup + timed` times on `stream`, each after an untimed `setup`, and return
/// the median GPU time of the timed runs in seconds. Each timed run starts on an idle GPU
/// with its stream held until the body is enqueued, so host-side gaps do not inflate small
/// timings and the enqueue time is the host's own (not back-pressure from earlier runs).
pub fn median_seconds(
    stream: &Stream,
    repeats: Repeats,
    setup: impl FnMut() -> Result<(), CliError>,
    body: impl FnMut() -> Result<(), CliError>,
) -> Result<f64, CliError> {
    Ok(timed_runs(stream, repeats, setup, body)?.gpu_seconds)
}

/// Medians of one operation's GPU time and of the host time its enqueueing took.
#[derive(Debug, Clone)]
pub struct Timing {
    pub gpu_seconds: f64,
    pub enqueue_seconds: f64,
    /// With [`set_tracing`] on: the driver calls of one more enqueue, made after the timed
    /// runs and in the same way (not among them).
    pub trace: Option<Vec<TracedCall>>,
}

static TRACING: AtomicBool = AtomicBool::new(false);

/// Have every [`timed_runs`] trace the driver calls of one more enqueue (`--trace`).
pub fn set_tracing(on: bool) {
    TRACING.store(on, Ordering::Relaxed);
}

thread_local! {
    /// The host time of the operation a body timed with [`time_op`], if it did.
    static OP_TIME: Cell<Option<Duration>> = const { Cell::new(None) };
}

/// Run `op` inside a timed body and take its host time as the run's enqueue time, instead
/// of the whole body's: for bodies that also enqueue the bench's own bookkeeping (the
/// collective bench's events that start the ranks together and join them at the end).
pub fn time_op<R>(op: impl FnOnce() -> R) -> R {
    trace::mark("(operation begins)");
    let t0 = Instant::now();
    let out = op();
    OP_TIME.with(|time| time.set(Some(t0.elapsed())));
    trace::mark("(operation ends)");
    out
}

/// As [`median_seconds`], also timing on the host how long each `body` call took to return
/// (or its operation, where the body times one with [`time_op`]).
pub fn timed_runs(
    stream: &Stream,
    repeats: Repeats,
    mut setup: impl FnMut() -> Result<(), CliError>,
    mut body: impl FnMut() -> Result<(), CliError>,
) -> Result<Timing, CliError> {
    let device = stream.device();
    let mut marks = Vec::with_capacity(repeats.timed);
    let mut host = Vec::with_capacity(repeats.timed);
    let mut traced = None;
    let tracing = TRACING.load(Ordering::Relaxed);
    let runs = repeats.warmup + repeats.timed + usize::from(tracing);
    for i in 0..runs {
        setup()?;
        if i < repeats.warmup {
            body()?;
            continue;
        }
        let trace_this = i == repeats.warmup + repeats.timed;
        let (start, end) = (Event::new(device, EventKind::Timing)?, Event::new(device, EventKind::Timing)?);
        // Start from an idle device, so the enqueue below is not slowed by the driver's
        // queue still holding earlier runs.
        device.synchronize()?;
        // Hold the stream until the body is enqueued, so the host's enqueueing time does
        // not count as GPU time (it is reported separately).
        let gate = HostGate::close_until(stream, GATE_DEADLINE)?;
        start.record(stream)?;
        OP_TIME.with(|time| time.set(None));
        if trace_this {
            trace::start();
        }
        let t0 = Instant::now();
        let result = body();
        let whole = t0.elapsed();
        if trace_this {
            traced = Some(trace::finish());
        } else {
            host.push(OP_TIME.with(Cell::take).unwrap_or(whole).as_secs_f64());
        }
        end.record(stream)?;
        if gate.expired() {
            eprintln!("warning: enqueueing one run took over {GATE_DEADLINE:?}; its GPU time includes host time");
        }
        gate.open();
        result?;
        if !trace_this {
            marks.push((start, end));
        }
    }
    stream.synchronize()?;
    let mut gpu = marks
        .iter()
        .map(|(s, e)| Event::elapsed_ms(s, e).map(|ms| f64::from(ms) / 1e3))
        .collect::<Result<Vec<f64>, CudaError>>()?;
    Ok(Timing { gpu_seconds: median(&mut gpu), enqueue_seconds: median(&mut host), trace: traced })
}

/// Print a traced enqueue ([`Timing::trace`]) as comment lines under a table: each mark's
/// host time since the previous one, which is the driver call plus the code before it.
pub fn print_trace(label: &str, calls: &[TracedCall]) {
    let total: u64 = calls.iter().map(|call| call.gap_ns).sum();
    println!(
        "# driver calls of one more enqueue, {label}: {:.2} us in all (us since the previous mark)",
        total as f64 / 1e3
    );
    for call in calls {
        println!("#   {:>8.2}  {}", call.gap_ns as f64 / 1e3, call.name);
    }
}

/// Each direction's rate over the middle half of a duplex pass (`marks[d][i]` is the end of
/// transfer i, `marks[d][0]` the start), once its work is done.
fn duplex_rates(marks: &[Vec<Event>; 2], bytes: usize) -> Result<[f64; 2], CliError> {
    let transfers = DUPLEX_TRANSFERS;
    let (from, to) = (transfers / 4, transfers - transfers / 4);
    let mut rates = [0.0; 2];
    for (rate, m) in rates.iter_mut().zip(marks) {
        let ms = Event::elapsed_ms(&m[from], &m[to])?;
        *rate = gbps((to - from) * bytes, f64::from(ms) / 1e3);
    }
    Ok(rates)
}

/// What [`duplex_all_at_once`] measured.
#[derive(Debug, Clone)]
pub struct AllAtOnce {
    /// Per card, the median `[d2h, h2d]` rate of the middle halves of its own passes.
    pub cards: Vec<[f64; 2]>,
    /// Each way, the median over the passes of every card's bytes over the time from the
    /// earliest card's first transfer to the latest card's last: what the cards carried
    /// together. Where the cards share a link whose copy engines run their passes one after
    /// another rather than side by side, each card's own rate is the whole link's and their sum
    /// counts it once a card; this does not. Meaningful where the cards are streams of one
    /// device, whose events share a clock (`duplex_shared`); across devices, pairs whose time
    /// cannot be read are skipped.
    pub in_all: [f64; 2],
}

/// The duplex passes of [`Ceilings::duplex`] on every card in `cards` at once: before each
/// pass every device is idle, and each card's stream is held until every card's pass is
/// enqueued, so they all start together and run side by side through host memory (one card:
/// [`Ceilings::duplex`] itself).
pub fn duplex_all_at_once(cards: &mut [Ceilings<'_>]) -> Result<AllAtOnce, CliError> {
    let Some(first) = cards.first() else {
        return Ok(AllAtOnce { cards: Vec::new(), in_all: [0.0; 2] });
    };
    let repeats = first.repeats;
    let mut setups = Vec::with_capacity(cards.len());
    for c in cards.iter() {
        let bytes = MAX_CHUNK_BYTES.min(c.a.len() / DUPLEX_TRANSFERS).max(1);
        let fork = StreamFork::new(c.device, 2)?;
        let slots = PinnedBuffer::<u8>::alloc(c.device, bytes * DEFAULT_SLOTS)?;
        setups.push((fork, slots, bytes));
    }
    let mut rates: Vec<[Vec<f64>; 2]> = cards.iter().map(|_| [Vec::new(), Vec::new()]).collect();
    let mut in_all: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    for pass in 0..repeats.warmup.min(1) + repeats.timed.max(1) {
        for c in cards.iter() {
            c.device.synchronize()?;
        }
        let gates =
            cards.iter().map(|c| HostGate::close_until(c.stream, GATE_DEADLINE)).collect::<Result<Vec<_>, _>>()?;
        let mut marks = Vec::with_capacity(cards.len());
        for (c, (fork, slots, bytes)) in cards.iter_mut().zip(setups.iter_mut()) {
            marks.push(c.duplex_enqueue(fork, slots, *bytes)?);
        }
        // Open every gate at once: the cards start together.
        drop(gates);
        for c in cards.iter() {
            c.stream.synchronize()?;
        }
        if pass < repeats.warmup.min(1) {
            continue;
        }
        for ((card_marks, (_, _, bytes)), card_rates) in marks.iter().zip(&setups).zip(rates.iter_mut()) {
            let [d2h, h2d] = duplex_rates(card_marks, *bytes)?;
            card_rates[0].push(d2h);
            card_rates[1].push(h2d);
        }
        let moved: usize = setups.iter().map(|(_, _, bytes)| bytes * DUPLEX_TRANSFERS).sum();
        for (dir, rates) in in_all.iter_mut().enumerate() {
            let ms = span_ms(&marks, dir);
            rates.push(if ms > 0.0 { gbps(moved, ms / 1e3) } else { f64::NAN });
        }
    }
    Ok(AllAtOnce {
        cards: rates.iter_mut().map(|[d2h, h2d]| [median(d2h), median(h2d)]).collect(),
        in_all: in_all.map(|mut r| median(&mut r)),
    })
}

/// Milliseconds from the earliest card's first mark to the latest card's last one in direction
/// `dir` (0 D2H, 1 H2D): the largest time from any card's start to any card's end, so no mark
/// needs to come after another for its time to be read.
fn span_ms(marks: &[[Vec<Event>; 2]], dir: usize) -> f64 {
    let mut span: f64 = 0.0;
    for from in marks {
        for to in marks {
            if let (Some(start), Some(end)) = (from[dir].first(), to[dir].last())
                && let Ok(ms) = Event::elapsed_ms(start, end)
            {
                span = span.max(f64::from(ms));
            }
        }
    }
    span
}

/// The fewest bytes each of several duplex passes at once on one device moves: each takes its
/// share of the one pass's bytes, but no less than this, so its transfers stay at least 4 MiB
/// (a 64th of it). Eight passes then hold twice the one pass's memory (2 GiB pinned for 1 GiB).
const SHARED_PASS_MIN_BYTES: usize = 256 << 20;

/// What `passes` duplex passes at once on one device, each on streams of its own and started
/// together ([`duplex_all_at_once`]), carry each way in all, GB/s (the mean of the two ways'
/// [`AllAtOnce::in_all`]), beside one pass's [`Ceilings::duplex`]: what as many ranks'
/// pipelines sharing the GPU can have of its link together. The passes are streams of this
/// one process; ranks are processes under an MPS daemon, whose copies reach the same copy
/// engines through it. (Summing each pass's own rate instead read 7.65 times one pass's
/// duplex for eight passes on one H100, more than its link carries: the passes had not all run
/// side by side.)
pub fn duplex_shared(device: &Device, passes: usize, bytes: usize, repeats: Repeats) -> Result<f64, CliError> {
    let per_pass = (bytes / passes.max(1)).max(SHARED_PASS_MIN_BYTES);
    let streams = (0..passes).map(|_| Stream::new(device)).collect::<Result<Vec<_>, _>>()?;
    let mut cards =
        streams.iter().map(|s| Ceilings::new(device, s, per_pass, repeats)).collect::<Result<Vec<_>, _>>()?;
    let [d2h, h2d] = duplex_all_at_once(&mut cards)?.in_all;
    Ok((d2h + h2d) / 2.0)
}

/// The median of `values` (the mean of the middle two for an even count).
pub fn median(values: &mut [f64]) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 { values[mid] } else { (values[mid - 1] + values[mid]) / 2.0 }
}

fn gbps(bytes: usize, seconds: f64) -> f64 {
    bytes as f64 / seconds / 1e9
}

/// Ceilings measured on one device with `bytes`-sized transfers of fresh random data.
pub struct Ceilings<'a> {
    device: &'a Device,
    stream: &'a Stream,
    repeats: Repeats,
    host: PinnedBuffer<u8>,
    a: DeviceBuffer<u8>,
    b: DeviceBuffer<u8>,
    pub measured: BTreeMap<&'static str, f64>,
}

impl<'a> Ceilings<'a> {
    pub fn new(device: &'a Device, stream: &'a Stream, bytes: usize, repeats: Repeats) -> Result<Self, CliError> {
        let mut host = PinnedBuffer::<u8>::alloc(device, bytes)?;
        fill_random(host.as_mut_slice()?, 0xCE11);
        let mut a = DeviceBuffer::<u8>::alloc(device, bytes)?;
        let b = DeviceBuffer::<u8>::alloc(device, bytes)?;
        copy_from_host(stream, &host.view(..), &mut a.view_mut(..))?;
        Ok(Ceilings { device, stream, repeats, host, a, b, measured: BTreeMap::new() })
    }

    /// Device-to-device copy in VRAM, bytes read plus bytes written per second.
    pub fn d2d(&mut self) -> Result<f64, CliError> {
        let (stream, a, b) = (self.stream, &self.a, &mut self.b);
        let t = median_seconds(
            stream,
            self.repeats,
            || Ok(()),
            || b.view_mut(..).copy_from(stream, &a.view(..)).map(drop).map_err(Into::into),
        )?;
        let rate = gbps(2 * a.len(), t);
        self.measured.insert("d2d", rate);
        Ok(rate)
    }

    /// Pinned host to device DMA, one direction alone.
    pub fn h2d(&mut self) -> Result<f64, CliError> {
        let (stream, host, a) = (self.stream, &self.host, &mut self.a);
        let t = median_seconds(
            stream,
            self.repeats,
            || Ok(()),
            || Ok(copy_from_host(stream, &host.view(..), &mut a.view_mut(..))?),
        )?;
        let rate = gbps(a.len(), t);
        self.measured.insert("h2d", rate);
        Ok(rate)
    }

    /// Device to pinned host DMA, one direction alone.
    pub fn d2h(&mut self) -> Result<f64, CliError> {
        let (stream, host, a) = (self.stream, &mut self.host, &self.a);
        let t = median_seconds(
            stream,
            self.repeats,
            || Ok(()),
            || Ok(copy_to_host(stream, &a.view(..), &mut host.view_mut(..))?),
        )?;
        let rate = gbps(a.len(), t);
        self.measured.insert("d2h", rate);
        Ok(rate)
    }

    /// Both directions of the link at once, in steady state. [`DUPLEX_TRANSFERS`] DMAs of
    /// the staged pipeline's largest chunk are queued in each direction on two streams that
    /// start together; both directions cycle through as many host slots as a staging ring
    /// has, so the host memory traffic is the pipeline's (uploads read recently written
    /// memory), not that of two 1 GiB streams. Each direction's rate is taken over its middle
    /// half of transfers only (the first and last may run alone while the other direction
    /// starts or drains), as the median of the timed passes (one pass can dip while the
    /// machine is busy elsewhere, and a dipped ceiling puts a copy above 1.0); the ceiling is
    /// the mean of the two directions: half the link's two-way throughput.
    pub fn duplex(&mut self) -> Result<f64, CliError> {
        // One card is the all-cards measurement of a single card: the same passes, started
        // from an idle device with the stream held until the pass is enqueued.
        let [d2h, h2d] = duplex_all_at_once(std::slice::from_mut(self))?.cards[0];
        // A copy moves equal bytes each way, so its per-direction ceiling is half of what
        // the link carries both ways together (measured: D2H 48.9 with H2D 51.7 beside it,
        // while a pipeline pacing both directions equally ran 49.7 each way).
        let ceiling = (d2h + h2d) / 2.0;
        self.measured.insert("duplex_d2h", d2h);
        self.measured.insert("duplex_h2d", h2d);
        self.measured.insert("duplex", ceiling);
        Ok(ceiling)
    }

    /// Enqueue one duplex pass after the work on this card's stream, joined back into it;
    /// returns each direction's marks (the start, then the end of each transfer).
    fn duplex_enqueue(
        &mut self,
        fork: &StreamFork,
        slots: &mut PinnedBuffer<u8>,
        bytes: usize,
    ) -> Result<[Vec<Event>; 2], CliError> {
        let (device, transfers, host_slots) = (self.device, DUPLEX_TRANSFERS, DEFAULT_SLOTS);
        let streams = fork.fork(self.stream)?;
        let mut marks: [Vec<Event>; 2] = [Vec::new(), Vec::new()];
        for (dir, stream) in streams.iter().enumerate() {
            let first = Event::new(device, EventKind::Timing)?;
            first.record(stream)?;
            marks[dir].push(first);
            for i in 0..transfers {
                let dev = i * bytes..(i + 1) * bytes;
                let slot = (i % host_slots) * bytes..(i % host_slots + 1) * bytes;
                if dir == 0 {
                    copy_to_host(stream, &self.a.view(dev), &mut slots.view_mut(slot))?;
                } else {
                    // Reads the slots the other direction writes, as a pipeline's uploads
                    // read what its downloads just landed (no ordering: only time matters).
                    let ahead = ((i + host_slots / 2) % host_slots) * bytes;
                    copy_from_host(stream, &slots.view(ahead..ahead + bytes), &mut self.b.view_mut(dev))?;
                }
                let e = Event::new(device, EventKind::Timing)?;
                e.record(stream)?;
                marks[dir].push(e);
            }
        }
        fork.join(self.stream)?;
        Ok(marks)
    }

    /// Median time in µs of one dependent operation of a pipeline's chunk step
    /// (`Machine::op_us`): [`OP_TRIPLES`] times in turn on one stream a reduce kernel over
    /// `bytes` and a `bytes` D2H then H2D of its result, each waiting for the one before, over
    /// the number of operations. What a chunk step pays for each of its kernels and copies is
    /// such a switch, with the bytes too few to matter.
    pub fn op_latency_us(&mut self, bytes: usize) -> Result<f64, CliError> {
        let (stream, host, a, b) = (self.stream, &mut self.host, &mut self.a, &mut self.b);
        let t = median_seconds(
            stream,
            self.repeats,
            || Ok(()),
            || {
                for _ in 0..OP_TRIPLES {
                    geforce_p2p::cuda::reduce(stream, &mut b.view_mut(..bytes), &a.view(..bytes), ReduceOp::Max, 1)?;
                    round_trip(stream, &b.view(..bytes), &mut host.view_mut(..bytes), &mut a.view_mut(..bytes))?;
                }
                Ok(())
            },
        )?;
        Ok(t * 1e6 / (3 * OP_TRIPLES) as f64)
    }

    /// Median time in µs of one `bytes` D2H followed by one `bytes` H2D on one stream, as
    /// bare DMAs (no bookkeeping events): what a small staged copy cannot beat.
    pub fn pair_latency_us(&mut self, bytes: usize) -> Result<f64, CliError> {
        let (stream, host, a, b) = (self.stream, &mut self.host, &self.a, &mut self.b);
        let t = median_seconds(
            stream,
            self.repeats,
            || Ok(()),
            || Ok(round_trip(stream, &a.view(..bytes), &mut host.view_mut(..bytes), &mut b.view_mut(..bytes))?),
        )?;
        Ok(t * 1e6)
    }
}
