//! The enum-valued flags (`--route`, `--receive`, `--algorithm`, `--op`, `--dtype`,
//! `--stream`, `--compress`) as clap
//! [`ValueEnum`]s, so `--help` lists the allowed values and clap refuses others.
//!
//! Each flag wraps the library's own type, and its values and their names are the library's
//! (`ALL`, `name()`): the CLI keeps no second list of names that could drift from what the
//! reports print and the library parses.

use clap::ValueEnum;
use clap::builder::PossibleValue;
use geforce_p2p::collectives::cost::Algorithm;
use geforce_p2p::kernels::compress::Format;
use geforce_p2p::{DType, Receive, ReduceOp, Route};

/// Implements [`ValueEnum`] for `$flag($lib)`, one value per element of `$all` (a constant
/// array of `$lib`), named by `$lib::name`.
macro_rules! value_enum {
    ($(#[$doc:meta])* $flag:ident($lib:ty) = $all:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct $flag(pub $lib);

        impl $flag {
            /// Every value, in the library's order (which `--help` keeps).
            const VALUES: [$flag; $all.len()] = {
                let all = $all;
                let mut values = [$flag(all[0]); $all.len()];
                let mut i = 1;
                while i < all.len() {
                    values[i] = $flag(all[i]);
                    i += 1;
                }
                values
            };
        }

        impl ValueEnum for $flag {
            fn value_variants<'a>() -> &'a [Self] {
                &Self::VALUES
            }

            fn to_possible_value(&self) -> Option<PossibleValue> {
                Some(PossibleValue::new(self.0.name()))
            }
        }
    };
}

value_enum!(
    /// `--route`: how a copy travels.
    RouteFlag(Route) = Route::ALL
);
value_enum!(
    /// `--receive`: how a collective folds what lands in its slots.
    ReceiveFlag(Receive) = Receive::ALL
);
value_enum!(
    /// `--algorithm`: the all-reduce a communicator runs (the ring only in one process).
    AlgorithmFlag(Algorithm) = Algorithm::ALL
);
value_enum!(
    /// `--op`: the reduction.
    OpFlag(ReduceOp) = ReduceOp::ALL
);
value_enum!(
    /// `--dtype`: the element type.
    DTypeFlag(DType) = DType::ALL
);

value_enum!(
    /// `--compress`: the format a compressed all-reduce's codes travel in.
    CompressFlag(Format) = Format::ALL
);

/// `--dtype` where `all` (every dtype in turn) is allowed too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DTypes(pub Option<DType>);

impl DTypes {
    /// `all`, then every dtype.
    const VALUES: [DTypes; DType::ALL.len() + 1] = {
        let mut values = [DTypes(None); DType::ALL.len() + 1];
        let mut i = 0;
        while i < DType::ALL.len() {
            values[i + 1] = DTypes(Some(DType::ALL[i]));
            i += 1;
        }
        values
    };

    /// The dtypes to run.
    pub fn list(self) -> Vec<DType> {
        self.0.map_or_else(|| DType::ALL.to_vec(), |d| vec![d])
    }
}

impl ValueEnum for DTypes {
    fn value_variants<'a>() -> &'a [Self] {
        &Self::VALUES
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        Some(match self.0 {
            None => PossibleValue::new("all").help("every dtype in turn"),
            Some(d) => PossibleValue::new(d.name()),
        })
    }
}

/// `--stream`: which streams a bench enqueues on (a choice of the CLI's, named once here for
/// both `--help` and the JSON report).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamFlag {
    /// A new non-blocking stream per device.
    Own,
    /// Each device's legacy default stream.
    Legacy,
}

impl StreamFlag {
    const VALUES: [StreamFlag; 2] = [StreamFlag::Own, StreamFlag::Legacy];

    /// The value's name, as `--stream` takes it and the JSON report records it.
    pub fn name(self) -> &'static str {
        match self {
            StreamFlag::Own => "own",
            StreamFlag::Legacy => "legacy",
        }
    }
}

impl ValueEnum for StreamFlag {
    fn value_variants<'a>() -> &'a [Self] {
        &Self::VALUES
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        Some(match self {
            StreamFlag::Own => PossibleValue::new(self.name()).help("a new non-blocking stream per device"),
            StreamFlag::Legacy => PossibleValue::new(self.name()).help("each device's legacy default stream"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every value parses (case-insensitively, as the library's `FromStr` does) to the
    /// library value of the same name, and every library value is offered.
    fn round_trips<F: ValueEnum + Copy + PartialEq + std::fmt::Debug>(lib_count: usize) {
        assert_eq!(F::value_variants().len(), lib_count);
        for v in F::value_variants() {
            let name = v.to_possible_value().map(|p| p.get_name().to_owned()).unwrap_or_default();
            assert_eq!(F::from_str(&name, false).ok(), Some(*v), "{name}");
            assert_eq!(F::from_str(&name.to_uppercase(), true).ok(), Some(*v), "{name}");
        }
    }

    #[test]
    fn every_library_value_is_a_flag_value_under_its_library_name() {
        round_trips::<RouteFlag>(Route::ALL.len());
        round_trips::<ReceiveFlag>(Receive::ALL.len());
        round_trips::<AlgorithmFlag>(Algorithm::ALL.len());
        round_trips::<OpFlag>(ReduceOp::ALL.len());
        round_trips::<DTypeFlag>(DType::ALL.len());
        round_trips::<DTypes>(DType::ALL.len() + 1);
        round_trips::<CompressFlag>(Format::ALL.len());
        round_trips::<StreamFlag>(2);
        assert_eq!(ReceiveFlag::from_str("zero-copy", false).map(|f| f.0.name()), Ok("zero-copy"));
        assert_eq!(DTypes::from_str("all", false).map(DTypes::list), Ok(DType::ALL.to_vec()));
        assert_eq!(DTypes::from_str("bf16", false).map(DTypes::list), Ok(vec![DType::BF16]));
        assert!(OpFlag::from_str("mean", false).is_err());
    }
}
