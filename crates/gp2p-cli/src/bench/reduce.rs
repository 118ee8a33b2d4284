//! `gp2p bench reduce`: the reduce kernels against the VRAM copy rate and the PCIe DMA rate.

use clap::Args;
use geforce_p2p::kernels::reference::{Reference, count_wrong, fill_random};
use geforce_p2p::ops::{copy_from_host, copy_to_host, reduce, reduce_from_host};
use geforce_p2p::{Device, DeviceBuffer, PinnedBuffer, ReduceOp, Stream, with_element};
use indicatif::ProgressBar;

use super::{CEILING_BYTES, Common, finish};
use crate::error::CliError;
use crate::flags::{DTypes, OpFlag};
use crate::measure::{Ceilings, Repeats, median_seconds};
use crate::report::{Report, Row};
use crate::sizes::format_size;
use crate::table::{num, table};

#[derive(Args)]
pub struct ReduceArgs {
    #[command(flatten)]
    common: Common,
    /// Element type, or every one in turn.
    #[arg(long, value_enum, default_value = "all")]
    dtype: DTypes,
    /// Reduction.
    #[arg(long, value_enum, default_value = "sum")]
    op: OpFlag,
    /// Device ordinal.
    #[arg(short = 'd', long, default_value_t = 0)]
    device: usize,
}

pub fn run(args: &ReduceArgs) -> Result<(), CliError> {
    let c = &args.common;
    let sizes = c.sizes()?;
    let dtypes = args.dtype.list();
    let repeats = c.repeats()?;
    let device = Device::open(args.device)?;
    let stream = c.stream(&device)?;
    eprintln!("measuring ceilings with {} transfers ...", format_size(CEILING_BYTES));
    let mut ceilings = Ceilings::new(&device, &stream, CEILING_BYTES, repeats)?;
    let ceil = ReduceCeilings { d2d: ceilings.d2d()?, h2d: ceilings.h2d()? };
    ceilings.d2h()?; // reported beside the others
    let progress = super::progress(dtypes.len() * sizes.len() * 2);
    let mut rows = Vec::new();
    for dtype in dtypes {
        let bench = ReduceBench {
            device: &device,
            stream: &stream,
            sizes: &sizes,
            op: args.op.0,
            repeats,
            ceilings: ceil,
            progress: &progress,
        };
        rows.extend(with_element!(dtype, |T| bench.run::<T>())?);
    }
    progress.finish_and_clear();
    let report = Report::new(&device, ceilings.measured.clone(), c.iters, rows)?.on_streams(c.stream.name());
    print_reduce(&report);
    finish(&report, c, "reduce")
}

/// The rates a reduce row is compared with, GB/s.
#[derive(Clone, Copy)]
struct ReduceCeilings {
    d2d: f64,
    h2d: f64,
}

struct ReduceBench<'a> {
    device: &'a Device,
    stream: &'a Stream,
    sizes: &'a [usize],
    op: ReduceOp,
    repeats: Repeats,
    ceilings: ReduceCeilings,
    progress: &'a ProgressBar,
}

