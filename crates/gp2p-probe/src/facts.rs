//! The facts a verdict rests on: plain data, serialisable. A missing source lowers what
//! the report can say, it never fails it, so a saved file may leave out any field except
//! the few that name things: `devices`, each device's `ordinal`, `compute_capability` and
//! `vram_bytes` (CUDA always has them), and each pair's `a` and `b`. [`Facts::check`]
//! refuses facts that contradict themselves.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::acs::Acs;

/// Everything the probe learnt about this machine.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Facts {
    /// Set only in the example files bundled with the probe ([`crate::examples`]): the
    /// machine they describe, in words. A report of them says, first, that it is an example
    /// and not this machine, also after a round trip through `--json` and `--from`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub example: Option<String>,
    /// Machine-wide facts.
    #[serde(default)]
    pub host: HostFacts,
    /// One entry per CUDA device, by ordinal (required: it is what tells probe facts from
    /// any other JSON).
    pub devices: Vec<DeviceFacts>,
    /// One entry per ordered pair (a, b), a != b.
    #[serde(default)]
    pub pairs: Vec<PairFacts>,
    /// Sources that could not be read, in words (e.g. "NVML: library not found").
    #[serde(default)]
    pub missing_sources: Vec<String>,
    /// The PCI bridges on the cards' paths (root ports, switch ports: every entry of a
    /// card's [`DeviceFacts::pci_path`] between the root bus and the card), each once, with
    /// its ACS as its config space shows it. Empty where sysfs was not read (other OSes,
    /// files saved before the probe read ACS): then nothing is known of ACS.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bridges: Vec<BridgeFacts>,
}

/// A PCI bridge on the path of one or more cards.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BridgeFacts {
    /// Its PCI address, as in the cards' `pci_path` (`0000:40:01.1`).
    pub bdf: String,
    /// Its ACS, from its sysfs `config` ([`crate::acs::parse_config`]).
    pub acs: Acs,
}

impl Facts {
    /// The device with this ordinal.
    pub fn device(&self, ordinal: usize) -> Option<&DeviceFacts> {
        self.devices.iter().find(|d| d.ordinal == ordinal)
    }

    /// The bridge with this PCI address.
    pub fn bridge(&self, bdf: &str) -> Option<&BridgeFacts> {
        self.bridges.iter().find(|b| b.bdf == bdf)
    }

    /// Whether NVML answered at all: some fact only NVML gives is known. `false` means
    /// libnvidia-ml could not be loaded or initialised (`missing_sources` says which).
    pub fn nvml_answered(&self) -> bool {
        self.host.driver_version.is_some()
            || self.devices.iter().any(|d| d.brand.is_some() || d.bar1_bytes.is_some() || d.pcie.is_some())
            || self.pairs.iter().any(|p| p.nvml_read.is_some() || p.nvml_write.is_some() || p.nvml_atomics.is_some())
    }

    /// Whether the facts hold together: each device listed once, each pair joining two
    /// different listed devices, each ordered pair once. Saved files are checked on load;
    /// the error says what is wrong, in words.
    pub fn check(&self) -> Result<(), String> {
        let mut ordinals = BTreeSet::new();
        for d in &self.devices {
            if !ordinals.insert(d.ordinal) {
                return Err(format!("device {} is listed twice: each device appears once in `devices`", d.ordinal));
            }
        }
        let listed = || ordinals.iter().map(usize::to_string).collect::<Vec<_>>().join(", ");
        let mut pairs = BTreeSet::new();
        for p in &self.pairs {
            if p.a == p.b {
                return Err(format!("pair {} -> {} joins a device to itself: a pair needs two devices", p.a, p.b));
            }
            if let Some(absent) = [p.a, p.b].into_iter().find(|o| !ordinals.contains(o)) {
                return Err(format!(
                    "pair {} -> {} names device {absent}, which `devices` does not list (it lists: {})",
                    p.a,
                    p.b,
                    listed()
                ));
            }
            if !pairs.insert((p.a, p.b)) {
                return Err(format!("pair {} -> {} is listed twice: each ordered pair appears once", p.a, p.b));
            }
        }
        let mut bridges = BTreeSet::new();
        for b in &self.bridges {
            if !bridges.insert(b.bdf.as_str()) {
                return Err(format!("bridge {} is listed twice: each bridge appears once in `bridges`", b.bdf));
            }
        }
        Ok(())
    }
}

/// Which kernel module flavour drives the GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModuleFlavour {
    /// NVIDIA's open GPU kernel modules (the patch applies to these).
    Open,
    /// The proprietary kernel module.
    Proprietary,
}

