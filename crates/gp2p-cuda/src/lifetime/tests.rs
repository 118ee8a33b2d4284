// A failing test is how a test reports; unwrap/expect say where.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;

/// Blocks given back through [`slow_give_back`].
static GIVEN_BACK: AtomicUsize = AtomicUsize::new(0);

/// A release that takes a while on the reclaimer's thread, so a caller that does not wait for
/// it sees it undone.
fn slow_give_back(_block: usize, _ptr: NonNull<u8>) {
    std::thread::sleep(Duration::from_millis(30));
    GIVEN_BACK.fetch_add(1, Ordering::SeqCst);
}

#[test]
fn waiting_for_the_releases_since_a_mark_returns_once_each_has_run() {
    let mark = releases_queued();
    let before = GIVEN_BACK.load(Ordering::SeqCst);
    for _ in 0..3 {
        // No points: ready at once, released by the reclaimer in its own time.
        release_after(
            Vec::new(),
            Release::HostMemory { ptr: NonNull::dangling(), block: 64, give_back: slow_give_back },
        );
    }
    assert!(releases_queued() >= mark + 3);
    wait_for_releases_since(mark);
    assert_eq!(GIVEN_BACK.load(Ordering::SeqCst) - before, 3, "returned before its releases ran");
    // Nothing handed over since: returns at once.
    let start = std::time::Instant::now();
    wait_for_releases_since(releases_queued());
    assert!(start.elapsed() < Duration::from_millis(20), "waited {:?} for nothing", start.elapsed());
}
