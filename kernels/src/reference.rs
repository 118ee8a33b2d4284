//! CPU references of the kernels, for the GPU test suite and for `gp2p bench`, which checks
//! every result it times: fresh random data, the reference of one reduce step (f64 for
//! floats, wrapping arithmetic for integers), element-by-element comparison with a
//! tolerance in ulps, and parallel loops so that checking 2^28 elements stays quick.

use half::{bf16, f16};

use crate::fp8::{F8E4M3, F8E5M2};
use crate::{Element, ReduceOp};

/// A small, fast, seedable generator (SplitMix64): test data must be fresh per case but
/// reproducible from the seed printed on failure.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-2, 2): away from overflow for products, never all zeros.
    pub fn next_f64_signed(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * 4.0 - 2.0
    }
}

/// What the suite needs of an element type: random values, the reference reduction and
/// the comparison with its tolerance.
pub trait Reference: Element {
    /// A random value.
    fn random(rng: &mut SplitMix64) -> Self;
    /// The value whose every byte is `byte` (poison).
    fn from_byte(byte: u8) -> Self;
    /// The reference of one kernel step: `op(dst, src)`, divided by `divide_by` for avg.
    fn reference(dst: Self, src: Self, op: ReduceOp, divide_by: u32) -> Self;
    /// Whether `got` is acceptable for `want` under `op`.
    fn matches(got: Self, want: Self, op: ReduceOp) -> bool;
    /// Half the distance from 1 to the next value (0 for integers, which are exact).
    const UNIT_ROUNDOFF: f64;
    /// The smallest positive normal value (0 for integers).
    const MIN_NORMAL: f64;
    /// The value as f64 (integers may round; only floats are compared this way).
    fn to_f64(self) -> f64;
}

macro_rules! int_element {
    ($($t:ty => $wide:ty),*) => {$(
        impl Reference for $t {
            fn random(rng: &mut SplitMix64) -> Self {
                rng.next_u64() as $t
            }
            fn from_byte(byte: u8) -> Self {
                <$t>::from_ne_bytes([byte; size_of::<$t>()])
            }
            fn reference(dst: Self, src: Self, op: ReduceOp, divide_by: u32) -> Self {
                match op {
                    ReduceOp::Sum => dst.wrapping_add(src),
                    // Integer avg: the wrapped sum, divided with truncation toward zero.
                    ReduceOp::Avg => (dst.wrapping_add(src) as $wide / divide_by as $wide) as $t,
                    ReduceOp::Min => dst.min(src),
                    ReduceOp::Max => dst.max(src),
                    ReduceOp::Prod => dst.wrapping_mul(src),
                }
            }
            fn matches(got: Self, want: Self, _: ReduceOp) -> bool {
                got == want
            }
            const UNIT_ROUNDOFF: f64 = 0.0;
            const MIN_NORMAL: f64 = 0.0;
            fn to_f64(self) -> f64 {
                self as f64
            }
        }
    )*};
}
int_element!(i8 => i32, u8 => u32, i32 => i32, u32 => u32, i64 => i64, u64 => u64);

/// Distance in units in the last place between two floats given as sign-magnitude bits.
fn ulps(a: u64, b: u64, sign_bit: u64) -> u64 {
    let ordered = |x: u64| -> i128 { if x & sign_bit != 0 { -((x & !sign_bit) as i128) } else { x as i128 } };
    ordered(a).abs_diff(ordered(b)) as u64
}

/// Reference for floats, in f64: the exact combination rounded once at the end.
fn float_reference(dst: f64, src: f64, op: ReduceOp, divide_by: u32) -> f64 {
    match op {
        ReduceOp::Sum => dst + src,
        ReduceOp::Avg => (dst + src) / f64::from(divide_by),
        ReduceOp::Min => dst.min(src),
        ReduceOp::Max => dst.max(src),
        ReduceOp::Prod => dst * src,
    }
}

/// Allowed ulps between a kernel step and its reference. Min and max are exact. A sum or a
/// product of two values is correctly rounded either way: the kernel rounds once into its
/// accumulator (f32 for f16, bf16 and fp8, or the dtype itself) and once into
/// the dtype, the reference once into f64 and once into the dtype, and rounding twice gives
/// the correctly rounded result whenever the wider format has at least 2p + 2 bits for a
/// p-bit dtype (f32's 24 >= 2 * 11 + 2, f64's 53 >= 2 * 24 + 2). Only avg's last step, a
/// rounded sum times a rounded reciprocal, may differ.
fn allowed_ulps(op: ReduceOp) -> u64 {
    match op {
        ReduceOp::Min | ReduceOp::Max | ReduceOp::Prod | ReduceOp::Sum => 0,
        ReduceOp::Avg => 2,
    }
}

