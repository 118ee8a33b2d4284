//! `gp2p bench comm <collective> --ranks N`: the one-process-per-GPU communicator
//! (`geforce_p2p::comm::Communicator`) among N processes, as torchrun, vLLM, sglang and the NCCL
//! door run it. This process is rank 0: it measures the duplex ceiling while the link is idle,
//! then starts the other ranks (itself again, told their rank in `GP2P_BENCH_COMM_RANK`, see the `ranks` module); rank r runs
//! on GPU r modulo the GPUs visible, so on a machine of one GPU every rank shares its link
//! (run an MPS daemon, or the processes take turns in time slices).
//!
//! Every rank checks its own result of each size against a fold of every rank's input (the
//! inputs come from seeds, so each knows them all); rank 0 adds the counts. A timed run is
//! `--calls` calls back to back on every rank (the ranks start together: a host barrier
//! through the communicator's segment first), timed on rank 0 with events; its time per call
//! is the run's, and the median over `-n` runs is the row's.
//!
//! The bound of a row is what the bytes need at the duplex rate D: on rank 0's link, its k
//! ranks (those sharing its GPU) each move f·S each way, f = 2(N−1)/N for all-reduce and
//! (N−1)/N for the others (S the buffer, the whole one for all-gather and reduce-scatter, as
//! nccl-tests counts), so `bound = k·f·S / D` and `ratio = bound / time`.
//!
//! `all-reduce --compress int8|fp8 [--block N]` times the compressed all-reduce
//! (`Communicator::all_reduce_compressed`): every rank's result must equal the CPU reference's
//! bits, the row adds rank 0's error against the exact result, and its bound counts the wire's
//! scales and codes in place of S.

use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use geforce_p2p::collectives::cost::Machine;
use geforce_p2p::comm::choice::all_reduce_prediction;
use geforce_p2p::comm::{CommOptions, Communicator, Compression, FlagWaits, MAX_RANKS, UniqueId, WireFormat};
use geforce_p2p::kernels::compress::Scheme;
use geforce_p2p::kernels::reference::{Reference, count_mismatched, count_wrong_vs_fold, fill_random};
use geforce_p2p::{Device, DeviceBuffer, Event, EventKind, ReduceOp, Stream, with_element};

use super::compressed::{
    CompressArgs, Compressed, comm_compressed_header, count_unequal_bits, deviation_from_exact, scaled_wire_bytes,
};
use super::ranks::{as_child, start_ranks};
use super::{CEILING_BYTES, Common, finish, progress, rows_table};
use crate::error::CliError;
use crate::flags::{AlgorithmFlag, DTypeFlag, OpFlag, ReceiveFlag};
use crate::measure::{Ceilings, median};
use crate::report::{Report, Row};
use crate::sizes::format_size;

/// How long a rank waits for the others to join, and a call for its peers: generous, since
/// ranks sharing a GPU without MPS take turns in time slices.
const WAIT: Duration = Duration::from_secs(300);

/// Which collective.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CommCollective {
    AllReduce,
    AllGather,
    ReduceScatter,
    Broadcast,
}

impl CommCollective {
    fn name(self) -> &'static str {
        match self {
            CommCollective::AllReduce => "all_reduce",
            CommCollective::AllGather => "all_gather",
            CommCollective::ReduceScatter => "reduce_scatter",
            CommCollective::Broadcast => "broadcast",
        }
    }

    /// Bytes each rank moves each way, per byte of the buffer: f of the module's bound.
    fn per_rank_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self {
            CommCollective::AllReduce => 2.0 * (n - 1.0) / n,
            _ => (n - 1.0) / n,
        }
    }

    /// nccl-tests' busbw = algbw × this factor.
    fn bus_factor(self, n: usize) -> f64 {
        match self {
            CommCollective::Broadcast => 1.0,
            other => other.per_rank_factor(n),
        }
    }
}

