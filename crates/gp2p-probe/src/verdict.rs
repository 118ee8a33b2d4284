//! From facts to one verdict per ordered pair. Pure; the rules apply in the order of
//! [`RULES`], the first that fits decides, and each verdict lists the facts it used.

use serde::{Deserialize, Serialize};

use crate::branches::{BAR1_PER_ALLOCATION_BRANCH, architectures_driven, branch_for_version, versions_for};
use crate::facts::{
    Architecture, CardClass, DeviceFacts, Facts, KernelModule, ModuleFlavour, P2pStatus, PairFacts, bar1_holds,
    bar1_needed,
};
use crate::parse::force_p2p_fields;
use crate::patch::{Certainty, Forced, PatchState, forced, patch_state};

/// The rules, in the order they are tried, as documented in the report's legend.
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
    "version: an open module version with no patch branch for the cards' architecture",
    "bar1: BAR1 smaller than VRAM (Resizable BAR off where the card offers more; else the per-allocation branch, or nothing)",
    "iommu: the IOMMU translates GPU DMA",
    "patch: everything the patch needs is in place",
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

/// A rule: the verdict when it applies to the pair.
type Rule = fn(&Pair<'_>) -> Option<Verdict>;

/// The rules after `facts`, in the order of [`RULES`] (`patch` is the fallback).
const CHECKS: &[(&str, Rule)] = &[
    ("on", on),
    ("wddm", wddm),
    ("mixed", mixed),
    ("vm", virtual_machine),
    ("regkey", regkey),
    ("card", card),
    ("arch", arch),
    ("patched", patched),
    ("module", module),
    ("version", version),
    ("bar1", bar1),
    ("iommu", iommu),
];

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
    CHECKS.iter().find_map(|(_, rule)| rule(&p)).unwrap_or_else(|| p.patch_would())
}

impl Pair<'_> {
    /// A verdict on this pair, P2P off.
    fn off(
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
        }
    }

    fn devices(&self) -> [&DeviceFacts; 2] {
        [self.a, self.b]
    }

    /// The driver versions whose patch branch drives this pair's architecture, in words.
    fn versions(&self) -> String {
        versions_for(self.a.arch()).join(", ")
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

    /// What would let device `d`'s BAR1 map its VRAM (the static BAR1 mapping the patch
    /// uses), and what the patch would do then: Resizable BAR only where the card offers a
    /// BAR1 that large.
    fn bar1_fix(&self, d: &DeviceFacts) -> (String, PatchOutlook) {
        let n = d.ordinal;
        let vram = gib(d.vram_bytes);
        let needed = bar1_needed(d.vram_bytes).map_or("more than any BAR can be".into(), gib);
        let Some(largest) = d.bar1_largest() else {
            return (
                format!(
                    "enable Above 4G decoding and Resizable BAR in the firmware, if device {n} offers a BAR1 of at least {needed} (the sizes it offers were not read: sysfs resource1_resize)"
                ),
                PatchOutlook::AfterChange(format!(
                    "enable Resizable BAR, if device {n} offers a BAR1 of at least {needed}"
                )),
            );
        };
        if bar1_holds(largest, d.vram_bytes) {
            let resizes = if self.patch.acted_on() {
                " (the patched module resizes BAR1 itself at load where the firmware leaves room)"
            } else {
                ""
            };
            return (
                format!(
                    "enable Above 4G decoding and Resizable BAR in the firmware: device {n} offers a BAR1 of up to {}, enough for its {vram} of VRAM{resizes}",
                    gib(largest)
                ),
                PatchOutlook::AfterChange(format!(
                    "enable Resizable BAR (device {n} offers a BAR1 of up to {})",
                    gib(largest)
                )),
            );
        }
        let stuck = if d.bar1_sizes.as_ref().is_some_and(Vec::is_empty) {
            format!("device {n} offers no resizable BAR1 (it stays at {})", gib(largest))
        } else {
            format!("device {n}'s BAR1 cannot grow past {}", gib(largest))
        };
        let geforce = d.class() == Some(CardClass::GeForce);
        if geforce && d.arch() == Architecture::Ada {
            return (
                format!(
                    "{stuck}, less than its {vram} of VRAM, so the static BAR1 mapping cannot fit: the experimental {BAR1_PER_ALLOCATION_BRANCH} branch maps BAR1 per allocation instead (made for 48 GB 4090s)"
                ),
                PatchOutlook::AfterChange(format!(
                    "move to the experimental {BAR1_PER_ALLOCATION_BRANCH} branch, which maps BAR1 per allocation"
                )),
            );
        }
        if geforce && d.bar1_sizes.as_ref().is_some_and(Vec::is_empty) {
            return (
                format!(
                    "{stuck}: a VBIOS update from the card's maker may add Resizable BAR; without one there is no remedy and this pair stays staged"
                ),
                PatchOutlook::AfterChange(
                    "a VBIOS update that adds Resizable BAR, where the card's maker has one".into(),
                ),
            );
        }
        (
            format!(
                "none: {stuck}, less than its {vram} of VRAM, and no patch branch maps BAR1 per allocation for this card; this pair stays staged"
            ),
            PatchOutlook::Cannot(format!("device {n}'s BAR1 cannot map its VRAM, and it cannot grow")),
        )
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
        if self.a.name != self.b.name {
            verdict.warnings.push(format!(
                "different models ({} and {}): the patch has been seen to work between cards of one chip; CUDA may refuse other pairs",
                self.a.name, self.b.name
            ));
        }
        verdict
    }
}

