//! `gp2p plan --ranks N`: the cost model's predicted time of each all-reduce algorithm per
//! size, its choice and what binds it (`geforce_p2p::collectives::cost`). A model, not a
//! measurement: it needs no GPU, except that `--measure` takes the per-card rates (and,
//! with two cards or more, the host's) from this machine's links, a phase's handoff and a
//! chunk step's operation from its first card, and DRAM from every core copying while
//! the first card's DMAs run both ways (`plan::dram`: the cores alone cannot load host memory
//! as DMAs do).

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::Args;
use geforce_p2p::collectives::cost::{self, ALGORITHM_VAR, Algorithm, Machine, Plan};
use geforce_p2p::collectives::hosts::{Network, across_hosts};
use geforce_p2p::comm::CommOptions;
use geforce_p2p::comm::choice::{AllReducePaths, all_reduce_prediction};

use crate::error::CliError;
use crate::sizes::{format_size, parse_size, sweep};

mod compressed;
mod dram;
mod measured;
use crate::table::{num, table};
pub(crate) use dram::dram_gbps;
use measured::{Measured, measure};
pub(crate) use measured::{handoff_us, op_us};

#[derive(Args)]
pub struct PlanArgs {
    /// Ranks (cards) in the all-reduce: 2 or more (default with --example: its cards).
    #[arg(long, required_unless_present = "example")]
    ranks: Option<usize>,
    /// The most cards behind one shared PCIe uplink (a switch): 1 where every card has its
    /// own link (default: 1, or the topology the probe finds with --measure or --example).
    #[arg(long, value_name = "CARDS")]
    uplink: Option<usize>,
    /// Ranks that share one GPU, as on a test bed of N processes on one card under MPS: their
    /// chunk steps take turns on its copy engines (default 1: a card each). They share its
    /// link too: the uplink's cards are at least this many.
    #[arg(long, value_name = "RANKS", default_value_t = 1)]
    ranks_per_gpu: usize,
    /// Plan for a bundled example machine: its cards and topology; its rates are not in the
    /// example, so the defaults or flags stand. Without NAME, list the examples (as `gp2p
    /// probe --example` does).
    #[arg(long, value_name = "NAME", num_args = 0..=1, default_missing_value = "", conflicts_with = "measure")]
    example: Option<String>,
    /// Host to device per card, alone, GB/s (default: the model's, measured on an H200).
    #[arg(long, value_name = "GB/s")]
    h2d: Option<f64>,
    /// Device to host per card, alone, GB/s.
    #[arg(long, value_name = "GB/s")]
    d2h: Option<f64>,
    /// Per card, each way with both directions at once, GB/s.
    #[arg(long, value_name = "GB/s")]
    duplex: Option<f64>,
    /// What all cards together move through host memory, up plus down, GB/s.
    #[arg(long, value_name = "GB/s")]
    host: Option<f64>,
    /// Host memory, bytes read plus written, GB/s.
    #[arg(long, value_name = "GB/s")]
    dram: Option<f64>,
    /// The cost of one dependent phase (a trip through host memory and its flag), µs.
    #[arg(long, value_name = "US")]
    handoff_us: Option<f64>,
    /// The cost of one dependent GPU operation of a pipeline's chunk step (a kernel after a
    /// copy or the reverse), µs (default: a fit on an H100).
    #[arg(long, value_name = "US")]
    op_us: Option<f64>,
    /// Sizes per rank, comma-separated (bytes; K, M, G suffixes), instead of -b/-e/-f.
    #[arg(long, value_delimiter = ',', value_parser = parse_size, conflicts_with_all = ["begin", "end", "factor"])]
    sizes: Option<Vec<usize>>,
    /// Smallest size per rank (bytes; K, M, G suffixes).
    #[arg(short = 'b', long, default_value = "4", value_parser = parse_size)]
    begin: usize,
    /// Largest size.
    #[arg(short = 'e', long, default_value = "1G", value_parser = parse_size)]
    end: usize,
    /// Step factor between sizes.
    #[arg(short = 'f', long, default_value_t = 4)]
    factor: usize,
    /// Hosts of `--ranks` cards each: also price the all-reduce across them, two-level (this
    /// library inside each host, an engine for networks between) against one flat ring.
    #[arg(long, value_name = "HOSTS")]
    hosts: Option<usize>,
    /// The network between hosts, Gb/s per host each way (with --hosts).
    #[arg(long, value_name = "Gb/s", default_value_t = 25.0, requires = "hosts")]
    network_gbps: f64,
    /// One message's latency across that network, µs (with --hosts).
    #[arg(long, value_name = "US", default_value_t = 10.0, requires = "hosts")]
    network_latency_us: f64,
    /// Also write the machine and the table as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Measure the per-card link rates here (and the host's, with two cards or more), as
    /// `gp2p probe --measure` does, the handoff (a 4 KiB round trip through host memory on
    /// the first card) and a chunk step's operation (a kernel and 4 KiB copies in turn on one
    /// stream); a flag given still wins. Needs a GPU.
    #[arg(long)]
    measure: bool,
}

