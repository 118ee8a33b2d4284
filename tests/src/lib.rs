//! The workspace integration suite. GPU tests live in `tests/` and are
//! `#[ignore = "needs a CUDA GPU"]`; `cargo xtask test-gpu` (or a bundle's `run`) runs them.
//! The CPU references they check against are `gp2p_kernels::reference`, shared with
//! `gp2p bench`.

pub use geforce_p2p::kernels::reference::{
    Reference, SplitMix64, check_reduce, count_mismatched, count_wrong_vs_fold, fill_random,
};

/// The longest length a test may use: `GP2P_TEST_MAX_LEN` where set (the sanitizer runs
/// set it, for time), else unlimited.
pub fn max_len() -> usize {
    std::env::var("GP2P_TEST_MAX_LEN").ok().and_then(|v| v.parse().ok()).unwrap_or(usize::MAX)
}