impl ReduceBench<'_> {
    fn run<T: Reference>(&self) -> Result<Vec<Row>, CliError> {
        let (device, stream) = (self.device, self.stream);
        let max = self.sizes.iter().max().copied().unwrap_or(0) / size_of::<T>();
        let divide_by = if self.op == ReduceOp::Avg { 2 } else { 1 };
        // Fresh random inputs: `pristine` is dst's starting value, restored (untimed) before
        // every run, so every timed run computes the same verifiable result.
        let mut host_dst = PinnedBuffer::<T>::alloc(device, max)?;
        let mut host_src = PinnedBuffer::<T>::alloc(device, max)?;
        let mut host_out = PinnedBuffer::<T>::alloc(device, max)?;
        fill_random(host_dst.as_mut_slice()?, 0xD57 ^ T::DTYPE.index() as u64);
        fill_random(host_src.as_mut_slice()?, 0x5C ^ T::DTYPE.index() as u64);
        let mut pristine = DeviceBuffer::<T>::alloc(device, max)?;
        let mut src = DeviceBuffer::<T>::alloc(device, max)?;
        let mut dst = DeviceBuffer::<T>::alloc(device, max)?;
        copy_from_host(stream, &host_dst.view(..), &mut pristine.view_mut(..))?;
        copy_from_host(stream, &host_src.view(..), &mut src.view_mut(..))?;
        let mut rows = Vec::new();
        for &bytes in self.sizes {
            let n = bytes / size_of::<T>();
            if n == 0 {
                continue;
            }
            for transport in ["device", "zero-copy"] {
                self.progress.set_message(format!("reduce {} {} {transport}", T::DTYPE, format_size(bytes)));
                dst.fill_bytes(stream, 0xA5)?;
                let dst_cell = std::cell::RefCell::new(&mut dst);
                let restore = || {
                    dst_cell
                        .borrow_mut()
                        .view_mut(..n)
                        .copy_from(stream, &pristine.view(..n))
                        .map(drop)
                        .map_err(Into::into)
                };
                let seconds = if transport == "device" {
                    median_seconds(stream, self.repeats, restore, || {
                        Ok(reduce(
                            stream,
                            &mut dst_cell.borrow_mut().view_mut(..n),
                            &src.view(..n),
                            self.op,
                            divide_by,
                        )?)
                    })?
                } else {
                    median_seconds(stream, self.repeats, restore, || {
                        Ok(reduce_from_host(
                            stream,
                            &mut dst_cell.borrow_mut().view_mut(..n),
                            &host_src.view(..n),
                            self.op,
                            divide_by,
                        )?)
                    })?
                };
                copy_to_host(stream, &dst.view(..n), &mut host_out.view_mut(..n))?;
                let (wrong, _) = count_wrong(
                    &host_out.as_slice()?[..n],
                    &host_dst.as_slice()?[..n],
                    &host_src.as_slice()?[..n],
                    self.op,
                    divide_by,
                );
                let real_bytes = n * size_of::<T>();
                // Device source: 2 reads + 1 write in VRAM, against the D2D copy's read+write
                // rate. Zero-copy: the src bytes cross PCIe once, against the H2D DMA rate.
                let (busbw_bytes, ceiling, ceiling_name) = if transport == "device" {
                    (3 * real_bytes, self.ceilings.d2d, "d2d")
                } else {
                    (real_bytes, self.ceilings.h2d, "h2d")
                };
                let busbw = busbw_bytes as f64 / seconds / 1e9;
                rows.push(Row {
                    bench: "reduce",
                    route: transport.to_string(),
                    dtype: T::DTYPE.to_string(),
                    op: self.op.to_string(),
                    ranks: 1,
                    bytes: real_bytes,
                    count: n,
                    time_us: seconds * 1e6,
                    algbw: real_bytes as f64 / seconds / 1e9,
                    busbw,
                    ceiling,
                    ceiling_name,
                    ratio: busbw / ceiling,
                    enqueue_us: None,
                    model_us: None,
                    wrong,
                    error: None,
                });
                self.progress.inc(1);
            }
        }
        Ok(rows)
    }
}

fn print_reduce(report: &Report) {
    let c = |name: &str| report.ceilings.get(name).copied().unwrap_or(f64::NAN);
    println!(
        "# gp2p bench reduce on {} ({}), medians of {} timed runs",
        report.gpu.name, report.gpu.driver, report.repeats
    );
    println!(
        "# ceilings ({} transfers): d2d {:.1} GB/s (read+write), h2d {:.1} GB/s, d2h {:.1} GB/s",
        format_size(CEILING_BYTES),
        c("d2d"),
        c("h2d"),
        c("d2h")
    );
    let mut t =
        table(&["size", "count", "type", "op", "dev us", "GB/s", "/d2d", "zc us", "GB/s", "/h2d", "#wrong"], &[]);
    for pair in report.rows.chunks(2) {
        let [dev, zc] = pair else { continue };
        t.add_row(vec![
            format_size(dev.bytes),
            dev.count.to_string(),
            dev.dtype.clone(),
            dev.op.clone(),
            num(dev.time_us, 1),
            num(dev.busbw, 1),
            num(dev.ratio, 3),
            num(zc.time_us, 1),
            num(zc.busbw, 2),
            num(zc.ratio, 3),
            (dev.wrong + zc.wrong).to_string(),
        ]);
    }
    println!("{}", t.trim_fmt());
    // The acceptance view: the largest size of each dtype, and each dtype against f32.
    let largest = report.rows.iter().map(|r| r.bytes).max().unwrap_or(0);
    let at = |dtype: &str, transport: &str| {
        report.rows.iter().find(|r| r.bytes == largest && r.dtype == dtype && r.route == transport).map(|r| r.busbw)
    };
    println!("# at {}: ratio to ceiling, and bytes/s relative to f32", format_size(largest));
    let mut t = table(&["type", "/d2d", "vs f32", "/h2d", "vs f32"], &[]);
    for r in report.rows.iter().filter(|r| r.bytes == largest && r.route == "device") {
        let zc = report.rows.iter().find(|z| z.bytes == largest && z.dtype == r.dtype && z.route == "zero-copy");
        let rel = |t: &str, v: f64| at("f32", t).map_or(f64::NAN, |f| v / f);
        t.add_row(vec![
            r.dtype.clone(),
            num(r.ratio, 3),
            num(rel("device", r.busbw), 3),
            num(zc.map_or(f64::NAN, |z| z.ratio), 3),
            num(zc.map_or(f64::NAN, |z| rel("zero-copy", z.busbw)), 3),
        ]);
    }
    println!("{}", t.trim_fmt());
}
