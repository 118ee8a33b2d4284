//! The compressed all-reduce among N ranks, run on the CPU: what the GPU path must compute,
//! step by step, and the oracle its tests compare against.

use std::ops::Range;

use super::block::Encoded;
use super::format::{BlockSize, CompressError, Compressible, Format};
use crate::ReduceOp;

/// The settings of one compressed all-reduce.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Scheme {
    /// How scaled blocks travel.
    pub format: Format,
    /// Values per block, one scale each.
    pub block: BlockSize,
}

/// The blocks of shard `shard` when `blocks` blocks are dealt to `ranks` ranks: consecutive
/// runs in rank order, the first `blocks % ranks` shards one block longer than the rest (a
/// shard may be empty). Rank `shard` owns it: it folds it and quantizes it for the gather.
/// `ranks` of 0 counts as 1.
pub fn shard_blocks(blocks: usize, ranks: usize, shard: usize) -> Range<usize> {
    let ranks = ranks.max(1);
    let (base, extra) = (blocks / ranks, blocks % ranks);
    let start = shard * base + shard.min(extra);
    start..start + base + usize::from(shard < extra)
}

/// How the blocks travel: through their owners ([`all_reduce`]) or straight to every rank
/// ([`all_reduce_one_shot`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Shots {
    /// Each block quantized once by every rank and folded by every rank: one rounding of each
    /// input. Each rank sends its whole buffer's wire and receives N − 1 of them, so it moves
    /// the two-shot's bytes between two ranks only.
    One,
    /// Each block quantized once on its way to its owner, folded there and quantized once more
    /// for the gather: two roundings whatever N is.
    Two,
}

/// The compressed all-reduce of `inputs` with the blocks travelling as `shots` says:
/// [`all_reduce_one_shot`] or [`all_reduce`].
pub fn all_reduce_by<T: Compressible>(
    inputs: &[&[T]],
    op: ReduceOp,
    scheme: Scheme,
    shots: Shots,
) -> Result<Vec<Vec<T>>, CompressError> {
    match shots {
        Shots::One => all_reduce_one_shot(inputs, op, scheme),
        Shots::Two => all_reduce(inputs, op, scheme),
    }
}

/// The compressed all-reduce of `inputs` (one buffer per rank, all of one length) under
/// `op`: every rank's result, in rank order.
///
/// The buffer is cut into blocks of `scheme.block` values (the last may be shorter), dealt
/// to the ranks as shards ([`shard_blocks`]). Each rank quantizes every block of the other
/// ranks' shards once and sends it up; the owner of a shard folds, block by block, the N
/// contributions in rank order in f32, its own exact and the others dequantized, and for
/// avg multiplies by the f32 reciprocal of N; it quantizes the folded block once and every
/// rank, the owner included, dequantizes those codes, so every rank holds the same bits.
/// Blocks with a NaN or an infinity, and tiny blocks, travel exact on either leg (see
/// [`Format::quantize`]); the result is rounded once to `T`.
///
/// The error of each element is within [`error_bound`](super::error_bound). Errors: an op
/// other than sum or avg, no ranks, or lengths that differ.
pub fn all_reduce<T: Compressible>(
    inputs: &[&[T]],
    op: ReduceOp,
    scheme: Scheme,
) -> Result<Vec<Vec<T>>, CompressError> {
    all_reduce_with(inputs, op, scheme.block, &|block| scheme.format.quantize(block))
}

/// The one-shot compressed all-reduce of `inputs` under `op`: every rank's result, in rank
/// order.
///
/// Every rank quantizes every block of its buffer once, its own included, and every rank
/// folds, block by block, the N dequantized contributions in rank order in f32, multiplies
/// by the f32 reciprocal of N for avg and rounds the result once to `T`: one quantization
/// of each input, and the same bits on every rank, since each folds the same codes in the
/// same order. Blocks with a NaN or an infinity, and tiny blocks, travel exact (see
/// [`Format::quantize`]). Its error is within [`error_bound`](super::error_bound) with every
/// rank's block maximum as a term and no folded block (nothing is quantized after the fold).
///
/// Errors: an op other than sum or avg, no ranks, or lengths that differ.
pub fn all_reduce_one_shot<T: Compressible>(
    inputs: &[&[T]],
    op: ReduceOp,
    scheme: Scheme,
) -> Result<Vec<Vec<T>>, CompressError> {
    one_shot_with(inputs, op, scheme.block, &|block| scheme.format.quantize(block))
}

