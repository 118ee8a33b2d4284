//! Whether the open-module P2P patch is in effect, inferred only from facts that can show
//! it, and how sure that is. Who compiled the module is not such a fact: distributions
//! (NixOS's `nixbld@`) and DKMS (`root@<host>`) build NVIDIA's stock sources too.

use serde::{Deserialize, Serialize};

use crate::branches::{TABLE_CHECKED, branch_for_version, newest_version, past_table};
use crate::facts::{Architecture, CardClass, DeviceFacts, Facts, ModuleFlavour, P2pStatus, PairFacts};
use crate::parse::{force_p2p_atomics, force_p2p_fields};

/// How sure a conclusion is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Certainty {
    /// A fact shows it directly: a status NVML or CUDA reports, a registry key, a size.
    Shown,
    /// It follows from the facts under one assumption, which the verdict names.
    Likely,
    /// Circumstantial: worth checking by hand, never acted on.
    Possible,
}

impl Certainty {
    /// Whether verdicts and route choices act on a conclusion this sure.
    pub fn acted_on(self) -> bool {
        self <= Certainty::Likely
    }

    /// The word for it in the report.
    pub fn name(self) -> &'static str {
        match self {
            Certainty::Shown => "shown",
            Certainty::Likely => "likely",
            Certainty::Possible => "possible",
        }
    }
}

/// What the facts say about the P2P patch on this machine. The patch is module-wide, so
/// one pair's evidence speaks for every pair.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PatchState {
    /// `Some(true)`: in effect; `Some(false)`: not; `None`: the facts cannot tell.
    pub in_effect: Option<bool>,
    /// How sure.
    pub certainty: Certainty,
    /// The facts it rests on, in words.
    pub because: String,
}

impl PatchState {
    /// Whether the patch is in effect surely enough to act on.
    pub fn acted_on(&self) -> bool {
        self.in_effect == Some(true) && self.certainty.acted_on()
    }

    /// One line for the report's header.
    pub fn describe(&self) -> String {
        let state = match (self.in_effect, self.certainty) {
            (Some(true), Certainty::Shown) => "in effect",
            (Some(true), Certainty::Likely) => "likely in effect",
            (Some(true), Certainty::Possible) => "possibly in effect, not relied on",
            (Some(false), Certainty::Shown) => "not in effect",
            (Some(false), _) => "no sign of it",
            (None, _) => "cannot tell",
        };
        format!("{state} ({}: {})", self.certainty.name(), self.because)
    }

    fn new(in_effect: Option<bool>, certainty: Certainty, because: String) -> PatchState {
        PatchState { in_effect, certainty, because }
    }
}

/// Architectures whose GeForce cards NVIDIA's own module refuses P2P over PCIe: a GeForce
/// pair of these that is reported P2P-capable over PCIe shows an override at work.
const REFUSED_BY_STOCK: &[Architecture] = &[Architecture::Ampere, Architecture::Ada, Architecture::Blackwell];
/// Architectures whose GeForce cards have no NVLink connector (Ampere's 3090 has one).
const WITHOUT_NVLINK: &[Architecture] = &[Architecture::Ada, Architecture::Blackwell];

