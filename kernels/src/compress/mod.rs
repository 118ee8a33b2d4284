//! The compressed all-reduce, as a CPU reference: block formats (int8, fp8 e4m3), their
//! quantize and dequantize, the N-rank all-reduce with two roundings, and the per-element
//! error bound it keeps. The GPU path is to compute the same bits; this module is its oracle.
//! It does not run on a GPU, pick formats or sizes, or move bytes.
//!
//! # The scheme
//!
//! A buffer of f32, f16 or bf16 values (converted to f32 exactly) is cut into blocks of 32
//! to 256 values ([`BlockSize`]), each with one f32 scale: the block's largest magnitude m
//! over 127 for [`Format::Int8`], over 448 for [`Format::Fp8E4m3`]; each value is divided by
//! the scale and rounded to the nearest code, ties to even. The blocks are dealt to the
//! ranks as shards ([`shard_blocks`]). Going up, each rank quantizes its blocks of the other
//! ranks' shards once; each owner folds its shard's N contributions in f32, rank by rank
//! (its own exact), multiplies by the f32 reciprocal of N for avg, and quantizes the folded
//! block once for the gather; every rank, the owner included, dequantizes those codes. Two
//! quantizations whatever N is, and every rank ends with the same bits ([`all_reduce`]).
//! The one-shot ([`all_reduce_one_shot`], which the communicator runs between two ranks)
//! quantizes every rank's every block once, its own included, and every rank folds all of them
//! in rank order: one quantization of each input, none after the fold, the same bits on every
//! rank; its bound takes every rank's block maximum and no folded block.
//!
//! A block holding a NaN or an infinity travels exact, a flag per block ([`Encoded::Exact`]):
//! NaN and ±inf reach the result as the exact path's f32 fold makes them (a NaN stays NaN,
//! +inf plus -inf is NaN), and the block's finite values keep their bits. So does a block
//! whose largest magnitude is above zero and below [`MIN_SCALED_BLOCK_MAX`] (2^-100): f32
//! subnormals come back exact. A block of zeros is scaled by 0 and comes back as zeros.
//!
//! # The bound, per element
//!
//! [`error_bound`] computes it; with u = 2^-24, m_r the largest magnitude of rank r's block
//! holding the element, for the ranks whose block was sent scaled (never the owner's own),
//! M the folded block's largest magnitude (0 when it travels exact: drop its term), x_r the
//! inputs and S their exact sum:
//!
//! - int8, sum: `|error| ≤ (Σ m_r + M)/254 + 3u(Σ m_r + M) + γ(N-1) Σ(|x_r| + e_r)`, where
//!   e_r is rank r's term of the first sum and γ(n) = nu/(1 - nu);
//! - fp8 e4m3, sum: the same with each term `m/254` replaced by `|x|/16 + m/(448·1024)`
//!   (plus `3u(|x| + m/448)`), x being the value quantized: x_r going up and, for the
//!   gather, the folded value, at most |S| plus the error before it;
//! - avg: the fold's error divided by N, plus the reciprocal's two roundings
//!   `(2u + u²)|S/N|`, then the gather's term with M the averaged block's maximum;
//! - f16 and bf16 results add the one rounding to the output type, as the exact path does.
//!
//! Proof sketch. One quantization of x, in a block of largest magnitude m ≥ 2^-100: the scale
//! s = fl(m/127) is a normal f32, t = fl(x/s) has |t| ≤ 127(1 + 2u) < 127.5, so the code
//! q = rint(t) needs no clamp and |q − t| ≤ 1/2; hence |qs − x| ≤ s/2 + u|x|, and
//! fl(q·s) adds u|qs|: at most m/254 + 3u·m in all. For e4m3 the code c is t rounded to
//! three mantissa bits: in the binade [2^e, 2^(e+1)) the step is 2^(e−3), so |c − t| ≤
//! |t|/16, and below e4m3's normal range (2^-6) the step is 2^-9, so |c − t| ≤ 2^-10; times
//! s ≤ m/448 that is |x|/16 + m/(448·1024), and the same three f32 roundings. (t may pass
//! 448 by f32 roundings only; saturating to 448 trims that.) Going up, rank r's value
//! arrives as x_r + e_r; the owner's f32 fold of N values in order adds at most γ(N−1)
//! times the sum of their magnitudes (recursive summation). The gather adds one more
//! quantization error of the folded value in its block. The triangle inequality sums the
//! terms. Every rank computes fl(code · scale) from the same scale and codes, so the bits
//! agree; the owner discards its exact fold for them.
//!
//! What the GPU kernels must keep for the same bits: IEEE f32 division and products rounded
//! to nearest even, no flush of subnormals to zero, no fused multiply-add in the fold, the
//! fold in rank order. Overflow is outside the bound: a fold past f32's range gives ±inf,
//! as the exact path's does.
//!
//! docs/compression.md says the same at more length.
//!
//! ```
//! use gp2p_kernels::ReduceOp;
//! use gp2p_kernels::compress::{all_reduce, error_bound, BlockSize, Format, Scheme, Term};
//!
//! let scheme = Scheme { format: Format::Int8, block: BlockSize::new(32)? };
//! let (a, b) = ([1.0f32, -0.5, 0.25], [0.75f32, 2.0, -1.0]);
//! let out = all_reduce(&[&a, &b], ReduceOp::Sum, scheme)?;
//! assert_eq!(out[0], out[1], "every rank holds the same bits");
//! // One block, owned by rank 0: only rank 1's block (max 2) and the folded one are
//! // quantized. The folded block's max is 1.75 give or take rank 1's rounding (2/254);
//! // an upper bound of it serves.
//! let terms = [Term { value: 1.0, block_max: None }, Term { value: 0.75, block_max: Some(2.0) }];
//! let bound = error_bound::<f32>(Format::Int8, ReduceOp::Sum, &terms, Some(1.76))?;
//! assert!((f64::from(out[0][0]) - 1.75).abs() <= bound);
//! assert!(bound < (2.0 + 1.76) / 254.0 * 1.0001);
//! # Ok::<(), gp2p_kernels::compress::CompressError>(())
//! ```

mod all_reduce;
mod block;
mod bound;
mod format;
mod wire;

pub use crate::fp8::{E4M3_MAX, e4m3_from_f32, e4m3_to_f32};
pub use all_reduce::{Scheme, Shots, all_reduce, all_reduce_by, all_reduce_one_shot, shard_blocks};
pub use block::Encoded;
pub use bound::{Term, error_bound, quantization_error};
pub use format::{BlockSize, CompressError, Compressible, Format, MIN_SCALED_BLOCK_MAX};
pub use wire::{EXACT_WORD, WireLayout, decode_wire, encode_wire};

#[cfg(test)]
mod tests;