/// Rule `on`: CUDA can access the peer. Where an override forces P2P on (the patch, or a
/// ForceP2P key), the driver skipped its own BAR1 and IOMMU checks, so those are checked
/// here: a failed one makes the pair UNSAFE, an unknown one OK?, and `Route::Auto` copies
/// either staged.
fn on(p: &Pair<'_>) -> Option<Verdict> {
    if p.pair.can_access_peer != Some(true) {
        return None;
    }
    let forced = forced(p.facts, p.patch);
    let link = if p.pair.nvml_nvlink == Some(P2pStatus::Ok) {
        Link::NvLink
    } else if forced.is_some() || p.pair.performance_rank.is_some_and(|r| r > 0) {
        Link::PcieBar1
    } else {
        Link::Pcie
    };
    let used = ["cuDeviceCanAccessPeer", "nvml p2p nvlink", "nvml p2p atomics", "kernel module"];
    let over = link_name(link);
    let Some(Forced { certainty, why, by_key }) = forced.filter(|_| link != Link::NvLink) else {
        let mut v = p.off(
            "OK",
            Certainty::Shown,
            format!("CUDA can access the peer (over {over}); the driver's own decision"),
            "nothing to do: geforce-p2p copies by P2P on this pair".into(),
            PatchOutlook::NotNeeded,
            &used,
        );
        v.on = Some(link);
        return Some(v);
    };
    let (mut hazards, mut unchecked, mut lacking) = (Vec::new(), Vec::new(), Vec::new());
    let (mut bar1_remedy, mut iommu_remedy) = (None, None);
    let mut branch_remedy = None;
    if let Some(wrong) = p.branch_lacking_arch().filter(|_| !by_key && p.geforce()) {
        hazards
            .push(format!("{wrong}: enabling peer access fails (cudaErrorMapBufferObjectFailed) or copies go wrong"));
        branch_remedy = Some(format!("move to a branch that drives {} cards: {}", p.a.arch().name(), p.versions()));
    }
    for d in p.devices() {
        match d.bar1_covers_vram() {
            Some(false) => {
                hazards.push(format!(
                    "{}: forced peer mappings fail (cudaErrorMapBufferObjectFailed) or copies land in the wrong place",
                    bar1_too_small(d)
                ));
                // One BAR1 remedy, for the first card: a pair's two cards are (almost
                // always) the same model, and the hazards name both. Only GeForce cards
                // need BAR1 to hold VRAM: the stock driver's own P2P does not.
                if p.geforce() {
                    bar1_remedy.get_or_insert_with(|| p.bar1_fix(d).0);
                }
            }
            None => {
                unchecked.push(p.missing(Missing::Bar1, d));
                lacking.push(Missing::Bar1);
            }
            Some(true) => {}
        }
        match p.iommu_translates(d) {
            Some(true) => {
                hazards.push(format!(
                    "{}: peer copies finish with zeros or garbage (IO_PAGE_FAULT in dmesg)",
                    iommu_translates(d)
                ));
                iommu_remedy = Some(IOMMU_REMEDY.to_owned());
            }
            None => {
                unchecked.push(p.missing(Missing::Iommu, d));
                lacking.push(Missing::Iommu);
            }
            Some(false) => {}
        }
    }
    // Without the override the driver checks BAR1 and the IOMMU itself: where the key
    // forces P2P, or the patch does on cards the stock driver serves, undoing it is the fix.
    let undo = if by_key {
        Some(format!(
            "remove ForceP2P from NVreg_RegistryDwords so the driver decides P2P itself{}",
            if p.geforce() { "" } else { " (it does so safely on these cards)" }
        ))
    } else if !p.geforce() {
        Some("go back to NVIDIA's stock module (PATCH.md, Going back): its own P2P on these cards checks BAR1 and the IOMMU".into())
    } else {
        None
    };
    // What the patch, where it forces P2P, still needs for this pair to be safe.
    let outlook = |needs: Vec<&str>| {
        if by_key {
            PatchOutlook::NotNeeded
        } else if !p.geforce() {
            p.patch_not_applicable()
        } else {
            PatchOutlook::InEffect(needs.join(", "))
        }
    };
    let needs: Vec<&str> = [
        branch_remedy.as_ref().map(|_| "a branch for these cards"),
        bar1_remedy.as_ref().map(|_| "a BAR1 that holds VRAM"),
        iommu_remedy.as_ref().map(|_| "the IOMMU in passthrough"),
    ]
    .into_iter()
    .flatten()
    .collect();
    let remedies: Vec<String> = [undo, branch_remedy, bar1_remedy, iommu_remedy].into_iter().flatten().collect();
    let staged =
        "until then geforce-p2p copies this pair staged (Route::Auto); Route::Peer still forces P2P, at your own risk";
    let mut v = if !hazards.is_empty() {
        p.off(
            "UNSAFE",
            certainty,
            format!(
                "CUDA can access the peer (over {over}), but {why}, past the driver's own BAR1 and IOMMU checks, and this pair fails them ({} hazard{})",
                hazards.len(),
                if hazards.len() == 1 { "" } else { "s" }
            ),
            format!("{}; {staged}", remedies.join("; ")),
            outlook(needs),
            &used,
        )
    } else if !unchecked.is_empty() {
        p.off(
            "OK?",
            Certainty::Possible,
            format!(
                "CUDA can access the peer (over {over}) and {why}, past the driver's own checks; whether that is safe cannot be checked without: {}",
                unchecked.join(", ")
            ),
            format!(
                "provide the missing facts ({}), or check by hand with `gp2p bench copy --route peer` (zero wrong elements at every size) and force Route::Peer; {staged}",
                p.provide(&lacking)
            ),
            outlook(vec!["the BAR1 and IOMMU facts to check it against"]),
            &used,
        )
    } else {
        p.off(
            "OK",
            certainty,
            format!("CUDA can access the peer (over {over}); {why}, and BAR1 and the IOMMU allow it"),
            "nothing to do: geforce-p2p copies by P2P on this pair".into(),
            outlook(Vec::new()),
            &used,
        )
    };
    v.on = Some(link);
    v.hazards = hazards;
    v.unchecked = unchecked;
    Some(v)
}

