//! `gp2p bench all-reduce|all-gather|reduce-scatter|broadcast`: nccl-tests columns, every
//! result verified, the link ceiling measured in the same run. With more ranks than GPUs
//! (feature `testing`), the ranks share device 0 and its one link. `all-reduce --compress
//! int8|fp8` times the compressed all-reduce instead, checks every element against its CPU
//! reference bit for bit, and adds its error against the exact result (f64) as two columns.

use clap::Args;
use geforce_p2p::collectives::pipeline::{Pipeline, choose};
use geforce_p2p::collectives::reference::expected;
use geforce_p2p::collectives::{
    Collective, Engine, Rank, all_gather, all_reduce, all_reduce_compressed, broadcast, reduce_scatter,
};
use geforce_p2p::kernels::compress::{Scheme, Shots};
use geforce_p2p::kernels::reference::{count_mismatched, fill_random};
use geforce_p2p::{Device, DeviceBuffer, Event, EventKind, Stream, with_element};

use super::compressed::{CompressArgs, Compressed, count_unequal_bits, deviation_from_exact, scaled_wire_bytes};
use super::{CEILING_BYTES, Common, finish, progress, rows_table};
use crate::error::CliError;
use crate::flags::{DTypeFlag, OpFlag, ReceiveFlag};
use crate::measure::{Ceilings, print_trace, time_op, timed_runs};
use crate::report::{Report, Row};
use crate::sizes::format_size;

#[derive(Args)]
pub struct CollectiveArgs {
    #[command(flatten)]
    common: Common,
    /// Number of ranks (more than the GPUs present needs the `testing` build: logical ranks).
    #[arg(long, default_value_t = 2)]
    ranks: usize,
    /// How each chunk that lands is folded: zero-copy (read from host memory in place),
    /// scratch (a DMA into device memory first), or auto (measured once per device).
    #[arg(long, value_enum, default_value = "auto", alias = "transport")]
    receive: ReceiveFlag,
    /// Reduction.
    #[arg(long, value_enum, default_value = "sum")]
    op: OpFlag,
    /// Element type.
    #[arg(long, value_enum, default_value = "f32")]
    dtype: DTypeFlag,
    /// Chunk size of the ring pipeline (bytes; K, M, G suffixes), instead of one sized by
    /// the buffer.
    #[arg(long, value_parser = crate::sizes::parse_size)]
    chunk: Option<usize>,
    /// Staging slots per ring edge, instead of the default.
    #[arg(long)]
    slots: Option<usize>,
    /// Two-rank all-reduces up to this size take the one-kernel line exchange (bytes; K, M,
    /// G suffixes; 0 turns it off), instead of the default.
    #[arg(long, value_parser = crate::sizes::parse_size)]
    line_max: Option<usize>,
    #[command(flatten)]
    compress: CompressArgs,
}

/// Which collective a bench runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    AllReduce,
    AllGather,
    ReduceScatter,
    Broadcast,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::AllReduce => "all_reduce",
            Kind::AllGather => "all_gather",
            Kind::ReduceScatter => "reduce_scatter",
            Kind::Broadcast => "broadcast",
        }
    }

    fn collective(self) -> Collective {
        match self {
            Kind::AllReduce => Collective::AllReduce,
            Kind::AllGather => Collective::AllGather,
            Kind::ReduceScatter => Collective::ReduceScatter,
            Kind::Broadcast => Collective::Broadcast { root: 0 },
        }
    }

    /// nccl-tests' busbw = algbw × this factor.
    fn bus_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self {
            Kind::AllReduce => 2.0 * (n - 1.0) / n,
            Kind::AllGather | Kind::ReduceScatter => (n - 1.0) / n,
            Kind::Broadcast => 1.0,
        }
    }
}

pub fn run(kind: Kind, args: &CollectiveArgs) -> Result<(), CliError> {
    with_element!(args.dtype.0, |T| run_typed::<T>(kind, args))
}

