//! Which all-reduce runs among more than two ranks: the cost model's choice
//! (`gp2p_collectives::cost`) between the communicator's two, priced as they run here.
//!
//! - **One-shot in lines** (the line kernel): every rank writes its buffer once and reads every
//!   other rank's, one phase; but an 8-byte line carries 4 data bytes and the call's number,
//!   so it moves twice the data's bytes: priced as the model's one-shot of `2 × S`. Its lines
//!   hold at most [`crate::CommOptions::lines_max_bytes`]; larger buffers take the rounds
//!   whatever the model says.
//! - **Two-shot in rounds** (`crate::rounds`): priced from its legs
//!   ([`gp2p_collectives::legs::all_reduce_traffic`], their traffic in closed form: this
//!   runs on every call): each share goes up once to the rank that folds it and each folded
//!   share goes up once for every other rank to read, so a card moves S up and 2(N−1)/N·S
//!   down where the shares are even (a page-aligned share's owner lands more, for small
//!   buffers), host memory sees each leg written once and read by each reader, (3N−2)·S in
//!   all, and the shares go out in N−1 rounds and come back in one more, each a trip through
//!   host memory behind a flag: N phases.
//!
//! The choice is made for each call from its size, on every rank alike (the rates and the
//! forced algorithm are the same on every rank: the forced one is among the options ranks
//! compare at creation). With the rates measured on H200s the lines win up to their 64 KiB
//! at 4 and at 8 ranks (8 ranks, 64 KiB: 71 µs against 101), which is what the communicator
//! ran before the model chose; a machine whose handoffs cost less moves the crossover down.
//! [`gp2p_collectives::cost::ALGORITHM_VAR`] or [`crate::CommOptions::algorithm`] forces one
//! (`one-shot`: the lines wherever they fit; `two-shot`: the rounds at every size).

use gp2p_collectives::cost::{Algorithm, Machine, Prediction, Traffic, price, traffic};
use gp2p_collectives::legs::all_reduce_traffic;

use crate::{Error, Result};

/// Bytes an 8-byte line moves per data byte (4 data bytes and a 4-byte call number).
pub const LINE_BYTES_PER_DATA_BYTE: usize = 2;

/// The communicator's two all-reduces among more than two ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ManyPath {
    /// The line kernel (one-shot).
    Lines,
    /// The two-shot rounds.
    Rounds,
}

/// How a communicator of more than two ranks picks its all-reduce.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ManyChoice {
    /// The rates the model prices with, for this world.
    pub machine: Machine,
    /// The largest buffer the lines hold, bytes.
    pub lines_max: usize,
    /// One-shot or two-shot, where the caller or the environment forced one.
    pub forced: Option<Algorithm>,
}

impl std::fmt::Display for ManyPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ManyPath::Lines => "one-shot (lines)",
            ManyPath::Rounds => "two-shot (rounds)",
        })
    }
}

impl ManyChoice {
    /// The model's prediction for each path at `bytes` per rank: (lines, rounds).
    pub fn predictions(&self, bytes: usize) -> (Prediction, Prediction) {
        let ranks = self.machine.ranks;
        let lines = traffic(Algorithm::OneShot, ranks, bytes * LINE_BYTES_PER_DATA_BYTE);
        let rounds = all_reduce_traffic(ranks, bytes);
        (price(&self.machine, Algorithm::OneShot, lines), price(&self.machine, Algorithm::TwoShot, rounds))
    }

    /// The path an all-reduce of `bytes` per rank takes.
    pub fn path(&self, bytes: usize) -> ManyPath {
        if bytes > self.lines_max {
            return ManyPath::Rounds;
        }
        match self.forced {
            Some(Algorithm::OneShot) => ManyPath::Lines,
            Some(_) => ManyPath::Rounds,
            None => {
                let (lines, rounds) = self.predictions(bytes);
                // A tie goes to the lines: one phase.
                if lines.seconds <= rounds.seconds { ManyPath::Lines } else { ManyPath::Rounds }
            }
        }
    }
}

/// Where a communicator's exact all-reduce of a size goes: what [`all_reduce_prediction`]
/// prices.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AllReducePaths {
    /// Ranks.
    pub world: usize,
    /// The largest all-reduce the two-rank one-kernel path runs, bytes.
    pub small_max: usize,
    /// Bytes of one pipeline slot.
    pub slot_bytes: usize,
    /// The chunk size where fixed ([`crate::CommOptions::chunk_bytes`]); `None`: by the
    /// message ([`crate::pipeline_chunk`]).
    pub chunk_bytes: Option<usize>,
    /// How more than two ranks choose (its `lines_max` also bounds the two-rank lines), and
    /// the forced algorithm.
    pub many: ManyChoice,
    /// Whether every rank's traffic crosses one link (two ranks on one GPU, as processes
    /// under MPS or as threads, the stand-in for cards behind one uplink): see
    /// [`AllReducePaths::two_ranks_take_rounds`].
    pub shared_link: bool,
}

