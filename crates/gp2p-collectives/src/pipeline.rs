//! Which pipeline an in-process collective runs: the ring's transfers ([`Schedule`]) or the
//! legs ([`Rounds`], the one-process-per-GPU communicator's), chosen by the cost model.
//!
//! Two ranks keep the ring and its one-step exchange (what was measured on two H200s) unless
//! an algorithm is forced. From three up the model prices both as they run, from their own
//! traffic ([`Rounds::traffic`] of the legs, and of the ring's schedule as legs,
//! [`Schedule::to_rounds`]) at H200 rates: the legs copy each chunk out once for every reader
//! (an all-gather's part, a broadcast, a folded share), in fewer rounds, so they win every
//! collective but the reduce-scatter, where the two move the same bytes in as many rounds and
//! the tie goes to the legs, the communicator's pipeline. (Measured only with logical ranks
//! on one GPU, where every rank's traffic shares one link and host memory is never the
//! limit: the legs' all-gather 1.03-1.12× and broadcast 1.13-1.57× faster than the ring's,
//! their all-reduce 2-7 % slower, 1-16 MiB at four ranks,
//! `benches/results/h200/engine-ring-vs-legs.txt`; the choice for N cards is the model's.) `GP2P_ALGORITHM=ring|two-shot` (or
//! [`crate::Engine::with_algorithm`]) forces one, for two ranks too (whose small all-reduces
//! across devices then skip the one-kernel exchanges); one-shot is the communicator's only.
//!
//! ```
//! use gp2p_collectives::Collective;
//! use gp2p_collectives::cost::Algorithm;
//! use gp2p_collectives::pipeline::{Pipeline, choose};
//!
//! // Four ranks of 1 MiB of f32: the two-shot legs.
//! let chosen = choose::<f32>(Collective::AllReduce, 4, 1 << 18, None, None);
//! assert!(matches!(chosen, Pipeline::Legs(_)));
//! // Two ranks keep the ring (here its one-step exchange) unless forced.
//! assert!(matches!(choose::<f32>(Collective::AllReduce, 2, 1 << 18, None, None), Pipeline::Ring(_)));
//! let forced = choose::<f32>(Collective::AllReduce, 2, 1 << 18, None, Some(Algorithm::TwoShot));
//! assert!(matches!(forced, Pipeline::Legs(_)));
//! ```

use gp2p_kernels::Element;

use crate::Collective;
use crate::cost::{Algorithm, Machine, price};
use crate::legs::Rounds;
use crate::schedule::{Schedule, schedule_for};

/// What an in-process collective runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pipeline {
    /// The ring's transfers (or, for two ranks and small buffers, the one-step exchange).
    Ring(Schedule),
    /// The legs, copied out once per chunk for every reader.
    Legs(Rounds),
}

/// The legs of `collective` over `ranks` buffers of `bytes` each, in place (the all-gather's
/// and the reduce-scatter's parts are the buffer's `ranks` equal parts).
pub fn legs_for(collective: Collective, ranks: usize, bytes: usize) -> Rounds {
    let part = bytes / ranks.max(1);
    match collective {
        Collective::AllReduce => Rounds::all_reduce(ranks, bytes),
        Collective::AllGather => Rounds::all_gather(ranks, part, true),
        Collective::ReduceScatter => Rounds::reduce_scatter(ranks, part, true),
        Collective::Broadcast { root } => Rounds::broadcast(ranks, bytes, root),
    }
}

