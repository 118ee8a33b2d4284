//! What this rank brings to the rendezvous: its host, its `GP2P_NCCL`, whether it can load the
//! real NCCL, and its device (the calling thread's current CUDA device, as NCCL takes it)
//! with the devices it reaches by P2P that is on and safe. Read without opening any device:
//! CUDA answers from its device handles, the probe from NVML, `/proc` and `/sys`.

use std::collections::HashSet;
use std::sync::OnceLock;

use geforce_p2p::Device;

use crate::decision::{DEFAULT_HARDWARE_QUEUES, DeviceFacts, MAX_HARDWARE_QUEUES, RankFacts};
use crate::env::Mode;

/// This rank's facts, and the CUDA ordinal of its device where it has one: `ordinal`, or the
/// calling thread's current device.
pub fn local(rank: usize, nranks: usize, mode: Mode, ordinal: Option<usize>) -> (RankFacts, Option<usize>) {
    let device = device(ordinal);
    let ordinal = device.as_ref().ok().map(|(o, _)| *o);
    let facts = RankFacts {
        rank,
        nranks,
        host: geforce_p2p::comm::host_id(),
        process: geforce_p2p::comm::process_id(),
        hardware_queues: hardware_queues(
            std::env::var(HARDWARE_QUEUES_VAR).ok().as_deref(),
            geforce_p2p::comm::mps_serves(),
        ),
        mode,
        door_version: env!("CARGO_PKG_VERSION").to_owned(),
        device: device.map(|(_, d)| d),
        // A rank that hands over by its own choice must have one; loading it costs no GPU.
        real_nccl: crate::real::real().is_ok(),
    };
    (facts, ordinal)
}

/// The variable that sets how many hardware queues CUDA gives this process on each device.
pub const HARDWARE_QUEUES_VAR: &str = "CUDA_DEVICE_MAX_CONNECTIONS";

/// The hardware queues CUDA gives a process whose [`HARDWARE_QUEUES_VAR`] is `value`, served
/// by an MPS daemon where `mps`: the number asked for within what CUDA takes (1 to 32); where
/// unset or unreadable, CUDA's default, or `None` under MPS, whose server deals out a share
/// of one pool the door cannot read.
pub fn hardware_queues(value: Option<&str>, mps: bool) -> Option<usize> {
    match value.map(str::trim).and_then(|v| v.parse::<usize>().ok()) {
        Some(queues) => Some(queues.clamp(1, MAX_HARDWARE_QUEUES)),
        None if mps => None,
        None => Some(DEFAULT_HARDWARE_QUEUES),
    }
}

/// Device `ordinal` (else the current one), as the decision needs it.
fn device(ordinal: Option<usize>) -> Result<(usize, DeviceFacts), String> {
    let ordinal = match ordinal {
        Some(o) => o,
        // No context current: device 0, as the CUDA runtime's default device.
        None => Device::current_ordinal().map_err(|e| e.to_string())?.unwrap_or(0),
    };
    let all = Device::all_info().map_err(|e| e.to_string())?;
    let own = all
        .iter()
        .find(|d| d.ordinal == ordinal)
        .ok_or_else(|| format!("the current device {ordinal} is not among the {} CUDA devices visible", all.len()))?;
    let runs_communicator = own.ptx_target().is_ok_and(|t| t.runs_line_exchange());
    let distrusted = distrusted_pairs();
    let own_bus = canonical_bus_id(&own.pci_bus_id);
    let mut p2p_with = Vec::new();
    for other in all.iter().filter(|d| d.ordinal != ordinal) {
        let bus = canonical_bus_id(&other.pci_bus_id);
        let on = Device::can_access_peer_ordinals(ordinal, other.ordinal).map_err(|e| e.to_string())?;
        if on && !distrusted.contains(&(own_bus.clone(), bus.clone())) {
            p2p_with.push(bus);
        }
    }
    // Cards CUDA_VISIBLE_DEVICES hides from this process (each rank seeing its own card only,
    // as some launchers set it): the driver's word through NVML, which sees every card.
    for bus in geforce_p2p::probe::nvml_p2p_peers(&own.pci_bus_id).unwrap_or_default() {
        let bus = canonical_bus_id(&bus);
        let hidden = !all.iter().any(|d| canonical_bus_id(&d.pci_bus_id) == bus);
        if hidden && !p2p_with.contains(&bus) {
            p2p_with.push(bus);
        }
    }
    Ok((ordinal, DeviceFacts { pci_bus_id: own_bus, name: own.name.clone(), runs_communicator, p2p_with }))
}

/// A PCI bus id as `dddd:bb:dd.f` in lowercase hex, however it was written: CUDA writes
/// `0000:C1:00.0`, NVML `00000000:C1:00.0`. The text as given where it does not parse.
pub fn canonical_bus_id(id: &str) -> String {
    let parse = || -> Option<String> {
        let (domain, rest) = id.trim().split_once(':')?;
        let (bus, rest) = rest.split_once(':')?;
        let (device, function) = rest.split_once('.')?;
        let hex = |s: &str| u32::from_str_radix(s, 16).ok();
        Some(format!("{:04x}:{:02x}:{:02x}.{:x}", hex(domain)?, hex(bus)?, hex(device)?, hex(function)?))
    };
    parse().unwrap_or_else(|| id.trim().to_ascii_lowercase())
}

/// The ordered pairs of devices (by canonical bus id) whose P2P the probe finds unsafe or
/// unchecked were it on: a BAR1 smaller than VRAM, a translating IOMMU. P2P there is not
/// usable, whatever CUDA says, as the copy engine treats it (`geforce_p2p::guard_peer_routes`).
fn distrusted_pairs() -> HashSet<(String, String)> {
    static PAIRS: OnceLock<HashSet<(String, String)>> = OnceLock::new();
    PAIRS
        .get_or_init(|| {
            let Ok(facts) = geforce_p2p::probe::collect_host() else {
                return HashSet::new();
            };
            let bus = |ordinal: usize| facts.device(ordinal).map(|d| canonical_bus_id(&d.pci_bus_id));
            geforce_p2p::probe::verdicts_if_on(&facts)
                .iter()
                .filter(|v| v.peer_distrust().is_some())
                .filter_map(|v| Some((bus(v.a)?, bus(v.b)?)))
                .collect()
        })
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_from_cuda_and_nvml_compare_equal() {
        assert_eq!(canonical_bus_id("0000:C1:00.0"), "0000:c1:00.0");
        assert_eq!(canonical_bus_id("00000000:C1:00.0"), "0000:c1:00.0");
        assert_eq!(canonical_bus_id(" 0001:02:1F.3 "), "0001:02:1f.3");
        assert_eq!(canonical_bus_id("not a bus"), "not a bus");
    }

    #[test]
    fn hardware_queues_are_cuda_s_default_unless_set_and_within_its_range() {
        assert_eq!(hardware_queues(None, false), Some(8));
        assert_eq!(hardware_queues(Some("32"), false), Some(32));
        assert_eq!(hardware_queues(Some(" 1 "), false), Some(1));
        assert_eq!(hardware_queues(Some("0"), false), Some(1));
        assert_eq!(hardware_queues(Some("64"), false), Some(32));
        assert_eq!(hardware_queues(Some("many"), false), Some(8));
    }

    #[test]
    fn under_mps_only_queues_asked_for_are_known() {
        assert_eq!(hardware_queues(None, true), None);
        assert_eq!(hardware_queues(Some("many"), true), None);
        assert_eq!(hardware_queues(Some("32"), true), Some(32));
    }
}
