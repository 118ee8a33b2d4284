//! The segment's lifecycle across threads and processes: joining, mode 0600, unlinking, stale
//! segments, refused arguments and timeouts. Runs without a GPU; skips where /dev/shm is missing.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: failing is how it reports

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use gp2p_comm::{Error, Segment, UniqueId};

/// Environment variable that turns this test binary into a child rank (see [`child_entry`]).
const CHILD_ENV: &str = "GP2P_COMM_TEST_CHILD";
/// Staging bytes of most tests: small, and not a multiple of a page.
const BYTES: usize = 4096 + 17;
/// Timeout of joins that are expected to succeed: generous, for loaded CI machines.
const LONG: Duration = Duration::from_secs(20);
/// Timeout of joins that are expected to time out.
const SHORT: Duration = Duration::from_millis(200);

/// Whether /dev/shm exists; prints why a test does not run where it does not.
fn shm_available(test: &str) -> bool {
    let ok = Path::new("/dev/shm").is_dir();
    if !ok {
        eprintln!("{test}: not run: /dev/shm does not exist on this machine");
    }
    ok
}

/// The file behind a segment name.
fn path_of(id: &UniqueId) -> PathBuf {
    PathBuf::from(format!("/dev/shm{}", id.segment_name()))
}

/// Removes a test's segment even when the test fails.
struct Cleanup(PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A fresh id and the guard that removes its segment.
fn fresh() -> (UniqueId, Cleanup) {
    let id = UniqueId::new().unwrap();
    let guard = Cleanup(path_of(&id));
    (id, guard)
}

/// Waits until the segment's creator has sized it (so its mode and header are set up).
fn wait_for_creation(id: &UniqueId) {
    let path = path_of(id);
    let deadline = Instant::now() + LONG;
    while std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0) == 0 {
        assert!(Instant::now() < deadline, "{} never appeared", path.display());
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Joins every rank of `world` from its own thread; returns the segments in rank order.
fn join_all(id: &UniqueId, world: usize) -> Vec<Segment> {
    std::thread::scope(|s| {
        let handles: Vec<_> =
            (0..world).map(|rank| s.spawn(move || Segment::join(id, rank, world, BYTES, LONG))).collect();
        handles.into_iter().map(|h| h.join().unwrap().unwrap()).collect()
    })
}

/// Checks that all segments map the same memory: each rank writes its own byte, reads all.
fn check_shared(segments: &[Segment]) {
    for (rank, seg) in segments.iter().enumerate() {
        assert_eq!((seg.rank(), seg.world(), seg.staging_len()), (rank, segments.len(), BYTES));
        seg.staging()[BYTES - 1 - rank].store(rank as u8 + 1, Ordering::Release);
    }
    for seg in segments {
        for rank in 0..segments.len() {
            assert_eq!(seg.staging()[BYTES - 1 - rank].load(Ordering::Acquire), rank as u8 + 1);
        }
    }
}

#[test]
fn two_ranks_join_from_threads() {
    if !shm_available("two_ranks_join_from_threads") {
        return;
    }
    let (id, _guard) = fresh();
    let segments = join_all(&id, 2);
    check_shared(&segments);
    assert!(!path_of(&id).exists(), "the name must be unlinked once every rank joined");
    let (ptr, len) = segments[0].mapping();
    assert_eq!(ptr.as_ptr() as usize % 4096, 0);
    assert_eq!(len, segments[0].staging_offset() + BYTES);
    assert_eq!(segments[0].staging_offset() % gp2p_comm::STAGING_ALIGN, 0);
}

#[test]
fn four_ranks_join_from_threads() {
    if !shm_available("four_ranks_join_from_threads") {
        return;
    }
    let (id, _guard) = fresh();
    let segments = join_all(&id, 4);
    check_shared(&segments);
    assert!(!path_of(&id).exists());
}

/// A second process joins through the id's text form, as torchrun ranks would.
#[test]
fn a_second_process_joins() {
    if !shm_available("a_second_process_joins") {
        return;
    }
    let (id, _guard) = fresh();
    let child = spawn_child(&format!("join {id} 1 2"));
    let seg = Segment::join(&id, 0, 2, BYTES, LONG).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "child failed: {}", String::from_utf8_lossy(&out.stderr));
    // The child wrote 0x5a at its last staging byte before it exited.
    assert_eq!(seg.staging()[BYTES - 1].load(Ordering::Acquire), 0x5a);
    assert!(!path_of(&id).exists());
}

#[test]
fn segment_is_private_and_unlinked_once_everyone_joined() {
    if !shm_available("segment_is_private_and_unlinked_once_everyone_joined") {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let (id, _guard) = fresh();
    std::thread::scope(|s| {
        let rank0 = s.spawn(|| Segment::join(&id, 0, 2, BYTES, LONG));
        wait_for_creation(&id);
        let mode = std::fs::metadata(path_of(&id)).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "mode {mode:o}");
        assert!(path_of(&id).exists(), "unlinked before every rank joined");
        let rank1 = Segment::join(&id, 1, 2, BYTES, LONG).unwrap();
        let rank0 = rank0.join().unwrap().unwrap();
        check_shared(&[rank0, rank1]);
    });
    assert!(!path_of(&id).exists());
}

/// A segment whose every process died (a crashed run) goes at the next creation; one a live
/// process waits on stays.
#[test]
fn stale_segment_removed_live_one_kept() {
    if !shm_available("stale_segment_removed_live_one_kept") {
        return;
    }
    let (stale, _g1) = fresh();
    let (live, _g2) = fresh();
    let (next, _g3) = fresh();

    let mut child = spawn_child(&format!("hang {stale}"));
    wait_for_creation(&stale);
    // A mismatched join returns once the creator has set the header up.
    assert!(matches!(Segment::join(&stale, 1, 3, BYTES, LONG), Err(Error::WorldMismatch { here: 3, segment: 2 })));
    child.kill().unwrap();
    child.wait().unwrap();
    // The crashed run left its segment behind (not asserted: another test's creation, running
    // in parallel, may remove it first, which is as right).

    std::thread::scope(|s| {
        let waiting = s.spawn(|| Segment::join(&live, 0, 2, BYTES, LONG));
        wait_for_creation(&live);
        let _ = Segment::join(&live, 0, 3, BYTES, LONG);

        Segment::join(&next, 0, 1, BYTES, LONG).unwrap();
        assert!(!path_of(&stale).exists(), "a segment of dead processes must be removed at the next creation");
        assert!(path_of(&live).exists(), "a segment a live process waits on must be kept");
        assert!(!path_of(&next).exists(), "a world of one is complete at once");

        Segment::join(&live, 1, 2, BYTES, LONG).unwrap();
        waiting.join().unwrap().unwrap();
    });
}

#[test]
fn mismatched_world_and_bytes_refused() {
    if !shm_available("mismatched_world_and_bytes_refused") {
        return;
    }
    let (id, _guard) = fresh();
    std::thread::scope(|s| {
        let rank0 = s.spawn(|| Segment::join(&id, 0, 2, BYTES, LONG));
        wait_for_creation(&id);
        let e = Segment::join(&id, 1, 4, BYTES, LONG).unwrap_err();
        assert!(matches!(e, Error::WorldMismatch { here: 4, segment: 2 }), "{e}");
        assert_eq!(
            e.to_string(),
            "world: this rank says 4, the segment was created for 2 ranks; every rank must pass the same world size"
        );
        let e = Segment::join(&id, 1, 2, 2 * BYTES, LONG).unwrap_err();
        assert!(matches!(e, Error::BytesMismatch { here, segment: BYTES } if here == 2 * BYTES), "{e}");
        assert!(e.to_string().contains("every rank must pass the same staging size"), "{e}");
        // The refused ranks left no trace: the right one still completes the communicator.
        Segment::join(&id, 1, 2, BYTES, LONG).unwrap();
        rank0.join().unwrap().unwrap();
    });
    assert!(!path_of(&id).exists());
}

#[test]
fn duplicate_rank_refused() {
    if !shm_available("duplicate_rank_refused") {
        return;
    }
    let (id, _guard) = fresh();
    let (tx, rx) = mpsc::channel();
    std::thread::scope(|s| {
        // Two threads claim rank 0; whichever comes second is refused at once.
        for _ in 0..2 {
            let tx = tx.clone();
            s.spawn(move || tx.send(Segment::join(&id, 0, 2, BYTES, LONG)).unwrap());
        }
        let first = rx.recv_timeout(LONG).unwrap().unwrap_err();
        let pid = std::process::id() as i32;
        assert!(matches!(first, Error::RankTaken { rank: 0, pid: p } if p == pid), "{first}");
        assert!(first.to_string().contains("every rank must pass a different rank"), "{first}");
        Segment::join(&id, 1, 2, BYTES, LONG).unwrap();
        rx.recv_timeout(LONG).unwrap().unwrap();
    });
    assert!(!path_of(&id).exists());
}

#[test]
fn bad_rank_and_world_refused_before_anything_is_created() {
    if !shm_available("bad_rank_and_world_refused_before_anything_is_created") {
        return;
    }
    let (id, _guard) = fresh();
    let e = Segment::join(&id, 2, 2, BYTES, LONG).unwrap_err();
    assert!(matches!(e, Error::Rank { rank: 2, world: 2 }), "{e}");
    assert_eq!(e.to_string(), "rank: 2 is not below the world size 2; pass a rank in 0..2");
    assert!(matches!(Segment::join(&id, 0, 0, BYTES, LONG), Err(Error::World { world: 0, .. })));
    let too_many = gp2p_comm::MAX_WORLD + 1;
    assert!(matches!(Segment::join(&id, 0, too_many, BYTES, LONG), Err(Error::World { .. })));
    assert!(matches!(Segment::join(&id, 0, 2, usize::MAX, LONG), Err(Error::StagingTooLarge { .. })));
    assert!(!path_of(&id).exists());
}

#[test]
fn missing_peer_times_out_naming_it() {
    if !shm_available("missing_peer_times_out_naming_it") {
        return;
    }
    let (id, _guard) = fresh();
    let start = Instant::now();
    let e = Segment::join(&id, 0, 2, BYTES, SHORT).unwrap_err();
    let took = start.elapsed();
    assert!(matches!(&e, Error::PeersMissing { missing, world: 2, .. } if missing == &[1]), "{e}");
    assert!(e.to_string().starts_with("ranks [1] of 2 never joined within"), "{e}");
    assert!(took >= SHORT && took < SHORT * 10, "took {took:?}");
    assert!(!path_of(&id).exists(), "a communicator that timed out must leave no segment");

    // Two of three ranks come: both name the third.
    let (id, _guard) = fresh();
    std::thread::scope(|s| {
        let waits: Vec<_> = [0, 2].map(|rank| s.spawn(move || Segment::join(&id, rank, 3, BYTES, SHORT))).into();
        for w in waits {
            let e = w.join().unwrap().unwrap_err();
            // Rank 1 always; on a loaded machine the other thread may have come too late as well.
            assert!(matches!(&e, Error::PeersMissing { missing, world: 3, .. } if missing.contains(&1)), "{e}");
        }
    });
    assert!(!path_of(&id).exists());
}

/// An id made where /dev/shm is another filesystem (another container) is refused by name.
#[test]
fn other_shared_memory_refused() {
    if !shm_available("other_shared_memory_refused") {
        return;
    }
    let (id, _guard) = fresh();
    let mut bytes = id.to_bytes();
    // The inode of /dev/shm: after magic (4), version (1), token (16) and device (8).
    bytes[29] ^= 0xff;
    let other = UniqueId::from_bytes(&bytes).unwrap();
    let e = Segment::join(&other, 0, 2, BYTES, LONG).unwrap_err();
    assert!(matches!(e, Error::OtherSharedMemory { .. }), "{e}");
    assert!(e.to_string().contains("share one /dev/shm"), "{e}");
    assert!(!path_of(&other).exists());
}

/// Runs this test binary as a child rank: `GP2P_COMM_TEST_CHILD` holds what to do.
fn spawn_child(what: &str) -> std::process::Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, what)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The child side of the multi-process tests; does nothing in a normal run.
/// - `join <id> <rank> <world>`: joins, writes 0x5a at the last staging byte, exits.
/// - `hang <id>`: creates the segment as rank 0 of 2 and waits until it is killed.
#[test]
fn child_entry() {
    let Ok(what) = std::env::var(CHILD_ENV) else { return };
    let words: Vec<&str> = what.split_whitespace().collect();
    match words.as_slice() {
        ["join", id, rank, world] => {
            let id: UniqueId = id.parse().unwrap();
            let seg = Segment::join(&id, rank.parse().unwrap(), world.parse().unwrap(), BYTES, LONG).unwrap();
            seg.staging()[BYTES - 1].store(0x5a, Ordering::Release);
        }
        ["hang", id] => {
            let id: UniqueId = id.parse().unwrap();
            let _ = Segment::join(&id, 0, 2, BYTES, Duration::from_secs(60));
            panic!("the hanging child was not killed");
        }
        _ => panic!("unknown child mode {what:?}"),
    }
}
