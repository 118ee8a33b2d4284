//! `DType`: the element types the kernels are instantiated for.

use std::fmt;
use std::str::FromStr;

/// An element type every kernel family is instantiated for.
///
/// f16, bf16 and the two fp8 formats accumulate in f32 inside a kernel, so each output element
/// is rounded once; the fp8 formats ([`crate::fp8`]) saturate at their largest finite value,
/// as NCCL's fp8 reductions do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// 32-bit float.
    F32,
    /// 64-bit float.
    F64,
    /// IEEE 754 half precision.
    F16,
    /// bfloat16.
    BF16,
    /// Signed 8-bit integer.
    I8,
    /// Unsigned 8-bit integer.
    U8,
    /// Signed 32-bit integer.
    I32,
    /// Unsigned 32-bit integer.
    U32,
    /// Signed 64-bit integer.
    I64,
    /// Unsigned 64-bit integer.
    U64,
    /// fp8 e4m3 ([`crate::fp8::F8E4M3`]: no infinities, 448 at most).
    F8E4M3,
    /// fp8 e5m2 ([`crate::fp8::F8E5M2`]: with infinities, 57344 at most).
    F8E5M2,
}

/// A string that names no [`DType`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown dtype {given:?}: expected one of f32, f64, f16, bf16, i8, u8, i32, u32, i64, u64, f8e4m3, f8e5m2")]
pub struct UnknownDType {
    /// What was given.
    pub given: String,
}

impl DType {
    /// Every dtype, in a fixed order (the order of the kernel tables).
    pub const ALL: [DType; 12] = [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I8,
        DType::U8,
        DType::I32,
        DType::U32,
        DType::I64,
        DType::U64,
        DType::F8E4M3,
        DType::F8E5M2,
    ];

    /// Bytes per element.
    pub const fn size_bytes(self) -> usize {
        match self {
            DType::I8 | DType::U8 | DType::F8E4M3 | DType::F8E5M2 => 1,
            DType::F16 | DType::BF16 => 2,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F64 | DType::I64 | DType::U64 => 8,
        }
    }

    /// Short lowercase name, as in kernel names and on the command line.
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I8 => "i8",
            DType::U8 => "u8",
            DType::I32 => "i32",
            DType::U32 => "u32",
            DType::I64 => "i64",
            DType::U64 => "u64",
            DType::F8E4M3 => "f8e4m3",
            DType::F8E5M2 => "f8e5m2",
        }
    }

    /// Whether this is a floating-point type.
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::F16 | DType::BF16 | DType::F8E4M3 | DType::F8E5M2)
    }

    /// Position in [`DType::ALL`].
    pub const fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = UnknownDType;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        DType::ALL
            .into_iter()
            .find(|d| d.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| UnknownDType { given: s.to_owned() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_index_matches_all() {
        for (i, d) in DType::ALL.into_iter().enumerate() {
            assert_eq!(d.index(), i);
            assert_eq!(d.name().parse::<DType>(), Ok(d));
        }
        assert!("f8".parse::<DType>().is_err_and(|e| e.to_string().contains("\"f8\"")));
        assert_eq!("F8E4M3".parse::<DType>(), Ok(DType::F8E4M3));
        let json = serde_json::to_string(&DType::ALL).unwrap();
        assert!(json.ends_with(r#""u64","f8e4m3","f8e5m2"]"#), "{json}");
    }

    #[test]
    fn sizes_are_the_c_sizes() {
        let sizes: Vec<usize> = DType::ALL.iter().map(|d| d.size_bytes()).collect();
        assert_eq!(sizes, [4, 8, 2, 2, 1, 1, 4, 4, 8, 8, 1, 1]);
    }
}
