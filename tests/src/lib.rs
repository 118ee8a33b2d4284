//! The workspace integration suite. GPU tests live in `tests/` and are
//! `#[ignore = "needs a CUDA GPU"]`; `cargo xtask test-gpu` (or a bundle's `run`) runs them.
//! Each states what it needs with [`needs!`] (`let [d0, d1] = needs!(gpus: 2);`), which
//! reports it as not run where this machine lacks that. The CPU references they check
//! against are `gp2p_kernels::reference`, shared with `gp2p bench`; the helpers every test
//! file uses (devices, random data, poison) live here once.

mod needs;

pub use needs::{
    NOT_RUN, Needs, SANITIZER_ENV, compute_80_gpus, concurrent_gpus, device, gpus, kernels_serialized,
    lacks_compute_80, not_run_line, sanitizer, with_stream,
};

pub use geforce_p2p::cuda::HostGate;
pub use geforce_p2p::kernels::reference::{
    Reference, SplitMix64, check_reduce, count_mismatched, count_wrong_vs_fold, fill_random,
};

/// The byte outputs are filled with before an operation, so an element it failed to write
/// shows (`T::from_byte(POISON)` is the poisoned element of type `T`).
pub const POISON: u8 = 0xA5;

/// `len` random elements from `seed`: fresh data for one case.
pub fn random<T: Reference>(len: usize, seed: u64) -> Vec<T> {
    let mut v = vec![T::from_byte(0); len];
    fill_random(&mut v, seed);
    v
}

/// The longest length a test may use: `GP2P_TEST_MAX_LEN` where set (the sanitizer runs
/// set it, for time), else unlimited.
pub fn max_len() -> usize {
    std::env::var("GP2P_TEST_MAX_LEN").ok().and_then(|v| v.parse().ok()).unwrap_or(usize::MAX)
}

/// The longest a drop may block the host while the dropped thing's work is still queued:
/// 1 ms, or `GP2P_DROP_LIMIT_US` microseconds where set (the sanitizer runs set it, since
/// compute-sanitizer intercepts the driver calls a drop makes).
pub fn drop_limit() -> std::time::Duration {
    let us = std::env::var("GP2P_DROP_LIMIT_US").ok().and_then(|v| v.parse().ok()).unwrap_or(1000);
    std::time::Duration::from_micros(us)
}

/// Hold `stream` closed (later work on it waits) until the returned gate is opened or
/// dropped, or at most `GATE_LIMIT`: a test that blocks the host while holding it (a driver
/// call that waits for the device, say) then fails instead of hanging. Check
/// [`HostGate::expired`] before relying on the work still being queued.
///
/// The gate closes once everything dropped before it is released: the reclaimer frees pinned
/// host memory with `cuMemFreeHost` (and device memory with `cuMemFree` where a device has no
/// memory pool), which waits for every stream of the device, the held one too, and meanwhile
/// other threads' driver calls wait (what `a_pinned_release_never_stalls_other_threads_while_
/// a_stream_is_held` shows); a test of something else must not fail on a release left over
/// from the test before it.
#[allow(clippy::expect_used)] // a test helper: failing is how it reports
pub fn hold(stream: &geforce_p2p::Stream) -> geforce_p2p::cuda::HostGate {
    geforce_p2p::cuda::lifetime::flush_releases();
    geforce_p2p::cuda::HostGate::close_until(stream, GATE_LIMIT).expect("closing a gate on a stream")
}

/// The longest [`hold`] keeps a stream closed.
pub const GATE_LIMIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Taken by every test of a binary that holds streams with [`hold`]: while a stream is held,
/// a driver allocation on another test thread of the process may wait for it (the driver
/// synchronises there on some systems, the two-H200 machine among them), and the held test
/// may then wait on that thread's driver call until the gate's deadline; so the tests of
/// such a binary run one at a time.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub use geforce_p2p::{DType, half, with_element};

/// Runs `$case::<T>(args)` for every element type the kernels support, in [`DType::ALL`]'s
/// order (the arguments are evaluated for each).
///
/// [`DType::ALL`]: geforce_p2p::DType::ALL
#[macro_export]
macro_rules! every_dtype {
    ($case:ident($($arg:expr),*)) => {{
        for dtype in $crate::DType::ALL {
            $crate::with_element!(dtype, |T| $case::<T>($($arg),*));
        }
    }};
}
