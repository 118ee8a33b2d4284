//! From facts to one verdict per ordered pair. Pure; the rules apply in the order of
//! [`RULES`], the first that fits decides, and each verdict lists the facts it used.

use serde::{Deserialize, Serialize};

use crate::facts::{DeviceFacts, Facts, ModuleFlavour, P2pStatus, PairFacts};
use crate::parse::force_p2p_fields;

/// Driver versions the open-kernel-module P2P patch has been published for (tinygrad and
/// aikitoria branches; see PATCH.md).
pub const PATCHED_VERSIONS: &[&str] = &[
    "550.54.15",
    "550.90.07",
    "550.127.08",
    "560.35.03",
    "565.57.01",
    "565.77",
    "570.86.16",
    "570.148.08",
    "575.64.05",
    "580.82.09",
    "580.95.05",
    "590.48.01",
    "595.58.03",
    "595.71.05",
];

/// The rules, in the order they are tried, as documented in the report's legend.
pub const RULES: &[&str] = &[
    "facts: without two listed devices and CUDA's answer for the pair nothing is decided",
    "on: CUDA can access the peer (warn when a patched driver runs with BAR1 < VRAM or a translating IOMMU)",
    "wddm: a Windows WDDM driver never exposes P2P",
    "mixed: different GPU generations (CUDA refuses them even on a patched driver)",
    "vm: inside a virtual machine the patch cannot help (the hypervisor decides)",
    "regkey: a ForceP2P registry key disables it",
    "module: the proprietary kernel module (the patch needs the open one)",
    "version: an open module version no patch branch exists for",
    "bar1: BAR1 smaller than VRAM (Resizable BAR off)",
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
    /// Short code for the pair matrix (OK, WDDM, MIX, VM, DR, PROP, VER, BAR1, IOMMU, PATCH, ?).
    pub code: String,
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
    /// Things that are on but unsafe, or worth knowing.
    pub warnings: Vec<String>,
}

/// The verdict for every ordered pair of `facts`, in order.
pub fn verdicts(facts: &Facts) -> Vec<Verdict> {
    facts.pairs.iter().map(|p| verdict(facts, p)).collect()
}

