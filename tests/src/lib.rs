//! The workspace integration suite. GPU tests live in `tests/` and are
//! `#[ignore = "needs a CUDA GPU"]`; `cargo xtask test-gpu` (or a bundle's `run`) runs them.
//! The CPU references they check against are `gp2p_kernels::reference`, shared with
//! `gp2p bench`.

pub use geforce_p2p::kernels::reference::{Reference, SplitMix64, check_reduce, fill_random};
