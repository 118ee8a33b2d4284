//! Tests of `cost`.

use proptest::prelude::*;

use super::*;

const MIB: usize = 1 << 20;
const GIB: usize = 1 << 30;

/// `a` within 1 % of `b`.
fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 0.01 * b.abs()
}

#[test]
fn algorithm_names_round_trip() {
    for a in Algorithm::ALL {
        assert_eq!(a.to_string().parse::<Algorithm>(), Ok(a));
    }
    assert_eq!("Two-Shot".parse::<Algorithm>(), Ok(Algorithm::TwoShot));
    let err = "twoshot".parse::<Algorithm>().unwrap_err();
    let text = err.to_string();
    assert!(["twoshot", "ring", "one-shot", "two-shot"].iter().all(|w| text.contains(w)), "{text}");
}

#[test]
fn traffic_matches_the_formulas_for_two_to_eight_ranks() {
    let s = 3 * MIB;
    let sf = s as f64;
    for n in 2..=8usize {
        let nf = n as f64;
        let ring = traffic(Algorithm::Ring, n, s);
        assert!(close(ring.up_bytes, 2.0 * (nf - 1.0) / nf * sf), "n={n}: {ring:?}");
        assert!(close(ring.down_bytes, 2.0 * (nf - 1.0) / nf * sf), "n={n}: {ring:?}");
        assert_eq!(ring.host_dram_bytes, (4 * (n - 1) * s) as f64, "n={n}");
        assert_eq!(ring.phases, 2 * (n - 1), "n={n}");
        let one = traffic(Algorithm::OneShot, n, s);
        assert_eq!((one.up_bytes, one.down_bytes), (sf, ((n - 1) * s) as f64), "n={n}");
        assert_eq!((one.host_dram_bytes, one.phases), ((n * n * s) as f64, 1), "n={n}");
        let two = traffic(Algorithm::TwoShot, n, s);
        assert_eq!(two.up_bytes, sf, "n={n}");
        assert!(close(two.down_bytes, 2.0 * (nf - 1.0) / nf * sf), "n={n}: {two:?}");
        assert_eq!((two.host_dram_bytes, two.phases), (((3 * n - 2) * s) as f64, 2), "n={n}");
        // Host memory sees each sent byte written once and each received byte read once.
        for t in [ring, one, two] {
            assert!(close(t.host_dram_bytes, nf * (t.up_bytes + t.down_bytes)), "n={n}: {t:?}");
        }
    }
    // The §4 line for N = 8, in units of S.
    let per_s = |t: Traffic| (t.up_bytes / sf, t.down_bytes / sf, t.host_dram_bytes / sf);
    assert_eq!(per_s(traffic(Algorithm::Ring, 8, s)), (1.75, 1.75, 28.0));
    assert_eq!(per_s(traffic(Algorithm::TwoShot, 8, s)), (1.0, 1.75, 22.0));
}

#[test]
fn one_rank_or_no_bytes_moves_nothing_and_costs_nothing() {
    for a in Algorithm::ALL {
        for (ranks, bytes) in [(1, GIB), (0, GIB), (8, 0)] {
            assert_eq!(traffic(a, ranks, bytes), Traffic::NONE, "{a} {ranks} {bytes}");
            let p = predict(&Machine::h200(ranks), a, bytes);
            assert_eq!((p.seconds, p.bound), (0.0, Bound::Nothing), "{a} {ranks} {bytes}");
        }
    }
}

proptest! {
    /// §4: two-shot never moves more bytes than the ring on any resource, and has no
    /// more phases; so the model never prices it slower.
    #[test]
    fn two_shot_never_moves_more_than_the_ring(ranks in 2usize..=64, bytes in 1usize..(1 << 40)) {
        let (ring, two) = (traffic(Algorithm::Ring, ranks, bytes), traffic(Algorithm::TwoShot, ranks, bytes));
        prop_assert!(two.up_bytes <= ring.up_bytes, "{two:?} {ring:?}");
        prop_assert!(two.down_bytes <= ring.down_bytes, "{two:?} {ring:?}");
        prop_assert!(two.host_dram_bytes <= ring.host_dram_bytes, "{two:?} {ring:?}");
        prop_assert!(two.phases <= ring.phases);
        let machine = Machine::h200(ranks);
        let (ring, two) = (predict(&machine, Algorithm::Ring, bytes), predict(&machine, Algorithm::TwoShot, bytes));
        prop_assert!(two.seconds <= ring.seconds, "{two:?} {ring:?}");
    }

    /// The plan's choice is never predicted slower than another algorithm.
    #[test]
    fn the_choice_is_the_fastest(ranks in 2usize..=16, bytes in 1usize..(1 << 34)) {
        let plan = choose_with(&Machine::h200(ranks), bytes, None);
        let chosen = plan.prediction().seconds;
        prop_assert!(plan.predictions.iter().all(|p| chosen <= p.seconds), "{plan:?}");
    }
}

