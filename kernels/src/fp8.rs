//! The two 8-bit float types NCCL reduces, [`F8E4M3`] and [`F8E5M2`], converted in software
//! so the kernels run the same arithmetic on every card (hardware conversion needs sm_89,
//! and the PTX targets are compute_75 and compute_80).
//!
//! A code is a sign bit, E exponent bits and M mantissa bits; exponent field 0 holds the
//! subnormals `m * 2^(emin - M)`, the others `(2^M + m) * 2^(e - bias - M)`. Counting the
//! magnitude codes up counts the values up, so one rounding to an integer number of steps
//! is the whole conversion from f32 (see [`Fp8Format::from_f32`]).
//!
//! - e4m3 (torch's `float8_e4m3fn`, NCCL's `ncclFloat8e4m3`): bias 7, no infinities, exponent
//!   and mantissa all ones is NaN, so the largest finite value is `0x7E` = 448.
//! - e5m2 (`float8_e5m2`, `ncclFloat8e5m2`): bias 15, IEEE-like: `0x7C` is infinity, `0x7D` to
//!   `0x7F` NaN, the largest finite value `0x7B` = 57344. Its codes are the top byte of f16's.
//!
//! Converting from f32 rounds to nearest, ties to the even code, and saturates: magnitudes
//! from the largest finite value up, infinity included, become that value (CUDA's
//! `__NV_SATFINITE`, what NCCL's own fp8 reductions store with). NaN stays NaN.
//!
//! ```
//! use gp2p_kernels::fp8::{F8E4M3, F8E5M2};
//!
//! assert_eq!(F8E4M3::from_f32(1.0).to_bits(), 0x38);
//! assert_eq!(F8E4M3::from_f32(1000.0).to_f32(), 448.0, "saturates");
//! assert_eq!(F8E5M2::from_f32(f32::INFINITY).to_f32(), 57344.0);
//! assert_eq!(F8E5M2::from_bits(0x7C).to_f32(), f32::INFINITY, "e5m2 holds infinity");
//! assert_eq!(F8E4M3::from_f32(1.0 + 1.0 / 16.0).to_f32(), 1.0, "a tie goes to the even code");
//! ```

/// One 8-bit float format: where its fields are and what its special codes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fp8Format {
    /// Stored mantissa bits.
    pub mantissa_bits: u32,
    /// The exponent of the smallest normal value; below it the spacing stays
    /// `2^(min_normal_exp - mantissa_bits)`.
    pub min_normal_exp: i32,
    /// The magnitude code of the largest finite value.
    pub max_finite_code: u8,
    /// The magnitude code of infinity, where the format has one.
    pub infinity_code: Option<u8>,
}

/// The sign bit of a code.
const SIGN_BIT: u8 = 0x80;
/// The magnitude code every NaN converts to (all ones, in both formats).
const NAN_CODE: u8 = 0x7F;

/// e4m3: bias 7, no infinities, 448 at most.
pub const E4M3: Fp8Format =
    Fp8Format { mantissa_bits: 3, min_normal_exp: -6, max_finite_code: 0x7E, infinity_code: None };
/// e5m2: bias 15, infinities, 57344 at most.
pub const E5M2: Fp8Format =
    Fp8Format { mantissa_bits: 2, min_normal_exp: -14, max_finite_code: 0x7B, infinity_code: Some(0x7C) };

/// 2^`n` as f32, for the exponents the conversions need (well inside f32's normal range).
fn pow2(n: i32) -> f32 {
    f32::from_bits(((127 + n) as u32) << 23)
}

impl Fp8Format {
    /// The largest finite magnitude.
    pub fn max_finite(self) -> f32 {
        self.to_f32(self.max_finite_code)
    }

    /// `value` as a code: rounded to nearest, ties to the even code; magnitudes from the
    /// largest finite value up (infinity included) saturate to it; NaN becomes the all-ones
    /// NaN code, its sign kept.
    pub fn from_f32(self, value: f32) -> u8 {
        let sign = if value.is_sign_negative() { SIGN_BIT } else { 0 };
        if value.is_nan() {
            return sign | NAN_CODE;
        }
        let magnitude = value.abs();
        if magnitude >= self.max_finite() {
            return sign | self.max_finite_code;
        }
        // The binade's exponent (f32 subnormals and zero have a biased exponent of 0 and land
        // on the subnormal spacing with the rest of the small values).
        let binade = ((magnitude.to_bits() >> 23) as i32 - 127).max(self.min_normal_exp);
        // Scaled so that the format's values in this binade are the integers 2^M..=2^(M+1)
        // (0..=2^(M+1) at the bottom): multiplying by a power of two is exact, so one rounding
        // to an integer is the whole conversion. 2^(M+1) is the next binade's first value,
        // and adding it to the binade's first code carries into the exponent field by itself.
        // Below the largest finite value the count never reaches a code past it.
        let mantissa_bits = self.mantissa_bits as i32;
        let steps = (magnitude * pow2(mantissa_bits - binade)).round_ties_even() as u8;
        let code = (((binade - self.min_normal_exp) as u8) << self.mantissa_bits) + steps;
        sign | code
    }

