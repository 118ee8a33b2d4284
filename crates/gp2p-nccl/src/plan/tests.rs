//! The plans on the host: argument checks, and a model that runs every rank's steps with
//! sends that wait for their receive (the strictest the communicator can be: a message larger
//! than its slots) and collectives that wait for every rank, moving real bytes.

use std::collections::HashMap;

use proptest::prelude::*;

use super::*;

const F32: DataType = DataType::Float32;
const U8: DataType = DataType::Uint8;

fn err(call: Call, rank: usize, world: usize) -> String {
    call.check(rank, world).expect_err("refused").to_string()
}

#[test]
fn bad_arguments_are_refused_by_name() {
    let ar = |send, recv| Call::AllReduce { send, recv, count: 256, dtype: F32, op: Op::Builtin(ReduceOp::Sum) };
    assert!(ar(0x1000, 0x1000).check(0, 2).is_ok(), "in place");
    assert!(ar(0x1000, 0x2000).check(0, 2).is_ok(), "apart");
    assert!(err(ar(0x1000, 0x1100), 0, 2).starts_with("recvbuff: [0x1100, +1024) overlaps"));
    assert!(err(ar(0, 0x2000), 0, 2).starts_with("sendbuff: null"));
    let huge = Call::AllReduce { send: 1, recv: 2, count: usize::MAX / 2, dtype: F32, op: Op::Builtin(ReduceOp::Sum) };
    assert!(err(huge, 0, 2).starts_with("count:"));
    let b = Call::Broadcast { send: 0, recv: 0x1000, count: 4, dtype: F32, root: 2 };
    assert_eq!(err(b, 0, 2), "root: 2 is not below nranks 2");
    let s = Call::Send { send: 0x1000, count: 4, dtype: F32, peer: 5 };
    assert_eq!(err(s, 0, 4), "peer: 5 is not below nranks 4");
    // A non-root's broadcast source and a non-root's reduce output may be null.
    assert!(Call::Broadcast { send: 0, recv: 0x1000, count: 4, dtype: F32, root: 1 }.check(0, 2).is_ok());
    let reduce = Call::Reduce { send: 0x1000, recv: 0, count: 4, dtype: F32, op: Op::Builtin(ReduceOp::Max), root: 1 };
    assert!(reduce.check(0, 2).is_ok());
    assert!(err(reduce, 1, 2).starts_with("recvbuff: null"));
}

#[test]
fn in_place_forms_are_nccl_s_and_other_overlaps_are_refused() {
    let bytes = 64 * 4;
    let ag = |send| Call::AllGather { send, recv: 0x10000, count: 64, dtype: F32 };
    assert!(ag(0x10000 + 2 * bytes as u64).check(2, 4).is_ok());
    assert!(ag(0x10000 + bytes as u64).check(2, 4).is_err(), "another rank's part");
    let rs = |recv| Call::ReduceScatter { send: 0x10000, recv, count: 64, dtype: F32, op: Op::Builtin(ReduceOp::Sum) };
    assert!(rs(0x10000 + 3 * bytes as u64).check(3, 4).is_ok());
    assert!(rs(0x10000).check(3, 4).is_err());
    let a2a = |recv| Call::AlltoAll { send: 0x10000, recv, count: 64, dtype: F32 };
    assert!(a2a(0x10000).check(0, 2).is_ok(), "one buffer is all-to-all's in-place form");
    assert!(err(a2a(0x10000 + bytes as u64), 0, 2).contains("ncclAlltoAll's in-place form"));
}