#[derive(Args)]
pub struct CommArgs {
    /// The collective.
    #[arg(value_enum)]
    collective: CommCollective,
    #[command(flatten)]
    common: Common,
    /// Number of ranks, one process each (1 to 8).
    #[arg(long, default_value_t = 2)]
    ranks: usize,
    /// Reduction (all-reduce, reduce-scatter).
    #[arg(long, value_enum, default_value = "sum")]
    op: OpFlag,
    /// Element type.
    #[arg(long, value_enum, default_value = "f32")]
    dtype: DTypeFlag,
    /// Calls back to back in each timed run.
    #[arg(long, default_value_t = 20)]
    calls: usize,
    /// Bytes of one slot of the communicator's pipeline (K, M, G suffixes), instead of
    /// `CommOptions::for_world`'s: for tuning it (every rank gets the same). A value equal to
    /// the default counts as the default: two ranks with --compress take 32 MiB instead, and a
    /// small /dev/shm makes it smaller (`gp2p_comm::fit_slot_to_shm`).
    #[arg(long, value_parser = crate::sizes::parse_size)]
    slot_bytes: Option<usize>,
    /// Slots per rank of that pipeline, instead of the default (four among more than two
    /// ranks; where /dev/shm has not the room for four of the default slot, three larger ones
    /// are made, the given value 4 counting as the default).
    #[arg(long)]
    slots: Option<usize>,
    /// The largest all-reduce the one-kernel path takes (K, M suffixes; 1 byte to 16M),
    /// instead of the default (4M between two ranks, 1M among 3 to 8; among more, or with
    /// --many-chunks off, the lines' size caps it): for finding where the pipeline overtakes
    /// it on this machine (every rank gets the same).
    #[arg(long, value_parser = crate::sizes::parse_size)]
    small_max_bytes: Option<usize>,
    /// Among 3 to 8 ranks, whether all-reduces above the lines up to --small-max-bytes run as
    /// the two-shot in one flagged-chunk kernel per rank (on, the default there; the flag
    /// alone says on) or as the rounds (off). GP2P_MANY_CHUNKS, where set, overrides it (the
    /// header's "one kernel up to" says which ran).
    #[arg(long, value_name = "on|off", num_args = 0..=1, default_missing_value = "on",
          value_parser = clap::builder::BoolishValueParser::new())]
    many_chunks: Option<bool>,
    /// Bytes of each chunk of the pipeline (K, M, G suffixes; at most a slot), instead of
    /// sizing two ranks' exchange by the message and the rounds' chunks a slot: for tuning
    /// (every rank gets the same).
    #[arg(long, value_parser = crate::sizes::parse_size)]
    chunk_bytes: Option<usize>,
    /// How each rank folds a chunk that lands in its slots: zero-copy (read in place across
    /// the link) or scratch (a DMA into device memory first); auto leaves it to
    /// GP2P_RECEIVE, else zero-copy for landings up to 256 KiB and scratch above.
    #[arg(long, value_enum, default_value = "auto")]
    receive: ReceiveFlag,
    /// The all-reduce to force: one-shot (the line kernel, where the buffer fits its lines;
    /// between two ranks above the one-kernel sizes, the exchange) or two-shot (the rounds);
    /// unset leaves it to GP2P_ALGORITHM, else the cost model (and two ranks on one GPU to the
    /// rounds, two on GPUs of their own to the exchange).
    #[arg(long, value_enum)]
    algorithm: Option<AlgorithmFlag>,
    #[command(flatten)]
    compress: CompressArgs,
    /// After each size's timed runs, one more call with every step stamped on the GPU: each
    /// rank writes its stamps to DIR/timeline-<size>-rank<r>.json, and rank 0 prints its own
    /// summed by stream and step under the table (where a call's time goes; the stamps slow
    /// it, so the row's time stays the untraced one).
    #[arg(long, value_name = "DIR")]
    timeline: Option<std::path::PathBuf>,
    /// How the pipeline waits for a peer's flags: kernel (the bounded wait kernel, the
    /// default), watched (stream memory operations that the communicator's watchdog ends
    /// after the peer timeout) or unbounded (stream memory operations that nothing ends: a
    /// rank that dies hangs the others; for measuring what the kernel costs).
    #[arg(long, default_value = "kernel")]
    waits: FlagWaits,
}

pub fn run(args: &CommArgs) -> Result<(), CliError> {
    with_element!(args.dtype.0, |T| run_typed::<T>(args))
}

