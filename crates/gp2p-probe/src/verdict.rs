//! From facts to one verdict per ordered pair. Pure; the rules apply in the order of
//! [`RULES`]: the first that fits decides the verdict's code and reason, and every rule that
//! fits adds its step to the verdict's chain of remedies ([`Verdict::steps`]), so a pair
//! with more than one thing in the way hears of all of them, in the order to take them.
//! Each verdict lists the facts it used.

use serde::{Deserialize, Serialize};

use crate::branches::{
    BAR1_PER_ALLOCATION_BRANCH, BRANCH_LISTS, TABLE_CHECKED, architectures_driven, branch_for_version, newest_version,
    past_table, versions_for, versions_in_words,
};
use crate::chips::chip_bar1;
use crate::facts::{
    Architecture, CardClass, DeviceFacts, Facts, KernelModule, ModuleFlavour, P2pStatus, PairFacts, bar1_holds,
    bar1_needed,
};
use crate::parse::force_p2p_fields;
use crate::patch::{Certainty, Forced, PatchState, forced, patch_state};

mod acs;
mod bar1;
mod rules;

use bar1::per_allocation_version;
#[cfg(test)]
use rules::CHECKS;
use rules::chain;

/// The rules, in the order they are tried, as documented in the report's legend. This is
/// also the order of a pair's steps: what stands in the way of everything after it first
/// (the platform, then registry keys, the driver, the firmware's BAR1, the kernel's IOMMU,
/// the bridges' ACS), and the patch last, built against the driver the steps before it installed. Where one
/// rule makes another moot, the other adds no step: after `card` (professional and
/// datacenter cards) and `patched` (which names every missing piece itself) none; after a
/// rule that says P2P can never work (`arch`, `mixed`, and `wddm` on a GeForce card) none
/// of `regkey`, `module`, `version`, `bar1`, `iommu` and `acs` (no setting helps); on Windows
/// neither `module`, `version` nor `iommu` (Linux's).
pub const RULES: &[&str] = &[
    "facts: without two listed devices and CUDA's answer for the pair nothing is decided",
    "on: CUDA can access the peer; where the patch or a ForceP2P key forces it, BAR1 < VRAM or a translating IOMMU make it UNSAFE and unknown ones OK? (Route::Auto copies both staged)",
    "wddm: a Windows WDDM driver never exposes P2P (TCC/MCDM only where the card supports it, never GeForce)",
    "mixed: different GPU generations or chips (CUDA refuses them even on a patched driver)",
    "vm: inside a virtual machine the patch cannot help (the hypervisor decides)",
    "regkey: a ForceP2P registry key disables it",
    "card: a professional or datacenter pair the stock driver refuses: topology, ACS or the GPU's mode, never the patch",
    "arch: GeForce cards of an architecture no patch branch drives",
    "patched: the patch is in effect and CUDA still refuses: what else is missing (branch, BAR1, IOMMU, or a cause the facts cannot show)",
    "module: the proprietary kernel module (the patch needs the open one, at a version with a branch for the cards)",
    "version: a driver version with no patch branch for the cards' architecture (one newer than the branch table: not known, so possible only)",
    "bar1: BAR1 smaller than VRAM (Resizable BAR where the card, or else its chip's cards as reported, offer more; a BAR1 at that limit gets the per-allocation branch, or nothing)",
    "iommu: the IOMMU translates GPU DMA",
    "acs: ACS on a bridge between the cards redirects peer traffic up to the root complex (slow, or a hang, once P2P is on)",
    "patch: everything the patch needs is in place, or will be after the steps before: install it",
];

/// What the P2P patch in PATCH.md would do for a pair.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PatchOutlook {
    /// P2P is already on; nothing to do.
    NotNeeded,
    /// Installing the patch would turn P2P on.
    Would,
    /// It would, after the named change.
    AfterChange(String),
    /// It cannot, for the reason given.
    Cannot(String),
    /// Not enough facts to say; the missing ones are named.
    Undecided(Vec<String>),
    /// The patch is already in effect; P2P still needs what is named (nothing, when empty).
    InEffect(String),
    /// The patch is not for these cards (professional and datacenter cards), for the
    /// reason given; the report then prints no patch clause.
    NotApplicable(String),
}

/// How P2P travels when it is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Link {
    /// NVLink.
    NvLink,
    /// PCIe through BAR1 (the patch's path, or a datacenter card's).
    PcieBar1,
    /// PCIe, mechanism not known.
    Pcie,
}