impl AllReducePaths {
    /// Bytes of a chunk of the rounds' legs: the fixed chunk where there is one, else a slot
    /// (the exchange's chunks are sized by the message; the rounds' stay a slot until measured
    /// otherwise, see [`all_reduce_prediction`]).
    pub fn rounds_chunk(&self) -> usize {
        self.chunk_bytes.unwrap_or(self.slot_bytes).min(self.slot_bytes)
    }

    /// Whether two ranks' all-reduce of `bytes` (past the one-kernel sizes) takes the rounds:
    /// where forced ([`Algorithm::TwoShot`]), and unforced where the two share one link. There
    /// the rounds ran 4-5 % faster than the exchange from 16 MiB to 256 MiB, both folding
    /// from a scratch (one H100, two processes under MPS:
    /// `benches/results/h10080gbhbm3/comm-receive.txt`, 0.727/0.874/0.925 of bound against
    /// 0.697/0.835/0.884); the exchange was tuned on two cards with a link each.
    /// [`Algorithm::OneShot`] forces the exchange.
    pub fn two_ranks_take_rounds(&self, bytes: usize) -> bool {
        self.world == 2
            && bytes > self.small_max
            && match self.many.forced {
                Some(Algorithm::TwoShot) => true,
                Some(_) => false,
                None => self.shared_link,
            }
    }

    /// The largest all-reduce two ranks should run as one kernel, given room for `small_max`
    /// bytes: all of it, except where the two share one link and no algorithm is forced. There
    /// the one kernel and the rounds load the same link, and the model prices the flagged
    /// chunks' kernel at half its DMA rate ([`CHUNK_KERNEL_BYTES_PER_DATA_BYTE`]) against the
    /// rounds' chunk steps, so past some size the rounds win: this is the largest size, in
    /// 4 KiB steps, that the model (at `many`'s rates, the same on every rank) prices no
    /// dearer as one kernel, never below the lines. On one H100 shared by two processes the
    /// one kernel took 168 µs at 2 MiB against the rounds' 200, and 407 µs at 4 MiB against
    /// 310 (`benches/results/h10080gbhbm3/comm-one-kernel-2.txt`); on cards of their own the
    /// one kernel ran faster up to 4 MiB (see `CommOptions::small_max_bytes`'s default).
    pub fn one_kernel_max(&self) -> usize {
        const STEP: usize = 4 << 10;
        let floor = self.many.lines_max.min(self.small_max);
        if self.world != 2 || !self.shared_link || self.many.forced.is_some() {
            return self.small_max;
        }
        // Both ranks' bytes cross the one link.
        let machine = Machine { cards_per_uplink: 2, ..self.many.machine };
        let one_kernel_wins = |bytes: usize| {
            let one = all_reduce_prediction(&machine, &AllReducePaths { small_max: bytes, ..*self }, bytes);
            let rounds = all_reduce_prediction(&machine, &AllReducePaths { small_max: 0, ..*self }, bytes);
            one.seconds <= rounds.seconds
        };
        if one_kernel_wins(self.small_max) {
            return self.small_max;
        }
        // Bisect in whole steps between a size the one kernel takes and one the rounds win.
        let (mut lo, mut hi) = (floor / STEP, self.small_max / STEP);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if one_kernel_wins(mid * STEP) { lo = mid } else { hi = mid }
        }
        (lo * STEP).max(floor)
    }

    /// What an exact all-reduce of `bytes` per rank runs: `one kernel (lines)`, `one kernel
    /// (chunks)`, `exchange` or `two-shot (rounds)` between two ranks; among more, the
    /// [`ManyPath`]'s name; `nothing` for one rank.
    pub fn path_name(&self, bytes: usize) -> &'static str {
        match self.world {
            0 | 1 => "nothing",
            2 if bytes <= self.many.lines_max => "one kernel (lines)",
            2 if bytes <= self.small_max => "one kernel (chunks)",
            2 if self.two_ranks_take_rounds(bytes) => "two-shot (rounds)",
            2 => "exchange",
            _ => match self.many.path(bytes) {
                ManyPath::Lines => "one-shot (lines)",
                ManyPath::Rounds => "two-shot (rounds)",
            },
        }
    }
}

