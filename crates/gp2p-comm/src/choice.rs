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

use crate::rounds::LaneWaits;
use crate::{Error, Result};

/// Bytes an 8-byte line moves per data byte (4 data bytes and a 4-byte call number).
pub const LINE_BYTES_PER_DATA_BYTE: usize = 2;

/// The communicator's all-reduces among more than two ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ManyPath {
    /// The line kernel (one-shot).
    Lines,
    /// The two-shot in one flagged-chunk kernel per rank, above the lines where the
    /// communicator was made with room for it (`CommOptions::many_chunks`; not by default).
    Chunks,
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
    /// The largest buffer the many-rank flagged-chunk kernel takes (its areas' room), bytes;
    /// 0 where the communicator has no areas for it.
    pub chunks_max: usize,
    /// One-shot or two-shot, where the caller or the environment forced one.
    pub forced: Option<Algorithm>,
}

impl std::fmt::Display for ManyPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ManyPath::Lines => "one-shot (lines)",
            ManyPath::Chunks => "two-shot (flagged chunks)",
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

    /// The path an all-reduce of `bytes` per rank takes: above the lines, the flagged chunks
    /// where the communicator has room for them and each rank owns a chunk (unless two-shot in
    /// rounds is forced), else the rounds.
    pub fn path(&self, bytes: usize) -> ManyPath {
        if bytes > self.lines_max {
            let chunks = bytes <= self.chunks_max
                && bytes.div_ceil(gp2p_kernels::CHUNK_BYTES) >= self.machine.ranks
                && self.forced != Some(Algorithm::TwoShot);
            return if chunks { ManyPath::Chunks } else { ManyPath::Rounds };
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
    /// Whether every rank's traffic crosses one link (two ranks on one GPU as processes
    /// under MPS, the stand-in for cards behind one uplink; two threads of one process there
    /// share a context too and keep two cards' paths, as measured): see
    /// [`AllReducePaths::two_ranks_take_rounds`].
    pub shared_link: bool,
}

/// How much dearer than the rounds the model may price two ranks' one kernel on a shared link
/// and still pick it ([`AllReducePaths::one_kernel_max`]): the kernel is one launch where the
/// rounds enqueue a driver call a step, and where the model priced it up to 7.5 % dearer (3-4
/// MiB) the two ran within 2.2 % of each other on one H100 (234 against 229 µs at 3 MiB, 265
/// against 266 at 4 MiB), the kernel's host time 2.9-5.4 µs a call where the rounds' was 60 at
/// 4 MiB (`benches/results/h10080gbhbm3/comm-one-kernel-2.txt`, `comm-all-reduce-2.txt`).
pub const ONE_KERNEL_HOST_TIE: f64 = 1.10;

impl AllReducePaths {
    /// Bytes of a chunk of the rounds' legs: the fixed chunk where there is one, else a slot
    /// (the exchange's chunks are sized by the message; the rounds' stay a slot: 512 KiB to
    /// 2 MiB chunks ran slower nearly everywhere among 2, 4 and 8 processes on one H100,
    /// `benches/results/h10080gbhbm3/comm-rounds-chunks.txt`).
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

    /// These paths as two ranks on one GPU take them, sharing its link as their communicator
    /// finds (`Communicator::new`): the rounds above the one kernel, which runs only as far as
    /// it prices within [`ONE_KERNEL_HOST_TIE`] of them ([`AllReducePaths::one_kernel_max`]).
    pub fn on_one_link(self) -> AllReducePaths {
        let shared = AllReducePaths { shared_link: true, ..self };
        AllReducePaths { small_max: shared.one_kernel_max(), ..shared }
    }

    /// The largest all-reduce two ranks should run as one kernel, given room for `small_max`
    /// bytes: all of it, except where the two share one link and no algorithm is forced. There
    /// the one kernel and the rounds load the same link, and the model prices the flagged
    /// chunks' kernel below its DMA rate ([`CHUNK_KERNEL_DMA_SHARE`]) against the rounds'
    /// chunk steps, so past some size the rounds win: this is the largest size, in 4 KiB
    /// steps, that the model (at `many`'s rates, the same on every rank) prices as one kernel
    /// at most [`ONE_KERNEL_HOST_TIE`] times the rounds, never below the lines (the whole
    /// default room of 4 MiB at the H200 defaults and at that H100's rates; about 4.5 MiB in a
    /// room of 8). On one H100 shared by two processes the two ran
    /// 149 against 181 µs at 2 MiB, 234 against 229 at 3 MiB and 265 against 266 at 4 MiB
    /// (`benches/results/h10080gbhbm3/comm-one-kernel-2.txt`); on cards of their
    /// own the one kernel ran faster up to 4 MiB (see `CommOptions::small_max_bytes`'s
    /// default).
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
            one.seconds <= rounds.seconds * ONE_KERNEL_HOST_TIE
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
                ManyPath::Chunks => "two-shot (flagged chunks)",
                ManyPath::Rounds => "two-shot (rounds)",
            },
        }
    }
}