#[test]
fn every_type_is_reduced_and_moved_fp8_included() {
    for fp8 in [DataType::Float8e4m3, DataType::Float8e5m2] {
        let ar = Call::AllReduce { send: 0x100, recv: 0x100, count: 8, dtype: fp8, op: Op::Builtin(ReduceOp::Sum) };
        assert!(ar.check(0, 2).is_ok());
        let premul =
            Call::AllReduce { send: 0x100, recv: 0x100, count: 8, dtype: fp8, op: Op::PreMulSum(Scalar::Value(0x38)) };
        assert!(premul.check(0, 2).is_ok());
        assert!(Call::AllGather { send: 0x100, recv: 0x1000, count: 8, dtype: fp8 }.check(0, 2).is_ok());
    }
    // NCCL takes a pre-multiplying op of any type: integers are multiplied too.
    let premul = Op::PreMulSum(Scalar::Value(3));
    let int = Call::AllReduce { send: 0x100, recv: 0x100, count: 8, dtype: DataType::Int32, op: premul };
    assert!(int.check(0, 2).is_ok());
}

#[test]
fn reduce_runs_as_an_all_reduce_into_scratch_off_the_root_and_premul_scales_a_copy() {
    let op = Op::PreMulSum(Scalar::Device(0x10));
    let reduce = Call::Reduce { send: 0x1000, recv: 0, count: 4, dtype: F32, op, root: 1 };
    let steps = reduce.steps(0, 2);
    assert_eq!(
        steps,
        [
            Step::Copy { dst: Buf::scratch(0), src: Buf::User(0x1000), bytes: 16 },
            Step::Scale { buf: Buf::scratch(0), count: 4, dtype: F32, scalar: Scalar::Device(0x10) },
            Step::AllReduce {
                input: Buf::scratch(0),
                output: Buf::scratch(0),
                count: 4,
                dtype: F32,
                op: ReduceOp::Sum
            },
        ]
    );
    let plain = Call::AllReduce { send: 0x1000, recv: 0x1000, count: 0, dtype: F32, op };
    assert!(plain.steps(0, 2).is_empty(), "nothing for zero elements");
}

/// What scratch holds before a step writes it.
const UNWRITTEN: u8 = 0xee;

/// One rank's memory: bytes by address.
type Memory = HashMap<Address, u8>;

fn read(mem: &Memory, scratch: &HashMap<usize, Vec<u8>>, buf: Buf, bytes: usize) -> Vec<u8> {
    match buf {
        Buf::User(a) => (0..bytes as u64).map(|i| *mem.get(&(a + i)).unwrap_or(&0)).collect(),
        // Scratch never written reads as a byte no test source holds, so reading it shows.
        Buf::Scratch { buffer, offset } => (offset..offset + bytes)
            .map(|i| scratch.get(&buffer).and_then(|s| s.get(i)).copied().unwrap_or(UNWRITTEN))
            .collect(),
    }
}

fn write(mem: &mut Memory, scratch: &mut HashMap<usize, Vec<u8>>, buf: Buf, data: &[u8]) {
    match buf {
        Buf::User(a) => {
            for (i, b) in data.iter().enumerate() {
                mem.insert(a + i as u64, *b);
            }
        }
        Buf::Scratch { buffer, offset } => {
            let s = scratch.entry(buffer).or_default();
            if s.len() < offset + data.len() {
                s.resize(offset + data.len(), UNWRITTEN);
            }
            s[offset..offset + data.len()].copy_from_slice(data);
        }
    }
}

