//! The cost of an all-reduce across several hosts, on paper (issue #36, item 4): the two-level
//! all-reduce of the `gp2p` backend (this library inside each host, an engine for networks
//! between hosts) against one flat ring over every rank, as NCCL runs it over sockets or
//! InfiniBand with host memory inside each host.
//!
//! `hosts` hosts of `local` cards each, `S` bytes per rank, a [`Network`] of `gbps` per host
//! each way (full duplex) and `latency_us` a step:
//!
//! | | each host's network link, each way | steps across it |
//! | --- | --- | --- |
//! | two-level | 2(H−1)/H·S (the `local` shards of S/local, all through one link) | 2(H−1) |
//! | flat ring of N = H·local | 2(N−1)/N·S | 2(N−1), each also a trip through host memory |
//!
//! Two-level time = the host's two-shot all-reduce of S, priced from the legs the
//! communicator runs for its halves ([`crate::legs::all_reduce_traffic`]: S up and
//! 2(local−1)/local·S down a card, (3·local−2)·S through host memory, in `local` rounds; the reduce-scatter and
//! the all-gather bracket the network stage) + the network stage;
//! [`AcrossHosts::two_level_pipelined`] is the same with the stages overlapped chunk by chunk
//! (the larger of the two): the bound the backend's chunks approach. Flat time = the largest of the
//! network link, each card's link (2(N−1)/N·S each way), the host's DMA and DRAM terms for its
//! cards, plus 2(N−1) steps each costing the larger of a handoff and the network latency.
//!
//! ```
//! use gp2p_collectives::cost::Machine;
//! use gp2p_collectives::hosts::{Network, across_hosts};
//!
//! // Two hosts of four H200-rate cards, 25 Gb/s between them, 1 GiB a rank: the two-level
//! // moves S across each link where the ring moves 1.75 S.
//! let cost = across_hosts(&Machine::h200(4), 2, Network { gbps: 25.0, latency_us: 10.0 }, 1 << 30);
//! assert!(cost.two_level < cost.flat);
//! assert_eq!(cost.flat_network_bytes / cost.two_level_network_bytes, 1.75);
//! ```

use crate::cost::{Algorithm, Machine, price};
use crate::legs::all_reduce_traffic;

/// Bytes per second in one Gb/s.
const BYTES_PER_GBIT: f64 = 1e9 / 8.0;

/// The link between hosts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Network {
    /// Each host's rate, each way at once, Gb/s (25, 100, ...).
    pub gbps: f64,
    /// One step across it (a message's latency), µs.
    pub latency_us: f64,
}

/// The model's times for one all-reduce across hosts, seconds, and the network bytes behind them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AcrossHosts {
    /// The two-level all-reduce, stages one after another.
    pub two_level: f64,
    /// The two-level all-reduce with its stages pipelined in chunks.
    pub two_level_pipelined: f64,
    /// One flat ring over every rank.
    pub flat: f64,
    /// Bytes each host's link carries each way, two-level.
    pub two_level_network_bytes: f64,
    /// Bytes each host's link carries each way, flat.
    pub flat_network_bytes: f64,
}

