//! The facts a verdict rests on: plain data, serialisable, every field optional — a
//! missing source lowers what the report can say, it never fails it.

use serde::{Deserialize, Serialize};

/// Everything the probe learnt about this machine.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Facts {
    /// Machine-wide facts.
    pub host: HostFacts,
    /// One entry per CUDA device, by ordinal.
    pub devices: Vec<DeviceFacts>,
    /// One entry per ordered pair (a, b), a != b.
    pub pairs: Vec<PairFacts>,
    /// Sources that could not be read, in words (e.g. "NVML: library not found").
    pub missing_sources: Vec<String>,
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
    /// `user@host` of the build, when the line has one: NVIDIA's builds say `dvs-builder@…`,
    /// a self-built (possibly patched) module names its builder.
    pub builder: Option<String>,
}

impl KernelModule {
    /// Whether the module was built outside NVIDIA (a self-built or patched module).
    pub fn self_built(&self) -> bool {
        self.builder.as_deref().is_some_and(|b| !b.starts_with("dvs-builder@"))
    }
}

/// What the kernel command line says about the IOMMU.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
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
pub struct HostFacts {
    /// `linux` or `windows` or another OS name.
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

impl HostFacts {
    /// `ForceP2P` from the RegistryDwords, if set there.
    pub fn force_p2p(&self) -> Option<u32> {
        self.registry_dwords.as_deref().and_then(crate::parse::force_p2p)
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
    pub name: String,
    /// UUID (NVML).
    pub uuid: Option<String>,
    /// PCI bus id.
    pub pci_bus_id: String,
    /// Compute capability.
    pub compute_capability: (u32, u32),
    /// Device memory, bytes.
    pub vram_bytes: u64,
    /// BAR1 aperture, bytes (NVML).
    pub bar1_bytes: Option<u64>,
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
}

impl DeviceFacts {
    /// Whether BAR1 can map all of VRAM (the static BAR1 rule: BAR1 − 128 KiB ≥ VRAM rounded
    /// up to 2 MiB). `None` when BAR1 is unknown.
    pub fn bar1_covers_vram(&self) -> Option<bool> {
        const RESERVED: u64 = 128 << 10;
        const ALIGN: u64 = 2 << 20;
        self.bar1_bytes.map(|bar1| bar1.saturating_sub(RESERVED) >= self.vram_bytes.next_multiple_of(ALIGN))
    }

    /// Whether the IOMMU translates this device's DMA. `None` when unknown.
    pub fn iommu_translates(&self) -> Option<bool> {
        self.iommu_group_type.as_deref().map(|t| t.eq_ignore_ascii_case("DMA") || t.eq_ignore_ascii_case("DMA-FQ"))
    }
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