/// Run every rank's steps to the end: a send waits for its receive, a collective for every
/// rank at a collective. Panics on a deadlock or on steps that do not pair.
fn run_all(programs: &[Vec<Step>], memories: &mut [Memory]) {
    let world = programs.len();
    let mut at = vec![0usize; world];
    let mut scratch: Vec<HashMap<usize, Vec<u8>>> = vec![HashMap::new(); world];
    loop {
        let mut moved = false;
        for r in 0..world {
            let Some(step) = programs[r].get(at[r]) else { continue };
            match *step {
                Step::Copy { dst, src, bytes } => {
                    let data = read(&memories[r], &scratch[r], src, bytes);
                    write(&mut memories[r], &mut scratch[r], dst, &data);
                    at[r] += 1;
                    moved = true;
                }
                Step::Send { buf, bytes, peer } => {
                    if let Some(Step::Recv { buf: into, bytes: got, peer: from }) =
                        programs[peer].get(at[peer]).copied()
                        && from == r
                    {
                        assert_eq!(bytes, got, "rank {r} sends {bytes} bytes to {peer}, which receives {got}");
                        let data = read(&memories[r], &scratch[r], buf, bytes);
                        write(&mut memories[peer], &mut scratch[peer], into, &data);
                        at[r] += 1;
                        at[peer] += 1;
                        moved = true;
                    }
                }
                Step::Recv { .. } => {}
                _ => {
                    let all_here = (0..world).all(|q| {
                        programs[q]
                            .get(at[q])
                            .is_some_and(|s| std::mem::discriminant(s) == std::mem::discriminant(step))
                    });
                    if all_here {
                        at.iter_mut().for_each(|a| *a += 1);
                        moved = true;
                    }
                }
            }
        }
        if (0..world).all(|r| at[r] == programs[r].len()) {
            return;
        }
        assert!(
            moved,
            "deadlock: ranks stopped at {:?} of {:?}",
            at,
            programs.iter().map(Vec::len).collect::<Vec<_>>()
        );
    }
}

/// The byte every test source holds: who wrote it, for whom, and where.
fn stamp(rank: usize, to: usize, i: usize) -> u8 {
    (rank * 31 + to * 7 + i) as u8
}

#[test]
fn all_to_all_gather_and_scatter_move_every_part_to_its_place_for_2_to_8_ranks() {
    let (send, recv, bytes) = (0x10000u64, 0x20000u64, 5usize);
    for world in 2..=8 {
        let mut mem: Vec<Memory> = (0..world)
            .map(|r| (0..world * bytes).map(|i| (send + i as u64, stamp(r, i / bytes, i % bytes))).collect())
            .collect();
        // Out of place, then in place (the received parts over the sent ones).
        for recv in [recv, send] {
            let call = Call::AlltoAll { send, recv, count: bytes, dtype: U8 };
            let programs: Vec<_> = (0..world).map(|r| call.steps(r, world)).collect();
            run_all(&programs, &mut mem);
            for (r, m) in mem.iter_mut().enumerate() {
                for from in 0..world {
                    for i in 0..bytes {
                        let at = recv + (from * bytes + i) as u64;
                        assert_eq!(m[&at], stamp(from, r, i), "rank {r} from {from}, in place: {}", recv == send);
                    }
                }
                // Fresh parts to send for the next form.
                for i in 0..world * bytes {
                    m.insert(send + i as u64, stamp(r, i / bytes, i % bytes));
                }
            }
        }
        for root in [0, world - 1] {
            let mut mem: Vec<Memory> = (0..world)
                .map(|r| (0..world * bytes).map(|i| (send + i as u64, stamp(r, i / bytes, i % bytes))).collect())
                .collect();
            let gather = Call::Gather { send, recv, count: bytes, dtype: U8, root };
            let scatter = Call::Scatter { send, recv: recv + 0x8000, count: bytes, dtype: U8, root };
            let programs: Vec<_> =
                (0..world).map(|r| [gather.steps(r, world), scatter.steps(r, world)].concat()).collect();
            run_all(&programs, &mut mem);
            for from in 0..world {
                for i in 0..bytes {
                    assert_eq!(
                        mem[root][&(recv + (from * bytes + i) as u64)],
                        stamp(from, 0, i),
                        "gathered from {from}"
                    );
                }
            }
            for (r, m) in mem.iter().enumerate() {
                for i in 0..bytes {
                    assert_eq!(m[&(recv + 0x8000 + i as u64)], stamp(root, r, i), "scattered to {r}");
                }
            }
        }
    }
}

