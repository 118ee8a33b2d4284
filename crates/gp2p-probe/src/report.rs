//! The report: a human table (devices, pair matrix with a legend, one line per pair) and
//! the JSON document (`facts` + `verdicts`) that `--from` re-renders.

use std::borrow::Cow;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::acs::{Acs, bit_names};
use crate::facts::{Facts, ModuleFlavour, PairFacts};
use crate::patch::patch_state;
use crate::table::table;
use crate::topology::{LEGEND, Topology};
use crate::verdict::{PatchOutlook, RULES, Verdict, gib, verdicts};

/// Facts and the verdicts drawn from them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// What was observed.
    pub facts: Facts,
    /// One verdict per ordered pair.
    pub verdicts: Vec<Verdict>,
    /// Where the cards sit and how each pair's traffic meets in the host, from the facts
    /// (absent from reports saved before it existed: `--from` draws it again).
    #[serde(default)]
    pub topology: Topology,
}

impl Report {
    /// Draw the verdicts from `facts`.
    pub fn new(facts: Facts) -> Report {
        let verdicts = verdicts(&facts);
        let topology = Topology::new(&facts);
        Report { facts, verdicts, topology }
    }

    /// The JSON document.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    }

    /// The human-readable report.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let f = &self.facts;
        let h = &f.host;
        let _ = writeln!(out, "geforce-p2p probe");
        if let Some(example) = &f.example {
            let _ = writeln!(out, "EXAMPLE, not this machine: {}", shown(example));
        }
        let module = h.kernel_module.as_ref().map_or("unknown".to_owned(), |m| {
            let flavour = match m.flavour {
                ModuleFlavour::Open => "open kernel module",
                ModuleFlavour::Proprietary => "proprietary kernel module",
            };
            let build = match (&m.builder, m.built_by_nvidia()) {
                (_, Some(true)) => ", NVIDIA build".to_owned(),
                (Some(b), _) => format!(", built by {}", shown(b)),
                (None, _) => String::new(),
            };
            format!("{} {flavour}{build}", shown(&m.version))
        });
        let cuda = h.cuda_driver.map_or("?".into(), |(a, b)| format!("{a}.{b}"));
        let os = if h.os.is_empty() { "unknown" } else { &h.os };
        let _ = writeln!(out, "driver: {module}; CUDA {cuda}; OS {}", shown(os));
        let iommu = h.iommu_cmdline.as_ref().map_or("unknown".into(), |c| {
            if c.flags.is_empty() { "no iommu flags on the kernel command line".into() } else { c.flags.join(" ") }
        });
        let _ = writeln!(out, "iommu (cmdline): {}", shown(&iommu));
        let _ = writeln!(out, "P2P patch: {}", shown(&patch_state(f).describe()));
        if !f.nvml_answered() {
            let _ = writeln!(
                out,
                "NVML: not loaded (libnvidia-ml); BAR1, brand, PCIe link, P2P status codes, atomics and topology unknown"
            );
        }
        if let Some(r) = &h.registry_dwords {
            let _ = writeln!(out, "registry: {}", shown(r));
        }
        if let Some(vm) = &h.virtual_machine {
            let _ = writeln!(out, "virtual machine: {}", shown(vm));
        }
        let _ = writeln!(out);
        let mut devices = table(
            &["#", "name", "cc", "VRAM", "BAR1", "BAR1 max", "PCIe cur/max", "brand/arch", "iommu", "bus"],
            &["name", "PCIe cur/max", "brand/arch", "iommu", "bus"],
        );
        for d in &f.devices {
            let bar1 = d.bar1_bytes.map_or("?".into(), gib);
            // The largest BAR1 Resizable BAR offers; "fixed" when the card offers none.
            let bar1_max = match &d.bar1_sizes {
                None => "?".to_owned(),
                Some(sizes) if sizes.is_empty() => "fixed".to_owned(),
                Some(_) => d.bar1_largest().map_or("?".into(), gib),
            };
            let pcie = d.pcie.map_or("?".into(), |p| {
                format!("{}.0 x{} / {}.0 x{}", p.current_gen, p.current_width, p.max_gen, p.max_width)
            });
            let brand = format!("{}/{}", d.brand.as_deref().unwrap_or("?"), d.architecture.as_deref().unwrap_or("?"));
            devices.add_row(vec![
                d.ordinal.to_string(),
                shown(&d.name).into_owned(),
                format!("{}.{}", d.compute_capability.0, d.compute_capability.1),
                gib(d.vram_bytes),
                bar1,
                bar1_max,
                pcie,
                shown(&brand).into_owned(),
                shown(d.iommu_group_type.as_deref().unwrap_or("?")).into_owned(),
                shown(&d.pci_bus_id).into_owned(),
            ]);
        }
        let _ = writeln!(out, "{}", devices.trim_fmt());
        let _ = writeln!(out);
        if !f.bridges.is_empty() {
            render_bridges(f, &mut out);
        }
        if self.topology.known() && f.devices.len() > 1 {
            self.render_topology(&mut out);
        }
        if self.verdicts.is_empty() {
            let _ = writeln!(out, "{} device(s): no pairs to check (P2P needs two devices)", f.devices.len());
        } else {
            self.render_matrix(&mut out);
        }
        if !f.missing_sources.is_empty() {
            let _ = writeln!(out, "\nnot read (the report says less without them):");
            for m in &f.missing_sources {
                let _ = writeln!(out, "  - {}", shown(m));
            }
        }
        if f.example.is_some() {
            let _ = writeln!(
                out,
                "\nEXAMPLE: this was a bundled example, not this machine (`gp2p probe --example` lists them); `gp2p probe` reports this one"
            );
        }
        out
    }

    /// The topology matrix (like `nvidia-smi topo -m`: each pair's path, then each card's
    /// NUMA node, local CPUs and root port), its legend, and the shared uplinks.
    fn render_topology(&self, out: &mut String) {
        let t = &self.topology;
        let _ = writeln!(out, "topology (how each pair's traffic meets in the host)");
        let ordinals: Vec<String> = t.cards.iter().map(|c| c.ordinal.to_string()).collect();
        let header: Vec<&str> = std::iter::once("")
            .chain(ordinals.iter().map(String::as_str))
            .chain(["NUMA", "CPUs", "root port"])
            .collect();
        let mut matrix = table(&header, &["CPUs", "root port"]);
        for a in &t.cards {
            let paths = t.cards.iter().map(|b| {
                if a.ordinal == b.ordinal {
                    "X".to_owned()
                } else {
                    let redirect = t.pair(a.ordinal, b.ordinal).is_some_and(|p| !p.acs_redirect.is_empty());
                    format!("{}{}", t.path(a.ordinal, b.ordinal).label(), if redirect { ACS_MARK } else { "" })
                }
            });
            let place = [
                // "-": the kernel names no node (one-node machines); "?": not read.
                match (a.numa_node, self.facts.device(a.ordinal).and_then(|d| d.numa_node)) {
                    (Some(n), _) => n.to_string(),
                    (None, Some(_)) => "-".into(),
                    (None, None) => "?".into(),
                },
                shown(a.cpus.as_deref().unwrap_or("?")).into_owned(),
                shown(a.root_port.as_deref().or(a.root_complex.as_deref()).unwrap_or("?")).into_owned(),
            ];
            matrix.add_row(std::iter::once(a.ordinal.to_string()).chain(paths).chain(place).collect::<Vec<_>>());
        }
        let _ = writeln!(out, "{}", matrix.trim_fmt());
        let _ = writeln!(out, "{LEGEND}");
        if t.pairs.iter().any(|p| !p.acs_redirect.is_empty()) {
            let _ = writeln!(
                out,
                "{ACS_MARK} ACS on a bridge between the two cards redirects their peer traffic up to the root complex (the pair's verdict names the bridges and how to clear it)"
            );
        }
        let mut unread: Vec<&str> = t.pairs.iter().flat_map(|p| p.acs_unread.iter().map(String::as_str)).collect();
        unread.sort_unstable();
        unread.dedup();
        if !unread.is_empty() {
            let _ = writeln!(
                out,
                "ACS not read on {} between the cards (run the probe as root to read it): where it redirects, the matrix cannot show it",
                shown(&unread.join(", "))
            );
        }
        for u in &t.uplinks {
            let cards = u.cards.iter().map(usize::to_string).collect::<Vec<_>>().join(", ");
            let port = u.root_port.as_deref().map_or(String::new(), |p| format!(" (root port {})", shown(p)));
            let _ = writeln!(
                out,
                "shared uplink: cards {cards} behind one switch{port}: what they move through host memory shares it"
            );
        }
        let _ = writeln!(out);
    }

    fn render_matrix(&self, out: &mut String) {
        let ordinals: Vec<usize> = self.facts.devices.iter().map(|d| d.ordinal).collect();
        let _ = writeln!(out, "pairs (row reads column)");
        // The corner cell is empty: the header is the column devices, the first cell of a
        // row its row device.
        let header: Vec<String> =
            std::iter::once(String::new()).chain(ordinals.iter().map(|b| b.to_string())).collect();
        let mut matrix = table(&header.iter().map(String::as_str).collect::<Vec<_>>(), &[]);
        for &a in &ordinals {
            let codes = ordinals.iter().map(|&b| {
                if a == b {
                    "X".to_owned()
                } else {
                    self.verdicts.iter().find(|v| v.a == a && v.b == b).map_or("-".into(), |v| v.code.clone())
                }
            });
            matrix.add_row(std::iter::once(a.to_string()).chain(codes).collect::<Vec<_>>());
        }
        let _ = writeln!(out, "{}", matrix.trim_fmt());
        let _ = writeln!(
            out,
            "legend: OK on | UNSAFE on but unsafe, OK? on but unchecked: copied staged | PATCH the patch would turn it on | BAR1, IOMMU, ACS, VER, PROP, DR: it would after the steps listed (the code names the first) | PFAIL the patch is in effect, cause not shown | WDDM, MIX, VM, ARCH: it cannot | TOPO, DRV: the stock driver refuses a professional or datacenter pair | ? not enough facts"
        );
        let _ = writeln!(
            out,
            "rules, in order: {}",
            RULES.iter().map(|r| r.split(':').next().unwrap_or(r)).collect::<Vec<_>>().join(" > ")
        );
        let _ = writeln!(out);
        for v in &self.verdicts {
            let patch = match &v.patch {
                PatchOutlook::NotApplicable(_) => None,
                outlook => Some(describe(outlook)),
            };
            let _ = writeln!(out, "{} -> {} [{}, {}] {}", v.a, v.b, v.code, v.certainty.name(), shown(&v.reason));
            if v.steps.len() > 1 {
                let _ = writeln!(out, "    remedy, in order:");
                for (i, step) in v.steps.iter().enumerate() {
                    let _ = writeln!(out, "      {}. [{}] {}", i + 1, step.code, shown(&step.remedy));
                }
            } else {
                let _ = writeln!(out, "    remedy: {}", shown(&v.remedy));
            }
            if let Some(pair) = self.facts.pairs.iter().find(|p| p.a == v.a && p.b == v.b) {
                let _ = writeln!(out, "    driver: {}", shown(&driver_line(pair, self.facts.nvml_answered())));
            }
            match patch {
                Some(patch) => {
                    let _ = writeln!(out, "    patch: {}; facts used: {}", shown(&patch), v.used.join(", "));
                }
                None => {
                    let _ = writeln!(out, "    facts used: {}", v.used.join(", "));
                }
            }
            for h in &v.hazards {
                let _ = writeln!(out, "    UNSAFE: {}", shown(h));
            }
            for w in &v.warnings {
                let _ = writeln!(out, "    WARNING: {}", shown(w));
            }
            for n in &v.notes {
                let _ = writeln!(out, "    note: {}", shown(n));
            }
        }
    }
}

