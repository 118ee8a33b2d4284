//! The data sets: per-rank buffers drawn from a seed, in each input type's range.

use half::{bf16, f16};

use super::super::Compressible;
use crate::reference::SplitMix64;

/// What the data sets need of an input type beyond [`Compressible`].
pub(super) trait Sample: Compressible {
    /// The smallest positive subnormal.
    const SUBNORMAL: f64;
    /// Subnormals are the multiples of [`Sample::SUBNORMAL`] below this many.
    const SUBNORMAL_STEPS: u64;
    /// The typical magnitude: small enough for f16 that eight ranks' outliers stay finite.
    const UNIT: f64;
    /// The largest magnitude a value is drawn with, so that sums of eight stay finite.
    const LIMIT: f64;

    /// `value` in this type (through f32); finite values clamped to the limit.
    fn sample(value: f64) -> Self {
        let value = if value.is_finite() { value.clamp(-Self::LIMIT, Self::LIMIT) } else { value };
        Self::from_f32(value as f32)
    }
}

impl Sample for f32 {
    const SUBNORMAL: f64 = f32::MIN_POSITIVE as f64 / (1u64 << 23) as f64;
    const SUBNORMAL_STEPS: u64 = 1 << 23;
    const UNIT: f64 = 1.0;
    const LIMIT: f64 = 1e30;
}

impl Sample for f16 {
    const SUBNORMAL: f64 = 1.0 / (1u64 << 24) as f64;
    const SUBNORMAL_STEPS: u64 = 1 << 10;
    const UNIT: f64 = 1.0 / 16.0;
    const LIMIT: f64 = 4096.0;
}

impl Sample for bf16 {
    const SUBNORMAL: f64 = bf16::CAST_FLOOR * 2.0;
    const SUBNORMAL_STEPS: u64 = 1 << 7;
    const UNIT: f64 = 1.0;
    const LIMIT: f64 = 1e30;
}

/// The data sets of the CPU tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum DataSet {
    /// Standard normal values.
    Normal,
    /// Student's t with ν = 2: heavy tails, no finite variance.
    StudentT2,
    /// Normal values, one per block and rank 10^4 times larger.
    Outlier,
    /// Zeros of both signs.
    Zeros,
    /// Subnormals of the input type.
    Subnormal,
    /// Normal values with NaN, +inf and -inf in some blocks (+inf and -inf meet in some).
    NanInf,
}

/// A uniform draw in (0, 1].
fn uniform(rng: &mut SplitMix64) -> f64 {
    ((rng.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
}

/// A standard normal draw (Box–Muller).
pub(super) fn normal(rng: &mut SplitMix64) -> f64 {
    let (a, b) = (uniform(rng), uniform(rng));
    (-2.0 * a.ln()).sqrt() * (std::f64::consts::TAU * b).cos()
}

/// A Student's t draw with ν = 2: a normal over the root of a χ²₂ draw halved, which is -ln U.
fn student_t2(rng: &mut SplitMix64) -> f64 {
    normal(rng) / (-uniform(rng).ln()).sqrt()
}

/// `ranks` buffers of `len` values of `set`, with blocks of `block` values, from `seed`.
pub(super) fn draw<T: Sample>(set: DataSet, ranks: usize, len: usize, block: usize, seed: u64) -> Vec<Vec<T>> {
    let mut rng = SplitMix64::new(seed);
    (0..ranks)
        .map(|rank| {
            let mut values: Vec<f64> = (0..len)
                .map(|_| match set {
                    DataSet::Normal | DataSet::Outlier | DataSet::NanInf => normal(&mut rng) * T::UNIT,
                    DataSet::StudentT2 => student_t2(&mut rng) * T::UNIT,
                    DataSet::Zeros => [0.0, -0.0][(rng.next_u64() % 2) as usize],
                    DataSet::Subnormal => {
                        let steps = (rng.next_u64() % T::SUBNORMAL_STEPS) as f64;
                        steps * T::SUBNORMAL * [1.0, -1.0][(rng.next_u64() % 2) as usize]
                    }
                })
                .collect();
            for (b, part) in values.chunks_mut(block).enumerate() {
                match set {
                    DataSet::Outlier => part[(rng.next_u64() % part.len() as u64) as usize] *= 1e4,
                    // About one block in three of each rank gets a special value, at a place
                    // that half the ranks share, so +inf and -inf sometimes meet.
                    DataSet::NanInf if rng.next_u64() % 3 == 0 => {
                        part[(b * 7 + rank % 2) % part.len()] =
                            [f64::NAN, f64::INFINITY, f64::NEG_INFINITY][(rng.next_u64() % 3) as usize]
                    }
                    _ => {}
                }
            }
            values.into_iter().map(T::sample).collect()
        })
        .collect()
}