/// What the facts say about the patch. In order: the module flavour and OS (where the patch
/// cannot be), NVML statuses and CUDA answers that only an override produces or that an
/// override would have changed, who built the module, and its version.
pub fn patch_state(facts: &Facts) -> PatchState {
    let host = &facts.host;
    let module = host.kernel_module.as_ref();
    let key = host.force_p2p();
    if module.is_some_and(|m| m.flavour == ModuleFlavour::Proprietary) {
        return PatchState::new(
            Some(false),
            Certainty::Shown,
            "the proprietary kernel module runs; the patch is to the open one".into(),
        );
    }
    if host.os.eq_ignore_ascii_case("windows") {
        return PatchState::new(
            Some(false),
            Certainty::Shown,
            "Windows; the patch is to Linux's open kernel module".into(),
        );
    }
    let pairs: Vec<(&PairFacts, &DeviceFacts, &DeviceFacts)> =
        facts.pairs.iter().filter_map(|p| Some((p, facts.device(p.a)?, facts.device(p.b)?))).collect();
    // The patch's built-in ForceP2P default (0x11) disables atomics: NVML then reports
    // them "disabled by regkey" though no key says so.
    let key_disables_atomics = key.is_some_and(|k| force_p2p_atomics(k) == 0);
    if let Some((p, ..)) = pairs.iter().find(|(p, ..)| p.nvml_atomics == Some(P2pStatus::DisabledByRegkey)) {
        if !key_disables_atomics {
            return PatchState::new(
                Some(true),
                Certainty::Shown,
                format!(
                    "NVML reports P2P atomics {} -> {} disabled by a registry key (DR) while no ForceP2P key disables them: the patch's built-in default",
                    p.a, p.b
                ),
            );
        }
    }
    let key_forces = key.is_some_and(|k| force_p2p_fields(k) == (1, 1));
    let geforce_over_pcie = |p: &PairFacts, a: &DeviceFacts, b: &DeviceFacts| {
        [a, b].iter().all(|d| d.class() == Some(CardClass::GeForce) && REFUSED_BY_STOCK.contains(&d.arch()))
            && p.nvml_nvlink != Some(P2pStatus::Ok)
    };
    if !key_forces {
        let nvml_ok = |p: &PairFacts| p.nvml_read == Some(P2pStatus::Ok) && p.nvml_write == Some(P2pStatus::Ok);
        if let Some((p, a, _)) = pairs.iter().find(|(p, a, b)| geforce_over_pcie(p, a, b) && nvml_ok(p)) {
            let cuda = if p.can_access_peer == Some(true) { " and CUDA" } else { "" };
            return PatchState::new(
                Some(true),
                Certainty::Shown,
                format!(
                    "NVML{cuda} report P2P between GeForce {} cards {} and {} over PCIe, which NVIDIA's own module refuses",
                    a.arch().name(),
                    p.a,
                    p.b
                ),
            );
        }
    }
    // With the patch every pair reads OK (or DR, under a key), so any other status shows
    // it is not in effect — unless a ForceP2P key is set, which can hand the decision back
    // to the chipset.
    let refused = |s: Option<P2pStatus>| s.is_some_and(|s| !matches!(s, P2pStatus::Ok | P2pStatus::DisabledByRegkey));
    if key.is_none() {
        if let Some((p, ..)) = pairs.iter().find(|(p, ..)| refused(p.nvml_read) || refused(p.nvml_write)) {
            let status = p.nvml_read.filter(|&s| refused(Some(s))).or(p.nvml_write).map_or("?", P2pStatus::code);
            return PatchState::new(
                Some(false),
                Certainty::Shown,
                format!(
                    "NVML reports {status} for pair {} -> {}; a patched module reports OK for every pair",
                    p.a, p.b
                ),
            );
        }
    }
    if !key_forces {
        let unconfirmed = |(p, a, b): &&(&PairFacts, &DeviceFacts, &DeviceFacts)| {
            geforce_over_pcie(p, a, b)
                && p.can_access_peer == Some(true)
                && p.nvml_read.is_none()
                && [a, b].iter().all(|d| WITHOUT_NVLINK.contains(&d.arch()))
        };
        if let Some((p, a, _)) = pairs.iter().find(unconfirmed) {
            return PatchState::new(
                Some(true),
                Certainty::Likely,
                format!(
                    "CUDA reports P2P between GeForce {} cards {} and {}, which have no NVLink and which NVIDIA's own module refuses over PCIe (NVML could not confirm)",
                    a.arch().name(),
                    p.a,
                    p.b
                ),
            );
        }
    }
    let Some(module) = module else {
        return PatchState::new(
            None,
            Certainty::Possible,
            "the kernel module is unknown and NVML shows nothing".into(),
        );
    };
    let builder = module.builder.as_deref().unwrap_or("an unnamed builder");
    if module.built_by_nvidia() == Some(true) {
        return PatchState::new(
            Some(false),
            Certainty::Shown,
            format!("open module {} is NVIDIA's own build ({builder})", module.version),
        );
    }
    if branch_for_version(&module.version).is_some() {
        return PatchState::new(
            Some(true),
            Certainty::Possible,
            format!(
                "open module {} is a version a patch branch exists for, built by {builder} (not NVIDIA); distributions and DKMS build stock modules too, and no NVML or CUDA fact shows an override",
                module.version
            ),
        );
    }
    if past_table(&module.version) {
        return PatchState::new(
            Some(true),
            Certainty::Possible,
            format!(
                "open module {} is newer than every patch branch this probe knows (its table ends at {}, checked on {TABLE_CHECKED}), built by {builder} (not NVIDIA); a branch for it may exist, and no NVML or CUDA fact shows an override",
                module.version,
                newest_version()
            ),
        );
    }
    PatchState::new(
        Some(false),
        Certainty::Likely,
        format!(
            "open module {} built by {builder} (a distribution, DKMS or local build); no patch branch has this version and no NVML or CUDA fact shows an override",
            module.version
        ),
    )
}

/// What forces P2P on before the driver's own checks.
pub(crate) struct Forced {
    /// How sure.
    pub certainty: Certainty,
    /// In words, for a verdict's reason.
    pub why: String,
    /// A `ForceP2P` key (removing it hands the decision back to the driver), not the patch.
    pub by_key: bool,
}

/// What forces P2P on before the driver's own checks, when facts show it: a `ForceP2P`
/// key enabling read and write, or the patch (whose built-in default is that key).
pub(crate) fn forced(facts: &Facts, patch: &PatchState) -> Option<Forced> {
    if let Some(key) = facts.host.force_p2p().filter(|&k| force_p2p_fields(k) == (1, 1)) {
        return Some(Forced {
            certainty: Certainty::Shown,
            why: format!("ForceP2P={key:#x} in the module's RegistryDwords forces it on"),
            by_key: true,
        });
    }
    patch.acted_on().then(|| Forced {
        certainty: patch.certainty,
        why: format!("the P2P patch forces it on (in effect: {})", patch.certainty.name()),
        by_key: false,
    })
}
