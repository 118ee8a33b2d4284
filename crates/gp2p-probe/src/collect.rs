//! Gathering facts from every source present: CUDA, NVML, and Linux's /proc and /sys.
//! Each source is optional; what cannot be read is listed in `missing_sources`.

use std::fs;
use std::path::Path;

use gp2p_cuda::{Device, driver_version};
use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::{P2pCapabilitiesIndex, P2pStatus as NvmlStatus, TopologyLevel};
use nvml_wrapper::error::NvmlError;

use crate::acs::{self, Acs};
use crate::facts::{BridgeFacts, DeviceFacts, Facts, HostFacts, P2pStatus, PairFacts, PcieLink};
use crate::parse;
use crate::{Error, Result};

/// Collect the facts of this machine. Fails only without a CUDA driver.
pub fn collect() -> Result<Facts> {
    gather(AskCuda::PerPair)
}

/// Collect every fact but CUDA's per-pair answers, which need each device opened (a CUDA
/// context on every GPU): the facts a copy engine needs at start-up, with CUDA answering
/// for itself at the first copy ([`verdicts_if_on`](crate::verdicts_if_on)). Pairs carry
/// NVML's statuses; `can_access_peer` stays unknown. Fails only without a CUDA driver.
pub fn collect_host() -> Result<Facts> {
    gather(AskCuda::NotPerPair)
}

/// Whether to open every device to ask CUDA about each pair.
#[derive(Clone, Copy, PartialEq, Eq)]
enum AskCuda {
    PerPair,
    NotPerPair,
}

fn gather(ask: AskCuda) -> Result<Facts> {
    // A driver that sees no device is gp2p_cuda's NoDevice (exit 2 and the examples' hint).
    let cuda_driver = driver_version()?;
    let infos = Device::all_info()?;
    let mut facts = Facts {
        host: HostFacts { os: std::env::consts::OS.to_owned(), cuda_driver: Some(cuda_driver), ..HostFacts::default() },
        ..Facts::default()
    };
    facts.devices = infos
        .iter()
        .map(|i| DeviceFacts {
            ordinal: i.ordinal,
            name: i.name.clone(),
            pci_bus_id: i.pci_bus_id.clone(),
            compute_capability: i.compute_capability,
            vram_bytes: i.total_memory as u64,
            ..DeviceFacts::default()
        })
        .collect();
    let opened: Vec<Option<Device>> = match ask {
        AskCuda::PerPair => infos.iter().map(|i| Device::open(i.ordinal).ok()).collect(),
        AskCuda::NotPerPair => infos.iter().map(|_| None).collect(),
    };
    for (a, da) in opened.iter().enumerate() {
        for (b, db) in opened.iter().enumerate() {
            if a == b {
                continue;
            }
            let mut pair = PairFacts { a, b, ..PairFacts::default() };
            if let (Some(da), Some(db)) = (da, db) {
                pair.can_access_peer = da.can_access_peer(db).ok();
                if let Ok(attrs) = da.p2p_attributes(db) {
                    pair.native_atomics = Some(attrs.native_atomics);
                    pair.performance_rank = Some(attrs.performance_rank);
                }
            }
            facts.pairs.push(pair);
        }
    }
    if ask == AskCuda::PerPair && opened.iter().any(Option::is_none) {
        facts.missing_sources.push("CUDA: some devices could not be opened (compute capability below 7.5?)".into());
    }
    nvml_facts(&mut facts);
    linux_facts(&mut facts);
    Ok(facts)
}

/// Read saved facts (the `facts` of a `--json` report, or bare facts), and check that they
/// hold together ([`Facts::check`]).
pub fn load(path: &Path) -> Result<Facts> {
    let err = |reason: String| Error::Facts { path: path.display().to_string(), reason };
    let text = fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
    let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| err(e.to_string()))?;
    let facts = value.get("facts").cloned().unwrap_or(value);
    let facts: Facts = serde_json::from_value(facts).map_err(|e| err(format!("not gp2p probe facts: {e}")))?;
    facts.check().map_err(|reason| Error::Inconsistent { path: path.display().to_string(), reason })?;
    Ok(facts)
}

