//! The rendezvous on loopback, ranks as threads.

use std::net::Ipv4Addr;

use super::*;
use crate::decision::DeviceFacts;
use crate::env::Mode;

fn facts(rank: usize, nranks: usize) -> RankFacts {
    RankFacts {
        rank,
        nranks,
        host: "box:boot".into(),
        process: format!("{}@1", 100 + rank),
        hardware_queues: Some(8),
        mode: Mode::Auto,
        door_version: "0.1.0".into(),
        device: Ok(DeviceFacts {
            pci_bus_id: format!("0000:{:02x}:00.0", rank + 1),
            name: "card".into(),
            runs_communicator: true,
            p2p_with: vec![],
        }),
        real_nccl: true,
    }
}

fn maker(secret: [u8; SECRET_BYTES], timeout: Duration) -> Maker {
    Maker {
        secret,
        host: "box:boot".into(),
        timeout,
        comm_id: Box::new(|| Ok(String::from("abcd"))),
        real_id: Some(Box::new(|| Ok(vec![5; crate::abi::UNIQUE_ID_BYTES]))),
    }
}

fn join_all(addr: SocketAddr, secret: [u8; SECRET_BYTES], all: Vec<RankFacts>) -> Vec<Result<Verdict>> {
    std::thread::scope(|s| {
        let handles: Vec<_> =
            all.iter().map(|f| s.spawn(move || join(addr, &secret, f, Duration::from_secs(20)))).collect();
        handles.into_iter().map(|h| h.join().expect("rank thread")).collect()
    })
}

#[test]
fn every_rank_gets_the_same_verdict_and_a_stranger_gets_nothing() {
    let secret = [3; SECRET_BYTES];
    let addr = listen(Ipv4Addr::LOCALHOST.into(), maker(secret, Duration::from_secs(20))).expect("listens");
    // A stranger with the wrong secret, before the ranks: closed unread, and not counted.
    let mut stranger = TcpStream::connect(addr).expect("connects");
    stranger.write_all(&[9; SECRET_BYTES]).expect("writes");
    let _ = send(&mut stranger, &facts(0, 4));
    let results = join_all(addr, secret, (0..4).map(|r| facts(r, 4)).collect());
    let first = results[0].as_ref().expect("rank 0 joins");
    assert_eq!(first.comm_id.as_deref(), Some("abcd"));
    assert!(matches!(first.decision, Decision::Serve { .. }));
    assert_eq!(first.facts.iter().map(|f| f.rank).collect::<Vec<_>>(), [0, 1, 2, 3]);
    for r in &results {
        assert_eq!(r.as_ref().ok(), Some(first));
    }
    let mut nothing = Vec::new();
    let _ = stranger.read_to_end(&mut nothing);
    assert!(nothing.is_empty(), "the stranger got {} bytes", nothing.len());
}

#[test]
fn ranks_that_disagree_all_get_the_same_refusal() {
    let secret = [4; SECRET_BYTES];
    let addr = listen(Ipv4Addr::LOCALHOST.into(), maker(secret, Duration::from_secs(2))).expect("listens");
    let mut all: Vec<RankFacts> = (0..3).map(|r| facts(r, 3)).collect();
    all[1].nranks = 2;
    let results = join_all(addr, secret, all);
    // A rank that comes after the refusal hears it too.
    let late = join(addr, &secret, &facts(2, 3), Duration::from_secs(5)).expect_err("refused").to_string();
    let messages: Vec<String> = results.into_iter().map(|r| r.expect_err("refused").to_string()).collect();
    assert!(messages.iter().all(|m| m == &messages[0]) && late == messages[0], "{messages:?} {late}");
    assert!(messages[0].contains("every rank must pass the same nranks"), "{}", messages[0]);
}

#[test]
fn a_missing_rank_fails_the_others_within_the_timeout_by_name() {
    let secret = [5; SECRET_BYTES];
    let addr = listen(Ipv4Addr::LOCALHOST.into(), maker(secret, Duration::from_millis(300))).expect("listens");
    let started = Instant::now();
    let results = join_all(addr, secret, (0..2).map(|r| facts(r, 3)).collect());
    assert!(started.elapsed() < Duration::from_secs(10));
    for r in results {
        let e = r.expect_err("a rank is missing").to_string();
        assert!(e.contains("1 of 3 ranks did not arrive") && e.contains("GP2P_NCCL_TIMEOUT"), "{e}");
    }
}