/// The verdict for one ordered pair.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdict {
    /// Source ordinal.
    pub a: usize,
    /// Peer ordinal.
    pub b: usize,
    /// Short code for the pair matrix (OK, UNSAFE, OK?, WDDM, MIX, VM, DR, TOPO, DRV, ARCH,
    /// PFAIL, PROP, VER, BAR1, IOMMU, PATCH, ?), as the report's legend explains.
    pub code: String,
    /// How sure the verdict is: shown by the facts, likely (one assumption, named in the
    /// reason), or possible.
    pub certainty: Certainty,
    /// `Some(link)` when P2P is on.
    pub on: Option<Link>,
    /// Why, in a sentence.
    pub reason: String,
    /// What to do about it, in a sentence.
    pub remedy: String,
    /// What the patch would do.
    pub patch: PatchOutlook,
    /// The facts this verdict used.
    pub used: Vec<String>,
    /// Why P2P that CUDA offers is unsafe here (forced past the driver's own checks onto a
    /// BAR1 smaller than VRAM or through a translating IOMMU): transfers fail or corrupt
    /// data silently. Non-empty means `Route::Auto` must not use P2P on this pair.
    #[serde(default)]
    pub hazards: Vec<String>,
    /// Requirements of forced P2P that the facts could not check (BAR1 or IOMMU unknown).
    /// Non-empty means `Route::Auto` must not use P2P on this pair until they are known.
    #[serde(default)]
    pub unchecked: Vec<String>,
    /// Things worth knowing.
    pub warnings: Vec<String>,
    /// Every step between this pair and P2P, in the order to take them (the order of
    /// [`RULES`]): one per rule that fits, the first the one the code and reason are about,
    /// and last, where the patch would then turn P2P on, installing it. `remedy` is their
    /// sentences joined. Empty where P2P is on: the remedy names what makes it safe.
    #[serde(default)]
    pub steps: Vec<Step>,
    /// What the facts could not tell about the pair and how to learn it (ACS of a bridge
    /// between the cards that needs root to read).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// One step of a pair's way to P2P.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    /// The rule whose blocker it removes, as [`RULES`] names them (`patch`: installing it).
    pub rule: String,
    /// That rule's verdict code (VER, BAR1, IOMMU, …; PATCH).
    pub code: String,
    /// What to do, in a sentence.
    pub remedy: String,
}

impl Verdict {
    /// Whether `Route::Auto` may copy this pair by P2P: CUDA offers it and nothing is
    /// shown, or left unchecked, against it.
    pub fn peer_trusted(&self) -> bool {
        self.on.is_some() && self.hazards.is_empty() && self.unchecked.is_empty()
    }

    /// Why `Route::Auto` must not use the P2P CUDA offers on this pair; `None` when it may,
    /// or when P2P is off (then there is nothing to keep it from).
    pub fn peer_distrust(&self) -> Option<String> {
        if self.on.is_none() || self.peer_trusted() {
            return None;
        }
        let mut why = self.hazards.clone();
        why.extend(self.unchecked.iter().map(|u| format!("not known: {u}")));
        Some(format!("{} -> {} [{}]: {}", self.a, self.b, self.code, why.join("; ")))
    }
}

/// The verdict for every ordered pair of `facts`, in order.
pub fn verdicts(facts: &Facts) -> Vec<Verdict> {
    let patch = patch_state(facts);
    facts.pairs.iter().map(|p| judge(facts, &patch, p)).collect()
}

/// The verdict for one pair.
pub fn verdict(facts: &Facts, pair: &PairFacts) -> Verdict {
    judge(facts, &patch_state(facts), pair)
}

/// For every ordered pair, the verdict it gets if CUDA offers peer access, whatever the
/// facts say CUDA answered: what a copy engine must know before `Route::Auto` takes P2P
/// (it asks CUDA itself). Works on facts gathered without opening any device
/// ([`collect_host`](crate::collect_host)). The machine-wide patch evidence comes from the
/// facts as they are.
pub fn verdicts_if_on(facts: &Facts) -> Vec<Verdict> {
    let patch = patch_state(facts);
    facts.pairs.iter().map(|p| judge(facts, &patch, &PairFacts { can_access_peer: Some(true), ..p.clone() })).collect()
}

/// A fact a verdict can lack.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Missing {
    /// A device's BAR1 size (NVML).
    Bar1,
    /// Whether the IOMMU translates a device's DMA (sysfs, or the kernel command line).
    Iommu,
}

/// One pair with everything its rules look at.
struct Pair<'f> {
    facts: &'f Facts,
    pair: &'f PairFacts,
    a: &'f DeviceFacts,
    b: &'f DeviceFacts,
    patch: &'f PatchState,
}