/// The mark of a topology matrix cell whose pair has ACS redirect on its path.
const ACS_MARK: &str = "*";

/// The bridges between the cards and their ACS, as read from config space: what `lspci
/// -vvv` shows as `ACSCtl`, and which of its bits send peer traffic up to the root complex.
fn render_bridges(f: &Facts, out: &mut String) {
    let _ = writeln!(out, "bridges between the cards (ACS, from their config space)");
    let mut rows = table(&["bridge", "ACS", "ACSCtl", "redirects"], &["bridge", "ACS", "ACSCtl", "redirects"]);
    for b in &f.bridges {
        let (state, control, redirects) = match &b.acs {
            Acs::Read { control, .. } => {
                let names = b.acs.redirect_names();
                let on = bit_names(*control).join(" ");
                let redirects = if names.is_empty() { "no".to_owned() } else { format!("YES: {}", names.join(" ")) };
                ("read".to_owned(), format!("{control:#06x} {on}").trim_end().to_owned(), redirects)
            }
            Acs::Absent => ("no ACS".to_owned(), "-".to_owned(), "no".to_owned()),
            Acs::NeedsRoot { bytes } => (format!("needs root ({bytes} bytes read)"), "?".to_owned(), "?".to_owned()),
            Acs::Unreadable { .. } => ("unreadable".to_owned(), "?".to_owned(), "?".to_owned()),
        };
        rows.add_row(vec![shown(&b.bdf).into_owned(), state, control, redirects]);
    }
    let _ = writeln!(out, "{}", rows.trim_fmt());
    let _ = writeln!(out);
}