#[test]
fn predictions_follow_the_formulas_and_name_their_bound() {
    // One card's link: a machine whose host and DRAM are far faster than its cards,
    // four ranks, 1 GiB, no handoff cost.
    let m = Machine {
        ranks: 4,
        h2d_gbps: 20.0,
        d2h_gbps: 30.0,
        duplex_gbps: 10.0,
        host_gbps: 1e6,
        dram_gbps: 1e6,
        handoff_us: 0.0,
        cards_per_uplink: 1,
        op_us: OP_US,
        ranks_per_device: 1,
    };
    // One-shot: down 3 GiB at the duplex rate, 3 × 2^30 / 10e9 = 0.3221225472 s.
    let one = predict(&m, Algorithm::OneShot, GIB);
    assert_eq!(one.bound, Bound::CardDown);
    assert!(close(one.seconds, 0.322_122_547_2), "{one:?}");
    // The DRAM term: 16 GiB / 10 GB/s = 1.718 s.
    let slow_dram = Machine { dram_gbps: 10.0, ..m };
    let one = predict(&slow_dram, Algorithm::OneShot, GIB);
    assert_eq!(one.bound, Bound::Dram);
    assert!(close(one.seconds, 1.717_986_918_4), "{one:?}");
    // The host term: 4 × (1 + 3) GiB / 10 GB/s, and the equal DRAM term names DRAM.
    let slow_host = Machine { host_gbps: 10.0, ..m };
    let one = predict(&slow_host, Algorithm::OneShot, GIB);
    assert_eq!(one.bound, Bound::Host);
    assert!(close(one.seconds, 1.717_986_918_4), "{one:?}");
    let both = Machine { host_gbps: 10.0, dram_gbps: 10.0, ..m };
    assert_eq!(predict(&both, Algorithm::OneShot, GIB).bound, Bound::Dram);
    // Handoffs: 6 ring phases of 1 s each outweigh 8 bytes; they add to the bandwidth term.
    let slow_flags = Machine { handoff_us: 1e6, ..m };
    let ring = predict(&slow_flags, Algorithm::Ring, 8);
    assert_eq!(ring.bound, Bound::Handoffs);
    assert!(close(ring.seconds, 6.0), "{ring:?}");
    let ring = predict(&slow_flags, Algorithm::Ring, GIB);
    assert!(close(ring.seconds, 6.0 + 1.5 * GIB as f64 / 10e9), "{ring:?}");
}

#[test]
fn ties_go_to_fewer_phases_and_a_forced_choice_is_kept() {
    // No handoff cost, and two ranks: every algorithm moves S up and S down per card
    // and 4·S through host memory, so all three tie; the one-shot has one phase.
    let m = Machine { handoff_us: 0.0, ..Machine::h200(2) };
    let plan = choose_with(&m, GIB, None);
    let seconds: Vec<f64> = plan.predictions.iter().map(|p| p.seconds).collect();
    assert!(seconds.iter().all(|&s| s == seconds[0]), "{plan:?}");
    assert_eq!((plan.chosen, plan.forced), (Algorithm::OneShot, false));
    let forced = choose_with(&m, GIB, Some(Algorithm::Ring));
    assert_eq!((forced.chosen, forced.forced), (Algorithm::Ring, true));
    assert_eq!(forced.prediction().algorithm, Algorithm::Ring);
    assert_eq!(forced.predictions, plan.predictions, "forcing changes the choice, not the table");
}

