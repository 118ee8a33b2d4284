//! `gp2p bench codec`: the compressed all-reduce's codec kernels alone, every buffer in device
//! memory: the encode of a rank's values, the decode of a wire, the two-shot owner's fold and
//! encode of its shard, and the one-shot's fold and decode of every rank's wire. Each row counts
//! the bytes its kernel reads and writes against the device-to-device copy rate of the same run,
//! and is checked against the CPU reference's bits. Where a traced call's timeline shows a slow
//! encode, this tells whether the kernel is slow or the GPU waited for the host.

use clap::Args;
use geforce_p2p::cuda::codec::{WireFormat, decode, encode, fold_decode, fold_encode};
use geforce_p2p::kernels::compress::{
    BlockSize, Compressible, Format, Scheme, WireLayout, all_reduce_one_shot, decode_wire, encode_wire,
};
use geforce_p2p::kernels::reference::{Reference, fill_random};
use geforce_p2p::{DType, Device, DeviceBuffer, ReduceOp, Stream, half};

use super::compressed::count_unequal_bits;
use super::{CEILING_BYTES, Common, finish};
use crate::error::CliError;
use crate::flags::{CompressFlag, DTypeFlag};
use crate::measure::{Ceilings, Repeats, median_seconds};
use crate::report::{Report, Row};
use crate::sizes::format_size;
use crate::table::{num, table};

#[derive(Args)]
pub struct CodecArgs {
    #[command(flatten)]
    common: Common,
    /// Input type: f32, f16 or bf16.
    #[arg(long, value_enum, default_value = "bf16")]
    dtype: DTypeFlag,
    /// The codes' format.
    #[arg(long, value_enum, default_value = "int8")]
    format: CompressFlag,
    /// Values per block, one scale each: a power of two from 32 to 256.
    #[arg(long, default_value_t = 64)]
    block: usize,
    /// Ranks whose wires the folds read, 2 to 8.
    #[arg(long, default_value_t = 2)]
    ranks: usize,
    /// Device ordinal.
    #[arg(short = 'd', long, default_value_t = 0)]
    device: usize,
}

/// The kernels, in the order each size's rows come.
const KERNELS: [&str; 4] = ["encode", "decode", "fold-encode", "fold-decode"];

/// The largest size the bench takes: its CPU reference runs on one thread.
const MAX_BYTES: usize = 256 << 20;

pub fn run(args: &CodecArgs) -> Result<(), CliError> {
    if !(2..=8).contains(&args.ranks) {
        return Err(CliError::Usage(format!("--ranks {}: the folds read 2 to 8 wires", args.ranks)));
    }
    if args.common.end > MAX_BYTES {
        return Err(CliError::Usage(format!(
            "--end {}: every output is checked against a CPU reference of every rank's values, which above {} \
             takes minutes and gigabytes of host memory: pass -e {} or less (-b 1M -e 64M covers the all-reduce's pieces)",
            format_size(args.common.end),
            format_size(MAX_BYTES),
            format_size(MAX_BYTES)
        )));
    }
    let block = BlockSize::new(args.block).map_err(|e| CliError::Usage(format!("--block {}: {e}", args.block)))?;
    let scheme = Scheme { format: args.format.0, block };
    match args.dtype.0 {
        DType::F32 => run_typed::<f32>(args, scheme),
        DType::F16 => run_typed::<half::f16>(args, scheme),
        DType::BF16 => run_typed::<half::bf16>(args, scheme),
        other => Err(CliError::Usage(format!("--dtype {other}: the codec takes f32, f16 or bf16"))),
    }
}

fn run_typed<T: Compressible + Reference>(args: &CodecArgs, scheme: Scheme) -> Result<(), CliError> {
    let c = &args.common;
    let sizes = c.sizes()?;
    let repeats = c.repeats()?;
    let device = Device::open(args.device)?;
    let stream = c.stream(&device)?;
    eprintln!("measuring the device-to-device copy rate with {} copies ...", format_size(CEILING_BYTES));
    let mut ceilings = Ceilings::new(&device, &stream, CEILING_BYTES, repeats)?;
    let d2d = ceilings.d2d()?;
    let progress = super::progress(sizes.len() * KERNELS.len());
    let bench = CodecBench { device: &device, stream: &stream, scheme, ranks: args.ranks, repeats, d2d };
    let mut rows = Vec::new();
    for &bytes in &sizes {
        let n = bytes / size_of::<T>();
        if n == 0 {
            progress.inc(KERNELS.len() as u64);
            continue;
        }
        progress.set_message(format!("codec {} {}", T::DTYPE, format_size(bytes)));
        rows.extend(bench.size::<T>(n)?);
        progress.inc(KERNELS.len() as u64);
    }
    progress.finish_and_clear();
    let report = Report::new(&device, ceilings.measured.clone(), c.iters, rows)?.on_streams(c.stream.name());
    print_codec(&report, scheme, args.ranks);
    finish(&report, c, "codec")
}

struct CodecBench<'a> {
    device: &'a Device,
    stream: &'a Stream,
    scheme: Scheme,
    ranks: usize,
    repeats: Repeats,
    d2d: f64,
}