// f16, bf16 and fp8 round from f64 through f32: half's direct f64 conversion has a software
// fallback that drops low bits before rounding (it can miss a tie-breaking bit), while
// f64 -> f32 -> f16 is correctly rounded for every value a sum or product of two values of
// these types takes (each step keeps at least 2p + 2 bits). fp8 saturates, as its kernels do.
macro_rules! float_element {
    ($($t:ty: $to:expr, $from:expr, $bits:expr, $sign:expr, $u:expr, $min:expr);*) => {$(
        impl Reference for $t {
            fn random(rng: &mut SplitMix64) -> Self {
                $from(rng.next_f64_signed())
            }
            fn from_byte(byte: u8) -> Self {
                // Every bit pattern is a valid float (poison is often a NaN, which is the point).
                let bits = (0..size_of::<$t>()).fold(0u64, |acc, _| (acc << 8) | u64::from(byte));
                <$t>::from_bits(bits as _)
            }
            fn reference(dst: Self, src: Self, op: ReduceOp, divide_by: u32) -> Self {
                $from(float_reference($to(dst), $to(src), op, divide_by))
            }
            fn matches(got: Self, want: Self, op: ReduceOp) -> bool {
                // Specials by class: a NaN's sign and payload are the hardware's (the GPU's
                // is positive, the CPU's often negative), and next to the largest finite
                // value in code order lies infinity or NaN, which no ulp slack may accept.
                let (g, w) = ($to(got), $to(want));
                if g.is_nan() || w.is_nan() {
                    return g.is_nan() && w.is_nan();
                }
                if g.is_infinite() || w.is_infinite() {
                    return g == w;
                }
                ulps($bits(got), $bits(want), $sign) <= allowed_ulps(op)
            }
            const UNIT_ROUNDOFF: f64 = $u;
            const MIN_NORMAL: f64 = $min;
            fn to_f64(self) -> f64 {
                $to(self)
            }
        }
    )*};
}
float_element!(
    f32: f64::from, |v: f64| v as f32, |v: f32| u64::from(v.to_bits()), 1 << 31, f32::EPSILON as f64 / 2.0,
        f32::MIN_POSITIVE as f64;
    f64: |v: f64| v, |v: f64| v, |v: f64| v.to_bits(), 1 << 63, f64::EPSILON / 2.0, f64::MIN_POSITIVE;
    f16: f64::from, |v: f64| f16::from_f32(v as f32), |v: f16| u64::from(v.to_bits()), 1 << 15, 4.8828125e-4, 6.103515625e-5;
    bf16: f64::from, |v: f64| bf16::from_f32(v as f32), |v: bf16| u64::from(v.to_bits()), 1 << 15, 3.90625e-3, 1.1754943508222875e-38;
    F8E4M3: |v: F8E4M3| f64::from(v.to_f32()), |v: f64| F8E4M3::from_f32(v as f32), |v: F8E4M3| u64::from(v.to_bits()),
        1 << 7, 0.0625, 0.015625;
    F8E5M2: |v: F8E5M2| f64::from(v.to_f32()), |v: f64| F8E5M2::from_f32(v as f32), |v: F8E5M2| u64::from(v.to_bits()),
        1 << 7, 0.125, 6.103515625e-5
);

/// Worker threads for the parallel helpers.
pub fn threads() -> usize {
    std::thread::available_parallelism().map_or(4, |n| n.get()).min(32)
}

/// Fill `out` with fresh random values from `seed`, in parallel.
pub fn fill_random<T: Reference>(out: &mut [T], seed: u64) {
    let chunk = out.len().div_ceil(threads()).max(1 << 16);
    std::thread::scope(|scope| {
        for (i, part) in out.chunks_mut(chunk).enumerate() {
            scope.spawn(move || {
                let mut rng = SplitMix64::new(seed ^ (i as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93));
                part.iter_mut().for_each(|v| *v = T::random(&mut rng));
            });
        }
    });
}