/// Rule `wddm`: a Windows WDDM driver never exposes P2P.
fn wddm(p: &Pair<'_>) -> Option<Verdict> {
    let windows = p.facts.host.os.eq_ignore_ascii_case("windows");
    // A GeForce card under Windows always runs WDDM: it cannot switch.
    let (d, certainty) = match p.devices().into_iter().find(|d| d.driver_model.as_deref() == Some("WDDM")) {
        Some(d) => (d, Certainty::Shown),
        None if windows => {
            let d = p.devices().into_iter().find(|d| d.class() == Some(CardClass::GeForce))?;
            (d, Certainty::Likely)
        }
        None => return None,
    };
    let n = d.ordinal;
    let (remedy, patch) = match d.class() {
        Some(CardClass::GeForce) => (
            format!(
                "none on Windows: device {n} is a GeForce card, which cannot leave WDDM (TCC and MCDM are for professional and datacenter cards); geforce-p2p's staged copy is the way here, or Linux with the P2P patch (PATCH.md)"
            ),
            PatchOutlook::Cannot(
                "the patch is for Linux's open kernel module; on Windows a GeForce card stays on WDDM".into(),
            ),
        ),
        Some(class) => (
            format!(
                "switch device {n} ({} card) to the TCC or MCDM driver model (`nvidia-smi -i {} -dm TCC`, or MCDM where the driver offers it; no display attached), then reboot",
                class.name(),
                if d.pci_bus_id.is_empty() { "<its bus id>" } else { &d.pci_bus_id }
            ),
            p.patch_not_applicable(),
        ),
        None => (
            format!(
                "switch device {n} to the TCC or MCDM driver model if it is a professional or datacenter card (GeForce cards cannot); otherwise geforce-p2p's staged copy is the way"
            ),
            PatchOutlook::Cannot("the patch is for Linux's open kernel module".into()),
        ),
    };
    let model = if certainty == Certainty::Shown { "runs under" } else { "is a GeForce card, so it runs under" };
    Some(p.off(
        "WDDM",
        certainty,
        format!("device {n} {model} the Windows WDDM driver model, which never exposes P2P"),
        remedy,
        patch,
        &["driver model", "brand"],
    ))
}