fn run_typed<T: Compressed>(args: &CommArgs) -> Result<(), CliError> {
    let kind = args.collective;
    let compressed =
        args.compress.wire_format(kind.name(), kind == CommCollective::AllReduce, args.op.0, args.dtype.0)?;
    let c = &args.common;
    let (sizes, repeats) = (c.sizes()?, c.repeats()?);
    if args.calls == 0 {
        return Err(CliError::Usage("--calls must be at least 1".into()));
    }
    let gpus = Device::count()?;
    let (rank, world, id, ranks, ceiling) = match as_child()? {
        Some((rank, world, id)) => (rank, world, id, None, None),
        None => {
            if !(1..=MAX_RANKS).contains(&args.ranks) {
                return Err(CliError::Usage(format!("--ranks {}: the communicator runs 1 to {MAX_RANKS}", args.ranks)));
            }
            // The ceiling first, while the link is idle.
            let device = Device::open(0)?;
            let stream = c.stream(&device)?;
            eprintln!("measuring the duplex ceiling ...");
            let mut ceil = Ceilings::new(&device, &stream, CEILING_BYTES, repeats)?;
            let duplex = ceil.duplex()?;
            let mut measured = ceil.measured.clone();
            drop(ceil);
            // Ranks sharing this GPU: what their pipelines can have of the link together (the
            // test bed's part of a gap to the bound).
            let sharing = (0..args.ranks).filter(|r| r % gpus == 0).count();
            if sharing > 1 {
                eprintln!("measuring {sharing} duplex passes at once ...");
                let shared = crate::measure::duplex_shared(&device, sharing, CEILING_BYTES, repeats)?;
                measured.insert("duplex_shared", shared);
            }
            // The model's other rates from this machine too, while nothing else runs (only
            // where rows are priced: copying DRAM takes a gigabyte of host memory).
            let here = if kind_is_priced(kind, compressed) {
                eprintln!("measuring the handoff, an operation and DRAM for the model ...");
                Measured {
                    handoff_us: crate::plan::handoff_us(0)?,
                    op_us: crate::plan::op_us(0)?,
                    dram_gbps: crate::plan::dram_gbps(0)?,
                }
            } else {
                let defaults = Machine::h200(args.ranks);
                Measured { handoff_us: defaults.handoff_us, op_us: defaults.op_us, dram_gbps: defaults.dram_gbps }
            };
            let id = UniqueId::new()?;
            let ranks = start_ranks(args.ranks, &id)?;
            (0, args.ranks, id, Some(ranks), Some((duplex, measured, here)))
        }
    };
    let device = Device::open(rank % gpus)?;
    let stream = c.stream(&device)?;
    let defaults = CommOptions::for_world(world);
    let options = CommOptions {
        peer_timeout: WAIT,
        join_timeout: WAIT,
        slot_bytes: args.slot_bytes.unwrap_or(defaults.slot_bytes),
        slots: args.slots.unwrap_or(defaults.slots),
        small_max_bytes: args.small_max_bytes.unwrap_or(defaults.small_max_bytes),
        many_chunks: args.many_chunks.unwrap_or(defaults.many_chunks),
        chunk_bytes: args.chunk_bytes,
        receive: args.receive.0,
        algorithm: args.algorithm.map(|a| a.0),
        // Compressed rows time the communicator a user who turns compression on gets (between
        // two ranks its slots four times larger), not one made for exact calls.
        compress: compressed.map(|format| Compression { format, min_bytes: None }),
        waits: args.waits,
        ..defaults
    };
    let mut comm = Communicator::new(&id, rank, world, &device, options)?;
    let sharing = (0..world).filter(|r| r % gpus == 0).count();
    let model = ceiling.as_ref().map(|&(duplex, _, here)| model_machine(world, sharing, duplex, here));
    let bar = (rank == 0).then(|| progress(sizes.len()));
    let mut rows = Vec::new();
    let mut timelines = Vec::new();
    for &bytes in &sizes {
        let duplex = ceiling.as_ref().map(|c| c.0);
        let sized = one_size::<T>(args, compressed, &mut comm, &stream, bytes, sharing, duplex, &mut timelines)?;
        let Some(mut row) = sized else {
            continue;
        };
        if let Some(machine) = &model
            && kind_is_priced(args.collective, compressed)
        {
            row.model_us = Some(all_reduce_prediction(machine, &comm.all_reduce_paths(), row.bytes).seconds * 1e6);
        }
        if let Some(bar) = &bar {
            bar.set_message(format!("{} {} x{world}", args.collective.name(), format_size(bytes)));
            bar.inc(1);
        }
        rows.push(row);
    }
    let (Some(ranks), Some((duplex, measured, _)), Some(bar)) = (ranks, ceiling, bar) else {
        return Ok(());
    };
    bar.finish_and_clear();
    ranks.finish()?;
    let shared_duplex = measured.get("duplex_shared").copied();
    let report = Report::new(&device, measured, c.iters, rows)?.on_streams(c.stream.name());
    let how = compressed.map_or_else(String::new, |f| format!(" --compress {} --block {}", f.format, f.block.get()));
    println!(
        "# gp2p bench comm {} --ranks {world} ({sharing} on rank 0's GPU){how} --op {} --dtype {} on {}, {} calls a run, medians of {} runs",
        args.collective.name(),
        args.op.0,
        args.dtype.0,
        report.gpu.name,
        args.calls,
        report.repeats
    );
    let algorithm = match comm.forced_algorithm() {
        Some(forced) => forced.name(),
        None if world == 2 && comm.all_reduce_paths().shared_link => "the rounds (two ranks on one GPU, one link)",
        None if world == 2 => "the exchange (two ranks on GPUs of their own)",
        None => "the cost model's choice",
    };
    let chunks = options.chunk_bytes.map_or_else(
        || "two ranks' exchange by the message, the rounds' a slot".to_string(),
        |bytes| format!("{} each", format_size(bytes)),
    );
    let calls = if comm.replay_counts().is_some() { "replayed from graphs (GP2P_REPLAY)" } else { "enqueued" };
    let waits = match options.waits {
        FlagWaits::Kernel => "bounded kernels",
        FlagWaits::Watched => "stream memory operations, watched (--waits watched)",
        FlagWaits::Unbounded => "unbounded stream memory operations (--waits unbounded)",
    };
    println!(
        "# pipeline: one kernel up to {}, then {} slots of {} a rank, chunks {chunks}, receive {}, algorithm \
         {algorithm}, calls {calls}, waits {waits}",
        format_size(comm.small_max_bytes()),
        comm.slots(),
        format_size(comm.slot_bytes()),
        geforce_p2p::comm::describe_receive(comm.receive())
    );
    let shared = shared_duplex.map_or_else(String::new, |gbps| {
        format!(" ({sharing} passes at once on it: {gbps:.1} in all, {:.3} of it)", gbps / duplex)
    });
    println!(
        "# ceiling: duplex {duplex:.1} GB/s each way{shared}; ratio = bound / time, bound = {sharing} x f x size / duplex (f = {:.3})",
        args.collective.per_rank_factor(world)
    );
    if let Some(m) = model.filter(|_| kind_is_priced(args.collective, compressed)) {
        println!(
            "# model: gp2p plan's cost model for the path each size takes, at duplex {:.1} GB/s (measured above), \
             {} rank(s) sharing one link and GPU ({:.1} us x (r - 1)(r - 2) a chunk step), handoff {:.1} us (a 4 KiB round trip through host memory), an operation of a \
             chunk step {:.2} us (a kernel or a 4 KiB copy after the other) and DRAM {:.0} GB/s (every core copying beside the card's DMAs) \
             measured here, and its default host {:.0} GB/s; model err = model / time - 1",
            m.duplex_gbps,
            m.cards_per_uplink,
            geforce_p2p::collectives::cost::DEVICE_TURN_US,
            m.handoff_us,
            m.op_us,
            m.dram_gbps,
            m.host_gbps
        );
    }
    if compressed.is_some() {
        println!("{}", comm_compressed_header(&comm));
    }
    println!("{}", rows_table(&report.rows, "of bound").trim_fmt());
    for summary in &timelines {
        print!("{summary}");
    }
    if let Some(counts) = comm.replay_counts() {
        let failure = counts.first_failure.map_or_else(String::new, |e| format!(" (the first: {e})"));
        println!(
            "# rank 0's calls: {} replayed, {} captured, {} enqueued; {} failed captures{failure}",
            counts.replayed, counts.captured, counts.enqueued, counts.failed_captures
        );
    }
    finish(&report, c, &format!("comm {}", args.collective.name()))
}