/// Count the indices in `0..len` where `wrong(i)` describes a wrong element, in parallel;
/// also keep the first few descriptions. The one parallel checking loop every comparison
/// below shares.
fn count_where(len: usize, wrong: impl Fn(usize) -> Option<String> + Sync) -> (usize, Vec<String>) {
    let chunk = len.div_ceil(threads()).max(1 << 16);
    let wrong = &wrong;
    let parts: Vec<(usize, Vec<String>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..len.div_ceil(chunk))
            .map(|c| {
                scope.spawn(move || {
                    let (mut count, mut first) = (0, Vec::new());
                    for description in (c * chunk..((c + 1) * chunk).min(len)).filter_map(wrong) {
                        count += 1;
                        if first.len() < 4 {
                            first.push(description);
                        }
                    }
                    (count, first)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or((usize::MAX, vec!["checker thread panicked".into()]))).collect()
    });
    let count = parts.iter().map(|(w, _)| *w).fold(0, usize::saturating_add);
    (count, parts.into_iter().flat_map(|(_, f)| f).take(4).collect())
}

/// Count the elements where `got[i]` is not an acceptable `op(dst[i], src[i])`, in
/// parallel; also describes the first few. Lengths must be equal (else every element counts).
pub fn count_wrong<T: Reference>(
    got: &[T],
    dst: &[T],
    src: &[T],
    op: ReduceOp,
    divide_by: u32,
) -> (usize, Vec<String>) {
    if got.len() != dst.len() || got.len() != src.len() {
        return (
            got.len().max(1),
            vec![format!("lengths differ: got {}, dst {}, src {}", got.len(), dst.len(), src.len())],
        );
    }
    count_where(got.len(), |i| {
        let want = T::reference(dst[i], src[i], op, divide_by);
        (!T::matches(got[i], want, op))
            .then(|| format!("[{i}] {:?} {op} {:?} = {want:?}, got {:?}", dst[i], src[i], got[i]))
    })
}

/// Count the elements where `got[i]` is not an acceptable `want[i]` under `op` (the
/// tolerance of [`Reference::matches`]), in parallel; also describes the first few. Lengths
/// must be equal (else every element counts).
pub fn count_mismatched<T: Reference>(got: &[T], want: &[T], op: ReduceOp) -> (usize, Vec<String>) {
    if got.len() != want.len() {
        return (got.len().max(1), vec![format!("lengths differ: got {}, want {}", got.len(), want.len())]);
    }
    count_where(got.len(), |i| {
        (!T::matches(got[i], want[i], op)).then(|| format!("[{i}] want {:?}, got {:?}", want[i], got[i]))
    })
}

/// Count the elements where `got[i]` is not `op` folded over `inputs[r][i]` of every rank,
/// computed independently of any schedule, in parallel; also describes the first few.
///
/// Integers: the wrapping fold in rank order, exactly (integer sum, product, min and max do
/// not depend on the order; avg divides the wrapped sum by the number of ranks). Floats: the
/// fold in f64, and `got` within the rounding a fold of n values in the element type may
/// add, a bound that grows with n — for sum and avg (n + 1) units of roundoff of the sum of
/// magnitudes plus the smallest normal value (below it the spacing is fixed); for products (n + 1) units of the product, plus slack for intermediate
/// results below the normal range; min and max exactly.
pub fn count_wrong_vs_fold<T: Reference>(got: &[T], inputs: &[&[T]], op: ReduceOp) -> (usize, Vec<String>) {
    if inputs.iter().any(|v| v.len() != got.len()) {
        return (got.len().max(1), vec![format!("input lengths differ from the output's {}", got.len())]);
    }
    let n = inputs.len();
    count_where(got.len(), |i| {
        fold_matches(got[i], inputs.iter().map(|v| v[i]), n, op)
            .err()
            .map(|want| format!("[{i}] want {want}, got {:?}", got[i]))
    })
}

/// Whether `got` is `op` over `values` (n of them) as [`count_wrong_vs_fold`] defines it;
/// `Err` carries the wanted value, written out.
fn fold_matches<T: Reference>(
    got: T,
    mut values: impl Iterator<Item = T>,
    n: usize,
    op: ReduceOp,
) -> Result<(), String> {
    let Some(first) = values.next() else { return Ok(()) };
    if !T::DTYPE.is_float() {
        let step = if op == ReduceOp::Avg { ReduceOp::Sum } else { op };
        let mut acc = values.fold(first, |acc, v| T::reference(acc, v, step, 1));
        if op == ReduceOp::Avg {
            // The integer avg step: (acc + 0) / n, truncating as the kernels do.
            let zero = T::from_byte(0);
            acc = T::reference(acc, zero, ReduceOp::Avg, n as u32);
        }
        return if got == acc { Ok(()) } else { Err(format!("{acc:?}")) };
    }
    let first = first.to_f64();
    let (mut exact, mut magnitude) = (first, first.abs());
    // Avg folds as a sum and divides once at the end.
    let step = if op == ReduceOp::Avg { ReduceOp::Sum } else { op };
    for v in values.map(T::to_f64) {
        exact = float_reference(exact, v, step, 1);
        magnitude = if op == ReduceOp::Prod { magnitude * v.abs() } else { magnitude + v.abs() };
    }
    if op == ReduceOp::Avg {
        (exact, magnitude) = (exact / n as f64, magnitude / n as f64);
    }
    let rounding = (n as f64 + 1.0) * T::UNIT_ROUNDOFF;
    let bound = match op {
        ReduceOp::Min | ReduceOp::Max => 0.0,
        // Below the normal range the spacing stops shrinking: a rounding there may lose half
        // of it, MIN_NORMAL units of roundoff, whatever the magnitude (fp8's coarse subnormals
        // show it: e4m3's avg of -5 and 0 steps of 2^-9 is -2.5 steps, stored as -2).
        ReduceOp::Sum | ReduceOp::Avg => rounding * (magnitude + T::MIN_NORMAL),
        // Each partial product may also lose up to MIN_NORMAL below the normal range; later
        // factors (|x| < 2 in the suite's data) can scale that loss up.
        ReduceOp::Prod => rounding * magnitude + (n as f64) * 2f64.powi(n as i32) * T::MIN_NORMAL,
    };
    let got = got.to_f64();
    if (got - exact).abs() <= bound || (got.is_nan() && exact.is_nan()) {
        Ok(())
    } else {
        Err(format!("{exact:e} ± {bound:e}"))
    }
}

/// [`count_wrong`] as a result: `Err` says how many elements are wrong and shows the first.
pub fn check_reduce<T: Reference>(got: &[T], dst: &[T], src: &[T], op: ReduceOp, divide_by: u32) -> Result<(), String> {
    match count_wrong(got, dst, src, op, divide_by) {
        (0, _) => Ok(()),
        (wrong, first) => {
            Err(format!("{wrong} of {} elements wrong ({op}, divide_by {divide_by}): {}", got.len(), first.join("; ")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mismatches_are_counted_in_parallel_with_the_first_described() {
        let want: Vec<u32> = (0..300_000).collect();
        let mut got = want.clone();
        for i in [5, 70_000, 200_001, 299_999] {
            got[i] += 1;
        }
        let (wrong, first) = count_mismatched(&got, &want, ReduceOp::Sum);
        assert_eq!(wrong, 4);
        assert!(first[0].starts_with("[5] "), "{first:?}");
        assert_eq!(count_mismatched(&got[..3], &want, ReduceOp::Sum).0, 3, "lengths differ");
        assert_eq!(count_mismatched::<u32>(&[], &[], ReduceOp::Sum), (0, vec![]));
        let (dst, src) = (vec![1u8; 200_000], vec![2u8; 200_000]);
        let mut sums = vec![3u8; 200_000];
        sums[199_999] = 4;
        assert_eq!(count_wrong(&sums, &dst, &src, ReduceOp::Sum, 1).0, 1);
    }

    #[test]
    fn fold_reference_takes_rounding_and_refuses_errors() {
        let a = [1.0f32, 2.0, 3.0];
        let b = [0.5f32, -2.0, 1e-8];
        let sum = [1.5f32, 0.0, 3.0];
        assert_eq!(count_wrong_vs_fold(&sum, &[&a, &b], ReduceOp::Sum).0, 0);
        let off = [1.5f32, 0.0, 3.001];
        assert_eq!(count_wrong_vs_fold(&off, &[&a, &b], ReduceOp::Sum).0, 1);
        assert_eq!(count_wrong_vs_fold(&[1.0f32, -2.0, 1e-8], &[&a, &b], ReduceOp::Min).0, 1, "min is exact");
        let (x, y) = ([200u8, 7], [100u8, 9]);
        assert_eq!(count_wrong_vs_fold(&[22u8, 8], &[&x, &y], ReduceOp::Avg).0, 0, "(300 mod 256) / 2");
        assert_eq!(count_wrong_vs_fold(&[150u8, 8], &[&x, &y], ReduceOp::Avg).0, 1, "no widening");
        let h = [bf16::from_f32(1.0); 2];
        let four = [h.as_slice(); 4];
        assert_eq!(count_wrong_vs_fold(&[bf16::from_f32(1.0); 2], &four, ReduceOp::Avg).0, 0);
        assert_eq!(count_wrong_vs_fold(&[1.0f32], &[&a[..0], &a[..1]], ReduceOp::Sum).0, 1, "lengths");
        // e4m3 subnormals are 2^-9 apart: the avg of -5 and 0 steps is -2.5 steps, a tie
        // stored as -2 steps, half a step from the exact value whatever the magnitude.
        let step = 2f32.powi(-9);
        let (x, y) = ([F8E4M3::from_f32(-5.0 * step)], [F8E4M3::from_f32(0.0)]);
        assert_eq!(count_wrong_vs_fold(&[F8E4M3::from_f32(-2.0 * step)], &[&x, &y], ReduceOp::Avg).0, 0);
        assert_eq!(count_wrong_vs_fold(&[F8E4M3::from_f32(-6.0 * step)], &[&x, &y], ReduceOp::Avg).0, 1);
    }

    #[test]
    fn references_wrap_and_truncate_like_the_kernels() {
        assert_eq!(i8::reference(100, 100, ReduceOp::Sum, 1), -56);
        assert_eq!(u8::reference(200, 100, ReduceOp::Avg, 3), 14); // (300 mod 256) / 3
        assert_eq!(i32::reference(-7, 0, ReduceOp::Avg, 2), -3); // toward zero
        assert_eq!(u64::reference(u64::MAX, 2, ReduceOp::Prod, 1), u64::MAX - 1);
        assert_eq!(f32::reference(1.5, -2.0, ReduceOp::Min, 1), -2.0);
        assert_eq!(f64::reference(1.0, 2.0, ReduceOp::Avg, 4), 0.75);
    }

    #[test]
    fn float_tolerance_is_in_ulps() {
        let one = 1.0f32;
        let next = f32::from_bits(one.to_bits() + 1);
        assert!(f32::matches(next, one, ReduceOp::Avg));
        assert!(!f32::matches(next, one, ReduceOp::Sum), "sums are exact");
        assert!(!f32::matches(next, one, ReduceOp::Max));
        assert!(!f32::matches(1.0 + 1e-5, one, ReduceOp::Sum));
        assert!(f32::matches(-0.0, 0.0, ReduceOp::Max), "±0 are one ulp class apart at most");
        assert!(!bf16::matches(bf16::from_f32(1.5), bf16::from_f32(1.0), ReduceOp::Avg));
        // Specials by class: any NaN matches any NaN, infinity only itself, and the ulp slack
        // never reaches from the largest finite value to the code after it.
        assert!(F8E4M3::matches(F8E4M3::from_bits(0x7F), F8E4M3::from_bits(0xFF), ReduceOp::Sum));
        assert!(!F8E4M3::matches(F8E4M3::from_bits(0x7F), F8E4M3::from_bits(0x7E), ReduceOp::Avg));
        assert!(!F8E5M2::matches(F8E5M2::from_bits(0x7C), F8E5M2::from_bits(0x7B), ReduceOp::Avg));
        assert!(
            f32::matches(f32::NAN, -f32::NAN, ReduceOp::Prod) && !f32::matches(f32::INFINITY, f32::MAX, ReduceOp::Avg)
        );
    }

    /// The kernels' arithmetic, emulated on the CPU, meets the 0-ulp sum and product
    /// tolerance: f16, bf16 and fp8 go through f32 and back, f32 stays f32 — over random values
    /// spread across exponents, subnormals and mixed signs included.
    #[test]
    fn kernel_sums_and_products_are_correctly_rounded() {
        // Just above a tie: the bit that breaks it lies far below f16's precision.
        let (one, nudge) = (f16::from_f32(1.0), f16::from_f64(2f64.powi(-11) + 2f64.powi(-21)));
        assert_eq!(f16::reference(one, nudge, ReduceOp::Sum, 1), f16::from_f32(1.0 + 2f32.powi(-10)));
        let mut rng = SplitMix64::new(0x5EED);
        let value = |rng: &mut SplitMix64| {
            let scale = 2f64.powi((rng.next_u64() % 40) as i32 - 20);
            rng.next_f64_signed() * scale
        };
        for _ in 0..200_000 {
            let (a, b) = (value(&mut rng), value(&mut rng));
            for op in [ReduceOp::Sum, ReduceOp::Prod] {
                let in_f32 = |x: f32, y: f32| if op == ReduceOp::Sum { x + y } else { x * y };
                let (ha, hb) = (bf16::from_f64(a), bf16::from_f64(b));
                let kernel = bf16::from_f32(in_f32(ha.to_f32(), hb.to_f32()));
                assert!(bf16::matches(kernel, bf16::reference(ha, hb, op, 1), op), "bf16 {op:?} {ha} {hb}");
                let (ha, hb) = (f16::from_f64(a), f16::from_f64(b));
                let kernel = f16::from_f32(in_f32(ha.to_f32(), hb.to_f32()));
                assert!(f16::matches(kernel, f16::reference(ha, hb, op, 1), op), "f16 {op:?} {ha} {hb}");
                let (ha, hb) = (F8E4M3::from_f32(a as f32), F8E4M3::from_f32(b as f32));
                let kernel = F8E4M3::from_f32(in_f32(ha.to_f32(), hb.to_f32()));
                assert!(F8E4M3::matches(kernel, F8E4M3::reference(ha, hb, op, 1), op), "e4m3 {op:?} {ha:?} {hb:?}");
                let (ha, hb) = (F8E5M2::from_f32(a as f32), F8E5M2::from_f32(b as f32));
                let kernel = F8E5M2::from_f32(in_f32(ha.to_f32(), hb.to_f32()));
                assert!(F8E5M2::matches(kernel, F8E5M2::reference(ha, hb, op, 1), op), "e5m2 {op:?} {ha:?} {hb:?}");
                let (fa, fb) = (a as f32, b as f32);
                assert!(f32::matches(in_f32(fa, fb), f32::reference(fa, fb, op, 1), op), "f32 {op:?} {fa} {fb}");
            }
        }
    }

    /// The kernels' fp8 step, emulated (f32 arithmetic as `common.cuh` does it, min and max
    /// as fminf and fmaxf, avg's last step times the f32 reciprocal), meets the reference on
    /// every pair of codes under every op: specials, saturation and subnormals included.
    #[test]
    fn the_fp8_step_on_every_pair_of_codes_meets_the_reference() {
        fn every_pair<T: Reference>(load: impl Fn(T) -> f32, store: impl Fn(f32) -> T, from_bits: impl Fn(u8) -> T) {
            for op in ReduceOp::ALL {
                for divide_by in [1u32, 3] {
                    for (a, b) in (0..=u16::MAX).map(|i| (from_bits((i >> 8) as u8), from_bits(i as u8))) {
                        let (x, y) = (load(a), load(b));
                        let v = match op {
                            ReduceOp::Sum => x + y,
                            ReduceOp::Avg if divide_by == 1 => x + y,
                            ReduceOp::Avg => (x + y) * (1.0 / divide_by as f32),
                            ReduceOp::Min => x.min(y),
                            ReduceOp::Max => x.max(y),
                            ReduceOp::Prod => x * y,
                        };
                        let (got, want) = (store(v), T::reference(a, b, op, divide_by));
                        assert!(T::matches(got, want, op), "{op} {a:?} {b:?} / {divide_by}: {got:?}, want {want:?}");
                    }
                }
            }
        }
        every_pair(F8E4M3::to_f32, F8E4M3::from_f32, F8E4M3::from_bits);
        every_pair(F8E5M2::to_f32, F8E5M2::from_f32, F8E5M2::from_bits);
    }

    #[test]
    fn check_reduce_counts_every_wrong_element() {
        let dst = vec![1u32; 300_000];
        let src = vec![2u32; 300_000];
        let mut got = vec![3u32; 300_000];
        assert_eq!(check_reduce(&got, &dst, &src, ReduceOp::Sum, 1), Ok(()));
        got[7] = 0;
        got[299_999] = 9;
        let err = check_reduce(&got, &dst, &src, ReduceOp::Sum, 1).unwrap_err();
        assert!(err.starts_with("2 of 300000 elements wrong"), "{err}");
    }

    #[test]
    fn random_data_is_fresh_and_not_zero() {
        let mut a = vec![0f32; 1000];
        let mut b = vec![0f32; 1000];
        fill_random(&mut a, 1);
        fill_random(&mut b, 2);
        assert_ne!(a, b);
        assert!(a.iter().filter(|v| **v == 0.0).count() < 2);
        assert!(a.iter().all(|v| (-2.0..2.0).contains(v)));
    }
}
