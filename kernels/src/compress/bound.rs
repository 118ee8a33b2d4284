//! The per-element error bound of the compressed all-reduce (the proof sketch is in the
//! module docs of `compress` and in docs/compression.md).

use super::format::{CompressError, Compressible, Format};
use crate::ReduceOp;

/// f32's unit roundoff: the relative error of one rounded f32 operation on a normal result.
const F32_ROUNDOFF: f64 = 1.0 / (1u64 << 24) as f64;
/// Half the smallest f32 subnormal: the absolute error of one rounded f32 product or
/// quotient whose result falls below the normal range (sums round no value there).
const F32_FLOOR: f64 = 1.0 / (1u128 << 126) as f64 / (1u64 << 24) as f64;
/// The largest e4m3 value and e4m3's relative half-step: three mantissa bits.
const E4M3_MAX: f64 = 448.0;
const E4M3_HALF_STEP: f64 = 1.0 / 16.0;
/// Half of e4m3's smallest step 2^-9: the absolute rounding below its normal range.
const E4M3_FLOOR: f64 = 1.0 / 1024.0;
/// f32 roundings other than the format's own that one quantization round trip takes: the
/// scale, the division by it and the product of code and scale.
const STEP_ROUNDINGS: f64 = 3.0;

/// One rank's contribution to one element, as the bound sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Term {
    /// The rank's value of the element, as a number (the input converted exactly).
    pub value: f64,
    /// The largest magnitude in the rank's block holding the element, if that block was
    /// sent scaled; `None` if it was not quantized (the owner's own shard, a block with a
    /// NaN or an infinity, a tiny block).
    pub block_max: Option<f64>,
}

/// The most a value of magnitude `magnitude`, in a block of largest magnitude `block_max`,
/// can move in one quantize and dequantize under `format` (`magnitude <= block_max`):
///
/// - int8: `block_max / 254 + 3u * block_max`
/// - fp8 e4m3: `magnitude / 16 + block_max / (448 * 1024) + 3u * (magnitude + block_max / 448)`
///
/// with u = 2^-24 (f32's unit roundoff). The first terms are the format's rounding, half a
/// code step: for int8 the step is the scale, `block_max / 127`; for e4m3 it is at most an
/// eighth of the value's own magnitude (three mantissa bits), and below e4m3's normal range
/// 2^-9 times the scale. The 3u terms bound the f32 roundings of the scale, the division by
/// it and the product of code and scale.
pub fn quantization_error(format: Format, magnitude: f64, block_max: f64) -> f64 {
    match format {
        Format::Int8 => block_max / 254.0 + STEP_ROUNDINGS * F32_ROUNDOFF * block_max,
        Format::Fp8E4m3 => {
            let scale = block_max / E4M3_MAX;
            E4M3_HALF_STEP * magnitude + E4M3_FLOOR * scale + STEP_ROUNDINGS * F32_ROUNDOFF * (magnitude + scale)
        }
    }
}

/// `n u / (1 - n u)`: the relative error a sum of n + 1 f32 values folded one by one can
/// gather, relative to the sum of their magnitudes.
fn fold_gamma(n: usize) -> f64 {
    let nu = n as f64 * F32_ROUNDOFF;
    nu / (1.0 - nu)
}