/// Rule `mixed`: different generations.
fn mixed(p: &Pair<'_>) -> Option<Verdict> {
    let (a, b) = (p.a, p.b);
    // Different chips of one generation (an A100 and an A6000) are refused alike.
    let differ = a.arch() != b.arch() || a.compute_capability != b.compute_capability;
    differ.then(|| {
        p.off(
            "MIX",
            Certainty::Shown,
            format!(
                "the devices are of different generations or chips ({} {}.{} and {} {}.{})",
                a.name,
                a.compute_capability.0,
                a.compute_capability.1,
                b.name,
                b.compute_capability.0,
                b.compute_capability.1
            ),
            "pair cards of the same generation for P2P; this pair uses the staged copy".into(),
            if p.geforce() {
                PatchOutlook::Cannot("CUDA refuses P2P between generations even on a patched driver".into())
            } else {
                p.patch_not_applicable()
            },
            &["architecture", "compute capability"],
        )
    })
}

/// Rule `vm`: inside a virtual machine the hypervisor decides.
fn virtual_machine(p: &Pair<'_>) -> Option<Verdict> {
    let vm = p.facts.host.virtual_machine.as_ref()?;
    Some(p.off(
        "VM",
        Certainty::Likely,
        format!("this is a virtual machine ({vm}); the emulated chipset makes the driver refuse P2P"),
        "ask the hypervisor for a GPUDirect clique (QEMU x-nv-gpudirect-clique) or run on bare metal".into(),
        if p.geforce() {
            PatchOutlook::Cannot("inside a VM the patch cannot map the peer's BAR1; the hypervisor decides".into())
        } else {
            p.patch_not_applicable()
        },
        &["virtualization"],
    ))
}

