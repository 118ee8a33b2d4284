//! `GP2P_NCCL_TRACE=N`: where a served call's host time goes. Off unless set; then the
//! process's served collectives and point-to-point calls after the first [`WARM_CALLS`] are
//! traced (each driver call the library makes, as `gp2p_cuda::trace` marks it), N of them,
//! and once the N-th returns one line on stderr gives the median host time of each step of
//! the traced calls and of the whole call: what the door's host time per call is made of,
//! on machines with no host profiler. A call whose steps differ from the first traced
//! call's (another path) is left out of the medians.
//!
//! ```text
//! geforce-p2p NCCL door: host time of 500 served calls, medians in us: cuCtxSetCurrent 0.41, cuStreamIsCapturing 0.09, ..., finish 0.20; whole call 6.84
//! ```
//!
//! A second line gives the door's entry points called meanwhile (from any thread: a
//! framework's watchdog too), how many per served call and the median host time of each:
//! what else the caller asks of the door for every call it makes. Calls handed to the real
//! NCCL are counted apart (`ncclAllReduce handed over`), so that a communicator the real
//! library runs beside the served ones (a one-rank group) gives that library's own call time
//! in the same run.

use std::cell::Cell;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use geforce_p2p::cuda::trace;

/// The variable that asks for the trace: how many calls.
pub const TRACE_VAR: &str = "GP2P_NCCL_TRACE";

/// Served calls left untraced first, so that the medians are of warm calls.
pub const WARM_CALLS: u64 = 200;

/// The calls asked for (0: off), read once.
fn wanted() -> u64 {
    static WANTED: OnceLock<u64> = OnceLock::new();
    *WANTED.get_or_init(|| parse(std::env::var(TRACE_VAR).ok().as_deref()))
}

/// `GP2P_NCCL_TRACE`'s value as a count of calls: 0 where unset, blank or not a number
/// (tracing is a measurement aid, never a reason for a call to fail).
fn parse(value: Option<&str>) -> u64 {
    value.and_then(|v| v.trim().parse().ok()).unwrap_or(0)
}

/// The traced calls' steps so far: each step's name and its gaps, one per call.
#[derive(Debug, Default)]
struct Steps {
    steps: Vec<(&'static str, Vec<u64>)>,
    totals: Vec<u64>,
    left_out: usize,
}

impl Steps {
    /// Add one call's trace; a call whose steps are not the first call's is only counted.
    fn add(&mut self, calls: &[trace::TracedCall]) {
        if self.steps.is_empty() {
            self.steps = calls.iter().map(|c| (c.name, Vec::new())).collect();
        }
        let same = calls.len() == self.steps.len() && calls.iter().zip(&self.steps).all(|(c, (n, _))| c.name == *n);
        if !same {
            self.left_out += 1;
            return;
        }
        for (call, (_, gaps)) in calls.iter().zip(&mut self.steps) {
            gaps.push(call.gap_ns);
        }
        self.totals.push(calls.iter().map(|c| c.gap_ns).sum());
    }

