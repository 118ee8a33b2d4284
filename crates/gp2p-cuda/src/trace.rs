//! A host-time trace of the calling thread's driver calls: where an enqueue's microseconds
//! go, on machines with no host profiler (the GPU machines this library is measured on have
//! no perf, strace or Nsight Systems).
//!
//! Off until [`start`]; then every driver call this crate makes on the thread, as it
//! returns, appends its name and the time. [`finish`] turns the marks into gaps: each
//! call's gap is the host time since the previous mark, which is the call itself plus
//! whatever Rust (or Python, for the first) ran before it. Marks are per thread, so the
//! reclaimer's frees and other threads' calls never mix in. Off, a driver call pays one
//! thread-local read.
//!
//! ```
//! use gp2p_cuda::trace;
//!
//! trace::start();
//! let _ = gp2p_cuda::Device::count(); // driver calls here, or an error without a driver
//! for call in trace::finish() {
//!     println!("{:>8.2} us  {}", call.gap_ns as f64 / 1e3, call.name);
//! }
//! ```

use std::cell::{Cell, RefCell};
use std::time::Instant;

thread_local! {
    static ON: Cell<bool> = const { Cell::new(false) };
    static MARKS: RefCell<Vec<(&'static str, Instant)>> = const { RefCell::new(Vec::new()) };
}

/// Room kept for marks, so that a traced enqueue does not grow the list (an allocation)
/// in the middle of what it times.
const ROOM: usize = 1024;

/// One mark of a finished trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TracedCall {
    /// The driver call (`cuLaunchKernel`, ...), or the name given to [`mark`].
    pub name: &'static str,
    /// Host nanoseconds since the previous mark (for the first, since [`start`]).
    pub gap_ns: u64,
}

/// Start tracing this thread's driver calls, dropping any marks of an unfinished trace.
pub fn start() {
    MARKS.with(|marks| {
        let mut marks = marks.borrow_mut();
        marks.clear();
        marks.reserve(ROOM);
        marks.push(("start", Instant::now()));
    });
    ON.with(|on| on.set(true));
}

/// Stop tracing this thread and return its marks since [`start`], the last one named
/// `finish` (empty if no trace was started).
pub fn finish() -> Vec<TracedCall> {
    mark("finish");
    ON.with(|on| on.set(false));
    MARKS.with(|marks| {
        let marks = std::mem::take(&mut *marks.borrow_mut());
        marks
            .windows(2)
            .map(|pair| TracedCall {
                name: pair[1].0,
                gap_ns: u64::try_from(pair[1].1.duration_since(pair[0].1).as_nanos()).unwrap_or(u64::MAX),
            })
            .collect()
    })
}

/// Add a mark named `name` to this thread's trace, if one is running: driver calls do this
/// as they return; callers may add their own to split the time between them.
pub fn mark(name: &'static str) {
    // `try_with`: a driver call from another thread-local's destructor, at thread exit, finds
    // these gone and is simply not marked.
    if ON.try_with(Cell::get).unwrap_or(false) {
        let _ = MARKS.try_with(|marks| marks.borrow_mut().push((name, Instant::now())));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_are_kept_only_while_tracing_and_only_on_their_thread() {
        mark("before");
        start();
        mark("one");
        std::thread::spawn(|| mark("other thread")).join().unwrap();
        mark("two");
        let names: Vec<_> = finish().into_iter().map(|call| call.name).collect();
        assert_eq!(names, ["one", "two", "finish"]);
        mark("after");
        assert_eq!(finish().into_iter().map(|call| call.name).collect::<Vec<_>>(), Vec::<&str>::new());
    }

    #[test]
    fn gaps_add_up_to_the_traced_time() {
        let outer = Instant::now();
        start();
        std::thread::sleep(std::time::Duration::from_millis(2));
        mark("slept");
        let calls = finish();
        let total: u64 = calls.iter().map(|call| call.gap_ns).sum();
        assert!(calls[0].gap_ns >= 2_000_000, "{calls:?}");
        assert!(u128::from(total) <= outer.elapsed().as_nanos(), "{calls:?}");
    }
}
