//! The decision for described worlds.

use proptest::prelude::*;

use super::*;

fn device(bus: &str, p2p_with: &[&str]) -> Result<DeviceFacts, String> {
    Ok(DeviceFacts {
        pci_bus_id: bus.into(),
        name: "NVIDIA GeForce RTX 4090".into(),
        runs_communicator: true,
        p2p_with: p2p_with.iter().map(|s| (*s).to_owned()).collect(),
    })
}

/// `world` ranks on one host, rank r on device `0000:0r:00.0`, no P2P anywhere.
fn world(world: usize) -> Vec<RankFacts> {
    (0..world)
        .map(|rank| RankFacts {
            rank,
            nranks: world,
            host: "box:boot".into(),
            process: format!("{}@1", 100 + rank),
            hardware_queues: Some(8),
            mode: Mode::Auto,
            door_version: "0.1.0".into(),
            device: device(&format!("0000:{:02x}:00.0", rank + 1), &[]),
            real_nccl: true,
        })
        .collect()
}

fn served(d: &Result<Decision, String>) -> bool {
    matches!(d, Ok(Decision::Serve { .. }))
}

#[test]
fn one_host_without_p2p_is_served_and_says_why() {
    let d = decide(&world(4), true, None);
    assert_eq!(d, Ok(Decision::Serve { reason: "no pair of its 4 devices has usable P2P".into() }));
    assert!(served(&decide(&world(1), false, None)), "one rank needs no real NCCL");
}

#[test]
fn ranks_sharing_one_device_are_served() {
    let mut facts = world(3);
    for f in &mut facts {
        f.device = device("0000:01:00.0", &[]);
    }
    assert_eq!(decide(&facts, true, None), Ok(Decision::Serve { reason: "its 3 ranks share one device".into() }));
}

/// `world` ranks as threads of one process, all on one device, with `queues` hardware queues.
fn threads(world_size: usize, queues: usize) -> Vec<RankFacts> {
    let mut facts = world(world_size);
    for f in &mut facts {
        (f.process, f.hardware_queues, f.device) = ("7@1".into(), Some(queues), device("0000:01:00.0", &[]));
    }
    facts
}

#[test]
fn threads_sharing_a_device_are_served_only_with_a_hardware_queue_for_each_stream() {
    // 2 ranks: 6 streams and the program's, within the default 8 queues.
    assert!(served(&decide(&threads(2, 8), true, None)));
    // 12 streams on 8 queues: an error on every rank (the real NCCL takes no shared device).
    assert_eq!(
        decide(&threads(4, 8), true, None),
        Err(String::from(
            "ranks 0, 1, 2, 3 are threads of one process on 0000:01:00.0, whose 12 streams and the program's want 13 hardware queues, and CUDA_DEVICE_MAX_CONNECTIONS gave the process 8 (where two ranks' streams share a queue, their waiting kernels can deadlock): set CUDA_DEVICE_MAX_CONNECTIONS=32 before CUDA starts (python -m geforce_p2p.nccl does where no MPS daemon serves the command), or run one process per rank; the real NCCL does not take ranks that share a device"
        ))
    );
    let mut forced = threads(4, 8);
    forced[2].mode = Mode::Force;
    assert!(decide(&forced, true, None).is_err(), "force does not risk a hang");
    forced[1].mode = Mode::Off;
    assert!(matches!(decide(&forced, true, None), Ok(Decision::HandOver { .. })), "off hands over, as ever");
    assert_eq!(
        decide(&threads(4, 32), true, None),
        Ok(Decision::Serve { reason: "its 4 ranks share one device".into() })
    );
    assert!(served(&decide(&threads(8, 32), true, None)), "8 ranks: 25 queues of 32");
    // The fewest queues any of them reports counts.
    let mut mixed = threads(4, 32);
    mixed[3].hardware_queues = Some(12);
    assert!(decide(&mixed, true, None).is_err());
    // A door that did not name the process: a process of its own.
    let mut unnamed = threads(4, 8);
    for f in &mut unnamed {
        f.process.clear();
    }
    assert!(served(&decide(&unnamed, true, None)));
    // Threads of one process on devices of their own share no context; processes on one
    // device share no queues.
    let mut own_devices = threads(4, 1);
    for (rank, f) in own_devices.iter_mut().enumerate() {
        f.device = device(&format!("0000:{:02x}:00.0", rank + 1), &[]);
    }
    assert!(served(&decide(&own_devices, true, None)));
    let mut processes = threads(8, 1);
    for (rank, f) in processes.iter_mut().enumerate() {
        f.process = format!("{rank}@1");
    }
    assert!(served(&decide(&processes, true, None)));
}

