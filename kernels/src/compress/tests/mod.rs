//! Tests of the compressed all-reduce against an f64 reference: every data set, format,
//! input type, rank count from 2 to 8 and op; then broken codecs, to show the checks fail.

mod data;
mod props;

use half::{bf16, f16};

use super::all_reduce::{all_reduce_with, one_shot_with};
use super::{
    BlockSize, Encoded, Format, MIN_SCALED_BLOCK_MAX, Scheme, Shots, Term, all_reduce, all_reduce_by, e4m3_to_f32,
    error_bound, shard_blocks,
};
use crate::ReduceOp;
use data::{DataSet, Sample, draw};

/// Slack for the f64 arithmetic of the exact sum and of the bound, relative to the sum of
/// the inputs' magnitudes: far below the bound's smallest f32 term.
const EVAL_SLACK: f64 = 1.0 / (1u64 << 45) as f64;

/// The largest magnitude of `block` if the module docs say it travels scaled: not when it
/// holds a NaN or an infinity, nor when its largest magnitude is above 0 and below 2^-100.
fn sent_max(block: &[f64]) -> Option<f64> {
    if block.iter().any(|v| !v.is_finite()) {
        return None;
    }
    let max = block.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    (max == 0.0 || max >= f64::from(MIN_SCALED_BLOCK_MAX)).then_some(max)
}

/// Checks every rank's result `outs` of the all-reduce of `inputs` (its blocks travelling as
/// `shots` says): the same bits on every rank, and each element within [`error_bound`] of the
/// exact result in f64 (NaN and ±inf where the exact result has them). Returns the largest
/// error over its bound seen.
fn check<T: Sample>(
    outs: &[Vec<T>],
    inputs: &[Vec<T>],
    op: ReduceOp,
    (format, shots): (Format, Shots),
    block: usize,
) -> Result<f64, String> {
    let (ranks, len) = (inputs.len(), inputs[0].len());
    if outs.len() != ranks {
        return Err(format!("{} results for {ranks} ranks", outs.len()));
    }
    for (r, out) in outs.iter().enumerate() {
        if out.len() != len {
            return Err(format!("rank {r} has {} elements, expected {len}", out.len()));
        }
        if let Some(i) = (0..len).find(|&i| out[i].to_f32().to_bits() != outs[0][i].to_f32().to_bits()) {
            return Err(format!("rank {r}'s bits differ from rank 0's at [{i}]: {:?} vs {:?}", out[i], outs[0][i]));
        }
    }
    let x: Vec<Vec<f64>> = inputs.iter().map(|v| v.iter().map(|t| f64::from(t.to_f32())).collect()).collect();
    let exact = |i: usize| {
        let sum: f64 = x.iter().map(|v| v[i]).sum();
        if op == ReduceOp::Avg { sum / ranks as f64 } else { sum }
    };
    let blocks = len.div_ceil(block);
    let mut worst = 0.0f64;
    for b in 0..blocks {
        let owner = (0..ranks).find(|&k| shard_blocks(blocks, ranks, k).contains(&b)).ok_or("a block no one owns")?;
        let range = b * block..((b + 1) * block).min(len);
        // Two-shot: the owner's own block is folded exact. One-shot: every block is quantized.
        let exact_own = |r: usize| r == owner && shots == Shots::Two;
        let maxima: Vec<Option<f64>> =
            (0..ranks).map(|r| if exact_own(r) { None } else { sent_max(&x[r][range.clone()]) }).collect();
        let terms = |i: usize| -> Vec<Term> {
            x.iter().zip(&maxima).map(|(v, &block_max)| Term { value: v[i], block_max }).collect()
        };
        // The bound without gather and cast (f32 casts nothing) bounds each folded value, and
        // so the folded block's largest magnitude; a block with NaN or inf travels exact.
        let mut folded_max = Some(0.0f64);
        for i in range.clone() {
            let before_gather = error_bound::<f32>(format, op, &terms(i), None).map_err(|e| e.to_string())?;
            let hi = exact(i).abs() + before_gather;
            folded_max = if hi.is_finite() { folded_max.map(|m| m.max(hi)) } else { None };
        }
        // One-shot quantizes nothing after the fold.
        let folded_max = folded_max.filter(|&m| m >= f64::from(MIN_SCALED_BLOCK_MAX) && shots == Shots::Two);
        for i in range {
            let (want, got) = (exact(i), f64::from(outs[0][i].to_f32()));
            if !want.is_finite() {
                if !(want.is_nan() && got.is_nan() || want == got) {
                    return Err(format!("[{i}] got {got}, the exact path gives {want}"));
                }
                continue;
            }
            let bound = error_bound::<T>(format, op, &terms(i), folded_max).map_err(|e| e.to_string())?;
            let magnitude: f64 = x.iter().map(|v| v[i].abs()).sum();
            let error = (got - want).abs();
            // A NaN error (a finite result where the exact one is not) fails too.
            let within = error <= bound + EVAL_SLACK * magnitude;
            if !within {
                return Err(format!("[{i}] got {got:e}, exact {want:e}: error {error:e} over the bound {bound:e}"));
            }
            if bound > 0.0 {
                worst = worst.max(error / bound);
            }
        }
    }
    Ok(worst)
}