/// The cost model's time for an exact all-reduce of `bytes` per rank, priced on `machine`
/// as the communicator runs it (`paths` says where it goes; the model's own choice among
/// more than two ranks is made with `paths.many`'s rates, as the communicator makes it):
///
/// - two ranks, up to `small_max`: one kernel, one phase, one-shot's traffic: each rank's
///   buffer up once and its peer's down once, in 8-byte lines of 4 data bytes (twice the
///   bytes) up to the lines' capacity and in flagged chunks (the bytes, at half the rate) above;
/// - two ranks above it: the exchange, one-shot's traffic of the bytes (each rank's buffer up
///   through its slots, the peer's down), or the rounds where two-shot is forced or the two
///   share a link ([`AllReducePaths::two_ranks_take_rounds`]), each with its fill (below);
/// - more ranks: the path [`ManyChoice::path`] takes, priced as [`ManyChoice::predictions`]
///   prices it, the rounds with their fill; one rank: nothing moves.
///
/// The pipelined paths also pay their fill: the first chunk goes up before anything comes
/// down and the last comes down after everything went up, so each direction carries one
/// chunk's time more. For the exchange that is its chunk ([`crate::pipeline_chunk`] of the
/// buffer); for the rounds a share, or a chunk of it ([`AllReducePaths::rounds_chunk`]). And
/// they pay their steps: every chunk step in turn (the exchange's chunks, the rounds' N rounds
/// of a share's chunks, [`rounds_steps`], one more for the fill) costs [`EXACT_STEP_OPS`]
/// dependent GPU operations at [`Machine::op_us`] each. With the handoff measured there, that
/// brings every pipelined row measured on one H100 shared by two or four ranks within ±15 %
/// (the test `the_h100_rows_of_the_pipelined_paths_are_within_fifteen_percent` holds them),
/// where the fill alone left them up to 20 % low; the steps make small chunks cost what they
/// do. Two ranks' flagged-chunk kernel is priced at half the link's DMA rate
/// ([`CHUNK_KERNEL_BYTES_PER_DATA_BYTE`]); eight ranks' large rows wait on the host's enqueue,
/// which the model does not see.
pub fn all_reduce_prediction(machine: &Machine, paths: &AllReducePaths, bytes: usize) -> Prediction {
    let filled = |t: Traffic, fill: usize| Traffic {
        up_bytes: t.up_bytes + fill as f64,
        down_bytes: t.down_bytes + fill as f64,
        ..t
    };
    // The rounds' first chunk: a share, or a chunk of it.
    let rounds_fill = bytes.div_ceil(paths.world.max(1)).min(paths.rounds_chunk());
    // The pipelined paths' chunk steps (see `Machine::op_us`), each of EXACT_STEP_OPS.
    let stepped = |p: Prediction, steps: usize| Prediction {
        seconds: p.seconds + machine.steps_seconds(steps, EXACT_STEP_OPS),
        ..p
    };
    match paths.world {
        0 | 1 => price(machine, Algorithm::OneShot, traffic(Algorithm::OneShot, 1, bytes)),
        2 if bytes <= paths.small_max => {
            // One kernel, no pipeline: the lines move twice the bytes, the flagged chunks the
            // bytes at about half the DMA rate (CHUNK_KERNEL_BYTES_PER_DATA_BYTE).
            let moved = if bytes <= paths.many.lines_max {
                bytes * LINE_BYTES_PER_DATA_BYTE
            } else {
                bytes * CHUNK_KERNEL_BYTES_PER_DATA_BYTE
            };
            price(machine, Algorithm::OneShot, traffic(Algorithm::OneShot, 2, moved))
        }
        2 if paths.two_ranks_take_rounds(bytes) => stepped(
            price(machine, Algorithm::TwoShot, filled(all_reduce_traffic(2, bytes), rounds_fill)),
            rounds_steps(2, bytes, paths.rounds_chunk()),
        ),
        2 => {
            let chunk = crate::pipeline_chunk(bytes, paths.slot_bytes, paths.chunk_bytes);
            let exchange =
                price(machine, Algorithm::OneShot, filled(traffic(Algorithm::OneShot, 2, bytes), chunk.min(bytes)));
            // Its chunks in turn, and the fill's one more.
            stepped(exchange, bytes.div_ceil(chunk) + 1)
        }
        ranks => {
            let priced = ManyChoice { machine: Machine { ranks, ..*machine }, ..paths.many };
            let (lines, rounds) = priced.predictions(bytes);
            if paths.many.path(bytes) == ManyPath::Lines {
                lines
            } else {
                let rounds = price(machine, Algorithm::TwoShot, filled(rounds.traffic, rounds_fill));
                stepped(rounds, rounds_steps(ranks, bytes, paths.rounds_chunk()))
            }
        }
    }
}