#[test]
fn ranks_on_another_host_than_the_id_maker_are_handed_over() {
    let d = decide(&world(2), true, Some("launcher:boot"));
    let reason = "its ranks run on another host than the process that made the unique id";
    assert_eq!(d, Ok(Decision::HandOver { reason: reason.into() }));
    assert!(served(&decide(&world(2), true, Some("box:boot"))));
}

#[test]
fn two_hosts_are_handed_over() {
    let mut facts = world(4);
    facts[2].host = "other:boot".into();
    assert_eq!(decide(&facts, true, None), Ok(Decision::HandOver { reason: "its 4 ranks run on 2 hosts".into() }));
}

#[test]
fn nine_ranks_are_handed_over_even_when_forced() {
    let mut facts = world(9);
    facts[0].mode = Mode::Force;
    assert_eq!(
        decide(&facts, true, None),
        Ok(Decision::HandOver { reason: "9 ranks; the door serves up to 8".into() })
    );
}

#[test]
fn a_p2p_pair_is_handed_over_unless_forced() {
    let mut facts = world(4);
    // Seen from one side only: rank 3 does not see rank 1's device (CUDA_VISIBLE_DEVICES).
    facts[1].device = device("0000:02:00.0", &["0000:04:00.0"]);
    let d = decide(&facts, true, None);
    assert_eq!(
        d,
        Ok(Decision::HandOver { reason: "ranks 1 and 3 have P2P between 0000:02:00.0 and 0000:04:00.0".into() })
    );
    facts[3].mode = Mode::Force;
    assert_eq!(decide(&facts, true, None), Ok(Decision::Serve { reason: "GP2P_NCCL=force on rank 3".into() }));
}

#[test]
fn off_on_any_rank_hands_over_and_beats_force() {
    let mut facts = world(2);
    facts[0].mode = Mode::Force;
    facts[1].mode = Mode::Off;
    assert_eq!(decide(&facts, true, None), Ok(Decision::HandOver { reason: "GP2P_NCCL=off on rank 1".into() }));
}

#[test]
fn a_device_the_communicator_cannot_run_on_is_handed_over() {
    let mut facts = world(2);
    facts[1].device = Err("no CUDA driver".into());
    let d = decide(&facts, true, None);
    assert_eq!(d, Ok(Decision::HandOver { reason: "rank 1 has no device the door can use: no CUDA driver".into() }));
    let mut facts = world(2);
    if let Ok(d) = &mut facts[0].device {
        d.runs_communicator = false;
    }
    assert!(matches!(decide(&facts, true, None), Ok(Decision::HandOver { .. })));
}

#[test]
fn a_hand_over_without_a_real_nccl_fails_on_every_rank_naming_the_fix() {
    let mut facts = world(2);
    facts[0].mode = Mode::Off;
    facts[1].real_nccl = false;
    let e = decide(&facts, true, None).expect_err("no real NCCL on rank 1");
    assert!(e.contains("rank(s) 1 cannot load it") && e.contains("GP2P_NCCL_REAL"), "{e}");
    let e = decide(&world(9), false, None).expect_err("no real id");
    assert!(e.contains("made the unique id"), "{e}");
}

#[test]
fn inconsistent_worlds_are_refused_by_name() {
    let mut facts = world(3);
    facts[2].nranks = 4;
    assert!(decide(&facts, true, None).is_err_and(|e| e.contains("same nranks")));
    let mut facts = world(3);
    facts[1].rank = 0;
    assert!(decide(&facts, true, None).is_err_and(|e| e.contains("two processes joined as rank 0")));
    let facts = world(3);
    assert!(decide(&facts[..2], true, None).is_err_and(|e| e.contains("rank(s) 2 did not arrive")));
    let mut facts = world(2);
    facts[1].door_version = "0.2.0".into();
    assert!(decide(&facts, true, None).is_err_and(|e| e.contains("same geforce-p2p")));
}

