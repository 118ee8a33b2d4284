use gp2p_cuda::codec::WireFormat;
use gp2p_kernels::ReduceOp;
use gp2p_kernels::compress::{BlockSize, Format, Scheme, all_reduce, decode_wire, encode_wire, shard_blocks};

use super::{MAX_ROUNDS, WIRE_ALIGN, WirePlan};

fn format(format: Format, block: usize) -> WireFormat {
    WireFormat { format, block: BlockSize::new(block).unwrap() }
}

/// Lengths around block and shard edges, and one long enough to need longer pieces.
const LENS: [usize; 9] = [0, 1, 31, 32, 33, 255, 8 * 256 + 3, 3 << 20, (40 << 20) + 77];

#[test]
fn pieces_cover_every_value_once_within_their_owner_s_shard_on_whole_blocks() {
    for ranks in 1..=8 {
        for len in LENS {
            for block in [32, 256] {
                let f = format(Format::Int8, block);
                let plan = WirePlan::new(len, ranks, f);
                let what = format!("{ranks} ranks, {len} values, blocks of {block}");
                let blocks = len.div_ceil(block);
                let mut covered = 0;
                let mut by_start: Vec<_> = plan.pieces.iter().collect();
                by_start.sort_by_key(|p| p.values.start);
                for p in &by_start {
                    assert_eq!(p.values.start, covered, "{what}: gap or overlap at {covered}");
                    covered = p.values.end;
                    assert!(!p.values.is_empty(), "{what}: an empty piece");
                    assert_eq!(p.values.start % block, 0, "{what}: a piece starts inside a block");
                    let shard = shard_blocks(blocks, ranks, p.owner);
                    assert!(
                        p.values.start >= shard.start * block && p.values.end <= (shard.end * block).min(len),
                        "{what}"
                    );
                    assert_eq!(p.wire_bytes, f.wire_bytes(p.values.len()), "{what}");
                }
                assert_eq!(covered, len, "{what}: values past the last piece");
                assert!(plan.rounds <= MAX_ROUNDS, "{what}: {} rounds", plan.rounds);
                for round in 0..plan.rounds {
                    let owners: Vec<usize> = plan.round(round).map(|p| p.owner).collect();
                    assert!(owners.windows(2).all(|w| w[0] < w[1]), "{what}: round {round} owners {owners:?}");
                }
            }
        }
    }
}

#[test]
fn wires_are_aligned_apart_and_inside_the_plan_s_bytes() {
    for ranks in [2, 3, 8] {
        for len in LENS {
            let plan = WirePlan::new(len, ranks, format(Format::Fp8E4m3, 64));
            let mut ups: Vec<(usize, usize)> = Vec::new();
            let mut downs: Vec<(usize, usize)> = Vec::new();
            for p in &plan.pieces {
                assert_eq!(p.up[p.owner], None, "the owner sends nothing up");
                for (r, up) in p.up.iter().enumerate() {
                    assert_eq!(up.is_some(), r != p.owner);
                }
                for start in p.up.iter().flatten() {
                    ups.push((*start, start + p.wire_bytes));
                }
                downs.push((p.down, p.down + p.wire_bytes));
            }
            for (spans, bytes) in [(&mut ups, plan.up_bytes), (&mut downs, plan.down_bytes)] {
                spans.sort_unstable();
                assert!(spans.iter().all(|s| s.0 % WIRE_ALIGN == 0), "{ranks} ranks, {len}: a wire unaligned");
                assert!(spans.windows(2).all(|w| w[0].1 <= w[1].0), "{ranks} ranks, {len}: wires overlap");
                assert!(spans.last().is_none_or(|s| s.1 <= bytes), "{ranks} ranks, {len}: a wire past its area");
            }
        }
    }
}

/// The plan's steps run on the CPU (the codec's CPU twin for the kernels) give the
/// reference's bits: pieces keep each block's owner and never split a block.
#[test]
fn running_the_plan_gives_the_reference_s_bits() {
    for ranks in 2..=5 {
        for (len, block, fmt) in
            [(1000, 32, Format::Int8), (3 * 256 + 77, 256, Format::Fp8E4m3), (5000, 64, Format::Int8)]
        {
            for op in [ReduceOp::Sum, ReduceOp::Avg] {
                let f = format(fmt, block);
                let inputs: Vec<Vec<f32>> = (0..ranks)
                    .map(|r| (0..len).map(|i| ((i * 7919 + r * 104_729) % 2001) as f32 / 37.0 - 27.0).collect())
                    .collect();
                let refs: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
                let want = all_reduce(&refs, op, Scheme { format: fmt, block: f.block }).unwrap();
                let plan = WirePlan::new(len, ranks, f);
                let (mut up_area, mut down_area) = (vec![0u8; plan.up_bytes], vec![0u8; plan.down_bytes]);
                for p in &plan.pieces {
                    for (r, up) in p.up.iter().enumerate() {
                        if let Some(at) = up {
                            let wire = encode_wire(fmt, f.block, &inputs[r][p.values.clone()]);
                            up_area[*at..*at + wire.len()].copy_from_slice(&wire);
                        }
                    }
                }
                let dequantized = |host: &[u8], at: usize, n: usize| -> Vec<f32> {
                    decode_wire(fmt, f.block, n, &host[at..]).iter().flat_map(|b| b.dequantize()).collect()
                };
                let mut downs = Vec::new();
                for p in &plan.pieces {
                    let n = p.values.len();
                    let mut folded: Vec<f32> = Vec::new();
                    for (r, input) in inputs.iter().enumerate() {
                        let part = if r == p.owner {
                            input[p.values.clone()].to_vec()
                        } else {
                            dequantized(&up_area, p.up[r].unwrap(), n)
                        };
                        if r == 0 {
                            folded = part;
                        } else {
                            folded.iter_mut().zip(part).for_each(|(a, v)| *a += v);
                        }
                    }
                    if op == ReduceOp::Avg {
                        let reciprocal = 1.0 / ranks as f32;
                        folded.iter_mut().for_each(|a| *a *= reciprocal);
                    }
                    downs.push((p.down, encode_wire(fmt, f.block, &folded)));
                }
                for (at, wire) in downs {
                    down_area[at..at + wire.len()].copy_from_slice(&wire);
                }
                let mut out = vec![f32::NAN; len];
                for p in &plan.pieces {
                    out[p.values.clone()].copy_from_slice(&dequantized(&down_area, p.down, p.values.len()));
                }
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&out), bits(&want[0]), "{ranks} ranks, {len} values, {fmt} blocks of {block}, {op}");
            }
        }
    }
}
