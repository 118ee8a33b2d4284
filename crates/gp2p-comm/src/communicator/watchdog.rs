//! The watchdog of a communicator whose pipeline waits by stream memory operations
//! ([`crate::FlagWaits::Watched`]): such a wait holds its stream until its flag is set and
//! never gives up by itself, so a thread of the rank does what the wait kernel's clock does.
//! Each watched wait takes the next number of its lane (rising across runs and calls, the
//! host's count shared with the thread) and writes it to its lane's progress word when it
//! starts holding, and again with [`LEFT`] added when it ends. The thread reads the two words
//! every few milliseconds; where one has shown the same waiting number for the peer timeout
//! it sets the rank's give-up word and the communicator's broken word, as a wait kernel that
//! gives up does. Once the communicator is broken (by this rank, another, or an abort), it
//! writes [`RELEASED`], which ends every watched wait, into every flag of the pipeline, over
//! and over while this rank still waits: whatever the calls in flight were folding is left
//! part-done, and the next call reports why. It never touches the GPU. Told to stop (the
//! communicator dropped), it goes on until every wait enqueued has ended, or, once broken,
//! until nothing has moved for twice the timeout (a context that no longer runs).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use gp2p_cuda::Stream;

use crate::layout::Layout;
use crate::pipeline::{LEFT, RELEASED, WATCHED_EMPTY};
use crate::registration::word;
use crate::{Error, FlagWaits, Result, Segment};

/// How often the thread looks while a wait is in flight, and while none is.
const LOOK_WAITING: Duration = Duration::from_millis(2);
const LOOK_IDLE: Duration = Duration::from_millis(20);

/// A look later than this after the one before (and than a quarter of the timeout) was
/// late: the time between is not counted against any wait.
const LATE_FLOOR: Duration = Duration::from_millis(100);

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

/// The state of the watchdog's looks: each lane's waiting number and since when it was seen,
/// and when it last looked.
#[derive(Debug)]
pub(crate) struct Watch {
    timeout: Duration,
    seen: [Option<(u32, Instant)>; 2],
    last_look: Option<Instant>,
}

impl Watch {
    pub(crate) fn new(timeout: Duration) -> Watch {
        Watch { timeout, seen: [None, None], last_look: None }
    }