/// The most an element of the compressed all-reduce's result in type `T` can differ from
/// the exact result: the sum of `terms`' values, divided by their number for avg.
///
/// `terms` holds every rank's contribution, `folded_max` the largest magnitude of the folded
/// block holding the element if that block was sent scaled for the gather (an upper bound
/// of it serves too). With E_r the [`quantization_error`] of each scaled term, S the exact
/// sum and n the number of ranks:
///
/// - up and fold: `F = Σ E_r + γ(n-1) Σ (|x_r| + E_r)`;
/// - avg: `F' = F/n + (2u + u²)(|S|/n + F/n) + 2^-150` (the reciprocal of n and the product
///   each round once); sum: `F' = F`;
/// - gather: `G = quantization_error(|S'| + F', M)` with S' the exact result, or 0 when the
///   folded block travels exact;
/// - the result: `F' + G`, plus for f16 and bf16 the cast from f32, `u_T (|S'| + F' + G) +
///   η_T`.
///
/// For int8 and a sum this is `(Σ m_r + M)/254` over the scaled terms and the gather, plus
/// terms of a few u times the magnitudes. Overflow is outside the bound: a fold past
/// f32's range gives infinity, as the exact path does. Errors: an op other than sum or avg.
pub fn error_bound<T: Compressible>(
    format: Format,
    op: ReduceOp,
    terms: &[Term],
    folded_max: Option<f64>,
) -> Result<f64, CompressError> {
    let ranks = terms.len();
    let exact: f64 = terms.iter().map(|t| t.value).sum::<f64>().abs();
    let mut up = 0.0;
    let mut carried = 0.0;
    for term in terms {
        let error = term.block_max.map_or(0.0, |max| quantization_error(format, term.value.abs(), max));
        up += error;
        carried += term.value.abs() + error;
    }
    let fold = up + fold_gamma(ranks.saturating_sub(1)) * carried;
    let (result, before_gather) = match op {
        ReduceOp::Sum => (exact, fold),
        ReduceOp::Avg => {
            let n = ranks.max(1) as f64;
            let (result, fold) = (exact / n, fold / n);
            let reciprocal = 2.0 * F32_ROUNDOFF + F32_ROUNDOFF * F32_ROUNDOFF;
            (result, fold + reciprocal * (result + fold) + F32_FLOOR)
        }
        ReduceOp::Min | ReduceOp::Max | ReduceOp::Prod => return Err(CompressError::Op { op }),
    };
    let gather = folded_max.map_or(0.0, |max| quantization_error(format, result + before_gather, max));
    let total = before_gather + gather;
    Ok(total + T::CAST_ROUNDOFF * (result + total) + T::CAST_FLOOR)
}

#[cfg(test)]
mod tests {
    use half::bf16;

    use super::*;

    #[test]
    fn int8_is_the_sum_of_block_maxima_over_254_up_to_f32_terms() {
        let terms = [
            Term { value: 1.0, block_max: Some(2.0) },
            Term { value: -3.0, block_max: Some(4.0) },
            Term { value: 0.5, block_max: None },
        ];
        let bound = error_bound::<f32>(Format::Int8, ReduceOp::Sum, &terms, Some(8.0)).unwrap();
        let stated = (2.0 + 4.0 + 8.0) / 254.0;
        assert!(bound > stated && bound < stated * (1.0 + 2f64.powi(-13)), "{bound} vs {stated}");
        let avg = error_bound::<f32>(Format::Int8, ReduceOp::Avg, &terms, Some(8.0 / 3.0)).unwrap();
        let stated = (2.0 + 4.0) / 254.0 / 3.0 + 8.0 / 3.0 / 254.0;
        assert!(avg > stated && avg < stated * (1.0 + 2f64.powi(-13)), "{avg} vs {stated}");
        assert!(error_bound::<f32>(Format::Int8, ReduceOp::Max, &terms, None).is_err());
    }

    #[test]
    fn fp8_is_relative_with_a_floor_at_the_scaled_block() {
        let e = quantization_error(Format::Fp8E4m3, 1.0, 448.0);
        assert!(e > 1.0 / 16.0 + 1.0 / 1024.0 && e < (1.0 / 16.0 + 1.0 / 1024.0) * (1.0 + 2f64.powi(-13)));
        assert_eq!(quantization_error(Format::Fp8E4m3, 0.0, 0.0), 0.0, "zeros are exact");
        assert_eq!(quantization_error(Format::Int8, 0.0, 0.0), 0.0);
        // The cast to bf16 adds half a bf16 step of the result, nothing when exact in f32.
        let exact = [Term { value: 3.0, block_max: None }];
        assert_eq!(error_bound::<f32>(Format::Fp8E4m3, ReduceOp::Sum, &exact, None).unwrap(), 0.0);
        let cast = error_bound::<bf16>(Format::Fp8E4m3, ReduceOp::Sum, &exact, None).unwrap();
        assert_eq!(cast, 3.0 / 256.0 + bf16::CAST_FLOOR);
    }
}
