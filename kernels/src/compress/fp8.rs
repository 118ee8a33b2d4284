//! fp8 e4m3 converted in software: the variant with no infinities (the one GPUs convert
//! to in hardware), so the GPU kernels can run the same arithmetic on cards older than sm_89.
//!
//! A code is a sign bit, four exponent bits (bias 7) and three mantissa bits. Exponent field
//! 0 holds the subnormals `m * 2^-9`; the others hold `(8 + m) * 2^(e - 10)`; exponent and
//! mantissa all ones is NaN, so the largest finite value is `0x7E` = 448. Counting codes
//! 0..=0x7E in order counts the values up: the value of magnitude code `c` is `c * 2^-9`
//! for `c < 16`, and each step of the exponent field doubles the spacing.

/// The largest finite e4m3 magnitude.
pub const E4M3_MAX: f32 = 448.0;

/// The code of +448, the largest finite magnitude.
const MAX_FINITE_CODE: u8 = 0x7E;
/// The magnitude bits of the NaN code.
const NAN_CODE: u8 = 0x7F;
/// The sign bit of a code.
const SIGN_BIT: u8 = 0x80;
/// Stored mantissa bits.
const MANTISSA_BITS: i32 = 3;
/// The exponent of the smallest normal e4m3 value, 2^-6; below it the spacing stays 2^-9.
const MIN_NORMAL_EXP: i32 = -6;

/// 2^`n` as f32, for the exponents the conversion needs (well inside the normal range).
fn pow2(n: i32) -> f32 {
    f32::from_bits(((127 + n) as u32) << 23)
}

/// `value` as e4m3: rounded to the nearest e4m3 value, ties to the even code; magnitudes
/// from 448 up (infinity included) saturate to ±448; NaN becomes the NaN code, its sign kept.
pub fn e4m3_from_f32(value: f32) -> u8 {
    let sign = if value.is_sign_negative() { SIGN_BIT } else { 0 };
    if value.is_nan() {
        return sign | NAN_CODE;
    }
    let magnitude = value.abs();
    if magnitude >= E4M3_MAX {
        return sign | MAX_FINITE_CODE;
    }
    // The binade's exponent (f32 subnormals and zero have a biased exponent of 0 and land
    // on the subnormal spacing with the rest of the small values).
    let binade = ((magnitude.to_bits() >> 23) as i32 - 127).max(MIN_NORMAL_EXP);
    // Scaled so that e4m3's values in this binade are the integers 8..=16 (0..=16 at the
    // bottom): multiplying by a power of two is exact, so one rounding to an integer is the
    // whole conversion. k = 16 is the next binade's first value, and adding k to the
    // binade's first code carries into the exponent field by itself. Below 448 the largest
    // k in the top binade is 14, code 0x7E, so no code reaches NaN's.
    let steps = (magnitude * pow2(MANTISSA_BITS - binade)).round_ties_even() as u8;
    let code = (((binade - MIN_NORMAL_EXP) as u8) << MANTISSA_BITS) + steps;
    sign | code
}