/// `machine` as two ranks' flagged-chunk kernel sees it: the link at the kernel's share of
/// its DMA rate ([`CHUNK_KERNEL_DMA_SHARE`]), host memory at its own.
fn chunk_kernel_rates(machine: &Machine) -> Machine {
    link_share(machine, CHUNK_KERNEL_DMA_SHARE)
}

/// `machine` as the many-rank flagged-chunk kernel sees it: the link at two ranks' share of
/// its DMA rate, slowed by [`MANY_CHUNKS_SLOWDOWN_PER_RANK`] for each rank sharing its GPU
/// past two.
fn many_chunk_kernel_rates(machine: &Machine) -> Machine {
    let past_two = machine.ranks_per_device.saturating_sub(2) as f64;
    link_share(machine, 1.0 / (1.0 / CHUNK_KERNEL_DMA_SHARE + MANY_CHUNKS_SLOWDOWN_PER_RANK * past_two))
}

/// `machine` with its link at `k` of its DMA rates, host memory at its own.
fn link_share(machine: &Machine, k: f64) -> Machine {
    Machine {
        h2d_gbps: machine.h2d_gbps * k,
        d2h_gbps: machine.d2h_gbps * k,
        duplex_gbps: machine.duplex_gbps * k,
        ..*machine
    }
}

/// The cost model's time for an exact all-reduce of `bytes` per rank, priced on `machine`
/// as the communicator runs it (`paths` says where it goes; the model's own choice among
/// more than two ranks is made with `paths.many`'s rates, as the communicator makes it):
///
/// - two ranks, up to `small_max`: one kernel, one phase, one-shot's traffic: each rank's
///   buffer up once and its peer's down once, in 8-byte lines of 4 data bytes (twice the
///   bytes) up to the lines' capacity and in flagged chunks (the bytes, below the DMA rate,
///   after a chunk step) above;
/// - two ranks above it: the exchange, one-shot's traffic of the bytes (each rank's buffer up
///   through its slots, the peer's down), with its fill (below), or the rounds where two-shot
///   is forced or the two share a link ([`AllReducePaths::two_ranks_take_rounds`]), without:
///   each of their waits names the one chunk it needs (`LaneWaits::EachChunk` of
///   `gp2p_collectives`), and on one H100 shared by two processes the rounds of 1-16 MiB ran
///   within 7 % of the price without the fill and up to 22 % under it with;
/// - more ranks: the path [`ManyChoice::path`] takes, priced as [`ManyChoice::predictions`]
///   prices it, the rounds with their fill; one rank: nothing moves.
///
/// The pipelined paths but two ranks' rounds also pay their fill: the first chunk goes up
/// before anything comes down and the last comes down after everything went up, so each
/// direction carries one chunk's time more, once for a link several cards share (and so once
/// a link in the host's term too: [`Machine::filled`]). For the exchange that is its chunk
/// ([`crate::pipeline_chunk`] of the buffer); for the rounds among more a share, or a chunk
/// of it ([`AllReducePaths::rounds_chunk`]). And every pipelined path pays its steps: every
/// chunk step in turn (the exchange's chunks, the rounds' N rounds of a share's chunks,
/// [`rounds_steps`], one more for the fill, which two ranks' rounds keep: their rows were
/// fitted with it) costs [`EXACT_STEP_OPS`]
/// dependent GPU operations at [`Machine::op_us`] each, and where ranks share one GPU their
/// turns on its copy engines ([`gp2p_collectives::cost::DEVICE_TURN_US`]). With the handoff
/// measured there, that brings every pipelined row measured on one H100 shared by two, four
/// or eight ranks within ±15 % (the tests `the_h100_rows_of_the_pipelined_paths_are_within_fifteen_percent`
/// and `the_h100_rows_among_two_four_and_eight_processes_are_within_fifteen_percent` hold
/// them), where the fill alone left them up to 20 % low and without the turns 1 MiB
/// among 8 priced 60 % low; the steps make small chunks cost what they do. Two ranks'
/// flagged-chunk kernel is priced at a share of the link's DMA rate
/// ([`CHUNK_KERNEL_DMA_SHARE`]); the many-rank one, one kernel of the rounds' bytes, at a
/// share that falls with the ranks sharing a GPU ([`MANY_CHUNKS_SLOWDOWN_PER_RANK`]),
/// after one handoff and two operations, not the rounds' handoffs and steps.
pub fn all_reduce_prediction(machine: &Machine, paths: &AllReducePaths, bytes: usize) -> Prediction {
    let filled = |t: Traffic, fill: usize| machine.filled(t, fill as f64);
    // The rounds' first chunk (a share, or a chunk of it), where their waits do not hide it.
    let rounds_fill = match rounds_hide_their_fill(paths.world) {
        true => 0,
        false => bytes.div_ceil(paths.world.max(1)).min(paths.rounds_chunk()),
    };
    // The pipelined paths' chunk steps (see `Machine::op_us`), each of EXACT_STEP_OPS.
    let stepped = |p: Prediction, steps: usize| Prediction {
        seconds: p.seconds + machine.steps_seconds(steps, EXACT_STEP_OPS),
        ..p
    };
    match paths.world {
        0 | 1 => price(machine, Algorithm::OneShot, traffic(Algorithm::OneShot, 1, bytes)),
        2 if bytes <= paths.small_max => {
            // One kernel, no pipeline: the lines move twice the bytes, the flagged chunks the
            // bytes below the DMA rate (CHUNK_KERNEL_DMA_SHARE) after a chunk step.
            if bytes <= paths.many.lines_max {
                return price(
                    machine,
                    Algorithm::OneShot,
                    traffic(Algorithm::OneShot, 2, bytes * LINE_BYTES_PER_DATA_BYTE),
                );
            }
            // The chunks' slower rate is the kernel's, not more bytes.
            stepped(price(&chunk_kernel_rates(machine), Algorithm::OneShot, traffic(Algorithm::OneShot, 2, bytes)), 1)
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
            match paths.many.path(bytes) {
                ManyPath::Lines => lines,
                // The rounds' bytes in one kernel at its share of the DMA rate: one handoff,
                // not one a round, and two dependent operations (its launch, the last flag).
                ManyPath::Chunks => {
                    let one_kernel = Traffic { phases: 1, ..rounds.traffic };
                    let p = price(&many_chunk_kernel_rates(machine), Algorithm::TwoShot, one_kernel);
                    Prediction { seconds: p.seconds + machine.ops_seconds(2), ..p }
                }
                ManyPath::Rounds => {
                    let rounds = price(machine, Algorithm::TwoShot, filled(rounds.traffic, rounds_fill));
                    stepped(rounds, rounds_steps(ranks, bytes, paths.rounds_chunk()))
                }
            }
        }
    }
}

