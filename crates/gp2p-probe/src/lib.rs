//! Why P2P is off between two NVIDIA GPUs, and whether the open-kernel-module patch
//! (PATCH.md) would turn it on.
//!
//! Three steps, each usable alone:
//! 1. [`collect`]: facts from every source present — CUDA (peer access and attributes),
//!    NVML (BAR1, PCIe link, P2P status codes, topology; loaded at run time), Linux's
//!    `/proc/driver/nvidia/version`, `/proc/cmdline`, `/proc/driver/nvidia/params`, and
//!    each GPU's IOMMU group, Resizable BAR sizes, NUMA node, local CPUs and PCI path in
//!    sysfs, and the ACS of every bridge on those paths from its config space ([`acs`]; the
//!    extended space needs root, and a shorter read is recorded as such). A missing source
//!    lowers what the report says and names itself, nothing more. [`collect_host`] gathers
//!    the same without opening any device (no CUDA context), leaving CUDA's per-pair
//!    answers out.
//! 2. [`verdicts`]: a pure function from [`Facts`] to one [`Verdict`] per ordered pair — on
//!    (and over what, and whether safe: `UNSAFE` pairs must be copied staged), or off with
//!    the exact reason, a remedy fitting the card, what the patch would do, and how sure
//!    ([`Certainty`]). Whether the patch is in effect ([`patch_state`]) is inferred only
//!    from facts that show it; [`branches`] says which branch drives which architecture
//!    (a data file with each branch's source, checked on [`TABLE_CHECKED`]: a driver newer
//!    than all of them is "not known", never "no branch"), and [`chips`] the largest BAR1
//!    each chip's cards offer, with its source (used where a card's own sizes were not
//!    read). ACS redirect on a bridge between two cards is a step of its own (or, where P2P
//!    is on, a warning), with the kernel parameter and `setpci` lines that clear it.
//!    [`verdicts_if_on`] judges every pair as if CUDA offered P2P: what a copy engine needs
//!    before it lets `Route::Auto` take it.
//!    [`Topology`] sums up where each card sits (NUMA node, local CPUs, root complex, the
//!    switch it shares an uplink behind) and how each pair's traffic meets in the host (and
//!    which bridges between them redirect it): a pure summary a cost model can take.
//! 3. [`Report`]: a table for people, JSON for bug reports; [`load`] re-reads saved facts
//!    and refuses ones that contradict themselves. [`table`] draws its tables (and the
//!    CLI's, so that all of gp2p's tables look alike).
//!
//! [`examples`] bundles the facts of a few common machines (`gp2p probe --example`), so a
//! report can be seen without a GPU.
//!
//! Not here: measuring links (the CLI's `gp2p probe --measure` joins the transport), acting
//! on the verdicts (the facade hands them to the transport), or changing anything on the
//! machine.
//!
//! ```
//! use gp2p_probe::{Facts, Report, facts::{DeviceFacts, PairFacts}};
//!
//! // Two RTX 4090s whose driver refuses P2P, with nothing known about the host:
//! let card = |ordinal| DeviceFacts { ordinal, name: "NVIDIA GeForce RTX 4090".into(), compute_capability: (8, 9), ..Default::default() };
//! let pair = |a, b| PairFacts { a, b, can_access_peer: Some(false), ..Default::default() };
//! let facts = Facts { devices: vec![card(0), card(1)], pairs: vec![pair(0, 1), pair(1, 0)], ..Default::default() };
//! let report = Report::new(facts);
//! assert_eq!(report.verdicts.len(), 2);
//! assert_eq!(report.verdicts[0].code, "?"); // the kernel module flavour is unknown
//! assert!(report.render().contains("0 -> 1"));
//! ```

// No unsafe here: raw driver calls go through gp2p_cuda::raw and the safe APIs above it.
#![forbid(unsafe_code)]

pub mod acs;
pub mod branches;
pub mod chips;
mod collect;
mod error;
pub mod examples;
pub mod facts;
pub mod parse;
mod patch;
mod report;
pub mod table;
pub mod topology;
mod verdict;

pub use branches::{BAR1_PER_ALLOCATION_BRANCH, Branch, PATCH_BRANCHES, TABLE_CHECKED};
pub use collect::{collect, collect_host, load, nvml_p2p_peers};
pub use error::{Error, Result};
pub use facts::Facts;
pub use patch::{Certainty, PatchState, patch_state};
pub use report::Report;
pub use topology::Topology;
pub use verdict::{Link, PatchOutlook, RULES, Verdict, verdict, verdicts, verdicts_if_on};

#[cfg(test)]
mod tests;