/// Runs one case with `quantize` as the codec (on both legs of the two-shot) and checks it.
fn run_with<T: Sample>(
    set: DataSet,
    (format, shots): (Format, Shots),
    op: ReduceOp,
    ranks: usize,
    (block, len): (usize, usize),
    seed: u64,
    quantize: &dyn Fn(&[f32]) -> Encoded,
) -> Result<f64, String> {
    let inputs = draw::<T>(set, ranks, len, block, seed);
    let views: Vec<&[T]> = inputs.iter().map(Vec::as_slice).collect();
    let size = BlockSize::new(block).map_err(|e| e.to_string())?;
    let outs = match shots {
        Shots::One => one_shot_with(&views, op, size, quantize),
        Shots::Two => all_reduce_with(&views, op, size, quantize),
    };
    check(&outs.map_err(|e| e.to_string())?, &inputs, op, (format, shots), block)
}

/// Runs one case through [`all_reduce_by`] and checks it.
fn run<T: Sample>(
    set: DataSet,
    (format, shots): (Format, Shots),
    op: ReduceOp,
    ranks: usize,
    (block, len): (usize, usize),
    seed: u64,
) -> Result<f64, String> {
    let inputs = draw::<T>(set, ranks, len, block, seed);
    let views: Vec<&[T]> = inputs.iter().map(Vec::as_slice).collect();
    let scheme = Scheme { format, block: BlockSize::new(block).map_err(|e| e.to_string())? };
    let outs = all_reduce_by(&views, op, scheme, shots).map_err(|e| e.to_string())?;
    check(&outs, &inputs, op, (format, shots), block)
}

/// Every format, input type, rank count from 2 to 8 and op on `set` for both shots, each
/// case's length a few blocks per rank and not a multiple of the block (sizes cycle with the
/// rank count). Panics on the first case that fails; returns the largest error over bound
/// per format, for the two-shot then the one-shot.
fn sweep(set: DataSet) -> [[f64; 2]; 2] {
    let mut worst = [[0.0f64; 2]; 2];
    for (s, shots) in [Shots::Two, Shots::One].into_iter().enumerate() {
        for (f, format) in Format::ALL.into_iter().enumerate() {
            for ranks in 2..=8 {
                for op in [ReduceOp::Sum, ReduceOp::Avg] {
                    let block = BlockSize::MIN << (ranks % 4);
                    let shape = (block, (2 * ranks + 1) * block + 13);
                    let seed = (ranks as u64) << 8 | (f as u64) << 4 | op.index() as u64;
                    let how = (format, shots);
                    let results = [
                        ("f32", run::<f32>(set, how, op, ranks, shape, seed)),
                        ("f16", run::<f16>(set, how, op, ranks, shape, seed)),
                        ("bf16", run::<bf16>(set, how, op, ranks, shape, seed)),
                    ];
                    for (dtype, result) in results {
                        match result {
                            Ok(ratio) => worst[s][f] = worst[s][f].max(ratio),
                            Err(e) => {
                                panic!("{set:?} {format} {shots:?} {dtype} {op}, {ranks} ranks, blocks of {block}: {e}")
                            }
                        }
                    }
                }
            }
        }
    }
    worst
}

