//! The cost model that picks an all-reduce algorithm for N ranks and a size, from the bytes
//! each algorithm moves and the rates measured on the machine (issue #33, item 4).
//!
//! Without P2P every byte goes card → pinned host memory → card, so an all-reduce of S
//! bytes per rank costs, per card and for the whole host:
//!
//! | [`Algorithm`] | each card sends (up) | each card receives (down) | host memory bytes | phases |
//! | --- | --- | --- | --- | --- |
//! | ring | 2(N−1)/N·S | 2(N−1)/N·S | 4(N−1)·S | 2(N−1) |
//! | one-shot | S | (N−1)·S | N²·S | 1 |
//! | two-shot | S | 2(N−1)/N·S | (3N−2)·S | 2 |
//!
//! A *phase* is one dependent trip through host memory: a rank waits for what another
//! wrote there in the phase before (what the tests' `host_schedule` counts as the phases after
//! the first). Host memory bytes count every write into it and every read out of it. One
//! rank, or no bytes, moves nothing ([`traffic`]).
//!
//! # The model
//!
//! [`predict`] prices one algorithm on a [`Machine`] of N cards:
//!
//! ```text
//! time  = phases × handoff + max(link, host, dram, uplink)
//! link  = max(up, down) / duplex             (a card that both sends and receives)
//!         up / d2h  or  down / h2d           (a card that only sends, or only receives)
//! host  = N × (up + down) / host_gbps        (all cards' DMAs through the host at once)
//! dram  = host memory bytes / dram_gbps
//! uplink = k × link                          (k cards behind one shared PCIe uplink, which
//!                                             runs at one card's rates: the probe's topology)
//! ```
//!
//! Assumptions, each a simplification the measurements can contradict:
//!
//! - Pipelined: every phase is cut into chunks that flow back to back, so the bandwidth
//!   terms overlap one another and only the largest counts; the phases do not overlap, so
//!   each costs one handoff on top ([`Machine::handoff_us`]: the latency of a small trip
//!   through host memory and the flag that says it is there).
//! - Every card moves the same bytes at the same rates: the slowest card's rates stand for
//!   all of them.
//! - A card that sends and receives runs both directions at the duplex rate for the whole
//!   time, even where one direction carries fewer bytes (one-shot receives N−1 times what it
//!   sends): conservative for one-shot and two-shot.
//! - The host and DRAM terms are the whole machine's, shared by all cards. Both count the
//!   same bytes here (each byte a card sends is written into host memory once and read once
//!   by every card that receives it); they differ in the rate: `host_gbps` is what all the
//!   cards' DMAs reach together (root complex, a switch's uplink, the socket link, or the
//!   last-level cache where staging stays small), `dram_gbps` what the memory controllers
//!   deliver. Every byte is assumed to reach DRAM; where chunks stay in the cache (DDIO),
//!   raise `dram_gbps` to the host rate.
//!
//! [`choose`] predicts every algorithm and takes the fastest (a tie goes to the one with
//! fewer phases), unless the environment variable [`ALGORITHM_VAR`] (`GP2P_ALGORITHM`)
//! names one. `gp2p plan --ranks N` prints the table.
//!
//! # Example
//!
//! ```
//! use gp2p_collectives::cost::{Algorithm, Bound, Machine, choose_with};
//!
//! // Eight cards with the rates measured on H200s: one trip for 8 bytes; for 1 GiB host
//! // memory binds, and the two-shot moves 22·S through it where the ring moves 28·S.
//! let machine = Machine::h200(8);
//! assert_eq!(choose_with(&machine, 8, None).chosen, Algorithm::OneShot);
//! let large = choose_with(&machine, 1 << 30, None);
//! assert_eq!(large.chosen, Algorithm::TwoShot);
//! assert_eq!(large.prediction().bound, Bound::Dram);
//! // GP2P_ALGORITHM=ring would have forced the ring.
//! assert_eq!(choose_with(&machine, 1 << 30, Some(Algorithm::Ring)).chosen, Algorithm::Ring);
//! ```