/// The cost of an all-reduce of `bytes` per rank over `hosts` hosts of `host.ranks` cards each
/// (`host`: one host's rates, as [`crate::cost::Machine`] has them), joined by `network`. One
/// host: the network carries nothing.
pub fn across_hosts(host: &Machine, hosts: usize, network: Network, bytes: usize) -> AcrossHosts {
    let (h, local, s) = (hosts.max(1) as f64, host.ranks.max(1) as f64, bytes as f64);
    let n = h * local;
    let net_rate = network.gbps * BYTES_PER_GBIT;
    let latency = network.latency_us * 1e-6;
    // Two-level: the host's reduce-scatter and all-gather (a two-shot's bytes, in the
    // communicator's `local` rounds), then all local ranks' rings across hosts at once.
    let local_stage = price(host, Algorithm::TwoShot, all_reduce_traffic(host.ranks, bytes)).seconds;
    let two_level_network_bytes = 2.0 * (h - 1.0) / h * s;
    let network_stage = if hosts > 1 { two_level_network_bytes / net_rate + 2.0 * (h - 1.0) * latency } else { 0.0 };
    // Flat: one ring of n ranks; every card and the host move the ring's bytes.
    let ring = 2.0 * (n - 1.0) / n * s;
    let flat_network_bytes = if hosts > 1 { ring } else { 0.0 };
    let card = ring / (host.duplex_gbps * 1e9);
    let host_dma = local * 2.0 * ring / (host.host_gbps * 1e9);
    let dram = local * 2.0 * ring / (host.dram_gbps * 1e9);
    let network_flat = flat_network_bytes / net_rate;
    let step = (host.handoff_us * 1e-6).max(if hosts > 1 { latency } else { 0.0 });
    let flat = [card, host_dma, dram, network_flat].into_iter().fold(0.0, f64::max) + 2.0 * (n - 1.0) * step;
    AcrossHosts {
        two_level: local_stage + network_stage,
        two_level_pipelined: local_stage.max(network_stage),
        flat,
        two_level_network_bytes: if hosts > 1 { two_level_network_bytes } else { 0.0 },
        flat_network_bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: usize = 1 << 30;

    /// `a` within 0.5 % of `b`.
    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 0.005 * b.abs()
    }

    #[test]
    fn two_hosts_of_four_h200_cards_at_25_and_100_gbits() {
        // By hand, S = 1 GiB = 1.0737 GB, N = 8:
        // the host's two-shot as the communicator's legs run it: (3·4 − 2) S = 10 S through
        // host memory, DRAM binds, 10 S / 140 GB/s = 76.70 ms (the host's DMAs: 4 × 2.5 S /
        // 190 GB/s = 56.5 ms), + 4 rounds (45.6 µs); two-level network: S each way over
        // 3.125 GB/s = 343.6 ms (+ 2 × 10 µs), total 420.4 ms;
        // flat: 1.75 S each way = 1.879 GB over 3.125 GB/s = 601.3 ms binds (cards 37.9 ms,
        // host 4 × 2 × 1.879 / 190 = 79.1 ms, DRAM 4 × 2 × 1.879 / 140 = 107.4 ms), + 14 × 11.4 µs.
        let h200 = Machine::h200(4);
        let slow = across_hosts(&h200, 2, Network { gbps: 25.0, latency_us: 10.0 }, GIB);
        let s = GIB as f64;
        assert!(close(slow.two_level, 10.0 * s / 140e9 + 45.6e-6 + s / 3.125e9 + 20e-6), "{slow:?}");
        assert!(close(slow.two_level * 1e3, 420.4) && close(slow.flat * 1e3, 601.5), "{slow:?}");
        assert!(close(slow.two_level_pipelined * 1e3, 343.6), "{slow:?}");
        // 100 Gb/s: the network stage is 85.9 ms; in turn the two levels take 162.7 ms, more
        // than the flat ring's 150.5 (its network 150.3 ms binds); pipelined, the network's
        // 85.9 ms binds, just above the host's 76.7.
        let fast = across_hosts(&h200, 2, Network { gbps: 100.0, latency_us: 10.0 }, GIB);
        assert!(close(fast.two_level * 1e3, 162.7) && close(fast.flat * 1e3, 150.5), "{fast:?}");
        assert!(close(fast.two_level_pipelined * 1e3, 85.9), "{fast:?}");
    }

    #[test]
    fn four_hosts_move_three_halves_s_where_the_ring_moves_nearly_two_s() {
        let cost = across_hosts(&Machine::h200(4), 4, Network { gbps: 25.0, latency_us: 10.0 }, GIB);
        let s = GIB as f64;
        assert!(close(cost.two_level_network_bytes, 1.5 * s) && close(cost.flat_network_bytes, 30.0 / 16.0 * s));
        assert!(cost.two_level < cost.flat, "{cost:?}");
    }

    #[test]
    fn one_host_sends_nothing_across() {
        let cost = across_hosts(&Machine::h200(4), 1, Network { gbps: 25.0, latency_us: 10.0 }, GIB);
        assert_eq!((cost.two_level_network_bytes, cost.flat_network_bytes), (0.0, 0.0));
        // The host's two-shot alone: 10 S through host memory where the ring moves 12 S,
        // which binds both at H200 rates.
        let ring = crate::cost::predict(&Machine::h200(4), Algorithm::Ring, GIB).seconds;
        assert!(close(ring / cost.two_level, 1.2), "{} against the ring's {ring}", cost.two_level);
    }
}
