//! criterion benches of the host-side costs (planning, enqueueing); see `benches/`.
//! GPU throughput is measured by `gp2p bench`, against ceilings measured in the same run.
