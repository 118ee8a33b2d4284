//! Where each card sits in the host, and what any two cards' traffic shares on its way
//! through host memory: the same PCIe switch and its one uplink, the same root complex,
//! the same NUMA node, or the interconnect between NUMA nodes (sockets). Without P2P every
//! byte goes card → host → card, so this, not P2P, decides what the cards contend for.
//!
//! [`Topology`] is a small pure summary of [`Facts`], built from what sysfs says of each
//! card ([`DeviceFacts::pci_path`], `numa_node`, `local_cpulist`), else from NVML's
//! per-pair level (nvidia-smi's PIX/PXB/PHB/NODE/SYS). It is what a cost model takes: per
//! card its NUMA node, the groups of cards behind one uplink, and per pair its path kind.
//!
//! ```
//! use gp2p_probe::{Facts, Topology, facts::DeviceFacts, topology::PathKind};
//!
//! // Two cards behind one switch under root port 0000:16:01.0, on NUMA node 0.
//! let card = |ordinal: usize, bus: &str| DeviceFacts {
//!     ordinal,
//!     numa_node: Some(0),
//!     pci_path: Some(["pci0000:16", "0000:16:01.0", "0000:17:00.0", bus].map(String::from).to_vec()),
//!     ..Default::default()
//! };
//! let facts = Facts { devices: vec![card(0, "0000:19:00.0"), card(1, "0000:1a:00.0")], ..Default::default() };
//! let topology = Topology::new(&facts);
//! assert_eq!(topology.path(0, 1), PathKind::Switch);
//! assert_eq!(topology.uplinks[0].cards, [0, 1]);
//! assert_eq!(topology.crosses_numa(0, 1), Some(false));
//! ```

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::facts::{DeviceFacts, Facts};

/// How two cards' traffic meets in the host, nearest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PathKind {
    /// Behind one PCIe switch (one root port): they share its uplink into the CPU
    /// (nvidia-smi PIX or PXB).
    Switch,
    /// Under one root complex (host bridge), each on its own root port (nvidia-smi PHB).
    RootComplex,
    /// One NUMA node, different root complexes (nvidia-smi NODE).
    Node,
    /// Different NUMA nodes: traffic between them crosses the CPU's interconnect, between
    /// sockets or between the nodes of one socket (nvidia-smi SYS).
    System,
    /// The facts do not tell.
    Unknown,
}

impl PathKind {
    /// The label of the report's topology matrix.
    pub fn label(self) -> &'static str {
        match self {
            PathKind::Switch => "SW",
            PathKind::RootComplex => "RC",
            PathKind::Node => "NODE",
            PathKind::System => "SYS",
            PathKind::Unknown => "?",
        }
    }

    /// From nvidia-smi's (and NVML's) name for a topology level.
    pub fn from_nvml(level: &str) -> PathKind {
        match level {
            "INTERNAL" | "PIX" | "PXB" => PathKind::Switch,
            "PHB" => PathKind::RootComplex,
            "NODE" => PathKind::Node,
            "SYS" => PathKind::System,
            _ => PathKind::Unknown,
        }
    }
}

/// The legend line of the report's topology matrix.
pub const LEGEND: &str = "legend: SW same PCIe switch, sharing its uplink into the CPU (nvidia-smi PIX/PXB) | RC same root complex, own root ports (PHB) | NODE same NUMA node, different root complexes (NODE) | SYS different NUMA nodes: across the CPU interconnect, between sockets or NUMA nodes (SYS) | ? not known | NUMA -: the kernel names no node";

/// Where one card sits.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CardPlace {
    /// CUDA ordinal.
    pub ordinal: usize,
    /// Its NUMA node; `None` where the kernel names none or it was not read.
    pub numa_node: Option<u32>,
    /// The CPUs local to it, as the kernel lists them (`0-15,128-143`).
    pub cpus: Option<String>,
    /// Its root complex (the root bus, `pci0000:40`).
    pub root_complex: Option<String>,
    /// The root port its link (or its switch's uplink) hangs from (`0000:40:01.1`); `None`
    /// for a card on the root bus itself (as in some virtual machines) or not read.
    pub root_port: Option<String>,
    /// PCIe switch ports between the root port and the card (0: its own link to the CPU).
    pub switch_ports: usize,
}

