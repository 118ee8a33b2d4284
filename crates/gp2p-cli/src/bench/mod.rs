//! `gp2p bench …`: nccl-tests style sweeps; every row is verified and compared with a
//! ceiling measured in the same run.

mod codec;
mod collective;
mod comm;
mod compressed;
mod copy;
mod host;
mod ranks;
mod reduce;
mod timeline;

use std::path::PathBuf;

use clap::{Args, Subcommand};
use geforce_p2p::{Device, Stream};
use indicatif::{ProgressBar, ProgressStyle};

use crate::error::CliError;
use crate::flags::StreamFlag;
use crate::measure::Repeats;
use crate::plot::plot_rows;
use crate::report::{Report, Row};
use crate::sizes::{format_size, parse_size, sweep};
use crate::table::{num, table};

/// Bytes per transfer for the ceilings: large enough for steady state on any PCIe link.
pub const CEILING_BYTES: usize = 1 << 30;

#[derive(Subcommand)]
pub enum BenchCommand {
    /// The reduce kernels, `dst = op(dst, src)`, with `src` in device memory (bytes read and
    /// written against the device-to-device copy rate) and in mapped pinned host memory
    /// (zero-copy: bytes over PCIe against the pinned host-to-device DMA rate).
    Reduce(reduce::ReduceArgs),
    /// Device-to-device copies by route (staged through pinned host memory, or peer),
    /// against the link ceilings: duplex on one card, min(D2H src, H2D dst) across two.
    Copy(copy::CopyArgs),
    /// copy_to_host and copy_from_host against the pinned DMA rates.
    Host(host::HostArgs),
    /// all_reduce over pinned host memory, nccl-tests columns (the ring between two ranks,
    /// the two-shot legs from three; GP2P_ALGORITHM=ring|two-shot forces one).
    AllReduce(collective::CollectiveArgs),
    /// all_gather (size = the gathered buffer), the ring or the legs as for all-reduce.
    AllGather(collective::CollectiveArgs),
    /// reduce_scatter (size = each rank's input), the ring or the legs as for all-reduce.
    ReduceScatter(collective::CollectiveArgs),
    /// Broadcast from rank 0, the ring or the legs as for all-reduce.
    Broadcast(collective::CollectiveArgs),
    /// The one-process-per-GPU communicator among --ranks processes (this one and copies it
    /// starts), rank r on GPU r modulo the GPUs: each row's time against the bytes' bound at
    /// the duplex rate measured first.
    Comm(comm::CommArgs),
    /// The compressed all-reduce's codec kernels alone in device memory (encode, decode, the
    /// owner's fold and encode, the one-shot's fold and decode), their bytes read and written
    /// against the device-to-device copy rate, every output against the CPU reference's bits.
    Codec(codec::CodecArgs),
    /// Draw saved `--json` reports again as SVG, with other tools' rows (NCCL, torch) beside
    /// them; needs no GPU.
    Plot(crate::plot::PlotArgs),
}

/// Flags every bench shares.
#[derive(Args, Clone)]
pub struct Common {
    /// Smallest size (bytes; K, M, G suffixes).
    #[arg(short = 'b', long, default_value = "4K", value_parser = parse_size)]
    begin: usize,
    /// Largest size.
    #[arg(short = 'e', long, default_value = "1G", value_parser = parse_size)]
    end: usize,
    /// Step factor between sizes.
    #[arg(short = 'f', long, default_value_t = 4)]
    factor: usize,
    /// Timed runs per row (the median is reported).
    #[arg(short = 'n', long, default_value_t = 20)]
    iters: usize,
    /// Untimed runs before timing.
    #[arg(short = 'w', long, default_value_t = 5)]
    warmup: usize,
    /// Write the report as JSON to this file. It records the command line, and the machine
    /// and commit where GP2P_MACHINE and GP2P_COMMIT say them.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Draw GB/s against size as SVG to this file, every point marked, the ceilings dashed,
    /// the machine and commit (GP2P_MACHINE, GP2P_COMMIT) under the title.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// The streams the bench enqueues on: new non-blocking streams, or each
    /// device's legacy default stream (where PyTorch enqueues unless told otherwise; a copy
    /// within one device then has one stream for both ends).
    #[arg(long, value_enum, default_value = "own")]
    stream: StreamFlag,
    /// After the table, for each size, the host time of every driver call of one more
    /// enqueue (untimed): where the enqueue column's microseconds go.
    #[arg(long)]
    trace: bool,
}

impl Common {
    fn sizes(&self) -> Result<Vec<usize>, CliError> {
        sweep(self.begin, self.end, self.factor).map_err(CliError::Usage)
    }

    /// The caller stream on `device` that `--stream` asks for.
    fn stream(&self, device: &Device) -> Result<Stream, CliError> {
        Ok(match self.stream {
            StreamFlag::Own => Stream::new(device)?,
            StreamFlag::Legacy => Stream::legacy(device),
        })
    }