/// Rule `regkey`: a ForceP2P registry key disables it.
fn regkey(p: &Pair<'_>) -> Option<Verdict> {
    let host = &p.facts.host;
    let key = host.force_p2p();
    let key_off = key.is_some_and(|f| {
        let (read, write) = force_p2p_fields(f);
        read == 0 || write == 0
    });
    let dr = Some(P2pStatus::DisabledByRegkey);
    let nvml_dr = p.pair.nvml_read == dr || p.pair.nvml_write == dr;
    let remedy = if host.os.eq_ignore_ascii_case("windows") {
        "remove the ForceP2P value from the NVIDIA driver's registry key and restart"
    } else {
        "remove ForceP2P from NVreg_RegistryDwords (modprobe options) and reload the module"
    };
    (key_off || nvml_dr).then(|| {
        p.off(
            "DR",
            Certainty::Shown,
            format!("P2P is disabled by a registry key (ForceP2P={})", key.map_or("?".into(), |f| format!("{f:#x}"))),
            remedy.into(),
            if p.geforce() {
                PatchOutlook::AfterChange("remove the ForceP2P registry key".into())
            } else {
                p.patch_not_applicable()
            },
            &["/proc/driver/nvidia/params", "nvml p2p read/write"],
        )
    })
}

/// Rule `card`: professional and datacenter cards get P2P from the stock driver, so when it
/// refuses them the cause is elsewhere (topology, ACS, the GPU's mode), never the GeForce
/// policy the patch works around.
fn card(p: &Pair<'_>) -> Option<Verdict> {
    if p.geforce() {
        return None;
    }
    let classes = if p.a.class() == p.b.class() {
        format!("{} cards", p.a.class().map_or("these", CardClass::name))
    } else {
        "professional and datacenter cards".to_owned()
    };
    let statuses = [p.pair.nvml_read, p.pair.nvml_write];
    let topology = p.pair.topology.as_deref();
    let path = topology.map_or(String::new(), |t| format!("; topology {t}"));
    let status = p.nvml_status();
    let acs = "check ACS redirect on the PCIe switches and root ports (as root: `sudo lspci -vvv | grep ACSCtl`; ReqRedir+ or CmpltRedir+ send P2P up to the root complex) and disable ACS in the firmware";
    let (code, certainty, reason, remedy) = if statuses
        .iter()
        .any(|s| matches!(s, Some(P2pStatus::ChipsetNotSupported | P2pStatus::IohTopologyNotSupported)))
        || topology == Some("SYS")
    {
        (
            "TOPO",
            Certainty::Likely,
            format!("the driver refuses P2P between these {classes} over their PCIe path{status}{path}"),
            format!(
                "put both cards under one PCIe switch or one CPU's root complex (topology PIX, PXB or PHB): this chipset or path does not carry P2P; {acs}"
            ),
        )
    } else if statuses.contains(&Some(P2pStatus::GpuNotSupported)) {
        (
            "DRV",
            Certainty::Possible,
            format!("the driver refuses P2P between these {classes}: the GPU side does not support it{status}"),
            "use the physical GPU rather than an SR-IOV virtual function or vGPU, leave MIG mode (`nvidia-smi -q | grep -i mig`), and remove PeerMappingOverride from the driver's registry keys".into(),
        )
    } else {
        (
            "DRV",
            Certainty::Possible,
            format!("the driver refuses P2P between these {classes}{status}{path}"),
            format!("{acs}; check MIG mode (`nvidia-smi -q | grep -i mig`) and that both cards are the same chip"),
        )
    };
    Some(p.off(
        code,
        certainty,
        reason,
        remedy,
        p.patch_not_applicable(),
        &["brand", "nvml p2p read/write", "topology"],
    ))
}

/// Rule `module`: the kernel module: unknown, or the proprietary one.
fn module(p: &Pair<'_>) -> Option<Verdict> {
    let status = p.nvml_status();
    let Some(module) = p.module() else {
        return Some(p.off(
            "?",
            Certainty::Shown,
            format!("the driver refuses P2P{status}; the kernel module flavour is unknown"),
            "read /proc/driver/nvidia/version (Linux) to tell open from proprietary".into(),
            PatchOutlook::Undecided(vec!["/proc/driver/nvidia/version".into()]),
            &["cuDeviceCanAccessPeer", "nvml p2p read/write"],
        ));
    };
    (module.flavour == ModuleFlavour::Proprietary).then(|| {
        p.off(
            "PROP",
            Certainty::Shown,
            format!("the driver refuses P2P{status}, and runs the proprietary kernel module {}", module.version),
            format!(
                "switch to NVIDIA's open kernel module at a version with a patch branch for {} cards (PATCH.md): {}",
                p.a.arch().name(),
                p.versions()
            ),
            PatchOutlook::AfterChange(format!("switch to the open kernel module at one of {}", p.versions())),
            &["cuDeviceCanAccessPeer", "kernel module"],
        )
    })
}