    /// The value of a code (exact in f32): NaN codes give NaN, e5m2's `0x7C` infinity.
    pub fn to_f32(self, code: u8) -> f32 {
        let magnitude = code & !SIGN_BIT;
        let value = if Some(magnitude) == self.infinity_code {
            f32::INFINITY
        } else if magnitude > self.max_finite_code {
            f32::NAN
        } else {
            let exponent_field = i32::from(magnitude >> self.mantissa_bits);
            let mantissa = f32::from(magnitude & ((1 << self.mantissa_bits) - 1));
            let mantissa_bits = self.mantissa_bits as i32;
            if exponent_field == 0 {
                mantissa * pow2(self.min_normal_exp - mantissa_bits)
            } else {
                (pow2(mantissa_bits) + mantissa) * pow2(exponent_field - 1 + self.min_normal_exp - mantissa_bits)
            }
        };
        if code & SIGN_BIT != 0 { -value } else { value }
    }
}

macro_rules! fp8_type {
    ($(#[$doc:meta])* $name:ident, $format:expr) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
        #[repr(transparent)]
        pub struct $name(u8);

        impl $name {
            /// The format's fields.
            pub const FORMAT: Fp8Format = $format;

            /// The value with these bits.
            pub const fn from_bits(bits: u8) -> Self {
                Self(bits)
            }

            /// The bits.
            pub const fn to_bits(self) -> u8 {
                self.0
            }

            /// `value` rounded to nearest (ties to even), saturating; see the module doc.
            pub fn from_f32(value: f32) -> Self {
                Self(Self::FORMAT.from_f32(value))
            }

            /// The value, exactly.
            pub fn to_f32(self) -> f32 {
                Self::FORMAT.to_f32(self.0)
            }
        }

        impl std::fmt::Debug for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "{} ({:#04x})", self.to_f32(), self.0)
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                std::fmt::Display::fmt(&self.to_f32(), f)
            }
        }
    };
}

fp8_type!(
    /// An fp8 e4m3 value (no infinities, 448 at most): torch's `float8_e4m3fn`.
    F8E4M3,
    E4M3
);
fp8_type!(
    /// An fp8 e5m2 value (with infinities, 57344 at most): torch's `float8_e5m2`.
    F8E5M2,
    E5M2
);

/// The largest finite e4m3 magnitude.
pub const E4M3_MAX: f32 = 448.0;

/// `value` as an e4m3 code (see [`Fp8Format::from_f32`]).
pub fn e4m3_from_f32(value: f32) -> u8 {
    E4M3.from_f32(value)
}