/// Whether the cost model prices these rows: the exact all-reduce only.
fn kind_is_priced(kind: CommCollective, compressed: Option<WireFormat>) -> bool {
    kind == CommCollective::AllReduce && compressed.is_none()
}

/// The machine the model prices rank 0's rows on: `world` ranks, `sharing` of them on one
/// link (rank 0's GPU), at the duplex rate measured before the ranks started (every row here
/// moves both ways at once), the model's defaults for the rest.
fn model_machine(world: usize, sharing: usize, duplex_gbps: f64, here: Measured) -> Machine {
    Machine {
        h2d_gbps: duplex_gbps,
        d2h_gbps: duplex_gbps,
        duplex_gbps,
        cards_per_uplink: sharing.max(1),
        // Ranks on one GPU here share its link and its copy engines.
        ranks_per_device: sharing.max(1),
        handoff_us: here.handoff_us,
        op_us: here.op_us,
        dram_gbps: here.dram_gbps,
        ..Machine::h200(world)
    }
}

/// The model's rates `gp2p plan --measure` measures that rank 0 measures too, before the
/// ranks start: a phase's handoff, a chunk step's operation and the host's DRAM rate.
#[derive(Debug, Clone, Copy)]
struct Measured {
    handoff_us: f64,
    op_us: f64,
    dram_gbps: f64,
}