/// `text` as the report prints it: control characters (and the bidirectional overrides
/// that reorder what a terminal shows) escaped, so a saved file cannot move the cursor,
/// recolour the terminal or fake a line of the report.
pub(crate) fn shown(text: &str) -> Cow<'_, str> {
    let hidden = |c: char| {
        c.is_control() || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    };
    if !text.chars().any(hidden) {
        return Cow::Borrowed(text);
    }
    Cow::Owned(text.chars().map(|c| if hidden(c) { c.escape_default().to_string() } else { c.to_string() }).collect())
}

/// What CUDA and NVML said about a pair, in nvidia-smi's codes, where known.
fn driver_line(p: &PairFacts, nvml_answered: bool) -> String {
    let cuda = match p.can_access_peer {
        Some(true) => "peer access yes",
        Some(false) => "peer access no",
        None => "peer access ?",
    };
    let nvml: Vec<String> =
        [("read", p.nvml_read), ("write", p.nvml_write), ("atomics", p.nvml_atomics), ("nvlink", p.nvml_nvlink)]
            .into_iter()
            .filter_map(|(what, s)| s.map(|s| format!("{what} {}", s.code())))
            .collect();
    let nvml = match (nvml.is_empty(), nvml_answered) {
        (false, _) => nvml.join(", "),
        (true, true) => "no P2P status".to_owned(),
        (true, false) => "not loaded".to_owned(),
    };
    let topology = p.topology.as_deref().map_or(String::new(), |t| format!("; topology {t}"));
    format!("CUDA {cuda}; NVML {nvml}{topology}")
}

/// What the patch would do, in words (for every outlook but `NotApplicable`, which the
/// report leaves out).
fn describe(outlook: &PatchOutlook) -> String {
    match outlook {
        PatchOutlook::NotNeeded => "not needed".to_owned(),
        PatchOutlook::Would => "would turn it on".to_owned(),
        PatchOutlook::AfterChange(c) => format!("would, after: {c}"),
        PatchOutlook::Cannot(why) => format!("cannot: {why}"),
        PatchOutlook::Undecided(missing) => format!("cannot tell, missing: {}", missing.join(", ")),
        PatchOutlook::InEffect(missing) if missing.is_empty() => "in effect".to_owned(),
        PatchOutlook::InEffect(missing) => format!("in effect; still missing: {missing}"),
        PatchOutlook::NotApplicable(why) => format!("not applicable: {why}"),
    }
}
