//! What the benches of the compressed all-reduce share (`bench all-reduce --compress` on the
//! in-process engine, `bench comm all-reduce --compress` on the communicator): the flags and
//! their checks, the CPU reference every result must equal bit for bit, and the error columns
//! against the exact result.

use clap::Args;
use geforce_p2p::collectives::WireFormat;
use geforce_p2p::comm::Communicator;
use geforce_p2p::comm::compression::ONE_SHOT_MAX_VALUES;
use geforce_p2p::kernels::compress::{self, BlockSize, Scheme, Shots, WireLayout};
use geforce_p2p::kernels::fp8::{F8E4M3, F8E5M2};
use geforce_p2p::kernels::reference::Reference;
use geforce_p2p::{DType, ReduceOp, half};

use crate::error::CliError;
use crate::flags::CompressFlag;
use crate::report::Deviation;

#[derive(Args, Debug, Clone, Copy)]
pub struct CompressArgs {
    /// All-reduce only: the compressed all-reduce, its values sent as one-byte codes in this
    /// format (sum or avg of f32, f16 or bf16); the rows add its error against the exact sum.
    #[arg(long, value_enum)]
    compress: Option<CompressFlag>,
    /// Values per block of --compress, one scale each: a power of two from 32 to 256.
    #[arg(long, default_value_t = 64, requires = "compress")]
    block: usize,
}

impl CompressArgs {
    /// The wire format `--compress` asks for, if any: checked against the collective (named
    /// `collective`, an all-reduce or not), op and type before anything runs.
    pub fn wire_format(
        &self,
        collective: &str,
        all_reduce: bool,
        op: ReduceOp,
        dtype: DType,
    ) -> Result<Option<WireFormat>, CliError> {
        let Some(format) = self.compress else { return Ok(None) };
        let usage = |why: String| Err(CliError::Usage(format!("--compress {}: {why}", format.0)));
        if !all_reduce {
            return usage(format!("only all-reduce is compressed, not {collective}"));
        }
        if !matches!(op, ReduceOp::Sum | ReduceOp::Avg) {
            return usage(format!("takes --op sum or avg, not {op}"));
        }
        if !matches!(dtype, DType::F32 | DType::F16 | DType::BF16) {
            return usage(format!("takes --dtype f32, f16 or bf16, not {dtype}"));
        }
        let block = BlockSize::new(self.block).map_err(|e| CliError::Usage(format!("--block {}: {e}", self.block)))?;
        Ok(Some(WireFormat { format: format.0, block }))
    }
}

/// What the benches need of an element type beyond the exact collectives: the compressed
/// all-reduce's CPU reference, for the three types it takes (None for the others, which
/// [`CompressArgs::wire_format`] refuses first).
pub trait Compressed: Reference {
    /// The reference's result on every rank for `shots` (the in-process engine runs the
    /// two-shot; a communicator says which it runs).
    fn compressed_reference(inputs: &[Vec<Self>], op: ReduceOp, scheme: Scheme, shots: Shots)
    -> Option<Vec<Vec<Self>>>;
}

macro_rules! compressed {
    (some: $($t:ty),*; none: $($u:ty),*) => {
        $(impl Compressed for $t {
            fn compressed_reference(
                inputs: &[Vec<Self>],
                op: ReduceOp,
                scheme: Scheme,
                shots: Shots,
            ) -> Option<Vec<Vec<Self>>> {
                let refs: Vec<&[Self]> = inputs.iter().map(Vec::as_slice).collect();
                compress::all_reduce_by(&refs, op, scheme, shots).ok()
            }
        })*
        $(impl Compressed for $u {
            fn compressed_reference(_: &[Vec<Self>], _: ReduceOp, _: Scheme, _: Shots) -> Option<Vec<Vec<Self>>> {
                None
            }
        })*
    };
}
compressed!(some: f32, half::f16, half::bf16; none: f64, i8, u8, i32, u32, i64, u64, F8E4M3, F8E5M2);

/// `gp2p bench comm`'s header line for compressed rows: the shots `comm` runs, from the
/// shortest buffer to the longest, and what the columns count.
pub fn comm_compressed_header(comm: &Communicator) -> String {
    let shots = match (comm.compressed_shots(0), comm.compressed_shots(usize::MAX)) {
        (Shots::One, Shots::One) => {
            "one-shot (each rank's wire up once, the other's down once, one rounding of each input)".to_string()
        }
        (Shots::One, Shots::Two) => format!(
            "one-shot up to {} Mi values (each rank's wire up once, the other's down once, one rounding of each \
             input), two-shot above (each shard's wires to its owner, the fold's back, two roundings)",
            ONE_SHOT_MAX_VALUES >> 20
        ),
        _ => "two-shot (each shard's wires to its owner, the fold's back, two roundings)".to_string(),
    };
    format!(
        "# compressed: {shots}; the bound counts the wire's scales and codes, not the buffer; #wrong counts values \
         whose bits differ from the CPU reference's; max rel err = largest |result - exact| over the largest \
         |exact|, rms rel err = RMS(result - exact) / RMS(exact), exact in f64 (rank 0's result)"
    )
}

