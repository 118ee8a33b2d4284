//! The pipeline's calls replayed from CUDA graphs
//! ([`CommOptions::replay_calls`](crate::CommOptions::replay_calls)): a call the pipeline has
//! not seen is captured into a graph (its copies, flag writes and waits recorded, nothing run)
//! and launched; a later call with the same buffers, sizes and op launches the kept graph
//! again, one driver call where enqueuing it takes one per operation (hundreds for a large
//! call among eight ranks, and then the host waits once the driver's queue is full:
//! `benches/results/h10080gbhbm3/comm-all-reduce-8.txt` spent 78 of a 105 ms call enqueuing
//! at 256 MiB). Between calls nothing of the graph changes: the calls the ranks pair up are
//! the same whether enqueued or replayed.
//!
//! Off unless asked for while it is measured against enqueuing on a GPU; never where a peer
//! rank is a thread of this process (a graph is made in the context the peers' kernels wait
//! in, see the communicator's launch cache).

use crate::{Error, Result};

/// The environment variable that turns replays on where the options leave it open: `on`
/// (or `1`, `true`) or `off` (`0`, `false`).
pub const REPLAY_VAR: &str = "GP2P_REPLAY";

/// Calls a pipeline keeps graphs of, the least recently launched dropped first: a training
/// step's few gradient buckets, a server's few tensor sizes.
pub(crate) const KEPT_CALLS: usize = 8;

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

/// One call's graph, or `None` where its capture failed (the call is enqueued each time).
struct Kept<K, G> {
    key: K,
    graph: Option<G>,
    last_used: u64,
}

/// The graphs of a pipeline's calls, by the call they record (`K`: everything the call's
/// enqueue depends on); `G` the graph.
pub(crate) struct Replays<K, G> {
    kept: Vec<Kept<K, G>>,
    uses: u64,
}

/// What [`Replays::run`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ran {
    /// Launched a graph kept from an earlier call.
    Replayed,
    /// Captured the call into a graph and launched it.
    Captured,
    /// Enqueued the call (its capture failed, now or before).
    Enqueued,
}

impl<K: PartialEq + Clone, G> Replays<K, G> {
    pub(crate) fn new() -> Replays<K, G> {
        Replays { kept: Vec::new(), uses: 0 }
    }

    /// Run the call `key` names: `launch` its kept graph; else `capture` one, keep it and
    /// `launch` it; where the capture fails (now or the first time), `enqueue` it. Errors of
    /// `launch` and `enqueue` are the call's; a failed capture is not (the call is enqueued
    /// instead, as it would have been without replays).
    pub(crate) fn run(
        &mut self,
        key: &K,
        capture: impl FnOnce() -> Result<G>,
        launch: impl FnOnce(&G) -> Result<()>,
        enqueue: impl FnOnce() -> Result<()>,
    ) -> Result<Ran> {
        self.uses += 1;
        let uses = self.uses;
        if let Some(kept) = self.kept.iter_mut().find(|k| &k.key == key) {
            kept.last_used = uses;
            return match &kept.graph {
                Some(graph) => launch(graph).map(|()| Ran::Replayed),
                None => enqueue().map(|()| Ran::Enqueued),
            };
        }
        if self.kept.len() >= KEPT_CALLS
            && let Some(oldest) = self.kept.iter().enumerate().min_by_key(|(_, k)| k.last_used).map(|(i, _)| i)
        {
            // A graph still running is freed once it completes (its drop never blocks).
            self.kept.swap_remove(oldest);
        }
        let graph = capture().ok();
        let ran = match &graph {
            Some(graph) => launch(graph).map(|()| Ran::Captured),
            None => enqueue().map(|()| Ran::Enqueued),
        };
        self.kept.push(Kept { key: key.clone(), graph, last_used: uses });
        ran
    }

    /// Calls with a graph kept.
    #[cfg(test)]
    pub(crate) fn graphs(&self) -> usize {
        self.kept.iter().filter(|k| k.graph.is_some()).count()
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
    /// what ran: which graph launched, or that the call was enqueued.
    fn call(replays: &mut Replays<u32, u32>, key: u32) -> (Ran, Option<u32>) {
        let launched = RefCell::new(None);
        let capture = || if key % 2 == 1 { Err(Error::CaptureRefused) } else { Ok(key * 10) };
        let launch = |g: &u32| {
            *launched.borrow_mut() = Some(*g);
            Ok(())
        };
        let Ok(ran) = replays.run(&key, capture, launch, || Ok(())) else {
            unreachable!("neither launch nor enqueue fails here")
        };
        (ran, launched.into_inner())
    }

    #[test]
    fn a_call_is_captured_once_then_replayed_and_one_that_cannot_be_is_enqueued_each_time() {
        let mut replays = Replays::new();
        assert_eq!(call(&mut replays, 2), (Ran::Captured, Some(20)));
        assert_eq!(call(&mut replays, 2), (Ran::Replayed, Some(20)));
        assert_eq!(call(&mut replays, 4), (Ran::Captured, Some(40)));
        assert_eq!(call(&mut replays, 3), (Ran::Enqueued, None));
        assert_eq!(call(&mut replays, 3), (Ran::Enqueued, None), "a failed capture is not tried again");
        assert_eq!(call(&mut replays, 2), (Ran::Replayed, Some(20)));
        assert_eq!(replays.graphs(), 2);
    }

    #[test]
    fn past_the_kept_calls_the_least_recently_launched_goes() {
        let mut replays = Replays::new();
        for key in 0..KEPT_CALLS as u32 {
            assert_eq!(call(&mut replays, 2 * key).0, Ran::Captured);
        }
        // Key 0 launched last: key 2 is now the oldest, and goes for a new call.
        assert_eq!(call(&mut replays, 0).0, Ran::Replayed);
        assert_eq!(call(&mut replays, 100).0, Ran::Captured);
        assert_eq!(replays.graphs(), KEPT_CALLS);
        assert_eq!(call(&mut replays, 0).0, Ran::Replayed);
        assert_eq!(call(&mut replays, 2).0, Ran::Captured, "dropped, so captured again");
    }

    #[test]
    fn errors_of_launches_and_enqueues_are_the_call_s() {
        let mut replays: Replays<u32, u32> = Replays::new();
        let failed = replays.run(&2, || Ok(20), |_| Err(Error::CaptureRefused), || Ok(()));
        assert!(matches!(failed, Err(Error::CaptureRefused)));
        let failed = replays.run(&3, || Err(Error::CaptureRefused), |_| Ok(()), || Err(Error::CaptureRefused));
        assert!(matches!(failed, Err(Error::CaptureRefused)));
    }
}