/// The pipeline `collective` over `ranks` buffers of `len` elements runs, the ring's chunks
/// of `chunk_bytes` (None: the transport's): `forced`'s ([`Algorithm::Ring`] the ring,
/// anything else the legs), else for two ranks or fewer the ring, else the cheaper by the
/// cost model at H200 rates (a tie goes to the legs).
pub fn choose<T: Element>(
    collective: Collective,
    ranks: usize,
    len: usize,
    chunk_bytes: Option<usize>,
    forced: Option<Algorithm>,
) -> Pipeline {
    let ring = || Pipeline::Ring(schedule_for::<T>(collective, ranks, len, chunk_bytes));
    let legs = || Pipeline::Legs(legs_for(collective, ranks, len * size_of::<T>()));
    match forced {
        Some(Algorithm::Ring) => return ring(),
        Some(_) => return legs(),
        None if ranks <= 2 => return ring(),
        None => {}
    }
    // The ring priced at the transport's chunking whatever `chunk_bytes` is, so that every
    // caller (the engine, the reference) makes the same choice.
    let machine = Machine::h200(ranks);
    let ring_traffic = schedule_for::<T>(collective, ranks, len, None).to_rounds(size_of::<T>()).traffic();
    let ring_seconds = price(&machine, Algorithm::Ring, ring_traffic).seconds;
    let rounds = legs_for(collective, ranks, len * size_of::<T>());
    let legs_seconds = price(&machine, Algorithm::TwoShot, rounds.traffic()).seconds;
    if ring_seconds < legs_seconds { ring() } else { Pipeline::Legs(rounds) }
}

/// The algorithm the environment variable [`crate::cost::ALGORITHM_VAR`] forces on
/// in-process collectives, read now: ring or two-shot; one-shot, the one-process-per-GPU
/// communicator's, forces nothing here (the cost model chooses). An error where it names no
/// algorithm.
pub fn forced_by_env() -> crate::Result<Option<Algorithm>> {
    Ok(crate::cost::forced_by_env()?.filter(|a| *a != Algorithm::OneShot))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_three_ranks_the_legs_run_every_collective_of_every_size() {
        for ranks in 3..=8 {
            for len in [1, 100, 1 << 14, 1 << 20, 1 << 26] {
                for collective in [
                    Collective::AllReduce,
                    Collective::AllGather,
                    Collective::ReduceScatter,
                    Collective::Broadcast { root: ranks - 1 },
                ] {
                    let len = len * ranks;
                    let chosen = choose::<f32>(collective, ranks, len, None, None);
                    assert!(matches!(chosen, Pipeline::Legs(_)), "{collective:?}, {ranks} ranks, {len} elements");
                }
            }
        }
    }

    #[test]
    fn the_ring_runs_where_forced_or_between_two() {
        let ring = choose::<u8>(Collective::AllGather, 4, 400, None, Some(Algorithm::Ring));
        assert_eq!(ring, Pipeline::Ring(schedule_for::<u8>(Collective::AllGather, 4, 400, None)));
        assert!(matches!(choose::<u8>(Collective::Broadcast { root: 1 }, 2, 400, None, None), Pipeline::Ring(_)));
        let legs = choose::<i64>(Collective::ReduceScatter, 2, 400, None, Some(Algorithm::TwoShot));
        assert_eq!(legs, Pipeline::Legs(Rounds::reduce_scatter(2, 200 * 8, true)));
    }

    #[test]
    fn the_all_gathers_ring_sends_three_parts_where_its_legs_send_one() {
        // Four ranks: each rank's leg sends its part once and lands three, in one round; the
        // ring sends and lands three parts a rank, in three steps.
        let (ranks, len) = (4, 4 << 20);
        let Pipeline::Ring(schedule) = choose::<f32>(Collective::AllGather, ranks, len, None, Some(Algorithm::Ring))
        else {
            panic!("forced")
        };
        let ring = schedule.to_rounds(4).traffic();
        let legs = legs_for(Collective::AllGather, ranks, len * 4).traffic();
        assert_eq!((ring.up_bytes, legs.up_bytes), (3.0 * (4 << 20) as f64, (4 << 20) as f64));
        assert_eq!(ring.down_bytes, legs.down_bytes);
        assert!(ring.phases > legs.phases && ring.host_dram_bytes > legs.host_dram_bytes);
    }
}