/// Bytes of a wire of `len` values that cross a link where no block travels exact: its
/// scales and codes (the rest of its room holds exact blocks, written only where they occur).
pub fn scaled_wire_bytes(format: WireFormat, len: usize) -> usize {
    WireLayout { values: len, block: format.block }.scaled_bytes()
}

/// Elements of `got` whose bits differ from `want`'s (NaN equal to NaN).
pub fn count_unequal_bits<T: Reference>(got: &[T], want: &[T]) -> usize {
    let same = |a: f64, b: f64| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
    got.iter().zip(want).filter(|(a, b)| !same(a.to_f64(), b.to_f64())).count()
}

/// The results in `outputs` against the exact sum (or average) of the inputs, in f64.
pub fn deviation_from_exact<T: Reference>(inputs: &[Vec<T>], outputs: &[Vec<T>], op: ReduceOp) -> Deviation {
    let divide = if op == ReduceOp::Avg { inputs.len() as f64 } else { 1.0 };
    let exact: Vec<f64> =
        (0..inputs[0].len()).map(|i| inputs.iter().map(|v| v[i].to_f64()).sum::<f64>() / divide).collect();
    Deviation::of(outputs.iter().flat_map(|out| out.iter().zip(&exact).map(|(g, e)| (g.to_f64(), *e))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &[&str]) -> CompressArgs {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: CompressArgs,
            #[arg(long, default_value = "sum")]
            op: String,
            #[arg(long, default_value = "f32")]
            dtype: String,
        }
        let line = std::iter::once("bench").chain(line.iter().copied());
        <Cli as clap::Parser>::try_parse_from(line).unwrap().args
    }

    #[test]
    fn compress_is_refused_where_it_does_not_apply_naming_why() {
        let format = args(&["--compress", "fp8", "--block", "128"])
            .wire_format("all_reduce", true, ReduceOp::Avg, DType::BF16)
            .unwrap()
            .unwrap();
        assert_eq!((format.format.name(), format.block.get()), ("fp8", 128));
        assert_eq!(args(&[]).wire_format("all_reduce", true, ReduceOp::Max, DType::F32).unwrap(), None);
        for (line, all_reduce, op, dtype, says) in [
            (&["--compress", "int8"][..], false, ReduceOp::Sum, DType::F32, "only all-reduce is compressed, not x"),
            (&["--compress", "int8"], true, ReduceOp::Max, DType::F32, "takes --op sum or avg, not max"),
            (&["--compress", "int8"], true, ReduceOp::Sum, DType::I32, "takes --dtype f32, f16 or bf16, not i32"),
            (&["--compress", "int8", "--block", "48"], true, ReduceOp::Sum, DType::F32, "--block 48"),
        ] {
            let e = args(line).wire_format("x", all_reduce, op, dtype).unwrap_err().to_string();
            assert!(e.contains(says), "{line:?}: {e}");
        }
    }

    #[test]
    fn a_wire_crosses_the_link_as_its_scales_and_codes() {
        let format = WireFormat { format: compress::Format::Int8, block: BlockSize::new(64).unwrap() };
        assert_eq!(scaled_wire_bytes(format, 1 << 20), (1 << 20) + 4 * (1 << 14));
        assert!(format.wire_bytes(1 << 20) > 5 << 20, "the room holds the exact area too");
    }

    #[test]
    fn the_error_columns_measure_against_the_exact_sum() {
        let inputs = vec![vec![1.0f32, -2.0, 0.5, 4.0], vec![1.0f32, 2.0, 0.5, 4.0]];
        let exact_sum = [2.0f64, 0.0, 1.0, 8.0];
        let mut outputs = vec![exact_sum.map(|x| x as f32).to_vec(); 2];
        let none = deviation_from_exact(&inputs, &outputs, ReduceOp::Sum);
        assert_eq!((none.max_relative, none.rms_relative), (0.0, 0.0));
        outputs[1][3] = 8.5;
        let one = deviation_from_exact(&inputs, &outputs, ReduceOp::Sum);
        assert_eq!(one.max_relative, 0.5 / 8.0);
        let rms_exact = (2.0 * (4.0 + 0.0 + 1.0 + 64.0) / 8.0f64).sqrt();
        let rms_err = (0.25 / 8.0f64).sqrt();
        assert!((one.rms_relative - rms_err / rms_exact).abs() < 1e-12, "{one:?}");
        let avg = deviation_from_exact(&inputs, &outputs, ReduceOp::Avg);
        assert!(avg.max_relative > 0.9, "the average is half the sum: {avg:?}");
        assert_eq!(count_unequal_bits(&[f32::NAN, 1.0, -0.0], &[f32::NAN, 1.0, 0.0]), 1, "NaN is NaN; -0 is not 0");
    }
}