use crate::error::{Error, Result};

/// The environment variable that forces an algorithm: `ring`, `one-shot` or `two-shot`.
pub const ALGORITHM_VAR: &str = "GP2P_ALGORITHM";

/// Bytes per second in one GB/s (GB/s = 1e9 B/s everywhere in this project).
const BYTES_PER_GB: f64 = 1e9;

/// Seconds per µs.
const SECONDS_PER_US: f64 = 1e-6;

/// Two predicted times closer than this fraction of the larger are a tie (float noise must
/// not decide between two algorithms the model prices the same, like the ring and the
/// two-shot at two ranks).
const TIE_FRACTION: f64 = 1e-9;

/// Host to device, GB/s: one H200 (PCIe 5.0 x16), pinned DMA alone
/// (benches/results/h200/probe-measure.txt: 55.4).
pub const H200_H2D_GBPS: f64 = 55.4;
/// Device to host, GB/s: one H200, pinned DMA alone (benches/results/h200-x2/probe-measure.txt:
/// 55.3 on both cards; 55.4 on the one-H200 machine).
pub const H200_D2H_GBPS: f64 = 55.3;
/// Each way with both directions at once, GB/s: one H200, the lower end of what it measured
/// (48.9-50.1 in benches/results/h200/probe-measure.txt and benches/results/h200-x2/probe-measure.txt).
pub const H200_DUPLEX_GBPS: f64 = 49.6;
/// What all cards together move through host memory, GB/s, up plus down: the two-H200
/// machine ran four DMAs at once (both cards, both ways) at 47.5 GB/s each with a
/// cache-sized staging footprint (4 MiB per stream), 4 × 47.5 = 190 (a run whose output was
/// not kept; `gp2p probe --measure` on two cards measures it). Measured with two cards; more
/// cards are assumed to get no more.
pub const H200_HOST_GBPS: f64 = 190.0;
/// Host memory, GB/s, reads plus writes: the same four DMAs fell to 34–36 GB/s each once
/// the footprint outgrew the cache (16 MiB or more per stream), about 140 in all (the same
/// run).
pub const H200_DRAM_GBPS: f64 = 140.0;
/// One handoff, µs: a 4 KiB D2H followed by a 4 KiB H2D on one stream, 11.4 µs on the
/// one-H200 machine (benches/results/h200/copy-latency-and-host.txt; 20.1 on the two-H200
/// one). It is a round trip through host memory with two driver calls' latency in it; a flag
/// set and awaited on the GPU costs less (4–6.5 µs, as published for custom all-reduce
/// kernels), so this prices phases high, which favours the
/// algorithms with fewer of them only where they would win anyway at small sizes.
pub const H200_HANDOFF_US: f64 = 11.4;

/// One dependent operation of a pipeline's chunk step, µs: on one stream, a kernel after a
/// copy or a copy after a kernel, or a wait kernel that sees its flag. A pipelined call pays
/// it for every operation of every chunk step, beyond the bytes' time and the fill: fitted on
/// one H100 with two processes sharing its link (an exact chunk step is four operations and
/// took 21 µs, `benches/results/h10080gbhbm3/comm-chunks-message-2.txt`; a compressed one, nine
/// operations whose two sides overlap, is priced at four,
/// `gp2p_comm::compression::COMPRESSED_STEP_OPS`), and the default elsewhere: `gp2p plan
/// --measure` and `gp2p bench comm` measure it on the machine (a reduce kernel and a 4 KiB
/// copy each way, in turn on one stream).
pub const OP_US: f64 = 5.25;