fn nvml_facts(facts: &mut Facts) {
    let nvml = match Nvml::init() {
        Ok(n) => n,
        Err(e) => {
            facts.missing_sources.push(nvml_missing(&e));
            return;
        }
    };
    facts.host.driver_version = nvml.sys_driver_version().ok();
    let handles: Vec<_> = facts
        .devices
        .iter()
        .map(|d| {
            nvml.device_by_pci_bus_id(d.pci_bus_id.as_str()).or_else(|_| nvml.device_by_index(d.ordinal as u32)).ok()
        })
        .collect();
    for (d, h) in facts.devices.iter_mut().zip(&handles) {
        let Some(h) = h else { continue };
        d.uuid = h.uuid().ok();
        d.bar1_bytes = h.bar1_memory_info().ok().map(|m| m.total);
        d.brand = h.brand().ok().map(|b| format!("{b:?}"));
        d.architecture = h.architecture().ok().map(|a| format!("{a:?}"));
        if let (Ok(cg), Ok(cw), Ok(mg), Ok(mw)) =
            (h.current_pcie_link_gen(), h.current_pcie_link_width(), h.max_pcie_link_gen(), h.max_pcie_link_width())
        {
            d.pcie = Some(PcieLink { current_gen: cg, current_width: cw, max_gen: mg, max_width: mw });
        }
        #[cfg(target_os = "windows")]
        {
            d.driver_model = h.driver_model().ok().map(|m| match m.current {
                nvml_wrapper::enum_wrappers::device::DriverModel::WDDM => "WDDM".to_owned(),
                nvml_wrapper::enum_wrappers::device::DriverModel::WDM => "TCC".to_owned(),
            });
        }
    }
    for pair in &mut facts.pairs {
        let (Some(Some(ha)), Some(Some(hb))) = (handles.get(pair.a), handles.get(pair.b)) else { continue };
        let status = |index| ha.p2p_status(hb, index).ok().map(convert_status);
        pair.nvml_read = status(P2pCapabilitiesIndex::Read);
        pair.nvml_write = status(P2pCapabilitiesIndex::Write);
        pair.nvml_nvlink = status(P2pCapabilitiesIndex::NvLink);
        pair.nvml_atomics = status(P2pCapabilitiesIndex::Atomics);
        #[cfg(target_os = "linux")]
        {
            pair.topology = nvml.topology_common_ancestor(ha, hb).ok().map(|t| topology_code(t).to_owned());
        }
    }
}

/// The PCI bus ids of every card NVML knows (whatever `CUDA_VISIBLE_DEVICES` hides from
/// CUDA) with which the card at `pci_bus_id` has P2P by the driver's word: reads and writes
/// OK, or NVLink OK. `None` where NVML is not there or does not know the card. What a process
/// that sees one card asks about the cards of other processes (the NCCL door's decision).
pub fn nvml_p2p_peers(pci_bus_id: &str) -> Option<Vec<String>> {
    let nvml = Nvml::init().ok()?;
    let own = nvml.device_by_pci_bus_id(pci_bus_id).ok()?;
    let own_bus = own.pci_info().ok()?.bus_id;
    let mut peers = Vec::new();
    for index in 0..nvml.device_count().ok()? {
        let Ok(other) = nvml.device_by_index(index) else { continue };
        let Ok(info) = other.pci_info() else { continue };
        if info.bus_id == own_bus {
            continue;
        }
        let ok = |i| matches!(own.p2p_status(&other, i), Ok(NvmlStatus::Ok));
        if (ok(P2pCapabilitiesIndex::Read) && ok(P2pCapabilitiesIndex::Write)) || ok(P2pCapabilitiesIndex::NvLink) {
            peers.push(info.bus_id);
        }
    }
    Some(peers)
}

/// What NVML would have told.
const NVML_TELLS: &str = "each card's BAR1 size, brand, architecture and PCIe link, and for each pair the driver's P2P status (the reason P2P is off), the atomics status and the topology";

