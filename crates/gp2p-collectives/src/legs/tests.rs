//! Every collective's legs on host buffers against a reference, for 2 to 8 ranks and lengths
//! that do not divide evenly; and the ring's schedules, as legs, giving what they give run as
//! transfers.

use proptest::prelude::*;

use super::*;
use crate::schedule::Schedule;

const WORD: usize = std::mem::size_of::<u64>();

/// Rank `r`'s `n` values of case `seed`: small enough that sums of 8 never wrap.
fn values(seed: u64, r: usize, n: usize) -> Vec<u64> {
    (0..n as u64).map(|i| (seed ^ (r as u64 * 0x9e37_79b9) ^ (i * 0x85eb_ca6b)) % 1_000_003).collect()
}

fn add(acc: &u64, x: &u64, _last: bool) -> u64 {
    acc + x
}

fn sum(inputs: &[Vec<u64>]) -> Vec<u64> {
    (0..inputs[0].len()).map(|i| inputs.iter().map(|v| v[i]).sum()).collect()
}

proptest! {
    #[test]
    fn the_all_reduce_gives_every_rank_the_sum(world in 2usize..=8, n in 1usize..3000, seed in any::<u64>()) {
        let inputs: Vec<Vec<u64>> = (0..world).map(|r| values(seed, r, n)).collect();
        let mut main = inputs.clone();
        Rounds::all_reduce(world, n * WORD).run_on_host(&mut main, &mut [], add);
        let want = sum(&inputs);
        for (r, got) in main.iter().enumerate() {
            prop_assert_eq!(got, &want, "rank {}", r);
        }
    }

    #[test]
    fn the_all_reduce_gives_every_rank_the_same_bits(world in 2usize..=8, n in 1usize..1500, seed in any::<u64>()) {
        // Floating point: each share is folded once, by its owner, and handed out.
        let inputs: Vec<Vec<f64>> =
            (0..world).map(|r| values(seed, r, n).iter().map(|&v| v as f64 / 7.0 - 70_000.0).collect()).collect();
        let mut main = inputs.clone();
        Rounds::all_reduce(world, n * WORD).run_on_host(&mut main, &mut [], |a, x, _| a + x);
        for r in 1..world {
            prop_assert!(main[r].iter().zip(&main[0]).all(|(a, b)| a.to_bits() == b.to_bits()), "rank {} differs", r);
        }
        let want: Vec<f64> = (0..n).map(|i| inputs.iter().map(|v| v[i]).sum()).collect();
        prop_assert!(main[0].iter().zip(&want).all(|(a, b)| (a - b).abs() <= 1e-9 * world as f64 * 1e5));
    }

    #[test]
    fn reduce_scatter_and_all_gather_move_parts_in_place_and_out(
        world in 2usize..=8, part in 1usize..600, seed in any::<u64>(), in_place in any::<bool>(),
    ) {
        let whole = world * part;
        let inputs: Vec<Vec<u64>> = (0..world).map(|r| values(seed, r, whole)).collect();
        let total = sum(&inputs);
        // Reduce-scatter: rank r's part r, folded into Part (holding its own part first) or
        // into its part of Main.
        let mut main = inputs.clone();
        let mut parts: Vec<Vec<u64>> = (0..world).map(|r| inputs[r][r * part..(r + 1) * part].to_vec()).collect();
        Rounds::reduce_scatter(world, part * WORD, in_place).run_on_host(&mut main, &mut parts, add);
        for r in 0..world {
            let got = if in_place { &main[r][r * part..(r + 1) * part] } else { &parts[r][..] };
            prop_assert_eq!(got, &total[r * part..(r + 1) * part], "reduce-scatter, rank {}", r);
        }
        // All-gather: every rank's part r of Main becomes rank r's part (its own put there first).
        let mine: Vec<Vec<u64>> = (0..world).map(|r| values(seed ^ 1, r, part)).collect();
        let mut main: Vec<Vec<u64>> = (0..world).map(|r| {
            let mut m = vec![0; whole];
            m[r * part..(r + 1) * part].copy_from_slice(&mine[r]);
            m
        }).collect();
        let mut parts = mine.clone();
        Rounds::all_gather(world, part * WORD, in_place).run_on_host(&mut main, &mut parts, add);
        let want: Vec<u64> = mine.concat();
        for (r, got) in main.iter().enumerate() {
            prop_assert_eq!(got, &want, "all-gather, rank {}", r);
        }
    }

    #[test]
    fn broadcast_and_send_copy_whole_buffers(world in 2usize..=8, n in 1usize..2000, root in 0usize..8, seed in any::<u64>()) {
        let root = root % world;
        let inputs: Vec<Vec<u64>> = (0..world).map(|r| values(seed, r, n)).collect();
        let mut main = inputs.clone();
        Rounds::broadcast(world, n * WORD, root).run_on_host(&mut main, &mut [], add);
        prop_assert!(main.iter().all(|b| b == &inputs[root]));
        let reader = (root + 1) % world;
        let mut main = inputs.clone();
        Rounds::send(world, n * WORD, root, reader).run_on_host(&mut main, &mut [], add);
        for (r, got) in main.iter().enumerate() {
            prop_assert_eq!(got, if r == reader { &inputs[root] } else { &inputs[r] });
        }
    }

    #[test]
    fn the_rings_schedules_as_legs_give_what_their_transfers_give(
        world in 2usize..=8, n in 1usize..2000, chunk in 1usize..300, seed in any::<u64>(),
    ) {
        let inputs: Vec<Vec<u64>> = (0..world).map(|r| values(seed, r, n)).collect();
        let mut schedules = vec![
            Schedule::all_reduce(world, n, chunk),
            Schedule::reduce_scatter(world, n, chunk),
            Schedule::all_gather(world, n, chunk),
            Schedule::broadcast(world, n, chunk, seed as usize % world),
        ];
        if world == 2 {
            schedules.push(Schedule::all_reduce_exchange(n, chunk, 1));
        }
        for schedule in schedules {
            let mut as_transfers = inputs.clone();
            schedule.run_on_host(&mut as_transfers, add);
            let mut as_legs = inputs.clone();
            let rounds = schedule.to_rounds(WORD);
            rounds.run_on_host(&mut as_legs, &mut [], add);
            prop_assert_eq!(&as_legs, &as_transfers);
            let sent: Vec<usize> = schedule.bytes_per_rank(WORD);
            prop_assert_eq!(rounds.bytes_sent(), sent);
        }
    }
}