/// One size on every rank: check a call from fresh inputs, then time the runs (rank 0), then
/// with `--timeline` trace one more call (rank 0 adds its summary to `timelines`); the row on
/// rank 0, `None` elsewhere and for sizes too small for the ranks.
#[allow(clippy::too_many_arguments)]
fn one_size<T: Compressed>(
    args: &CommArgs,
    compressed: Option<WireFormat>,
    comm: &mut Communicator,
    stream: &Stream,
    bytes: usize,
    sharing: usize,
    duplex: Option<f64>,
    timelines: &mut Vec<String>,
) -> Result<Option<Row>, CliError> {
    let (rank, n, kind, op) = (comm.rank(), comm.world(), args.collective, args.op.0);
    let len = match kind {
        CommCollective::AllGather | CommCollective::ReduceScatter => (bytes / size_of::<T>()) / n * n,
        CommCollective::AllReduce | CommCollective::Broadcast => bytes / size_of::<T>(),
    };
    if len == 0 {
        return Ok(None);
    }
    let part = len / n;
    let input_len = if kind == CommCollective::AllGather { part } else { len };
    let output_len = if kind == CommCollective::ReduceScatter { part } else { len };
    let inputs: Vec<Vec<T>> = (0..n)
        .map(|r| {
            let mut v = vec![T::from_byte(0); input_len];
            fill_random(&mut v, 0xC0_4411 + (r as u64) * 7919 + bytes as u64);
            v
        })
        .collect();
    let pristine = DeviceBuffer::from_host(stream, &inputs[rank])?;
    let mut out = DeviceBuffer::<T>::alloc(stream.device(), output_len)?;
    let call = |comm: &mut Communicator, out: &mut DeviceBuffer<T>| -> Result<(), CliError> {
        let input = pristine.view(..);
        let mut output = out.view_mut(..);
        match (kind, compressed) {
            (CommCollective::AllReduce, Some(format)) => comm.all_reduce_compressed(&mut output, stream, op, format)?,
            (CommCollective::AllReduce, None) => comm.all_reduce(&mut output, stream, op)?,
            (CommCollective::AllGather, _) => comm.all_gather(&input, &mut output, stream)?,
            (CommCollective::ReduceScatter, _) => comm.reduce_scatter(&input, &mut output, stream, op)?,
            (CommCollective::Broadcast, _) => comm.broadcast(&mut output, stream, 0)?,
        }
        Ok(())
    };
    let in_place = matches!(kind, CommCollective::AllReduce | CommCollective::Broadcast);
    let reset = |out: &mut DeviceBuffer<T>| -> Result<(), CliError> {
        if in_place {
            out.view_mut(..).copy_from(stream, &pristine.view(..))?;
        }
        Ok(())
    };
    // One right answer for the compressed call, the reference's bits.
    let want = match compressed {
        Some(format) => {
            let scheme = Scheme { format: format.format, block: format.block };
            let all = T::compressed_reference(&inputs, op, scheme, comm.compressed_shots(len))
                .ok_or_else(|| CliError::Usage(format!("--compress takes f32, f16 or bf16, not {}", T::DTYPE)))?;
            let mine = all.into_iter().nth(rank);
            Some(
                mine.ok_or_else(|| CliError::Wrong(format!("the compressed reference has no result for rank {rank}")))?,
            )
        }
        None => None,
    };
    let count_wrong = |got: &[T]| match &want {
        Some(want) => count_unequal_bits(got, want),
        None => wrong_count(kind, got, &inputs, rank, op),
    };
    reset(&mut out)?;
    call(comm, &mut out)?;
    let got = out.to_host_vec(stream)?;
    let wrong = count_wrong(&got);
    // Compressed, the result's distance from the exact sum is the row's error (every rank
    // holds the same bits, so rank 0's result stands for all).
    let error =
        (compressed.is_some() && rank == 0).then(|| deviation_from_exact(&inputs, std::slice::from_ref(&got), op));
    let mut wrong_everywhere: u64 = comm.exchange_host([wrong as u64, 0, 0, 0, 0, 0])?.iter().map(|w| w[0]).sum();
    let mut per_call = Vec::with_capacity(args.common.iters);
    let mut enqueue = Vec::with_capacity(args.common.iters);
    for run in 0..args.common.warmup + args.common.iters {
        reset(&mut out)?;
        stream.synchronize()?;
        comm.exchange_host([0; 6])?;
        let (start, end) =
            (Event::new(stream.device(), EventKind::Timing)?, Event::new(stream.device(), EventKind::Timing)?);
        start.record(stream)?;
        let t0 = Instant::now();
        for _ in 0..args.calls {
            call(comm, &mut out)?;
        }
        let host = t0.elapsed().as_secs_f64();
        end.record(stream)?;
        stream.synchronize()?;
        comm.check()?;
        if run >= args.common.warmup {
            per_call.push(f64::from(Event::elapsed_ms(&start, &end)?) / 1e3 / args.calls as f64);
            enqueue.push(host / args.calls as f64);
        }
    }
    let seconds = median(&mut per_call);
    if let Some(dir) = &args.timeline {
        reset(&mut out)?;
        stream.synchronize()?;
        comm.exchange_host([0; 6])?;
        comm.start_timeline()?;
        call(comm, &mut out)?;
        let stamps = comm.read_timeline(stream)?;
        comm.check()?;
        // The traced call's result counts in the row's #wrong; a rank that cannot write its
        // file says so after every rank has written (none waits for one that stopped).
        let wrong = count_wrong(&out.to_host_vec(stream)?);
        let written = super::timeline::write(dir, bytes, rank, n, &stamps.stamps);
        let all = comm.exchange_host([wrong as u64, u64::from(written.is_err()), 0, 0, 0, 0])?;
        written?;
        if let Some(failed) = all.iter().position(|w| w[1] != 0) {
            return Err(CliError::Usage(format!("--timeline: rank {failed} could not write its file")));
        }
        wrong_everywhere += all.iter().map(|w| w[0]).sum::<u64>();
        if rank == 0 {
            let file = super::timeline::file_for(dir, bytes, 0);
            let mut summary = super::timeline::summary(bytes, n, &stamps, &file, seconds * 1e6);
            // Every rank has written its file (the exchange above came after): where they
            // share this GPU, their crossings share its link.
            if sharing == n {
                let ranks = (0..n).map(|r| super::timeline::read(dir, bytes, r)).collect::<Result<Vec<_>, _>>()?;
                summary.push_str(&super::timeline::link_line(&super::timeline::link_busy(&ranks), n));
            }
            timelines.push(summary);
        }
    }
    let Some(duplex) = duplex else { return Ok(None) };
    let real = len * size_of::<T>();
    let algbw = real as f64 / seconds / 1e9;
    // Compressed, the link carries the wire (scales and codes) where it would carry the buffer.
    let moved = compressed.map_or(real, |format| scaled_wire_bytes(format, len));
    let bound = sharing as f64 * kind.per_rank_factor(n) * moved as f64 / (duplex * 1e9);
    Ok(Some(Row {
        bench: kind.name(),
        route: compressed.map_or_else(|| "comm".into(), |f| format!("comm {} b{}", f.format, f.block.get())),
        dtype: T::DTYPE.to_string(),
        op: if matches!(kind, CommCollective::AllGather | CommCollective::Broadcast) {
            "none".into()
        } else {
            op.to_string()
        },
        ranks: n,
        bytes: real,
        count: len,
        time_us: seconds * 1e6,
        algbw,
        busbw: algbw * kind.bus_factor(n),
        ceiling: duplex,
        ceiling_name: "duplex",
        ratio: bound / seconds,
        enqueue_us: Some(median(&mut enqueue) * 1e6),
        model_us: None,
        wrong: usize::try_from(wrong_everywhere).unwrap_or(usize::MAX),
        error,
    }))
}