/// What two ranks' flagged-chunk kernel (the one kernel above the lines) is priced as moving
/// per byte of data: its loads and stores across the bus reach about half the link's DMA rate.
/// On one H100 shared by two processes (duplex 50.5 GB/s) 1 MiB took 89-91 µs and 4 MiB
/// 337-432 µs (`benches/results/h10080gbhbm3/comm-exact-bf16-2.txt`, `comm-all-reduce-2.txt`,
/// `comm-chunks-message-2.txt`), where the DMA rate alone prices 52 and 177.
pub const CHUNK_KERNEL_BYTES_PER_DATA_BYTE: usize = 2;

/// Dependent operations of one chunk step of the exact pipelines: the wait for a slot or a
/// flag, the copy out or the landing's copy, the fold, the flag's write.
pub const EXACT_STEP_OPS: usize = 4;

/// Chunk steps in turn of the two-shot rounds of `bytes` among `world`, chunks of `chunk`:
/// each of the N rounds (N − 1 of the reduce-scatter, one of the all-gather) sends a share
/// in its chunks, one after another, and the fill adds one.
pub fn rounds_steps(world: usize, bytes: usize, chunk: usize) -> usize {
    let share = bytes.div_ceil(world.max(1));
    world * share.div_ceil(chunk.max(1)).max(1) + 1
}

/// The algorithm forced by `option` ([`crate::CommOptions::algorithm`]) or else by the value
/// of [`gp2p_collectives::cost::ALGORITHM_VAR`] (`env`): None where neither names one. The
/// ring is refused (the one-process engine runs it; the communicator runs one-shot and
/// two-shot), as is a value that names no algorithm.
pub(crate) fn forced(option: Option<Algorithm>, env: Option<&str>) -> Result<Option<Algorithm>> {
    let (forced, name) = match option {
        Some(a) => (Some(a), "algorithm"),
        None => {
            let from_env = gp2p_collectives::cost::forced_algorithm(env).map_err(|e| Error::InvalidOption {
                name: gp2p_collectives::cost::ALGORITHM_VAR,
                reason: e.to_string(),
            })?;
            (from_env, gp2p_collectives::cost::ALGORITHM_VAR)
        }
    };
    if forced == Some(Algorithm::Ring) {
        return Err(Error::InvalidOption {
            name,
            reason: "ring: among processes the communicator runs one-shot (lines) or two-shot (rounds); force one of \
                     those, or leave it unset for the cost model's choice"
                .into(),
        });
    }
    Ok(forced)
}

/// The forced algorithm as the word ranks compare at creation: 0 none, 1 one-shot, 2
/// two-shot (3 the ring, which [`forced`] refuses before).
pub(crate) fn option_word(forced: Option<Algorithm>) -> u32 {
    match forced {
        None => 0,
        Some(Algorithm::OneShot) => 1,
        Some(Algorithm::TwoShot) => 2,
        Some(Algorithm::Ring) => 3,
    }
}

#[cfg(test)]
mod tests {
    use gp2p_collectives::cost::{Bound, OP_US};

    use super::*;

    const KIB: usize = 1 << 10;

    fn h200(ranks: usize) -> ManyChoice {
        ManyChoice { machine: Machine::h200(ranks), lines_max: 64 * KIB, forced: None }
    }

    /// Two ranks' paths with the default options (one kernel to 4 MiB, lines to 2 KiB, 8 MiB
    /// slots, chunks by the message), on one shared link or on cards of their own.
    fn two_ranks_default(shared_link: bool) -> AllReducePaths {
        AllReducePaths {
            world: 2,
            small_max: 4 << 20,
            slot_bytes: 8 << 20,
            chunk_bytes: None,
            many: ManyChoice { machine: Machine::h200(2), lines_max: 2 * KIB, forced: None },
            shared_link,
        }
    }

