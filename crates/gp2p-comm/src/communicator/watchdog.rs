//! The watchdog of a communicator whose pipeline waits by stream memory operations
//! ([`crate::FlagWaits::Watched`]): such a wait holds its stream until its flag is set and
//! never gives up by itself, so a thread of the rank does what the wait kernel's clock does.
//! Each watched wait writes its lane's progress word when it starts holding (its number) and
//! when it ends ([`LEFT`] added); the thread reads the two words every few milliseconds, and
//! where one has shown the same waiting number for the peer timeout it sets the rank's
//! give-up word and the communicator's broken word, as a wait kernel that gives up does.
//! Once the communicator is broken (by this rank, another, or an abort), it writes
//! [`RELEASED`], which ends every watched wait, into every flag of the pipeline, over and
//! over while this rank still waits: whatever the calls still in flight were folding is left
//! part-done, and the next call reports why. It never touches the GPU, and it outlives the
//! communicator only while this rank's waits are in flight.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::layout::Layout;
use crate::pipeline::{LEFT, RELEASED, WATCHED_EMPTY};
use crate::registration::word;
use crate::{Result, Segment};

/// How often the thread looks while a wait is in flight, and while none is.
const LOOK_WAITING: Duration = Duration::from_millis(2);
const LOOK_IDLE: Duration = Duration::from_millis(20);

/// What one look at the progress words calls for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// No wait in flight on either lane.
    Idle,
    /// A wait in flight, within the timeout.
    Waiting,
    /// A wait has held its number for the timeout: give up.
    GiveUp,
    /// The communicator is broken and a wait is in flight: end it.
    Release,
}

/// The state of the watchdog's looks: each lane's waiting number and since when it was seen.
#[derive(Debug)]
pub(crate) struct Watch {
    timeout: Duration,
    seen: [Option<(u32, Instant)>; 2],
}

impl Watch {
    pub(crate) fn new(timeout: Duration) -> Watch {
        Watch { timeout, seen: [None, None] }
    }

    /// One look at the two lanes' progress words and the broken word, at `now`.
    pub(crate) fn look(&mut self, progress: [u32; 2], broken: bool, now: Instant) -> Verdict {
        let mut waiting = false;
        let mut overdue = false;
        for (seen, word) in self.seen.iter_mut().zip(progress) {
            // 0: no wait yet; LEFT set: the last wait ended.
            if word == 0 || word & LEFT != 0 {
                *seen = None;
                continue;
            }
            waiting = true;
            match *seen {
                Some((number, since)) if number == word => overdue |= now.duration_since(since) >= self.timeout,
                _ => *seen = Some((word, now)),
            }
        }
        match (waiting, broken) {
            (false, _) => Verdict::Idle,
            (true, true) => Verdict::Release,
            (true, false) if overdue => Verdict::GiveUp,
            (true, false) => Verdict::Waiting,
        }
    }
}

/// A rank's watchdog thread, told to stop when dropped (it stops once no wait of the rank is
/// in flight; dropping never waits for it).
#[derive(Debug)]
pub(crate) struct Watchdog {
    stop: Arc<AtomicBool>,
}

/// Every flag this rank writes as a writer, set empty the watched way before any rank can
/// call (flags start at zero, which no watched wait takes for empty).
pub(crate) fn set_own_flags_empty(segment: &Segment, layout: &Layout, rank: usize) -> Result<()> {
    for slot in 0..layout.slot_count {
        for reader in 0..layout.world {
            word(segment, layout.full(rank, slot, reader))?.store(WATCHED_EMPTY, Ordering::Relaxed);
        }
    }
    Ok(())
}