#[test]
fn the_variable_forces_an_algorithm_and_a_wrong_value_names_it_and_the_choices() {
    assert_eq!(forced_algorithm(None), Ok(None));
    assert_eq!(forced_algorithm(Some("")), Ok(None), "empty counts as unset");
    assert_eq!(forced_algorithm(Some("ring")), Ok(Some(Algorithm::Ring)));
    assert_eq!(forced_algorithm(Some(" One-Shot ")), Ok(Some(Algorithm::OneShot)));
    assert_eq!(forced_algorithm(Some("two-shot")), Ok(Some(Algorithm::TwoShot)));
    let err = forced_algorithm(Some("tree")).unwrap_err();
    assert_eq!(err, Error::UnknownAlgorithm { var: ALGORITHM_VAR, given: "tree".into() });
    let text = err.to_string();
    for word in ["GP2P_ALGORITHM", "tree", "ring", "one-shot", "two-shot"] {
        assert!(text.contains(word), "{word} missing: {text}");
    }
}

/// The three algorithms' predictions at `bytes`, in µs, in `Algorithm::ALL` order.
fn micros(m: &Machine, bytes: usize) -> Vec<f64> {
    choose_with(m, bytes, None).predictions.iter().map(|p| p.seconds * 1e6).collect()
}

/// (a) Eight Gen4 RTX 4090s on a two-socket EPYC, each card on its own x16 link.
///
/// Per card (nvbandwidth issue 15, one card at a time): H2D 25, D2H 26.5 GB/s; with
/// both directions at once the first cards drop to 11–16 each way: duplex 13.5.
/// Host, all eight at once: no measurement at hand. The 4× RTX 5090 Genoa box moved at
/// least 2 × 4 × 27.3 ≈ 218 GB/s through host memory (NCCL busbw 27.3 at 128 MB,
/// nccl-tests issue 287); with half of every card's peers across the socket link we
/// assume 180, below the 8 × 2 × 13.5 = 216 the cards could move (an assumption).
/// DRAM: 2 sockets × 12 channels DDR5-4800 is 921.6 GB/s on paper; we assume 500 for
/// DMA reads and writes (an assumption). Handoff 12 µs (2× 4090 through the host:
/// 11.4–12.8 µs, nccl-tests issue 287).
///
/// Per S (bytes per rank), seconds per GB, N = 8:
/// - ring: link 1.75/13.5 = 0.12963, host 8·3.5/180 = 0.15556, DRAM 28/500 = 0.056:
///   host binds; 14 phases = 168 µs.
/// - one-shot: link 7/13.5 = 0.51852 (down), host 64/180 = 0.35556, DRAM 64/500 =
///   0.128: the card's down link binds; 1 phase = 12 µs.
/// - two-shot: link 1.75/13.5 = 0.12963 (down), host 22/180 = 0.12222, DRAM 22/500 =
///   0.044: the down link binds; 2 phases = 24 µs.
///
/// 8 B: 168.0 / 12.0 / 24.0 µs: one-shot. 1 MiB (1048.576 µs per s/GB): ring 168 +
/// 163.11 = 331.11, one-shot 12 + 543.71 = 555.71, two-shot 24 + 135.93 = 159.93:
/// two-shot. 1 GiB: two-shot 1.75 × 2^30 / 13.5e9 + 24e-6 = 0.139212755 s, ring
/// 28 × 2^30 / 180e9 + 168e-6 = 0.167194506 s: two-shot. One-shot gives way to two-shot
/// at 12 µs / (0.51852 − 0.12963) s/GB ≈ 30.9 kB.
#[test]
fn eight_gen4_cards_on_two_sockets() {
    let m = Machine {
        ranks: 8,
        h2d_gbps: 25.0,
        d2h_gbps: 26.5,
        duplex_gbps: 13.5,
        host_gbps: 180.0,
        dram_gbps: 500.0,
        handoff_us: 12.0,
        cards_per_uplink: 1,
        op_us: OP_US,
        ranks_per_device: 1,
    };
    assert_eq!(choose_with(&m, 8, None).chosen, Algorithm::OneShot);
    let mib = choose_with(&m, MIB, None);
    assert_eq!(mib.chosen, Algorithm::TwoShot);
    assert_eq!(mib.predictions[0].bound, Bound::Handoffs, "168 µs of ring phases against 163 of bytes");
    for (got, want) in micros(&m, MIB).into_iter().zip([331.11, 555.71, 159.93]) {
        assert!(close(got, want), "{got} µs, hand: {want}");
    }
    let gib = choose_with(&m, GIB, None);
    assert_eq!(gib.chosen, Algorithm::TwoShot);
    assert_eq!(gib.prediction().bound, Bound::CardDown);
    assert!(close(gib.prediction().seconds, 0.139_212_755), "{gib:?}");
    assert_eq!(gib.predictions[0].bound, Bound::Host);
    assert!(close(gib.predictions[0].seconds, 0.167_194_506), "{gib:?}");
    // Either side of the one-shot/two-shot crossover (30.9 kB).
    assert_eq!(choose_with(&m, 28_000, None).chosen, Algorithm::OneShot);
    assert_eq!(choose_with(&m, 34_000, None).chosen, Algorithm::TwoShot);
}

