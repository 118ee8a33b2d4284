//! Who runs a communicator: the door or the real NCCL, decided once, from the facts every
//! rank brings to the rendezvous, by the same pure function on every rank's behalf (the
//! rendezvous runs it once and sends everyone the answer). Served: every rank on one host, at
//! most [`MAX_RANKS`] of them, each on a device the communicator runs on, and no pair of their
//! devices with usable P2P (`GP2P_NCCL=force` skips that last test). Otherwise handed over,
//! for the communicator's whole life. Ranks that are threads of one process on one device,
//! which the real NCCL does not take, fail instead where their streams would share the
//! device's hardware queues ([`decide`]).

use serde::{Deserialize, Serialize};

use crate::env::Mode;

/// The most ranks a served communicator takes (the communicator's own limit).
pub const MAX_RANKS: usize = geforce_p2p::comm::MAX_RANKS;

/// The streams each rank's calls run on (the communicator's).
const STREAMS_PER_RANK: usize = geforce_p2p::comm::STREAMS_PER_RANK;

/// The most hardware queues CUDA gives a process on a device (`CUDA_DEVICE_MAX_CONNECTIONS`'
/// ceiling), and what it gives unless told.
pub const MAX_HARDWARE_QUEUES: usize = 32;
/// See [`MAX_HARDWARE_QUEUES`].
pub const DEFAULT_HARDWARE_QUEUES: usize = 8;

/// What one rank tells the rendezvous about itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankFacts {
    /// Its rank.
    pub rank: usize,
    /// The world size it was given.
    pub nranks: usize,
    /// Its host (`gp2p_comm::host_id`).
    pub host: String,
    /// Its process on that host (`gp2p_comm::process_id`): ranks that are threads of one
    /// process share it (empty, from a door that did not say: a process of its own).
    #[serde(default)]
    pub process: String,
    /// The hardware queues its process gets on each device (`CUDA_DEVICE_MAX_CONNECTIONS`
    /// as the door read it when the communicator was made); `None` where an MPS daemon serves
    /// the process and the variable is unset, so the server deals them out unknown.
    #[serde(default = "default_hardware_queues")]
    pub hardware_queues: Option<usize>,
    /// Its `GP2P_NCCL`.
    pub mode: Mode,
    /// The door's version it runs (every rank must run the same).
    pub door_version: String,
    /// Its device, or why it has none the door can use.
    pub device: Result<DeviceFacts, String>,
    /// Whether it could load the real NCCL.
    pub real_nccl: bool,
}

/// A rank's device, as the decision needs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceFacts {
    /// PCI bus id, lowercase `dddd:bb:dd.f`: what names one device across processes whose
    /// CUDA ordinals differ.
    pub pci_bus_id: String,
    /// The device's name, for messages.
    pub name: String,
    /// Whether the communicator runs on it (the kernels' compute_80 build: Ampere and newer).
    pub runs_communicator: bool,
    /// The bus ids of the other devices it reaches by P2P that is on and safe.
    pub p2p_with: Vec<String>,
}

/// The outcome for a communicator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Decision {
    /// The door runs it.
    Serve {
        /// Why, for the log line.
        reason: String,
    },
    /// The real NCCL runs it.
    HandOver {
        /// Why, for the log line.
        reason: String,
    },
}

fn default_hardware_queues() -> Option<usize> {
    Some(DEFAULT_HARDWARE_QUEUES)
}

