//! criterion benches of the host-side costs (planning, enqueueing); see `benches/`.
//! GPU throughput is measured by `gp2p bench`, against ceilings measured in the same run.
// No unsafe here: raw driver calls go through gp2p_cuda::raw and the safe APIs above it.
#![forbid(unsafe_code)]
