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

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

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

/// Run a served call's `work`, traced where `GP2P_NCCL_TRACE` asks for it (see the module).
pub(crate) fn served<R>(work: impl FnOnce() -> R) -> R {
    let wanted = wanted();
    if wanted == 0 {
        return work();
    }
    static CALLS: AtomicU64 = AtomicU64::new(0);
    static STEPS: Mutex<Option<Steps>> = Mutex::new(None);
    let call = CALLS.fetch_add(1, Ordering::Relaxed);
    if !(WARM_CALLS..WARM_CALLS + wanted).contains(&call) {
        return work();
    }
    trace::start();
    let result = work();
    let calls = trace::finish();
    let mut steps = STEPS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let steps = steps.get_or_insert_with(Steps::default);
    steps.add(&calls);
    if call + 1 == WARM_CALLS + wanted {
        crate::log::measured(&steps.line());
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
    fn the_variable_is_a_count_and_anything_else_is_off() {
        assert_eq!(parse(Some(" 500 ")), 500);
        for off in [None, Some(""), Some("yes"), Some("-3")] {
            assert_eq!(parse(off), 0, "{off:?}");
        }
    }
}