/// The loaded NVIDIA kernel module, from `/proc/driver/nvidia/version`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelModule {
    /// Open or proprietary.
    pub flavour: ModuleFlavour,
    /// Driver version, e.g. "580.159.04".
    pub version: String,
    /// `user@host` of the build, when the line has one: NVIDIA's builds say `dvs-builder@…`;
    /// a module built anywhere else names that builder — a distribution's (NixOS:
    /// `nixbld@…`), DKMS on the machine itself (`root@…`), or a person building the patch.
    pub builder: Option<String>,
}

impl KernelModule {
    /// Whether NVIDIA built this module (`dvs-builder@…`); `None` when the line names no
    /// builder. A build elsewhere says nothing about the patch by itself: distributions and
    /// DKMS build NVIDIA's stock sources too.
    pub fn built_by_nvidia(&self) -> Option<bool> {
        self.builder.as_deref().map(|b| b.starts_with("dvs-builder@"))
    }
}

/// What the kernel command line says about the IOMMU.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct IommuCmdline {
    /// The iommu-related words found, verbatim.
    pub flags: Vec<String>,
}

impl IommuCmdline {
    /// Whether they ask for passthrough (`iommu=pt`, `iommu.passthrough=1`).
    pub fn passthrough(&self) -> bool {
        self.flags.iter().any(|f| f == "iommu=pt" || f == "iommu.passthrough=1")
    }

    /// Whether they turn the IOMMU off (`iommu=off`, `intel_iommu=off`, `amd_iommu=off`).
    pub fn off(&self) -> bool {
        self.flags.iter().any(|f| matches!(f.as_str(), "iommu=off" | "intel_iommu=off" | "amd_iommu=off"))
    }
}

/// Machine-wide facts.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct HostFacts {
    /// `linux` or `windows` or another OS name; empty when not known.
    pub os: String,
    /// The CUDA driver version, e.g. (13, 0).
    pub cuda_driver: Option<(u32, u32)>,
    /// The display driver version NVML reports, e.g. "580.159.04".
    pub driver_version: Option<String>,
    /// From `/proc/driver/nvidia/version`.
    pub kernel_module: Option<KernelModule>,
    /// From `/proc/cmdline`.
    pub iommu_cmdline: Option<IommuCmdline>,
    /// The module's RegistryDwords string from `/proc/driver/nvidia/params`, verbatim, when
    /// set ([`HostFacts::force_p2p`] reads `ForceP2P` from it).
    pub registry_dwords: Option<String>,
    /// Whether this is a virtual machine (and which, when known).
    pub virtual_machine: Option<String>,
}

// `HostFacts::force_p2p`, which reads `ForceP2P` from the RegistryDwords, is in `parse.rs`
// with the parser it calls: the facts are plain data, and the parsers build on them.

/// What a card is sold as, from NVML's brand (or, without NVML, its name). It decides which
/// advice fits: the P2P patch is for GeForce cards; professional and datacenter cards get P2P
/// from the stock driver, and can leave WDDM on Windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CardClass {
    /// GeForce and TITAN cards.
    GeForce,
    /// Workstation cards: Quadro, RTX A-series, RTX Ada / PRO.
    Professional,
    /// Datacenter and virtual-GPU cards: Tesla, A100, H100, L40, …
    Datacenter,
}

impl CardClass {
    /// The words for it in a verdict.
    pub fn name(self) -> &'static str {
        match self {
            CardClass::GeForce => "GeForce",
            CardClass::Professional => "professional",
            CardClass::Datacenter => "datacenter",
        }
    }
}

/// The GPU architecture (generation) of a card, from NVML or, without it, from the
/// compute capability.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Architecture {
    /// Volta and older (compute capability below 7.5): the open kernel module does not
    /// drive them.
    Older,
    /// Turing (7.5).
    Turing,
    /// Ampere (8.0, 8.6, 8.7).
    Ampere,
    /// Ada (8.9).
    Ada,
    /// Hopper (9.0).
    Hopper,
    /// Blackwell (10.x, 12.x).
    Blackwell,
    /// Something newer than this probe knows.
    Newer,
}

