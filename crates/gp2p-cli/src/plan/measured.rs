//! What `gp2p plan --measure` (and `gp2p bench comm`'s model column) measures on this
//! machine: the per-card link rates and the host's (`crate::measure_links`), a phase's
//! handoff, a chunk step's operation, and DRAM (`super::dram`).

use geforce_p2p::cuda;

use super::{Placement, dram};
use crate::error::CliError;

/// Per-card rates (and the host's, where measured) from this machine's links.
pub(super) struct Measured {
    /// h2d, d2h, duplex: each the slowest card's (every card moves the same bytes, so the
    /// slowest sets the time).
    pub(super) card: [f64; 3],
    /// All cards at once, up plus down, with two cards or more.
    pub(super) host_gbps: Option<f64>,
    /// One phase's handoff on the first card, µs: the same 4 KiB device → host → device round
    /// trip the model's default was measured as ([`geforce_p2p::collectives::cost::H200_HANDOFF_US`]).
    pub(super) handoff_us: f64,
    /// Host memory's rate, GB/s read plus written: every core copying between two buffers
    /// far past the caches while the first card's DMAs run both ways (`super::dram`).
    pub(super) dram_gbps: f64,
    /// One operation of a pipeline's chunk step on the first card, µs ([`op_us`]).
    pub(super) op_us: f64,
    /// How many cards were measured.
    pub(super) cards: usize,
}

/// The per-card rates, and the host's, of this machine's cards, and where they sit.
pub(super) fn measure() -> Result<(Measured, Placement), CliError> {
    let report = geforce_p2p::probe()?;
    let place = Placement::new(&report.facts, "this machine".to_owned());
    let links = crate::measure_links(&report)?;
    if links.devices.is_empty() {
        return Err(CliError::from(cuda::Error::NoDevice { ordinal: 0, count: report.facts.devices.len() }));
    }
    let slowest = |rate: fn(&crate::DeviceLink) -> f64| links.devices.iter().map(rate).fold(f64::INFINITY, f64::min);
    let host_gbps = links.together.as_ref().filter(|all| all.cards.len() >= 2).map(|all| all.host_gbps);
    let measured = Measured {
        card: [slowest(|d| d.h2d_gbps), slowest(|d| d.d2h_gbps), slowest(|d| d.duplex_gbps)],
        host_gbps,
        handoff_us: handoff_us(links.devices[0].device)?,
        dram_gbps: dram::dram_gbps(links.devices[0].device)?,
        op_us: op_us(links.devices[0].device)?,
        cards: links.devices.len(),
    };
    Ok((measured, place))
}

/// Bytes each way of the measured handoff: the default's.
const HANDOFF_BYTES: usize = 4 << 10;

/// The median time of one [`HANDOFF_BYTES`] device → host copy followed by the copy back,
/// on one stream of card `ordinal`: a phase's trip through host memory, with the driver
/// calls' latency in it, as the model prices a phase.
pub(crate) fn handoff_us(ordinal: usize) -> Result<f64, CliError> {
    let device = geforce_p2p::Device::open(ordinal)?;
    let stream = geforce_p2p::Stream::new(&device)?;
    let mut ceilings = crate::measure::Ceilings::new(&device, &stream, HANDOFF_BYTES, HANDOFF_REPEATS)?;
    ceilings.pair_latency_us(HANDOFF_BYTES)
}

/// One dependent operation of a pipeline's chunk step on card `ordinal`, µs
/// ([`crate::measure::Ceilings::op_latency_us`] of [`HANDOFF_BYTES`]): `Machine::op_us`
/// measured, in place of the H100 fit.
pub(crate) fn op_us(ordinal: usize) -> Result<f64, CliError> {
    let device = geforce_p2p::Device::open(ordinal)?;
    let stream = geforce_p2p::Stream::new(&device)?;
    let mut ceilings = crate::measure::Ceilings::new(&device, &stream, HANDOFF_BYTES, HANDOFF_REPEATS)?;
    ceilings.op_latency_us(HANDOFF_BYTES)
}

/// Runs of the handoff: many, each short, so the median is steady.
const HANDOFF_REPEATS: crate::measure::Repeats = crate::measure::Repeats { warmup: 5, timed: 51 };