    /// The line said once the last call is in.
    fn line(&mut self) -> String {
        let steps: Vec<String> =
            self.steps.iter_mut().map(|(name, gaps)| format!("{name} {:.2}", median_us(gaps))).collect();
        let left_out = match self.left_out {
            0 => String::new(),
            n => format!(" ({n} calls on other paths left out)"),
        };
        format!(
            "geforce-p2p NCCL door: host time of {} served calls{left_out}, medians in us: {}; whole call {:.2}",
            self.totals.len(),
            steps.join(", "),
            median_us(&mut self.totals)
        )
    }
}

/// The median of `gaps` (ns) in µs; 0 for none.
fn median_us(gaps: &mut [u64]) -> f64 {
    if gaps.is_empty() {
        return 0.0;
    }
    gaps.sort_unstable();
    gaps[gaps.len() / 2] as f64 / 1e3
}

/// Whether entry points are counted: not yet, while the served calls are traced, until the
/// next entry point ends (which says what they were), or no more.
static ENTRY_WINDOW: AtomicU8 = AtomicU8::new(WINDOW_NOT_YET);
const WINDOW_NOT_YET: u8 = 0;
const WINDOW_OPEN: u8 = 1;
const WINDOW_CLOSING: u8 = 2;
const WINDOW_CLOSED: u8 = 3;

/// The entry points' host times (ns) by name and whether the real NCCL ran them, while the
/// window is open, at most this many each.
static ENTRIES: Mutex<Vec<(Entry, Vec<u64>)>> = Mutex::new(Vec::new());
const MOST_ENTRIES: usize = 1 << 20;

/// An entry point's name, and whether the call was handed to the real NCCL.
type Entry = (&'static str, bool);

thread_local! {
    /// Set where this thread's entry point handed its call to the real NCCL ([`handed_over`]).
    static HANDED_OVER: Cell<bool> = const { Cell::new(false) };
}

/// Note that the entry point running on this thread handed its call to the real NCCL (one
/// thread-local write: cheap enough for every forwarded call, traced or not).
pub(crate) fn handed_over() {
    HANDED_OVER.with(|h| h.set(true));
}

/// Run the entry point `name`'s `work`, counted and timed while served calls are traced.
pub(crate) fn entry<R>(name: &'static str, work: impl FnOnce() -> R) -> R {
    // Timed only while the window is open: an entry made as it opens goes uncounted, and
    // after it closes entries cost the load alone.
    let open = |window| window == WINDOW_OPEN || window == WINDOW_CLOSING;
    if !open(ENTRY_WINDOW.load(Ordering::Relaxed)) {
        return work();
    }
    HANDED_OVER.with(|h| h.set(false));
    let start = Instant::now();
    let result = work();
    let ns = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
    let key = (name, HANDED_OVER.with(Cell::take));
    if open(ENTRY_WINDOW.load(Ordering::Relaxed)) {
        let mut entries = ENTRIES.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let at = match entries.iter().position(|(k, _)| *k == key) {
            Some(at) => at,
            None => {
                entries.push((key, Vec::new()));
                entries.len() - 1
            }
        };
        if entries[at].1.len() < MOST_ENTRIES {
            entries[at].1.push(ns);
        }
        let closing =
            ENTRY_WINDOW.compare_exchange(WINDOW_CLOSING, WINDOW_CLOSED, Ordering::Relaxed, Ordering::Relaxed);
        if closing.is_ok() {
            crate::log::measured(&entries_line(&mut entries, wanted()));
        }
    }
    result
}

/// The line of the entry points called while `served` calls were traced.
fn entries_line(entries: &mut [(Entry, Vec<u64>)], served: u64) -> String {
    let each: Vec<String> = entries
        .iter_mut()
        .map(|((name, real), ns)| {
            let by = if *real { " handed over" } else { "" };
            format!("{name}{by} {:.2} x {:.2}", ns.len() as f64 / served.max(1) as f64, median_us(ns))
        })
        .collect();
    format!(
        "geforce-p2p NCCL door: entry points while those {served} calls ran, per served call x median us: {}",
        each.join(", ")
    )
}

/// Run a served call's `work`, traced where `GP2P_NCCL_TRACE` asks for it (see the module).
pub(crate) fn served<R>(work: impl FnOnce() -> R) -> R {
    let wanted = wanted();
    if wanted == 0 {
        return work();
    }
    static CALLS: AtomicU64 = AtomicU64::new(0);
    static STEPS: Mutex<Option<Steps>> = Mutex::new(None);
    let call = CALLS.fetch_add(1, Ordering::Relaxed);
    if call + 1 == WARM_CALLS {
        // Entry points count from the end of the last warm call's.
        ENTRY_WINDOW.store(WINDOW_OPEN, Ordering::Relaxed);
    }
    let last = WARM_CALLS.saturating_add(wanted);
    if !(WARM_CALLS..last).contains(&call) {
        return work();
    }
    trace::start();
    let result = work();
    let calls = trace::finish();
    let mut steps = STEPS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let steps = steps.get_or_insert_with(Steps::default);
    steps.add(&calls);
    if call + 1 == last {
        crate::log::measured(&steps.line());
        ENTRY_WINDOW.store(WINDOW_CLOSING, Ordering::Relaxed);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(steps: &[(&'static str, u64)]) -> Vec<trace::TracedCall> {
        steps.iter().map(|&(name, gap_ns)| trace::TracedCall { name, gap_ns }).collect()
    }

    #[test]
    fn the_line_gives_each_step_s_median_and_leaves_out_calls_on_other_paths() {
        let mut steps = Steps::default();
        for gap in [1000, 3000, 2000] {
            steps.add(&call(&[("start", gap), ("cuLaunchKernel", 2 * gap), ("finish", 500)]));
        }
        steps.add(&call(&[("start", 9000), ("finish", 9000)]));
        let line = steps.line();
        assert!(line.contains("host time of 3 served calls (1 calls on other paths left out)"), "{line}");
        assert!(line.contains("start 2.00, cuLaunchKernel 4.00, finish 0.50; whole call 6.50"), "{line}");
    }

    #[test]
    fn the_entries_line_gives_calls_per_served_call_and_their_median() {
        let mut entries = vec![
            (("ncclAllReduce", false), vec![5000, 4000, 6000, 5000]),
            (("ncclAllReduce", true), vec![1000, 2000]),
            (("ncclCommGetAsyncError", false), vec![300, 100]),
        ];
        let line = entries_line(&mut entries, 4);
        assert!(line.contains("while those 4 calls ran"), "{line}");
        assert!(
            line.contains(
                "ncclAllReduce 1.00 x 5.00, ncclAllReduce handed over 0.50 x 2.00, ncclCommGetAsyncError 0.50 x 0.30"
            ),
            "{line}"
        );
    }

    #[test]
    fn the_variable_is_a_count_and_anything_else_is_off() {
        assert_eq!(parse(Some(" 500 ")), 500);
        for off in [None, Some(""), Some("yes"), Some("-3")] {
            assert_eq!(parse(off), 0, "{off:?}");
        }
    }
}