#[test]
fn a_send_to_itself_meets_its_receive_as_a_copy_and_alone_is_refused() {
    let calls = [
        (Call::Recv { recv: 0x2000, count: 4, dtype: F32, peer: 1 }, ()),
        (Call::Send { send: 0x1000, count: 4, dtype: F32, peer: 1 }, ()),
        (Call::Recv { recv: 0x3000, count: 4, dtype: F32, peer: 0 }, ()),
    ];
    let ordered = order_group(&calls, 1).expect("paired");
    assert_eq!(
        ordered,
        [
            (Call::Recv { recv: 0x3000, count: 4, dtype: F32, peer: 0 }, ()),
            (Call::SelfCopy { send: 0x1000, recv: 0x2000, count: 4, dtype: F32 }, ()),
        ]
    );
    let e = order_group(&calls[..1], 1).map(|_| ()).expect_err("a receive alone");
    let e = e.to_string();
    assert!(e.contains("0 send(s) and 1 receive(s)"), "{e}");
}

proptest! {
    /// Every rank sends messages to others in an order of its own and posts its receives in
    /// another; once each rank's group is ordered, every message arrives, in order per pair,
    /// and nobody waits forever, with collectives between groups.
    #[test]
    fn grouped_sends_and_receives_in_any_order_never_deadlock(
        world in 2usize..=8,
        messages in proptest::collection::vec((0usize..8, 0usize..8, 1usize..4), 0..24),
        seed in any::<u64>(),
    ) {
        let messages: Vec<(usize, usize, usize)> =
            messages.into_iter().map(|(s, d, n)| (s % world, d % world, n)).filter(|(s, d, _)| s != d).collect();
        let mut state = seed;
        let mut shuffle = |v: &mut Vec<(Call, ())>| {
            for i in (1..v.len()).rev() {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                v.swap(i, (state >> 33) as usize % (i + 1));
            }
        };
        let mut mem: Vec<Memory> = vec![Memory::new(); world];
        let mut programs = vec![Vec::new(); world];
        let barrier = Call::AllReduce { send: 8, recv: 8, count: 1, dtype: F32, op: Op::Builtin(ReduceOp::Sum) };
        for rank in 0..world {
            let mut calls = Vec::new();
            for (k, &(s, d, n)) in messages.iter().enumerate() {
                let at = 0x10_0000 * (k as u64 + 1);
                if s == rank {
                    for i in 0..n {
                        mem[rank].insert(at + i as u64, stamp(s, d, k + i));
                    }
                    calls.push((Call::Send { send: at, count: n, dtype: U8, peer: d }, ()));
                }
                if d == rank {
                    calls.push((Call::Recv { recv: at + 0x8000, count: n, dtype: U8, peer: s }, ()));
                }
            }
            // The order of calls of one pair is the user's (NCCL matches them in it); the
            // pairs interleave at random.
            let mut order: Vec<(Call, ())> = calls.clone();
            shuffle(&mut order);
            let mut by_leg: HashMap<(usize, usize), Vec<(Call, ())>> = HashMap::new();
            for (c, _) in &calls {
                let leg = match *c { Call::Send { peer, .. } => (rank, peer), Call::Recv { peer, .. } => (peer, rank), _ => (0, 0) };
                by_leg.entry(leg).or_default().push((*c, ()));
            }
            for slot in order.iter_mut() {
                let leg = match slot.0 { Call::Send { peer, .. } => (rank, peer), Call::Recv { peer, .. } => (peer, rank), _ => (0, 0) };
                *slot = by_leg.get_mut(&leg).map(|v| v.remove(0)).expect("a call of the leg");
            }
            let mut group = vec![(barrier, ())];
            group.extend(order);
            for (call, ()) in order_group(&group, rank).expect("ordered") {
                programs[rank].extend(call.steps(rank, world));
            }
            programs[rank].extend(barrier.steps(rank, world));
        }
        run_all(&programs, &mut mem);
        for (k, &(s, d, n)) in messages.iter().enumerate() {
            let at = 0x10_0000 * (k as u64 + 1) + 0x8000;
            for i in 0..n {
                prop_assert_eq!(mem[d].get(&(at + i as u64)).copied(), Some(stamp(s, d, k + i)), "message {} from {} to {}", k, s, d);
            }
        }
    }
}