impl CodecBench<'_> {
    /// The four kernels' rows for `n` values: rank r's input fresh random values, rank 0 the
    /// fold's owner.
    fn size<T: Compressible + Reference>(&self, n: usize) -> Result<Vec<Row>, CliError> {
        let (stream, scheme, ranks) = (self.stream, self.scheme, self.ranks);
        let format = WireFormat { format: scheme.format, block: scheme.block };
        let layout = WireLayout { values: n, block: scheme.block };
        let inputs: Vec<Vec<T>> = (0..ranks)
            .map(|r| {
                let mut v = vec![T::from_f32(0.0); n];
                fill_random(&mut v, 0xC0DEC ^ ((r as u64) << 32) ^ n as u64);
                v
            })
            .collect();
        let values: Vec<Vec<f32>> = inputs.iter().map(|v| v.iter().map(|x| x.to_f32()).collect()).collect();
        let sources = inputs.iter().map(|v| DeviceBuffer::from_host(stream, v)).collect::<Result<Vec<_>, _>>()?;
        // Zeroed first: the encode writes the exact area only for blocks that travel exact, so
        // a wire then equals the reference's bytes, which are zero there too. Rank 0's is the
        // timed encode's; the others' are encoded here for the folds.
        let mut wires = Vec::with_capacity(ranks);
        for (r, source) in sources.iter().enumerate() {
            let mut wire = DeviceBuffer::<u8>::alloc(self.device, layout.bytes())?;
            wire.fill_bytes(stream, 0)?;
            if r > 0 {
                encode(stream, format, &source.view(..), &mut wire.view_mut(..))?;
            }
            wires.push(wire);
        }
        let mut out_wire = DeviceBuffer::<u8>::alloc(self.device, layout.bytes())?;
        out_wire.fill_bytes(stream, 0)?;
        let mut dst = DeviceBuffer::<T>::alloc(self.device, n)?;
        let reference_wires: Vec<Vec<u8>> =
            values.iter().map(|v| encode_wire(scheme.format, scheme.block, v)).collect();
        let decoded: Vec<f32> = decoded_values(scheme.format, scheme.block, n, &reference_wires[0]);
        let (value_bytes, wire_bytes) = (n * size_of::<T>(), layout.scaled_bytes());
        let mut rows = Vec::with_capacity(KERNELS.len());

        // Encode: rank 0's values into its wire (every timed run writes the same bytes), which
        // the decode and the folds then read.
        let t = self.time(|| encode(stream, format, &sources[0].view(..), &mut wires[0].view_mut(..)))?;
        let wrong = count_bytes_wrong(&wires[0].to_host_vec(stream)?, &reference_wires[0]);
        rows.push(self.row::<T>("encode", n, t, value_bytes + wire_bytes, wrong));

        // Decode: rank 0's wire into values.
        let t = self.time(|| decode(stream, format, &wires[0].view(..), &mut dst.view_mut(..)))?;
        let want: Vec<T> = decoded.iter().map(|&x| T::from_f32(x)).collect();
        let wrong = count_unequal_bits(&dst.to_host_vec(stream)?, &want);
        rows.push(self.row::<T>("decode", n, t, wire_bytes + value_bytes, wrong));

        // Fold and encode: rank 0 owns the shard, its values exact, every other rank's decoded.
        let views: Vec<_> = wires.iter().map(|w| w.view(..)).collect();
        let others: Vec<Option<&_>> = views.iter().enumerate().map(|(r, v)| (r != 0).then_some(v)).collect();
        let t = self.time(|| {
            fold_encode(stream, format, &sources[0].view(..), &others, 0, false, &mut out_wire.view_mut(..))
        })?;
        let folded = fold_in_rank_order(&values[0], &reference_wires[1..], scheme, n);
        let wrong =
            count_bytes_wrong(&out_wire.to_host_vec(stream)?, &encode_wire(scheme.format, scheme.block, &folded));
        rows.push(self.row::<T>("fold-encode", n, t, value_bytes + ranks * wire_bytes, wrong));

        // Fold and decode: every rank's wire, the one-shot's result.
        let every: Vec<&_> = views.iter().collect();
        let t = self.time(|| fold_decode(stream, format, &every, false, &mut dst.view_mut(..)))?;
        let slices: Vec<&[T]> = inputs.iter().map(Vec::as_slice).collect();
        let want = all_reduce_one_shot(&slices, ReduceOp::Sum, scheme)
            .map_err(|e| CliError::Wrong(format!("the one-shot's CPU reference refused the bench's inputs: {e}")))?
            .swap_remove(0);
        let wrong = count_unequal_bits(&dst.to_host_vec(stream)?, &want);
        rows.push(self.row::<T>("fold-decode", n, t, ranks * wire_bytes + value_bytes, wrong));
        Ok(rows)
    }

    fn time<E: Into<CliError>>(&self, mut op: impl FnMut() -> Result<(), E>) -> Result<f64, CliError> {
        median_seconds(self.stream, self.repeats, || Ok(()), || op().map_err(Into::into))
    }

    /// A row: `moved` the bytes the kernel reads and writes in device memory.
    fn row<T: Compressible>(&self, kernel: &str, n: usize, seconds: f64, moved: usize, wrong: usize) -> Row {
        let bytes = n * size_of::<T>();
        let busbw = moved as f64 / seconds / 1e9;
        Row {
            bench: "codec",
            route: kernel.to_string(),
            dtype: T::DTYPE.to_string(),
            op: "sum".to_string(),
            ranks: self.ranks,
            bytes,
            count: n,
            time_us: seconds * 1e6,
            algbw: bytes as f64 / seconds / 1e9,
            busbw,
            ceiling: self.d2d,
            ceiling_name: "d2d",
            ratio: busbw / self.d2d,
            enqueue_us: None,
            model_us: None,
            wrong,
            error: None,
        }
    }
}

