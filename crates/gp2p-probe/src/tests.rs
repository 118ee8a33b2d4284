//! Fixtures for every verdict branch, the laws over random facts, and report round trips.

use std::path::{Path, PathBuf};

use proptest::prelude::*;

use crate::facts::*;
use crate::parse;
use crate::{Certainty, Error, PatchOutlook, Report, verdicts};

mod acs;

const GIB: u64 = 1 << 30;

/// A saved-facts file under `tests/fixtures/` (the shape `gp2p probe --json` writes).
fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

/// A fixture's facts, loaded (and checked) as `gp2p probe --from` loads them.
fn load_fixture(name: &str) -> Facts {
    crate::load(&fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Two RTX 4090s on a stock open-module driver that refuses P2P (NVML: CNS), with
/// everything the patch needs in place: the "PATCH" case, which other fixtures bend.
fn two_4090s() -> Facts {
    let card = |ordinal: usize| DeviceFacts {
        ordinal,
        name: "NVIDIA GeForce RTX 4090".into(),
        uuid: Some(format!("GPU-{ordinal}")),
        pci_bus_id: format!("0000:0{}:00.0", ordinal + 1),
        compute_capability: (8, 9),
        vram_bytes: 24 * GIB - 512 * (1 << 20),
        bar1_bytes: Some(32 * GIB),
        bar1_sizes: Some((6..=15).map(|bit| (1 << 20) << bit).collect()),
        pcie: Some(PcieLink { current_gen: 4, current_width: 16, max_gen: 4, max_width: 16 }),
        brand: Some("GeForceRTX".into()),
        architecture: Some("Ada".into()),
        driver_model: None,
        iommu_group_type: Some("identity".into()),
        ..DeviceFacts::default()
    };
    let pair = |a, b| PairFacts {
        a,
        b,
        can_access_peer: Some(false),
        native_atomics: Some(false),
        performance_rank: Some(0),
        nvml_read: Some(P2pStatus::ChipsetNotSupported),
        nvml_write: Some(P2pStatus::ChipsetNotSupported),
        nvml_nvlink: Some(P2pStatus::NotSupported),
        nvml_atomics: Some(P2pStatus::NotSupported),
        topology: Some("PHB".into()),
    };
    let version = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  565.57.01  Release Build  (dvs-builder@U16-I3-B03-4-3)  Tue Oct  1 01:26:03 UTC 2024";
    Facts {
        host: HostFacts {
            os: "linux".into(),
            cuda_driver: Some((12, 7)),
            driver_version: Some("565.57.01".into()),
            kernel_module: parse::kernel_module(version),
            iommu_cmdline: Some(parse::iommu_cmdline("BOOT_IMAGE=/vmlinuz ro quiet amd_iommu=on iommu=pt")),
            registry_dwords: None,
            virtual_machine: None,
        },
        devices: vec![card(0), card(1)],
        pairs: vec![pair(0, 1), pair(1, 0)],
        ..Facts::default()
    }
}

fn codes(facts: &Facts) -> Vec<String> {
    verdicts(facts).into_iter().map(|v| v.code).collect()
}

fn first(facts: &Facts) -> crate::Verdict {
    verdicts(facts).remove(0)
}

#[test]
fn patch_would_turn_it_on_when_everything_is_in_place() {
    let v = first(&two_4090s());
    assert_eq!(v.code, "PATCH");
    assert_eq!(v.patch, PatchOutlook::Would);
    assert!(v.reason.contains("read CNS, write CNS"), "{}", v.reason);
    assert!(v.remedy.contains("565.57.01"));
}

#[test]
fn on_and_forced_over_a_translating_iommu_or_a_small_bar1_is_unsafe() {
    // The patch in effect, IOMMU translating (amd_iommu=on without pt).
    let f = load_fixture("4090-pair-patched-iommu-translated.json");
    for v in verdicts(&f) {
        assert_eq!((v.code.as_str(), v.on, v.certainty), ("UNSAFE", Some(crate::Link::PcieBar1), Certainty::Shown));
        assert_eq!(v.hazards.len(), 2, "{:?}", v.hazards);
        for d in [v.a, v.b] {
            let says = format!("the IOMMU translates device {d}'s DMA (DMA-FQ)");
            assert!(v.hazards.iter().any(|h| h.contains(&says)), "{:?}", v.hazards);
        }
        assert!(v.remedy.starts_with("set the IOMMU to passthrough (iommu=pt"), "{}", v.remedy);
        assert!(v.remedy.contains("copies this pair staged"), "{}", v.remedy);
        assert!(!v.peer_trusted());
        assert!(v.peer_distrust().is_some_and(|why| why.contains("[UNSAFE]")));
        assert_eq!(v.patch, PatchOutlook::InEffect("the IOMMU in passthrough".into()));
    }
    let text = Report::new(f).render();
    assert!(text.contains("[UNSAFE, shown]") && text.contains("    UNSAFE: the IOMMU translates"), "{text}");
    // A 48 GB 4090 D with its 32 GiB BAR1, forced on by the patch.
    let f = load_fixture("4090d-48g-pair-patched.json");
    let v = first(&f);
    assert_eq!(v.code, "UNSAFE");
    assert!(v.hazards.iter().all(|h| h.contains("BAR1 (32.0 GiB) cannot map its VRAM (48.0 GiB)")), "{:?}", v.hazards);
}

#[test]
fn forced_by_a_key_counts_and_the_driver_s_own_p2p_does_not() {
    let mut f = two_4090s();
    f.pairs.iter_mut().for_each(|p| p.can_access_peer = Some(true));
    f.devices[1].bar1_bytes = Some(256 << 20);
    f.devices[0].iommu_group_type = Some("DMA-FQ".into());
    // The driver's own yes (NVML's CNS shows no override): OK, trusted.
    assert_eq!(codes(&f), ["OK", "OK"]);
    assert!(first(&f).peer_trusted() && first(&f).hazards.is_empty());
    // ForceP2P=0x11 forces read and write on past the same checks: unsafe.
    f.host.registry_dwords = parse::registry("RegistryDwords: \"ForceP2P=0x11\"\n");
    let v = first(&f);
    assert_eq!((v.code.as_str(), v.hazards.len()), ("UNSAFE", 2), "{v:?}");
    assert!(v.reason.contains("ForceP2P=0x11"), "{}", v.reason);
    assert!(v.remedy.starts_with("remove ForceP2P from NVreg_RegistryDwords"), "{}", v.remedy);
    assert_eq!(v.patch, PatchOutlook::NotNeeded, "the key, not the patch, forces it");
    // Forcing reads only (0x21) forces nothing the copy engine uses.
    f.host.registry_dwords = parse::registry("RegistryDwords: \"ForceP2P=0x21\"\n");
    assert_eq!(first(&f).code, "OK");
    // NVLink does not go through BAR1: forced or not, nothing to check.
    f.host.registry_dwords = parse::registry("RegistryDwords: \"ForceP2P=0x11\"\n");
    f.pairs.iter_mut().for_each(|p| p.nvml_nvlink = Some(P2pStatus::Ok));
    assert_eq!((first(&f).code.as_str(), first(&f).on), ("OK", Some(crate::Link::NvLink)));
}

#[test]
fn forced_with_requirements_unknown_is_not_trusted() {
    let mut f = load_fixture("4090-pair-patched-565.json");
    assert!(first(&f).peer_trusted(), "BAR1 32 GiB, IOMMU identity: {:?}", first(&f));
    f.devices[1].iommu_group_type = None;
    f.devices[0].bar1_bytes = None;
    // iommu=pt on the command line still tells: passthrough does not translate.
    assert_eq!(first(&f).unchecked, ["BAR1 of device 0 (NVML gave none)"]);
    f.host.iommu_cmdline = None;
    let v = first(&f);
    assert_eq!((v.code.as_str(), v.certainty), ("OK?", Certainty::Possible));
    assert_eq!(v.unchecked.len(), 2);
    assert!(v.unchecked[0].starts_with("BAR1 of device 0") && v.unchecked[1].starts_with("IOMMU state of device 1"));
    assert!(v.on.is_some() && !v.peer_trusted() && v.hazards.is_empty());
}

#[test]
fn verdicts_if_on_judge_pairs_collected_without_cuda() {
    // What the facade's engine gets at start-up: no CUDA answers, NVML's statuses.
    let mut f = load_fixture("4090-pair-patched-iommu-translated.json");
    f.pairs.iter_mut().for_each(|p| p.can_access_peer = None);
    assert_eq!(codes(&f), ["?", "?"]);
    let if_on = crate::verdicts_if_on(&f);
    assert!(if_on.iter().all(|v| v.code == "UNSAFE" && v.peer_distrust().is_some()));
    // The H100 pair on NixOS's stock module: nothing forced, so nothing to keep Auto off.
    assert!(
        crate::verdicts_if_on(&load_fixture("h100-pair-nixos-stock-iommu-translated.json"))
            .iter()
            .all(|v| v.peer_trusted())
    );
}

#[test]
fn a_module_built_outside_nvidia_is_not_taken_for_the_patch() {
    // NixOS (nixbld@) and Ubuntu (buildd@) build NVIDIA's stock sources; the driver's own
    // P2P on datacenter and professional cards copes with a translating IOMMU and a small
    // BAR1, so neither is a hazard there and nothing is forced.
    for name in ["h100-pair-nixos-stock-iommu-translated.json", "a6000-pair-ubuntu-stock-small-bar1.json"] {
        let f = load_fixture(name);
        let state = crate::patch_state(&f);
        assert!(!state.acted_on(), "{name}: {state:?}");
        for v in verdicts(&f) {
            assert_eq!(
                (v.code.as_str(), v.on, v.certainty),
                ("OK", Some(crate::Link::Pcie), Certainty::Shown),
                "{name}"
            );
            assert!(v.warnings.is_empty(), "{name}: {:?}", v.warnings);
            assert!(v.reason.contains("the driver's own decision"), "{name}: {}", v.reason);
        }
        let text = Report::new(f).render();
        assert!(!text.contains("self-built") && !text.contains("WARNING"), "{name}: {text}");
    }
    // A version a patch branch exists for, built outside NVIDIA, is at most "possible".
    let state = crate::patch_state(&load_fixture("h100-pair-nixos-stock-iommu-translated.json"));
    assert_eq!((state.in_effect, state.certainty), (Some(true), Certainty::Possible));
    assert!(state.describe().starts_with("possibly in effect, not relied on"), "{}", state.describe());
    // The H200 this project measures on: NixOS's stock 580.159.04, one device.
    let h200 =
        crate::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../../benches/results/h200/probe.json")).unwrap();
    let text = Report::new(h200).render();
    assert!(text.contains("580.159.04 open kernel module, built by nixbld@"), "{text}");
    assert!(text.contains("P2P patch: no sign of it"), "{text}");
}

#[test]
fn the_patch_is_inferred_from_what_only_it_produces() {
    // NVML atomics DR with no ForceP2P key: the patch's built-in default.
    let f = load_fixture("4090-pair-patched-565.json");
    let state = crate::patch_state(&f);
    assert_eq!((state.in_effect, state.certainty), (Some(true), Certainty::Shown));
    assert!(state.because.contains("atomics 0 -> 1 disabled by a registry key"), "{}", state.because);
    let v = first(&f);
    assert_eq!((v.code.as_str(), v.on), ("OK", Some(crate::Link::PcieBar1)));
    assert!(v.reason.contains("the P2P patch forces it on"), "{}", v.reason);
    assert_eq!(v.patch, PatchOutlook::InEffect(String::new()), "on because of the patch, nothing missing");
    // Without the atomics status, NVML's OK between GeForce cards over PCIe shows it too.
    let mut f = load_fixture("4090-pair-patched-565.json");
    f.pairs.iter_mut().for_each(|p| p.nvml_atomics = None);
    let state = crate::patch_state(&f);
    assert_eq!((state.in_effect, state.certainty), (Some(true), Certainty::Shown));
    assert!(state.because.contains("GeForce Ada cards 0 and 1 over PCIe"), "{}", state.because);
    // Without NVML at all, CUDA's yes between two Ada cards (no NVLink) makes it likely.
    for p in &mut f.pairs {
        (p.nvml_read, p.nvml_write, p.nvml_nvlink) = (None, None, None);
    }
    let state = crate::patch_state(&f);
    assert_eq!((state.in_effect, state.certainty), (Some(true), Certainty::Likely));
    // A ForceP2P key that disables atomics explains the DR: the key forces, not the patch.
    let mut f = load_fixture("4090-pair-patched-565.json");
    f.host.kernel_module = two_4090s().host.kernel_module;
    f.host.registry_dwords = Some("ForceP2P=0x11".into());
    assert_eq!(crate::patch_state(&f).in_effect, Some(false));
    assert!(first(&f).reason.contains("ForceP2P=0x11 in the module's RegistryDwords forces it on"));
    // NVML refusing any pair (CNS) shows the patch is not in effect, whoever built the module.
    let mut f = two_4090s();
    f.host.kernel_module = load_fixture("4090-pair-patched-565.json").host.kernel_module;
    let state = crate::patch_state(&f);
    assert_eq!((state.in_effect, state.certainty), (Some(false), Certainty::Shown));
    assert!(state.because.contains("NVML reports CNS"), "{}", state.because);
    // The proprietary module cannot carry it.
    f.host.kernel_module =
        parse::kernel_module("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.14  Thu Feb 22 01:44:30 UTC 2024");
    assert_eq!(crate::patch_state(&f).in_effect, Some(false));
}

#[test]
fn nvlink_is_named_when_nvml_says_so() {
    let mut f = two_4090s();
    f.pairs.iter_mut().for_each(|p| {
        p.can_access_peer = Some(true);
        p.nvml_nvlink = Some(P2pStatus::Ok);
    });
    assert_eq!(first(&f).on, Some(crate::Link::NvLink));
}

#[test]
fn wddm_cannot() {
    let mut f = two_4090s();
    f.host.os = "windows".into();
    f.devices[0].driver_model = Some("WDDM".into());
    let v = first(&f);
    assert_eq!(v.code, "WDDM");
    assert!(matches!(v.patch, PatchOutlook::Cannot(_)));
}

#[test]
fn professional_and_datacenter_cards_never_get_geforce_patch_advice() {
    // RTX 6000 Ada pair across two sockets on the proprietary module: not "switch to the
    // open module for the patch", but the topology.
    let f = load_fixture("rtx6000ada-pair-proprietary-across-sockets.json");
    for v in verdicts(&f) {
        assert_eq!(v.code, "TOPO");
        assert!(matches!(v.patch, PatchOutlook::NotApplicable(_)), "{:?}", v.patch);
        assert!(v.remedy.contains("one PCIe switch") && v.remedy.contains("ACSCtl"), "{}", v.remedy);
        assert!(!v.remedy.contains("patch") && !v.remedy.contains("open kernel module"), "{}", v.remedy);
    }
    let text = Report::new(f).render();
    assert!(!text.contains("    patch:"), "no patch clause for these cards: {text}");
    // A100 pair with ForceP2P=0: remove the key, and nothing about the patch.
    let f = load_fixture("a100-pair-forcep2p-disabled.json");
    let v = first(&f);
    assert_eq!(v.code, "DR");
    assert_eq!(v.remedy, "remove ForceP2P from NVreg_RegistryDwords (modprobe options) and reload the module");
    assert!(matches!(v.patch, PatchOutlook::NotApplicable(_)), "{:?}", v.patch);
    assert!(!Report::new(f).render().contains("    patch:"));
    // The GeForce pair with the same key keeps its patch clause.
    let mut f = two_4090s();
    f.host.registry_dwords = Some("ForceP2P=0".into());
    assert!(matches!(first(&f).patch, PatchOutlook::AfterChange(_)));
    // A datacenter pair the driver refuses for the GPU's own reason, and one NVML cannot explain.
    let mut f = load_fixture("a100-pair-forcep2p-disabled.json");
    f.host.registry_dwords = None;
    for p in &mut f.pairs {
        (p.nvml_read, p.nvml_write, p.nvml_atomics) =
            (Some(P2pStatus::GpuNotSupported), Some(P2pStatus::GpuNotSupported), Some(P2pStatus::NotSupported));
    }
    let v = first(&f);
    assert_eq!(v.code, "DRV");
    assert!(v.remedy.contains("virtual function") && v.remedy.contains("MIG"), "{}", v.remedy);
    // Without NVML (libnvidia-ml absent) the brand comes from the name, and the reason
    // says NVML's answer is missing rather than inventing one.
    f.host.driver_version = None;
    for d in &mut f.devices {
        (d.brand, d.architecture, d.bar1_bytes, d.pcie) = (None, None, None, None);
    }
    for p in &mut f.pairs {
        (p.nvml_read, p.nvml_write, p.nvml_atomics, p.nvml_nvlink) = (None, None, None, None);
    }
    let v = first(&f);
    assert_eq!(v.code, "DRV");
    assert!(v.reason.contains("libnvidia-ml could not be loaded"), "{}", v.reason);
}

#[test]
fn tcc_is_suggested_only_for_cards_that_support_it() {
    let v = first(&load_fixture("windows-4090-pair-wddm.json"));
    assert_eq!(v.code, "WDDM");
    assert!(!v.remedy.contains("switch") && v.remedy.contains("cannot leave WDDM"), "{}", v.remedy);
    let v = first(&load_fixture("windows-a6000-pair-wddm.json"));
    assert_eq!(v.code, "WDDM");
    assert!(v.remedy.starts_with("switch device 0 (professional card) to the TCC or MCDM"), "{}", v.remedy);
    assert!(matches!(v.patch, PatchOutlook::NotApplicable(_)));
    // GeForce under Windows without NVML (driver model unknown) is WDDM all the same.
    let mut f = load_fixture("windows-4090-pair-wddm.json");
    for d in &mut f.devices {
        (d.driver_model, d.brand) = (None, None);
    }
    let v = first(&f);
    assert_eq!((v.code.as_str(), v.certainty), ("WDDM", Certainty::Likely));
    assert!(v.reason.contains("is a GeForce card, so it runs under"), "{}", v.reason);
}

#[test]
fn a_5090_is_only_sent_to_branches_that_drive_it() {
    // Stock 570.86.16: its branch exists but drives Ampere and Ada only.
    let f = load_fixture("5090-pair-stock-570.json");
    let v = first(&f);
    assert_eq!(v.code, "VER");
    assert!(v.reason.contains("the 570.86.16-p2p branch does not drive Blackwell cards"), "{}", v.reason);
    let PatchOutlook::AfterChange(change) = &v.patch else { panic!("{:?}", v.patch) };
    assert!(change.starts_with("move to one of 615.71.09") && !change.contains("570.") && !change.contains("565."));
    assert!(change.contains(", the newest 6 of the 15 from 575.51.02 on that PATCH.md lists"), "{change}");
    // The proprietary module: the switch names Blackwell branches only.
    let mut f = load_fixture("5090-pair-stock-570.json");
    f.host.kernel_module =
        parse::kernel_module("NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.86.16  Thu Jan 23 23:01:05 UTC 2025");
    let v = first(&f);
    assert_eq!(v.code, "PROP");
    assert!(v.remedy.contains("Blackwell cards") && !v.remedy.contains("565.77"), "{}", v.remedy);
    // The 570.86.16-p2p branch installed anyway: CUDA says yes, mapping fails; UNSAFE.
    let f = load_fixture("5090-pair-patched-570-branch.json");
    let v = first(&f);
    assert_eq!(v.code, "UNSAFE");
    assert!(
        v.hazards[0].contains("does not drive Blackwell")
            && v.remedy.starts_with("move to a branch that drives Blackwell cards: 615.71.09")
    );
    // And where CUDA refuses on that branch: told the branch is wrong, not to install the patch.
    let mut f = load_fixture("5090-pair-patched-570-branch.json");
    f.pairs.iter_mut().for_each(|p| p.can_access_peer = Some(false));
    let v = first(&f);
    assert_eq!(v.code, "VER");
    assert!(matches!(&v.patch, PatchOutlook::InEffect(m) if m.contains("Blackwell")), "{:?}", v.patch);
    // A 4090 pair on 570.86.16 is fine: that branch drives Ada.
    let mut f = load_fixture("5090-pair-stock-570.json");
    for d in &mut f.devices {
        (d.name, d.architecture, d.compute_capability) = ("NVIDIA GeForce RTX 4090".into(), Some("Ada".into()), (8, 9));
    }
    assert_eq!(first(&f).code, "PATCH");
    assert!(first(&f).remedy.contains("branch 570.86.16-p2p of aikitoria/open-gpu-kernel-modules"));
    // Turing: no branch at all.
    let mut f = two_4090s();
    for d in &mut f.devices {
        (d.name, d.architecture, d.compute_capability) =
            ("NVIDIA GeForce RTX 2080 Ti".into(), Some("Turing".into()), (7, 5));
    }
    let v = first(&f);
    assert_eq!(v.code, "ARCH");
    assert!(v.reason.contains("branches exist for Ampere, Ada and Blackwell"), "{}", v.reason);
}

#[test]
fn an_already_patched_module_is_told_what_else_is_missing() {
    let f = load_fixture("4090-pair-patched-cuda-refuses.json");
    for v in verdicts(&f) {
        assert_eq!((v.code.as_str(), v.certainty), ("PFAIL", Certainty::Possible));
        assert!(!v.remedy.contains("install the P2P patch"), "{}", v.remedy);
        assert!(v.remedy.contains("RMForceStaticBar1=1") && v.remedy.contains("dmesg"), "{}", v.remedy);
        assert!(!v.remedy.contains("display"), "the 5090 display note is for Blackwell: {}", v.remedy);
        assert!(matches!(v.patch, PatchOutlook::InEffect(_)), "{:?}", v.patch);
    }
    // With a small BAR1 the missing piece is named.
    let mut f = load_fixture("4090-pair-patched-cuda-refuses.json");
    f.devices[1].bar1_bytes = Some(256 << 20);
    let v = first(&f);
    assert_eq!(v.code, "BAR1");
    assert!(v.reason.starts_with("the P2P patch is in effect (shown) but CUDA refuses"), "{}", v.reason);
    assert!(v.remedy.contains("offers a BAR1 of up to 32.0 GiB"), "{}", v.remedy);
    // A module that only may be patched (no NVML to tell) gets the install advice, with a warning.
    let mut f = load_fixture("4090-pair-patched-cuda-refuses.json");
    for p in &mut f.pairs {
        (p.nvml_read, p.nvml_write, p.nvml_atomics, p.nvml_nvlink) = (None, None, None, None);
    }
    let v = first(&f);
    assert_eq!(v.code, "PATCH");
    assert!(v.warnings.iter().any(|w| w.contains("may already carry the patch")), "{:?}", v.warnings);
}

#[test]
fn missing_sources_name_themselves() {
    // No libnvidia-ml: the verdict says so and what it would have told; root is no remedy.
    let f = load_fixture("4090-pair-without-nvml.json");
    assert!(!f.nvml_answered());
    let v = first(&f);
    assert_eq!(v.code, "?");
    assert!(v.reason.contains("NVML's reason is unknown: libnvidia-ml could not be loaded"), "{}", v.reason);
    assert!(v.remedy.contains("libnvidia-ml.so.1") && !v.remedy.contains("root"), "{}", v.remedy);
    let PatchOutlook::Undecided(missing) = &v.patch else { panic!("{:?}", v.patch) };
    assert!(missing.iter().all(|m| m.contains("NVML, which could not be loaded")), "{missing:?}");
    let text = Report::new(f).render();
    assert!(text.contains("NVML: not loaded (libnvidia-ml)") && text.contains("it would have told"), "{text}");
    assert!(text.contains("NVML not loaded") && !text.contains("as root"), "{text}");
    // A file root could have read is the one place root is suggested.
    let mut f = load_fixture("4090-pair-without-nvml.json");
    f.missing_sources.push(
        "/sys/bus/pci/devices/0000:01:00.0/resource1_resize: permission denied (run the probe as root to read it)"
            .into(),
    );
    assert!(Report::new(f).render().contains("as root to read it"));
    // NVML's atomics status is shown where it is known.
    let f = load_fixture("4090-pair-patched-cuda-refuses.json");
    assert!(first(&f).reason.contains("(NVML: read OK, write OK, atomics DR)"), "{}", first(&f).reason);
    let text = Report::new(f).render();
    assert!(
        text.contains("driver: CUDA peer access no; NVML read OK, write OK, atomics DR, nvlink NS; topology SYS"),
        "{text}"
    );
}

#[test]
fn mixed_generations_cannot() {
    let mut f = two_4090s();
    f.devices[1].name = "NVIDIA GeForce RTX 5090".into();
    f.devices[1].architecture = Some("Blackwell".into());
    f.devices[1].compute_capability = (12, 0);
    assert_eq!(codes(&f), ["MIX", "MIX"]);
    // One generation, different chips (A100 GA100 and A6000 GA102): refused alike.
    let mut f = two_4090s();
    (f.devices[0].name, f.devices[0].architecture, f.devices[0].compute_capability) =
        ("NVIDIA A100-PCIE-40GB".into(), Some("Ampere".into()), (8, 0));
    (f.devices[1].name, f.devices[1].architecture, f.devices[1].compute_capability) =
        ("NVIDIA RTX A6000".into(), Some("Ampere".into()), (8, 6));
    assert_eq!(codes(&f), ["MIX", "MIX"]);
}

#[test]
fn virtual_machines_cannot() {
    let mut f = two_4090s();
    f.host.virtual_machine = Some("Standard PC (Q35 + ICH9, 2009)".into());
    let v = first(&f);
    assert_eq!(v.code, "VM");
    assert!(matches!(v.patch, PatchOutlook::Cannot(_)));
}

#[test]
fn a_registry_key_that_disables_it() {
    let mut f = two_4090s();
    f.host.registry_dwords = parse::registry("RegistryDwords: \"ForceP2P=0\"\n");
    let v = first(&f);
    assert_eq!(v.code, "DR");
    assert!(matches!(v.patch, PatchOutlook::AfterChange(_)));
    // NVML saying DR is enough even without the params file.
    let mut f = two_4090s();
    f.pairs[0].nvml_read = Some(P2pStatus::DisabledByRegkey);
    assert_eq!(first(&f).code, "DR");
}

#[test]
fn the_proprietary_module_needs_a_switch() {
    let mut f = two_4090s();
    f.host.kernel_module =
        parse::kernel_module("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.14  Thu Feb 22 01:44:30 UTC 2024");
    let v = first(&f);
    assert_eq!(v.code, "PROP");
    assert!(matches!(&v.patch, PatchOutlook::AfterChange(c) if c.contains("open kernel module")));
}

#[test]
fn an_open_module_without_a_patch_branch_needs_a_version_change() {
    let mut f = two_4090s();
    f.host.kernel_module = parse::kernel_module(
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (dvs-builder@U22)  2026",
    );
    assert_eq!(first(&f).code, "VER");
}

#[test]
fn a_610_open_module_on_two_4090s_gets_its_published_branch() {
    // Issue #50: NVIDIA's 610.43.02 open module was told no branch exists and to downgrade.
    let f = load_fixture("4090-pair-stock-610.43.02.json");
    for v in verdicts(&f) {
        assert_eq!((v.code.as_str(), v.certainty, &v.patch), ("PATCH", Certainty::Likely, &PatchOutlook::Would));
        assert_eq!(
            v.remedy,
            "install the P2P patch, branch 610.43.02-p2p of aikitoria/open-gpu-kernel-modules, for open module 610.43.02 (PATCH.md), then check with `gp2p probe` and `gp2p bench copy --route peer`"
        );
        assert!(v.warnings.is_empty(), "seen in the repository itself: {:?}", v.warnings);
    }
    // A branch known only from third parties is named with a caution.
    let mut f = f;
    let stock_615 =
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  615.71.09  Release Build  (dvs-builder@U22)  2026";
    f.host.kernel_module = parse::kernel_module(stock_615);
    let v = first(&f);
    assert!(v.remedy.contains("branch 615.71.09-p2p of aikitoria/open-gpu-kernel-modules"), "{}", v.remedy);
    assert_eq!(
        v.warnings,
        [
            "branch 615.71.09-p2p is known from third-party notes, not seen in aikitoria/open-gpu-kernel-modules itself (branch table checked on 2026-12-06): make sure it is listed at https://github.com/aikitoria/open-gpu-kernel-modules/tree/615.71.09-p2p before building"
        ]
    );
}

#[test]
fn a_driver_past_the_table_is_not_known_never_branchless() {
    let f = load_fixture("4090-pair-stock-625-past-table.json");
    let v = first(&f);
    assert_eq!((v.code.as_str(), v.certainty), ("VER", Certainty::Possible));
    assert_eq!(
        v.reason,
        "the driver refuses P2P (NVML: read CNS, write CNS, atomics NS); open module 625.20.03 is newer than every patch branch this probe knows: its table ends at 615.71.09 (checked on 2026-12-06), so a branch for 625.20.03 may exist"
    );
    assert!(!v.reason.contains("no patch branch exists"), "{}", v.reason);
    assert!(
        v.steps[0].remedy.starts_with(
            "look for a 625.20.03 branch in the P2P patch's branch lists (https://github.com/aikitoria/open-gpu-kernel-modules/branches/all, https://github.com/tinygrad/open-gpu-kernel-modules/branches/all) and, if there is one for Ada cards, build it at exactly 625.20.03; if there is none, install a driver version whose patch branch drives Ada cards (615.71.09, "
        ),
        "{}",
        v.steps[0].remedy
    );
    assert_eq!(step_codes(&v), ["VER", "PATCH"]);
    assert!(
        matches!(&v.patch, PatchOutlook::AfterChange(c) if c.starts_with("a 625.20.03 branch, where one is published, or a move to one of 615.71.09"))
    );
    let text = Report::new(f.clone()).render();
    assert!(text.contains("0 -> 1 [VER, possible] "), "{text}");
    // Built by someone other than NVIDIA past the table: a patched module is possible, and
    // never acted on.
    // (NVML's CNS would show it is not in effect, so without NVML.)
    let mut f = f;
    if let Some(m) = f.host.kernel_module.as_mut() {
        m.builder = Some("root@rig".into());
    }
    f.pairs.iter_mut().for_each(|p| (p.nvml_read, p.nvml_write, p.nvml_atomics) = (None, None, None));
    let state = crate::patch_state(&f);
    assert_eq!((state.in_effect, state.certainty), (Some(true), Certainty::Possible));
    assert!(
        state.because.contains(
            "newer than every patch branch this probe knows (its table ends at 615.71.09, checked on 2026-12-06)"
        ),
        "{}",
        state.because
    );
    // Inside the table's range, a version with no branch keeps the plain wording.
    let mut f = load_fixture("4090-pair-stock-625-past-table.json");
    f.host.kernel_module = parse::kernel_module(
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (dvs-builder@U22)  2026",
    );
    let v = first(&f);
    assert_eq!((v.code.as_str(), v.certainty), ("VER", Certainty::Shown));
    assert!(v.reason.ends_with("no patch branch exists for open module 580.159.04"), "{}", v.reason);
}

#[test]
fn small_bar1_needs_resizable_bar() {
    let mut f = two_4090s();
    f.devices[1].bar1_bytes = Some(256 << 20);
    let v = first(&f);
    assert_eq!(v.code, "BAR1");
    assert!(matches!(&v.patch, PatchOutlook::AfterChange(c) if c.contains("Resizable BAR")), "{:?}", v.patch);
    // A 48 GiB card with a 32 GiB BAR1 (the 4090D mod) too.
    let mut f = two_4090s();
    f.devices[0].vram_bytes = 48 * GIB;
    assert_eq!(first(&f).code, "BAR1");
}

#[test]
fn resizable_bar_is_advised_only_where_the_card_offers_a_large_enough_bar1() {
    // 48 GB 4090s: BAR1 tops out at 32 GiB, so the 48g branch, not Resizable BAR.
    let v = first(&load_fixture("4090-48g-pair-stock.json"));
    assert_eq!(v.code, "BAR1");
    assert!(!v.remedy.contains("enable Above 4G decoding"), "{}", v.remedy);
    assert!(v.remedy.contains("cannot grow past 32.0 GiB") && v.remedy.contains(crate::BAR1_PER_ALLOCATION_BRANCH));
    assert!(matches!(&v.patch, PatchOutlook::AfterChange(c) if c.contains("590.48.01-p2p-48g")), "{:?}", v.patch);
    // The same cards forced on by the patch: UNSAFE, with the same remedy.
    let v = first(&load_fixture("4090d-48g-pair-patched.json"));
    assert_eq!(v.code, "UNSAFE");
    assert!(
        v.remedy.contains(crate::BAR1_PER_ALLOCATION_BRANCH) && !v.remedy.contains("Resizable BAR"),
        "{}",
        v.remedy
    );
    // 5090s with Resizable BAR off: they offer 32 GiB, enough for 32607 MiB.
    let v = first(&load_fixture("5090-pair-rebar-off.json"));
    assert_eq!(v.code, "BAR1");
    assert!(v.remedy.starts_with("enable Above 4G decoding and Resizable BAR") && v.remedy.contains("up to 32.0 GiB"));
    // 3090s whose VBIOS predates Resizable BAR: no sizes offered at all, no 48g branch (Ampere).
    let v = first(&load_fixture("3090-pair-pre-rebar-vbios.json"));
    assert_eq!(v.code, "BAR1");
    assert!(v.remedy.contains("offers no resizable BAR1") && v.remedy.contains("VBIOS update"), "{}", v.remedy);
    assert!(!v.remedy.contains("enable Above 4G") && !v.remedy.contains("p2p-48g"), "{}", v.remedy);
    // Sizes not read: the chip table says what 5090s offer, and the verdict names that
    // assumption (likely, not shown).
    let mut f = load_fixture("5090-pair-rebar-off.json");
    f.devices.iter_mut().for_each(|d| d.bar1_sizes = None);
    let v = first(&f);
    assert_eq!(v.certainty, Certainty::Likely);
    assert!(v.remedy.starts_with("enable Above 4G decoding and Resizable BAR"), "{}", v.remedy);
    assert!(v.remedy.contains("GB202 cards like device 0 offer a BAR1 of up to 32.0 GiB"), "{}", v.remedy);
    assert!(
        v.reason.contains("assuming device 0 offers no more than the 32.0 GiB reported for GB202 cards"),
        "{}",
        v.reason
    );
    // A card the table does not know: the advice is conditional and names the size needed.
    for d in &mut f.devices {
        d.name = "NVIDIA GeForce RTX 5080".into();
    }
    let v = first(&f);
    assert_eq!(v.certainty, Certainty::Shown);
    assert!(v.remedy.contains("if device 0 offers a BAR1 of at least 31.8 GiB"), "{}", v.remedy);
    // A card that cannot grow and has no branch for it: no remedy, and the patch cannot help.
    let mut f = load_fixture("3090-pair-pre-rebar-vbios.json");
    f.devices.iter_mut().for_each(|d| d.bar1_sizes = Some(vec![256 << 20]));
    let v = first(&f);
    assert!(v.remedy.starts_with("none: device 0's BAR1 cannot grow past 0.2 GiB"), "{}", v.remedy);
    assert!(matches!(v.patch, PatchOutlook::Cannot(_)), "{:?}", v.patch);
}

#[test]
fn a_bar1_at_its_chip_s_largest_size_is_a_limit_of_the_card_not_a_firmware_setting() {
    // 48 GB 4090 Ds on a kernel too old to list the sizes they offer: AD102 cards are
    // reported to offer 32 GiB at most, which they have. Never "enable Resizable BAR".
    let f = load_fixture("4090d-48g-pair-bar1-at-chip-max.json");
    assert!(f.devices.iter().all(|d| d.bar1_sizes.is_none()));
    for v in verdicts(&f) {
        assert_eq!((v.code.as_str(), v.certainty), ("BAR1", Certainty::Likely), "{v:?}");
        assert!(!v.remedy.contains("Resizable BAR") && !v.remedy.contains("Above 4G"), "{}", v.remedy);
        assert!(v.remedy.contains("cannot grow past 32.0 GiB, the largest AD102 cards offer"), "{}", v.remedy);
        assert!(v.remedy.contains("aikitoria/open-gpu-kernel-modules#14"), "the source is cited: {}", v.remedy);
        assert!(v.reason.contains("assuming device"), "the assumption is named: {}", v.reason);
        assert!(
            matches!(&v.patch, PatchOutlook::AfterChange(c) if c.contains(crate::BAR1_PER_ALLOCATION_BRANCH)),
            "{:?}",
            v.patch
        );
    }
    // The same cards at a 256 MiB BAR1: Resizable BAR first (up to the chip's 32 GiB), then
    // the per-allocation branch; the firmware setting is not called useless.
    let mut f = load_fixture("4090d-48g-pair-bar1-at-chip-max.json");
    f.devices.iter_mut().for_each(|d| d.bar1_bytes = Some(256 << 20));
    let v = first(&f);
    assert_eq!(v.code, "BAR1");
    assert!(
        v.remedy.starts_with("enable Above 4G decoding and Resizable BAR in the firmware (up to 32.0 GiB); then "),
        "{}",
        v.remedy
    );
    assert!(v.remedy.contains(crate::BAR1_PER_ALLOCATION_BRANCH) && !v.remedy.contains("whatever the firmware sets"));
    assert!(
        matches!(&v.patch, PatchOutlook::AfterChange(c) if c.starts_with("enable Resizable BAR (up to 32.0 GiB), then move to the experimental")),
        "{:?}",
        v.patch
    );
    // A chip with no per-allocation branch (a GA102 card with 48 GB, made up): nothing covers it.
    let mut f = load_fixture("4090d-48g-pair-bar1-at-chip-max.json");
    for d in &mut f.devices {
        (d.name, d.architecture, d.compute_capability) =
            ("NVIDIA GeForce RTX 3090".into(), Some("Ampere".into()), (8, 6));
    }
    let v = first(&f);
    assert!(
        v.remedy.starts_with("none: device 0's BAR1 (32.0 GiB) cannot grow past 32.0 GiB, the largest GA102"),
        "{}",
        v.remedy
    );
    assert!(
        matches!(&v.patch, PatchOutlook::Cannot(why) if why.contains("cannot grow past 32.0 GiB")),
        "{:?}",
        v.patch
    );
    // A row that is only an assumption (AD103) decides nothing: the advice stays conditional.
    for d in &mut f.devices {
        (d.name, d.architecture, d.compute_capability) = ("NVIDIA GeForce RTX 4080".into(), Some("Ada".into()), (8, 9));
    }
    let v = first(&f);
    assert_eq!(v.certainty, Certainty::Shown);
    assert!(v.remedy.contains("if device 0 offers a BAR1 of at least 48.0 GiB"), "{}", v.remedy);
    assert!(v.remedy.contains("AD103 cards offer up to 32.0 GiB, an assumption"), "{}", v.remedy);
    assert!(!matches!(v.patch, PatchOutlook::Cannot(_)), "{:?}", v.patch);
    assert!(!v.remedy.contains(crate::BAR1_PER_ALLOCATION_BRANCH), "{}", v.remedy);
    // What the card offers, where read, wins over the table (a VBIOS offering 64 GiB).
    let mut f = load_fixture("4090d-48g-pair-bar1-at-chip-max.json");
    f.devices.iter_mut().for_each(|d| d.bar1_sizes = Some(vec![256 << 20, 32 * GIB, 64 * GIB]));
    let v = first(&f);
    assert_eq!(v.certainty, Certainty::Shown);
    assert!(v.remedy.starts_with("enable Above 4G decoding and Resizable BAR"), "{}", v.remedy);
    assert!(v.remedy.contains("device 0 offers a BAR1 of up to 64.0 GiB"), "{}", v.remedy);
}

/// A change to [`two_4090s`] (whose only blocker is the patch itself) that puts one blocker
/// in the way.
type Blocker = fn(&mut Facts);

/// Every blocker kind the rules know, as (rule, code, change), in the order of `RULES`.
/// `card` (professional cards: never GeForce advice) and `patched` (a state, whose missing
/// pieces are tested on their own) are not among them. The changes commute: applying two
/// in either order gives both blockers.
const BLOCKERS: &[(&str, &str, Blocker)] = &[
    ("wddm", "WDDM", |f| {
        f.host.os = "windows".into();
        f.devices[0].driver_model = Some("WDDM".into());
    }),
    ("mixed", "MIX", |f| {
        let d = &mut f.devices[1];
        (d.name, d.architecture, d.compute_capability) =
            ("NVIDIA GeForce RTX 5090".into(), Some("Blackwell".into()), (12, 0));
    }),
    ("vm", "VM", |f| f.host.virtual_machine = Some("KVM".into())),
    ("regkey", "DR", |f| f.host.registry_dwords = Some("ForceP2P=0".into())),
    ("arch", "ARCH", |f| {
        // Turing cards (device 1 stays whatever `mixed` made it).
        for d in f.devices.iter_mut().filter(|d| d.architecture.as_deref() == Some("Ada")) {
            (d.name, d.architecture, d.compute_capability) =
                ("NVIDIA GeForce RTX 2080 Ti".into(), Some("Turing".into()), (7, 5));
        }
    }),
    ("module", "PROP", |f| f.host.kernel_module.iter_mut().for_each(|m| m.flavour = ModuleFlavour::Proprietary)),
    ("version", "VER", |f| f.host.kernel_module.iter_mut().for_each(|m| m.version = "580.159.04".into())),
    ("bar1", "BAR1", |f| f.devices[0].bar1_bytes = Some(256 << 20)),
    ("iommu", "IOMMU", |f| f.devices[0].iommu_group_type = Some("DMA".into())),
];

/// Pairs of blockers where the first makes the second moot, as `RULES` documents: no step
/// for the second. After a rule that says P2P can never work (`wddm` on these GeForce
/// cards, `mixed`, `arch`) no setting is worth a step.
const MOOT: &[(&str, &str)] = &[
    ("wddm", "regkey"),
    ("wddm", "module"),
    ("wddm", "version"),
    ("wddm", "bar1"),
    ("wddm", "iommu"),
    ("mixed", "regkey"),
    ("mixed", "module"),
    ("mixed", "version"),
    ("mixed", "bar1"),
    ("mixed", "iommu"),
    ("arch", "module"),
    ("arch", "version"),
    ("arch", "bar1"),
    ("arch", "iommu"),
];

/// Blockers whose removal leaves the patch to do the rest (the others: it cannot).
const FIXABLE: &[&str] = &["regkey", "module", "version", "bar1", "iommu"];

fn step_codes(v: &crate::Verdict) -> Vec<&str> {
    v.steps.iter().map(|s| s.code.as_str()).collect()
}

#[test]
fn each_blocker_alone_is_one_step_then_the_patch_where_it_helps() {
    for &(rule, code, block) in BLOCKERS {
        let mut f = two_4090s();
        block(&mut f);
        let v = first(&f);
        let mut expected = vec![code];
        if FIXABLE.contains(&rule) {
            expected.push("PATCH");
        }
        assert_eq!((v.code.as_str(), step_codes(&v)), (code, expected), "{rule}: {v:?}");
        assert_eq!(v.steps[0].rule, rule);
    }
}

#[test]
fn every_two_blockers_are_both_named_in_the_documented_order() {
    let order: Vec<&str> = crate::RULES.iter().map(|r| r.split(':').next().unwrap_or(r)).collect();
    for (i, &(rule_x, code_x, block_x)) in BLOCKERS.iter().enumerate() {
        for &(rule_y, code_y, block_y) in &BLOCKERS[i + 1..] {
            assert!(
                order.iter().position(|r| *r == rule_x) < order.iter().position(|r| *r == rule_y),
                "BLOCKERS lists {rule_x} before {rule_y}, as RULES does"
            );
            // The changes commute: either order of applying them gives the same facts.
            let (mut f, mut g) = (two_4090s(), two_4090s());
            block_x(&mut f);
            block_y(&mut f);
            block_y(&mut g);
            block_x(&mut g);
            assert_eq!(f, g, "{rule_x} and {rule_y} do not commute");
            let v = first(&f);
            let codes = step_codes(&v);
            let mut expected = vec![code_x];
            if !MOOT.contains(&(rule_x, rule_y)) {
                expected.push(code_y);
            }
            if FIXABLE.contains(&rule_x) && FIXABLE.contains(&rule_y) {
                expected.push("PATCH");
            }
            assert_eq!(codes, expected, "{rule_x} + {rule_y}: {}", v.remedy);
            // The first decides the code, the remedy names every step in order, and the
            // patch outlook lists every change or says why it cannot.
            assert_eq!(v.code, code_x, "{rule_x} + {rule_y}");
            let joined: Vec<&str> = v.steps.iter().map(|s| s.remedy.as_str()).collect();
            assert_eq!(v.remedy, joined.join("; then "), "{rule_x} + {rule_y}");
            match &v.patch {
                PatchOutlook::AfterChange(changes) => {
                    assert!(FIXABLE.contains(&rule_x) && FIXABLE.contains(&rule_y), "{rule_x} + {rule_y}: {changes}");
                    assert_eq!(changes.matches("; then ").count(), 1, "two changes: {changes}");
                }
                PatchOutlook::Cannot(_) => {
                    assert!(!FIXABLE.contains(&rule_x) || !FIXABLE.contains(&rule_y), "{rule_x} + {rule_y}")
                }
                other => panic!("{rule_x} + {rule_y}: {other:?}"),
            }
        }
    }
}

#[test]
fn two_blockers_at_once_are_both_named_and_rendered_in_order() {
    // 4090s on NVIDIA's 570.195.03 (no patch branch) with Resizable BAR off.
    let f = load_fixture("4090-pair-stock-570-rebar-off.json");
    let v = first(&f);
    assert_eq!(step_codes(&v), ["VER", "BAR1", "PATCH"]);
    assert!(v.steps[1].remedy.starts_with("enable Above 4G decoding and Resizable BAR"), "{:?}", v.steps);
    assert!(v.steps[2].remedy.contains("the driver version the steps above lead to"), "{:?}", v.steps);
    let PatchOutlook::AfterChange(changes) = &v.patch else { panic!("{:?}", v.patch) };
    assert!(changes.starts_with("move to one of 615.71.09") && changes.contains("; then enable Resizable BAR"));
    let text = Report::new(f).render();
    let steps = "    remedy, in order:\n      1. [VER] install a driver version whose patch branch drives Ada cards";
    assert!(text.contains(steps), "{text}");
    assert!(
        text.contains("\n      2. [BAR1] enable Above 4G decoding") && text.contains("\n      3. [PATCH] install"),
        "{text}"
    );
    // The patch in effect and CUDA refusing: every missing piece, not only the first.
    let mut f = load_fixture("4090-pair-patched-cuda-refuses.json");
    f.devices[1].bar1_bytes = Some(256 << 20);
    f.devices[0].iommu_group_type = Some("DMA".into());
    let v = first(&f);
    assert_eq!(step_codes(&v), ["BAR1", "IOMMU"], "{:?}", v.steps);
    assert_eq!(v.patch, PatchOutlook::InEffect("a BAR1 that holds VRAM, the IOMMU in passthrough".into()));
}

#[test]
fn a_card_only_the_per_allocation_branch_serves_is_sent_to_its_version_alone() {
    // 48 GB 4090s on a driver with no patch branch: the version step names 590.48.01 only,
    // as the patch step does, not every version with an Ada branch.
    let mut f = load_fixture("4090-48g-pair-stock.json");
    f.host.kernel_module.iter_mut().for_each(|m| m.version = "570.195.03".into());
    let v = first(&f);
    assert_eq!(step_codes(&v), ["VER", "BAR1", "PATCH"]);
    assert!(v.steps[0].remedy.starts_with("install driver 590.48.01, whose 590.48.01-p2p-48g branch"), "{:?}", v.steps);
    assert!(!v.steps[0].remedy.contains("550.54.15"), "{}", v.steps[0].remedy);
    assert!(v.steps[2].remedy.contains("for open module 590.48.01 exactly"), "{:?}", v.steps);
    let PatchOutlook::AfterChange(changes) = &v.patch else { panic!("{:?}", v.patch) };
    assert!(changes.starts_with("move to 590.48.01; then "), "{changes}");
}

#[test]
fn a_translating_iommu_needs_passthrough() {
    let mut f = two_4090s();
    f.devices[0].iommu_group_type = Some("DMA".into());
    let v = first(&f);
    assert_eq!(v.code, "IOMMU");
    assert!(v.remedy.contains("iommu=pt"));
}

#[test]
fn missing_facts_are_named() {
    let mut f = two_4090s();
    f.devices[0].bar1_bytes = None;
    f.devices[1].iommu_group_type = None;
    f.host.iommu_cmdline = None;
    let v = first(&f);
    assert_eq!(v.code, "?");
    let PatchOutlook::Undecided(missing) = &v.patch else { panic!("{:?}", v.patch) };
    assert_eq!(
        missing,
        &[
            "BAR1 of device 0 (NVML gave none)",
            "IOMMU state of device 1 (sysfs /sys/bus/pci/devices/0000:02:00.0/iommu_group, or iommu=pt on the kernel command line)"
        ]
    );
    assert!(!v.remedy.contains("root"), "root cannot read what NVML or sysfs lack: {}", v.remedy);
    let mut f = two_4090s();
    f.host.kernel_module = None;
    assert_eq!(first(&f).code, "?");
    let mut f = two_4090s();
    f.pairs[0].can_access_peer = None;
    assert!(matches!(first(&f).patch, PatchOutlook::Undecided(_)));
}

#[test]
fn json_round_trip_renders_the_same_report() {
    let mut f = two_4090s();
    f.devices[1].bar1_bytes = Some(256 << 20);
    let report = Report::new(f);
    let dir = std::env::temp_dir().join(format!("gp2p-probe-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("report.json");
    std::fs::write(&path, report.to_json()).unwrap();
    let again = Report::new(crate::load(&path).unwrap());
    assert_eq!(again, report);
    assert_eq!(again.render(), report.render());
    assert!(report.render().contains("BAR1"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn one_device_has_no_pairs() {
    let mut f = two_4090s();
    f.devices.truncate(1);
    f.pairs.clear();
    let r = Report::new(f);
    assert!(r.verdicts.is_empty());
    assert!(r.render().contains("no pairs to check"));
}

#[test]
fn every_fixture_s_saved_verdicts_are_what_the_code_draws() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let doc: serde_json::Value = match std::fs::read_to_string(&path) {
            Ok(text) if path.extension().is_some_and(|e| e == "json") => serde_json::from_str(&text).unwrap(),
            _ => continue,
        };
        let Some(saved) = doc.get("verdicts") else { continue };
        let saved: Vec<crate::Verdict> = serde_json::from_value(saved.clone()).unwrap();
        let drawn = Report::new(crate::load(&path).unwrap()).verdicts;
        assert_eq!(drawn, saved, "{}: verdicts changed; rewrite them as tests/fixtures/README.md says", path.display());
        checked += 1;
    }
    assert!(checked >= 18, "only {checked} fixtures carry verdicts");
}

#[test]
fn saved_files_that_contradict_themselves_are_refused() {
    for (name, says) in [
        ("pair-names-absent-device.json", "pair 0 -> 2 names device 2, which `devices` does not list (it lists: 0, 1)"),
        ("self-pair.json", "pair 1 -> 1 joins a device to itself"),
        ("duplicate-ordinals.json", "device 0 is listed twice"),
    ] {
        let err = crate::load(&fixture(name)).expect_err(name);
        assert!(matches!(err, Error::Inconsistent { .. }), "{name}: {err:?}");
        let text = err.to_string();
        assert!(text.contains(says) && text.contains(name), "{name}: {text}");
        assert!(!err.is_unavailable(), "a bad file is not a missing driver (exit 1, not 2)");
    }
}

#[test]
fn a_pair_naming_an_unlisted_device_decides_nothing() {
    // Facts built in code are not checked; the verdict still refuses to guess.
    let mut f = two_4090s();
    f.pairs.push(PairFacts { a: 0, b: 7, can_access_peer: Some(false), ..PairFacts::default() });
    let v = verdicts(&f).pop().unwrap();
    assert_eq!(v.code, "?");
    assert!(v.reason.contains("no device 7"), "{}", v.reason);
}

#[test]
fn sizes_do_not_wrap() {
    // VRAM of u64::MAX rounded up to 2 MiB used to wrap to 0 and fit any BAR1.
    let f = load_fixture("vram-u64-max.json");
    assert_eq!(f.devices[1].vram_bytes, u64::MAX);
    assert_eq!(f.devices[1].bar1_covers_vram(), Some(false));
    assert_eq!(codes(&f), ["BAR1", "BAR1"]);
    assert!(!bar1_holds(u64::MAX, u64::MAX));
    assert!(bar1_holds(32 * GIB, 24 * GIB) && !bar1_holds(32 * GIB, 32 * GIB));
    assert!(Report::new(f).render().contains("17179869184.0 GiB"));
}

#[test]
fn control_characters_in_saved_facts_are_escaped_on_output() {
    let report = Report::new(load_fixture("control-chars-in-names.json"));
    let text = report.render();
    assert!(!text.contains('\u{1b}') && !text.contains('\r'), "{text:?}");
    assert!(text.contains("RTX 4090\\u{1b}[1A\\u{1b}[2K\\r0 -> 1 [OK]"), "{text}");
    // The fake verdict is part of the name on the device line, never a line of its own.
    assert_eq!(text.lines().filter(|l| l.starts_with("0 -> 1 [")).count(), 1);
    // JSON escapes them its own way and round-trips.
    let json = report.to_json();
    assert!(!json.contains('\u{1b}') && json.contains("\\u001b[1A"));
}

#[test]
fn fields_the_docs_call_optional_may_be_absent() {
    // An older file: no `os`, no `missing_sources`, no uuid, PCIe link or NVML atomics, and
    // fields since dropped (`force_p2p`, the cmdline's `passthrough`).
    let f = load_fixture("older-file-without-optional-fields.json");
    assert_eq!(f.host.os, "");
    assert!(f.missing_sources.is_empty() && f.devices[0].uuid.is_none() && f.pairs[0].nvml_atomics.is_none());
    assert_eq!(codes(&f), ["PATCH", "PATCH"]);
    assert!(Report::new(f).render().contains("OS unknown"));
}

fn arb_status() -> impl Strategy<Value = Option<P2pStatus>> {
    prop::option::of(prop::sample::select(vec![
        P2pStatus::Ok,
        P2pStatus::ChipsetNotSupported,
        P2pStatus::GpuNotSupported,
        P2pStatus::IohTopologyNotSupported,
        P2pStatus::DisabledByRegkey,
        P2pStatus::NotSupported,
        P2pStatus::Unknown,
    ]))
}

fn arb_device(ordinal: usize) -> impl Strategy<Value = DeviceFacts> {
    (
        prop::sample::select(vec![(8u32, 6u32), (8, 9), (12, 0)]),
        prop::option::of(prop::sample::select(vec![256u64 << 20, 16 * GIB, 32 * GIB, 64 * GIB])),
        prop::sample::select(vec![12 * GIB, 24 * GIB, 32 * GIB, 48 * GIB]),
        prop::option::of(prop::sample::select(vec!["identity", "DMA", "DMA-FQ", "none"])),
        prop::option::of(prop::sample::select(vec!["WDDM", "TCC"])),
        any::<bool>(),
        prop::sample::select(vec!["NVIDIA GeForce RTX 4090", "NVIDIA RTX A6000", "NVIDIA H100 PCIe", ""]),
        prop::option::of(prop::sample::select(vec!["GeForceRTX", "NvidiaRTX", "Nvidia"])),
        prop::option::of(prop::collection::vec(prop::sample::select(vec![256u64 << 20, 32 * GIB]), 0..3)),
    )
        .prop_map(move |(cc, bar1, vram, iommu, model, known_arch, name, brand, sizes)| DeviceFacts {
            ordinal,
            name: name.to_owned(),
            compute_capability: cc,
            vram_bytes: vram,
            bar1_bytes: bar1,
            bar1_sizes: sizes,
            iommu_group_type: iommu.map(str::to_owned),
            driver_model: model.map(str::to_owned),
            architecture: known_arch.then(|| Architecture::from_compute_capability(cc).name().to_owned()),
            brand: brand.map(str::to_owned),
            ..DeviceFacts::default()
        })
}

fn arb_facts() -> impl Strategy<Value = Facts> {
    (1usize..5)
        .prop_flat_map(|n| {
            let devices: Vec<_> = (0..n).map(arb_device).collect();
            let pairs = prop::collection::vec(
                (prop::option::of(any::<bool>()), arb_status(), arb_status(), arb_status(), arb_status()),
                n * (n - 1),
            );
            let module = prop::option::of((
                any::<bool>(),
                prop::sample::select(vec!["565.57.01", "580.159.04", "550.54.14"]),
                any::<bool>(),
            ));
            let force = prop::option::of(prop::sample::select(vec![0u32, 0x11, 0x22, 0x10]));
            let vm = prop::option::of(Just("KVM".to_owned()));
            let os = prop::sample::select(vec!["linux", "windows"]);
            (devices, pairs, module, force, vm, os)
        })
        .prop_map(|(devices, pair_facts, module, force, vm, os)| {
            let n = devices.len();
            let ordered = (0..n).flat_map(|a| (0..n).filter(move |&b| b != a).map(move |b| (a, b)));
            let pairs = ordered
                .zip(pair_facts)
                .map(|((a, b), (can, read, write, nvlink, atomics))| PairFacts {
                    a,
                    b,
                    can_access_peer: can,
                    nvml_read: read,
                    nvml_write: write,
                    nvml_nvlink: nvlink,
                    nvml_atomics: atomics,
                    ..PairFacts::default()
                })
                .collect();
            let kernel_module = module.map(|(open, version, self_built)| KernelModule {
                flavour: if open { ModuleFlavour::Open } else { ModuleFlavour::Proprietary },
                version: version.to_owned(),
                builder: Some(if self_built { "me@box".into() } else { "dvs-builder@x".into() }),
            });
            Facts {
                host: HostFacts {
                    os: os.into(),
                    kernel_module,
                    registry_dwords: force.map(|f| format!("ForceP2P={f:#x}")),
                    virtual_machine: vm,
                    ..HostFacts::default()
                },
                devices,
                pairs,
                ..Facts::default()
            }
        })
}

proptest! {
    #[test]
    fn one_verdict_per_ordered_pair_never_on_against_cuda(facts in arb_facts()) {
        let vs = verdicts(&facts);
        let n = facts.devices.len();
        prop_assert_eq!(vs.len(), n * n.saturating_sub(1));
        for a in 0..n {
            for b in 0..n {
                let count = vs.iter().filter(|v| v.a == a && v.b == b).count();
                prop_assert_eq!(count, usize::from(a != b), "pair {} -> {}", a, b);
            }
        }
        for (v, p) in vs.iter().zip(&facts.pairs) {
            prop_assert!(!v.reason.is_empty() && !v.remedy.is_empty() && !v.code.is_empty());
            prop_assert!(!v.used.is_empty());
            if p.can_access_peer != Some(true) {
                prop_assert!(v.on.is_none(), "on although CUDA said {:?}", p.can_access_peer);
            } else {
                prop_assert!(v.on.is_some());
            }
            // Off: every step in the order of RULES, the remedy their sentences joined.
            if v.on.is_none() {
                let order: Vec<&str> = crate::RULES.iter().map(|r| r.split(':').next().unwrap_or(r)).collect();
                let at: Vec<usize> = v.steps.iter().map(|s| order.iter().position(|r| *r == s.rule).unwrap_or(usize::MAX)).collect();
                prop_assert!(!at.is_empty() && at.windows(2).all(|w| w[0] <= w[1]) && at[at.len() - 1] < order.len(), "{:?}", v.steps);
                prop_assert_eq!(&v.steps[0].code, &v.code);
                let joined: Vec<&str> = v.steps.iter().map(|s| s.remedy.as_str()).collect();
                prop_assert_eq!(&v.remedy, &joined.join("; then "));
            } else {
                prop_assert!(v.steps.is_empty());
            }
            // Auto is kept off P2P exactly where the verdict says it is on but not safe.
            prop_assert_eq!(v.on.is_some() && !v.peer_trusted(), matches!(v.code.as_str(), "UNSAFE" | "OK?"));
            // Professional and datacenter pairs never hear that the patch would help.
            let pro = |o: usize| facts.device(o).and_then(DeviceFacts::class).is_some_and(|c| c != CardClass::GeForce);
            if pro(p.a) && pro(p.b) {
                prop_assert!(!matches!(v.patch, PatchOutlook::Would | PatchOutlook::AfterChange(_)), "{:?}", v);
                prop_assert!(!v.remedy.contains("install the P2P patch") && !v.remedy.contains("branch"), "{}", v.remedy);
            }
        }
        // Judged as if CUDA offered P2P, every pair is on.
        prop_assert!(crate::verdicts_if_on(&facts).iter().all(|v| v.on.is_some()));
    }
}

#[test]
fn device_table_and_pair_matrix_are_drawn_like_the_cli_tables() {
    // The look of `crate::table`: no borders, numbers right, text left, no trailing spaces.
    let text = Report::new(load_fixture("4090-pair-patched-565.json")).render();
    let expected = "\
 #  name                      cc      VRAM      BAR1  BAR1 max  PCIe cur/max       brand/arch      iommu     bus
 0  NVIDIA GeForce RTX 4090  8.9  23.6 GiB  32.0 GiB         ?  4.0 x16 / 4.0 x16  GeForceRTX/Ada  identity  0000:01:00.0
 1  NVIDIA GeForce RTX 4090  8.9  23.6 GiB  32.0 GiB         ?  4.0 x16 / 4.0 x16  GeForceRTX/Ada  identity  0000:41:00.0

topology (how each pair's traffic meets in the host)
      0    1  NUMA  CPUs  root port
 0    X  SYS     ?  ?     ?
 1  SYS    X     ?  ?     ?
legend: SW same PCIe switch";
    assert!(text.contains(expected), "{text}");
    let expected = "\
 1  SYS    X     ?  ?     ?
legend: SW same PCIe switch, sharing its uplink into the CPU (nvidia-smi PIX/PXB) | RC same root complex, own root ports (PHB) | NODE same NUMA node, different root complexes (NODE) | SYS different NUMA nodes: across the CPU interconnect, between sockets or NUMA nodes (SYS) | ? not known | NUMA -: the kernel names no node

pairs (row reads column)
     0   1
 0   X  OK
 1  OK   X
legend: ";
    assert!(text.contains(expected), "{text}");
    assert!(text.lines().all(|line| line == line.trim_end()), "trailing spaces:\n{text}");
}

/// A bundled example's facts, as `gp2p probe --example NAME` reads them.
fn bundled(name: &str) -> Facts {
    crate::examples::example(name).unwrap_or_else(|| panic!("no example {name}")).facts().unwrap()
}

#[test]
fn every_bundled_example_loads_says_it_is_one_and_round_trips() {
    assert!(crate::examples::EXAMPLES.len() >= 3);
    let dir = std::env::temp_dir().join(format!("gp2p-probe-examples-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for e in crate::examples::EXAMPLES {
        let facts = e.facts().unwrap_or_else(|err| panic!("{}: {err}", e.name));
        assert!(facts.example.as_deref().is_some_and(|m| !m.is_empty()), "{}: not marked as an example", e.name);
        assert!(crate::examples::list().contains(e.name));
        let report = Report::new(facts);
        let text = report.render();
        assert!(text.starts_with("geforce-p2p probe\nEXAMPLE, not this machine: "), "{}: {text}", e.name);
        assert!(text.trim_end().lines().last().is_some_and(|l| l.starts_with("EXAMPLE: this was a bundled example")));
        assert!(text.contains("topology (how each pair's traffic meets in the host)"), "{}: {text}", e.name);
        // --json then --from: the same report, still marked.
        let path = dir.join(format!("{}.json", e.name));
        std::fs::write(&path, report.to_json()).unwrap();
        let again = Report::new(crate::load(&path).unwrap());
        assert_eq!(again, report, "{}", e.name);
        assert_eq!(again.render(), text, "{}", e.name);
    }
    assert!(crate::examples::example("nope").is_none());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_dual_socket_box_of_eight_cards_each_on_its_own_numa_node() {
    use crate::topology::PathKind;
    let f = bundled("8x4090-epyc");
    let t = crate::Topology::new(&f);
    let nodes = t.numa_nodes();
    assert_eq!(nodes.len(), 8, "{nodes:?}");
    assert!(nodes.iter().enumerate().all(|(i, (node, cards))| *node == i as u32 && *cards == [i]), "{nodes:?}");
    assert_eq!(t.pairs.len(), 28);
    assert!(t.pairs.iter().all(|p| p.path == PathKind::System), "{:?}", t.pairs);
    assert!(t.uplinks.is_empty() && t.crosses_numa(0, 7) == Some(true) && t.crosses_numa(3, 4) == Some(true));
    assert_eq!(t.cards[4].root_complex.as_deref(), Some("pci0000:80"));
    assert_eq!(t.cards[4].cpus.as_deref(), Some("64-79,192-207"));
    assert!(verdicts(&f).iter().all(|v| v.code == "PATCH"), "{:?}", codes(&f));
    let text = Report::new(f).render();
    let matrix = "\
      0    1    2    3    4    5    6    7  NUMA  CPUs             root port
 0    X  SYS  SYS  SYS  SYS  SYS  SYS  SYS     0  0-15,128-143     0000:00:01.1
";
    assert!(text.contains(matrix), "{text}");
    assert!(
        text.contains("\n 7  SYS  SYS  SYS  SYS  SYS  SYS  SYS    X     7  112-127,240-255  0000:e0:01.1\n"),
        "{text}"
    );
}

#[test]
fn four_cards_behind_one_switch_share_its_uplink() {
    use crate::topology::{PathKind, Uplink};
    let f = bundled("4x3090-switch");
    let t = crate::Topology::new(&f);
    assert_eq!(t.uplinks, [Uplink { root_port: Some("0000:16:01.0".into()), cards: vec![0, 1, 2, 3] }]);
    assert!(t.pairs.iter().all(|p| p.path == PathKind::Switch));
    assert_eq!(t.numa_nodes(), [(0, vec![0, 1, 2, 3])]);
    assert!(t.cards.iter().all(|c| c.switch_ports == 2), "{:?}", t.cards);
    // The proprietary module at a version with no branch, and ACS redirect on the switch's
    // downstream ports: three steps, then the patch.
    assert_eq!(step_codes(&first(&f)), ["PROP", "VER", "ACS", "PATCH"]);
    assert!(t.pairs.iter().all(|p| p.acs_redirect.len() == 2 && p.acs_unread.is_empty()), "{:?}", t.pairs);
    let text = Report::new(f).render();
    assert!(text.contains("\n 0    X  SW*  SW*  SW*     0  0-111  0000:16:01.0\n"), "{text}");
    assert!(
        text.contains("\n* ACS on a bridge between the two cards redirects their peer traffic up to the root complex"),
        "{text}"
    );
    assert!(text.contains("shared uplink: cards 0, 1, 2, 3 behind one switch (root port 0000:16:01.0)"), "{text}");
}

#[test]
fn the_desktop_example_names_its_whole_chain() {
    let f = bundled("2x4090");
    assert_eq!(step_codes(&first(&f)), ["VER", "BAR1", "IOMMU", "PATCH"]);
    let t = crate::Topology::new(&f);
    assert_eq!(t.path(0, 1), crate::topology::PathKind::RootComplex);
    // The kernel names no NUMA node on this desktop: "-", not "not read".
    assert!(Report::new(f).render().contains("\n 0   X  RC     -  0-31  0000:00:01.1\n"));
}