/// The `missing_sources` entry for an NVML that did not start: which of libnvidia-ml's
/// failures it was, what to do, and what NVML would have told.
fn nvml_missing(e: &NvmlError) -> String {
    let what = match e {
        NvmlError::LibloadingError(_) | NvmlError::LibraryNotFound => {
            format!(
                "libnvidia-ml could not be loaded ({e}); install the NVIDIA driver's user-space libraries, or expose libnvidia-ml.so.1 to this container"
            )
        }
        NvmlError::NoPermission => format!("libnvidia-ml refused this user ({e}); run the probe as root"),
        NvmlError::DriverNotLoaded => format!("the NVIDIA kernel driver is not loaded ({e})"),
        _ => format!("libnvidia-ml failed to start ({e})"),
    };
    format!("NVML: {what}; it would have told {NVML_TELLS}")
}

fn convert_status(s: NvmlStatus) -> P2pStatus {
    match s {
        NvmlStatus::Ok => P2pStatus::Ok,
        NvmlStatus::ChipsetNotSupported => P2pStatus::ChipsetNotSupported,
        NvmlStatus::GpuNotSupported => P2pStatus::GpuNotSupported,
        NvmlStatus::IohTopologyNotSupported => P2pStatus::IohTopologyNotSupported,
        NvmlStatus::DisabledByRegkey => P2pStatus::DisabledByRegkey,
        NvmlStatus::NotSupported => P2pStatus::NotSupported,
        NvmlStatus::Unknown => P2pStatus::Unknown,
    }
}

/// nvidia-smi's names for the topology levels.
pub fn topology_code(level: TopologyLevel) -> &'static str {
    match level {
        TopologyLevel::Internal => "INTERNAL",
        TopologyLevel::Single => "PIX",
        TopologyLevel::Multiple => "PXB",
        TopologyLevel::HostBridge => "PHB",
        TopologyLevel::Node => "NODE",
        TopologyLevel::System => "SYS",
    }
}

fn linux_facts(facts: &mut Facts) {
    if !cfg!(target_os = "linux") {
        return;
    }
    match fs::read_to_string("/proc/driver/nvidia/version") {
        Ok(text) => facts.host.kernel_module = parse::kernel_module(&text),
        Err(e) => facts.missing_sources.push(unreadable("/proc/driver/nvidia/version", &e)),
    }
    match fs::read_to_string("/proc/cmdline") {
        Ok(text) => facts.host.iommu_cmdline = Some(parse::iommu_cmdline(&text)),
        Err(e) => facts.missing_sources.push(unreadable("/proc/cmdline", &e)),
    }
    if let Ok(text) = fs::read_to_string("/proc/driver/nvidia/params") {
        facts.host.registry_dwords = parse::registry(&text);
    }
    facts.host.virtual_machine = virtual_machine();
    let kernel = fs::read_to_string("/proc/sys/kernel/osrelease").ok().and_then(|t| parse::kernel_release(&t));
    for d in &mut facts.devices {
        d.iommu_group_type = iommu_group_type(&d.pci_bus_id);
        d.bar1_sizes = bar1_sizes(&d.pci_bus_id, kernel, &mut facts.missing_sources);
        place(Path::new(SYS_PCI_DEVICES), d, &mut facts.missing_sources);
    }
    facts.bridges = bridges(Path::new(SYS_PCI_DEVICES), &facts.devices, &mut facts.missing_sources);
}