    /// One look at the two lanes' progress words and the broken word, at `now`. A look late
    /// after the one before (the thread not run for a quarter of the timeout, and at least
    /// [`LATE_FLOOR`]) counts none of the time between against a wait: what happened then is
    /// unknown, and giving up wrongly breaks every rank.
    pub(crate) fn look(&mut self, progress: [u32; 2], broken: bool, now: Instant) -> Verdict {
        if let Some(last) = self.last_look {
            let gap = now.duration_since(last);
            if gap > (self.timeout / 4).max(LATE_FLOOR) {
                for (_, since) in self.seen.iter_mut().flatten() {
                    *since += gap;
                }
            }
        }
        self.last_look = Some(now);
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

/// Whether every wait enqueued has ended: each lane's word shows its last number (the host's
/// count, `numbers`) ended, or no number was ever taken.
pub(crate) fn all_ended(progress: [u32; 2], numbers: [u32; 2]) -> bool {
    progress.into_iter().zip(numbers).all(|(word, last)| last == 0 || word == last | LEFT)
}

/// Whether every lane's last wait enqueued has started (ended or not): no later wait is left
/// for the GPU to reach.
pub(crate) fn all_started(progress: [u32; 2], numbers: [u32; 2]) -> bool {
    progress.into_iter().zip(numbers).all(|(word, last)| last == 0 || word & !LEFT == last)
}

/// A rank's watchdog thread, told to stop when dropped (it stops once no wait of the rank is
/// in flight; dropping never waits for it).
#[derive(Debug)]
pub(crate) struct Watchdog {
    stop: Arc<AtomicBool>,
}

/// Refuse watched waits where calls replay from graphs (`crate::replay`): a graph repeats
/// its waits' numbers, which the watchdog tells waits apart by.
pub(crate) fn refuse_replays(waits: FlagWaits, replay_calls: bool) -> Result<()> {
    if waits == FlagWaits::Watched && replay_calls {
        return Err(Error::InvalidOption {
            name: "waits",
            reason: "watched: calls replayed from graphs (GP2P_REPLAY, CommOptions::replay_calls) would repeat their \
                     waits' numbers, which the watchdog tells waits apart by; take FlagWaits::Kernel, or replays off"
                .into(),
        });
    }
    Ok(())
}

/// Refuse a call of the pipeline on a capturing stream where the waits are watched, before it
/// is enqueued (the communicator stays whole), for the same reason.
pub(crate) fn refuse_capture(waits: FlagWaits, stream: &Stream) -> Result<()> {
    if waits == FlagWaits::Watched && stream.is_capturing()? {
        return Err(Error::InvalidOption {
            name: "waits",
            reason: "watched: a call of the pipeline cannot be captured into a graph (its waits' numbers would repeat \
                     at every launch); take FlagWaits::Kernel for graphs"
                .into(),
        });
    }
    Ok(())
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
    /// Start the thread watching `rank`'s waits in `segment` with `layout`, the lanes' last
    /// numbers in `numbers`.
    pub(crate) fn start(
        segment: Arc<Segment>,
        layout: &Layout,
        rank: usize,
        timeout: Duration,
        numbers: Arc<[AtomicU32; 2]>,
    ) -> Result<Watchdog> {
        // Every word inside the segment, checked here, so the thread finds them too.
        Words::of(&segment, layout, rank)?;
        let (layout, stop) = (*layout, Arc::new(AtomicBool::new(false)));
        let stopped = Arc::clone(&stop);
        std::thread::Builder::new()
            .name(format!("gp2p-watchdog-{rank}"))
            .spawn(move || {
                if let Ok(words) = Words::of(&segment, &layout, rank) {
                    watch(&words, timeout, &numbers, &stopped);
                }
            })
            .map_err(|e| Error::InvalidOption {
                name: "waits",
                reason: format!("the watched waits' thread could not start ({e}); use FlagWaits::Kernel"),
            })?;
        Ok(Watchdog { stop })
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        // Release: the thread that sees it sees every number taken before.
        self.stop.store(true, Ordering::Release);
    }
}

/// The words the thread reads and writes, in the segment.
struct Words<'a> {
    progress: [&'a AtomicU32; 2],
    failed: &'a AtomicU32,
    broken: &'a AtomicU32,
    flags: Vec<&'a AtomicU32>,
}

impl<'a> Words<'a> {
    fn of(segment: &'a Segment, layout: &Layout, rank: usize) -> Result<Words<'a>> {
        let (first, count) = layout.all_flags();
        Ok(Words {
            progress: [word(segment, layout.progress(rank, 0))?, word(segment, layout.progress(rank, 1))?],
            failed: word(segment, layout.flag(rank))?,
            broken: word(segment, layout.broken())?,
            flags: (0..count).map(|i| word(segment, first + 4 * i)).collect::<Result<_>>()?,
        })
    }
}

/// The thread: look, give up or release, until told to stop and every wait enqueued has
/// ended, or, broken, nothing has moved for twice the timeout.
fn watch(words: &Words<'_>, timeout: Duration, numbers: &[AtomicU32; 2], stop: &AtomicBool) {
    let mut watch = Watch::new(timeout);
    let mut moved = (None, Instant::now());
    loop {
        let progress = words.progress.map(|w| w.load(Ordering::Acquire));
        let broken = words.broken.load(Ordering::Acquire) != 0;
        let now = Instant::now();
        if moved.0 != Some(progress) {
            moved = (Some(progress), now);
        }
        if stop.load(Ordering::Acquire) {
            let last = numbers.each_ref().map(|n| n.load(Ordering::Acquire));
            // A call not yet started is watched however long it takes to start; a broken
            // communicator whose last waits have started and not moved for twice the timeout,
            // released, has a context that no longer runs.
            let quiet = now.duration_since(moved.1) > 2 * timeout;
            if all_ended(progress, last) || (broken && quiet && all_started(progress, last)) {
                return;
            }
        }
        match watch.look(progress, broken, now) {
            Verdict::Idle => std::thread::sleep(LOOK_IDLE),
            Verdict::Waiting => std::thread::sleep(LOOK_WAITING),
            Verdict::GiveUp => {
                // As a wait kernel that gives up: this rank's word, then everyone's.
                words.failed.store(1, Ordering::Release);
                words.broken.store(1, Ordering::Release);
            }
            Verdict::Release => {
                for flag in &words.flags {
                    flag.store(RELEASED, Ordering::Release);
                }
                std::thread::sleep(LOOK_WAITING);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A segment laid out for two ranks with watched waits, joined by this process alone as
    /// rank 0; None where there is no /dev/shm.
    fn watched_segment() -> Option<(Arc<Segment>, Layout)> {
        let id = match crate::UniqueId::new() {
            Ok(id) => id,
            Err(crate::Error::NoSharedMemory { .. }) => return None,
            Err(e) => panic!("{e}"),
        };
        let options = crate::CommOptions { waits: crate::FlagWaits::Watched, ..crate::CommOptions::default() };
        let layout = Layout::new(2, &options).unwrap();
        let segment = Segment::join(&id, 0, 1, layout.staging_bytes(), Duration::from_secs(5)).unwrap();
        Some((Arc::new(segment), layout))
    }

    #[test]
    fn watched_waits_refuse_replays_and_other_waits_do_not() {
        for waits in FlagWaits::ALL {
            assert!(refuse_replays(waits, false).is_ok());
            let refused = refuse_replays(waits, true);
            assert_eq!(refused.is_err(), waits == FlagWaits::Watched, "{waits:?}");
            if let Err(e) = refused {
                assert!(e.to_string().contains("GP2P_REPLAY") && e.to_string().contains("Kernel"), "{e}");
            }
        }
    }

    #[test]
    fn a_wait_that_holds_its_number_for_the_timeout_is_given_up_and_a_broken_one_released() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut watch = Watch::new(Duration::from_millis(100));
        // Looks every 10 ms (well within a quarter of the timeout) from `from` to `to`, all
        // seeing `progress`: the verdict of each.
        let mut looks = |from: u64, to: u64, progress: [u32; 2], broken: bool| -> Vec<Verdict> {
            (from..=to).step_by(10).map(|ms| watch.look(progress, broken, at(ms))).collect()
        };
        assert_eq!(looks(0, 0, [0, 0], false), [Verdict::Idle], "no wait yet");
        assert_eq!(looks(10, 10, [3 | LEFT, 0], true), [Verdict::Idle], "waits ended: nothing to release");
        // Lane 0 waits on its wait 3, lane 1 on its 5 then its 6: neither lasts 100 ms.
        assert!(looks(20, 90, [3, 5], false).iter().all(|v| *v == Verdict::Waiting));
        assert!(looks(100, 110, [3, 6], false).iter().all(|v| *v == Verdict::Waiting), "lane 0 at 90 ms");
        assert_eq!(looks(120, 120, [3, 6], false), [Verdict::GiveUp], "lane 0 at 100 ms");
        // Lane 0's wait ends; lane 1's 6, from 100 ms, lasts to 200.
        assert!(looks(130, 190, [3 | LEFT, 6], false).iter().all(|v| *v == Verdict::Waiting));
        assert_eq!(looks(200, 200, [3 | LEFT, 6], false), [Verdict::GiveUp]);
        // Once broken, a wait in flight is released, however new.
        assert_eq!(looks(210, 210, [4, 6 | LEFT], true), [Verdict::Release]);
        assert_eq!(looks(220, 220, [4 | LEFT, 6 | LEFT], true), [Verdict::Idle]);
        // A late look (past the floor of 100 ms here) counts none of the time before it.
        let mut watch = Watch::new(Duration::from_millis(100));
        assert_eq!(watch.look([9, 0], false, at(0)), Verdict::Waiting);
        assert_eq!(watch.look([9, 0], false, at(50)), Verdict::Waiting, "50 ms watched");
        assert_eq!(watch.look([9, 0], false, at(250)), Verdict::Waiting, "200 ms unwatched: still 50");
        assert_eq!(watch.look([9, 0], false, at(299)), Verdict::Waiting, "99 ms watched");
        assert_eq!(watch.look([9, 0], false, at(300)), Verdict::GiveUp, "100 ms watched");
        // A number seen again after a wait that ended starts its clock afresh.
        let mut watch = Watch::new(Duration::from_millis(100));
        assert_eq!(watch.look([1, 0], false, at(0)), Verdict::Waiting);
        assert_eq!(watch.look([1 | LEFT, 0], false, at(60)), Verdict::Idle);
        assert_eq!(watch.look([1, 0], false, at(80)), Verdict::Waiting, "80 ms after the first, 0 after this");
        assert_eq!(watch.look([1, 0], false, at(100)), Verdict::Waiting);
        assert_eq!(watch.look([1, 0], false, at(120)), Verdict::Waiting);
        assert_eq!(watch.look([1, 0], false, at(140)), Verdict::Waiting);
        assert_eq!(watch.look([1, 0], false, at(160)), Verdict::Waiting);
        assert_eq!(watch.look([1, 0], false, at(180)), Verdict::GiveUp);
        // Every wait enqueued has ended where each lane shows its last number ended.
        assert!(all_ended([0, 0], [0, 0]), "none taken");
        assert!(all_ended([4 | LEFT, 0], [4, 0]));
        assert!(!all_ended([4, 0], [4, 0]), "lane 0's last still holds");
        assert!(!all_ended([3 | LEFT, 0], [4, 0]), "lane 0's last not yet started");
        assert!(!all_ended([4 | LEFT, 0], [4, 1]), "lane 1's only wait not yet started");
        assert!(all_started([4, 1 | LEFT], [4, 1]) && !all_started([3 | LEFT, 0], [4, 0]));
    }

    #[test]
    fn told_to_stop_the_thread_watches_until_the_last_wait_enqueued_has_ended() {
        let Some((segment, layout)) = watched_segment() else { return };
        let w = |offset: usize| word(&segment, offset).unwrap();
        // Lane 0's wait 3 is enqueued; the GPU has ended its wait 2 and not reached 3.
        w(layout.progress(0, 0)).store(2 | LEFT, Ordering::Release);
        let numbers = Arc::new([AtomicU32::new(3), AtomicU32::new(0)]);
        drop(Watchdog::start(Arc::clone(&segment), &layout, 0, Duration::from_secs(60), numbers).unwrap());
        let alive = || Arc::strong_count(&segment) > 1;
        std::thread::sleep(Duration::from_millis(100));
        assert!(alive(), "gone before wait 3 started");
        w(layout.progress(0, 0)).store(3, Ordering::Release);
        std::thread::sleep(Duration::from_millis(100));
        assert!(alive(), "gone while wait 3 holds");
        w(layout.progress(0, 0)).store(3 | LEFT, Ordering::Release);
        let deadline = Instant::now() + Duration::from_secs(10);
        while alive() {
            assert!(Instant::now() < deadline, "still there 10 s after the last wait ended");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn the_thread_gives_up_on_a_stuck_wait_then_releases_every_flag_and_stops_once_it_ends() {
        let Some((segment, layout)) = watched_segment() else { return };
        set_own_flags_empty(&segment, &layout, 0).unwrap();
        let w = |offset: usize| word(&segment, offset).unwrap();
        let (first, count) = layout.all_flags();
        assert_eq!(w(layout.full(0, 1, 1)).load(Ordering::Relaxed), WATCHED_EMPTY, "own flags start empty");
        assert_eq!(w(layout.full(1, 0, 0)).load(Ordering::Relaxed), 0, "another writer's are its own to set");
        // Rank 0's send lane enters its wait 2 and stays there.
        w(layout.progress(0, 0)).store(2, Ordering::Release);
        let started = Instant::now();
        let numbers = Arc::new([AtomicU32::new(2), AtomicU32::new(0)]);
        let dog = Watchdog::start(Arc::clone(&segment), &layout, 0, Duration::from_millis(50), numbers).unwrap();
        drop(dog); // told to stop: it still watches while a wait enqueued has not ended
        let deadline = started + Duration::from_secs(10);
        while w(first + 4 * (count - 1)).load(Ordering::Acquire) != RELEASED {
            assert!(Instant::now() < deadline, "no release within 10 s");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(started.elapsed() >= Duration::from_millis(50), "released before the timeout");
        assert_eq!(w(layout.flag(0)).load(Ordering::Acquire), 1, "this rank gave up");
        assert_eq!(w(layout.broken()).load(Ordering::Acquire), 1, "and broke the communicator");
        assert!((0..count).all(|i| w(first + 4 * i).load(Ordering::Acquire) == RELEASED), "every flag released");
        // The wait ends (as the GPU's would once released): every wait enqueued has ended, so
        // the thread, told to stop, ends (and lets go of the segment).
        w(layout.progress(0, 0)).store(2 | LEFT, Ordering::Release);
        while Arc::strong_count(&segment) > 1 {
            assert!(Instant::now() < deadline, "the thread did not end within 10 s");
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