/// Rule `version`: an open module no patch exists for.
fn version(p: &Pair<'_>) -> Option<Verdict> {
    let module = p.module()?;
    let arch = p.a.arch();
    let missing = match branch_for_version(&module.version) {
        None => format!("no patch branch exists for open module {}", module.version),
        Some(b) if !b.architectures.contains(&arch) => {
            format!("the {} branch does not drive {} cards", b.name, arch.name())
        }
        Some(_) => return None,
    };
    Some(p.off(
        "VER",
        Certainty::Shown,
        format!("the driver refuses P2P{}; {missing}", p.nvml_status()),
        format!(
            "install a driver version whose patch branch drives {} cards ({}) and build the patched open module at exactly that version",
            arch.name(),
            p.versions()
        ),
        PatchOutlook::AfterChange(format!("move to one of {}", p.versions())),
        &["cuDeviceCanAccessPeer", "kernel module", "architecture"],
    ))
}

/// Rule `arch`: GeForce cards of an architecture no branch drives (Turing and older).
fn arch(p: &Pair<'_>) -> Option<Verdict> {
    let arch = p.a.arch();
    versions_for(arch).is_empty().then(|| {
        p.off(
            "ARCH",
            Certainty::Shown,
            format!(
                "the driver refuses P2P{}, and no patch branch drives {} cards (branches exist for {})",
                p.nvml_status(),
                arch.name(),
                architectures_driven()
            ),
            "none: geforce-p2p's staged copy is the way for this pair".into(),
            PatchOutlook::Cannot(format!("no branch drives {} cards", arch.name())),
            &["architecture", "compute capability"],
        )
    })
}

/// Rule `patched`: the patch is in effect and CUDA still refuses. Installing it is not the
/// answer; what else is missing is.
fn patched(p: &Pair<'_>) -> Option<Verdict> {
    if !p.patch.acted_on() {
        return None;
    }
    let status = p.nvml_status();
    let in_effect =
        format!("the P2P patch is in effect ({}) but CUDA refuses this pair{status}", p.patch.certainty.name());
    let used = ["cuDeviceCanAccessPeer", "nvml p2p read/write/atomics", "kernel module"];
    if let Some(wrong) = p.branch_lacking_arch() {
        return Some(p.off(
            "VER",
            Certainty::Shown,
            format!("{in_effect}: {wrong}"),
            format!("move to a branch that drives {} cards: {}", p.a.arch().name(), p.versions()),
            PatchOutlook::InEffect(format!("a branch for {} cards", p.a.arch().name())),
            &used,
        ));
    }
    if let Some(d) = p.devices().into_iter().find(|d| d.bar1_covers_vram() == Some(false)) {
        let (remedy, _) = p.bar1_fix(d);
        return Some(p.off(
            "BAR1",
            Certainty::Shown,
            format!("{in_effect}: {}", bar1_too_small(d)),
            remedy,
            PatchOutlook::InEffect("a BAR1 that holds VRAM".into()),
            &["BAR1", "BAR1 sizes (resource1_resize)", "VRAM", "kernel module"],
        ));
    }
    if let Some(d) = p.devices().into_iter().find(|d| p.iommu_translates(d) == Some(true)) {
        return Some(p.off(
            "IOMMU",
            Certainty::Shown,
            format!("{in_effect}: {}", iommu_translates(d)),
            IOMMU_REMEDY.into(),
            PatchOutlook::InEffect("the IOMMU in passthrough".into()),
            &["IOMMU group type", "/proc/cmdline", "kernel module"],
        ));
    }
    let mut causes = vec![
        "look for NVRM errors in the kernel log (`sudo dmesg | grep NVRM`)".to_owned(),
        "static BAR1 may be off: add RMForceStaticBar1=1 to NVreg_RegistryDwords".to_owned(),
        "ACS redirect on a switch or root port (`sudo lspci -vvv | grep ACSCtl`): disable ACS in the firmware"
            .to_owned(),
        "a kernel upgrade since the module was built: rebuild it for the running kernel".to_owned(),
    ];
    if p.a.arch() == Architecture::Blackwell {
        causes.insert(
            1,
            "a display attached to a 5090 breaks it on some branches: move the display to another card".into(),
        );
    }
    Some(p.off(
        "PFAIL",
        Certainty::Possible,
        format!("{in_effect}, and the facts show no cause"),
        format!("known further causes: {}", causes.join("; ")),
        PatchOutlook::InEffect("something the facts do not show (see the remedy)".into()),
        &used,
    ))
}

