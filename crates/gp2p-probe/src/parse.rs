//! Parsers for what Linux exposes in text: `/proc/driver/nvidia/version`, `/proc/cmdline`,
//! `/proc/driver/nvidia/params`. Pure, tested on real-format strings.

use crate::facts::{HostFacts, IommuCmdline, KernelModule, ModuleFlavour};

/// The first line of `/proc/driver/nvidia/version`:
/// - open: `NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (dvs-builder@…)  <date>`
/// - proprietary: `NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.216.03  <date>`
pub fn kernel_module(text: &str) -> Option<KernelModule> {
    let line = text.lines().find(|l| l.starts_with("NVRM version:"))?;
    let flavour = if line.contains("Open Kernel Module") { ModuleFlavour::Open } else { ModuleFlavour::Proprietary };
    let version = line
        .split_whitespace()
        .find(|w| {
            w.split('.').count() >= 2 && w.split('.').all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
        })?
        .to_owned();
    let builder = line.find('(').and_then(|start| {
        let rest = &line[start + 1..];
        rest.find(')').map(|end| rest[..end].to_owned()).filter(|b| b.contains('@'))
    });
    Some(KernelModule { flavour, version, builder })
}

/// The sizes a BAR's Resizable BAR capability offers, in bytes, ascending, from its sysfs
/// `resource<N>_resize` file: a hex bitmask where bit n offers 2^n MiB (`0000000000003fc0`
/// offers 64 MiB to 8 GiB). Bits past what 64-bit bytes can count are dropped.
pub fn rebar_sizes(text: &str) -> Option<Vec<u64>> {
    const MIB_SHIFT: u32 = 20;
    let mask = u64::from_str_radix(text.trim().trim_start_matches("0x"), 16).ok()?;
    Some((0..u64::BITS - MIB_SHIFT).filter(|bit| mask & (1 << bit) != 0).map(|bit| 1u64 << (bit + MIB_SHIFT)).collect())
}

/// A PCI device's place in the PCI tree from its resolved sysfs path
/// (`/sys/devices/pci0000:40/0000:40:01.1/0000:41:00.0`): the components from the root bus
/// (`pci<domain>:<bus>`) down to the device. Whatever sits above the root bus (ACPI or
/// VMBus nodes in some virtual machines) is left out; `None` when the path has no root bus.
/// Where the path holds more than one root bus, the last is the device's: behind Intel VMD
/// (`pci0000:00/0000:00:0e.0/pci10000:e0/10000:e0:06.0/…`) the VMD device sits above a
/// root bus of its own, and taking the first would make it every card's root port.
pub fn pci_path(resolved: &str) -> Option<Vec<String>> {
    let parts: Vec<&str> = resolved.split('/').filter(|p| !p.is_empty()).collect();
    let root = parts.iter().rposition(|p| p.starts_with("pci") && p.contains(':'))?;
    Some(parts[root..].iter().map(|p| (*p).to_owned()).collect())
}

/// A device's NUMA node from sysfs `numa_node` (`-1` where the kernel names none).
pub fn numa_node(text: &str) -> Option<i32> {
    text.trim().parse().ok()
}

