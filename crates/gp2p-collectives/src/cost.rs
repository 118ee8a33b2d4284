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
/// `H200_*` constant says where its figure comes from); `gp2p plan --measure` measures the
/// per-card rates on the machine at hand.
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
}

impl Machine {
    /// `ranks` cards with the rates measured on this project's H200 machines
    /// ([`H200_H2D_GBPS`], [`H200_D2H_GBPS`], [`H200_DUPLEX_GBPS`], [`H200_HOST_GBPS`],
    /// [`H200_DRAM_GBPS`], [`H200_HANDOFF_US`]).
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
        }
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
mod tests {
    use proptest::prelude::*;

    use super::*;

    const MIB: usize = 1 << 20;
    const GIB: usize = 1 << 30;

    /// `a` within 1 % of `b`.
    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 0.01 * b.abs()
    }

    #[test]
    fn algorithm_names_round_trip() {
        for a in Algorithm::ALL {
            assert_eq!(a.to_string().parse::<Algorithm>(), Ok(a));
        }
        assert_eq!("Two-Shot".parse::<Algorithm>(), Ok(Algorithm::TwoShot));
        let err = "twoshot".parse::<Algorithm>().unwrap_err();
        let text = err.to_string();
        assert!(["twoshot", "ring", "one-shot", "two-shot"].iter().all(|w| text.contains(w)), "{text}");
    }

    #[test]
    fn traffic_matches_the_formulas_for_two_to_eight_ranks() {
        let s = 3 * MIB;
        let sf = s as f64;
        for n in 2..=8usize {
            let nf = n as f64;
            let ring = traffic(Algorithm::Ring, n, s);
            assert!(close(ring.up_bytes, 2.0 * (nf - 1.0) / nf * sf), "n={n}: {ring:?}");
            assert!(close(ring.down_bytes, 2.0 * (nf - 1.0) / nf * sf), "n={n}: {ring:?}");
            assert_eq!(ring.host_dram_bytes, (4 * (n - 1) * s) as f64, "n={n}");
            assert_eq!(ring.phases, 2 * (n - 1), "n={n}");
            let one = traffic(Algorithm::OneShot, n, s);
            assert_eq!((one.up_bytes, one.down_bytes), (sf, ((n - 1) * s) as f64), "n={n}");
            assert_eq!((one.host_dram_bytes, one.phases), ((n * n * s) as f64, 1), "n={n}");
            let two = traffic(Algorithm::TwoShot, n, s);
            assert_eq!(two.up_bytes, sf, "n={n}");
            assert!(close(two.down_bytes, 2.0 * (nf - 1.0) / nf * sf), "n={n}: {two:?}");
            assert_eq!((two.host_dram_bytes, two.phases), (((3 * n - 2) * s) as f64, 2), "n={n}");
            // Host memory sees each sent byte written once and each received byte read once.
            for t in [ring, one, two] {
                assert!(close(t.host_dram_bytes, nf * (t.up_bytes + t.down_bytes)), "n={n}: {t:?}");
            }
        }
        // The §4 line for N = 8, in units of S.
        let per_s = |t: Traffic| (t.up_bytes / sf, t.down_bytes / sf, t.host_dram_bytes / sf);
        assert_eq!(per_s(traffic(Algorithm::Ring, 8, s)), (1.75, 1.75, 28.0));
        assert_eq!(per_s(traffic(Algorithm::TwoShot, 8, s)), (1.0, 1.75, 22.0));
    }

    #[test]
    fn one_rank_or_no_bytes_moves_nothing_and_costs_nothing() {
        for a in Algorithm::ALL {
            for (ranks, bytes) in [(1, GIB), (0, GIB), (8, 0)] {
                assert_eq!(traffic(a, ranks, bytes), Traffic::NONE, "{a} {ranks} {bytes}");
                let p = predict(&Machine::h200(ranks), a, bytes);
                assert_eq!((p.seconds, p.bound), (0.0, Bound::Nothing), "{a} {ranks} {bytes}");
            }
        }
    }

    proptest! {
        /// §4: two-shot never moves more bytes than the ring on any resource, and has no
        /// more phases; so the model never prices it slower.
        #[test]
        fn two_shot_never_moves_more_than_the_ring(ranks in 2usize..=64, bytes in 1usize..(1 << 40)) {
            let (ring, two) = (traffic(Algorithm::Ring, ranks, bytes), traffic(Algorithm::TwoShot, ranks, bytes));
            prop_assert!(two.up_bytes <= ring.up_bytes, "{two:?} {ring:?}");
            prop_assert!(two.down_bytes <= ring.down_bytes, "{two:?} {ring:?}");
            prop_assert!(two.host_dram_bytes <= ring.host_dram_bytes, "{two:?} {ring:?}");
            prop_assert!(two.phases <= ring.phases);
            let machine = Machine::h200(ranks);
            let (ring, two) = (predict(&machine, Algorithm::Ring, bytes), predict(&machine, Algorithm::TwoShot, bytes));
            prop_assert!(two.seconds <= ring.seconds, "{two:?} {ring:?}");
        }

        /// The plan's choice is never predicted slower than another algorithm.
        #[test]
        fn the_choice_is_the_fastest(ranks in 2usize..=16, bytes in 1usize..(1 << 34)) {
            let plan = choose_with(&Machine::h200(ranks), bytes, None);
            let chosen = plan.prediction().seconds;
            prop_assert!(plan.predictions.iter().all(|p| chosen <= p.seconds), "{plan:?}");
        }
    }

    #[test]
    fn predictions_follow_the_formulas_and_name_their_bound() {
        // One card's link: a machine whose host and DRAM are far faster than its cards,
        // four ranks, 1 GiB, no handoff cost.
        let m = Machine {
            ranks: 4,
            h2d_gbps: 20.0,
            d2h_gbps: 30.0,
            duplex_gbps: 10.0,
            host_gbps: 1e6,
            dram_gbps: 1e6,
            handoff_us: 0.0,
            cards_per_uplink: 1,
        };
        // One-shot: down 3 GiB at the duplex rate, 3 × 2^30 / 10e9 = 0.3221225472 s.
        let one = predict(&m, Algorithm::OneShot, GIB);
        assert_eq!(one.bound, Bound::CardDown);
        assert!(close(one.seconds, 0.322_122_547_2), "{one:?}");
        // The DRAM term: 16 GiB / 10 GB/s = 1.718 s.
        let slow_dram = Machine { dram_gbps: 10.0, ..m };
        let one = predict(&slow_dram, Algorithm::OneShot, GIB);
        assert_eq!(one.bound, Bound::Dram);
        assert!(close(one.seconds, 1.717_986_918_4), "{one:?}");
        // The host term: 4 × (1 + 3) GiB / 10 GB/s, and the equal DRAM term names DRAM.
        let slow_host = Machine { host_gbps: 10.0, ..m };
        let one = predict(&slow_host, Algorithm::OneShot, GIB);
        assert_eq!(one.bound, Bound::Host);
        assert!(close(one.seconds, 1.717_986_918_4), "{one:?}");
        let both = Machine { host_gbps: 10.0, dram_gbps: 10.0, ..m };
        assert_eq!(predict(&both, Algorithm::OneShot, GIB).bound, Bound::Dram);
        // Handoffs: 6 ring phases of 1 s each outweigh 8 bytes; they add to the bandwidth term.
        let slow_flags = Machine { handoff_us: 1e6, ..m };
        let ring = predict(&slow_flags, Algorithm::Ring, 8);
        assert_eq!(ring.bound, Bound::Handoffs);
        assert!(close(ring.seconds, 6.0), "{ring:?}");
        let ring = predict(&slow_flags, Algorithm::Ring, GIB);
        assert!(close(ring.seconds, 6.0 + 1.5 * GIB as f64 / 10e9), "{ring:?}");
    }

    #[test]
    fn ties_go_to_fewer_phases_and_a_forced_choice_is_kept() {
        // No handoff cost, and two ranks: every algorithm moves S up and S down per card
        // and 4·S through host memory, so all three tie; the one-shot has one phase.
        let m = Machine { handoff_us: 0.0, ..Machine::h200(2) };
        let plan = choose_with(&m, GIB, None);
        let seconds: Vec<f64> = plan.predictions.iter().map(|p| p.seconds).collect();
        assert!(seconds.iter().all(|&s| s == seconds[0]), "{plan:?}");
        assert_eq!((plan.chosen, plan.forced), (Algorithm::OneShot, false));
        let forced = choose_with(&m, GIB, Some(Algorithm::Ring));
        assert_eq!((forced.chosen, forced.forced), (Algorithm::Ring, true));
        assert_eq!(forced.prediction().algorithm, Algorithm::Ring);
        assert_eq!(forced.predictions, plan.predictions, "forcing changes the choice, not the table");
    }

    #[test]
    fn the_variable_forces_an_algorithm_and_a_wrong_value_names_it_and_the_choices() {
        assert_eq!(forced_algorithm(None), Ok(None));
        assert_eq!(forced_algorithm(Some("")), Ok(None), "empty counts as unset");
        assert_eq!(forced_algorithm(Some("ring")), Ok(Some(Algorithm::Ring)));
        assert_eq!(forced_algorithm(Some(" One-Shot ")), Ok(Some(Algorithm::OneShot)));
        assert_eq!(forced_algorithm(Some("two-shot")), Ok(Some(Algorithm::TwoShot)));
        let err = forced_algorithm(Some("tree")).unwrap_err();
        assert_eq!(err, Error::UnknownAlgorithm { var: ALGORITHM_VAR, given: "tree".into() });
        let text = err.to_string();
        for word in ["GP2P_ALGORITHM", "tree", "ring", "one-shot", "two-shot"] {
            assert!(text.contains(word), "{word} missing: {text}");
        }
    }

    /// The three algorithms' predictions at `bytes`, in µs, in `Algorithm::ALL` order.
    fn micros(m: &Machine, bytes: usize) -> Vec<f64> {
        choose_with(m, bytes, None).predictions.iter().map(|p| p.seconds * 1e6).collect()
    }

    /// (a) Eight Gen4 RTX 4090s on a two-socket EPYC, each card on its own x16 link.
    ///
    /// Per card (nvbandwidth issue 15, one card at a time): H2D 25, D2H 26.5 GB/s; with
    /// both directions at once the first cards drop to 11–16 each way: duplex 13.5.
    /// Host, all eight at once: no measurement at hand. The 4× RTX 5090 Genoa box moved at
    /// least 2 × 4 × 27.3 ≈ 218 GB/s through host memory (NCCL busbw 27.3 at 128 MB,
    /// nccl-tests issue 287); with half of every card's peers across the socket link we
    /// assume 180, below the 8 × 2 × 13.5 = 216 the cards could move (an assumption).
    /// DRAM: 2 sockets × 12 channels DDR5-4800 is 921.6 GB/s on paper; we assume 500 for
    /// DMA reads and writes (an assumption). Handoff 12 µs (2× 4090 through the host:
    /// 11.4–12.8 µs, nccl-tests issue 287).
    ///
    /// Per S (bytes per rank), seconds per GB, N = 8:
    /// - ring: link 1.75/13.5 = 0.12963, host 8·3.5/180 = 0.15556, DRAM 28/500 = 0.056:
    ///   host binds; 14 phases = 168 µs.
    /// - one-shot: link 7/13.5 = 0.51852 (down), host 64/180 = 0.35556, DRAM 64/500 =
    ///   0.128: the card's down link binds; 1 phase = 12 µs.
    /// - two-shot: link 1.75/13.5 = 0.12963 (down), host 22/180 = 0.12222, DRAM 22/500 =
    ///   0.044: the down link binds; 2 phases = 24 µs.
    ///
    /// 8 B: 168.0 / 12.0 / 24.0 µs: one-shot. 1 MiB (1048.576 µs per s/GB): ring 168 +
    /// 163.11 = 331.11, one-shot 12 + 543.71 = 555.71, two-shot 24 + 135.93 = 159.93:
    /// two-shot. 1 GiB: two-shot 1.75 × 2^30 / 13.5e9 + 24e-6 = 0.139212755 s, ring
    /// 28 × 2^30 / 180e9 + 168e-6 = 0.167194506 s: two-shot. One-shot gives way to two-shot
    /// at 12 µs / (0.51852 − 0.12963) s/GB ≈ 30.9 kB.
    #[test]
    fn eight_gen4_cards_on_two_sockets() {
        let m = Machine {
            ranks: 8,
            h2d_gbps: 25.0,
            d2h_gbps: 26.5,
            duplex_gbps: 13.5,
            host_gbps: 180.0,
            dram_gbps: 500.0,
            handoff_us: 12.0,
            cards_per_uplink: 1,
        };
        assert_eq!(choose_with(&m, 8, None).chosen, Algorithm::OneShot);
        let mib = choose_with(&m, MIB, None);
        assert_eq!(mib.chosen, Algorithm::TwoShot);
        assert_eq!(mib.predictions[0].bound, Bound::Handoffs, "168 µs of ring phases against 163 of bytes");
        for (got, want) in micros(&m, MIB).into_iter().zip([331.11, 555.71, 159.93]) {
            assert!(close(got, want), "{got} µs, hand: {want}");
        }
        let gib = choose_with(&m, GIB, None);
        assert_eq!(gib.chosen, Algorithm::TwoShot);
        assert_eq!(gib.prediction().bound, Bound::CardDown);
        assert!(close(gib.prediction().seconds, 0.139_212_755), "{gib:?}");
        assert_eq!(gib.predictions[0].bound, Bound::Host);
        assert!(close(gib.predictions[0].seconds, 0.167_194_506), "{gib:?}");
        // Either side of the one-shot/two-shot crossover (30.9 kB).
        assert_eq!(choose_with(&m, 28_000, None).chosen, Algorithm::OneShot);
        assert_eq!(choose_with(&m, 34_000, None).chosen, Algorithm::TwoShot);
    }

    /// (b) Four Gen4 cards behind one PCIe switch with one x16 Gen4 uplink to the host
    /// (a published dual-Xeon box; NCCL models 24 GB/s a direction inside a
    /// switch). Without P2P every byte crosses the uplink both ways: all four together move
    /// at most 2 × 24 = 48 GB/s, up plus down. Per card as (a): H2D 25, D2H 26.5, duplex
    /// 13.5. DRAM: the switch's socket, 8 channels DDR4-2933 = 188 GB/s on paper, assumed
    /// 120. Handoff 14 µs (about 14 µs through the host, tinygrad's P2P README: a switch hop
    /// more than (a)).
    ///
    /// Per S, seconds per GB, N = 4:
    /// - ring: link 1.5/13.5 = 0.11111, host 4·3/48 = 0.25, DRAM 12/120 = 0.1: host;
    ///   6 phases = 84 µs.
    /// - one-shot: link 3/13.5 = 0.22222, host 4·4/48 = 0.33333, DRAM 16/120 = 0.13333:
    ///   host; 14 µs.
    /// - two-shot: link 1.5/13.5 = 0.11111, host 4·2.5/48 = 0.20833, DRAM 10/120 =
    ///   0.08333: host; 28 µs.
    ///
    /// 8 B: 84.0 / 14.0 / 28.0 µs: one-shot. 1 MiB: ring 84 + 262.14 = 346.14, one-shot
    /// 14 + 349.53 = 363.53, two-shot 28 + 218.45 = 246.45: two-shot. 1 GiB: two-shot
    /// 10 × 2^30 / 48e9 + 28e-6 = 0.223724213 s (ring 0.268519456): two-shot, the host
    /// term (here the uplink's cap on all four, given as the host rate)
    /// binds. Crossover 14 µs / 0.125 s/GB = 112 kB.
    #[test]
    fn four_cards_behind_one_switch_uplink() {
        let m = Machine {
            ranks: 4,
            h2d_gbps: 25.0,
            d2h_gbps: 26.5,
            duplex_gbps: 13.5,
            host_gbps: 48.0,
            dram_gbps: 120.0,
            handoff_us: 14.0,
            cards_per_uplink: 1,
        };
        assert_eq!(choose_with(&m, 8, None).chosen, Algorithm::OneShot);
        assert_eq!(choose_with(&m, 100_000, None).chosen, Algorithm::OneShot, "below 112 kB");
        let mib = choose_with(&m, MIB, None);
        assert_eq!(mib.chosen, Algorithm::TwoShot);
        for (got, want) in micros(&m, MIB).into_iter().zip([346.14, 363.53, 246.45]) {
            assert!(close(got, want), "{got} µs, hand: {want}");
        }
        let gib = choose_with(&m, GIB, None);
        assert_eq!(gib.chosen, Algorithm::TwoShot);
        assert!(gib.predictions.iter().all(|p| p.bound == Bound::Host), "the uplink binds all: {gib:?}");
        assert!(close(gib.prediction().seconds, 0.223_724_213), "{gib:?}");
        assert!(close(gib.predictions[0].seconds, 0.268_519_456), "{gib:?}");
    }

    /// (b') The same four cards, with the switch given as the probe's topology hands it
    /// over (four cards behind one uplink) rather than as a host rate: the host (400) and
    /// DRAM (1000) have room, and the uplink, at one card's rates, carries all four.
    ///
    /// 1 GiB, per card: two-shot up 1, down 1.5 (× 2^30 B), link 1.5 × 2^30 / 13.5e9 =
    /// 0.119305 s, uplink 4 × that = 0.477218 s, + 28 µs = 0.477246 s; the ring 0.477218 +
    /// 84 µs = 0.477302 s; one-shot down 3: 4 × 3 × 2^30 / 13.5e9 + 14 µs = 0.954451 s.
    /// Two-shot, the uplink binds.
    #[test]
    fn four_cards_behind_one_switch_from_the_topology() {
        let m = Machine {
            ranks: 4,
            h2d_gbps: 25.0,
            d2h_gbps: 26.5,
            duplex_gbps: 13.5,
            host_gbps: 400.0,
            dram_gbps: 1000.0,
            handoff_us: 14.0,
            cards_per_uplink: 4,
        };
        let gib = choose_with(&m, GIB, None);
        assert_eq!(gib.chosen, Algorithm::TwoShot);
        assert!(gib.predictions.iter().all(|p| p.bound == Bound::Uplink), "{gib:?}");
        for (got, want) in gib.predictions.iter().map(|p| p.seconds).zip([0.477_302, 0.954_451, 0.477_246]) {
            assert!(close(got, want), "{got} s, hand: {want}");
        }
        // Each card on its own link: the uplink term is gone and the card's link binds.
        let own = choose_with(&Machine { cards_per_uplink: 1, ..m }, GIB, None);
        assert_eq!(own.prediction().bound, Bound::CardDown);
        assert!(close(own.prediction().seconds, 0.119_305 + 28e-6), "{own:?}");
    }

    /// (c) Two Gen5 cards (RTX 5090, x16 each) on a desktop with dual-channel DDR5.
    ///
    /// Per card (figures published for 8× RTX 5090 on a Xeon 8458P): H2D 56.3, D2H 57.3,
    /// duplex 50.9. Host: assumed 200 (the CPU's PCIe lanes are not what binds here).
    /// DRAM: two channels of DDR5-5600 = 89.6 GB/s on paper, assumed 70. Handoff 12.8 µs
    /// (2× 5090 through the host, nccl-tests issue 287).
    ///
    /// At N = 2 all three move S up and S down per card and 4·S through host memory: link
    /// 1/50.9 = 0.019646, host 2·2/200 = 0.02, DRAM 4/70 = 0.057143 s/GB: DRAM binds them
    /// all, and one-shot's one phase beats the two of the others at every size (the ring
    /// and two-shot are the same thing here). 8 B: 12.8 µs. 1 MiB: 12.8 + 59.92 = 72.72 µs.
    /// 1 GiB: 4 × 2^30 / 70e9 + 12.8e-6 = 0.061369476 s (busbw 17.5 GB/s).
    #[test]
    fn two_gen5_cards_on_a_desktop() {
        let m = Machine {
            ranks: 2,
            h2d_gbps: 56.3,
            d2h_gbps: 57.3,
            duplex_gbps: 50.9,
            host_gbps: 200.0,
            dram_gbps: 70.0,
            handoff_us: 12.8,
            cards_per_uplink: 1,
        };
        for bytes in [8, MIB, GIB] {
            let plan = choose_with(&m, bytes, None);
            assert_eq!(plan.chosen, Algorithm::OneShot, "{bytes}: {plan:?}");
            assert_eq!(plan.predictions[0], Prediction { algorithm: Algorithm::Ring, ..plan.predictions[2] });
        }
        assert!(close(micros(&m, 8)[1], 12.8));
        assert!(close(micros(&m, MIB)[1], 72.72));
        let gib = choose_with(&m, GIB, None);
        assert_eq!(gib.prediction().bound, Bound::Dram);
        assert!(close(gib.prediction().seconds, 0.061_369_476), "{gib:?}");
    }
}
