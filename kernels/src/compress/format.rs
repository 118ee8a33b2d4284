//! The vocabulary of the compressed all-reduce: the block formats, the block size, the input
//! types and the one error type.

use std::fmt;

use half::{bf16, f16};

use crate::{Element, ReduceOp};

/// How a scaled block's values travel: one code per value, one f32 scale per block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// Symmetric int8: the scale maps the block's largest magnitude to 127, each value is
    /// rounded to the nearest integer code (ties to even), -128 is never used.
    Int8,
    /// fp8 e4m3 (no infinities, largest finite 448): the scale maps the block's largest
    /// magnitude to 448, each value is rounded to the nearest e4m3 value (ties to even).
    Fp8E4m3,
}

impl Format {
    /// Every format.
    pub const ALL: [Format; 2] = [Format::Int8, Format::Fp8E4m3];

    /// Short lowercase name, as on the command line: `int8`, `fp8`.
    pub const fn name(self) -> &'static str {
        match self {
            Format::Int8 => "int8",
            Format::Fp8E4m3 => "fp8",
        }
    }

    /// The code magnitude the block's largest magnitude maps to: 127 or 448.
    pub const fn code_max(self) -> f32 {
        match self {
            Format::Int8 => 127.0,
            Format::Fp8E4m3 => 448.0,
        }
    }

    /// The scale of a block whose largest magnitude is `block_max`, rounded once to f32.
    pub fn scale(self, block_max: f32) -> f32 {
        block_max / self.code_max()
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Values per block (one scale each): a power of two from [`BlockSize::MIN`] to
/// [`BlockSize::MAX`]. Smaller blocks follow local magnitudes more closely at the cost of
/// more scale bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockSize(usize);

impl BlockSize {
    /// The smallest block: at 32 values a 4-byte scale is an eighth of an int8 block's bytes.
    pub const MIN: usize = 32;
    /// The largest block.
    pub const MAX: usize = 256;
    /// The smallest block, as a [`BlockSize`].
    pub const SMALLEST: BlockSize = BlockSize(Self::MIN);

    /// `values` as a block size, if it is a power of two from 32 to 256.
    pub fn new(values: usize) -> Result<BlockSize, CompressError> {
        if values.is_power_of_two() && (Self::MIN..=Self::MAX).contains(&values) {
            Ok(BlockSize(values))
        } else {
            Err(CompressError::BlockSize { given: values })
        }
    }

    /// Every valid size, smallest first.
    pub fn all() -> impl Iterator<Item = BlockSize> {
        (Self::MIN.trailing_zeros()..=Self::MAX.trailing_zeros()).map(|shift| BlockSize(1 << shift))
    }

    /// The number of values.
    pub const fn get(self) -> usize {
        self.0
    }
}

/// Blocks whose largest magnitude is above zero and below this travel exact (as f32).
///
/// 2^-100: above it a block's scale, and every nonzero dequantized value, stay normal f32
/// numbers (the smallest is 2^-100 / 448 times the smallest e4m3 step 2^-9, about 2^-118),
/// which the bound's relative rounding terms need. Below it the values are so small that
/// sending them whole costs nothing that matters, and it keeps f32 subnormals exact.
pub const MIN_SCALED_BLOCK_MAX: f32 = f32::from_bits((127 - 100) << 23);

/// What went wrong in a call of the compressed all-reduce reference.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CompressError {
    /// The block size is not a power of two from 32 to 256.
    #[error("block size {given} is not a power of two from 32 to 256")]
    BlockSize {
        /// What was given.
        given: usize,
    },
    /// The op is neither sum nor avg.
    #[error("compressed all-reduce takes sum or avg, not {op}")]
    Op {
        /// What was given.
        op: ReduceOp,
    },
    /// A rank's buffer differs in length from rank 0's.
    #[error("rank {rank} has {len} elements, expected {expected} like rank 0")]
    Length {
        /// The rank whose buffer differs.
        rank: usize,
        /// Its length.
        len: usize,
        /// Rank 0's length.
        expected: usize,
    },
    /// No rank took part.
    #[error("an all-reduce needs at least one rank, got none")]
    NoRanks,
}

/// An input type of the compressed all-reduce: f32, f16 or bf16. Each converts to f32
/// exactly; the result is rounded back once, as the exact path rounds it.
pub trait Compressible: Element {
    /// The value as f32 (exact for all three types).
    fn to_f32(self) -> f32;
    /// `value` rounded to this type, to nearest with ties to even.
    fn from_f32(value: f32) -> Self;
    /// Relative error of [`Compressible::from_f32`] on normal results: half the distance
    /// from 1 to the next value (0 for f32, which is not rounded).
    const CAST_ROUNDOFF: f64;
    /// Absolute error of [`Compressible::from_f32`] below the normal range: half the
    /// smallest subnormal (0 for f32).
    const CAST_FLOOR: f64;
}

impl Compressible for f32 {
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(value: f32) -> Self {
        value
    }
    const CAST_ROUNDOFF: f64 = 0.0;
    const CAST_FLOOR: f64 = 0.0;
}

impl Compressible for f16 {
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    fn from_f32(value: f32) -> Self {
        f16::from_f32(value)
    }
    // 11 significant bits; the smallest subnormal is 2^-24.
    const CAST_ROUNDOFF: f64 = 1.0 / (1u64 << 11) as f64;
    const CAST_FLOOR: f64 = 1.0 / (1u64 << 25) as f64;
}

impl Compressible for bf16 {
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    fn from_f32(value: f32) -> Self {
        bf16::from_f32(value)
    }
    // 8 significant bits; the smallest subnormal is 2^-133.
    const CAST_ROUNDOFF: f64 = 1.0 / (1u64 << 8) as f64;
    const CAST_FLOOR: f64 = f64::from_bits((1023 - 134) << 52);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_sizes_are_the_powers_of_two_from_32_to_256() {
        let all: Vec<usize> = BlockSize::all().map(BlockSize::get).collect();
        assert_eq!(all, [32, 64, 128, 256]);
        let valid: Vec<usize> = (0..=1024).filter(|&n| BlockSize::new(n).is_ok()).collect();
        assert_eq!(valid, all);
        assert_eq!(BlockSize::new(48), Err(CompressError::BlockSize { given: 48 }));
    }

    #[test]
    fn constants_are_the_powers_they_name() {
        assert_eq!(f64::from(MIN_SCALED_BLOCK_MAX), 2f64.powi(-100));
        assert_eq!(bf16::CAST_FLOOR, 2f64.powi(-134));
        assert_eq!(f64::from(bf16::from_bits(1).to_f32()), 2.0 * bf16::CAST_FLOOR, "the smallest subnormal");
        assert_eq!(f64::from(f16::from_bits(1).to_f32()), 2.0 * f16::CAST_FLOOR);
        assert_eq!(f64::from(f16::EPSILON.to_f32()), 2.0 * f16::CAST_ROUNDOFF);
        assert_eq!(f64::from(bf16::EPSILON.to_f32()), 2.0 * bf16::CAST_ROUNDOFF);
        assert_eq!(Format::Int8.scale(254.0), 2.0);
        assert_eq!(Format::Fp8E4m3.scale(896.0), 2.0);
        assert_eq!(Format::Fp8E4m3.to_string(), "fp8");
    }
}