/// What each chunk step of a pipelined call costs on top where r ranks share one GPU
/// ([`Machine::ranks_per_device`]), µs per unit of (r − 1)(r − 2): their DMAs take turns on
/// its copy engines. A fit, on one H100 with 4 and 8 processes under MPS (f32 all-reduce at
/// 1706435, `benches/results/h10080gbhbm3/comm-all-reduce-{4,8}.txt`): 1 MiB took 438 and
/// 1545 µs where the model without it priced 308 and 614, a shortfall of 26 and 103 µs a
/// step; this brings every row of those runs from 1 to 256 MiB, and the earlier runs among 4
/// with 4 MiB slots, within ±15 %. The eight ranks' rows set it (their errors +1 to +8 %);
/// the four ranks' only just fit (−12.7 % at 1 MiB, whose shortfall the form halves, to
/// +14.3 % at 64 MiB), so the form is a first fit, not a law. Two ranks on one GPU measured no shortfall (their rows
/// price high already), and the form gives them none; cards of their own pay none of it.
pub const DEVICE_TURN_US: f64 = 2.5;

/// An all-reduce algorithm over host memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// Reduce-scatter then all-gather around the ring: the fewest link bytes for large N
    /// at equal directions, 2(N−1) dependent phases.
    Ring,
    /// Every card writes its buffer once and reads everyone else's: one phase, (N−1)·S
    /// down every link.
    OneShot,
    /// Each card reduces its 1/N share, then every card reads all shares: two phases, never
    /// more bytes than the ring on any resource.
    TwoShot,
}

impl Algorithm {
    /// Every algorithm, in the order tables list them.
    pub const ALL: [Algorithm; 3] = [Algorithm::Ring, Algorithm::OneShot, Algorithm::TwoShot];

    /// The name [`ALGORITHM_VAR`], `gp2p plan` and reports use: `ring`, `one-shot`,
    /// `two-shot`.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Ring => "ring",
            Algorithm::OneShot => "one-shot",
            Algorithm::TwoShot => "two-shot",
        }
    }
}

impl std::fmt::Display for Algorithm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A string that names no [`Algorithm`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown algorithm {given:?}: expected ring, one-shot or two-shot")]
pub struct UnknownAlgorithm {
    /// What was given.
    pub given: String,
}

impl std::str::FromStr for Algorithm {
    type Err = UnknownAlgorithm;

    /// A name as [`Algorithm::name`] gives it, in any case.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Algorithm::ALL
            .into_iter()
            .find(|a| a.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| UnknownAlgorithm { given: s.to_owned() })
    }
}

/// What one card moves, and what the whole host does, in one all-reduce.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Traffic {
    /// Bytes each card sends to host memory (device to host).
    pub up_bytes: f64,
    /// Bytes each card receives from host memory (host to device).
    pub down_bytes: f64,
    /// Bytes written into and read out of host memory, all cards together.
    pub host_dram_bytes: f64,
    /// Dependent trips through host memory, one after the other.
    pub phases: usize,
}

impl Traffic {
    /// Nothing moved.
    const NONE: Traffic = Traffic { up_bytes: 0.0, down_bytes: 0.0, host_dram_bytes: 0.0, phases: 0 };
}

/// What `algorithm` moves for an all-reduce of `bytes` per rank over `ranks` ranks (the
/// table in the [module doc](self)). One rank (or none), or no bytes, moves nothing.
pub fn traffic(algorithm: Algorithm, ranks: usize, bytes: usize) -> Traffic {
    if ranks < 2 || bytes == 0 {
        return Traffic::NONE;
    }
    let (n, s) = (ranks as f64, bytes as f64);
    // The ring's per-link share and the two-shot's received bytes are the same expression,
    // so at two ranks they compare equal exactly.
    let shares = 2.0 * (n - 1.0) * s / n;
    match algorithm {
        Algorithm::Ring => Traffic {
            up_bytes: shares,
            down_bytes: shares,
            host_dram_bytes: 4.0 * (n - 1.0) * s,
            phases: 2 * (ranks - 1),
        },
        Algorithm::OneShot => Traffic { up_bytes: s, down_bytes: (n - 1.0) * s, host_dram_bytes: n * n * s, phases: 1 },
        Algorithm::TwoShot => {
            Traffic { up_bytes: s, down_bytes: shares, host_dram_bytes: (3.0 * n - 2.0) * s, phases: 2 }
        }
    }
}

