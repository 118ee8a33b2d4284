//! One block on the wire: quantized to a scale and one code per value, or sent exact (the
//! flag), and back.

use super::format::{Format, MIN_SCALED_BLOCK_MAX};
use crate::fp8::{e4m3_from_f32, e4m3_to_f32};

/// A block as it travels.
#[derive(Debug, Clone, PartialEq)]
pub enum Encoded {
    /// One f32 scale and one byte per value: int8 codes in two's complement, or e4m3 codes.
    Scaled {
        /// The format of the codes.
        format: Format,
        /// The block's largest magnitude divided by [`Format::code_max`] (0 for a block of
        /// zeros, whose codes are all 0).
        scale: f32,
        /// One code per value.
        codes: Vec<u8>,
    },
    /// The values themselves, as f32: a block holding a NaN or an infinity (so they reach
    /// the result as the exact path would carry them), or a block whose largest magnitude is
    /// above zero and below [`MIN_SCALED_BLOCK_MAX`].
    Exact(Vec<f32>),
}

impl Encoded {
    /// Values in the block.
    pub fn len(&self) -> usize {
        match self {
            Encoded::Scaled { codes, .. } => codes.len(),
            Encoded::Exact(values) => values.len(),
        }
    }

    /// Whether the block holds no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the block travels exact (the per-block flag).
    pub fn is_exact(&self) -> bool {
        matches!(self, Encoded::Exact(_))
    }

    /// The block's values: each code times the scale, rounded once to f32; exact blocks as
    /// they were sent.
    pub fn dequantize(&self) -> Vec<f32> {
        match self {
            Encoded::Scaled { format, scale, codes } => codes.iter().map(|&c| decode(*format, c, *scale)).collect(),
            Encoded::Exact(values) => values.clone(),
        }
    }
}

impl Format {
    /// `block` as it travels: exact when it holds a NaN or an infinity or its largest
    /// magnitude is below [`MIN_SCALED_BLOCK_MAX`] (zero excepted), else scaled so that its
    /// largest magnitude maps to [`Format::code_max`], each value rounded to nearest.
    pub fn quantize(self, block: &[f32]) -> Encoded {
        match scaled_max(block) {
            Some(max) => self.quantize_with_scale(block, self.scale(max)),
            None => Encoded::Exact(block.to_vec()),
        }
    }

    /// `block` quantized with `scale` as given (0 gives all-zero codes). [`Format::quantize`]
    /// passes the block's own; a test passes a wrong one to see the bound break.
    pub(super) fn quantize_with_scale(self, block: &[f32], scale: f32) -> Encoded {
        let codes = block.iter().map(|&x| if scale == 0.0 { 0 } else { encode(self, x / scale) }).collect();
        Encoded::Scaled { format: self, scale, codes }
    }
}

/// The largest magnitude of `block` if the block is to be scaled: `None` for a block that
/// holds a NaN or an infinity, or whose largest magnitude is above zero and below
/// [`MIN_SCALED_BLOCK_MAX`].
fn scaled_max(block: &[f32]) -> Option<f32> {
    let mut max = 0.0f32;
    for x in block {
        if !x.is_finite() {
            return None;
        }
        max = max.max(x.abs());
    }
    (max == 0.0 || max >= MIN_SCALED_BLOCK_MAX).then_some(max)
}

/// The code of `scaled`, a value already divided by the scale (|scaled| is at most
/// `code_max` up to the rounding of the scale and the division).
fn encode(format: Format, scaled: f32) -> u8 {
    match format {
        // The clamp only guards the cast: the division overshoots 127 by two f32 roundings
        // at most, far less than the half that would round past it.
        Format::Int8 => (scaled.round_ties_even().clamp(-127.0, 127.0) as i8) as u8,
        Format::Fp8E4m3 => e4m3_from_f32(scaled),
    }
}

/// The value of `code` under `scale`.
fn decode(format: Format, code: u8, scale: f32) -> f32 {
    let unscaled = match format {
        Format::Int8 => f32::from(code as i8),
        Format::Fp8E4m3 => e4m3_to_f32(code),
    };
    unscaled * scale
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn int8_maps_the_block_max_to_127_and_rounds_to_nearest_even() {
        let block = [254.0f32, -254.0, 1.0, 3.0, 5.0, -1.0, 0.9, 0.0];
        let Encoded::Scaled { scale, codes, .. } = Format::Int8.quantize(&block) else { panic!("scaled") };
        assert_eq!(scale, 2.0);
        // 1/2 and 5/2 tie to the even 0 and 2, 3/2 to 2; 0.9/2 is below the tie.
        assert_eq!(codes.iter().map(|&c| c as i8).collect::<Vec<_>>(), [127, -127, 0, 2, 2, 0, 0, 0]);
        assert_eq!(Format::Int8.quantize(&block).dequantize(), [254.0, -254.0, 0.0, 4.0, 4.0, 0.0, 0.0, 0.0]);
    }

    #[test]
    fn fp8_maps_the_block_max_to_448() {
        let block = [896.0f32, -1.0, 2.0 * 1.0625, 2f32.powi(-8), 0.0];
        let encoded = Format::Fp8E4m3.quantize(&block);
        let Encoded::Scaled { scale, ref codes, .. } = encoded else { panic!("scaled") };
        assert_eq!((scale, codes[0], codes[1]), (2.0, 0x7E, 0xB0), "448 and -0.5");
        // 1.0625 ties between 1 and 1.125 (to the even 1), 2^-9 is the smallest step.
        assert_eq!(encoded.dequantize(), [896.0, -1.0, 2.0, 2f32.powi(-8), 0.0]);
    }

    #[test]
    fn zeros_are_exact_and_specials_and_tiny_blocks_travel_exact() {
        for format in Format::ALL {
            let zeros = format.quantize(&[0.0, -0.0, 0.0]);
            assert!(!zeros.is_exact(), "zeros are scaled, with scale 0");
            assert_eq!(zeros.dequantize(), [0.0; 3]);
            for special in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
                let block = [1.0, special, -2.0];
                let encoded = format.quantize(&block);
                assert!(encoded.is_exact(), "{format} {special}");
                let back = encoded.dequantize();
                assert_eq!(back[0].to_bits(), 1f32.to_bits());
                assert_eq!(back[1].to_bits(), special.to_bits());
            }
            let subnormals = [1e-40f32, -3e-45, 0.0];
            assert_eq!(format.quantize(&subnormals), Encoded::Exact(subnormals.to_vec()));
            let just_below = f32::from_bits(MIN_SCALED_BLOCK_MAX.to_bits() - 1);
            assert!(format.quantize(&[just_below, 0.0]).is_exact());
            assert!(!format.quantize(&[MIN_SCALED_BLOCK_MAX, 1e-40]).is_exact(), "a tiny max is still scaled");
            assert!(format.quantize(&[]).is_empty());
        }
    }

    #[test]
    fn every_int8_and_fp8_code_in_a_block_comes_back_where_it_was() {
        // A block whose values are exactly the codes times a power-of-two scale quantizes
        // to those codes and back without error.
        let int8: Vec<f32> = (-127..=127).map(|c| c as f32 * 0.25).collect();
        assert_eq!(Format::Int8.quantize(&int8).dequantize(), int8);
        let fp8: Vec<f32> = (0u8..=0x7E).chain(0x80..=0xFE).map(|c| e4m3_to_f32(c) * 8.0).collect();
        assert_eq!(Format::Fp8E4m3.quantize(&fp8).dequantize(), fp8);
    }
}
