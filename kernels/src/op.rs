//! `ReduceOp`: the reductions every collective and reduce kernel supports.

use std::fmt;
use std::str::FromStr;

/// How two elements are combined.
///
/// - `Sum` and `Prod` wrap on integer overflow (two's complement), as NCCL does.
/// - `Min` and `Max` on floats follow IEEE `fmin`/`fmax`: a NaN on one side yields the other.
/// - `Avg` is a sum whose last step divides by the number of contributions. On floats it
///   multiplies by the reciprocal in the element's accumulation precision (f32 for f16/bf16);
///   on integers it divides the wrapped sum and truncates toward zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReduceOp {
    /// Sum.
    Sum,
    /// Arithmetic mean over the contributions.
    Avg,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
    /// Product.
    Prod,
}

/// A string that names no [`ReduceOp`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown reduce op {given:?}: expected one of sum, avg, min, max, prod")]
pub struct UnknownReduceOp {
    /// What was given.
    pub given: String,
}

impl ReduceOp {
    /// Every op, in the order of the kernel tables.
    pub const ALL: [ReduceOp; 5] = [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Min, ReduceOp::Max, ReduceOp::Prod];

    /// Short lowercase name, as in kernel names and on the command line.
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Avg => "avg",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Prod => "prod",
        }
    }

    /// Position in [`ReduceOp::ALL`].
    pub const fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ReduceOp {
    type Err = UnknownReduceOp;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ReduceOp::ALL
            .into_iter()
            .find(|o| o.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| UnknownReduceOp { given: s.to_owned() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for (i, op) in ReduceOp::ALL.into_iter().enumerate() {
            assert_eq!(op.index(), i);
            assert_eq!(op.name().parse::<ReduceOp>(), Ok(op));
        }
        assert!("mean".parse::<ReduceOp>().is_err_and(|e| e.to_string().contains("avg")));
    }
}