/// The most ranks `gp2p plan` prices: far beyond one host's cards, and small enough that
/// the model's arithmetic (2(N−1) phases, N² host bytes) cannot overflow.
const MAX_RANKS: usize = 4096;

/// Where a rate of the machine came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
enum Source {
    /// The model's default (measured on this project's H200 machines).
    Default,
    /// A command-line flag.
    Flag,
    /// `--measure`, on this machine.
    Measured,
}

/// The machine's rates and where each came from, in [`RATES`] order.
struct Rates {
    machine: Machine,
    sources: [Source; 7],
    /// What `--measure` measured on, for the machine line.
    measured_on: Option<String>,
    /// Where the uplink sharing came from (`--uplink`, or the probe's topology of this
    /// machine or of an example); None where neither said.
    placed: Option<String>,
}

/// The rates' flag names, in the order [`Rates::sources`] and [`rate_mut`] use.
const RATES: [&str; 7] = ["h2d", "d2h", "duplex", "host", "dram", "handoff-us", "op-us"];

/// Where [`RATES`]' times begin: the rates before it are GB/s, above 0; the times µs, 0 or more.
const FIRST_TIME: usize = 5;

fn rate_mut(machine: &mut Machine, i: usize) -> &mut f64 {
    match i {
        0 => &mut machine.h2d_gbps,
        1 => &mut machine.d2h_gbps,
        2 => &mut machine.duplex_gbps,
        3 => &mut machine.host_gbps,
        4 => &mut machine.dram_gbps,
        5 => &mut machine.handoff_us,
        _ => &mut machine.op_us,
    }
}

/// Where the cards sit, from the probe's topology (of this machine, or of an example).
struct Placement {
    /// Cards the probe saw.
    cards: usize,
    /// The most cards behind one shared uplink (1: each its own).
    per_uplink: usize,
    /// Whose topology: "this machine" or the example's name.
    of: String,
}

impl Placement {
    fn new(facts: &geforce_p2p::probe::Facts, of: String) -> Placement {
        let topology = geforce_p2p::probe::Topology::new(facts);
        let per_uplink = topology.uplinks.iter().map(|u| u.cards.len()).max().unwrap_or(1).max(1);
        Placement { cards: facts.devices.len(), per_uplink, of }
    }
}

impl PlanArgs {
    fn sizes(&self) -> Result<Vec<usize>, CliError> {
        let sizes = match &self.sizes {
            Some(sizes) => sizes.clone(),
            None => sweep(self.begin, self.end, self.factor).map_err(CliError::Usage)?,
        };
        if sizes.contains(&0) {
            return Err(CliError::Usage("--sizes: every size must be at least 1 byte".into()));
        }
        Ok(sizes)
    }

    /// The machine: flags first, then what `measured` has, then the model's defaults.
    /// The network of `--hosts`, its flags checked.
    fn network(&self) -> Result<Network, CliError> {
        let (gbps, latency_us) = (self.network_gbps, self.network_latency_us);
        if !(gbps.is_finite() && gbps > 0.0) {
            return Err(CliError::Usage(format!("--network-gbps {gbps}: expected a rate above 0 Gb/s")));
        }
        if !(latency_us.is_finite() && latency_us >= 0.0) {
            return Err(CliError::Usage(format!("--network-latency-us {latency_us}: expected 0 µs or more")));
        }
        match self.hosts {
            Some(h) if !(1..=MAX_RANKS).contains(&h) => {
                Err(CliError::Usage(format!("--hosts {h}: expected 1 to {MAX_RANKS} hosts")))
            }
            _ => Ok(Network { gbps, latency_us }),
        }
    }