/// Check that `facts` describe one communicator (every rank of it once, the same world size
/// and door version), then decide it. `maker_has_real`: the process that made the unique id
/// loads the real NCCL, which makes a hand-over's real id; `maker_host`: the host of the process that made the id, where a served
/// communicator's shared memory is made (`None`: made by the ranks themselves).
///
/// # Errors
/// A message for every rank where the facts disagree; where ranks that are threads of one
/// process on one device would share its hardware queues (the message says which variable to
/// set); or where the communicator must go to the real NCCL and a rank (or the process that made the id) has none.
pub fn decide(facts: &[RankFacts], maker_has_real: bool, maker_host: Option<&str>) -> Result<Decision, String> {
    check_consistent(facts)?;
    // In rank order, so the reason names the same ranks whatever order they arrived in.
    let mut facts = facts.to_vec();
    facts.sort_by_key(|f| f.rank);
    let decision = decide_consistent(&facts, maker_host)?;
    if let Decision::HandOver { reason } = &decision {
        let lacking: Vec<usize> = facts.iter().filter(|f| !f.real_nccl).map(|f| f.rank).collect();
        if !maker_has_real || !lacking.is_empty() {
            let who = if lacking.is_empty() {
                String::from("the process that made the unique id could not load it")
            } else {
                format!("rank(s) {} cannot load it", join(&lacking))
            };
            return Err(format!(
                "this communicator must run on the real NCCL ({reason}), but {who}: install NCCL (pip install nvidia-nccl-cu12 or -cu13) or name its libnccl.so.2 in GP2P_NCCL_REAL"
            ));
        }
    }
    Ok(decision)
}

fn check_consistent(facts: &[RankFacts]) -> Result<(), String> {
    let Some(first) = facts.first() else {
        return Err(String::from("no rank arrived"));
    };
    let world = first.nranks;
    if let Some(other) = facts.iter().find(|f| f.nranks != world) {
        return Err(format!(
            "rank {} was created with nranks={} and rank {} with nranks={world}: every rank must pass the same nranks",
            other.rank, other.nranks, first.rank
        ));
    }
    if let Some(other) = facts.iter().find(|f| f.door_version != first.door_version) {
        return Err(format!(
            "rank {} runs the NCCL door of geforce-p2p {} and rank {} runs {}: every rank must load the same geforce-p2p",
            other.rank, other.door_version, first.rank, first.door_version
        ));
    }
    let mut seen = vec![false; world];
    for f in facts {
        match seen.get_mut(f.rank) {
            None => return Err(format!("rank {} is not below nranks={world}", f.rank)),
            Some(true) => return Err(format!("two processes joined as rank {}: every rank must be unique", f.rank)),
            Some(s) => *s = true,
        }
    }
    if facts.len() != world {
        let missing: Vec<usize> = (0..world).filter(|&r| !seen[r]).collect();
        return Err(format!("rank(s) {} did not arrive", join(&missing)));
    }
    Ok(())
}

/// [`decide`] of facts already checked to be one whole communicator.
fn decide_consistent(facts: &[RankFacts], maker_host: Option<&str>) -> Result<Decision, String> {
    let hand_over = |reason: String| Ok(Decision::HandOver { reason });
    let world = facts.len();
    if let Some(off) = facts.iter().find(|f| f.mode == Mode::Off) {
        return hand_over(format!("GP2P_NCCL=off on rank {}", off.rank));
    }
    if world > MAX_RANKS {
        return hand_over(format!("{world} ranks; the door serves up to {MAX_RANKS}"));
    }
    let mut hosts: Vec<&str> = facts.iter().map(|f| f.host.as_str()).collect();
    hosts.sort_unstable();
    hosts.dedup();
    if hosts.len() > 1 {
        return hand_over(format!("its {world} ranks run on {} hosts", hosts.len()));
    }
    if maker_host.is_some_and(|maker| hosts.first().is_some_and(|&h| h != maker)) {
        return hand_over(String::from("its ranks run on another host than the process that made the unique id"));
    }
    let mut devices = Vec::with_capacity(world);
    for f in facts {
        match &f.device {
            Err(why) => return hand_over(format!("rank {} has no device the door can use: {why}", f.rank)),
            Ok(d) if !d.runs_communicator => {
                return hand_over(format!(
                    "rank {}'s {} ({}) is older than the Ampere cards the door's communicator runs on",
                    f.rank, d.name, d.pci_bus_id
                ));
            }
            Ok(d) => devices.push((f.rank, d)),
        }
    }
    // Not handed over: the real NCCL refuses ranks that share a device.
    if let Some(problem) = crowded_context(facts) {
        return Err(problem);
    }
    let forced = facts.iter().find(|f| f.mode == Mode::Force);
    if let Some(f) = forced {
        return Ok(Decision::Serve { reason: format!("GP2P_NCCL=force on rank {}", f.rank) });
    }
    for (i, (rank_a, a)) in devices.iter().enumerate() {
        for (rank_b, b) in &devices[i + 1..] {
            let linked = a.pci_bus_id != b.pci_bus_id
                && (a.p2p_with.contains(&b.pci_bus_id) || b.p2p_with.contains(&a.pci_bus_id));
            if linked {
                return hand_over(format!(
                    "ranks {rank_a} and {rank_b} have P2P between {} and {}",
                    a.pci_bus_id, b.pci_bus_id
                ));
            }
        }
    }
    let mut buses: Vec<&str> = devices.iter().map(|(_, d)| d.pci_bus_id.as_str()).collect();
    buses.sort_unstable();
    buses.dedup();
    let reason = match (world, buses.len()) {
        (1, _) => String::from("one rank"),
        (_, 1) => format!("its {world} ranks share one device"),
        (_, n) => format!("no pair of its {n} devices has usable P2P"),
    };
    Ok(Decision::Serve { reason })
}