impl Watchdog {
    /// Start the thread watching `rank`'s waits in `segment` with `layout`.
    pub(crate) fn start(segment: Arc<Segment>, layout: &Layout, rank: usize, timeout: Duration) -> Result<Watchdog> {
        let words = Words::of(&segment, layout, rank)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        std::thread::Builder::new()
            .name(format!("gp2p-watchdog-{rank}"))
            .spawn(move || watch(&segment, &words, timeout, &stopped))
            .map_err(|e| crate::Error::InvalidOption {
                name: "waits",
                reason: format!("the watched waits' thread could not start ({e}); use FlagWaits::Kernel"),
            })?;
        Ok(Watchdog { stop })
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The offsets the thread reads and writes.
struct Words {
    progress: [usize; 2],
    failed: usize,
    broken: usize,
    flags: (usize, usize),
}

impl Words {
    fn of(segment: &Segment, layout: &Layout, rank: usize) -> Result<Words> {
        let words = Words {
            progress: [layout.progress(rank, 0), layout.progress(rank, 1)],
            failed: layout.flag(rank),
            broken: layout.broken(),
            flags: layout.all_flags(),
        };
        // Every offset inside the segment, checked once: the thread's reads cannot fail.
        for offset in [words.progress[0], words.progress[1], words.failed, words.broken] {
            word(segment, offset)?;
        }
        word(segment, words.flags.0 + 4 * words.flags.1.saturating_sub(1))?;
        Ok(words)
    }
}

/// The thread: look, give up or release, until told to stop with no wait in flight.
fn watch(segment: &Segment, words: &Words, timeout: Duration, stop: &AtomicBool) {
    let at = |offset: usize| -> Option<&AtomicU32> { word(segment, offset).ok() };
    let mut watch = Watch::new(timeout);
    loop {
        let progress = words.progress.map(|o| at(o).map_or(0, |w| w.load(Ordering::Acquire)));
        let broken = at(words.broken).is_some_and(|w| w.load(Ordering::Acquire) != 0);
        match watch.look(progress, broken, Instant::now()) {
            Verdict::Idle if stop.load(Ordering::Relaxed) => return,
            Verdict::Idle => std::thread::sleep(LOOK_IDLE),
            Verdict::Waiting => std::thread::sleep(LOOK_WAITING),
            Verdict::GiveUp => {
                // As a wait kernel that gives up: this rank's word, then everyone's.
                if let Some(w) = at(words.failed) {
                    w.store(1, Ordering::Release);
                }
                if let Some(w) = at(words.broken) {
                    w.store(1, Ordering::Release);
                }
            }
            Verdict::Release => {
                let (first, count) = words.flags;
                for i in 0..count {
                    if let Some(w) = at(first + 4 * i) {
                        w.store(RELEASED, Ordering::Release);
                    }
                }
                std::thread::sleep(LOOK_WAITING);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_that_holds_its_number_for_the_timeout_is_given_up_and_a_broken_one_released() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut watch = Watch::new(Duration::from_millis(100));
        assert_eq!(watch.look([0, 0], false, at(0)), Verdict::Idle, "no wait yet");
        assert_eq!(watch.look([3 | LEFT, 0], true, at(0)), Verdict::Idle, "waits ended: nothing to release");
        // Lane 0 waits on its wait 3, lane 1 on its 5 then moves on: neither lasts 100 ms.
        assert_eq!(watch.look([3, 5], false, at(10)), Verdict::Waiting);
        assert_eq!(watch.look([3, 6], false, at(90)), Verdict::Waiting);
        assert_eq!(watch.look([3 | LEFT, 6], false, at(105)), Verdict::Waiting, "lane 0 ended, lane 1 from 90");
        assert_eq!(watch.look([4, 6], false, at(189)), Verdict::Waiting, "lane 1 at 99 ms");
        assert_eq!(watch.look([4, 6], false, at(190)), Verdict::GiveUp, "lane 1 at 100 ms");
        // Once broken, a wait in flight is released, however new.
        assert_eq!(watch.look([4, 7], true, at(191)), Verdict::Release);
        assert_eq!(watch.look([4 | LEFT, 7 | LEFT], true, at(192)), Verdict::Idle);
        // A number seen again after a wait that ended starts its clock afresh.
        let mut watch = Watch::new(Duration::from_millis(100));
        assert_eq!(watch.look([1, 0], false, at(0)), Verdict::Waiting);
        assert_eq!(watch.look([1 | LEFT, 0], false, at(60)), Verdict::Idle);
        assert_eq!(watch.look([1, 0], false, at(120)), Verdict::Waiting, "120 ms after the first, 0 after this");
        assert_eq!(watch.look([1, 0], false, at(219)), Verdict::Waiting);
        assert_eq!(watch.look([1, 0], false, at(220)), Verdict::GiveUp);
    }

    #[test]
    fn the_thread_gives_up_on_a_stuck_wait_then_releases_every_flag_and_stops_once_it_ends() {
        let id = match crate::UniqueId::new() {
            Ok(id) => id,
            Err(crate::Error::NoSharedMemory { .. }) => return, // no /dev/shm here
            Err(e) => panic!("{e}"),
        };
        let options = crate::CommOptions { waits: crate::FlagWaits::Watched, ..crate::CommOptions::default() };
        let layout = Layout::new(2, &options).unwrap();
        let segment = Arc::new(Segment::join(&id, 0, 1, layout.staging_bytes(), Duration::from_secs(5)).unwrap());
        set_own_flags_empty(&segment, &layout, 0).unwrap();
        let w = |offset: usize| word(&segment, offset).unwrap();
        let (first, count) = layout.all_flags();
        assert_eq!(w(layout.full(0, 1, 1)).load(Ordering::Relaxed), WATCHED_EMPTY, "own flags start empty");
        assert_eq!(w(layout.full(1, 0, 0)).load(Ordering::Relaxed), 0, "another writer's are its own to set");
        // Rank 0's send lane enters its wait 2 and stays there.
        w(layout.progress(0, 0)).store(2, Ordering::Release);
        let started = Instant::now();
        let dog = Watchdog::start(Arc::clone(&segment), &layout, 0, Duration::from_millis(50)).unwrap();
        drop(dog); // told to stop: it still watches while a wait is in flight
        let deadline = started + Duration::from_secs(10);
        while w(first + 4 * (count - 1)).load(Ordering::Acquire) != RELEASED {
            assert!(Instant::now() < deadline, "no release within 10 s");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(started.elapsed() >= Duration::from_millis(50), "released before the timeout");
        assert_eq!(w(layout.flag(0)).load(Ordering::Acquire), 1, "this rank gave up");
        assert_eq!(w(layout.broken()).load(Ordering::Acquire), 1, "and broke the communicator");
        assert!((0..count).all(|i| w(first + 4 * i).load(Ordering::Acquire) == RELEASED), "every flag released");
        // The wait ends (as the GPU's would once released): the thread stops writing.
        w(layout.progress(0, 0)).store(2 | LEFT, Ordering::Release);
        std::thread::sleep(Duration::from_millis(100));
        w(first).store(WATCHED_EMPTY, Ordering::Release);
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(w(first).load(Ordering::Acquire), WATCHED_EMPTY, "still releasing after the waits ended");
    }
}