/// [`sweep`] of `set` keeps the bound (it panics where not), and is not vacuous: in both
/// formats and both shots some element comes within a factor of the bound.
fn keeps_the_bound_closely(set: DataSet) {
    for (shots, [int8, fp8]) in ["two-shot", "one-shot"].into_iter().zip(sweep(set)) {
        assert!(int8 > 0.3 && fp8 > 0.3, "{set:?} {shots}: int8 {int8}, fp8 {fp8}");
    }
}

#[test]
fn normal_blocks_keep_the_bound_on_every_rank() {
    keeps_the_bound_closely(DataSet::Normal);
}

#[test]
fn heavy_tailed_student_t_blocks_keep_the_bound() {
    keeps_the_bound_closely(DataSet::StudentT2);
}

#[test]
fn blocks_with_an_outlier_keep_the_bound() {
    keeps_the_bound_closely(DataSet::Outlier);
}

#[test]
fn zero_blocks_come_back_exact() {
    assert_eq!(sweep(DataSet::Zeros), [[0.0; 2]; 2]);
    let inputs = draw::<bf16>(DataSet::Zeros, 3, 100, 32, 7);
    let views: Vec<&[bf16]> = inputs.iter().map(Vec::as_slice).collect();
    for format in Format::ALL {
        let scheme = Scheme { format, block: BlockSize::new(32).unwrap() };
        let outs = all_reduce(&views, ReduceOp::Sum, scheme).unwrap();
        assert!(outs.iter().flatten().all(|v| v.to_f32() == 0.0), "{format}");
    }
}

#[test]
fn subnormal_blocks_keep_the_bound() {
    sweep(DataSet::Subnormal);
    // f32 subnormals travel exact: the only error left is the fold's, at most one rounding
    // of a subnormal sum, which is none.
    let inputs = draw::<f32>(DataSet::Subnormal, 4, 300, 64, 11);
    let views: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
    let scheme = Scheme { format: Format::Int8, block: BlockSize::new(64).unwrap() };
    let outs = all_reduce(&views, ReduceOp::Sum, scheme).unwrap();
    let exact: Vec<f32> = (0..300).map(|i| inputs.iter().map(|v| v[i]).sum()).collect();
    assert_eq!(outs[2], exact);
    assert!(exact.iter().any(|&v| v != 0.0 && v.abs() < f32::MIN_POSITIVE), "the data are subnormal");
}

#[test]
fn nan_and_inf_blocks_travel_exact_and_propagate() {
    sweep(DataSet::NanInf);
    let inputs = draw::<f32>(DataSet::NanInf, 4, 2000, 32, 5);
    let views: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
    let scheme = Scheme { format: Format::Fp8E4m3, block: BlockSize::new(32).unwrap() };
    let out = &all_reduce(&views, ReduceOp::Sum, scheme).unwrap()[0];
    // Not vacuous: NaN from NaN and from +inf meeting -inf, infinities of both signs, and
    // finite values in blocks that travelled exact.
    let meets = (0..2000).filter(|&i| inputs.iter().all(|v| !v[i].is_nan()) && out[i].is_nan()).count();
    let count = |f: fn(f32) -> bool| out.iter().filter(|&&v| f(v)).count();
    assert!(meets > 0, "+inf meets -inf somewhere");
    assert!(count(|v| v == f32::INFINITY) > 0 && count(|v| v == f32::NEG_INFINITY) > 0);
    assert!(count(f32::is_finite) > 1000);
}

/// A codec that quantizes like `format` but multiplies each block's scale by `factor`.
fn scaled_by(format: Format, factor: f32) -> impl Fn(&[f32]) -> Encoded {
    move |block| match format.quantize(block) {
        Encoded::Scaled { scale, .. } => format.quantize_with_scale(block, scale * factor),
        exact => exact,
    }
}