/// Every bridge on the cards' PCI paths (between the root bus and the card), once each,
/// with its ACS from its sysfs `config` (`devices`: the PCI devices by bus id). What needs
/// root (the kernel shows other users 64 or 256 of the 4096 bytes) or cannot be read is
/// recorded as such, and summed up in `missing`.
fn bridges(devices: &Path, cards: &[DeviceFacts], missing: &mut Vec<String>) -> Vec<BridgeFacts> {
    let mut found: Vec<BridgeFacts> = Vec::new();
    for path in cards.iter().filter_map(|d| d.pci_path.as_deref()) {
        for bdf in path.get(1..path.len().saturating_sub(1)).unwrap_or(&[]) {
            if found.iter().any(|b| &b.bdf == bdf) {
                continue;
            }
            let acs = match fs::read(devices.join(bdf).join("config")) {
                Ok(bytes) => acs::parse_config(&bytes),
                Err(e) => Acs::Unreadable { reason: unreadable(&format!("{bdf}/config"), &e) },
            };
            found.push(BridgeFacts { bdf: bdf.clone(), acs });
        }
    }
    let needs_root: Vec<&str> =
        found.iter().filter(|b| matches!(b.acs, Acs::NeedsRoot { .. })).map(|b| b.bdf.as_str()).collect();
    if !needs_root.is_empty() {
        missing.push(format!(
            "ACS of the bridges between the cards ({}): the kernel shows their extended config space only to root (run the probe as root to read it)",
            needs_root.join(", ")
        ));
    }
    for b in &found {
        if let Acs::Unreadable { reason } = &b.acs {
            missing.push(format!("ACS of bridge {}: {reason}", b.bdf));
        }
    }
    found
}

/// Where sysfs lists PCI devices by bus id.
const SYS_PCI_DEVICES: &str = "/sys/bus/pci/devices";

/// Where a card sits in the host, from sysfs (`devices`, the PCI devices by bus id): its
/// NUMA node, its local CPUs and its path through the PCI tree (root complex, root port,
/// switch ports). What cannot be read stays unknown and is added to `missing`: the topology
/// then says less, and NVML's per-pair level fills in where it can.
fn place(devices: &Path, d: &mut DeviceFacts, missing: &mut Vec<String>) {
    let dev = devices.join(d.pci_bus_id.to_ascii_lowercase());
    if !dev.exists() {
        missing.push(format!(
            "{}: absent; where device {} sits in the host (NUMA node, PCI path) is unknown",
            dev.display(),
            d.ordinal
        ));
        return;
    }
    let mut read = |name: &str| {
        let file = dev.join(name);
        fs::read_to_string(&file).map_err(|e| missing.push(unreadable(&file.display().to_string(), &e))).ok()
    };
    d.numa_node = read("numa_node").and_then(|t| parse::numa_node(&t));
    d.local_cpulist = read("local_cpulist").map(|t| t.trim().to_owned()).filter(|t| !t.is_empty());
    d.pci_path = match fs::canonicalize(&dev) {
        Ok(p) => parse::pci_path(&p.to_string_lossy()),
        Err(e) => {
            missing.push(unreadable(&dev.display().to_string(), &e));
            None
        }
    };
}

/// The first kernel whose sysfs lists the sizes of every resizable BAR (`resource<N>_resize`).
const REBAR_SYSFS_KERNEL: (u32, u32) = (6, 1);

/// The BAR1 sizes a PCI device's Resizable BAR capability offers, from sysfs: empty when the
/// file is absent on a kernel that lists every resizable BAR (the card has none); `None`
/// when sysfs cannot tell, with the reason added to `missing`.
fn bar1_sizes(bus_id: &str, kernel: Option<(u32, u32)>, missing: &mut Vec<String>) -> Option<Vec<u64>> {
    let dev = Path::new("/sys/bus/pci/devices").join(bus_id.to_ascii_lowercase());
    if !dev.exists() {
        return None;
    }
    let file = dev.join("resource1_resize");
    match fs::read_to_string(&file) {
        Ok(text) => parse::rebar_sizes(&text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if kernel.is_some_and(|k| k >= REBAR_SYSFS_KERNEL) {
                return Some(Vec::new());
            }
            missing.push(format!(
                "{}: absent, and this kernel ({}) may predate it (Linux 6.1); the BAR1 sizes the card offers are unknown",
                file.display(),
                kernel.map_or("version unknown".into(), |(major, minor)| format!("{major}.{minor}"))
            ));
            None
        }
        Err(e) => {
            missing.push(unreadable(&file.display().to_string(), &e));
            None
        }
    }
}