/// Major and minor version of the running kernel, from `/proc/sys/kernel/osrelease`
/// (`6.8.0-45-generic`).
pub fn kernel_release(text: &str) -> Option<(u32, u32)> {
    let mut parts = text.trim().split(['.', '-']);
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// The iommu-related words of `/proc/cmdline`.
pub fn iommu_cmdline(text: &str) -> IommuCmdline {
    let flags = text
        .split_whitespace()
        .filter(|w| {
            let key = w.split('=').next().unwrap_or("");
            matches!(key, "iommu" | "intel_iommu" | "amd_iommu" | "iommu.passthrough" | "iommu.strict")
        })
        .map(str::to_owned)
        .collect();
    IommuCmdline { flags }
}

/// `RegistryDwords` from `/proc/driver/nvidia/params` (a line `RegistryDwords: "k=v;k=v"`),
/// when set.
pub fn registry(text: &str) -> Option<String> {
    let line = text.lines().find(|l| l.trim_start().starts_with("RegistryDwords:"))?;
    let value = line.split_once(':').map(|(_, v)| v.trim().trim_matches('"').to_owned()).unwrap_or_default();
    (!value.is_empty()).then_some(value)
}

impl HostFacts {
    /// `ForceP2P` from the RegistryDwords, if set there.
    pub fn force_p2p(&self) -> Option<u32> {
        self.registry_dwords.as_deref().and_then(force_p2p)
    }
}

/// The `ForceP2P` value in a RegistryDwords string (decimal or 0x hex).
pub fn force_p2p(registry_dwords: &str) -> Option<u32> {
    registry_dwords.split(';').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        if !k.trim().eq_ignore_ascii_case("ForceP2P") {
            return None;
        }
        let v = v.trim();
        match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
            Some(hex) => u32::from_str_radix(hex, 16).ok(),
            None => v.parse().ok(),
        }
    })
}

/// The read and write fields of a `ForceP2P` value: bits 1:0 and 5:4; 0 disables, 1
/// enables, 2 (the default) leaves the chipset's decision.
pub fn force_p2p_fields(value: u32) -> (u32, u32) {
    (value & 0b11, (value >> 4) & 0b11)
}