#[test]
fn shares_cover_the_buffer_in_order_on_page_boundaries() {
    for parts in 1..=8 {
        for bytes in [0, 1, 4095, 4096, 4097, 3 * 4096, 100_000, 1 << 20] {
            let mut next = 0;
            for i in 0..parts {
                let s = share(parts, bytes, i);
                assert_eq!(s.start, next, "{parts} parts of {bytes}");
                assert!(s.start % SHARE_ALIGN == 0 || s.start == bytes);
                next = s.end;
            }
            assert_eq!(next, bytes);
        }
    }
}

proptest! {
    #[test]
    fn the_all_reduces_closed_form_traffic_is_its_legs(world in 1usize..=8, bytes in 0usize..(1 << 20)) {
        prop_assert_eq!(all_reduce_traffic(world, bytes), Rounds::all_reduce(world, bytes).traffic());
    }
}

#[test]
fn each_card_sends_what_the_table_says() {
    // N = 4, S = 4 shares of 4 KiB: the all-reduce sends S a card (three shares to their
    // owners, its folded share once for every reader), the broadcast's root S, an all-gather's
    // rank its part.
    let (world, bytes) = (4, 4 * SHARE_ALIGN);
    assert_eq!(Rounds::all_reduce(world, bytes).bytes_sent(), vec![bytes; world]);
    assert_eq!(Rounds::broadcast(world, bytes, 1).bytes_sent(), vec![0, bytes, 0, 0]);
    assert_eq!(Rounds::all_gather(world, 5, false).bytes_sent(), vec![5; world]);
    // Every reader of a leg to the others lands it, the writer does not.
    let leg = &Rounds::broadcast(world, bytes, 1).legs[0];
    assert_eq!(leg.readers(world).collect::<Vec<_>>(), vec![2, 3, 0]);
    assert!(!leg.is_read_by(1) && leg.is_read_by(0));
}

#[test]
fn the_all_reduces_traffic_is_the_tables_two_shot_where_the_shares_are_even() {
    use crate::cost::{Algorithm, traffic};
    for world in 2..=8 {
        let bytes = world * 3 * SHARE_ALIGN;
        let legs = Rounds::all_reduce(world, bytes).traffic();
        let table = traffic(Algorithm::TwoShot, world, bytes);
        // The same bytes; N rounds where the table counts 2 phases (the shares go out one
        // owner a round).
        assert_eq!((legs.up_bytes, legs.host_dram_bytes), (table.up_bytes, table.host_dram_bytes), "{world} ranks");
        assert!((legs.down_bytes - table.down_bytes).abs() < 1e-6, "{world} ranks");
        assert_eq!(legs.phases, world);
    }
    // Shares start on pages: 16 KiB over 8 ranks gives ranks 0-3 a page each and 4-7 none, so
    // rank 0 writes its 4 pages (3 to their owners, its folded one once) and lands 7 folds of
    // its page and the 3 other pages (10), more than the even 2(N-1)/N S (7 pages); host
    // memory sees 8 writers' 4 pages and 2 × 7 reads of each of the 4 shares.
    let t = Rounds::all_reduce(8, 4 * SHARE_ALIGN).traffic();
    assert_eq!((t.up_bytes, t.down_bytes), (4.0 * 4096.0, 10.0 * 4096.0));
    assert_eq!((t.host_dram_bytes, t.phases), ((4.0 * 8.0 + 2.0 * 7.0 * 4.0) * 4096.0, 8));
}
