//! Test oracles: what each rank must hold after a collective, computed on the host.
//!
//! The GPU tests, the benches and `gp2p bench` check every result against [`expected`], which
//! replays the engine's own pipeline (the ring's [`schedule_for`] or the legs,
//! [`crate::pipeline::choose`]) with the kernels' CPU reference ([`Reference`]) at each step,
//! so floating-point results are folded in the GPU's order.
//!
//! ```
//! use gp2p_collectives::Collective;
//! use gp2p_collectives::reference::expected;
//! use gp2p_kernels::ReduceOp;
//!
//! let inputs = vec![vec![1u32, 2, 3], vec![10, 20, 30]];
//! assert_eq!(expected(Collective::AllReduce, &inputs, ReduceOp::Sum), vec![vec![11, 22, 33]; 2]);
//! ```

use gp2p_kernels::ReduceOp;
pub use gp2p_kernels::reference::Reference;

use crate::Collective;
use crate::cost::Algorithm;
use crate::pipeline::{Pipeline, choose};
use crate::schedule::segment;
pub use crate::schedule::{schedule_for, step_divisor};

/// What each rank's output must hold after `collective` over `inputs` (one per rank: the
/// whole buffer, or for all-gather each rank's part), computed on the host by replaying the
/// pipeline the engine runs ([`crate::pipeline::choose`], the algorithm the environment
/// forces included) with the CPU reference of each kernel step — so floating-point results
/// are folded in the GPU's order and compare within the per-step tolerance.
pub fn expected<T: Reference>(collective: Collective, inputs: &[Vec<T>], op: ReduceOp) -> Vec<Vec<T>> {
    expected_with(collective, inputs, op, crate::pipeline::forced_by_env().ok().flatten())
}

/// [`expected`] for an engine forced to `forced` ([`crate::Engine::with_algorithm`]).
pub fn expected_with<T: Reference>(
    collective: Collective,
    inputs: &[Vec<T>],
    op: ReduceOp,
    forced: Option<Algorithm>,
) -> Vec<Vec<T>> {
    let n = inputs.len();
    let len = inputs.first().map_or(0, Vec::len);
    let replay = |len: usize| {
        let mut bufs = inputs.to_vec();
        let step = |d: &T, s: &T, last: bool| T::reference(*d, *s, op, step_divisor(op, last, n));
        match choose::<T>(collective, n, len, None, forced) {
            Pipeline::Ring(schedule) => schedule.run_on_host(&mut bufs, step),
            Pipeline::Legs(rounds) => rounds.run_on_host(&mut bufs, &mut [], step),
        }
        bufs
    };
    match collective {
        Collective::AllReduce => replay(len),
        Collective::AllGather => vec![inputs.concat(); n],
        Collective::ReduceScatter => {
            replay(len).iter().enumerate().map(|(r, b)| b[segment(n, len, r)].to_vec()).collect()
        }
        Collective::Broadcast { root } => vec![inputs.get(root).cloned().unwrap_or_default(); n],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_ranks_exchange_and_ring_give_every_rank_the_sum() {
        // Rank 1 of the exchange folds rank 0 in; both end with the sum.
        let inputs = vec![vec![1u32, 2, 3], vec![10, 20, 30]];
        assert_eq!(expected(Collective::AllReduce, &inputs, ReduceOp::Sum), vec![vec![11, 22, 33]; 2]);
    }

    #[test]
    fn expected_results_of_each_collective() {
        let inputs: Vec<Vec<u32>> = vec![vec![1, 2, 3, 4, 5, 6], vec![10, 20, 30, 40, 50, 60], vec![7; 6]];
        let sums = expected(Collective::AllReduce, &inputs, ReduceOp::Sum);
        assert!(sums.iter().all(|b| b == &[18, 29, 40, 51, 62, 73]));
        let avg = expected(Collective::AllReduce, &inputs, ReduceOp::Avg);
        assert!(avg.iter().all(|b| b == &[6, 9, 13, 17, 20, 24]), "{avg:?}");
        let parts = expected(Collective::ReduceScatter, &inputs, ReduceOp::Max);
        assert_eq!(parts, [vec![10, 20], vec![30, 40], vec![50, 60]]);
        let gathered = expected(Collective::AllGather, &[vec![1u8], vec![2], vec![3]], ReduceOp::Sum);
        assert!(gathered.iter().all(|b| b == &[1, 2, 3]));
        let root = expected(Collective::Broadcast { root: 1 }, &inputs, ReduceOp::Sum);
        assert!(root.iter().all(|b| b == &inputs[1]));
    }
}
