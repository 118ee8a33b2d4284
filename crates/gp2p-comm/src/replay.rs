//! The pipeline's calls replayed from CUDA graphs
//! ([`CommOptions::replay_calls`](crate::CommOptions::replay_calls)): the second time a call
//! with the same buffers, sizes and op comes, it is captured into a graph (its copies, flag
//! writes and waits recorded, nothing run) and launched; every later such call launches the
//! kept graph again, one driver call where enqueuing takes one per operation (hundreds for a
//! large call among eight ranks, and then the host waits once the driver's queue is full:
//! `benches/results/h10080gbhbm3/comm-all-reduce-8.txt` as of 91413aa, `git show
//! a399dea:<file>`, spent 78 of a 105 ms call enqueuing at 256 MiB). Between calls nothing of
//! the graph changes: the calls the ranks pair up are the same whether enqueued or replayed.
//!
//! Off unless asked for; never where a peer rank is a thread of this process (a graph is made
//! in the context the peers' kernels wait in, see the communicator's launch cache). Measured
//! once against enqueuing (bf16, 1-64 MiB among 2, 4 and 8 processes on one H100,
//! `benches/results/h10080gbhbm3/comm-replay.txt`): from 4 MiB it cut the host's time a call
//! to 0.31-0.56 of enqueuing's; the compressed all-reduce took 2-25 % less time among 2 and 4
//! processes and the exact one 0-11 % less among 2, but among 4 the exact one's times moved by
//! −37 % to +2 %, and among 8 the exact one took 4-36 % more at 1-16 MiB and the compressed one
//! −22 % to +12 %; one run a side, on a test bed whose runs spread by as much. Not enough to
//! turn it on for everyone.

use crate::{Error, Result};

/// The environment variable that turns replays on where the options leave it open: `on`
/// (or `1`, `true`) or `off` (`0`, `false`).
pub const REPLAY_VAR: &str = "GP2P_REPLAY";

/// Calls a pipeline keeps track of, the least recently run dropped first: a training step's
/// gradient buckets, whose addresses recur every step. A call's graph is captured the second
/// time its key is seen, so buffers that never recur (a server's fresh output tensors) cost
/// no capture.
pub(crate) const KEPT_CALLS: usize = 16;

/// Whether a communicator made with `option` replays its calls, given `env`, the value of
/// [`REPLAY_VAR`] if set: the option where it says, else the variable, else not. A value the
/// variable does not take is refused, naming it.
pub(crate) fn resolve(option: Option<bool>, env: Option<&str>) -> Result<bool> {
    if let Some(on) = option {
        return Ok(on);
    }
    match env.map(|v| v.trim().to_ascii_lowercase()).as_deref() {
        None | Some("" | "off" | "0" | "false") => Ok(false),
        Some("on" | "1" | "true") => Ok(true),
        Some(other) => Err(Error::InvalidOption {
            name: REPLAY_VAR,
            reason: format!("{other:?} is neither on nor off: set {REPLAY_VAR}=on, {REPLAY_VAR}=off, or unset it"),
        }),
    }
}

/// How a pipeline's calls ran since it was made (`Communicator::replay_counts`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplayCounts {
    /// Calls launched from a graph captured at an earlier call.
    pub replayed: u64,
    /// Calls captured into a graph, then launched.
    pub captured: u64,
    /// Calls enqueued: the first of their key, or one whose capture had failed.
    pub enqueued: u64,
    /// Captures that failed (their calls were enqueued instead, and so will later ones with
    /// the same key be), and the first one's error.
    pub failed_captures: u64,
    /// See [`ReplayCounts::failed_captures`].
    pub first_failure: Option<String>,
}

/// Where a call's key stands.
enum State<G> {
    /// Enqueued once: captured if it comes again.
    Seen,
    Graph(G),
    /// Its capture failed: enqueued every time.
    Failed,
}

struct Kept<K, G> {
    key: K,
    state: State<G>,
    last_used: u64,
}

/// The graphs of a pipeline's calls, by the call they record (`K`: everything the call's
/// enqueue depends on); `G` the graph.
pub(crate) struct Replays<K, G> {
    kept: Vec<Kept<K, G>>,
    uses: u64,
    counts: ReplayCounts,
}

impl<K, G> Replays<K, G> {
    pub(crate) fn new() -> Replays<K, G> {
        Replays { kept: Vec::new(), uses: 0, counts: ReplayCounts::default() }
    }