impl Architecture {
    /// Its name, as NVML spells it.
    pub fn name(self) -> &'static str {
        match self {
            Architecture::Older => "pre-Turing",
            Architecture::Turing => "Turing",
            Architecture::Ampere => "Ampere",
            Architecture::Ada => "Ada",
            Architecture::Hopper => "Hopper",
            Architecture::Blackwell => "Blackwell",
            Architecture::Newer => "newer",
        }
    }

    /// From a compute capability.
    pub fn from_compute_capability((major, minor): (u32, u32)) -> Architecture {
        match (major, minor) {
            (0..=6, _) | (7, 0..=4) => Architecture::Older,
            (7, _) => Architecture::Turing,
            (8, 9) => Architecture::Ada,
            (8, _) => Architecture::Ampere,
            (9, _) => Architecture::Hopper,
            (10..=12, _) => Architecture::Blackwell,
            _ => Architecture::Newer,
        }
    }
}

/// PCIe link state of one device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PcieLink {
    /// Current generation (links train down when idle).
    pub current_gen: u32,
    /// Current width.
    pub current_width: u32,
    /// Maximum generation of GPU and slot.
    pub max_gen: u32,
    /// Maximum width.
    pub max_width: u32,
}

/// Facts about one device.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceFacts {
    /// CUDA ordinal.
    pub ordinal: usize,
    /// Name, e.g. "NVIDIA GeForce RTX 4090".
    #[serde(default)]
    pub name: String,
    /// UUID (NVML).
    pub uuid: Option<String>,
    /// PCI bus id.
    #[serde(default)]
    pub pci_bus_id: String,
    /// Compute capability.
    pub compute_capability: (u32, u32),
    /// Device memory, bytes.
    pub vram_bytes: u64,
    /// BAR1 aperture, bytes (NVML).
    pub bar1_bytes: Option<u64>,
    /// BAR1 sizes the card's Resizable BAR capability offers, bytes, ascending (Linux sysfs
    /// `resource1_resize` of its PCI function). Empty: the card offers no resizable BAR1
    /// (Linux 6.1 and later list every resizable BAR). `None`: not read.
    pub bar1_sizes: Option<Vec<u64>>,
    /// PCIe link (NVML).
    pub pcie: Option<PcieLink>,
    /// Brand, e.g. "GeForce", "GeForceRTX", "Nvidia" (NVML).
    pub brand: Option<String>,
    /// Architecture, e.g. "Ada", "Hopper" (NVML).
    pub architecture: Option<String>,
    /// Windows driver model: "WDDM", "TCC" or "MCDM" (NVML, Windows only).
    pub driver_model: Option<String>,
    /// Type of the device's IOMMU group (`identity`, `DMA`, `DMA-FQ`, …), or "none" when
    /// the device has no IOMMU group (no IOMMU).
    pub iommu_group_type: Option<String>,
    /// NUMA node of the card's PCI function (Linux sysfs `numa_node`); -1 where the kernel
    /// names none (a machine of one node, or firmware that does not say). `None`: not read.
    #[serde(default)]
    pub numa_node: Option<i32>,
    /// The CPUs local to the card, as the kernel lists them (sysfs `local_cpulist`, e.g.
    /// `0-15,128-143`). `None`: not read.
    #[serde(default)]
    pub local_cpulist: Option<String>,
    /// The card's place in the PCI tree: its sysfs device path from the root bus (the root
    /// complex, `pci0000:40`) through the root port and any switch ports down to the card
    /// itself, e.g. `["pci0000:40", "0000:40:01.1", "0000:41:00.0", "0000:42:00.0",
    /// "0000:43:00.0"]`. `None`: not read. [`crate::Topology`] reads it.
    #[serde(default)]
    pub pci_path: Option<Vec<String>>,
}

impl DeviceFacts {
    /// Whether BAR1 can map all of VRAM (the static BAR1 rule: BAR1 − 128 KiB ≥ VRAM rounded
    /// up to 2 MiB). `None` when BAR1 is unknown.
    pub fn bar1_covers_vram(&self) -> Option<bool> {
        self.bar1_bytes.map(|bar1| bar1_holds(bar1, self.vram_bytes))
    }

    /// What the card is sold as: NVML's brand, else its CUDA name (every GeForce card's
    /// name says GeForce or TITAN). `None` when neither is known.
    pub fn class(&self) -> Option<CardClass> {
        match self.brand.as_deref() {
            Some("GeForce" | "GeForceRTX" | "Titan" | "TitanRTX") => return Some(CardClass::GeForce),
            Some("Quadro" | "QuadroRTX" | "NvidiaRTX" | "NVS") => return Some(CardClass::Professional),
            Some("Tesla" | "Nvidia" | "GRID" | "VApps" | "VPC" | "VCS" | "VWS" | "CloudGaming" | "VGaming") => {
                return Some(CardClass::Datacenter);
            }
            _ => {}
        }
        let name = self.name.to_ascii_lowercase();
        if name.is_empty() {
            None
        } else if name.contains("geforce") || name.contains("titan") {
            Some(CardClass::GeForce)
        } else if name.contains("quadro") || name.contains("rtx") {
            Some(CardClass::Professional)
        } else {
            Some(CardClass::Datacenter)
        }
    }

