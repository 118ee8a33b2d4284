//! `gp2p probe`: why P2P is off for each pair, and what would turn it on.

use std::path::PathBuf;

use clap::Args;
use geforce_p2p::probe::{Report, examples, load};
use geforce_p2p::{CopyOptions, Device, DeviceBuffer, Route, Stream, transport};

use crate::bench::CEILING_BYTES;
use crate::error::CliError;
use crate::measure::{Ceilings, Repeats, duplex_all_at_once, timed_runs};
use crate::table::{num, table};

#[derive(Args)]
pub struct ProbeArgs {
    /// Also write the facts and verdicts as JSON to FILE (attach it to bug reports); `-`
    /// prints the JSON instead of the tables.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Re-render a report from facts saved with --json, instead of probing this machine.
    #[arg(long)]
    from: Option<PathBuf>,
    /// Also measure each device link (one-way and both ways) and each pair's copy rate.
    #[arg(long)]
    measure: bool,
    /// Render the report of a bundled example machine instead of probing this one (no GPU
    /// needed); without NAME, or with an unknown one, list the examples.
    #[arg(long, value_name = "NAME", num_args = 0..=1, default_missing_value = "", conflicts_with_all = ["from", "measure"])]
    example: Option<String>,
}

/// Runs per measurement (median).
const MEASURE_REPEATS: Repeats = Repeats { warmup: 2, timed: 10 };

pub fn run(args: &ProbeArgs) -> Result<(), CliError> {
    let report = match (&args.from, &args.example) {
        (Some(path), _) => Report::new(load(path)?),
        (None, Some(name)) => match examples::example(name) {
            Some(example) => Report::new(example.facts()?),
            None if name.is_empty() => {
                print!("bundled examples (gp2p probe --example NAME):\n{}", examples::list());
                return Ok(());
            }
            None => {
                let list = examples::list();
                return Err(CliError::Usage(format!(
                    "no bundled example is called {name:?}; the bundled examples are:\n{}",
                    list.trim_end()
                )));
            }
        },
        (None, None) => geforce_p2p::probe().map_err(|e| {
            let unavailable = e.is_unavailable();
            let e = CliError::from(e);
            if unavailable { CliError::Hinted { error: Box::new(e), hint: crate::NO_DRIVER_HINT.into() } } else { e }
        })?,
    };
    match &args.json {
        Some(path) if path.as_os_str() == "-" => println!("{}", report.to_json()),
        Some(path) => {
            print!("{}", report.render());
            let io = |source| CliError::Io { path: path.display().to_string(), source };
            std::fs::write(path, report.to_json() + "\n").map_err(io)?;
            eprintln!("wrote {}", path.display());
        }
        None => print!("{}", report.render()),
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
    /// Every measured card running its duplex traffic at the same time: what each card
    /// gets then, what they move together through host memory, and what binds.
    pub together: Option<AllCards>,
}

/// Every card's link busy both ways at once, all cards together: the host's ceiling.
#[derive(Debug, Clone, serde::Serialize)]
pub struct AllCards {
    /// Per card, its rates while every card runs.
    pub cards: Vec<CardTogether>,
    /// What all cards move through host memory together, both directions summed.
    pub host_gbps: f64,
    /// The lowest of the cards' each-way rate together over their duplex rate alone.
    pub worst_ratio: f64,
    /// What binds: each card's own link, or the host (memory or a shared uplink).
    pub binds: String,
}

/// One card's rates while every card runs its duplex traffic.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CardTogether {
    /// The CUDA ordinal.
    pub device: usize,
    /// Device to host, with every card busy both ways.
    pub d2h_gbps: f64,
    /// Host to device, with every card busy both ways.
    pub h2d_gbps: f64,
}

/// Cards that keep this share of their duplex rate when all run together are bound by
/// their own links; below it, by what they share (host memory, a switch's uplink).
const OWN_LINK_SHARE: f64 = 0.95;