/// Cards behind one uplink into the CPU: what they move through host memory shares it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Uplink {
    /// The root port the uplink hangs from, where sysfs shows it (NVML's PIX/PXB alone
    /// shows the sharing, not the port).
    pub root_port: Option<String>,
    /// The cards behind it, two or more, ascending.
    pub cards: Vec<usize>,
}

/// How one unordered pair's traffic meets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PairPlace {
    /// The lower ordinal.
    pub a: usize,
    /// The higher ordinal.
    pub b: usize,
    /// How.
    pub path: PathKind,
    /// The bridges between the two cards ([`bridges_between`]) whose ACS redirects peer
    /// traffic up to the root complex ([`crate::acs::REDIRECTS`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub acs_redirect: Vec<String>,
    /// The bridges between the two cards whose ACS is not known (its config space needs
    /// root, or could not be read). Empty where the facts read no bridge at all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub acs_unread: Vec<String>,
}

/// The host side of every card's link: per card its place, the groups of cards behind one
/// uplink, and per unordered pair how their traffic meets. Pure data, built by
/// [`Topology::new`] from [`Facts`]; empty lists where the facts say nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Topology {
    /// Per card, in the order of the facts' devices.
    pub cards: Vec<CardPlace>,
    /// Groups of two or more cards behind one uplink (one PCIe switch), by lowest ordinal.
    pub uplinks: Vec<Uplink>,
    /// Per unordered pair (a < b), in order.
    pub pairs: Vec<PairPlace>,
}

impl Topology {
    /// The topology the facts show.
    pub fn new(facts: &Facts) -> Topology {
        let cards: Vec<CardPlace> = facts.devices.iter().map(place).collect();
        let mut pairs = Vec::new();
        for (i, a) in facts.devices.iter().enumerate() {
            for b in &facts.devices[i + 1..] {
                let (a, b) = if a.ordinal < b.ordinal { (a, b) } else { (b, a) };
                let (acs_redirect, acs_unread) = acs_between(facts, a, b);
                pairs.push(PairPlace {
                    a: a.ordinal,
                    b: b.ordinal,
                    path: path_between(facts, a, b),
                    acs_redirect,
                    acs_unread,
                });
            }
        }
        pairs.sort_by_key(|p| (p.a, p.b));
        let uplinks = uplinks(&cards, &pairs);
        Topology { cards, uplinks, pairs }
    }

    /// How the traffic of cards `a` and `b` meets; [`PathKind::Unknown`] for a card the
    /// facts do not list.
    pub fn path(&self, a: usize, b: usize) -> PathKind {
        self.pair(a, b).map_or(PathKind::Unknown, |p| p.path)
    }

    /// The place of the unordered pair of `a` and `b`, where the facts list both.
    pub fn pair(&self, a: usize, b: usize) -> Option<&PairPlace> {
        let (a, b) = (a.min(b), a.max(b));
        self.pairs.iter().find(|p| p.a == a && p.b == b)
    }

    /// Whether traffic between `a` and `b` crosses the interconnect between NUMA nodes;
    /// `None` where their path is not known (then it may or may not).
    pub fn crosses_numa(&self, a: usize, b: usize) -> Option<bool> {
        match self.path(a, b) {
            PathKind::Unknown => None,
            path => Some(path == PathKind::System),
        }
    }

    /// The cards of each NUMA node, by node; cards whose node is not known are left out.
    pub fn numa_nodes(&self) -> Vec<(u32, Vec<usize>)> {
        let mut nodes: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
        for c in &self.cards {
            if let Some(node) = c.numa_node {
                nodes.entry(node).or_default().push(c.ordinal);
            }
        }
        nodes.into_iter().collect()
    }