/// The rates of a machine of `ranks` cards that the model prices with. GB/s = 1e9 B/s.
///
/// [`Machine::h200`] fills them with what this project measured on its H200 machines (each
/// `H200_*` constant says where its figure comes from) and the H100 fit of a chunk step's
/// operation ([`OP_US`]); `gp2p plan --measure` measures them on the machine at hand.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Machine {
    /// Cards (ranks) in the all-reduce.
    pub ranks: usize,
    /// Host to device per card, alone, GB/s.
    pub h2d_gbps: f64,
    /// Device to host per card, alone, GB/s.
    pub d2h_gbps: f64,
    /// Per card, each way, with both directions at once, GB/s.
    pub duplex_gbps: f64,
    /// What all cards together move through host memory at once, GB/s: the sum of every
    /// card's up and down.
    pub host_gbps: f64,
    /// Host memory, GB/s: bytes written plus bytes read.
    pub dram_gbps: f64,
    /// The cost of one dependent phase, µs: a trip through host memory and the flag that
    /// says it is there.
    pub handoff_us: f64,
    /// The most cards behind one shared PCIe uplink (a switch) on their way to the host: 1
    /// where every card has its own link. Without P2P a switch does not help: every byte of
    /// its cards crosses the one uplink, which runs at one card's rates. From the probe's
    /// topology (`gp2p_probe::Topology::uplinks`), which `gp2p plan` hands over.
    pub cards_per_uplink: usize,
    /// One dependent operation of a pipeline's chunk step, µs ([`OP_US`]).
    pub op_us: f64,
    /// Ranks that share one GPU: 1 where each has a card of its own; the test bed's N
    /// processes on one card, N. Their chunk steps take turns on its copy engines
    /// ([`DEVICE_TURN_US`]).
    pub ranks_per_device: usize,
}

impl Machine {
    /// `ranks` cards with the rates measured on this project's H200 machines
    /// ([`H200_H2D_GBPS`], [`H200_D2H_GBPS`], [`H200_DUPLEX_GBPS`], [`H200_HOST_GBPS`],
    /// [`H200_DRAM_GBPS`], [`H200_HANDOFF_US`]) and a step's operation fitted on an H100
    /// ([`OP_US`]), a card each.
    pub const fn h200(ranks: usize) -> Machine {
        Machine {
            ranks,
            h2d_gbps: H200_H2D_GBPS,
            d2h_gbps: H200_D2H_GBPS,
            duplex_gbps: H200_DUPLEX_GBPS,
            host_gbps: H200_HOST_GBPS,
            dram_gbps: H200_DRAM_GBPS,
            handoff_us: H200_HANDOFF_US,
            cards_per_uplink: 1,
            op_us: OP_US,
            ranks_per_device: 1,
        }
    }

    /// Seconds that `steps` chunk steps of `ops` dependent operations each add to a pipelined
    /// call (see [`OP_US`]), with the turns of ranks that share a GPU ([`DEVICE_TURN_US`]).
    pub fn steps_seconds(&self, steps: usize, ops: usize) -> f64 {
        let sharing = self.ranks_per_device.clamp(2, self.ranks.max(2));
        let turns = ((sharing - 1) * (sharing - 2)) as f64 * DEVICE_TURN_US * SECONDS_PER_US;
        steps as f64 * (self.ops_seconds(ops) + turns)
    }

    /// Seconds of `ops` dependent GPU operations with no copy among them (no turns).
    pub fn ops_seconds(&self, ops: usize) -> f64 {
        ops as f64 * self.op_us * SECONDS_PER_US
    }