/// The values of the wire of `n` values, as its decode computes them in f32.
fn decoded_values(format: Format, block: BlockSize, n: usize, wire: &[u8]) -> Vec<f32> {
    decode_wire(format, block, n, wire).iter().flat_map(|b| b.dequantize()).collect()
}

/// The owner's fold, in rank order: its own values exact (rank 0), then every other rank's
/// decoded from its wire, each sum rounded to f32 as the kernel rounds it.
fn fold_in_rank_order(own: &[f32], others: &[Vec<u8>], scheme: Scheme, n: usize) -> Vec<f32> {
    let mut acc = own.to_vec();
    for wire in others {
        for (a, x) in acc.iter_mut().zip(decoded_values(scheme.format, scheme.block, n, wire)) {
            *a += x;
        }
    }
    acc
}

fn count_bytes_wrong(got: &[u8], want: &[u8]) -> usize {
    got.iter().zip(want).filter(|(g, w)| g != w).count() + got.len().abs_diff(want.len())
}

fn print_codec(report: &Report, scheme: Scheme, ranks: usize) {
    let d2d = report.ceilings.get("d2d").copied().unwrap_or(f64::NAN);
    println!(
        "# gp2p bench codec --format {} --block {} --ranks {ranks} on {} ({}), medians of {} timed runs",
        scheme.format,
        scheme.block.get(),
        report.gpu.name,
        report.gpu.driver,
        report.repeats
    );
    println!(
        "# ceiling: d2d {d2d:.1} GB/s (a {} device-to-device copy, bytes read and written); GB/s = bytes the kernel \
         reads and writes in device memory a second, wires counted by their words and codes; the folds read {ranks} \
         ranks' inputs (the owner's values and {} wires; the one-shot's {ranks} wires); the inputs are random in \
         [-1, 1), so every block is scaled (none travels exact); #wrong per kernel = bytes of its wire (encode, \
         fold-encode) or values (decode, fold-decode) unlike the CPU reference's",
        format_size(CEILING_BYTES),
        ranks - 1
    );
    let mut head = vec!["size", "count", "type"];
    for kernel in KERNELS {
        head.extend([kernel, "GB/s", "/d2d"]);
    }
    head.push("#wrong");
    let mut t = table(&head, &[]);
    for group in report.rows.chunks(KERNELS.len()) {
        let first = &group[0];
        let mut cells = vec![format_size(first.bytes), first.count.to_string(), first.dtype.clone()];
        for row in group {
            cells.extend([num(row.time_us, 1), num(row.busbw, 1), num(row.ratio, 3)]);
        }
        cells.push(group.iter().map(|r| r.wrong.to_string()).collect::<Vec<_>>().join("/"));
        t.add_row(cells);
    }
    println!("{}", t.trim_fmt());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_fold_adds_every_decoded_wire_in_rank_order() {
        let scheme = Scheme { format: Format::Int8, block: BlockSize::new(32).unwrap() };
        let own: Vec<f32> = (0..70).map(|i| i as f32 * 0.25 - 3.0).collect();
        let other: Vec<f32> = (0..70).map(|i| 100.0 - i as f32).collect();
        let wire = encode_wire(scheme.format, scheme.block, &other);
        let folded = fold_in_rank_order(&own, std::slice::from_ref(&wire), scheme, 70);
        let decoded = decoded_values(scheme.format, scheme.block, 70, &wire);
        assert_eq!(decoded.len(), 70);
        for i in 0..70 {
            assert_eq!(folded[i].to_bits(), (own[i] + decoded[i]).to_bits(), "value {i}");
            // int8 in blocks of 32: within half a step of the block's largest magnitude / 127.
            assert!((decoded[i] - other[i]).abs() <= 100.0 / 127.0 / 2.0 + 1e-4, "value {i}: {}", decoded[i]);
        }
    }

    #[test]
    fn wrong_bytes_count_every_difference_and_a_length_apart() {
        assert_eq!(count_bytes_wrong(&[1, 2, 3], &[1, 2, 3]), 0);
        assert_eq!(count_bytes_wrong(&[1, 9, 3], &[1, 2, 3, 4]), 2);
    }
}