/// (b) Four Gen4 cards behind one PCIe switch with one x16 Gen4 uplink to the host
/// (a published dual-Xeon box; NCCL models 24 GB/s a direction inside a
/// switch). Without P2P every byte crosses the uplink both ways: all four together move
/// at most 2 × 24 = 48 GB/s, up plus down. Per card as (a): H2D 25, D2H 26.5, duplex
/// 13.5. DRAM: the switch's socket, 8 channels DDR4-2933 = 188 GB/s on paper, assumed
/// 120. Handoff 14 µs (about 14 µs through the host, tinygrad's P2P README: a switch hop
/// more than (a)).
///
/// Per S, seconds per GB, N = 4:
/// - ring: link 1.5/13.5 = 0.11111, host 4·3/48 = 0.25, DRAM 12/120 = 0.1: host;
///   6 phases = 84 µs.
/// - one-shot: link 3/13.5 = 0.22222, host 4·4/48 = 0.33333, DRAM 16/120 = 0.13333:
///   host; 14 µs.
/// - two-shot: link 1.5/13.5 = 0.11111, host 4·2.5/48 = 0.20833, DRAM 10/120 =
///   0.08333: host; 28 µs.
///
/// 8 B: 84.0 / 14.0 / 28.0 µs: one-shot. 1 MiB: ring 84 + 262.14 = 346.14, one-shot
/// 14 + 349.53 = 363.53, two-shot 28 + 218.45 = 246.45: two-shot. 1 GiB: two-shot
/// 10 × 2^30 / 48e9 + 28e-6 = 0.223724213 s (ring 0.268519456): two-shot, the host
/// term (here the uplink's cap on all four, given as the host rate)
/// binds. Crossover 14 µs / 0.125 s/GB = 112 kB.
#[test]
fn four_cards_behind_one_switch_uplink() {
    let m = Machine {
        ranks: 4,
        h2d_gbps: 25.0,
        d2h_gbps: 26.5,
        duplex_gbps: 13.5,
        host_gbps: 48.0,
        dram_gbps: 120.0,
        handoff_us: 14.0,
        cards_per_uplink: 1,
        op_us: OP_US,
        ranks_per_device: 1,
    };
    assert_eq!(choose_with(&m, 8, None).chosen, Algorithm::OneShot);
    assert_eq!(choose_with(&m, 100_000, None).chosen, Algorithm::OneShot, "below 112 kB");
    let mib = choose_with(&m, MIB, None);
    assert_eq!(mib.chosen, Algorithm::TwoShot);
    for (got, want) in micros(&m, MIB).into_iter().zip([346.14, 363.53, 246.45]) {
        assert!(close(got, want), "{got} µs, hand: {want}");
    }
    let gib = choose_with(&m, GIB, None);
    assert_eq!(gib.chosen, Algorithm::TwoShot);
    assert!(gib.predictions.iter().all(|p| p.bound == Bound::Host), "the uplink binds all: {gib:?}");
    assert!(close(gib.prediction().seconds, 0.223_724_213), "{gib:?}");
    assert!(close(gib.predictions[0].seconds, 0.268_519_456), "{gib:?}");
}