#[test]
fn ranks_that_say_fewer_ranks_and_come_first_make_it_and_a_latecomer_is_told_why() {
    let secret = [6; SECRET_BYTES];
    let addr = listen(Ipv4Addr::LOCALHOST.into(), maker(secret, Duration::from_secs(2))).expect("listens");
    let results = join_all(addr, secret, (0..2).map(|r| facts(r, 2)).collect());
    assert!(results.iter().all(Result::is_ok));
    let e = join(addr, &secret, &facts(2, 3), Duration::from_secs(5)).expect_err("too late").to_string();
    assert!(e.contains("made with 2 rank(s) before this one arrived"), "{e}");
}

#[test]
fn a_rendezvous_nobody_listens_on_is_named() {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("binds");
    let addr = listener.local_addr().expect("address");
    drop(listener);
    let e = join(addr, &[0; SECRET_BYTES], &facts(0, 1), Duration::from_millis(200)).expect_err("nobody there");
    assert!(e.to_string().contains("ncclGetUniqueId"), "{e}");
}

#[test]
fn secrets_compare_whole() {
    let a = [1u8; SECRET_BYTES];
    let mut b = a;
    assert!(same_secret(&a, &b));
    b[SECRET_BYTES - 1] = 0;
    assert!(!same_secret(&a, &b));
}

#[test]
fn the_real_id_is_made_once_and_only_for_a_hand_over() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let made = Arc::new(AtomicUsize::new(0));
    let counting = |secret| {
        let made = Arc::clone(&made);
        let real_id: RealIdMaker = Box::new(move || {
            made.fetch_add(1, Ordering::SeqCst);
            Ok(vec![9; crate::abi::UNIQUE_ID_BYTES])
        });
        Maker { real_id: Some(real_id), ..maker(secret, Duration::from_secs(20)) }
    };
    // Served: no real id made, none sent.
    let secret = [6; SECRET_BYTES];
    let addr = listen(Ipv4Addr::LOCALHOST.into(), counting(secret)).expect("listens");
    for r in join_all(addr, secret, (0..2).map(|r| facts(r, 2)).collect()) {
        let v = r.expect("joins");
        assert!(matches!(v.decision, Decision::Serve { .. }) && v.real_id.is_none() && v.comm_id.is_some());
    }
    assert_eq!(made.load(Ordering::SeqCst), 0);
    // Handed over (a rank has no device the door can use): one id, the same to every rank.
    let secret = [7; SECRET_BYTES];
    let addr = listen(Ipv4Addr::LOCALHOST.into(), counting(secret)).expect("listens");
    let mut all: Vec<RankFacts> = (0..3).map(|r| facts(r, 3)).collect();
    if let Ok(device) = &mut all[2].device {
        device.runs_communicator = false;
    }
    for r in join_all(addr, secret, all) {
        let v = r.expect("joins");
        assert!(matches!(v.decision, Decision::HandOver { .. }), "{:?}", v.decision);
        assert_eq!(v.real_id, Some(vec![9; crate::abi::UNIQUE_ID_BYTES]));
        assert!(v.comm_id.is_none());
    }
    assert_eq!(made.load(Ordering::SeqCst), 1);
}

#[test]
fn a_hand_over_without_a_real_nccl_where_the_id_was_made_is_refused_saying_so() {
    let secret = [8; SECRET_BYTES];
    let addr = listen(Ipv4Addr::LOCALHOST.into(), Maker { real_id: None, ..maker(secret, Duration::from_secs(20)) })
        .expect("listens");
    let mut all: Vec<RankFacts> = (0..2).map(|r| facts(r, 2)).collect();
    if let Ok(device) = &mut all[1].device {
        device.runs_communicator = false;
    }
    for r in join_all(addr, secret, all) {
        let e = r.expect_err("refused").to_string();
        assert!(e.contains("real NCCL"), "{e}");
    }
}

#[test]
fn an_unused_rendezvous_of_this_process_stops_and_frees_its_port() {
    let secret = [10; SECRET_BYTES];
    let addr = listen(Ipv4Addr::LOCALHOST.into(), maker(secret, Duration::from_secs(20))).expect("listens");
    stop_unused(addr, &[11; SECRET_BYTES]);
    std::thread::sleep(Duration::from_millis(300));
    assert!(TcpStream::connect(addr).is_ok(), "another secret stops nothing");
    stop_unused(addr, &secret);
    let closed = (0..50).any(|_| {
        std::thread::sleep(Duration::from_millis(50));
        TcpStream::connect(addr).is_err()
    });
    assert!(closed, "the listener at {addr} still takes connections");
    assert!(!listening().contains_key(&(addr, secret)), "forgotten");
}