    /// `t` with a pipeline's fill: `fill_bytes` more each way, the first chunk up before
    /// anything comes down and the last down after everything went up, once for a link that
    /// several cards share (priced a card at a time, it is shared among them). Two processes
    /// on one H100 ran 16 MiB in 939 µs (`benches/results/h10080gbhbm3/comm-all-reduce-2.txt` as
    /// of 1706435), priced 942 µs with the fill once for their link and 1113 µs with a fill a card;
    /// since each of their waits names the one chunk it needs, their rounds hide it and
    /// `gp2p_comm` prices them without.
    pub fn filled(&self, t: Traffic, fill_bytes: f64) -> Traffic {
        let fill = fill_bytes / self.cards_per_uplink.max(1) as f64;
        Traffic { up_bytes: t.up_bytes + fill, down_bytes: t.down_bytes + fill, ..t }
    }
}

/// What binds a prediction: the term of the model that sets its time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Bound {
    /// Each card's link, device to host.
    CardUp,
    /// Each card's link, host to device.
    CardDown,
    /// All cards' DMAs through the host together ([`Machine::host_gbps`]).
    Host,
    /// Host memory ([`Machine::dram_gbps`]).
    Dram,
    /// A PCIe uplink that several cards share ([`Machine::cards_per_uplink`]).
    Uplink,
    /// The phases' handoffs cost more than the largest bandwidth term: latency binds.
    Handoffs,
    /// Nothing moves (one rank, or no bytes).
    Nothing,
}

impl Bound {
    /// The name tables print: `card up`, `card down`, `host`, `dram`, `uplink`, `handoffs`,
    /// `nothing`.
    pub fn name(self) -> &'static str {
        match self {
            Bound::CardUp => "card up",
            Bound::CardDown => "card down",
            Bound::Host => "host",
            Bound::Dram => "dram",
            Bound::Uplink => "uplink",
            Bound::Handoffs => "handoffs",
            Bound::Nothing => "nothing",
        }
    }
}

impl std::fmt::Display for Bound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The model's time for one algorithm.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Prediction {
    /// The algorithm priced.
    pub algorithm: Algorithm,
    /// Predicted time of one all-reduce, seconds.
    pub seconds: f64,
    /// The term that sets it.
    pub bound: Bound,
    /// The bytes and phases it was priced from.
    pub traffic: Traffic,
}

/// The model's time for `algorithm` on `machine`, `bytes` per rank (the formulas in the
/// [module doc](self)). Where two bandwidth terms are equal, the shared one is named
/// (DRAM before host before the card's link, down before up); handoffs bind only when they
/// cost more than every bandwidth term.
pub fn predict(machine: &Machine, algorithm: Algorithm, bytes: usize) -> Prediction {
    price(machine, algorithm, traffic(algorithm, machine.ranks, bytes))
}

/// The model's time for traffic `t` on `machine`, named `algorithm`: [`predict`] for an
/// implementation whose traffic differs from the table's (the one-process-per-GPU
/// communicator's one-shot carries its data in 8-byte lines of 4 data bytes, twice the
/// bytes; its two-shot runs legs, whose traffic [`crate::legs::Rounds::traffic`] counts: the
/// table's two-shot bytes, in N rounds).
pub fn price(machine: &Machine, algorithm: Algorithm, t: Traffic) -> Prediction {
    let seconds_at = |bytes: f64, gbps: f64| bytes / (gbps * BYTES_PER_GB);
    let (up, down) = match (t.up_bytes > 0.0, t.down_bytes > 0.0) {
        (true, true) => (seconds_at(t.up_bytes, machine.duplex_gbps), seconds_at(t.down_bytes, machine.duplex_gbps)),
        (true, false) => (seconds_at(t.up_bytes, machine.d2h_gbps), 0.0),
        (false, true) => (0.0, seconds_at(t.down_bytes, machine.h2d_gbps)),
        (false, false) => return Prediction { algorithm, seconds: 0.0, bound: Bound::Nothing, traffic: t },
    };
    let host = seconds_at(machine.ranks as f64 * (t.up_bytes + t.down_bytes), machine.host_gbps);
    let dram = seconds_at(t.host_dram_bytes, machine.dram_gbps);
    // k cards through one uplink at one card's rates: k times a card's link time. With one
    // card per uplink it is the card's own link, named as such below.
    let uplink = if machine.cards_per_uplink > 1 { machine.cards_per_uplink as f64 * up.max(down) } else { 0.0 };
    // The first of equal terms wins: the shared resources first.
    let (bandwidth, mut bound) = [
        (dram, Bound::Dram),
        (host, Bound::Host),
        (uplink, Bound::Uplink),
        (down, Bound::CardDown),
        (up, Bound::CardUp),
    ]
    .into_iter()
    .fold((f64::NEG_INFINITY, Bound::Nothing), |best, term| if term.0 > best.0 { term } else { best });
    let handoffs = t.phases as f64 * machine.handoff_us * SECONDS_PER_US;
    if handoffs > bandwidth {
        bound = Bound::Handoffs;
    }
    Prediction { algorithm, seconds: handoffs + bandwidth, bound, traffic: t }
}