/// The verdict for one pair.
pub fn verdict(facts: &Facts, pair: &PairFacts) -> Verdict {
    let v =
        |code: &str, on: Option<Link>, reason: String, remedy: String, patch: PatchOutlook, used: &[&str]| Verdict {
            a: pair.a,
            b: pair.b,
            code: code.to_owned(),
            on,
            reason,
            remedy,
            patch,
            used: used.iter().map(|s| (*s).to_owned()).collect(),
            warnings: Vec::new(),
        };
    let host = &facts.host;
    let module = host.kernel_module.as_ref();
    let nvml = nvml_summary(pair);

    // 1. A pair of devices the facts describe, and CUDA's answer for it.
    let (Some(a), Some(b)) = (facts.device(pair.a), facts.device(pair.b)) else {
        let absent = if facts.device(pair.a).is_none() { pair.a } else { pair.b };
        return v(
            "?",
            None,
            format!("the facts list no device {absent}, so nothing is known about it"),
            "probe again on the machine itself (`gp2p probe --json`) rather than editing saved facts".into(),
            PatchOutlook::Undecided(vec![format!("device {absent}")]),
            &["devices"],
        );
    };
    let Some(can_access) = pair.can_access_peer else {
        let missing = vec!["cuDeviceCanAccessPeer".to_owned()];
        return v(
            "?",
            None,
            "CUDA did not answer for this pair (a device could not be opened)".into(),
            "run the probe where both devices can be opened (compute capability 8.0+, not hidden by CUDA_VISIBLE_DEVICES)".into(),
            PatchOutlook::Undecided(missing),
            &["cuDeviceCanAccessPeer"],
        );
    };

    // 2. On.
    if can_access {
        let self_built = module.is_some_and(|m| m.self_built());
        let link = if pair.nvml_nvlink == Some(P2pStatus::Ok) {
            Link::NvLink
        } else if self_built || pair.performance_rank.is_some_and(|r| r > 0) {
            Link::PcieBar1
        } else {
            Link::Pcie
        };
        let mut verdict = v(
            "OK",
            Some(link),
            format!("CUDA can access the peer (over {})", link_name(link)),
            "nothing to do: geforce-p2p copies by P2P on this pair".into(),
            PatchOutlook::NotNeeded,
            &["cuDeviceCanAccessPeer", "nvml p2p nvlink", "kernel module"],
        );
        // A patched driver forces NVML to OK before checking BAR1 or the IOMMU.
        let patched = self_built || host.force_p2p().is_some_and(|f| force_p2p_fields(f) == (1, 1));
        if patched && link != Link::NvLink {
            for d in [a, b] {
                if d.bar1_covers_vram() == Some(false) {
                    verdict.warnings.push(format!(
                        "{}; a forced P2P mapping can fail or corrupt data: {BAR1_REMEDY}",
                        bar1_too_small(d)
                    ));
                }
                if d.iommu_translates() == Some(true) {
                    verdict.warnings.push(format!(
                        "{}; with the patch, P2P data can be silently wrong: {IOMMU_REMEDY}",
                        iommu_translates(d)
                    ));
                }
            }
        }
        return verdict;
    }

    // 3. WDDM.
    let wddm = [a, b].into_iter().find(|d| d.driver_model.as_deref() == Some("WDDM"));
    if let Some(d) = wddm {
        return v(
            "WDDM",
            None,
            format!("device {} runs under the Windows WDDM driver model, which never exposes P2P", d.ordinal),
            "switch the cards to TCC/MCDM where the card supports it, or run Linux; otherwise geforce-p2p's staged copy is the way".into(),
            PatchOutlook::Cannot("the patch is for the Linux open kernel module; WDDM never exposes P2P".into()),
            &["driver model"],
        );
    }

    // 4. Mixed generations.
    let arch_differs = match (&a.architecture, &b.architecture) {
        (Some(x), Some(y)) => x != y,
        _ => a.compute_capability != b.compute_capability,
    };
    if arch_differs {
        return v(
            "MIX",
            None,
            format!(
                "the devices are of different generations ({} {}.{} and {} {}.{})",
                a.name,
                a.compute_capability.0,
                a.compute_capability.1,
                b.name,
                b.compute_capability.0,
                b.compute_capability.1
            ),
            "pair cards of the same generation for P2P; this pair uses the staged copy".into(),
            PatchOutlook::Cannot("CUDA refuses P2P between generations even on a patched driver".into()),
            &["architecture", "compute capability"],
        );
    }

    // 5. Virtual machine.
    if let Some(vm) = &host.virtual_machine {
        return v(
            "VM",
            None,
            format!("this is a virtual machine ({vm}); the emulated chipset makes the driver refuse P2P"),
            "ask the hypervisor for a GPUDirect clique (QEMU x-nv-gpudirect-clique) or run on bare metal".into(),
            PatchOutlook::Cannot("inside a VM the patch cannot map the peer's BAR1; the hypervisor decides".into()),
            &["virtualization"],
        );
    }

    // 6. A registry key disables it.
    let regkey_off = host.force_p2p().is_some_and(|f| {
        let (read, write) = force_p2p_fields(f);
        read == 0 || write == 0
    }) || nvml.disabled_by_regkey;
    if regkey_off {
        return v(
            "DR",
            None,
            format!(
                "P2P is disabled by a registry key (ForceP2P={})",
                host.force_p2p().map_or("?".into(), |f| format!("{f:#x}"))
            ),
            "remove ForceP2P from NVreg_RegistryDwords (modprobe options) and reload the module".into(),
            PatchOutlook::AfterChange("remove the ForceP2P registry key".into()),
            &["/proc/driver/nvidia/params", "nvml p2p read/write"],
        );
    }

    let status = nvml.describe();
    // 7. The proprietary module.
    let Some(module) = module else {
        return v(
            "?",
            None,
            format!("the driver refuses P2P{status}; the kernel module flavour is unknown"),
            "read /proc/driver/nvidia/version (Linux) to tell open from proprietary".into(),
            PatchOutlook::Undecided(vec!["/proc/driver/nvidia/version".into()]),
            &["cuDeviceCanAccessPeer", "nvml p2p read/write"],
        );
    };
    if module.flavour == ModuleFlavour::Proprietary {
        return v(
            "PROP",
            None,
            format!("the driver refuses P2P{status}, and runs the proprietary kernel module {}", module.version),
            "switch to NVIDIA's open kernel module at a version the patch exists for (see PATCH.md)".into(),
            PatchOutlook::AfterChange(format!(
                "switch to the open kernel module at one of {}",
                PATCHED_VERSIONS.join(", ")
            )),
            &["cuDeviceCanAccessPeer", "kernel module"],
        );
    }

    // 8. An open module no patch exists for.
    if !PATCHED_VERSIONS.contains(&module.version.as_str()) {
        return v(
            "VER",
            None,
            format!("the driver refuses P2P{status}; no patch branch exists for open module {}", module.version),
            "install a driver version with a patch branch and build the patched open module at exactly that version"
                .into(),
            PatchOutlook::AfterChange(format!("move to one of {}", PATCHED_VERSIONS.join(", "))),
            &["cuDeviceCanAccessPeer", "kernel module"],
        );
    }

    // 9, 10. BAR1 and the IOMMU, where the patch's mappings go.
    let mut missing = Vec::new();
    for d in [a, b] {
        match d.bar1_covers_vram() {
            Some(false) => {
                return v(
                    "BAR1",
                    None,
                    format!("the driver refuses P2P{status}; {}", bar1_too_small(d)),
                    BAR1_REMEDY.into(),
                    PatchOutlook::AfterChange("enable Resizable BAR so BAR1 covers VRAM".into()),
                    &["BAR1", "VRAM"],
                );
            }
            None => missing.push(format!("BAR1 of device {}", d.ordinal)),
            Some(true) => {}
        }
    }
    for d in [a, b] {
        match d.iommu_translates() {
            Some(true) => {
                return v(
                    "IOMMU",
                    None,
                    format!("the driver refuses P2P{status}; {}", iommu_translates(d)),
                    IOMMU_REMEDY.into(),
                    PatchOutlook::AfterChange("set the IOMMU to passthrough (iommu=pt)".into()),
                    &["IOMMU group type", "/proc/cmdline"],
                );
            }
            None => missing.push(format!("IOMMU state of device {}", d.ordinal)),
            Some(false) => {}
        }
    }
    if !missing.is_empty() {
        return v(
            "?",
            None,
            format!("the driver refuses P2P{status}; the patch's requirements cannot all be checked"),
            format!("provide the missing facts ({}) — run the probe as root on the host", missing.join(", ")),
            PatchOutlook::Undecided(missing),
            &["kernel module", "BAR1", "IOMMU group type"],
        );
    }

    // 11. Everything the patch needs is there.
    v(
        "PATCH",
        None,
        format!("the driver refuses P2P between these cards{status}"),
        format!(
            "install the P2P patch for open module {} (PATCH.md), then check with `gp2p probe` and `gp2p bench copy --route peer`",
            module.version
        ),
        PatchOutlook::Would,
        &["cuDeviceCanAccessPeer", "kernel module", "BAR1", "IOMMU group type", "nvml p2p read/write"],
    )
}

/// NVML's statuses for a pair, summarised for the reason text.
struct NvmlSummary {
    read: Option<P2pStatus>,
    write: Option<P2pStatus>,
    disabled_by_regkey: bool,
}

fn nvml_summary(pair: &PairFacts) -> NvmlSummary {
    let dr = Some(P2pStatus::DisabledByRegkey);
    NvmlSummary {
        read: pair.nvml_read,
        write: pair.nvml_write,
        disabled_by_regkey: pair.nvml_read == dr || pair.nvml_write == dr,
    }
}

impl NvmlSummary {
    fn describe(&self) -> String {
        match (self.read, self.write) {
            (Some(r), Some(w)) => format!(" (NVML: read {}, write {})", r.code(), w.code()),
            _ => String::new(),
        }
    }
}

fn link_name(link: Link) -> &'static str {
    match link {
        Link::NvLink => "NVLink",
        Link::PcieBar1 => "PCIe BAR1",
        Link::Pcie => "PCIe",
    }
}

/// The patch maps peer VRAM through BAR1: what to do where BAR1 cannot map all of it.
const BAR1_REMEDY: &str = "enable Above 4G decoding and Resizable BAR in the firmware so BAR1 covers VRAM";
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