/// [`all_reduce_one_shot`] with `quantize` as the codec; a test passes a broken one.
pub(super) fn one_shot_with<T: Compressible>(
    inputs: &[&[T]],
    op: ReduceOp,
    block: BlockSize,
    quantize: &dyn Fn(&[f32]) -> Encoded,
) -> Result<Vec<Vec<T>>, CompressError> {
    let len = check_inputs(inputs, op)?;
    let ranks = inputs.len();
    let size = block.get();
    let mut folded: Vec<f32> = Vec::with_capacity(len);
    for start in (0..len).step_by(size) {
        let range = start..(start + size).min(len);
        let parts = inputs.iter().map(|input| {
            let values: Vec<f32> = input[range.clone()].iter().map(|x| x.to_f32()).collect();
            quantize(&values).dequantize()
        });
        folded.extend(fold_in_rank_order(parts, op, ranks));
    }
    let result: Vec<T> = folded.into_iter().map(T::from_f32).collect();
    Ok(vec![result; ranks])
}

/// One block's contributions, one per rank in rank order, folded in f32 one after the other
/// and, for avg, multiplied by the f32 reciprocal of `ranks`. The fold starts from the first
/// value, not from 0, which keeps -0 + -0 = -0.
fn fold_in_rank_order(parts: impl Iterator<Item = Vec<f32>>, op: ReduceOp, ranks: usize) -> Vec<f32> {
    let mut parts = parts;
    let mut acc = parts.next().unwrap_or_default();
    for part in parts {
        acc.iter_mut().zip(part).for_each(|(a, v)| *a += v);
    }
    if op == ReduceOp::Avg {
        let reciprocal = 1.0 / ranks as f32;
        acc.iter_mut().for_each(|a| *a *= reciprocal);
    }
    acc
}

/// The length every rank's input has, once `op` and the inputs are checked.
fn check_inputs<T>(inputs: &[&[T]], op: ReduceOp) -> Result<usize, CompressError> {
    if !matches!(op, ReduceOp::Sum | ReduceOp::Avg) {
        return Err(CompressError::Op { op });
    }
    let len = inputs.first().ok_or(CompressError::NoRanks)?.len();
    if let Some((rank, other)) = inputs.iter().enumerate().find(|(_, v)| v.len() != len) {
        return Err(CompressError::Length { rank, len: other.len(), expected: len });
    }
    Ok(len)
}