/// (b') The same four cards, with the switch given as the probe's topology hands it
/// over (four cards behind one uplink) rather than as a host rate: the host (400) and
/// DRAM (1000) have room, and the uplink, at one card's rates, carries all four.
///
/// 1 GiB, per card: two-shot up 1, down 1.5 (× 2^30 B), link 1.5 × 2^30 / 13.5e9 =
/// 0.119305 s, uplink 4 × that = 0.477218 s, + 28 µs = 0.477246 s; the ring 0.477218 +
/// 84 µs = 0.477302 s; one-shot down 3: 4 × 3 × 2^30 / 13.5e9 + 14 µs = 0.954451 s.
/// Two-shot, the uplink binds.
#[test]
fn four_cards_behind_one_switch_from_the_topology() {
    let m = Machine {
        ranks: 4,
        h2d_gbps: 25.0,
        d2h_gbps: 26.5,
        duplex_gbps: 13.5,
        host_gbps: 400.0,
        dram_gbps: 1000.0,
        handoff_us: 14.0,
        cards_per_uplink: 4,
        op_us: OP_US,
        ranks_per_device: 1,
    };
    let gib = choose_with(&m, GIB, None);
    assert_eq!(gib.chosen, Algorithm::TwoShot);
    assert!(gib.predictions.iter().all(|p| p.bound == Bound::Uplink), "{gib:?}");
    for (got, want) in gib.predictions.iter().map(|p| p.seconds).zip([0.477_302, 0.954_451, 0.477_246]) {
        assert!(close(got, want), "{got} s, hand: {want}");
    }
    // Each card on its own link: the uplink term is gone and the card's link binds.
    let own = choose_with(&Machine { cards_per_uplink: 1, ..m }, GIB, None);
    assert_eq!(own.prediction().bound, Bound::CardDown);
    assert!(close(own.prediction().seconds, 0.119_305 + 28e-6), "{own:?}");
}

/// (c) Two Gen5 cards (RTX 5090, x16 each) on a desktop with dual-channel DDR5.
///
/// Per card (figures published for 8× RTX 5090 on a Xeon 8458P): H2D 56.3, D2H 57.3,
/// duplex 50.9. Host: assumed 200 (the CPU's PCIe lanes are not what binds here).
/// DRAM: two channels of DDR5-5600 = 89.6 GB/s on paper, assumed 70. Handoff 12.8 µs
/// (2× 5090 through the host, nccl-tests issue 287).
///
/// At N = 2 all three move S up and S down per card and 4·S through host memory: link
/// 1/50.9 = 0.019646, host 2·2/200 = 0.02, DRAM 4/70 = 0.057143 s/GB: DRAM binds them
/// all, and one-shot's one phase beats the two of the others at every size (the ring
/// and two-shot are the same thing here). 8 B: 12.8 µs. 1 MiB: 12.8 + 59.92 = 72.72 µs.
/// 1 GiB: 4 × 2^30 / 70e9 + 12.8e-6 = 0.061369476 s (busbw 17.5 GB/s).
#[test]
fn two_gen5_cards_on_a_desktop() {
    let m = Machine {
        ranks: 2,
        h2d_gbps: 56.3,
        d2h_gbps: 57.3,
        duplex_gbps: 50.9,
        host_gbps: 200.0,
        dram_gbps: 70.0,
        handoff_us: 12.8,
        cards_per_uplink: 1,
        op_us: OP_US,
        ranks_per_device: 1,
    };
    for bytes in [8, MIB, GIB] {
        let plan = choose_with(&m, bytes, None);
        assert_eq!(plan.chosen, Algorithm::OneShot, "{bytes}: {plan:?}");
        assert_eq!(plan.predictions[0], Prediction { algorithm: Algorithm::Ring, ..plan.predictions[2] });
    }
    assert!(close(micros(&m, 8)[1], 12.8));
    assert!(close(micros(&m, MIB)[1], 72.72));
    let gib = choose_with(&m, GIB, None);
    assert_eq!(gib.prediction().bound, Bound::Dram);
    assert!(close(gib.prediction().seconds, 0.061_369_476), "{gib:?}");
}

#[test]
fn ranks_sharing_a_gpu_add_their_turns_to_each_step_and_two_or_fewer_none() {
    let ops_us = 4.0 * OP_US;
    // (ranks per device, ranks, turns a step in units of DEVICE_TURN_US)
    for (per_device, ranks, turns) in
        [(0, 4, 0), (1, 4, 0), (2, 4, 0), (3, 4, 2), (4, 4, 6), (8, 4, 6), (8, 8, 42), (8, 1, 0)]
    {
        let m = Machine { ranks_per_device: per_device, ..Machine::h200(ranks) };
        let us = m.steps_seconds(10, 4) * 1e6;
        let want = 10.0 * (ops_us + turns as f64 * DEVICE_TURN_US);
        assert!(close(us, want), "{per_device} ranks a device, {ranks} ranks: {us} µs, want {want}");
    }
}