/// The atomics field of a `ForceP2P` value: bits 9:8, coded like the others (0x11, the
/// patch's built-in default, leaves it 0: atomics disabled).
pub fn force_p2p_atomics(value: u32) -> u32 {
    (value >> 8) & 0b11
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_module_line() {
        let text = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.195.03  Release Build  (dvs-builder@U22-I3-H04-03-1)  Sat Sep 20 00:47:16 UTC 2025\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n";
        let m = kernel_module(text).unwrap();
        assert_eq!(m.flavour, ModuleFlavour::Open);
        assert_eq!(m.version, "570.195.03");
        assert_eq!(m.builder.as_deref(), Some("dvs-builder@U22-I3-H04-03-1"));
        assert_eq!(m.built_by_nvidia(), Some(true));
    }

    #[test]
    fn a_module_built_elsewhere_names_its_builder() {
        let text = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  565.57.01  Release Build  (alice@tinybox)  Sat Dec  7 10:00:00 UTC 2024";
        let m = kernel_module(text).unwrap();
        assert_eq!(m.version, "565.57.01");
        assert_eq!(m.built_by_nvidia(), Some(false));
        // NixOS builds NVIDIA's stock sources as nixbld, with no host after the @.
        let nix = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (nixbld@)  Thu Jan  1 00:00:01 UTC 1970";
        let m = kernel_module(nix).unwrap();
        assert_eq!((m.version.as_str(), m.builder.as_deref()), ("580.159.04", Some("nixbld@")));
        assert_eq!(m.built_by_nvidia(), Some(false));
    }

    #[test]
    fn proprietary_module_line() {
        let m =
            kernel_module("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.216.03  Thu Apr  3 01:14:19 UTC 2025")
                .unwrap();
        assert_eq!(m.flavour, ModuleFlavour::Proprietary);
        assert_eq!(m.version, "535.216.03");
        assert_eq!(m.builder, None);
        assert!(kernel_module("something else").is_none());
    }

    #[test]
    fn cmdline_iommu_words() {
        let c = iommu_cmdline("BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro quiet amd_iommu=on iommu=pt");
        assert_eq!(c.flags, ["amd_iommu=on", "iommu=pt"]);
        assert!(c.passthrough() && !c.off());
        let c = iommu_cmdline("root=/dev/nvme0n1p2 intel_iommu=off");
        assert!(c.off() && !c.passthrough());
        assert!(iommu_cmdline("root=/dev/vda console=ttyS0").flags.is_empty());
    }

    #[test]
    fn resizable_bar_sizes_and_kernel_release() {
        const MIB: u64 = 1 << 20;
        // A 4090: 64 MiB to 32 GiB.
        let sizes = rebar_sizes("000000000000ffc0\n").unwrap();
        assert_eq!((sizes.len(), sizes[0], sizes[9]), (10, 64 * MIB, 32 << 30));
        assert_eq!(rebar_sizes("0000000000000000\n"), Some(vec![]));
        assert_eq!(rebar_sizes("8000000000000000"), Some(vec![]), "2^63 MiB is past u64 bytes");
        assert_eq!(rebar_sizes("0000080000000000").map(|s| s[0]), Some(1 << 63));
        assert_eq!(rebar_sizes("not hex"), None);
        assert_eq!(kernel_release("6.8.0-45-generic\n"), Some((6, 8)));
        assert_eq!(kernel_release("5.15.167.4-microsoft-standard-WSL2"), Some((5, 15)));
        assert_eq!(kernel_release("garbage"), None);
    }

    #[test]
    fn pci_paths_and_numa_nodes() {
        let path = pci_path("/sys/devices/pci0000:40/0000:40:01.1/0000:41:00.0/0000:42:00.0/0000:43:00.0").unwrap();
        assert_eq!(path, ["pci0000:40", "0000:40:01.1", "0000:41:00.0", "0000:42:00.0", "0000:43:00.0"]);
        // Hyper-V: VMBus nodes above the root bus are not part of the PCI tree.
        let vm = "/sys/devices/LNXSYSTM:00/LNXSYBUS:00/PNP0A03:00/device:07/VMBUS:01/47505500-0001-0000-3130-444531454238/pci0001:00/0001:00:00.0";
        assert_eq!(pci_path(vm).unwrap(), ["pci0001:00", "0001:00:00.0"]);
        assert_eq!(pci_path("/sys/devices/platform/foo"), None);
        // Intel VMD: its own root bus below the VMD device; each card on its own root port
        // of that bus shares no switch with the other.
        let vmd = |port: &str, card: &str| {
            pci_path(&format!("/sys/devices/pci0000:00/0000:00:0e.0/pci10000:e0/10000:e0:{port}/10000:{card}")).unwrap()
        };
        let (a, b) = (vmd("06.0", "e1:00.0"), vmd("1a.0", "e2:00.0"));
        assert_eq!(a, ["pci10000:e0", "10000:e0:06.0", "10000:e1:00.0"]);
        let card =
            |ordinal, pci_path| crate::facts::DeviceFacts { ordinal, pci_path: Some(pci_path), ..Default::default() };
        let facts = crate::Facts { devices: vec![card(0, a), card(1, b)], ..Default::default() };
        assert_eq!(crate::Topology::new(&facts).path(0, 1), crate::topology::PathKind::RootComplex);
        assert_eq!((numa_node("1\n"), numa_node("-1\n"), numa_node("")), (Some(1), Some(-1), None));
    }

    #[test]
    fn registry_dwords_and_force_p2p() {
        let params = "ResmanDebugLevel: 4294967295\nRegistryDwords: \"ForceP2P=0x11;RMForceStaticBar1=1\"\nRegistryDwordsPerDevice: \"\"\n";
        let raw = registry(params);
        assert_eq!(raw.as_deref(), Some("ForceP2P=0x11;RMForceStaticBar1=1"));
        assert_eq!(raw.as_deref().and_then(force_p2p), Some(0x11));
        assert_eq!(force_p2p_fields(0x11), (1, 1));
        assert_eq!((force_p2p_atomics(0x11), force_p2p_atomics(0x111), force_p2p_atomics(0x222)), (0, 1, 2));
        assert_eq!(force_p2p("ForceP2P=0"), Some(0));
        assert_eq!(force_p2p("forcep2p=0X10"), Some(0x10));
        assert_eq!(force_p2p("RMForceStaticBar1=1"), None);
        assert_eq!(registry("RegistryDwords: \"\"\n"), None);
        assert_eq!(registry("EnableMSI: 1\n"), None);
    }
}