fn judge(facts: &Facts, patch: &PatchState, pair: &PairFacts) -> Verdict {
    let undecided = |reason: String, remedy: &str, missing: String, used: &str| Verdict {
        a: pair.a,
        b: pair.b,
        code: "?".into(),
        certainty: Certainty::Shown,
        on: None,
        reason,
        remedy: remedy.into(),
        patch: PatchOutlook::Undecided(vec![missing]),
        used: vec![used.into()],
        hazards: Vec::new(),
        unchecked: Vec::new(),
        warnings: Vec::new(),
        steps: vec![Step { rule: "facts".into(), code: "?".into(), remedy: remedy.into() }],
        notes: Vec::new(),
    };
    // 1. A pair of devices the facts describe, and CUDA's answer for it.
    let (Some(a), Some(b)) = (facts.device(pair.a), facts.device(pair.b)) else {
        let absent = if facts.device(pair.a).is_none() { pair.a } else { pair.b };
        return undecided(
            format!("the facts list no device {absent}, so nothing is known about it"),
            "probe again on the machine itself (`gp2p probe --json`) rather than editing saved facts",
            format!("device {absent}"),
            "devices",
        );
    };
    if pair.can_access_peer.is_none() {
        return undecided(
            "CUDA did not answer for this pair (a device could not be opened)".into(),
            "run the probe where both devices can be opened (compute capability 7.5+, not hidden by CUDA_VISIBLE_DEVICES)",
            "cuDeviceCanAccessPeer".into(),
            "cuDeviceCanAccessPeer",
        );
    }
    let p = Pair { facts, pair, a, b, patch };
    let found = chain(&p);
    let mut v = match found.first() {
        Some((_, v)) if v.on.is_some() => v.clone(),
        _ => p.combine(found),
    };
    v.notes.extend(p.acs_note());
    v
}

/// The patch outlook of a chain of blockers, from each one's: not for these cards where the
/// first says so; else it cannot where any says so (every reason); else what is still
/// missing where the patch is in effect; else not known where the first is not; else it
/// would, after every change in order (and any fact found missing on the way).
fn merge_outlooks(outlooks: &[&PatchOutlook]) -> PatchOutlook {
    let Some(first) = outlooks.first() else { return PatchOutlook::Would };
    if matches!(first, PatchOutlook::NotApplicable(_) | PatchOutlook::NotNeeded | PatchOutlook::Would) {
        return (*first).clone();
    }
    let cannot: Vec<&str> = outlooks
        .iter()
        .filter_map(|o| if let PatchOutlook::Cannot(why) = o { Some(why.as_str()) } else { None })
        .collect();
    if !cannot.is_empty() {
        return PatchOutlook::Cannot(cannot.join("; and "));
    }
    let in_effect: Vec<&str> = outlooks
        .iter()
        .filter_map(|o| if let PatchOutlook::InEffect(m) = o { Some(m.as_str()) } else { None })
        .collect();
    if !in_effect.is_empty() {
        return PatchOutlook::InEffect(in_effect.into_iter().filter(|m| !m.is_empty()).collect::<Vec<_>>().join(", "));
    }
    let missing = |o: &&PatchOutlook| if let PatchOutlook::Undecided(m) = o { m.clone() } else { Vec::new() };
    if matches!(first, PatchOutlook::Undecided(_)) {
        return PatchOutlook::Undecided(outlooks.iter().flat_map(missing).collect());
    }
    let changes: Vec<String> = outlooks
        .iter()
        .filter_map(|o| match o {
            PatchOutlook::AfterChange(change) => Some(change.clone()),
            PatchOutlook::Undecided(m) => Some(format!("check what is not known: {}", m.join(", "))),
            _ => None,
        })
        .collect();
    PatchOutlook::AfterChange(changes.join("; then "))
}

