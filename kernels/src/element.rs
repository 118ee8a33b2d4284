//! `Element`: the Rust types that carry each [`DType`] on the host.

use crate::DType;

mod sealed {
    pub trait Sealed {}
}

/// A host type whose values the kernels can read and write: plain old data of a [`DType`],
/// valid for every bit pattern, so bytes copied back from a GPU are always a valid value.
///
/// Sealed: implemented for `f32`, `f64`, [`half::f16`], [`half::bf16`], `i8`, `u8`, `i32`,
/// `u32`, `i64` and `u64`.
pub trait Element: sealed::Sealed + Copy + Send + Sync + std::fmt::Debug + PartialEq + 'static {
    /// The kernels' name for this type.
    const DTYPE: DType;
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$d;
        }
        const _: () = assert!(std::mem::size_of::<$t>() == DType::$d.size_bytes());
    )*};
}

element!(
    f32 => F32, f64 => F64, half::f16 => F16, half::bf16 => BF16, i8 => I8,
    u8 => U8, i32 => I32, u32 => U32, i64 => I64, u64 => U64,
);