/// The `missing_sources` entry for a file that could not be read; root is suggested only
/// where root would help (permission denied).
fn unreadable(path: &str, e: &std::io::Error) -> String {
    if e.kind() == std::io::ErrorKind::PermissionDenied {
        format!("{path}: permission denied (run the probe as root to read it)")
    } else {
        format!("{path}: {e}")
    }
}

/// The IOMMU group type of a PCI device, "none" when it has no group (no IOMMU), `None`
/// when sysfs cannot tell.
fn iommu_group_type(bus_id: &str) -> Option<String> {
    let dev = Path::new("/sys/bus/pci/devices").join(bus_id.to_ascii_lowercase());
    if !dev.exists() {
        return None;
    }
    let group = dev.join("iommu_group");
    if !group.exists() {
        return Some("none".into());
    }
    fs::read_to_string(group.join("type")).ok().map(|t| t.trim().to_owned())
}

/// Whether the CPU reports a hypervisor, and the machine's product name when DMI has one.
fn virtual_machine() -> Option<String> {
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").ok()?;
    let flagged = cpuinfo.lines().any(|l| l.starts_with("flags") && l.split_whitespace().any(|w| w == "hypervisor"));
    if !flagged {
        return None;
    }
    let product = ["/sys/class/dmi/id/product_name", "/sys/class/dmi/id/sys_vendor"]
        .iter()
        .find_map(|p| fs::read_to_string(p).ok().map(|s| s.trim().to_owned()).filter(|s| !s.is_empty()));
    Some(product.unwrap_or_else(|| "hypervisor flag set".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvml_statuses_map_to_nvidia_smi_codes() {
        let codes: Vec<&str> = [
            NvmlStatus::Ok,
            NvmlStatus::ChipsetNotSupported,
            NvmlStatus::GpuNotSupported,
            NvmlStatus::IohTopologyNotSupported,
            NvmlStatus::DisabledByRegkey,
            NvmlStatus::NotSupported,
            NvmlStatus::Unknown,
        ]
        .into_iter()
        .map(|s| convert_status(s).code())
        .collect();
        assert_eq!(codes, ["OK", "CNS", "GNS", "TNS", "DR", "NS", "U"]);
    }

    #[test]
    fn topology_levels_use_nvidia_smi_names() {
        let names: Vec<&str> = [
            TopologyLevel::Internal,
            TopologyLevel::Single,
            TopologyLevel::Multiple,
            TopologyLevel::HostBridge,
            TopologyLevel::Node,
            TopologyLevel::System,
        ]
        .into_iter()
        .map(topology_code)
        .collect();
        assert_eq!(names, ["INTERNAL", "PIX", "PXB", "PHB", "NODE", "SYS"]);
    }

    #[test]
    fn a_missing_nvml_names_itself_and_what_it_would_have_told() {
        let loading = nvml_missing(&NvmlError::LibraryNotFound);
        assert!(loading.starts_with("NVML: libnvidia-ml could not be loaded"), "{loading}");
        assert!(loading.contains("BAR1 size") && loading.contains("atomics status") && !loading.contains("root"));
        assert!(nvml_missing(&NvmlError::NoPermission).contains("run the probe as root"));
        assert!(!nvml_missing(&NvmlError::DriverNotLoaded).contains("root"));
        let denied = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        assert!(unreadable("/proc/cmdline", &denied).contains("run the probe as root"));
        let absent = std::io::Error::from(std::io::ErrorKind::NotFound);
        assert!(!unreadable("/proc/driver/nvidia/version", &absent).contains("root"));
    }

    #[test]
    fn where_a_card_sits_names_what_could_not_be_read() {
        let devices = std::env::temp_dir().join(format!("gp2p-probe-place-{}", std::process::id()));
        let dev = devices.join("0000:41:00.0");
        fs::create_dir_all(&dev).unwrap();
        fs::write(dev.join("numa_node"), "1\n").unwrap();
        let mut missing = Vec::new();
        // The card's directory without local_cpulist: that file is named.
        let mut d = DeviceFacts { ordinal: 0, pci_bus_id: "0000:41:00.0".into(), ..DeviceFacts::default() };
        place(&devices, &mut d, &mut missing);
        assert_eq!((d.numa_node, d.local_cpulist.as_deref()), (Some(1), None));
        assert_eq!(missing.len(), 1, "{missing:?}");
        assert!(missing[0].contains("0000:41:00.0/local_cpulist"), "{missing:?}");
        // A card sysfs does not list at all: one entry, naming the card.
        let mut d = DeviceFacts { ordinal: 1, pci_bus_id: "0000:81:00.0".into(), ..DeviceFacts::default() };
        place(&devices, &mut d, &mut missing);
        assert!(missing[1].contains("0000:81:00.0: absent; where device 1 sits"), "{missing:?}");
        assert_eq!((d.numa_node, d.pci_path), (None, None));
        fs::remove_dir_all(&devices).unwrap();
    }

    #[test]
    fn bridge_acs_is_read_from_config_or_named_as_needing_root() {
        let devices = std::env::temp_dir().join(format!("gp2p-probe-bridges-{}", std::process::id()));
        let mut full = vec![0u8; acs::CONFIG_BYTES];
        full[0x100..0x104].copy_from_slice(&0x0001_000Du32.to_le_bytes());
        full[0x104..0x106].copy_from_slice(&0x005fu16.to_le_bytes());
        full[0x106..0x108].copy_from_slice(&0x001du16.to_le_bytes());
        for (bdf, bytes) in [("0000:02:08.0", full.clone()), ("0000:02:10.0", full[..64].to_vec())] {
            fs::create_dir_all(devices.join(bdf)).unwrap();
            fs::write(devices.join(bdf).join("config"), bytes).unwrap();
        }
        let card = |ordinal, port: &str, bus: &str| DeviceFacts {
            ordinal,
            pci_path: Some(["pci0000:00", "0000:00:01.0", "0000:01:00.0", port, bus].map(String::from).to_vec()),
            ..DeviceFacts::default()
        };
        let mut missing = Vec::new();
        let found = bridges(
            &devices,
            &[card(0, "0000:02:08.0", "0000:03:00.0"), card(1, "0000:02:10.0", "0000:04:00.0")],
            &mut missing,
        );
        let bdfs: Vec<&str> = found.iter().map(|b| b.bdf.as_str()).collect();
        assert_eq!(
            bdfs,
            ["0000:00:01.0", "0000:01:00.0", "0000:02:08.0", "0000:02:10.0"],
            "each once, root bus and cards left out"
        );
        assert_eq!(found[2].acs, Acs::Read { offset: 0x100, capability: 0x5f, control: 0x1d });
        assert_eq!(found[3].acs, Acs::NeedsRoot { bytes: 64 });
        assert!(
            matches!(&found[0].acs, Acs::Unreadable { reason } if reason.contains("0000:00:01.0/config")),
            "{:?}",
            found[0]
        );
        assert!(missing[0].contains("(0000:02:10.0)") && missing[0].contains("run the probe as root"), "{missing:?}");
        assert!(missing[1].starts_with("ACS of bridge 0000:00:01.0: "), "{missing:?}");
        fs::remove_dir_all(&devices).unwrap();
    }

    #[test]
    fn saved_facts_load_bare_or_inside_a_report() {
        let dir = std::env::temp_dir().join(format!("gp2p-probe-load-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let facts = Facts { host: HostFacts { os: "linux".into(), ..HostFacts::default() }, ..Facts::default() };
        let bare = dir.join("bare.json");
        fs::write(&bare, serde_json::to_string(&facts).unwrap()).unwrap();
        assert_eq!(load(&bare).unwrap(), facts);
        let bad = dir.join("bad.json");
        fs::write(&bad, "{\"rows\": []}").unwrap();
        assert!(load(&bad).is_err_and(|e| e.to_string().contains("not gp2p probe facts")));
        assert!(load(&dir.join("missing.json")).is_err());
        fs::remove_dir_all(&dir).unwrap();
    }
}