/// Rule `bar1`: BAR1 too small to map VRAM, where the patch's mappings go.
fn bar1(p: &Pair<'_>) -> Option<Verdict> {
    let d = p.devices().into_iter().find(|d| d.bar1_covers_vram() == Some(false))?;
    let (remedy, outlook) = p.bar1_fix(d);
    Some(p.off(
        "BAR1",
        Certainty::Shown,
        format!("the driver refuses P2P{}; {}", p.nvml_status(), bar1_too_small(d)),
        remedy,
        outlook,
        &["BAR1", "BAR1 sizes (resource1_resize)", "VRAM"],
    ))
}

/// Rule `iommu`: a translating IOMMU, which the patch's raw BAR1 addresses bypass; then any fact
/// these two rules could not check.
fn iommu(p: &Pair<'_>) -> Option<Verdict> {
    if let Some(d) = p.devices().into_iter().find(|d| p.iommu_translates(d) == Some(true)) {
        return Some(p.off(
            "IOMMU",
            Certainty::Shown,
            format!("the driver refuses P2P{}; {}", p.nvml_status(), iommu_translates(d)),
            IOMMU_REMEDY.into(),
            PatchOutlook::AfterChange("set the IOMMU to passthrough (iommu=pt)".into()),
            &["IOMMU group type", "/proc/cmdline"],
        ));
    }
    let (mut missing, mut lacking) = (Vec::new(), Vec::new());
    for d in p.devices() {
        if d.bar1_covers_vram().is_none() {
            missing.push(p.missing(Missing::Bar1, d));
            lacking.push(Missing::Bar1);
        }
    }
    for d in p.devices() {
        if p.iommu_translates(d).is_none() {
            missing.push(p.missing(Missing::Iommu, d));
            lacking.push(Missing::Iommu);
        }
    }
    (!missing.is_empty()).then(|| {
        p.off(
            "?",
            Certainty::Shown,
            format!("the driver refuses P2P{}; the patch's requirements cannot all be checked", p.nvml_status()),
            format!("provide the missing facts: {}", p.provide(&lacking)),
            PatchOutlook::Undecided(missing),
            &["kernel module", "BAR1", "IOMMU group type"],
        )
    })
}

fn link_name(link: Link) -> &'static str {
    match link {
        Link::NvLink => "NVLink",
        Link::PcieBar1 => "PCIe BAR1",
        Link::Pcie => "PCIe",
    }
}

/// The patch's peer mappings bypass IOMMU translation: what to do where DMA is translated.
const IOMMU_REMEDY: &str = "set the IOMMU to passthrough (iommu=pt on the kernel command line) or turn it off";

/// The BAR1 hazard of device `d`, in words (for a refusal and for a warning alike).
fn bar1_too_small(d: &DeviceFacts) -> String {
    format!(
        "device {}'s BAR1 ({}) cannot map its VRAM ({})",
        d.ordinal,
        gib(d.bar1_bytes.unwrap_or(0)),
        gib(d.vram_bytes)
    )
}

/// The IOMMU hazard of device `d`, in words.
fn iommu_translates(d: &DeviceFacts) -> String {
    format!("the IOMMU translates device {}'s DMA ({})", d.ordinal, d.iommu_group_type.as_deref().unwrap_or("?"))
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