/// What keeps ranks that are threads of one process on one device from being served, if
/// anything does. They share the device's context, whose hardware queues the driver deals out
/// to streams in turn; where two ranks' streams share a queue, one rank's kernel waiting for a
/// peer may sit ahead of the very work that peer waits on (the likely reason 4 ranks as
/// threads of nccl-tests hung on one H100 with the default 8 queues, and 2 ranks under an MPS
/// daemon with the variable unset). So each of their streams should get a queue, and one is
/// left for the program; under MPS, whose server deals out queues from one pool, only a number
/// the program asked for counts. Ranks from a door that did not name its process are taken as
/// processes of their own.
fn crowded_context(facts: &[RankFacts]) -> Option<String> {
    let mut groups: Vec<(&str, &str, Vec<usize>, Option<usize>)> = Vec::new();
    for f in facts.iter().filter(|f| !f.process.is_empty()) {
        let Ok(device) = &f.device else { continue };
        let key = (f.process.as_str(), device.pci_bus_id.as_str());
        match groups.iter_mut().find(|g| (g.0, g.1) == key) {
            Some(group) => {
                group.2.push(f.rank);
                // `None`, an MPS server's unknown share, is the least.
                group.3 = group.3.min(f.hardware_queues);
            }
            None => groups.push((key.0, key.1, vec![f.rank], f.hardware_queues)),
        }
    }
    groups.into_iter().find_map(|(_, bus, ranks, queues)| {
        let streams = ranks.len() * STREAMS_PER_RANK;
        let needed = streams + 1;
        if ranks.len() < 2 || queues.is_some_and(|q| q >= needed) {
            return None;
        }
        let ranks = join(&ranks);
        let given = match queues {
            Some(q) => format!("CUDA_DEVICE_MAX_CONNECTIONS gave the process {q}"),
            None => String::from(
                "an MPS daemon serves the process and deals out the queues itself, as CUDA_DEVICE_MAX_CONNECTIONS is unset or not a number",
            ),
        };
        let fix = match queues {
            Some(_) => format!(
                "set CUDA_DEVICE_MAX_CONNECTIONS={MAX_HARDWARE_QUEUES} before CUDA starts (python -m geforce_p2p.nccl does where no MPS daemon serves the command)"
            ),
            None => format!(
                "set CUDA_DEVICE_MAX_CONNECTIONS={MAX_HARDWARE_QUEUES} for this program (only where few processes share the daemon: its clients draw on one pool), stop the MPS daemon"
            ),
        };
        Some(format!(
            "ranks {ranks} are threads of one process on {bus}, whose {streams} streams and the program's want {needed} hardware queues, and {given} (where two ranks' streams share a queue, their waiting kernels can deadlock): {fix}, or run one process per rank; the real NCCL does not take ranks that share a device"
        ))
    })
}

fn join(ranks: &[usize]) -> String {
    ranks.iter().map(usize::to_string).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests;