    /// Run the call whose key `is_key` knows (`key` makes it, only for a key not kept yet, so
    /// a replay copies nothing): `launch` its kept graph; else, the second time the key comes,
    /// `capture` one, keep it and `launch` it; else (the first time, or once its capture
    /// failed) `enqueue` it. Errors of `launch` and `enqueue` are the call's; a failed capture
    /// is not (the call is enqueued instead, as it would have been without replays).
    pub(crate) fn run<E: std::fmt::Display>(
        &mut self,
        is_key: impl Fn(&K) -> bool,
        key: impl FnOnce() -> K,
        capture: impl FnOnce() -> Result<G, E>,
        launch: impl FnOnce(&G) -> Result<()>,
        enqueue: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        self.uses += 1;
        let uses = self.uses;
        let Some(kept) = self.kept.iter_mut().find(|k| is_key(&k.key)) else {
            if self.kept.len() >= KEPT_CALLS
                && let Some(oldest) = self.kept.iter().enumerate().min_by_key(|(_, k)| k.last_used).map(|(i, _)| i)
            {
                // A graph still running is freed once it completes (its drop never blocks).
                self.kept.swap_remove(oldest);
            }
            self.kept.push(Kept { key: key(), state: State::Seen, last_used: uses });
            self.counts.enqueued += 1;
            return enqueue();
        };
        kept.last_used = uses;
        if matches!(kept.state, State::Seen) {
            kept.state = match capture() {
                Ok(graph) => {
                    self.counts.captured += 1;
                    State::Graph(graph)
                }
                Err(e) => {
                    self.counts.failed_captures += 1;
                    self.counts.first_failure.get_or_insert_with(|| e.to_string());
                    State::Failed
                }
            };
            if let State::Graph(graph) = &kept.state {
                return launch(graph);
            }
        }
        match &kept.state {
            State::Graph(graph) => {
                self.counts.replayed += 1;
                launch(graph)
            }
            _ => {
                self.counts.enqueued += 1;
                enqueue()
            }
        }
    }

    /// How the calls ran so far.
    pub(crate) fn counts(&self) -> &ReplayCounts {
        &self.counts
    }
}

impl<K, G> std::fmt::Debug for Replays<K, G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Replays({} calls kept)", self.kept.len())
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;

    #[test]
    fn the_option_wins_then_the_variable_then_off() {
        assert!(resolve(Some(true), Some("off")).is_ok_and(|on| on));
        assert!(resolve(Some(false), Some("on")).is_ok_and(|on| !on));
        assert!(resolve(None, Some(" On ")).is_ok_and(|on| on));
        assert!(resolve(None, Some("1")).is_ok_and(|on| on));
        assert!(resolve(None, Some("false")).is_ok_and(|on| !on));
        assert!(resolve(None, Some("")).is_ok_and(|on| !on));
        assert!(resolve(None, None).is_ok_and(|on| !on));
        let Err(Error::InvalidOption { name, reason }) = resolve(None, Some("sometimes")) else {
            unreachable!("a value the variable does not take is refused")
        };
        assert_eq!(name, REPLAY_VAR);
        assert!(reason.contains("GP2P_REPLAY=on"), "{reason}");
    }

    /// Runs `key` through `replays`, capturing graph `key * 10` unless `key` is odd, and says
    /// which graph launched (`None`: the call was enqueued).
    fn call(replays: &mut Replays<u32, u32>, key: u32) -> Option<u32> {
        let launched = RefCell::new(None);
        let capture = || if key % 2 == 1 { Err("no capture") } else { Ok(key * 10) };
        let launch = |g: &u32| {
            *launched.borrow_mut() = Some(*g);
            Ok(())
        };
        let Ok(()) = replays.run(|k| *k == key, || key, capture, launch, || Ok(())) else {
            unreachable!("neither launch nor enqueue fails here")
        };
        launched.into_inner()
    }

    #[test]
    fn a_call_is_captured_the_second_time_then_replayed_and_one_that_cannot_be_is_enqueued() {
        let mut replays = Replays::new();
        assert_eq!(call(&mut replays, 2), None, "enqueued the first time");
        assert_eq!(call(&mut replays, 2), Some(20), "captured the second");
        assert_eq!(call(&mut replays, 2), Some(20), "replayed after");
        assert_eq!(call(&mut replays, 3), None);
        assert_eq!(call(&mut replays, 3), None, "its capture fails");
        assert_eq!(call(&mut replays, 3), None, "and is not tried again");
        let counts = replays.counts().clone();
        assert_eq!((counts.replayed, counts.captured, counts.enqueued, counts.failed_captures), (1, 1, 4, 1));
        assert_eq!(counts.first_failure.as_deref(), Some("no capture"));
    }

    #[test]
    fn past_the_kept_calls_the_least_recently_run_goes() {
        let mut replays = Replays::new();
        for key in 0..KEPT_CALLS as u32 {
            call(&mut replays, 2 * key);
            assert_eq!(call(&mut replays, 2 * key), Some(20 * key));
        }
        // Key 0 ran last: key 2 is now the oldest, and goes for a new call.
        assert_eq!(call(&mut replays, 0), Some(0));
        assert_eq!(call(&mut replays, 100), None);
        assert_eq!(call(&mut replays, 0), Some(0));
        assert_eq!(call(&mut replays, 2), None, "dropped, so seen anew");
        assert_eq!(replays.counts().captured, KEPT_CALLS as u64);
    }

    #[test]
    fn errors_of_launches_and_enqueues_are_the_call_s() {
        let mut replays: Replays<u32, u32> = Replays::new();
        let fails = || Err(Error::CaptureRefused);
        let failed = replays.run(|k| *k == 2, || 2, || Ok::<_, &str>(20), |_| Ok(()), fails);
        assert!(matches!(failed, Err(Error::CaptureRefused)), "the first call's enqueue");
        let failed = replays.run(|k| *k == 2, || 2, || Ok::<_, &str>(20), |_| Err(Error::CaptureRefused), || Ok(()));
        assert!(matches!(failed, Err(Error::CaptureRefused)), "the launch of its capture");
        let failed = replays.run(|k| *k == 2, || 2, || Ok::<_, &str>(20), |_| Err(Error::CaptureRefused), || Ok(()));
        assert!(matches!(failed, Err(Error::CaptureRefused)), "a replay");
    }
}