    fn rates(&self, measured: Option<&Measured>, place: Option<&Placement>) -> Result<Rates, CliError> {
        let ranks = self.ranks.or(place.map(|p| p.cards)).unwrap_or(0);
        if !(2..=MAX_RANKS).contains(&ranks) {
            return Err(CliError::Usage(format!(
                "--ranks {ranks}: the cost model plans all-reduces of 2 to {MAX_RANKS} ranks (one rank moves nothing)"
            )));
        }
        let mut machine = Machine::h200(ranks);
        let (per_uplink, mut placed) = match (self.uplink, place) {
            (Some(k), _) if k == 0 || k > ranks => {
                return Err(CliError::Usage(format!("--uplink {k}: expected 1 to {ranks} cards (of --ranks {ranks})")));
            }
            (Some(k), _) => (k, "--uplink".to_owned()),
            (None, Some(p)) => (p.per_uplink, format!("{}'s topology", p.of)),
            (None, None) => (1, String::new()),
        };
        if per_uplink > ranks {
            // The topology's cards outnumber the ranks asked for: at most all of them share.
            placed.push_str(&format!(", {per_uplink} cards there, at most {ranks} here"));
        }
        if self.ranks_per_gpu == 0 || self.ranks_per_gpu > ranks {
            return Err(CliError::Usage(format!(
                "--ranks-per-gpu {}: expected 1 to {ranks} ranks (of --ranks {ranks})",
                self.ranks_per_gpu
            )));
        }
        machine.ranks_per_device = self.ranks_per_gpu;
        // Ranks on one GPU share its link too.
        machine.cards_per_uplink = per_uplink.max(self.ranks_per_gpu).min(ranks);
        if self.ranks_per_gpu > per_uplink.min(ranks) {
            placed = "--ranks-per-gpu: ranks on one GPU share its link".to_owned();
        }
        let mut sources = [Source::Default; 7];
        if let Some(m) = measured {
            for (i, &rate) in m.card.iter().enumerate() {
                *rate_mut(&mut machine, i) = rate;
                sources[i] = Source::Measured;
            }
            if let Some(host) = m.host_gbps {
                machine.host_gbps = host;
                sources[3] = Source::Measured;
            }
            machine.handoff_us = m.handoff_us;
            sources[5] = Source::Measured;
            machine.dram_gbps = m.dram_gbps;
            sources[4] = Source::Measured;
            machine.op_us = m.op_us;
            sources[6] = Source::Measured;
        }
        let flags = [self.h2d, self.d2h, self.duplex, self.host, self.dram, self.handoff_us, self.op_us];
        for (i, flag) in flags.into_iter().enumerate() {
            let Some(value) = flag else { continue };
            let time = i >= FIRST_TIME;
            if !value.is_finite() || value < 0.0 || (value == 0.0 && !time) {
                let what = if time { "a time of 0 µs or more" } else { "a rate above 0 GB/s" };
                return Err(CliError::Usage(format!("--{} {value}: expected {what}", RATES[i])));
            }
            *rate_mut(&mut machine, i) = value;
            sources[i] = Source::Flag;
        }
        let measured_on = measured.map(|m| {
            let cards = match (m.cards, m.host_gbps) {
                (1, _) => "on 1 card".to_owned(),
                (n, Some(_)) => format!(
                    "the slowest of {n} cards; the host with all {n} at once; the handoff and an operation on the first"
                ),
                (n, None) => format!("the slowest of {n} cards; the handoff and an operation on the first"),
            };
            cards + "; DRAM with every core copying beside the first card's DMAs"
        });
        let placed = (!placed.is_empty()).then_some(placed);
        Ok(Rates { machine, sources, measured_on, placed })
    }
}