/// The value of an e4m3 code (exact in f32); the NaN codes give NaN.
pub fn e4m3_to_f32(code: u8) -> f32 {
    E4M3.to_f32(code)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::SplitMix64;

    /// Every finite non-negative value of `format`, by code.
    fn table(format: Fp8Format) -> Vec<f32> {
        (0..=format.max_finite_code).map(|c| format.to_f32(c)).collect()
    }

    /// The nearest code to `value` by search over the table, ties to the even code, saturating.
    fn nearest_by_search(format: Fp8Format, value: f32) -> u8 {
        let sign = if value.is_sign_negative() { SIGN_BIT } else { 0 };
        let target = f64::from(value.abs());
        let mut best = 0u8;
        for (code, v) in table(format).into_iter().enumerate() {
            let (d, best_d) = ((f64::from(v) - target).abs(), (f64::from(format.to_f32(best)) - target).abs());
            if d < best_d || (d == best_d && code % 2 == 0) {
                best = code as u8;
            }
        }
        sign | best
    }

    #[test]
    fn the_tables_are_the_formats_values_in_order() {
        let t = table(E4M3);
        assert_eq!(
            (t[0], t[1], t[7], t[8], t[15], t[16]),
            (0.0, 2f32.powi(-9), 7.0 / 512.0, 2f32.powi(-6), 15.0 / 512.0, 2f32.powi(-5))
        );
        assert_eq!((t[0x38], t[0x3F], t[0x7E]), (1.0, 1.875, 448.0));
        assert_eq!(E4M3.max_finite(), E4M3_MAX);
        let t = table(E5M2);
        assert_eq!(
            (t[1], t[3], t[4], t[0x3C], t[0x3F], t[0x7B]),
            (2f32.powi(-16), 3.0 * 2f32.powi(-16), 2f32.powi(-14), 1.0, 1.75, 57344.0)
        );
        for (format, step) in [(E4M3, 8), (E5M2, 4)] {
            let t = table(format);
            assert!(t.windows(2).all(|w| w[0] < w[1]), "values grow with the code");
            // Within a binade the step is 2^-M of its first value.
            for binade in t[step..].chunks(step) {
                assert!(binade.windows(2).all(|w| w[1] - w[0] == binade[0] / step as f32), "{binade:?}");
            }
            assert!(format.to_f32(0x7F).is_nan() && format.to_f32(0xFF).is_nan());
        }
        assert_eq!(e4m3_to_f32(0xB8), -1.0);
        assert_eq!((E5M2.to_f32(0x7C), E5M2.to_f32(0xFC)), (f32::INFINITY, f32::NEG_INFINITY));
        assert!(E5M2.to_f32(0x7D).is_nan() && E5M2.to_f32(0x7E).is_nan());
    }

    #[test]
    fn e5m2_is_the_top_byte_of_f16() {
        for code in 0..=u8::MAX {
            let wide = half::f16::from_bits(u16::from(code) << 8).to_f32();
            let narrow = E5M2.to_f32(code);
            assert!(wide == narrow || (wide.is_nan() && narrow.is_nan()), "code {code:#04x}: {wide} vs {narrow}");
        }
    }

    #[test]
    fn every_finite_code_round_trips() {
        for format in [E4M3, E5M2] {
            for code in (0..=format.max_finite_code).chain(SIGN_BIT..=SIGN_BIT | format.max_finite_code) {
                assert_eq!(format.from_f32(format.to_f32(code)), code, "code {code:#04x} of {format:?}");
            }
        }
    }

    #[test]
    fn conversion_rounds_to_nearest_even_and_saturates() {
        for format in [E4M3, E5M2] {
            let t = table(format);
            for pair in t.windows(2) {
                // The midpoint of two neighbours is exact in f32; it goes to the even code.
                let mid = (pair[0] + pair[1]) / 2.0;
                assert_eq!(format.from_f32(mid), nearest_by_search(format, mid), "midpoint {mid}");
                assert_eq!(format.from_f32(mid) % 2, 0, "tie at {mid} to the even code");
                let (below, above) = (f32::from_bits(mid.to_bits() - 1), f32::from_bits(mid.to_bits() + 1));
                assert_eq!(format.to_f32(format.from_f32(below)), pair[0], "just below {mid}");
                assert_eq!(format.to_f32(format.from_f32(above)), pair[1], "just above {mid}");
            }
            let mut rng = SplitMix64::new(0xE4E3);
            for _ in 0..20_000 {
                let value = (rng.next_f64_signed() * 2f64.powi((rng.next_u64() % 40) as i32 - 22)) as f32;
                assert_eq!(format.from_f32(value), nearest_by_search(format, value), "{value}");
            }
            let max = format.max_finite();
            for big in [max, max * 1.01, max * 2.0, 1e30, f32::INFINITY] {
                assert_eq!(format.from_f32(big), format.max_finite_code, "{big}");
                assert_eq!(format.from_f32(-big), SIGN_BIT | format.max_finite_code, "-{big}");
            }
            assert_eq!(format.from_f32(f32::NAN) & !SIGN_BIT, NAN_CODE);
            let smallest = format.to_f32(1);
            assert_eq!(format.from_f32(smallest / 2.0), 0, "half the smallest step ties to zero");
            assert_eq!(format.from_f32(1e-40), 0, "f32 subnormals");
            assert_eq!(format.from_f32(-0.0), SIGN_BIT);
        }
    }

    #[test]
    fn the_types_carry_their_format() {
        assert_eq!(F8E4M3::from_f32(-2.0).to_bits(), 0xC0);
        assert_eq!(F8E5M2::from_f32(-2.0).to_bits(), 0xC0);
        assert_eq!(F8E4M3::from_bits(0x7E).to_f32(), 448.0);
        assert_eq!(F8E5M2::from_bits(0x7B).to_f32(), 57344.0);
        assert_eq!(format!("{:?}", F8E4M3::from_f32(1.5)), "1.5 (0x3c)");
        assert_eq!(F8E5M2::from_f32(3.0).to_string(), "3");
    }
}
