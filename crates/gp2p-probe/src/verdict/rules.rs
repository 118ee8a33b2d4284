//! The rules after `facts`, one function each, in the order of [`super::RULES`]: each looks
//! at one pair and gives its verdicts where it applies. [`chain`] walks them all: every
//! rule that applies adds its step, so a pair learns every blocker, not only the first.

use super::*;

mod on;

use on::on;

/// A rule: the verdicts it gives the pair, none where it does not apply (`patched` and
/// `iommu` can give more than one: each names one blocker).
pub(super) type Rule = fn(&Pair<'_>) -> Vec<Verdict>;

/// The rules after `facts`, in the order of [`RULES`] (`patch` is the last step).
pub(super) const CHECKS: &[(&str, Rule)] = &[
    ("on", |p| on(p).into_iter().collect()),
    ("wddm", |p| wddm(p).into_iter().collect()),
    ("mixed", |p| mixed(p).into_iter().collect()),
    ("vm", |p| virtual_machine(p).into_iter().collect()),
    ("regkey", |p| regkey(p).into_iter().collect()),
    ("card", |p| card(p).into_iter().collect()),
    ("arch", |p| arch(p).into_iter().collect()),
    ("patched", patched),
    ("module", |p| module(p).into_iter().collect()),
    ("version", |p| version(p).into_iter().collect()),
    ("bar1", |p| bar1(p).into_iter().collect()),
    ("iommu", iommu),
    ("acs", |p| acs(p).into_iter().collect()),
];

/// Every rule that applies to the pair, in the order of [`CHECKS`], each with its name: the
/// pair's chain of blockers, the first of which decides its code. Some rules end or prune
/// the walk, as [`RULES`] says:
/// - `on` ends it: P2P is on, and its verdict names what makes it safe.
/// - `card` ends it for professional and datacenter pairs (no GeForce rule is about them),
///   and explains the refusal only where no rule before it did.
/// - `patched` ends it: with the patch in effect it names every missing piece (branch,
///   BAR1, IOMMU) itself.
/// - A rule that says P2P can never work on the pair ([`never`]: `arch`, `mixed`, and
///   `wddm` on a GeForce card) makes `regkey`, `module`, `version`, `bar1`, `iommu` and
///   `acs` after it moot: no driver, firmware or kernel setting brings P2P then.
/// - Windows makes `module`, `version` and `iommu` moot (Linux's kernel module and IOMMU
///   groups; the `wddm` step already says Linux is the way).
pub(super) fn chain(p: &Pair<'_>) -> Vec<(&'static str, Verdict)> {
    let windows = p.facts.host.os.eq_ignore_ascii_case("windows");
    let mut found: Vec<(&'static str, Verdict)> = Vec::new();
    for &(name, rule) in CHECKS {
        let hopeless = found.iter().any(|(rule, v)| never(rule, v));
        let moot = match name {
            "card" if !p.geforce() => {
                if found.is_empty() {
                    found.extend(rule(p).into_iter().map(|v| (name, v)));
                }
                break;
            }
            "module" | "version" | "iommu" => windows || hopeless,
            "regkey" | "bar1" | "acs" => hopeless,
            _ => false,
        };
        if moot {
            continue;
        }
        let given = rule(p);
        let ends = !given.is_empty() && matches!(name, "on" | "patched");
        found.extend(given.into_iter().map(|v| (name, v)));
        if ends {
            break;
        }
    }
    found
}

/// Whether `rule`'s verdict `v` says P2P can never work on the pair, whatever else changes:
/// `arch` (no branch drives the cards) and `mixed` (CUDA refuses mixed pairs) always;
/// `wddm` where its remedy is none (a GeForce card cannot leave WDDM; other cards can
/// switch to TCC or MCDM).
fn never(rule: &str, v: &Verdict) -> bool {
    match rule {
        "arch" | "mixed" => true,
        "wddm" => v.remedy.starts_with("none"),
        _ => false,
    }
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
            p.geforce_outlook(PatchOutlook::Cannot(
                "CUDA refuses P2P between generations even on a patched driver".into(),
            )),
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
        p.geforce_outlook(PatchOutlook::Cannot(
            "inside a VM the patch cannot map the peer's BAR1; the hypervisor decides".into(),
        )),
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
            p.geforce_outlook(PatchOutlook::AfterChange("remove the ForceP2P registry key".into())),
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
    let acs = p.acs_cause(
        "check ACS redirect on the PCIe switches and root ports (as root: `sudo lspci -vvv | grep ACSCtl`; ReqRedir+ or CmpltRedir+ send P2P up to the root complex) and disable ACS in the firmware",
    );
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
                "put both cards under one PCIe switch or one CPU's root complex (topology PIX, PXB or PHB): this chipset or path does not carry P2P{}",
                acs.map_or(String::new(), |a| format!("; {a}"))
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
            format!(
                "{}check MIG mode (`nvidia-smi -q | grep -i mig`) and that both cards are the same chip",
                acs.map_or(String::new(), |a| format!("{a}; "))
            ),
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

/// Rule `module`: the kernel module: unknown, or the proprietary one. Where its version has
/// no patch branch for the cards, `version` adds that step.
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
    let arch = p.a.arch();
    let branch = branch_for_version(&module.version).filter(|b| b.architectures.contains(&arch));
    (module.flavour == ModuleFlavour::Proprietary).then(|| {
        let (remedy, change) = match branch {
            Some(b) => (
                format!(
                    "switch to NVIDIA's open kernel module at the version you run, {}, which the {} branch patches (PATCH.md)",
                    module.version, b.name
                ),
                format!("switch to the open kernel module at {}", module.version),
            ),
            None => (
                format!(
                    "switch to NVIDIA's open kernel module (PATCH.md), at a version with a patch branch for {} cards",
                    arch.name()
                ),
                "switch to the open kernel module".to_owned(),
            ),
        };
        p.off(
            "PROP",
            Certainty::Shown,
            format!("the driver refuses P2P{status}, and runs the proprietary kernel module {}", module.version),
            remedy,
            PatchOutlook::AfterChange(change),
            &["cuDeviceCanAccessPeer", "kernel module"],
        )
    })
}

/// Rule `version`: a module version no patch branch for the cards exists for (open, or the
/// proprietary one `module` switches from). A version newer than the whole branch table is
/// different: a branch may have been published since the table was checked, so the verdict
/// says where the table ends and where to look, and only that it is possible.
fn version(p: &Pair<'_>) -> Option<Verdict> {
    let module = p.module()?;
    let (arch, version) = (p.a.arch(), module.version.as_str());
    let flavour = match module.flavour {
        ModuleFlavour::Open => "open module",
        ModuleFlavour::Proprietary => "driver",
    };
    let past = branch_for_version(version).is_none() && past_table(version);
    let missing = match branch_for_version(version) {
        None if past => format!(
            "{flavour} {version} is newer than every patch branch this probe knows: its table ends at {} (checked on {TABLE_CHECKED}), so a branch for {version} may exist",
            newest_version()
        ),
        None => format!("no patch branch exists for {flavour} {version}"),
        Some(b) if !b.architectures.contains(&arch) => {
            format!("the {} branch does not drive {} cards", b.name, arch.name())
        }
        Some(_) => return None,
    };
    // Where BAR1 cannot grow to hold VRAM only the per-allocation branch serves the cards:
    // its version, not every version with a branch (the patch step names it too).
    let (remedy, change) = if p.per_allocation() {
        let version = per_allocation_version();
        (
            format!(
                "install driver {version}, whose {BAR1_PER_ALLOCATION_BRANCH} branch maps BAR1 per allocation, and build the patched open module at exactly that version"
            ),
            format!("move to {version}"),
        )
    } else {
        let elsewhere = format!(
            "install a driver version whose patch branch drives {} cards ({}) and build the patched open module at exactly that version",
            arch.name(),
            p.versions()
        );
        if past {
            (
                format!(
                    "look for a {version} branch in the P2P patch's branch lists ({}) and, if there is one for {} cards, build it at exactly {version}; if there is none, {elsewhere}",
                    BRANCH_LISTS.join(", "),
                    arch.name()
                ),
                format!("a {version} branch, where one is published, or a move to one of {}", p.versions()),
            )
        } else {
            (elsewhere, format!("move to one of {}", p.versions()))
        }
    };
    Some(p.off(
        "VER",
        if past { Certainty::Possible } else { Certainty::Shown },
        format!("the driver refuses P2P{}; {missing}", p.nvml_status()),
        remedy,
        PatchOutlook::AfterChange(change),
        &["cuDeviceCanAccessPeer", "kernel module", "architecture", "patch branch table"],
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
/// answer; what else is missing is: every piece the facts show (branch, BAR1, IOMMU), each a
/// verdict, or the further causes they cannot show.
fn patched(p: &Pair<'_>) -> Vec<Verdict> {
    if !p.patch.acted_on() {
        return Vec::new();
    }
    let status = p.nvml_status();
    let in_effect =
        format!("the P2P patch is in effect ({}) but CUDA refuses this pair{status}", p.patch.certainty.name());
    let used = ["cuDeviceCanAccessPeer", "nvml p2p read/write/atomics", "kernel module"];
    let mut missing = Vec::new();
    if let Some(wrong) = p.branch_lacking_arch() {
        missing.push(p.off(
            "VER",
            Certainty::Shown,
            format!("{in_effect}: {wrong}"),
            format!("move to a branch that drives {} cards: {}", p.a.arch().name(), p.versions()),
            PatchOutlook::InEffect(format!("a branch for {} cards", p.a.arch().name())),
            &used,
        ));
    }
    if let Some(d) = p.devices().into_iter().find(|d| d.bar1_covers_vram() == Some(false)) {
        let fix = p.bar1_fix(d);
        missing.push(p.off(
            "BAR1",
            Certainty::Shown,
            format!("{in_effect}: {}", bar1_too_small(d)),
            fix.remedy,
            PatchOutlook::InEffect("a BAR1 that holds VRAM".into()),
            &["BAR1", "BAR1 sizes (resource1_resize)", "VRAM", "kernel module"],
        ));
    }
    if let Some(d) = p.devices().into_iter().find(|d| p.iommu_translates(d) == Some(true)) {
        missing.push(p.off(
            "IOMMU",
            Certainty::Shown,
            format!("{in_effect}: {}", iommu_translates(d)),
            IOMMU_REMEDY.into(),
            PatchOutlook::InEffect("the IOMMU in passthrough".into()),
            &["IOMMU group type", "/proc/cmdline", "kernel module"],
        ));
    }
    if !missing.is_empty() {
        return missing;
    }
    let mut causes = vec![
        "look for NVRM errors in the kernel log (`sudo dmesg | grep NVRM`)".to_owned(),
        "static BAR1 may be off: add RMForceStaticBar1=1 to NVreg_RegistryDwords".to_owned(),
        "a kernel upgrade since the module was built: rebuild it for the running kernel".to_owned(),
    ];
    // ACS as read from the bridges between the cards, where it was; else the check by hand.
    let by_hand =
        "ACS redirect on a switch or root port (`sudo lspci -vvv | grep ACSCtl`): disable ACS in the firmware";
    causes.splice(2..2, p.acs_cause(by_hand));
    if p.a.arch() == Architecture::Blackwell {
        causes.insert(
            1,
            "a display attached to a 5090 breaks it on some branches: move the display to another card".into(),
        );
    }
    vec![p.off(
        "PFAIL",
        Certainty::Possible,
        format!("{in_effect}, and the facts show no cause"),
        format!("known further causes: {}", causes.join("; ")),
        PatchOutlook::InEffect("something the facts do not show (see the remedy)".into()),
        &used,
    )]
}

/// Rule `acs`: ACS on a bridge between the cards redirects peer traffic up to the root
/// complex, where P2P would then go once on: slowly, or to a hang (PATCH.md).
fn acs(p: &Pair<'_>) -> Option<Verdict> {
    let (redirect, _) = p.acs_path();
    (!redirect.is_empty()).then(|| {
        p.off(
            "ACS",
            Certainty::Shown,
            format!(
                "the driver refuses P2P{}; ACS on {} between the cards redirects peer traffic up to the root complex, where P2P would then go: slowly, or to a hang",
                p.nvml_status(),
                Pair::redirecting(&redirect)
            ),
            Pair::acs_remedy(&redirect),
            PatchOutlook::AfterChange("clear ACS redirect on the bridges between the cards".into()),
            &["bridge ACS (sysfs config)", "PCI path"],
        )
    })
}

/// Rule `bar1`: BAR1 too small to map VRAM, where the patch's mappings go.
fn bar1(p: &Pair<'_>) -> Option<Verdict> {
    let d = p.devices().into_iter().find(|d| d.bar1_covers_vram() == Some(false))?;
    let fix = p.bar1_fix(d);
    // Advice from the chip table rests on one assumption, which the reason names.
    let (certainty, assumed) = match &fix.assumption {
        Some(assumption) => (Certainty::Likely, format!("; {assumption}")),
        None => (Certainty::Shown, String::new()),
    };
    Some(p.off(
        "BAR1",
        certainty,
        format!("the driver refuses P2P{}; {}{assumed}", p.nvml_status(), bar1_too_small(d)),
        fix.remedy,
        fix.outlook,
        &["BAR1", "BAR1 sizes (resource1_resize)", "VRAM"],
    ))
}

/// Rule `iommu`: a translating IOMMU, which the patch's raw BAR1 addresses bypass; and any
/// fact this rule and `bar1` could not check, as a second verdict.
fn iommu(p: &Pair<'_>) -> Vec<Verdict> {
    let mut given = Vec::new();
    if let Some(d) = p.devices().into_iter().find(|d| p.iommu_translates(d) == Some(true)) {
        given.push(p.off(
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
    if !missing.is_empty() {
        given.push(p.off(
            "?",
            Certainty::Shown,
            format!("the driver refuses P2P{}; the patch's requirements cannot all be checked", p.nvml_status()),
            format!("provide the missing facts: {}", p.provide(&lacking)),
            PatchOutlook::Undecided(missing),
            &["kernel module", "BAR1", "IOMMU group type"],
        ));
    }
    given
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