#[test]
fn a_wrong_scale_breaks_the_bound() {
    let shape = (64, 64 * 9 + 5);
    // A coarser int8 step (by a third: the bound's slack hides a few per cent), a scale that
    // clips the block maximum (int8 and fp8): each exceeds the bound somewhere, while the right
    // codec on the same data keeps it.
    for shots in [Shots::Two, Shots::One] {
        for (format, factor) in [(Format::Int8, 1.3), (Format::Int8, 0.95), (Format::Fp8E4m3, 0.9)] {
            let how = (format, shots);
            let broken = run_with::<f32>(DataSet::Normal, how, ReduceOp::Sum, 2, shape, 3, &scaled_by(format, factor));
            let message = format!("{format} {shots:?} x{factor}: {broken:?}");
            assert!(broken.is_err_and(|e| e.contains("over the bound")), "{message}");
            assert!(run::<f32>(DataSet::Normal, how, ReduceOp::Sum, 2, shape, 3).is_ok());
        }
    }
}

#[test]
fn truncated_codes_break_the_bound() {
    // Rounding toward zero instead of to nearest doubles int8's worst error.
    let truncate = |block: &[f32]| match Format::Int8.quantize(block) {
        Encoded::Scaled { format, scale, .. } => {
            let codes = block.iter().map(|&x| if scale == 0.0 { 0 } else { (x / scale).trunc() as i8 as u8 }).collect();
            Encoded::Scaled { format, scale, codes }
        }
        exact => exact,
    };
    for shots in [Shots::Two, Shots::One] {
        let broken =
            run_with::<bf16>(DataSet::Normal, (Format::Int8, shots), ReduceOp::Avg, 3, (32, 500), 9, &truncate);
        assert!(broken.is_err_and(|e| e.contains("over the bound")), "{shots:?}");
    }
    // And fp8 codes one step off where they should round down: e4m3's relative half step.
    let up_a_step = |block: &[f32]| match Format::Fp8E4m3.quantize(block) {
        Encoded::Scaled { format, scale, codes } => {
            let codes =
                codes.into_iter().map(|c| if c & 0x7F < 0x7E && e4m3_to_f32(c) != 0.0 { c + 1 } else { c }).collect();
            Encoded::Scaled { format, scale, codes }
        }
        exact => exact,
    };
    for shots in [Shots::Two, Shots::One] {
        let how = (Format::Fp8E4m3, shots);
        let broken = run_with::<f32>(DataSet::Normal, how, ReduceOp::Sum, 2, (32, 500), 9, &up_a_step);
        assert!(broken.is_err_and(|e| e.contains("over the bound")), "{shots:?}");
    }
}

#[test]
fn scaling_special_or_tiny_blocks_breaks_the_checks() {
    // Without the exact flag: a NaN or an infinity spreads over its block, and f32
    // subnormals lose their low bits to a subnormal scale.
    let always_scaled = |block: &[f32]| {
        let max = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        Format::Int8.quantize_with_scale(block, Format::Int8.scale(max))
    };
    for shots in [Shots::Two, Shots::One] {
        for set in [DataSet::NanInf, DataSet::Subnormal] {
            let how = (Format::Int8, shots);
            let broken = run_with::<f32>(set, how, ReduceOp::Sum, 3, (32, 700), 4, &always_scaled);
            assert!(broken.is_err(), "{set:?} {shots:?}");
            assert!(run::<f32>(set, how, ReduceOp::Sum, 3, (32, 700), 4).is_ok());
        }
    }
}

#[test]
fn one_rank_with_other_bits_is_caught() {
    let inputs = draw::<f16>(DataSet::Normal, 4, 300, 32, 1);
    let views: Vec<&[f16]> = inputs.iter().map(Vec::as_slice).collect();
    let scheme = Scheme { format: Format::Int8, block: BlockSize::new(32).unwrap() };
    for shots in [Shots::Two, Shots::One] {
        let how = (Format::Int8, shots);
        let mut outs = all_reduce_by(&views, ReduceOp::Sum, scheme, shots).unwrap();
        assert!(check(&outs, &inputs, ReduceOp::Sum, how, 32).is_ok());
        outs[3][77] = f16::from_bits(outs[3][77].to_bits() ^ 1);
        let e = check(&outs, &inputs, ReduceOp::Sum, how, 32).unwrap_err();
        assert!(e.starts_with("rank 3's bits differ from rank 0's at [77]"), "{e}");
    }
}