/// Elements of this rank's result that are not what every rank's input makes.
fn wrong_count<T: Reference>(kind: CommCollective, got: &[T], inputs: &[Vec<T>], rank: usize, op: ReduceOp) -> usize {
    match kind {
        CommCollective::AllReduce => {
            let all: Vec<&[T]> = inputs.iter().map(Vec::as_slice).collect();
            count_wrong_vs_fold(got, &all, op).0
        }
        CommCollective::ReduceScatter => {
            let part = got.len();
            let mine: Vec<&[T]> = inputs.iter().map(|v| &v[rank * part..(rank + 1) * part]).collect();
            count_wrong_vs_fold(got, &mine, op).0
        }
        CommCollective::AllGather => {
            let want: Vec<T> = inputs.iter().flatten().copied().collect();
            count_mismatched(got, &want, ReduceOp::Max).0
        }
        CommCollective::Broadcast => count_mismatched(got, &inputs[0], ReduceOp::Max).0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_counts_each_rank_s_bytes_each_way() {
        assert!((CommCollective::AllReduce.per_rank_factor(4) - 1.5).abs() < 1e-12);
        assert!((CommCollective::AllGather.per_rank_factor(8) - 0.875).abs() < 1e-12);
        assert!((CommCollective::Broadcast.bus_factor(8) - 1.0).abs() < 1e-12);
    }

    #[test]
    fn every_rank_s_result_is_checked_against_every_rank_s_input() {
        let inputs = vec![vec![1i32, 2, 3, 4], vec![10, 20, 30, 40]];
        assert_eq!(wrong_count(CommCollective::AllReduce, &[11, 22, 33, 44], &inputs, 0, ReduceOp::Sum), 0);
        assert_eq!(wrong_count(CommCollective::AllReduce, &[11, 22, 0, 44], &inputs, 1, ReduceOp::Sum), 1);
        assert_eq!(wrong_count(CommCollective::ReduceScatter, &[33, 44], &inputs, 1, ReduceOp::Sum), 0);
        let gathered = [1, 2, 3, 4, 10, 20, 30, 40];
        assert_eq!(wrong_count(CommCollective::AllGather, &gathered, &inputs, 0, ReduceOp::Sum), 0);
        assert_eq!(wrong_count(CommCollective::Broadcast, &[1, 2, 3, 5], &inputs, 1, ReduceOp::Sum), 1);
    }

    #[test]
    fn the_model_prices_the_exact_all_reduce_on_the_measured_link_shared_by_rank_0_s_ranks() {
        let here = Measured { handoff_us: 23.5, op_us: 6.5, dram_gbps: 96.0 };
        let m = model_machine(4, 4, 50.0, here);
        assert_eq!((m.ranks, m.cards_per_uplink, m.ranks_per_device), (4, 4, 4));
        assert_eq!((m.h2d_gbps, m.d2h_gbps, m.duplex_gbps), (50.0, 50.0, 50.0));
        assert_eq!((m.handoff_us, m.op_us, m.dram_gbps), (23.5, 6.5, 96.0), "measured here");
        assert_eq!(m.host_gbps, Machine::h200(4).host_gbps, "the rest are the model's defaults");
        assert_eq!(model_machine(2, 0, 50.0, here).cards_per_uplink, 1, "a link is shared by one rank at least");
        assert!(kind_is_priced(CommCollective::AllReduce, None));
        assert!(!kind_is_priced(CommCollective::AllGather, None));
        let int8 = WireFormat {
            format: geforce_p2p::kernels::compress::Format::Int8,
            block: geforce_p2p::kernels::compress::BlockSize::SMALLEST,
        };
        assert!(!kind_is_priced(CommCollective::AllReduce, Some(int8)), "compressed rows are not priced");
    }
}
