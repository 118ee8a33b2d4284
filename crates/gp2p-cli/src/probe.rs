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
        print!("{}", measure_links(&report)?.render());
    }
    Ok(())
}

/// What `--measure` (and `geforce_p2p.probe(measure=True)`) measures: per device the pinned
/// H2D and D2H rates alone and both ways at once; per ordered pair the copy rate by the
/// route `Auto` picks and by the staged route. GB/s = 1e9 bytes per second.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LinkRates {
    /// The size of each timed transfer.
    pub transfer_bytes: usize,
    /// Timed runs per figure (each figure is their median).
    pub runs: usize,
    /// Per device that could be opened.
    pub devices: Vec<DeviceLink>,
    /// Devices that could not be opened, not measured.
    pub unopened: Vec<usize>,
    /// Per ordered pair of measured devices, each route.
    pub pairs: Vec<PairCopy>,
}

/// One device's link to host memory.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DeviceLink {
    /// The CUDA ordinal.
    pub device: usize,
    /// Host to device alone.
    pub h2d_gbps: f64,
    /// Device to host alone.
    pub d2h_gbps: f64,
    /// Each way, both directions at once (the duplex ceiling).
    pub duplex_gbps: f64,
}

/// One copy between two devices.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PairCopy {
    /// Source ordinal.
    pub from: usize,
    /// Destination ordinal.
    pub to: usize,
    /// The route asked for (`auto` or `staged`).
    pub route: String,
    /// The route the copy took.
    pub took: String,
    /// The copy's rate.
    pub gbps: f64,
}

impl LinkRates {
    /// The JSON form (what Python's `ProbeReport.links` holds).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    }

    /// The tables `gp2p probe --measure` prints.
    pub fn render(&self) -> String {
        let mut out = format!(
            "\nmeasured ({} transfers, medians of {}):\n",
            crate::sizes::format_size(self.transfer_bytes),
            self.runs
        );
        for d in &self.unopened {
            out.push_str(&format!("  device {d}: cannot be opened, not measured\n"));
        }
        let mut links = table(&["device", "h2d GB/s", "d2h GB/s", "both ways, each GB/s"], &[]);
        for d in &self.devices {
            links.add_row(vec![d.device.to_string(), num(d.h2d_gbps, 1), num(d.d2h_gbps, 1), num(d.duplex_gbps, 1)]);
        }
        out.push_str(&format!("{}\n", links.trim_fmt()));
        if !self.pairs.is_empty() {
            let mut pairs = table(&["from", "to", "route", "took", "GB/s"], &["route", "took"]);
            for p in &self.pairs {
                pairs.add_row(vec![
                    p.from.to_string(),
                    p.to.to_string(),
                    p.route.clone(),
                    p.took.clone(),
                    num(p.gbps, 1),
                ]);
            }
            out.push_str(&format!("{}\n", pairs.trim_fmt()));
        }
        out
    }
}

/// Measure the link rates of the devices in `report` (see [`LinkRates`]); takes a few
/// seconds per device and pair.
pub fn measure_links(report: &Report) -> Result<LinkRates, CliError> {
    let mut rates = LinkRates {
        transfer_bytes: CEILING_BYTES,
        runs: MEASURE_REPEATS.timed,
        devices: Vec::new(),
        unopened: Vec::new(),
        pairs: Vec::new(),
    };
    let mut devices = Vec::new();
    for d in &report.facts.devices {
        let Ok(device) = Device::open(d.ordinal) else {
            rates.unopened.push(d.ordinal);
            continue;
        };
        let stream = Stream::new(&device)?;
        let mut c = Ceilings::new(&device, &stream, CEILING_BYTES, MEASURE_REPEATS)?;
        let (h2d_gbps, d2h_gbps) = (c.h2d()?, c.d2h()?);
        let duplex_gbps = c.duplex()?;
        drop(c);
        rates.devices.push(DeviceLink { device: d.ordinal, h2d_gbps, d2h_gbps, duplex_gbps });
        devices.push((d.ordinal, device, stream));
    }
    for (a, da, sa) in &devices {
        for (b, db, sb) in &devices {
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
                let gbps = CEILING_BYTES as f64 / t.gpu_seconds / 1e9;
                rates.pairs.push(PairCopy {
                    from: *a,
                    to: *b,
                    route: route.to_string(),
                    took: taken.to_string(),
                    gbps,
                });
            }
        }
    }
    Ok(rates)
}