fn run_typed<T: Compressed>(kind: Kind, args: &CollectiveArgs) -> Result<(), CliError> {
    let compressed = args.compress.wire_format(kind.name(), kind == Kind::AllReduce, args.op.0, args.dtype.0)?;
    let c = &args.common;
    let (sizes, repeats) = (c.sizes()?, c.repeats()?);
    let n = args.ranks.max(1);
    let count = Device::count()?;
    let logical = n > count;
    let devices: Vec<Device> = (0..n).map(|r| Device::open(if logical { 0 } else { r })).collect::<Result<_, _>>()?;
    // Logical ranks share one stream: the collective's fork and join then bracket all ranks.
    let streams: Vec<Stream> = if logical {
        vec![c.stream(&devices[0])?]
    } else {
        devices.iter().map(|d| c.stream(d)).collect::<Result<_, _>>()?
    };
    let stream_of = |r: usize| &streams[if logical { 0 } else { r }];
    eprintln!("measuring ceilings ...");
    let mut ceil = Ceilings::new(&devices[0], stream_of(0), CEILING_BYTES, repeats)?;
    let duplex = ceil.duplex()?;
    let measured = ceil.measured.clone();
    drop(ceil);
    let mut engine = Engine::with_staging(args.chunk, args.slots)?;
    if let Some(bytes) = args.line_max {
        engine = engine.with_line_exchange_max(bytes);
    }
    let bar = progress(sizes.len());
    let mut rows = Vec::new();
    let mut traces = Vec::new();
    let (op, receive) = (args.op.0, args.receive.0);
    for &bytes in &sizes {
        // all_gather and reduce_scatter sizes are the full buffer (n parts), as nccl-tests.
        let len = match kind {
            Kind::AllGather | Kind::ReduceScatter => (bytes / size_of::<T>()) / n * n,
            Kind::AllReduce | Kind::Broadcast => bytes / size_of::<T>(),
        };
        if len == 0 {
            continue;
        }
        let part = len / n;
        bar.set_message(format!("{} {} x{n} {}", kind.name(), format_size(bytes), T::DTYPE));
        let input_len = if matches!(kind, Kind::AllGather) { part } else { len };
        let output_len = if matches!(kind, Kind::ReduceScatter) { part } else { len };
        let inputs: Vec<Vec<T>> = (0..n)
            .map(|r| {
                let mut v = vec![T::from_byte(0); input_len];
                fill_random(&mut v, 0xA11 + (r as u64) * 7919 + bytes as u64);
                v
            })
            .collect();
        let pristine: Vec<DeviceBuffer<T>> =
            (0..n).map(|r| DeviceBuffer::from_host(stream_of(r), &inputs[r])).collect::<Result<_, _>>()?;
        let mut bufs: Vec<DeviceBuffer<T>> =
            devices.iter().map(|d| DeviceBuffer::alloc(d, output_len)).collect::<Result<_, _>>()?;
        let cells = std::cell::RefCell::new(&mut bufs);
        let start = Event::new(&devices[0], EventKind::Sync)?;
        let ends: Vec<Event> = devices.iter().map(|d| Event::new(d, EventKind::Sync)).collect::<Result<_, _>>()?;
        let in_place = matches!(kind, Kind::AllReduce | Kind::Broadcast);
        let timing = timed_runs(
            stream_of(0),
            repeats,
            || {
                // In-place collectives start every run from the same inputs.
                if in_place {
                    let mut bufs = cells.borrow_mut();
                    for (r, (b, p)) in bufs.iter_mut().zip(&pristine).enumerate() {
                        b.view_mut(..).copy_from(stream_of(r), &p.view(..))?;
                    }
                }
                Ok(())
            },
            || {
                // Every rank starts with stream 0's start and stream 0 ends after every rank.
                start.record(stream_of(0))?;
                for stream in streams.iter().skip(1) {
                    stream.wait(&start)?;
                }
                let mut bufs = cells.borrow_mut();
                let mut ranks: Vec<Rank<'_, T>> = bufs
                    .iter_mut()
                    .enumerate()
                    .map(|(r, b)| Rank { buffer: b.view_mut(..), stream: stream_of(r) })
                    .collect();
                let views: Vec<_> = pristine.iter().map(|p| p.view(..)).collect();
                // The enqueue column is the collective's call alone, not the events around it.
                time_op(|| match (kind, compressed) {
                    (Kind::AllReduce, Some(format)) => all_reduce_compressed(&engine, &mut ranks, op, format),
                    (Kind::AllReduce, None) => all_reduce(&engine, &mut ranks, op, receive),
                    (Kind::AllGather, _) => all_gather(&engine, &views, &mut ranks, receive),
                    (Kind::ReduceScatter, _) => reduce_scatter(&engine, &views, &mut ranks, op, receive),
                    (Kind::Broadcast, _) => broadcast(&engine, &mut ranks, 0, receive),
                })?;
                for (stream, end) in streams.iter().zip(&ends).skip(1) {
                    end.record(stream)?;
                    stream_of(0).wait(end)?;
                }
                Ok(())
            },
        )?;
        // Verify against the same pipeline run on host copies, step by step with the CPU
        // reference, so floating-point results match the GPU's order of operations.
        let collective = kind.collective();
        let staging = engine.staging_for(len * size_of::<T>(), &devices);
        let forced = engine.forced_algorithm()?;
        let pipeline = choose::<T>(collective, n, len, Some(staging.chunk_bytes), forced);
        let outputs: Vec<Vec<T>> =
            bufs.iter().enumerate().map(|(r, b)| b.to_host_vec(stream_of(r))).collect::<Result<_, _>>()?;
        let (wrong, error) = match compressed {
            // The compressed all-reduce has one right answer, its reference's bits; how far
            // that is from the exact sum is its error, reported beside the time.
            Some(format) => {
                let scheme = Scheme { format: format.format, block: format.block };
                let want = T::compressed_reference(&inputs, op, scheme, Shots::Two)
                    .ok_or_else(|| CliError::Usage(format!("--compress takes f32, f16 or bf16, not {}", T::DTYPE)))?;
                let wrong = outputs.iter().zip(&want).map(|(got, want)| count_unequal_bits(got, want)).sum();
                (wrong, Some(deviation_from_exact(&inputs, &outputs, op)))
            }
            None => {
                let want = expected(collective, &inputs, op);
                (outputs.iter().zip(&want).map(|(got, want)| count_mismatched(got, want, op).0).sum(), None)
            }
        };
        if let Some(trace) = &timing.trace {
            traces.push((format_size(len * size_of::<T>()), trace.clone()));
        }
        let seconds = timing.gpu_seconds;
        let real = len * size_of::<T>();
        let algbw = real as f64 / seconds / 1e9;
        let busbw = algbw * kind.bus_factor(n);
        // Bytes on the binding link and direction, counted from what ran: each rank's own
        // link carries what it sends up and receives down (the ring: as much each way; the
        // legs: more down); logical ranks put every rank's traffic on device 0's one link.
        let (sent, received) = match (&pipeline, compressed) {
            // Each rank sends its wire W up once (its values of the others' shards, its folds)
            // and receives the others' wires of its shard and their folds: 2(N−1)/N·W.
            (_, Some(format)) => {
                let wire = scaled_wire_bytes(format, len);
                (vec![wire; n], vec![2 * (n - 1) * wire / n; n])
            }
            (Pipeline::Ring(schedule), None) => {
                let each = schedule.bytes_per_rank(size_of::<T>());
                (each.clone(), each)
            }
            (Pipeline::Legs(rounds), None) => (rounds.bytes_sent(), rounds.bytes_received()),
        };
        let most = |bytes: &[usize]| {
            if logical { bytes.iter().sum::<usize>() } else { bytes.iter().copied().max().unwrap_or(0) }
        };
        let link_bytes = most(&sent).max(most(&received));
        let link = link_bytes as f64 / seconds / 1e9;
        rows.push(Row {
            bench: kind.name(),
            route: compressed.map_or_else(|| receive.to_string(), |f| format!("{} b{}", f.format, f.block.get())),
            dtype: T::DTYPE.to_string(),
            op: if matches!(kind, Kind::AllGather | Kind::Broadcast) { "none".into() } else { op.to_string() },
            ranks: n,
            bytes: real,
            count: len,
            time_us: seconds * 1e6,
            algbw,
            busbw,
            ceiling: duplex,
            ceiling_name: "duplex",
            ratio: link / duplex,
            enqueue_us: Some(timing.enqueue_seconds * 1e6),
            model_us: None,
            wrong,
            error,
        });
        bar.inc(1);
    }
    bar.finish_and_clear();
    let report = Report::new(&devices[0], measured, c.iters, rows)?.on_streams(c.stream.name());
    let how = match compressed {
        Some(f) => format!("--compress {} --block {}", f.format, f.block.get()),
        None => format!("--receive {receive}"),
    };
    println!(
        "# gp2p bench {} --ranks {n}{} {how} --op {} --dtype {} on {}, medians of {} runs",
        kind.name(),
        if logical { " (logical ranks on device 0)" } else { "" },
        op,
        args.dtype.0,
        report.gpu.name,
        report.repeats
    );
    println!("# ceiling: duplex {duplex:.1} GB/s each way; ratio = link bytes per direction per second / duplex");
    if compressed.is_some() {
        println!(
            "# compressed: #wrong counts values whose bits differ from the CPU reference's; max rel err = largest \
             |result - exact| over the largest |exact|, rms rel err = RMS(result - exact) / RMS(exact), exact in f64"
        );
    }
    println!("{}", rows_table(&report.rows, "ratio").trim_fmt());
    for (size, trace) in &traces {
        print_trace(size, trace);
    }
    finish(&report, c, kind.name())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(bytes: usize) -> Row {
        Row {
            bench: "all_reduce",
            route: "auto".into(),
            dtype: "f32".into(),
            op: "sum".into(),
            ranks: 2,
            bytes,
            count: bytes / 4,
            time_us: 18.9,
            algbw: 0.0,
            busbw: 0.0,
            ceiling: 49.7,
            ceiling_name: "duplex",
            ratio: 0.0,
            enqueue_us: Some(20.5),
            model_us: None,
            wrong: 0,
            error: None,
        }
    }

    /// The device scripts keep data rows with `grep -E '^ +[0-9]'` (benches/device/common.sh's
    /// `record`: `'^ +[0-9.]+[KMG]? '`): every data row, and nothing else, starts that way.
    #[test]
    fn data_rows_are_what_the_device_scripts_grep() {
        let text = rows_table(&[row(8), row(1 << 30)], "ratio").trim_fmt();
        let data: Vec<&str> = text
            .lines()
            .filter(|l| {
                let rest = l.trim_start_matches(' ');
                rest.len() < l.len() && rest.starts_with(|c: char| c.is_ascii_digit())
            })
            .collect();
        assert_eq!(data.len(), 2, "{text}");
        assert!(data[0].trim_start().starts_with("8 ") && data[1].trim_start().starts_with("1G "), "{text}");
    }
}