    /// The card's architecture: NVML's, else the compute capability's.
    pub fn arch(&self) -> Architecture {
        match self.architecture.as_deref() {
            Some("Kepler" | "Maxwell" | "Pascal" | "Volta") => Architecture::Older,
            Some("Turing") => Architecture::Turing,
            Some("Ampere") => Architecture::Ampere,
            Some("Ada") => Architecture::Ada,
            Some("Hopper") => Architecture::Hopper,
            Some("Blackwell") => Architecture::Blackwell,
            _ => Architecture::from_compute_capability(self.compute_capability),
        }
    }

    /// The largest BAR1 the card can have: the largest size its Resizable BAR capability
    /// offers, or, with none offered, the BAR1 it has. `None` when the sizes were not read.
    pub fn bar1_largest(&self) -> Option<u64> {
        let sizes = self.bar1_sizes.as_ref()?;
        sizes.iter().copied().max().or(self.bar1_bytes)
    }

    /// Whether the IOMMU translates this device's DMA. `None` when unknown.
    pub fn iommu_translates(&self) -> Option<bool> {
        self.iommu_group_type.as_deref().map(|t| t.eq_ignore_ascii_case("DMA") || t.eq_ignore_ascii_case("DMA-FQ"))
    }
}

/// BAR1 space the driver keeps for itself (doorbell and MMIO pages: 32 × 4 KiB).
const BAR1_RESERVED_BYTES: u64 = 128 << 10;
/// The static BAR1 mapping maps VRAM in 2 MiB pages.
const BAR1_MAP_ALIGN_BYTES: u64 = 2 << 20;

/// The static BAR1 rule: whether a BAR1 of `bar1` bytes can map `vram` bytes. VRAM so large
/// that rounding it up overflows fits in no BAR1.
pub fn bar1_holds(bar1: u64, vram: u64) -> bool {
    bar1_needed(vram).is_some_and(|needed| bar1 >= needed)
}

/// The smallest BAR1 that maps `vram` bytes under the static BAR1 rule; `None` when no
/// 64-bit size can.
pub fn bar1_needed(vram: u64) -> Option<u64> {
    vram.checked_next_multiple_of(BAR1_MAP_ALIGN_BYTES)?.checked_add(BAR1_RESERVED_BYTES)
}

/// NVML's P2P status for one capability.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum P2pStatus {
    /// OK.
    Ok,
    /// CNS: the chipset does not support it.
    ChipsetNotSupported,
    /// GNS: the GPU does not support it.
    GpuNotSupported,
    /// TNS: IOH topology not supported.
    IohTopologyNotSupported,
    /// DR: disabled by a registry key.
    DisabledByRegkey,
    /// NS: not supported (generic).
    NotSupported,
    /// U: unknown.
    Unknown,
}

impl P2pStatus {
    /// nvidia-smi's short code.
    pub fn code(self) -> &'static str {
        match self {
            P2pStatus::Ok => "OK",
            P2pStatus::ChipsetNotSupported => "CNS",
            P2pStatus::GpuNotSupported => "GNS",
            P2pStatus::IohTopologyNotSupported => "TNS",
            P2pStatus::DisabledByRegkey => "DR",
            P2pStatus::NotSupported => "NS",
            P2pStatus::Unknown => "U",
        }
    }
}

/// Facts about one ordered pair.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PairFacts {
    /// Source ordinal.
    pub a: usize,
    /// Peer ordinal.
    pub b: usize,
    /// `cuDeviceCanAccessPeer(a, b)`.
    pub can_access_peer: Option<bool>,
    /// `cuDeviceGetP2PAttribute` NATIVE_ATOMIC_SUPPORTED.
    pub native_atomics: Option<bool>,
    /// `cuDeviceGetP2PAttribute` PERFORMANCE_RANK.
    pub performance_rank: Option<i32>,
    /// NVML P2P status for reads.
    pub nvml_read: Option<P2pStatus>,
    /// NVML P2P status for writes.
    pub nvml_write: Option<P2pStatus>,
    /// NVML P2P status over NVLink.
    pub nvml_nvlink: Option<P2pStatus>,
    /// NVML P2P status for atomics.
    pub nvml_atomics: Option<P2pStatus>,
    /// Topology common ancestor: PIX, PXB, PHB, NODE, SYS (or INTERNAL).
    pub topology: Option<String>,
}
