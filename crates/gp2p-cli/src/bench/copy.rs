//! `gp2p bench copy`: device-to-device copies by route against the link ceilings.

use clap::Args;
use geforce_p2p::kernels::reference::fill_random;
use geforce_p2p::ops::copy_from_host;
use geforce_p2p::{CopyOptions, Device, DeviceBuffer, PinnedBuffer, transport};

use super::{CEILING_BYTES, Common, finish, progress};
use crate::error::CliError;
use crate::flags::RouteFlag;
use crate::measure::{Ceilings, print_trace, timed_runs};
use crate::report::{Report, Row};
use crate::sizes::format_size;
use crate::table::{num, table};

/// The small size whose latency is compared with one D2H plus one H2D.
const SMALL_BYTES: usize = 4096;

#[derive(Args)]
pub struct CopyArgs {
    #[command(flatten)]
    common: Common,
    /// Route.
    #[arg(long, value_enum, default_value = "staged")]
    route: RouteFlag,
    /// Source device.
    #[arg(long, default_value_t = 0)]
    src: usize,
    /// Destination device.
    #[arg(long, default_value_t = 0)]
    dst: usize,
    /// Override the staged pipeline's chunk size (bytes; K, M, G suffixes).
    #[arg(long, value_parser = crate::sizes::parse_size)]
    chunk: Option<usize>,
    /// Override the number of staging slots.
    #[arg(long)]
    slots: Option<usize>,
}

pub fn run(args: &CopyArgs) -> Result<(), CliError> {
    let c = &args.common;
    let sizes = c.sizes()?;
    let repeats = c.repeats()?;
    let (src_dev, dst_dev) = (Device::open(args.src)?, Device::open(args.dst)?);
    let (src_stream, dst_stream) = (c.stream(&src_dev)?, c.stream(&dst_dev)?);
    let one_card = src_dev == dst_dev;
    eprintln!("measuring ceilings ...");
    // Ceilings of the links this copy uses: the source's D2H and the destination's H2D;
    // on one card, both directions of its one link at once.
    let mut src_ceilings = Ceilings::new(&src_dev, &src_stream, CEILING_BYTES, repeats)?;
    let d2h = src_ceilings.d2h()?;
    let small_pair_us = src_ceilings.pair_latency_us(SMALL_BYTES)?;
    let mut measured = src_ceilings.measured.clone();
    let (binding_name, binding) = if one_card {
        let h2d = src_ceilings.h2d()?;
        let duplex = src_ceilings.duplex()?;
        measured = src_ceilings.measured.clone();
        measured.insert("min_one_way", d2h.min(h2d));
        ("duplex", duplex)
    } else {
        let mut dst_ceilings = Ceilings::new(&dst_dev, &dst_stream, CEILING_BYTES, repeats)?;
        let h2d = dst_ceilings.h2d()?;
        measured.insert("h2d_dst", h2d);
        measured.insert("min_one_way", d2h.min(h2d));
        ("min_one_way", d2h.min(h2d))
    };
    drop(src_ceilings);
    measured.insert("small_pair_us", small_pair_us);

    let max = sizes.iter().max().copied().unwrap_or(0).div_ceil(4);
    let mut host = PinnedBuffer::<u32>::alloc(&src_dev, max)?;
    fill_random(host.as_mut_slice()?, 0xC0B1);
    let mut src = DeviceBuffer::<u32>::alloc(&src_dev, max)?;
    copy_from_host(&src_stream, &host.view(..), &mut src.view_mut(..))?;
    let mut dst = DeviceBuffer::<u32>::alloc(&dst_dev, max)?;
    let route = args.route.0;
    let options = CopyOptions { route, chunk_bytes: args.chunk, slots: args.slots };
    let bar = progress(sizes.len());
    let mut rows = Vec::new();
    let mut traces = Vec::new();
    for &bytes in &sizes {
        let n = bytes.div_ceil(4);
        bar.set_message(format!("copy {route} {}", format_size(bytes)));
        dst.fill_bytes(&dst_stream, 0xA5)?;
        dst_stream.synchronize()?;
        let mut taken = route;
        let timing = timed_runs(
            &src_stream,
            repeats,
            || Ok(()),
            || {
                taken = transport().copy(&src.view(..n), &src_stream, &mut dst.view_mut(..n), &dst_stream, options)?;
                Ok(())
            },
        )?;
        let got = dst.view(..n).to_host_vec(&dst_stream)?;
        let wrong = got.iter().zip(&host.as_slice()?[..n]).filter(|(g, w)| g != w).count();
        if let Some(trace) = &timing.trace {
            traces.push((format_size(bytes), trace.clone()));
        }
        let seconds = timing.gpu_seconds;
        let busbw = (n * 4) as f64 / seconds / 1e9;
        rows.push(Row {
            bench: "copy",
            route: taken.to_string(),
            dtype: "u32".into(),
            op: "none".into(),
            ranks: if one_card { 1 } else { 2 },
            bytes: n * 4,
            count: n,
            time_us: seconds * 1e6,
            algbw: busbw,
            busbw,
            ceiling: binding,
            ceiling_name: binding_name,
            ratio: busbw / binding,
            enqueue_us: Some(timing.enqueue_seconds * 1e6),
            model_us: None,
            wrong,
            error: None,
        });
        bar.inc(1);
    }
    bar.finish_and_clear();
    let report = Report::new(&src_dev, measured, c.iters, rows)?.on_streams(c.stream.name());
    print_copy(&report, args);
    for (size, trace) in &traces {
        print_trace(size, trace);
    }
    finish(&report, c, "copy")
}

fn print_copy(report: &Report, args: &CopyArgs) {
    let c = |name: &str| report.ceilings.get(name).copied().unwrap_or(f64::NAN);
    println!(
        "# gp2p bench copy --route {} --src {} --dst {} on {} ({}), medians of {} timed runs",
        args.route.0, args.src, args.dst, report.gpu.name, report.gpu.driver, report.repeats
    );
    let duplex = report.ceilings.get("duplex").map_or(String::new(), |d| format!(", duplex {d:.1} GB/s each way"));
    println!(
        "# ceilings: d2h {:.1} GB/s, h2d {:.1} GB/s{duplex}; min one-way {:.1}",
        c("d2h"),
        c("h2d").min(c("h2d_dst")),
        c("min_one_way")
    );
    let mut t = table(
        &["size", "count", "route", "time us", "GB/s", "/ceil", "/one-way", "enqueue us", "/gpu", "#wrong"],
        &["route"],
    );
    for r in &report.rows {
        let enqueue = r.enqueue_us.unwrap_or(f64::NAN);
        t.add_row(vec![
            format_size(r.bytes),
            r.count.to_string(),
            r.route.clone(),
            num(r.time_us, 1),
            num(r.busbw, 2),
            num(r.ratio, 3),
            num(r.busbw / c("min_one_way"), 3),
            num(enqueue, 1),
            num(enqueue / r.time_us, 3),
            r.wrong.to_string(),
        ]);
    }
    println!("{}", t.trim_fmt());
    if let Some(small) = report.rows.iter().find(|r| r.bytes == SMALL_BYTES) {
        println!(
            "# {}: {:.1} us against one D2H + one H2D of {} in {:.1} us: {:.2}x",
            format_size(SMALL_BYTES),
            small.time_us,
            format_size(SMALL_BYTES),
            c("small_pair_us"),
            small.time_us / c("small_pair_us")
        );
    }
}