    /// The runs to time, with the traced run after them where `--trace` asks for it.
    fn repeats(&self) -> Result<Repeats, CliError> {
        crate::measure::set_tracing(self.trace);
        if self.iters == 0 {
            return Err(CliError::Usage("-n/--iters must be at least 1".into()));
        }
        Ok(Repeats { warmup: self.warmup, timed: self.iters })
    }
}

pub fn run(command: BenchCommand) -> Result<(), CliError> {
    match command {
        BenchCommand::Reduce(args) => reduce::run(&args),
        BenchCommand::Copy(args) => copy::run(&args),
        BenchCommand::Host(args) => host::run(&args),
        BenchCommand::AllReduce(args) => collective::run(collective::Kind::AllReduce, &args),
        BenchCommand::AllGather(args) => collective::run(collective::Kind::AllGather, &args),
        BenchCommand::ReduceScatter(args) => collective::run(collective::Kind::ReduceScatter, &args),
        BenchCommand::Broadcast(args) => collective::run(collective::Kind::Broadcast, &args),
        BenchCommand::Comm(args) => comm::run(&args),
        BenchCommand::Codec(args) => codec::run(&args),
        BenchCommand::Plot(args) => crate::plot::run(&args),
    }
}

/// nccl-tests' columns, one row per size, with each row's ratio under `ratio_name`.
fn rows_table(rows: &[Row], ratio_name: &str) -> crate::table::Table {
    let mut heads = vec!["size", "count", "type", "op", "ranks", "time us", "algbw", "busbw", ratio_name, "enqueue us"];
    heads.push("#wrong");
    // Lossy rows (a compressed all-reduce) also say how far they are from the exact result.
    let lossy = rows.iter().any(|r| r.error.is_some());
    if lossy {
        heads.extend(["max rel err", "rms rel err"]);
    }
    // Rows the cost model prices also show its time and how far off it is.
    let modelled = rows.iter().any(|r| r.model_us.is_some());
    if modelled {
        heads.extend(["model us", "model err"]);
    }
    let mut t = table(&heads, &[]);
    for r in rows {
        let mut cells = vec![
            format_size(r.bytes),
            r.count.to_string(),
            r.dtype.clone(),
            r.op.clone(),
            r.ranks.to_string(),
            num(r.time_us, 1),
            num(r.algbw, 2),
            num(r.busbw, 2),
            num(r.ratio, 3),
            num(r.enqueue_us.unwrap_or(f64::NAN), 1),
            r.wrong.to_string(),
        ];
        if lossy {
            let e = r.error;
            cells.push(e.map_or("-".into(), |e| format!("{:.2e}", e.max_relative)));
            cells.push(e.map_or("-".into(), |e| format!("{:.2e}", e.rms_relative)));
        }
        if modelled {
            cells.push(r.model_us.map_or("-".into(), |m| num(m, 1)));
            cells.push(r.model_us.map_or("-".into(), |m| model_error(m, r.time_us)));
        }
        t.add_row(cells);
    }
    t
}

/// The model's error against a measured time, as a signed percentage of the measured time:
/// `-12%` where the model predicts 12 % less time than was measured.
fn model_error(model_us: f64, measured_us: f64) -> String {
    format!("{:+.0}%", (model_us / measured_us - 1.0) * 100.0)
}

/// A progress bar on stderr for `steps` rows.
fn progress(steps: usize) -> ProgressBar {
    let bar = ProgressBar::new(steps as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} {msg}").unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar
}

/// Write the JSON and the plot if asked, each saying its command, machine and commit, and
/// fail when any timed result was wrong.
fn finish(report: &Report, common: &Common, title: &str) -> Result<(), CliError> {
    let report = &report.clone().described(
        std::env::args(),
        std::env::var("GP2P_MACHINE").ok(),
        std::env::var("GP2P_COMMIT").ok(),
    );
    if let Some(path) = &common.json {
        report.write_json(path)?;
        eprintln!("wrote {}", path.display());
    }
    if let Some(path) = &common.plot {
        plot_rows(path, title, report)?;
        eprintln!("wrote {}", path.display());
    }
    let wrong: usize = report.rows.iter().map(|r| r.wrong).sum();
    if wrong > 0 {
        return Err(CliError::Wrong(format!("{wrong} wrong elements in the timed results (see the #wrong column)")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_s_error_is_signed_against_the_measured_time() {
        assert_eq!(model_error(88.0, 100.0), "-12%");
        assert_eq!(model_error(115.0, 100.0), "+15%");
        let row = |model_us| Row {
            bench: "all_reduce",
            route: "comm".into(),
            dtype: "f32".into(),
            op: "sum".into(),
            ranks: 2,
            bytes: 1 << 20,
            count: 1 << 18,
            time_us: 100.0,
            algbw: 10.5,
            busbw: 10.5,
            ceiling: 50.0,
            ceiling_name: "duplex",
            ratio: 0.4,
            enqueue_us: Some(3.0),
            model_us,
            wrong: 0,
            error: None,
        };
        let text = rows_table(&[row(Some(80.0))], "of bound").to_string();
        assert!(text.contains("model us") && text.contains("80.0") && text.contains("-20%"), "{text}");
        assert!(!rows_table(&[row(None)], "of bound").to_string().contains("model"), "no column without a model");
    }
}
