//! `Element`: the Rust types that carry each [`DType`] on the host.

use crate::DType;
use crate::fp8::{F8E4M3, F8E5M2};

mod sealed {
    pub trait Sealed {}
}

/// A host type whose values the kernels can read and write: plain old data of a [`DType`],
/// valid for every bit pattern, so bytes copied back from a GPU are always a valid value.
///
/// Sealed: implemented for `f32`, `f64`, [`half::f16`], [`half::bf16`], `i8`, `u8`, `i32`,
/// `u32`, `i64`, `u64`, [`F8E4M3`] and [`F8E5M2`].
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
    u8 => U8, i32 => I32, u32 => U32, i64 => I64, u64 => U64, F8E4M3 => F8E4M3, F8E5M2 => F8E5M2,
);

/// Evaluate `body` with the type name `T` (any name given) standing for the [`Element`] of
/// `dtype`: the one place a runtime [`DType`] becomes a type, so a new dtype is added to
/// every such dispatch at once.
///
/// ```
/// use gp2p_kernels::{DType, Element, with_element};
///
/// fn size_of_element<E: Element>() -> usize {
///     size_of::<E>()
/// }
/// for dtype in DType::ALL {
///     assert_eq!(with_element!(dtype, |T| size_of_element::<T>()), dtype.size_bytes());
/// }
/// ```
#[macro_export]
macro_rules! with_element {
    ($dtype:expr, |$t:ident| $body:expr) => {
        match $dtype {
            $crate::DType::F32 => {
                type $t = f32;
                $body
            }
            $crate::DType::F64 => {
                type $t = f64;
                $body
            }
            $crate::DType::F16 => {
                type $t = $crate::half::f16;
                $body
            }
            $crate::DType::BF16 => {
                type $t = $crate::half::bf16;
                $body
            }
            $crate::DType::I8 => {
                type $t = i8;
                $body
            }
            $crate::DType::U8 => {
                type $t = u8;
                $body
            }
            $crate::DType::I32 => {
                type $t = i32;
                $body
            }
            $crate::DType::U32 => {
                type $t = u32;
                $body
            }
            $crate::DType::I64 => {
                type $t = i64;
                $body
            }
            $crate::DType::U64 => {
                type $t = u64;
                $body
            }
            $crate::DType::F8E4M3 => {
                type $t = $crate::fp8::F8E4M3;
                $body
            }
            $crate::DType::F8E5M2 => {
                type $t = $crate::fp8::F8E5M2;
                $body
            }
        }
    };
}