proptest! {
    /// Every rank gets the same answer whatever order the facts arrive in.
    #[test]
    fn the_decision_does_not_depend_on_arrival_order(
        n in 1usize..10,
        seed in any::<u64>(),
        p2p in proptest::option::of((0usize..10, 0usize..10)),
        off in proptest::option::of(0usize..10),
        force in proptest::option::of(0usize..10),
        other_host in proptest::option::of(0usize..10),
        crowded in any::<bool>(),
        queues in proptest::collection::vec(1usize..=32, 10),
    ) {
        let mut facts = if crowded { threads(n, 8) } else { world(n) };
        if crowded {
            // Two processes' threads, each with its own queues.
            for (f, q) in facts.iter_mut().zip(&queues) {
                f.hardware_queues = Some(*q);
                if f.rank % 2 == 1 {
                    f.process = "8@1".into();
                }
            }
        }
        if let Some((a, b)) = p2p && a < n && b < n {
            let bus = format!("0000:{:02x}:00.0", b + 1);
            facts[a].device = device(&format!("0000:{:02x}:00.0", a + 1), &[&bus]);
        }
        for (pick, mode) in [(off, Mode::Off), (force, Mode::Force)] {
            if let Some(r) = pick && r < n {
                facts[r].mode = mode;
            }
        }
        if let Some(r) = other_host && r < n {
            facts[r].host = "elsewhere".into();
        }
        let expected = decide(&facts, true, None);
        let mut shuffled = facts.clone();
        let mut state = seed;
        for i in (1..shuffled.len()).rev() {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            shuffled.swap(i, (state >> 33) as usize % (i + 1));
        }
        prop_assert_eq!(decide(&shuffled, true, None), expected);
    }
}

#[test]
fn threads_sharing_a_device_under_mps_are_served_only_with_queues_asked_for() {
    // Under an MPS daemon with CUDA_DEVICE_MAX_CONNECTIONS unset, 2 ranks as threads of
    // nccl-tests hung on one H100: the server's share is unknown, so even 2 ranks fail.
    let mut unset = threads(2, 8);
    for f in &mut unset {
        f.hardware_queues = None;
    }
    assert_eq!(
        decide(&unset, true, None),
        Err(String::from(
            "ranks 0, 1 are threads of one process on 0000:01:00.0, whose 6 streams and the program's want 7 hardware queues, and an MPS daemon serves the process and deals out the queues itself, as CUDA_DEVICE_MAX_CONNECTIONS is unset or not a number (where two ranks' streams share a queue, their waiting kernels can deadlock): set CUDA_DEVICE_MAX_CONNECTIONS=32 for this program (only where few processes share the daemon: its clients draw on one pool), stop the MPS daemon, or run one process per rank; the real NCCL does not take ranks that share a device"
        ))
    );
    // One rank alone shares nothing, and processes of their own share no context.
    assert!(served(&decide(
        &unset[..1].iter().map(|f| RankFacts { nranks: 1, ..f.clone() }).collect::<Vec<_>>(),
        true,
        None
    )));
    let mut processes = unset.clone();
    processes[1].process = "8@1".into();
    assert!(served(&decide(&processes, true, None)));
    // One rank whose share is unknown makes the group's unknown.
    let mut one_unset = threads(4, 32);
    one_unset[2].hardware_queues = None;
    assert!(decide(&one_unset, true, None).is_err_and(|e| e.contains("an MPS daemon serves the process")));
    // A number asked for counts as it does without MPS.
    assert!(served(&decide(&threads(4, 32), true, None)));
}

#[test]
fn facts_from_a_door_that_names_no_process_read_as_a_process_of_its_own() {
    let Ok(serde_json::Value::Object(mut fields)) = serde_json::to_value(&world(1)[0]) else {
        unreachable!("facts are a JSON object")
    };
    fields.remove("process");
    fields.remove("hardware_queues");
    let Ok(read) = serde_json::from_value::<RankFacts>(serde_json::Value::Object(fields)) else {
        unreachable!("the fields default")
    };
    assert_eq!((read.process.as_str(), read.hardware_queues), ("", Some(DEFAULT_HARDWARE_QUEUES)));
}