/// Every algorithm's prediction for one size, and the one to run.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The algorithm to run.
    pub chosen: Algorithm,
    /// One per algorithm, in the order of [`Algorithm::ALL`].
    pub predictions: Vec<Prediction>,
    /// Whether [`ALGORITHM_VAR`] (or the caller) forced the choice instead of the model.
    pub forced: bool,
}

impl Plan {
    /// The prediction for the chosen algorithm.
    pub fn prediction(&self) -> &Prediction {
        // Every plan holds a prediction for each algorithm.
        self.predictions.iter().find(|p| p.algorithm == self.chosen).unwrap_or(&self.predictions[0])
    }
}

/// The plan for an all-reduce of `bytes` per rank on `machine`: the fastest algorithm by
/// [`predict`], unless the environment variable [`ALGORITHM_VAR`] names one. Fails when it
/// is set to anything but an algorithm's name (empty counts as unset).
pub fn choose(machine: &Machine, bytes: usize) -> Result<Plan> {
    Ok(choose_with(machine, bytes, forced_by_env()?))
}

/// The algorithm the environment variable [`ALGORITHM_VAR`] forces, read now
/// ([`forced_algorithm`] of its value).
pub fn forced_by_env() -> Result<Option<Algorithm>> {
    let value = std::env::var_os(ALGORITHM_VAR).map(|v| v.to_string_lossy().into_owned());
    forced_algorithm(value.as_deref())
}

/// The algorithm the value of [`ALGORITHM_VAR`] forces: `None` when unset or empty, an
/// error naming the variable and the accepted values when it names no algorithm.
pub fn forced_algorithm(value: Option<&str>) -> Result<Option<Algorithm>> {
    match value.map(str::trim) {
        None | Some("") => Ok(None),
        Some(name) => name
            .parse()
            .map(Some)
            .map_err(|_: UnknownAlgorithm| Error::UnknownAlgorithm { var: ALGORITHM_VAR, given: name.to_owned() }),
    }
}

/// [`choose`] without the environment: `forced` if given, else the fastest by [`predict`]
/// (a tie goes to fewer phases, then to the first in [`Algorithm::ALL`]).
pub fn choose_with(machine: &Machine, bytes: usize, forced: Option<Algorithm>) -> Plan {
    let predictions: Vec<Prediction> = Algorithm::ALL.into_iter().map(|a| predict(machine, a, bytes)).collect();
    let fastest = predictions.iter().fold(&predictions[0], |best, p| {
        let tie = (p.seconds - best.seconds).abs() <= TIE_FRACTION * p.seconds.max(best.seconds);
        let better = if tie { p.traffic.phases < best.traffic.phases } else { p.seconds < best.seconds };
        if better { p } else { best }
    });
    Plan { chosen: forced.unwrap_or(fastest.algorithm), forced: forced.is_some(), predictions }
}

#[cfg(test)]
mod tests;