/// Whether the rounds among `world` ranks hide their fill: where each wait across a rank's
/// two lanes names the one chunk it needs ([`LaneWaits::for_ranks`]: two ranks), back-to-back
/// calls hide the first chunk's trip behind the other rank's, and the model prices no fill
/// (the exact rounds here, the compressed ones in `crate::compression`). On one H100 shared
/// by two processes the exact rounds of 1-16 MiB ran within 7 % of the price without the
/// fill and up to 22 % under it with; the compressed ones 13-17 % under it with.
pub(crate) fn rounds_hide_their_fill(world: usize) -> bool {
    LaneWaits::for_ranks(world) == LaneWaits::EachChunk
}

/// The share of the link's DMA rate at which two ranks' flagged-chunk kernel (the one kernel
/// above the lines) moves its bytes across the bus: its loads and stores reach about 70 % of
/// it. It is priced as the bytes at the link's rates times this, after one chunk step (its
/// launch, the wait for the peer's first chunk, the last chunk's flag); host memory sees each
/// byte once. On one H100 shared by two processes (duplex 48.9 GB/s) it took 98, 125, 149,
/// 234 and 265 µs at 1, 1.5, 2, 3 and 4 MiB (`benches/results/h10080gbhbm3/
/// comm-one-kernel-2.txt`), priced 94, 125, 155, 217 and 278.
pub const CHUNK_KERNEL_DMA_SHARE: f64 = 0.7;

/// What each rank sharing one GPU past two adds to the inverse of the many-rank flagged-chunk
/// kernel's share of the link's DMA rate (two ranks' share is [`CHUNK_KERNEL_DMA_SHARE`]):
/// with N processes on one H100 it moved the rounds' bytes at 0.47-0.53 of the rate among 4
/// and 0.29-0.32 among 8 (1 / (1/0.7 + 0.3 (N - 2)): 0.49 and 0.31), its time nearly linear
/// in the bytes from 128 KiB to 4 MiB after about 20 µs, at duplex 42-50 GB/s
/// (`benches/results/h10080gbhbm3/many-chunks-warps.txt`'s `team` rows and
/// `comm-door-ref-all-reduce-4-2.txt` and `-8.txt` as of 7c68ab9). The ranks split one GPU's
/// blocks, and each chunk's owner waits on every peer's flag. On cards of their own (a rank a GPU) it is unmeasured
/// and priced at two ranks' share.
pub const MANY_CHUNKS_SLOWDOWN_PER_RANK: f64 = 0.3;

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
mod tests;