    /// `a` within 0.5 % of `b`.
    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 0.005 * b.abs()
    }

    #[test]
    fn eight_h200_ranks_price_the_lines_at_twice_the_bytes_and_the_rounds_at_eight_phases() {
        // By hand, 64 KiB a rank, 8 ranks, H200 rates (DRAM 140 GB/s, handoff 11.4 µs):
        // lines: DRAM takes 8² × 128 KiB = 8 MiB → 59.9 µs, + 1 handoff = 71.3 µs;
        // rounds: each card sends 64 KiB and lands 64 KiB + 6 × its 8 KiB share = 112 KiB,
        // host memory sees (3·8 − 2) × 64 KiB = 1.375 MiB → 10.3 µs (DRAM binds: the host's
        // DMAs take 8 × 176 KiB / 190 GB/s = 7.6 µs), + 8 handoffs (91.2 µs) = 101.5 µs. The
        // lines win.
        let choice = h200(8);
        let (lines, rounds) = choice.predictions(64 * KIB);
        assert!(close(lines.seconds * 1e6, 11.4 + 64.0 * 131072.0 / 140e3), "{lines:?}");
        assert!(close(rounds.seconds * 1e6, 8.0 * 11.4 + 22.0 * 65536.0 / 140e3), "{rounds:?}");
        assert_eq!((rounds.traffic.up_bytes, rounds.traffic.down_bytes), (64.0 * 1024.0, 112.0 * 1024.0));
        assert!(close(lines.seconds * 1e6, 71.31) && close(rounds.seconds * 1e6, 101.5));
        assert_eq!(choice.path(64 * KIB), ManyPath::Lines);
        assert_eq!(choice.path(64 * KIB + 1), ManyPath::Rounds, "past the lines' capacity");
    }

    #[test]
    fn with_h200_rates_the_lines_take_every_size_they_hold_at_three_to_eight_ranks() {
        for ranks in 3..=8 {
            let choice = h200(ranks);
            for bytes in [4, 100, 4 * KIB, 16 * KIB, 64 * KIB] {
                assert_eq!(choice.path(bytes), ManyPath::Lines, "{ranks} ranks, {bytes} bytes");
            }
        }
    }

    #[test]
    fn cheap_handoffs_move_the_crossover_below_the_lines_capacity() {
        // Handoffs of 1 µs, 8 ranks. At 8 KiB: lines DRAM 8² × 16 KiB / 140 GB/s = 7.49 µs
        // + 1 = 8.49; rounds: the two pages go to ranks 0 and 1 (shares start on pages), each
        // of which sends 8 KiB and lands 8 + 6 × 4 = 32 KiB, so the host's DMAs bind: 8 × 40
        // KiB / 190 GB/s = 1.72 µs, + 8 × 1 = 9.72: the lines. At 16 KiB: lines 14.98 + 1 =
        // 15.98; rounds 8 + DRAM 22 × 16 KiB / 140 GB/s (2.57) = 10.57: the rounds.
        let choice = ManyChoice { machine: Machine { handoff_us: 1.0, ..Machine::h200(8) }, ..h200(8) };
        let (lines, rounds) = choice.predictions(8 * KIB);
        assert!(close(lines.seconds * 1e6, 8.49) && close(rounds.seconds * 1e6, 9.72), "{lines:?} {rounds:?}");
        assert_eq!(choice.path(8 * KIB), ManyPath::Lines);
        let (lines, rounds) = choice.predictions(16 * KIB);
        assert!(close(lines.seconds * 1e6, 15.98) && close(rounds.seconds * 1e6, 10.57), "{lines:?} {rounds:?}");
        assert_eq!(choice.path(16 * KIB), ManyPath::Rounds);
        assert_eq!(choice.path(4), ManyPath::Lines, "the smallest stay one phase");
    }

    #[test]
    fn a_forced_algorithm_wins_where_it_can_run() {
        let one = ManyChoice { forced: Some(Algorithm::OneShot), ..h200(8) };
        let two = ManyChoice { forced: Some(Algorithm::TwoShot), ..h200(8) };
        assert_eq!(two.path(8), ManyPath::Rounds, "two-shot at every size");
        let cheap = ManyChoice { machine: Machine { handoff_us: 1.0, ..Machine::h200(8) }, ..one };
        assert_eq!(cheap.path(32 * KIB), ManyPath::Lines, "one-shot where the model says rounds");
        assert_eq!(one.path(64 * KIB + 1), ManyPath::Rounds, "but never past the lines' capacity");
    }

    #[test]
    fn two_ranks_on_one_link_take_the_rounds_past_the_one_kernel_unless_one_shot_is_forced() {
        const MIB: usize = 1 << 20;
        let paths = |forced, shared_link| AllReducePaths {
            world: 2,
            small_max: 4 * MIB,
            slot_bytes: 8 * MIB,
            chunk_bytes: None,
            many: ManyChoice { forced, ..h200(2) },
            shared_link,
        };
        let past = 4 * MIB + 1;
        assert!(paths(None, true).two_ranks_take_rounds(past));
        assert!(!paths(None, true).two_ranks_take_rounds(4 * MIB), "the one kernel first");
        assert!(!paths(None, false).two_ranks_take_rounds(past), "links of their own: the exchange");
        assert!(!paths(Some(Algorithm::OneShot), true).two_ranks_take_rounds(past), "one-shot forces the exchange");
        assert!(paths(Some(Algorithm::TwoShot), false).two_ranks_take_rounds(past));
        assert_eq!(paths(None, true).path_name(past), "two-shot (rounds)");
        assert_eq!(paths(None, false).path_name(past), "exchange");
        let three = AllReducePaths { world: 3, ..paths(None, true) };
        assert!(!three.two_ranks_take_rounds(past), "two ranks only");
        let shared = Machine { duplex_gbps: 50.0, cards_per_uplink: 2, ..Machine::h200(2) };
        let priced = all_reduce_prediction(&shared, &paths(None, true), 64 * MIB);
        assert_eq!(priced.algorithm, Algorithm::TwoShot, "priced as the path it takes: {priced:?}");
    }

    #[test]
    fn an_all_reduce_is_priced_as_the_path_it_takes() {
        const MIB: usize = 1 << 20;
        let paths = |world, forced| AllReducePaths {
            world,
            small_max: 4 * MIB,
            slot_bytes: 8 * MIB,
            chunk_bytes: None,
            many: ManyChoice { forced, ..h200(world) },
            shared_link: false,
        };
        let slot_chunks = |world, forced| AllReducePaths { chunk_bytes: Some(8 * MIB), ..paths(world, forced) };
        // A shared link of 50 GB/s each way between two processes (the uplink binds: twice a
        // card's time), H200's handoff. 16 MiB in chunks of a quarter, 4 MiB of fill each way:
        // 2 x 20 MiB / 50 GB/s = 839 µs, and five steps of four operations; in chunks of a
        // slot, 8 MiB: 2 x 24 MiB, 1007 µs, and three steps; 4.5 MiB, just past the one
        // kernel, fills with a quarter, or with all of it where a chunk is a slot.
        let shared = Machine { duplex_gbps: 50.0, cards_per_uplink: 2, ..Machine::h200(2) };
        let steps = |n: f64| n * EXACT_STEP_OPS as f64 * OP_US;
        let exchange = all_reduce_prediction(&shared, &paths(2, None), 16 * MIB);
        assert_eq!(
            (exchange.algorithm, exchange.bound, exchange.traffic.phases),
            (Algorithm::OneShot, Bound::Uplink, 1)
        );
        assert!(close(exchange.seconds * 1e6, 11.4 + 2.0 * 20.0 * 1048.576 / 50.0 + steps(5.0)), "{exchange:?}");
        let slot_sized = all_reduce_prediction(&shared, &slot_chunks(2, None), 16 * MIB);
        assert!(close(slot_sized.seconds * 1e6, 11.4 + 2.0 * 24.0 * 1048.576 / 50.0 + steps(3.0)), "{slot_sized:?}");
        let just_past = |p: AllReducePaths| all_reduce_prediction(&shared, &p, 4 * MIB + 512 * KIB).traffic.up_bytes;
        assert_eq!(just_past(paths(2, None)), (4.5 + 1.125) * MIB as f64, "a quarter of the buffer");
        assert_eq!(just_past(slot_chunks(2, None)), 9.0 * MIB as f64, "the whole buffer is the one chunk");
        // Two-shot forced: the rounds' first chunk, a share of 8 MiB (a slot), of fill each way.
        let rounds = all_reduce_prediction(&shared, &paths(2, Some(Algorithm::TwoShot)), 16 * MIB);
        assert_eq!((rounds.algorithm, rounds.traffic.phases), (Algorithm::TwoShot, 2), "{rounds:?}");
        assert_eq!(rounds.traffic.up_bytes, 24.0 * MIB as f64);
        assert_eq!(rounds_steps(2, 16 * MIB, 8 * MIB), 3, "two rounds of one chunk, and the fill");
        assert_eq!(rounds_steps(4, 64 * MIB, 4 * MIB), 17, "four rounds of four chunks, and the fill");
        // The one kernel has no pipeline: the lines carry twice the bytes, the chunks above
        // them the bytes at half the rate, and two-shot forced does not move these sizes.
        let small = |bytes, forced| all_reduce_prediction(&shared, &paths(2, forced), bytes);
        assert_eq!(small(64 * KIB, None).traffic.up_bytes, 128.0 * 1024.0);
        assert_eq!(small(64 * KIB + 4, Some(Algorithm::TwoShot)).traffic.up_bytes, 2.0 * 65540.0);
        // More ranks: the choice module's path, its price with the given rates; the rounds
        // with a share (below a chunk) of fill each way.
        let eight = all_reduce_prediction(&Machine::h200(8), &paths(8, None), 64 * KIB);
        assert_eq!(eight, h200(8).predictions(64 * KIB).0, "the lines at 64 KiB");
        let past = all_reduce_prediction(&Machine::h200(8), &paths(8, None), MIB);
        let plain = h200(8).predictions(MIB).1.traffic;
        assert_eq!(past.algorithm, Algorithm::TwoShot, "the rounds past the lines");
        assert_eq!(
            (past.traffic.up_bytes, past.traffic.down_bytes),
            (plain.up_bytes + 131072.0, plain.down_bytes + 131072.0)
        );
        let fixed = AllReducePaths { chunk_bytes: Some(64 * KIB), ..paths(8, None) };
        let past_fixed = all_reduce_prediction(&Machine::h200(8), &fixed, MIB);
        assert_eq!(past_fixed.traffic.up_bytes, plain.up_bytes + 65536.0, "a fixed chunk of fill");
        assert_eq!(all_reduce_prediction(&shared, &paths(1, None), MIB).seconds, 0.0, "one rank moves nothing");
        let names = [64 * KIB, 64 * KIB + 4, 4 * MIB + 4].map(|b| paths(2, None).path_name(b));
        assert_eq!(names, ["one kernel (lines)", "one kernel (chunks)", "exchange"]);
        assert_eq!(paths(2, Some(Algorithm::TwoShot)).path_name(4 * MIB + 4), "two-shot (rounds)");
        assert_eq!(paths(8, None).path_name(MIB), "two-shot (rounds)");
    }

    /// Every pipelined row measured on one H100 shared by the ranks under MPS, folding from a
    /// scratch, with the handoff measured there (10.7 µs) and the duplex of each run: two
    /// ranks' exchange in slot-sized chunks and the rounds (`benches/results/h10080gbhbm3/
    /// comm-receive.txt`, duplex 50.0 GB/s), the exchange chunked by the message
    /// (`comm-chunks-message-2.txt`, 50.5), four ranks' rounds in two runs
    /// (`comm-receive.txt`, `comm-chunks-slot-4.txt`): the model, with its fill and its steps,
    /// is within ±15 % of each. (Eight ranks are not: their host enqueue binds, 78 of 105 ms
    /// at 256 MiB, `comm-all-reduce-8.txt`.) Two ranks' 1 MiB, the flagged-chunk kernel
    /// (`comm-all-reduce-2.txt`, `comm-exact-bf16-2.txt`: 90.5 and 89.3 µs), is too.
    #[test]
    fn the_h100_rows_of_the_pipelined_paths_are_within_fifteen_percent() {
        const MIB: usize = 1 << 20;
        struct Run {
            world: usize,
            chunk: Option<usize>,
            forced: Option<Algorithm>,
            duplex: f64,
            /// µs at 4, 16, 64 and 256 MiB (0: the one kernel's, or not run).
            times: [f64; 4],
        }
        let runs = [
            Run { world: 2, chunk: Some(8 * MIB), forced: None, duplex: 50.0, times: [0.0, 965.4, 3226.6, 12188.9] },
            Run { world: 2, chunk: None, forced: None, duplex: 50.5, times: [0.0, 936.4, 3174.8, 12008.8] },
            Run {
                world: 2,
                chunk: Some(8 * MIB),
                forced: Some(Algorithm::TwoShot),
                duplex: 50.0,
                times: [0.0, 953.7, 3174.6, 11994.4],
            },
            Run { world: 4, chunk: Some(4 * MIB), forced: None, duplex: 50.0, times: [789.7, 2380.8, 9423.8, 37955.6] },
            Run { world: 4, chunk: None, forced: None, duplex: 50.5, times: [808.1, 2361.5, 9344.3, 37050.4] },
        ];
        let two = two_ranks_default(false);
        let shared = Machine { duplex_gbps: 50.5, cards_per_uplink: 2, handoff_us: 10.7, ..Machine::h200(2) };
        let one_kernel_us = all_reduce_prediction(&shared, &two, MIB).seconds * 1e6;
        for measured_us in [90.5, 89.3] {
            assert!((one_kernel_us / measured_us - 1.0).abs() <= 0.15, "1 MiB: model {one_kernel_us:.0} µs");
        }
        for run in runs {
            let world = run.world;
            // The defaults' layout (`layout`'s tests hold `AllReducePaths::of` to it): two
            // ranks one kernel to 4 MiB, 8 MiB slots; four ranks lines to 64 KiB, 4 MiB slots.
            let (small_max, slot_bytes, lines_max) =
                if world == 2 { (4 * MIB, 8 * MIB, 2 * KIB) } else { (64 * KIB, 4 * MIB, 64 * KIB) };
            let many = ManyChoice { machine: Machine::h200(world), lines_max, forced: run.forced };
            let paths =
                AllReducePaths { world, small_max, slot_bytes, chunk_bytes: run.chunk, many, shared_link: false };
            let machine =
                Machine { duplex_gbps: run.duplex, cards_per_uplink: world, handoff_us: 10.7, ..Machine::h200(world) };
            for (mib, measured_us) in [4, 16, 64, 256].into_iter().zip(run.times) {
                if measured_us == 0.0 {
                    continue;
                }
                let model_us = all_reduce_prediction(&machine, &paths, mib * MIB).seconds * 1e6;
                let error = model_us / measured_us - 1.0;
                assert!(
                    error.abs() <= 0.15,
                    "{world} ranks, chunks {:?}, {mib} MiB: model {model_us:.0} µs, measured {measured_us}",
                    run.chunk
                );
            }
        }
    }

    #[test]
    fn the_forced_algorithm_comes_from_the_option_then_the_environment_and_never_the_ring() {
        assert_eq!(forced(None, None).unwrap(), None);
        assert_eq!(forced(None, Some("")).unwrap(), None, "empty counts as unset");
        assert_eq!(forced(None, Some("Two-Shot")).unwrap(), Some(Algorithm::TwoShot));
        assert_eq!(forced(Some(Algorithm::OneShot), Some("two-shot")).unwrap(), Some(Algorithm::OneShot));
        let err = forced(None, Some("ring")).unwrap_err().to_string();
        assert!(err.contains("GP2P_ALGORITHM") && err.contains("one-shot (lines) or two-shot (rounds)"), "{err}");
        let err = forced(Some(Algorithm::Ring), None).unwrap_err().to_string();
        assert!(err.contains("algorithm") && err.contains("ring"), "{err}");
        let err = forced(None, Some("fastest")).unwrap_err().to_string();
        assert!(err.contains("GP2P_ALGORITHM") && err.contains("fastest"), "{err}");
        let words: Vec<u32> = [None, Some(Algorithm::OneShot), Some(Algorithm::TwoShot)].map(option_word).into();
        assert_eq!(words, [0, 1, 2]);
    }

    /// Two ranks sharing one link stop the one kernel where the model prices the rounds
    /// cheaper: between 2 and 4 MiB at the H200 defaults and at the rates measured on the H100
    /// where the one kernel took 168 µs at 2 MiB (rounds 200) and 407 at 4 MiB (rounds 310,
    /// `benches/results/h10080gbhbm3/comm-one-kernel-2.txt`); cards of their own, a forced
    /// algorithm and more ranks keep the room's whole size.
    #[test]
    fn two_ranks_on_one_link_stop_the_one_kernel_where_the_rounds_get_cheaper() {
        const MIB: usize = 1 << 20;
        let shared = two_ranks_default(true);
        let h100 = Machine { duplex_gbps: 41.6, handoff_us: 10.8, op_us: 5.54, dram_gbps: 90.0, ..Machine::h200(2) };
        for paths in [shared, AllReducePaths { many: ManyChoice { machine: h100, ..shared.many }, ..shared }] {
            let max = paths.one_kernel_max();
            assert!((2 * MIB..4 * MIB).contains(&max), "{max}");
            assert_eq!(max % (4 * KIB), 0, "{max}");
            let cut = AllReducePaths { small_max: max, ..paths };
            assert_eq!(cut.path_name(max), "one kernel (chunks)");
            assert_eq!(cut.path_name(max + 4 * KIB), "two-shot (rounds)");
        }
        assert_eq!(AllReducePaths { shared_link: false, ..shared }.one_kernel_max(), 4 * MIB);
        for forced in [Algorithm::OneShot, Algorithm::TwoShot] {
            let paths = AllReducePaths { many: ManyChoice { forced: Some(forced), ..shared.many }, ..shared };
            assert_eq!(paths.one_kernel_max(), 4 * MIB, "{forced:?}");
        }
        // A room the rounds never beat within is kept whole; one under the lines stays.
        assert_eq!(AllReducePaths { small_max: 256 * KIB, ..shared }.one_kernel_max(), 256 * KIB);
        assert_eq!(AllReducePaths { small_max: KIB, ..shared }.one_kernel_max(), KIB);
    }
}