impl Pair<'_> {
    /// A verdict on this pair, P2P off.
    pub(super) fn off(
        &self,
        code: &str,
        certainty: Certainty,
        reason: String,
        remedy: String,
        patch: PatchOutlook,
        used: &[&str],
    ) -> Verdict {
        Verdict {
            a: self.pair.a,
            b: self.pair.b,
            code: code.to_owned(),
            certainty,
            on: None,
            reason,
            remedy,
            patch,
            used: used.iter().map(|s| (*s).to_owned()).collect(),
            hazards: Vec::new(),
            unchecked: Vec::new(),
            warnings: Vec::new(),
            steps: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// The verdict of a pair P2P is off for, from its chain of blockers ([`chain`]): the
    /// first decides the code, reason and certainty; the steps are every blocker's remedy in
    /// order, then installing the patch where it would then turn P2P on; the patch outlook
    /// names every change (or why it cannot, or what is not known).
    fn combine(&self, chain: Vec<(&'static str, Verdict)>) -> Verdict {
        let Some((_, first)) = chain.first() else {
            let mut v = self.patch_would();
            v.steps = vec![Step { rule: "patch".into(), code: v.code.clone(), remedy: v.remedy.clone() }];
            return v;
        };
        let mut v = first.clone();
        let outlooks: Vec<&PatchOutlook> = chain.iter().map(|(_, c)| &c.patch).collect();
        v.patch = merge_outlooks(&outlooks);
        let mut steps: Vec<Step> = chain
            .iter()
            .map(|(rule, c)| Step { rule: (*rule).to_owned(), code: c.code.clone(), remedy: c.remedy.clone() })
            .collect();
        for (_, c) in &chain[1..] {
            for used in &c.used {
                if !v.used.contains(used) {
                    v.used.push(used.clone());
                }
            }
            v.warnings.extend(c.warnings.iter().cloned());
        }
        if matches!(v.patch, PatchOutlook::AfterChange(_)) && self.geforce() && !self.patch.acted_on() {
            let install = self.install_after(&chain);
            steps.push(Step { rule: "patch".into(), code: "PATCH".into(), remedy: install.remedy });
            v.warnings.extend(install.warnings);
        }
        v.remedy = steps.iter().map(|s| s.remedy.as_str()).collect::<Vec<_>>().join("; then ");
        v.steps = steps;
        v
    }

    /// Installing the patch, as the last step after the changes of `chain`: the branch for
    /// the driver version the steps lead to.
    fn install_after(&self, chain: &[(&'static str, Verdict)]) -> Verdict {
        let mut install = self.patch_would();
        let check = "then check with `gp2p probe` and `gp2p bench copy --route peer`";
        if self.per_allocation() {
            let version = per_allocation_version();
            install.remedy = format!(
                "install the P2P patch from the {BAR1_PER_ALLOCATION_BRANCH} branch, for open module {version} exactly (PATCH.md), {check}"
            );
        } else if chain.iter().any(|(rule, _)| matches!(*rule, "module" | "version")) {
            install.remedy = format!(
                "install the P2P patch from the branch for the driver version the steps above lead to, built at exactly that version (PATCH.md), {check}"
            );
        }
        install
    }

    fn devices(&self) -> [&DeviceFacts; 2] {
        [self.a, self.b]
    }

    /// The driver versions whose patch branch drives this pair's architecture, in words
    /// ([`versions_in_words`]).
    fn versions(&self) -> String {
        versions_in_words(&versions_for(self.a.arch()))
    }

    /// Why the module's patch branch cannot drive this pair, when it is a branch that
    /// does not list the pair's architecture (a 5090 on the 570.86.16 branch).
    fn branch_lacking_arch(&self) -> Option<String> {
        let branch = branch_for_version(&self.module()?.version)?;
        let arch = self.a.arch();
        (!branch.architectures.contains(&arch))
            .then(|| format!("the {} branch does not drive {} cards", branch.name, arch.name()))
    }

    /// Whether GeForce advice can fit this pair: a card is GeForce, or of unknown class.
    /// Professional and datacenter pairs never get it.
    fn geforce(&self) -> bool {
        self.devices().iter().any(|d| !matches!(d.class(), Some(CardClass::Professional | CardClass::Datacenter)))
    }

    /// `outlook` where GeForce advice fits this pair ([`Self::geforce`]), else
    /// [`Self::patch_not_applicable`].
    fn geforce_outlook(&self, outlook: PatchOutlook) -> PatchOutlook {
        if self.geforce() { outlook } else { self.patch_not_applicable() }
    }

    /// The patch's outlook for a professional or datacenter pair: it is not for them.
    fn patch_not_applicable(&self) -> PatchOutlook {
        PatchOutlook::NotApplicable(
            "the P2P patch works around the driver's GeForce policy; professional and datacenter cards get P2P from the stock driver"
                .into(),
        )
    }

    /// Whether the IOMMU translates `d`'s DMA: its group's type, else the kernel command
    /// line when that turns translation off (passthrough, or the IOMMU off).
    fn iommu_translates(&self, d: &DeviceFacts) -> Option<bool> {
        let cmdline = self.facts.host.iommu_cmdline.as_ref();
        d.iommu_translates().or_else(|| cmdline.filter(|c| c.passthrough() || c.off()).map(|_| false))
    }

    fn module(&self) -> Option<&KernelModule> {
        self.facts.host.kernel_module.as_ref()
    }

    /// NVML's read/write statuses for the reason text, or nothing when unknown.
    fn nvml_status(&self) -> String {
        let atomics = self.pair.nvml_atomics.map_or(String::new(), |a| format!(", atomics {}", a.code()));
        match (self.pair.nvml_read, self.pair.nvml_write) {
            (Some(r), Some(w)) => format!(" (NVML: read {}, write {}{atomics})", r.code(), w.code()),
            _ if !self.facts.nvml_answered() => " (NVML's reason is unknown: libnvidia-ml could not be loaded)".into(),
            _ => String::new(),
        }
    }

    /// A fact this pair's verdict needs but lacks, with where it comes from.
    fn missing(&self, fact: Missing, d: &DeviceFacts) -> String {
        let n = d.ordinal;
        match fact {
            Missing::Bar1 if !self.facts.nvml_answered() => {
                format!("BAR1 of device {n} (NVML, which could not be loaded: libnvidia-ml)")
            }
            Missing::Bar1 => format!("BAR1 of device {n} (NVML gave none)"),
            Missing::Iommu => format!(
                "IOMMU state of device {n} (sysfs /sys/bus/pci/devices/{}/iommu_group, or iommu=pt on the kernel command line)",
                d.pci_bus_id.to_ascii_lowercase()
            ),
        }
    }

    /// What to do about the facts lacking: the fix for each one's source (root reads
    /// neither, so it is never the advice here).
    fn provide(&self, lacking: &[Missing]) -> String {
        let mut how = Vec::new();
        if lacking.contains(&Missing::Bar1) {
            how.push(if self.facts.nvml_answered() {
                "NVML answered but gave no BAR1: see \"not read\" below"
            } else {
                "make libnvidia-ml.so.1 loadable (it ships with the NVIDIA driver's user-space libraries; containers need it mounted)"
            });
        }
        if lacking.contains(&Missing::Iommu) {
            how.push(
                "run the probe where /sys shows the GPUs' IOMMU groups (on the host, not in a container without /sys)",
            );
        }
        how.join("; ")
    }

    /// Rule `patch`: everything the patch needs is in place.
    fn patch_would(&self) -> Verdict {
        let version = self.module().map_or("?", |m| m.version.as_str());
        let branch = branch_for_version(version)
            .map_or(format!("the {version} branch"), |b| format!("branch {} of {}", b.name, b.line.repository()));
        let mut verdict = self.off(
            "PATCH",
            Certainty::Likely,
            format!("the driver refuses P2P between these cards{}", self.nvml_status()),
            format!(
                "install the P2P patch, {branch}, for open module {version} (PATCH.md), then check with `gp2p probe` and `gp2p bench copy --route peer`"
            ),
            PatchOutlook::Would,
            &["cuDeviceCanAccessPeer", "kernel module", "BAR1", "IOMMU group type", "nvml p2p read/write"],
        );
        if self.patch.in_effect == Some(true) {
            // Possible only (acted-on states were handled by `patched`).
            verdict.warnings.push(format!(
                "the module may already carry the patch ({}); if it does, CUDA refuses for another reason: NVML's P2P statuses would tell (OK everywhere under the patch)",
                self.patch.because
            ));
        }
        if let Some(b) = branch_for_version(version).filter(|b| b.third_party_only) {
            verdict.warnings.push(format!(
                "branch {} is known from third-party notes, not seen in {} itself (branch table checked on {TABLE_CHECKED}): make sure it is listed at {} before building",
                b.name,
                b.line.repository(),
                b.url
            ));
        }
        if self.a.name != self.b.name {
            verdict.warnings.push(format!(
                "different models ({} and {}): the patch has been seen to work between cards of one chip; CUDA may refuse other pairs",
                self.a.name, self.b.name
            ));
        }
        verdict
    }
}

/// Bytes as GiB with one decimal, as the verdicts and the report write them.
pub(crate) fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_legend_lists_the_rules_in_the_order_they_run() {
        let names: Vec<&str> = RULES.iter().map(|r| r.split(':').next().unwrap_or(r)).collect();
        let run: Vec<&str> =
            std::iter::once("facts").chain(CHECKS.iter().map(|(name, _)| *name)).chain(["patch"]).collect();
        assert_eq!(names, run);
    }
}