    /// Whether the facts say anything about where the cards sit.
    pub fn known(&self) -> bool {
        self.pairs.iter().any(|p| p.path != PathKind::Unknown)
            || self.cards.iter().any(|c| c.numa_node.is_some() || c.cpus.is_some() || c.root_complex.is_some())
    }
}

fn place(d: &DeviceFacts) -> CardPlace {
    let path = d.pci_path.as_deref().unwrap_or(&[]);
    CardPlace {
        ordinal: d.ordinal,
        numa_node: d.numa_node.and_then(|n| u32::try_from(n).ok()),
        cpus: d.local_cpulist.clone(),
        root_complex: path.first().cloned(),
        // [root bus, root port, switch ports…, card]: a root port only where there is
        // something between the root bus and the card.
        root_port: (path.len() >= 3).then(|| path[1].clone()),
        switch_ports: path.len().saturating_sub(3),
    }
}

/// How the traffic of `a` and `b` meets: from their PCI paths where sysfs gave both, then
/// NVML's level for the pair, then their NUMA nodes or local CPUs.
fn path_between(facts: &Facts, a: &DeviceFacts, b: &DeviceFacts) -> PathKind {
    let (pa, pb) = (place(a), place(b));
    if a.pci_path.is_some() && b.pci_path.is_some() {
        if pa.root_port.is_some() && pa.root_port == pb.root_port {
            return PathKind::Switch;
        }
        if pa.root_complex.is_some() && pa.root_complex == pb.root_complex {
            return PathKind::RootComplex;
        }
        if let Some(numa) = same_numa(&pa, &pb) {
            return if numa { PathKind::Node } else { PathKind::System };
        }
    }
    let nvml = facts
        .pairs
        .iter()
        .filter(|p| (p.a, p.b) == (a.ordinal, b.ordinal) || (p.a, p.b) == (b.ordinal, a.ordinal))
        .find_map(|p| p.topology.as_deref())
        .map(PathKind::from_nvml);
    match nvml {
        Some(kind) if kind != PathKind::Unknown => kind,
        // Different nodes is all a NUMA node tells without the path.
        _ if same_numa(&pa, &pb) == Some(false) => PathKind::System,
        _ => PathKind::Unknown,
    }
}

/// The PCI bridges between cards `a` and `b`, from their sysfs paths: on each side, the
/// bridges below the deepest one both paths share (their traffic turns there), down to
/// but not including the card. Root ports count (the root bus does not); a pair under one
/// switch gets its two downstream ports, and any switch below them. `None` where a path
/// is not known.
pub fn bridges_between(a: &DeviceFacts, b: &DeviceFacts) -> Option<Vec<String>> {
    let (pa, pb) = (a.pci_path.as_deref()?, b.pci_path.as_deref()?);
    let shared = pa.iter().zip(pb).take_while(|(x, y)| x == y).count();
    let below = |path: &[String]| -> Vec<String> {
        // [root bus, bridges…, card]: the bridges past the shared part, never the root bus.
        let bridges = path.get(1..path.len().saturating_sub(1)).unwrap_or(&[]);
        bridges.iter().skip(shared.saturating_sub(1)).cloned().collect()
    };
    let mut between = below(pa);
    for bridge in below(pb) {
        if !between.contains(&bridge) {
            between.push(bridge);
        }
    }
    Some(between)
}

/// The bridges between `a` and `b` that redirect peer traffic (ACS), and those whose ACS
/// is not known. Nothing where the facts read no bridge (ACS was not collected).
pub fn acs_between(facts: &Facts, a: &DeviceFacts, b: &DeviceFacts) -> (Vec<String>, Vec<String>) {
    let (mut redirect, mut unread) = (Vec::new(), Vec::new());
    if facts.bridges.is_empty() {
        return (redirect, unread);
    }
    for bdf in bridges_between(a, b).unwrap_or_default() {
        match facts.bridge(&bdf) {
            Some(bridge) if bridge.acs.redirects() != 0 => redirect.push(bdf),
            Some(bridge) if bridge.acs.known() => {}
            _ => unread.push(bdf),
        }
    }
    (redirect, unread)
}

