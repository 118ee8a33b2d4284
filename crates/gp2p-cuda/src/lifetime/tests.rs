// A failing test is how a test reports; unwrap/expect say where.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;
use std::sync::atomic::AtomicUsize;
use std::time::Instant;

use super::*;

/// Set in the child process that runs the exit test's body.
const CHILD: &str = "GP2P_TEST_EXIT_HOOK_CHILD";

/// Blocks given back through [`count_give_back`].
static GIVEN_BACK: AtomicUsize = AtomicUsize::new(0);

fn count_give_back(_block: usize, _ptr: NonNull<u8>) {
    GIVEN_BACK.fetch_add(1, Ordering::SeqCst);
}

/// Hand the reclaimer a release that needs no driver and waits for no GPU work.
fn hand_over_one() {
    release_after(Vec::new(), Release::HostMemory { ptr: NonNull::dangling(), block: 64, give_back: count_give_back });
}

#[test]
fn from_exit_on_the_reclaimer_releases_nothing_and_nothing_waits_for_it() {
    const NAME: &str = "lifetime::tests::from_exit_on_the_reclaimer_releases_nothing_and_nothing_waits_for_it";
    if std::env::var_os(CHILD).is_none() {
        // The hook stops the process's reclaimer for good: run the body in a process of its own.
        let exe = std::env::current_exe().unwrap();
        let out = Command::new(exe).args(["--exact", NAME, "--test-threads=1"]).env(CHILD, "1").output().unwrap();
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "the child failed:\n{stdout}\n{stderr}");
        assert!(stdout.contains("1 passed"), "the child ran no test:\n{stdout}");
        return;
    }
    hand_over_one();
    flush_releases();
    assert_eq!(GIVEN_BACK.load(Ordering::SeqCst), 1, "before exit, a release runs");
    assert!(not_paused().is_some());

    stop_releases_at_exit();
    stop_releases_at_exit(); // a second exit handler's call returns at once
    hand_over_one();
    let start = Instant::now();
    flush_releases();
    assert!(start.elapsed() < Duration::from_secs(1), "flush waited {:?} for a stopped reclaimer", start.elapsed());
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(GIVEN_BACK.load(Ordering::SeqCst), 1, "a release ran after the process began to exit");
    assert!(not_paused().is_none(), "a free outside the reclaimer may still call the driver");
}