impl AllCards {
    /// From the rates each card reached alone (`alone`: duplex each way, in card order) and
    /// together (`together`: `[d2h, h2d]`).
    pub fn new(devices: &[usize], alone: &[f64], together: &[[f64; 2]]) -> AllCards {
        let cards: Vec<CardTogether> = devices
            .iter()
            .zip(together)
            .map(|(&device, &[d2h_gbps, h2d_gbps])| CardTogether { device, d2h_gbps, h2d_gbps })
            .collect();
        let host_gbps = cards.iter().map(|c| c.d2h_gbps + c.h2d_gbps).sum();
        let worst_ratio = cards
            .iter()
            .zip(alone)
            .map(|(c, &alone)| (c.d2h_gbps + c.h2d_gbps) / 2.0 / alone)
            .fold(f64::INFINITY, f64::min);
        let binds = if cards.len() < 2 {
            "the card's own link (one card: nothing shares the host)".to_owned()
        } else if worst_ratio >= OWN_LINK_SHARE {
            format!("each card's own link (together every card keeps {worst_ratio:.2} or more of its rate alone)")
        } else {
            format!(
                "the host: host memory or a shared uplink (together a card keeps as little as {worst_ratio:.2} of its rate alone)"
            )
        };
        AllCards { cards, host_gbps, worst_ratio, binds }
    }
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
        if let Some(all) = &self.together {
            let mut cards = table(&["device", "d2h GB/s", "h2d GB/s"], &[]);
            for c in &all.cards {
                cards.add_row(vec![c.device.to_string(), num(c.d2h_gbps, 1), num(c.h2d_gbps, 1)]);
            }
            out.push_str(&format!(
                "every card at once, both ways:\n{}\nhost ceiling: {} GB/s through host memory, all cards together; binds: {}\n",
                cards.trim_fmt(),
                num(all.host_gbps, 1),
                all.binds
            ));
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
        together: None,
    };
    let mut devices = Vec::new();
    for d in &report.facts.devices {
        let Ok(device) = Device::open(d.ordinal) else {
            rates.unopened.push(d.ordinal);
            continue;
        };
        let stream = Stream::new(&device)?;
        devices.push((d.ordinal, device, stream));
    }
    {
        let mut cards = devices
            .iter()
            .map(|(_, device, stream)| Ceilings::new(device, stream, CEILING_BYTES, MEASURE_REPEATS))
            .collect::<Result<Vec<_>, _>>()?;
        // One card at a time first, then all of them at once.
        for ((ordinal, _, _), c) in devices.iter().zip(cards.iter_mut()) {
            let (h2d_gbps, d2h_gbps) = (c.h2d()?, c.d2h()?);
            let duplex_gbps = c.duplex()?;
            rates.devices.push(DeviceLink { device: *ordinal, h2d_gbps, d2h_gbps, duplex_gbps });
        }
        if !cards.is_empty() {
            let together = duplex_all_at_once(&mut cards)?.cards;
            let ordinals: Vec<usize> = devices.iter().map(|(o, _, _)| *o).collect();
            let alone: Vec<f64> = rates.devices.iter().map(|d| d.duplex_gbps).collect();
            rates.together = Some(AllCards::new(&ordinals, &alone, &together));
        }
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

#[cfg(test)]
mod tests {
    use super::AllCards;

    #[test]
    fn what_binds_all_cards_is_named_from_their_rates_alone_and_together() {
        // One card: its own link, whatever the rates.
        let one = AllCards::new(&[0], &[49.6], &[[48.0, 50.0]]);
        assert!(one.binds.starts_with("the card's own link"), "{}", one.binds);
        assert!((one.host_gbps - 98.0).abs() < 1e-9);
        // Two cards that keep their rates: their own links.
        let free = AllCards::new(&[0, 1], &[49.6, 49.6], &[[48.9, 49.9], [49.0, 50.2]]);
        assert!(free.binds.starts_with("each card's own link"), "{}", free.binds);
        assert!((free.worst_ratio - (48.9 + 49.9) / 2.0 / 49.6).abs() < 1e-9);
        // Eight Gen4 cards that drop to 13 GB/s each way from 24: the host binds.
        let alone = [24.0; 8];
        let together = [[13.0, 13.0]; 8];
        let shared = AllCards::new(&[0, 1, 2, 3, 4, 5, 6, 7], &alone, &together);
        assert!(shared.binds.starts_with("the host"), "{}", shared.binds);
        assert!((shared.host_gbps - 8.0 * 26.0).abs() < 1e-9);
        assert!((shared.worst_ratio - 13.0 / 24.0).abs() < 1e-9);
    }
}