/// Whether two cards share a NUMA node: by their nodes where both are named, else by their
/// local CPUs where neither is (equal lists on a machine whose kernel names no nodes: one
/// node). Where only one card's node is named the other's CPU list is every CPU, which
/// differs from any one node's: not known.
fn same_numa(a: &CardPlace, b: &CardPlace) -> Option<bool> {
    match (a.numa_node, b.numa_node, &a.cpus, &b.cpus) {
        (Some(x), Some(y), ..) => Some(x == y),
        (None, None, Some(x), Some(y)) => Some(x == y),
        _ => None,
    }
}

/// Groups of cards behind one uplink: the cards joined by `Switch` pairs, with their root
/// port where every card of the group names the same one.
fn uplinks(cards: &[CardPlace], pairs: &[PairPlace]) -> Vec<Uplink> {
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for p in pairs.iter().filter(|p| p.path == PathKind::Switch) {
        let with = |o: usize, groups: &[Vec<usize>]| groups.iter().position(|g| g.contains(&o));
        match (with(p.a, &groups), with(p.b, &groups)) {
            (Some(i), Some(j)) if i != j => {
                let merged = groups.remove(i.max(j));
                groups[i.min(j)].extend(merged);
            }
            (Some(_), Some(_)) => {}
            (Some(i), None) => groups[i].push(p.b),
            (None, Some(j)) => groups[j].push(p.a),
            (None, None) => groups.push(vec![p.a, p.b]),
        }
    }
    let mut uplinks: Vec<Uplink> = groups
        .into_iter()
        .map(|mut g| {
            g.sort_unstable();
            let ports: Vec<Option<&String>> =
                g.iter().map(|o| cards.iter().find(|c| c.ordinal == *o).and_then(|c| c.root_port.as_ref())).collect();
            let root_port = ports.first().copied().flatten().filter(|p| ports.iter().all(|q| *q == Some(*p))).cloned();
            Uplink { root_port, cards: g }
        })
        .collect();
    uplinks.sort_by_key(|u| u.cards[0]);
    uplinks
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::PairFacts;

    fn card(ordinal: usize, numa: i32, path: &[&str]) -> DeviceFacts {
        DeviceFacts {
            ordinal,
            numa_node: Some(numa),
            pci_path: Some(path.iter().map(|p| (*p).to_owned()).collect()),
            ..DeviceFacts::default()
        }
    }

    #[test]
    fn switch_root_complex_node_and_sockets_from_sysfs_paths() {
        let facts = Facts {
            devices: vec![
                // Two cards behind one switch under root port 00:01.0.
                card(0, 0, &["pci0000:00", "0000:00:01.0", "0000:01:00.0", "0000:02:08.0", "0000:03:00.0"]),
                card(1, 0, &["pci0000:00", "0000:00:01.0", "0000:01:00.0", "0000:02:10.0", "0000:04:00.0"]),
                // Its own root port on the same root complex.
                card(2, 0, &["pci0000:00", "0000:00:03.0", "0000:05:00.0"]),
                // Another root complex of node 0, and one of node 1.
                card(3, 0, &["pci0000:40", "0000:40:01.1", "0000:41:00.0"]),
                card(4, 1, &["pci0000:80", "0000:80:01.1", "0000:81:00.0"]),
            ],
            ..Facts::default()
        };
        let t = Topology::new(&facts);
        assert_eq!(t.path(0, 1), PathKind::Switch);
        assert_eq!(t.path(1, 0), PathKind::Switch, "either order");
        assert_eq!(t.path(0, 2), PathKind::RootComplex);
        assert_eq!(t.path(2, 3), PathKind::Node);
        assert_eq!(t.path(3, 4), PathKind::System);
        assert_eq!((t.crosses_numa(0, 4), t.crosses_numa(0, 3)), (Some(true), Some(false)));
        assert_eq!(t.crosses_numa(0, 9), None, "not known, rather than not crossing");
        assert_eq!(t.uplinks, [Uplink { root_port: Some("0000:00:01.0".into()), cards: vec![0, 1] }]);
        assert_eq!((t.cards[0].switch_ports, t.cards[2].switch_ports), (2, 0));
        assert_eq!(t.numa_nodes(), [(0, vec![0, 1, 2, 3]), (1, vec![4])]);
        assert_eq!(t.pairs.len(), 10);
        assert_eq!(t.path(0, 9), PathKind::Unknown, "a card the facts do not list");
    }

    #[test]
    fn nvml_levels_fill_in_and_no_numa_node_means_the_local_cpus_decide() {
        let plain = |ordinal| DeviceFacts { ordinal, ..DeviceFacts::default() };
        let pair = |a, b, level: &str| PairFacts { a, b, topology: Some(level.into()), ..PairFacts::default() };
        let mut facts = Facts {
            devices: vec![plain(0), plain(1), plain(2)],
            pairs: vec![pair(0, 1, "PXB"), pair(1, 0, "PXB"), pair(0, 2, "SYS"), pair(2, 1, "SYS")],
            ..Facts::default()
        };
        let t = Topology::new(&facts);
        assert_eq!((t.path(0, 1), t.path(0, 2), t.path(1, 2)), (PathKind::Switch, PathKind::System, PathKind::System));
        assert_eq!(t.uplinks, [Uplink { root_port: None, cards: vec![0, 1] }]);
        assert!(t.known());
        // Nothing at all: unknown, and the report leaves the matrix out.
        facts.pairs.clear();
        assert!(!Topology::new(&facts).known());
        // A kernel that names no NUMA node (-1): equal local CPU lists put two root
        // complexes on one node, different ones on two.
        let mut a = card(0, -1, &["pci0000:00", "0000:00:01.1", "0000:01:00.0"]);
        let mut b = card(1, -1, &["pci0000:40", "0000:40:01.1", "0000:41:00.0"]);
        (a.local_cpulist, b.local_cpulist) = (Some("0-31".into()), Some("0-31".into()));
        let facts = Facts { devices: vec![a.clone(), b.clone()], ..Facts::default() };
        assert_eq!(Topology::new(&facts).path(0, 1), PathKind::Node);
        assert_eq!(Topology::new(&facts).cards[0].numa_node, None);
        b.local_cpulist = Some("32-63".into());
        let facts = Facts { devices: vec![a.clone(), b.clone()], ..Facts::default() };
        assert_eq!(Topology::new(&facts).path(0, 1), PathKind::System);
        // One card's node named, the other's not (-1, its CPU list every CPU): not known,
        // rather than two nodes because "0-15" is not "0-31".
        (a.numa_node, a.local_cpulist, b.local_cpulist) = (Some(0), Some("0-15".into()), Some("0-31".into()));
        let facts = Facts { devices: vec![a, b], ..Facts::default() };
        assert_eq!(Topology::new(&facts).path(0, 1), PathKind::Unknown);
    }

    #[test]
    fn the_bridges_between_two_cards_are_those_below_where_their_paths_part() {
        let path = |p: &[&str]| card(0, 0, p);
        let sw_a = path(&["pci0000:00", "0000:00:01.0", "0000:01:00.0", "0000:02:08.0", "0000:03:00.0"]);
        let sw_b = path(&["pci0000:00", "0000:00:01.0", "0000:01:00.0", "0000:02:10.0", "0000:04:00.0"]);
        let own_port = path(&["pci0000:00", "0000:00:03.0", "0000:05:00.0"]);
        let other_rc = path(&["pci0000:40", "0000:40:01.1", "0000:41:00.0"]);
        // One switch: its two downstream ports, not its upstream port or the root port.
        assert_eq!(bridges_between(&sw_a, &sw_b).unwrap(), ["0000:02:08.0", "0000:02:10.0"]);
        // Root ports of one root complex: the root ports, and the switch on one side.
        assert_eq!(
            bridges_between(&sw_a, &own_port).unwrap(),
            ["0000:00:01.0", "0000:01:00.0", "0000:02:08.0", "0000:00:03.0"]
        );
        // Two root complexes: every bridge of both paths.
        assert_eq!(bridges_between(&own_port, &other_rc).unwrap(), ["0000:00:03.0", "0000:40:01.1"]);
        // A card on the root bus itself (some virtual machines) has no bridge; unknown paths none.
        let vm = path(&["pci0001:00", "0001:00:00.0"]);
        assert_eq!(bridges_between(&vm, &other_rc).unwrap(), ["0000:40:01.1"]);
        assert_eq!(bridges_between(&DeviceFacts::default(), &other_rc), None);
    }

    #[test]
    fn acs_redirect_and_unread_bridges_are_named_per_pair() {
        use crate::acs::Acs;
        use crate::facts::BridgeFacts;
        let bridge = |bdf: &str, acs| BridgeFacts { bdf: bdf.into(), acs };
        let mut facts = Facts {
            devices: vec![
                card(0, 0, &["pci0000:00", "0000:00:01.0", "0000:01:00.0", "0000:02:08.0", "0000:03:00.0"]),
                card(1, 0, &["pci0000:00", "0000:00:01.0", "0000:01:00.0", "0000:02:10.0", "0000:04:00.0"]),
            ],
            ..Facts::default()
        };
        // Nothing read: nothing said (files saved before ACS was read).
        assert_eq!(
            (Topology::new(&facts).pairs[0].acs_redirect.len(), Topology::new(&facts).pairs[0].acs_unread.len()),
            (0, 0)
        );
        facts.bridges = vec![
            bridge("0000:02:08.0", Acs::Read { offset: 0x1c0, capability: 0x7f, control: 0x1d }),
            bridge("0000:02:10.0", Acs::NeedsRoot { bytes: 64 }),
        ];
        let pair = &Topology::new(&facts).pairs[0];
        assert_eq!(
            (pair.acs_redirect.as_slice(), pair.acs_unread.as_slice()),
            (&["0000:02:08.0".to_owned()][..], &["0000:02:10.0".to_owned()][..])
        );
        // Read and clear, or no ACS at all: neither list. A bridge left out of a file that
        // read others is not known.
        facts.bridges = vec![bridge("0000:02:08.0", Acs::Read { offset: 0x1c0, capability: 0x7f, control: 0x11 })];
        let pair = &Topology::new(&facts).pairs[0];
        assert_eq!((pair.acs_redirect.len(), pair.acs_unread.as_slice()), (0, &["0000:02:10.0".to_owned()][..]));
    }

    #[test]
    fn one_switch_below_another_is_one_uplink() {
        let facts = Facts {
            devices: vec![
                card(0, 0, &["pci0000:00", "0000:00:01.0", "0000:01:00.0", "0000:02:00.0", "0000:03:00.0"]),
                card(
                    1,
                    0,
                    &[
                        "pci0000:00",
                        "0000:00:01.0",
                        "0000:01:00.0",
                        "0000:02:01.0",
                        "0000:04:00.0",
                        "0000:05:00.0",
                        "0000:06:00.0",
                    ],
                ),
                card(
                    2,
                    0,
                    &[
                        "pci0000:00",
                        "0000:00:01.0",
                        "0000:01:00.0",
                        "0000:02:01.0",
                        "0000:04:00.0",
                        "0000:05:01.0",
                        "0000:07:00.0",
                    ],
                ),
            ],
            ..Facts::default()
        };
        let t = Topology::new(&facts);
        assert_eq!(t.uplinks, [Uplink { root_port: Some("0000:00:01.0".into()), cards: vec![0, 1, 2] }]);
    }
}