pub fn run(args: &PlanArgs) -> Result<(), CliError> {
    let example = match &args.example {
        Some(name) if name.is_empty() => {
            print!("bundled examples (gp2p plan --example NAME):\n{}", geforce_p2p::probe::examples::list());
            return Ok(());
        }
        Some(name) => {
            let Some(example) = geforce_p2p::probe::examples::example(name) else {
                return Err(CliError::Usage(format!(
                    "--example {name}: no such example; the bundled ones:\n{}",
                    geforce_p2p::probe::examples::list()
                )));
            };
            Some(Placement::new(&example.facts()?, format!("the example {name}")))
        }
        None => None,
    };
    // Refuse bad flags (and a bad GP2P_ALGORITHM) before measuring anything.
    args.rates(None, example.as_ref())?;
    args.network()?;
    let sizes = args.sizes()?;
    let forced = cost::forced_by_env()?;
    let (measured, place) = if args.measure {
        let (measured, place) = measure()?;
        (Some(measured), Some(place))
    } else {
        (None, example)
    };
    let rates = args.rates(measured.as_ref(), place.as_ref())?;
    let plans: Vec<(usize, Plan)> =
        sizes.iter().map(|&bytes| (bytes, cost::choose_with(&rates.machine, bytes, forced))).collect();
    print!("{}", render(&rates, &plans, forced));
    if let Some(hosts) = args.hosts {
        let network = args.network()?;
        print!("{}", render_hosts(&rates.machine, hosts, network, &sizes));
    }
    if let Some(path) = &args.json {
        let io = |source| CliError::Io { path: path.display().to_string(), source };
        let text =
            serde_json::to_string_pretty(&json(&rates, &plans, forced)).map_err(|e| io(std::io::Error::other(e)))?;
        std::fs::write(path, text + "\n").map_err(io)?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

/// nccl-tests' all_reduce bus bandwidth: 2(N−1)/N·S per second, GB/s.
fn busbw_gbps(ranks: usize, bytes: usize, seconds: f64) -> f64 {
    let n = ranks as f64;
    2.0 * (n - 1.0) / n * bytes as f64 / seconds / 1e9
}

/// What `gp2p plan` prints: the machine, where its rates came from, the table, and what the
/// table is and is not.
fn render(rates: &Rates, plans: &[(usize, Plan)], forced: Option<Algorithm>) -> String {
    let m = &rates.machine;
    let mut out = format!(
        "gp2p plan: all_reduce over {} ranks, every byte through pinned host memory\n\
         machine: per card h2d {:.1} GB/s, d2h {:.1}, duplex {:.1} each way; host {:.1} GB/s all cards up + down; \
         DRAM {:.1} GB/s; handoff {:.1} µs per phase; {:.2} µs per operation of a pipeline's chunk step\n",
        m.ranks, m.h2d_gbps, m.d2h_gbps, m.duplex_gbps, m.host_gbps, m.dram_gbps, m.handoff_us, m.op_us
    );
    for (source, says) in [
        (Source::Measured, "measured here"),
        (Source::Flag, "from flags"),
        (Source::Default, "the model's defaults (measured on H200s; op-us fitted on an H100)"),
    ] {
        let names: Vec<&str> =
            RATES.iter().zip(&rates.sources).filter(|(_, s)| **s == source).map(|(n, _)| *n).collect();
        if !names.is_empty() {
            let on = match (source, &rates.measured_on) {
                (Source::Measured, Some(on)) => format!(" ({on})"),
                _ => String::new(),
            };
            out.push_str(&format!("  {says}{on}: {}\n", names.join(", ")));
        }
    }
    let from = rates.placed.as_deref().unwrap_or("the default");
    if m.cards_per_uplink > 1 {
        out.push_str(&format!("  uplink: {} cards share one PCIe uplink at most ({from})\n", m.cards_per_uplink));
    } else if rates.placed.is_some() {
        out.push_str(&format!("  uplink: every card has its own ({from})\n"));
    }
    if m.ranks_per_device > 1 {
        out.push_str(&format!(
            "  GPU: {} ranks share one, their chunk steps taking turns on its copy engines (--ranks-per-gpu)\n",
            m.ranks_per_device
        ));
    }
    let mut header: Vec<String> = vec!["size".into()];
    header.extend(Algorithm::ALL.iter().map(|a| format!("{a} µs")));
    header.extend(["chosen", "bound", "busbw GB/s"].map(String::from));
    let header: Vec<&str> = header.iter().map(String::as_str).collect();
    let mut t = table(&header, &["chosen", "bound"]);
    for (bytes, plan) in plans {
        let chosen = plan.prediction();
        let mut row = vec![format_size(*bytes)];
        row.extend(plan.predictions.iter().map(|p| num(p.seconds * 1e6, 1)));
        row.push(if plan.forced { format!("{} (forced)", plan.chosen) } else { plan.chosen.to_string() });
        row.push(chosen.bound.to_string());
        row.push(num(busbw_gbps(m.ranks, *bytes, chosen.seconds), 2));
        t.add_row(row);
    }
    out.push_str(&format!("{}\n", t.trim_fmt()));
    let names = Algorithm::ALL.map(Algorithm::name).join("|");
    match forced {
        Some(a) => out.push_str(&format!("{ALGORITHM_VAR}={a} forces every choice above; unset it for the model's.\n")),
        None => out.push_str(&format!("{ALGORITHM_VAR}={names} forces a choice.\n")),
    }
    out.push_str(&communicator_table(m, plans, forced));
    let sizes: Vec<usize> = plans.iter().map(|(bytes, _)| *bytes).collect();
    out.push_str(&compressed::compressed_table(m, &sizes));
    out.push_str(
        "The tables are the model's predictions, not measurements. In one process (the engine behind \
         geforce_p2p.all_reduce) two ranks run the ring and more run the cheaper of the ring and two-shot, \
         priced at H200 rates; never one-shot.\n",
    );
    out
}

/// The all-reduce across `hosts` hosts of `m.ranks` cards each: two-level (as built, and
/// pipelined) against one flat ring (`geforce_p2p::collectives::hosts`).
fn render_hosts(m: &Machine, hosts: usize, network: Network, sizes: &[usize]) -> String {
    let mut out = format!(
        "Across {hosts} hosts of {} cards, {} Gb/s and {} µs a step between them (geforce_p2p.distributed's \
         two levels against one flat ring over all {} ranks):\n",
        m.ranks,
        network.gbps,
        network.latency_us,
        hosts * m.ranks
    );
    let mut t =
        table(&["size", "two-level µs", "pipelined µs", "flat ring µs", "flat / two-level", "network bytes"], &[]);
    for &bytes in sizes {
        let c = across_hosts(m, hosts, network, bytes);
        let ratio = if c.flat_network_bytes > 0.0 { c.two_level_network_bytes / c.flat_network_bytes } else { 0.0 };
        t.add_row(vec![
            format_size(bytes),
            num(c.two_level * 1e6, 1),
            num(c.two_level_pipelined * 1e6, 1),
            num(c.flat * 1e6, 1),
            num(c.flat / c.two_level, 2),
            format!("{} of the ring's", num(ratio, 2)),
        ]);
    }
    out.push_str(&format!("{}\n", t.trim_fmt()));
    out.push_str(
        "\"pipelined\": the stages overlapped chunk by chunk, the bound the backend's chunks \
         (GP2P_ACROSS_CHUNK_BYTES) approach; how close they come on GPUs is not measured.\n",
    );
    out
}

/// What the one-process-per-GPU communicator runs at each size and the model's time for it,
/// priced as it runs (`gp2p_comm::choice::all_reduce_prediction`: the pipelined paths with
/// their fill), with the default options for the world (`CommOptions::for_world`).
fn communicator_table(m: &Machine, plans: &[(usize, Plan)], forced: Option<Algorithm>) -> String {
    if m.ranks > geforce_p2p::comm::MAX_RANKS {
        return format!(
            "One process per GPU (torchrun, geforce_p2p.distributed): a communicator takes at most {} ranks, so \
             {} run as groups of it (geforce_p2p.distributed's two levels, --hosts) or not at all.\n",
            geforce_p2p::comm::MAX_RANKS,
            m.ranks
        );
    }
    // The ring is refused at creation: the header says so below, with the paths unforced.
    let mut paths =
        match AllReducePaths::of(m.ranks, &CommOptions::for_world(m.ranks), forced.filter(|a| *a != Algorithm::Ring)) {
            Ok(paths) => paths,
            Err(e) => return format!("One process per GPU: no communicator table ({e})\n"),
        };
    if m.ranks == 2 && m.ranks_per_device >= 2 {
        paths = paths.on_one_link();
    }
    let mut out = if m.ranks == 2 {
        format!(
            "One process per GPU (torchrun, geforce_p2p.distributed) between two ranks: one kernel up to {} (8-byte \
             lines, twice the bytes, up to {}), the exchange through the slots above (two-shot rounds where \
             forced, or where the two share one GPU); the exchange priced with one chunk of fill each way (a \
             quarter of the buffer, 1 MiB to a slot; once for a shared link), the rounds without (each wait names the \
             one chunk it needs), and every chunk step with four operations.\n",
            format_size(paths.small_max),
            format_size(paths.many.lines_max)
        )
    } else {
        let chunks = if paths.many.chunks_max > paths.many.lines_max {
            format!(
                ", above them up to {} its two-shot in one flagged-chunk kernel",
                format_size(paths.many.chunks_max)
            )
        } else {
            String::new()
        };
        format!(
            "One process per GPU (torchrun, geforce_p2p.distributed): its one-shot in 8-byte lines (twice the bytes, \
             up to {}) or its two-shot in rounds ({} handoffs, a share's chunk of fill each way, once for a shared \
             link, four operations a chunk step), the cheaper at H200 rates as the communicator chooses{chunks}.\n",
            format_size(paths.many.lines_max),
            m.ranks
        )
    };
    if forced == Some(Algorithm::Ring) {
        out.push_str(&format!("{ALGORITHM_VAR}=ring: the communicator refuses it (it runs one-shot or two-shot).\n"));
        return out;
    }
    let mut t = table(&["size", "µs", "bound", "busbw GB/s", "runs"], &["bound", "runs"]);
    for (bytes, _) in plans {
        let p = all_reduce_prediction(m, &paths, *bytes);
        t.add_row(vec![
            format_size(*bytes),
            num(p.seconds * 1e6, 1),
            p.bound.name().to_owned(),
            num(busbw_gbps(m.ranks, *bytes, p.seconds), 2),
            paths.path_name(*bytes).to_owned(),
        ]);
    }
    out.push_str(&format!("{}\n", t.trim_fmt()));
    out
}

/// The JSON `--json` writes.
#[derive(serde::Serialize)]
struct Json {
    ranks: usize,
    machine: JsonMachine,
    forced: Option<&'static str>,
    rows: Vec<JsonRow>,
}

#[derive(serde::Serialize)]
struct JsonMachine {
    h2d_gbps: f64,
    d2h_gbps: f64,
    duplex_gbps: f64,
    host_gbps: f64,
    dram_gbps: f64,
    handoff_us: f64,
    /// One operation of a pipeline's chunk step, µs (`sources["op-us"]` says where it came
    /// from: the H100 fit, a flag or this machine).
    op_us: f64,
    /// The most cards behind one shared uplink.
    cards_per_uplink: usize,
    /// Ranks that share one GPU (`--ranks-per-gpu`).
    ranks_per_device: usize,
    /// Per rate, by its flag's name: `default`, `flag` or `measured`.
    sources: BTreeMap<&'static str, Source>,
}

#[derive(serde::Serialize)]
struct JsonRow {
    bytes: usize,
    chosen: &'static str,
    bound: &'static str,
    busbw_gbps: f64,
    predictions: Vec<JsonPrediction>,
}

#[derive(serde::Serialize)]
struct JsonPrediction {
    algorithm: &'static str,
    time_us: f64,
    bound: &'static str,
    phases: usize,
}

fn json(rates: &Rates, plans: &[(usize, Plan)], forced: Option<Algorithm>) -> Json {
    let m = &rates.machine;
    Json {
        ranks: m.ranks,
        machine: JsonMachine {
            h2d_gbps: m.h2d_gbps,
            d2h_gbps: m.d2h_gbps,
            duplex_gbps: m.duplex_gbps,
            host_gbps: m.host_gbps,
            dram_gbps: m.dram_gbps,
            handoff_us: m.handoff_us,
            op_us: m.op_us,
            cards_per_uplink: m.cards_per_uplink,
            ranks_per_device: m.ranks_per_device,
            sources: RATES.into_iter().zip(rates.sources).collect(),
        },
        forced: forced.map(Algorithm::name),
        rows: plans
            .iter()
            .map(|(bytes, plan)| JsonRow {
                bytes: *bytes,
                chosen: plan.chosen.name(),
                bound: plan.prediction().bound.name(),
                busbw_gbps: busbw_gbps(m.ranks, *bytes, plan.prediction().seconds),
                predictions: plan
                    .predictions
                    .iter()
                    .map(|p| JsonPrediction {
                        algorithm: p.algorithm.name(),
                        time_us: p.seconds * 1e6,
                        bound: p.bound.name(),
                        phases: p.traffic.phases,
                    })
                    .collect(),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests;