/// [`all_reduce`] with `quantize` turning a block into what travels, on both legs; a test
/// passes a broken one to see the bound fail.
pub(super) fn all_reduce_with<T: Compressible>(
    inputs: &[&[T]],
    op: ReduceOp,
    block: BlockSize,
    quantize: &dyn Fn(&[f32]) -> Encoded,
) -> Result<Vec<Vec<T>>, CompressError> {
    let len = check_inputs(inputs, op)?;
    let ranks = inputs.len();
    let size = block.get();
    let blocks = len.div_ceil(size);
    let range = |i: usize| i * size..((i + 1) * size).min(len);
    let values: Vec<Vec<f32>> = inputs.iter().map(|v| v.iter().map(|&x| x.to_f32()).collect()).collect();

    // Up: up[r][k] holds what rank r sends to the owner of shard k, one block at a time; a
    // rank's own shard never leaves it, so it is not quantized.
    let up: Vec<Vec<Vec<Encoded>>> = (0..ranks)
        .map(|r| {
            (0..ranks)
                .map(|k| {
                    if k == r {
                        Vec::new()
                    } else {
                        shard_blocks(blocks, ranks, k).map(|i| quantize(&values[r][range(i)])).collect()
                    }
                })
                .collect()
        })
        .collect();

    // Fold at each owner, then the one quantization for the gather.
    let gather: Vec<Vec<Encoded>> = (0..ranks)
        .map(|k| {
            shard_blocks(blocks, ranks, k)
                .enumerate()
                .map(|(j, i)| {
                    let parts = up
                        .iter()
                        .enumerate()
                        .map(|(r, sent)| if r == k { values[k][range(i)].to_vec() } else { sent[k][j].dequantize() });
                    quantize(&fold_in_rank_order(parts, op, ranks))
                })
                .collect()
        })
        .collect();

    // Gather: every rank decodes every shard's codes, its own shard's too.
    Ok((0..ranks)
        .map(|_rank| gather.iter().flatten().flat_map(Encoded::dequantize).map(T::from_f32).collect())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_cover_every_block_once_in_order() {
        for ranks in 1..=8 {
            for blocks in 0..40 {
                let shards: Vec<Range<usize>> = (0..ranks).map(|k| shard_blocks(blocks, ranks, k)).collect();
                assert_eq!(shards[0].start, 0);
                assert_eq!(shards[ranks - 1].end, blocks, "{ranks} ranks, {blocks} blocks");
                assert!(shards.windows(2).all(|w| w[0].end == w[1].start));
                let sizes: Vec<usize> = shards.iter().map(|s| s.len()).collect();
                assert!(sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= 1, "{sizes:?}");
            }
        }
        assert_eq!(shard_blocks(5, 0, 0), 0..5);
    }

    #[test]
    fn bad_calls_are_refused_with_their_numbers() {
        let scheme = Scheme { format: Format::Int8, block: BlockSize::new(32).unwrap() };
        let (a, b) = ([1.0f32; 10], [1.0f32; 9]);
        let e = all_reduce(&[&a, &b], ReduceOp::Sum, scheme).unwrap_err();
        assert_eq!(e, CompressError::Length { rank: 1, len: 9, expected: 10 });
        assert!(e.to_string().contains("rank 1 has 9 elements, expected 10"), "{e}");
        assert_eq!(all_reduce::<f32>(&[], ReduceOp::Sum, scheme), Err(CompressError::NoRanks));
        let e = all_reduce(&[&a, &a], ReduceOp::Prod, scheme).unwrap_err();
        assert_eq!(e.to_string(), "compressed all-reduce takes sum or avg, not prod");
    }

    #[test]
    fn one_block_of_two_ranks_step_by_step() {
        // Rank 0 owns the block: its own values stay exact, rank 1's travel as int8 with scale
        // 4/127, the sum travels back with the scale of its own largest magnitude.
        let scheme = Scheme { format: Format::Int8, block: BlockSize::new(32).unwrap() };
        let (a, b) = ([1.0f32, 0.25, -2.0], [4.0f32, 0.1, 0.0]);
        let out = all_reduce(&[&a, &b], ReduceOp::Sum, scheme).unwrap();
        let up = Format::Int8.quantize(&b).dequantize();
        let folded: Vec<f32> = a.iter().zip(&up).map(|(x, y)| x + y).collect();
        let want = Format::Int8.quantize(&folded).dequantize();
        assert_eq!(out, [want.clone(), want.clone()]);
        assert_ne!(want, folded, "two roundings: the owner's exact fold is not the result");
        let avg = all_reduce(&[&a, &b], ReduceOp::Avg, scheme).unwrap();
        let halved: Vec<f32> = folded.iter().map(|x| x * 0.5).collect();
        assert_eq!(avg[1], Format::Int8.quantize(&halved).dequantize());
        assert_eq!(all_reduce::<f32>(&[&[], &[]], ReduceOp::Sum, scheme).unwrap(), [Vec::<f32>::new(), vec![]]);
    }

    #[test]
    fn one_shot_quantizes_every_input_once_and_rounds_nothing_after_the_fold() {
        let scheme = Scheme { format: Format::Int8, block: BlockSize::new(32).unwrap() };
        let (a, b) = ([1.0f32, 0.25, -2.0], [4.0f32, 0.1, 0.0]);
        let out = all_reduce_one_shot(&[&a, &b], ReduceOp::Sum, scheme).unwrap();
        let (qa, qb) = (Format::Int8.quantize(&a).dequantize(), Format::Int8.quantize(&b).dequantize());
        let want: Vec<f32> = qa.iter().zip(&qb).map(|(x, y)| x + y).collect();
        assert_eq!(out, [want.clone(), want.clone()]);
        assert_ne!(qa, a, "rank 0's own values are quantized too");
        assert_ne!(out, all_reduce(&[&a, &b], ReduceOp::Sum, scheme).unwrap(), "not the two-shot's bits");
        let avg = all_reduce_by(&[&a, &b], ReduceOp::Avg, scheme, Shots::One).unwrap();
        assert_eq!(avg[0], want.iter().map(|x| x * 0.5).collect::<Vec<f32>>());
        let e = all_reduce_one_shot(&[&a, &b[..2]], ReduceOp::Sum, scheme).unwrap_err();
        assert_eq!(e, CompressError::Length { rank: 1, len: 2, expected: 3 });
        assert_eq!(all_reduce_one_shot::<f32>(&[], ReduceOp::Sum, scheme), Err(CompressError::NoRanks));
        assert!(all_reduce_one_shot(&[&a, &b], ReduceOp::Max, scheme).is_err());
    }
}
