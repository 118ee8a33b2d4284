//! `gp2p probe`: why P2P is off for each pair, and what would turn it on.

use std::path::PathBuf;

use clap::Args;
use geforce_p2p::probe::{Report, load};
use geforce_p2p::{CopyOptions, Device, DeviceBuffer, Route, Stream, transport};

use crate::bench::CEILING_BYTES;
use crate::error::CliError;
use crate::measure::{Ceilings, Repeats, timed_runs};
use crate::table::{num, table};

#[derive(Args)]
pub struct ProbeArgs {
    /// Print the facts and verdicts as JSON (attach this to bug reports).
    #[arg(long)]
    json: bool,
    /// Re-render a report from facts saved with --json, instead of probing this machine.
    #[arg(long)]
    from: Option<PathBuf>,
    /// Also measure each device link (one-way and both ways) and each pair's copy rate.
    #[arg(long)]
    measure: bool,
}

/// Runs per measurement (median).
const MEASURE_REPEATS: Repeats = Repeats { warmup: 2, timed: 10 };

pub fn run(args: &ProbeArgs) -> Result<(), CliError> {
    let report = match &args.from {
        Some(path) => Report::new(load(path)?),
        None => geforce_p2p::probe()?,
    };
    if args.json {
        println!("{}", report.to_json());
    } else {
        print!("{}", report.render());
    }
    if args.measure && args.from.is_none() {
        measure(&report)?;
    }
    Ok(())
}

/// Per device: pinned H2D and D2H alone and both at once; per pair: the copy rate by the
/// route Auto picks and by the staged route.
fn measure(report: &Report) -> Result<(), CliError> {
    println!(
        "\nmeasured ({} transfers, medians of {}):",
        crate::sizes::format_size(CEILING_BYTES),
        MEASURE_REPEATS.timed
    );
    let mut devices = Vec::new();
    let mut links = table(&["device", "h2d GB/s", "d2h GB/s", "both ways, each GB/s"], &[]);
    for d in &report.facts.devices {
        let Ok(device) = Device::open(d.ordinal) else {
            println!("  device {}: cannot be opened, not measured", d.ordinal);
            continue;
        };
        let stream = Stream::new(&device)?;
        let mut c = Ceilings::new(&device, &stream, CEILING_BYTES, MEASURE_REPEATS)?;
        let (h2d, d2h) = (c.h2d()?, c.d2h()?);
        let both = c.duplex()?;
        links.add_row(vec![d.ordinal.to_string(), num(h2d, 1), num(d2h, 1), num(both, 1)]);
        devices.push((device, stream));
    }
    println!("{}", links.trim_fmt());
    let mut pairs = table(&["from", "to", "route", "took", "GB/s"], &["route", "took"]);
    for (a, (da, sa)) in devices.iter().enumerate() {
        for (b, (db, sb)) in devices.iter().enumerate() {
            if a == b {
                continue;
            }
            let len = CEILING_BYTES / 4;
            let src = DeviceBuffer::<u32>::alloc(da, len)?;
            let mut dst = DeviceBuffer::<u32>::alloc(db, len)?;
            for route in [Route::Auto, Route::Staged] {
                let options = CopyOptions { route, ..CopyOptions::default() };
                let mut taken = route;
                let t = timed_runs(
                    sa,
                    MEASURE_REPEATS,
                    || Ok(()),
                    || {
                        taken = transport().copy(&src.view(..), sa, &mut dst.view_mut(..), sb, options)?;
                        Ok(())
                    },
                )?;
                let rate = CEILING_BYTES as f64 / t.gpu_seconds / 1e9;
                pairs.add_row(vec![a.to_string(), b.to_string(), route.to_string(), taken.to_string(), num(rate, 1)]);
            }
        }
    }
    if devices.len() > 1 {
        println!("{}", pairs.trim_fmt());
    }
    Ok(())
}