/// The value of an e4m3 code (exact in f32); the NaN codes give NaN.
pub fn e4m3_to_f32(code: u8) -> f32 {
    let magnitude = code & !SIGN_BIT;
    let value = if magnitude == NAN_CODE {
        f32::NAN
    } else {
        let exponent_field = i32::from(magnitude >> MANTISSA_BITS);
        let mantissa = f32::from(magnitude & 7);
        if exponent_field == 0 {
            mantissa * pow2(MIN_NORMAL_EXP - MANTISSA_BITS)
        } else {
            (8.0 + mantissa) * pow2(exponent_field - 10)
        }
    };
    if code & SIGN_BIT != 0 { -value } else { value }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::SplitMix64;

    /// Every finite non-negative e4m3 value, by code.
    fn table() -> Vec<f32> {
        (0..=MAX_FINITE_CODE).map(e4m3_to_f32).collect()
    }

    /// The nearest code to `value` by search over the table, ties to the even code, saturating.
    fn nearest_by_search(value: f32) -> u8 {
        let sign = if value.is_sign_negative() { SIGN_BIT } else { 0 };
        let target = f64::from(value.abs());
        let mut best = 0u8;
        for (code, v) in table().into_iter().enumerate() {
            let (d, best_d) = ((f64::from(v) - target).abs(), (f64::from(e4m3_to_f32(best)) - target).abs());
            if d < best_d || (d == best_d && code % 2 == 0) {
                best = code as u8;
            }
        }
        sign | best
    }

    #[test]
    fn the_table_is_the_e4m3_values_in_order() {
        let t = table();
        assert_eq!(
            (t[0], t[1], t[7], t[8], t[15], t[16]),
            (0.0, 2f32.powi(-9), 7.0 / 512.0, 2f32.powi(-6), 15.0 / 512.0, 2f32.powi(-5))
        );
        assert_eq!((t[0x38], t[0x3F], t[0x7E]), (1.0, 1.875, 448.0));
        assert!(t.windows(2).all(|w| w[0] < w[1]), "values grow with the code");
        // Three mantissa bits: within a binade the step is an eighth of its first value.
        for binade in t[8..].chunks(8) {
            assert!(binade.windows(2).all(|w| w[1] - w[0] == binade[0] / 8.0), "{binade:?}");
        }
        assert!(e4m3_to_f32(0x7F).is_nan() && e4m3_to_f32(0xFF).is_nan());
        assert_eq!(e4m3_to_f32(0xB8), -1.0);
    }

    #[test]
    fn every_code_round_trips() {
        for code in (0..=MAX_FINITE_CODE).chain(SIGN_BIT..=SIGN_BIT | MAX_FINITE_CODE) {
            assert_eq!(e4m3_from_f32(e4m3_to_f32(code)), code, "code {code:#04x}");
        }
    }

    #[test]
    fn conversion_rounds_to_nearest_even_and_saturates() {
        let t = table();
        for pair in t.windows(2) {
            // The midpoint of two neighbours is exact in f32; it goes to the even code.
            let mid = (pair[0] + pair[1]) / 2.0;
            assert_eq!(e4m3_from_f32(mid), nearest_by_search(mid), "midpoint {mid}");
            assert_eq!(e4m3_from_f32(mid) % 2, 0, "tie at {mid} to the even code");
            let (below, above) = (f32::from_bits(mid.to_bits() - 1), f32::from_bits(mid.to_bits() + 1));
            assert_eq!(e4m3_to_f32(e4m3_from_f32(below)), pair[0], "just below {mid}");
            assert_eq!(e4m3_to_f32(e4m3_from_f32(above)), pair[1], "just above {mid}");
        }
        let mut rng = SplitMix64::new(0xE4E3);
        for _ in 0..20_000 {
            let value = (rng.next_f64_signed() * 2f64.powi((rng.next_u64() % 24) as i32 - 14)) as f32;
            assert_eq!(e4m3_from_f32(value), nearest_by_search(value), "{value}");
        }
        for big in [448.0, 463.9, 464.0, 1e6, f32::INFINITY] {
            assert_eq!(e4m3_from_f32(big), MAX_FINITE_CODE, "{big}");
            assert_eq!(e4m3_from_f32(-big), SIGN_BIT | MAX_FINITE_CODE, "-{big}");
        }
        assert_eq!(e4m3_from_f32(f32::NAN) & !SIGN_BIT, NAN_CODE);
        assert_eq!(e4m3_from_f32(2f32.powi(-10)), 0, "half the smallest step ties to zero");
        assert_eq!(e4m3_from_f32(1e-40), 0, "f32 subnormals");
        assert_eq!(e4m3_from_f32(-0.0), SIGN_BIT);
    }
}
