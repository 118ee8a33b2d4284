//! The published P2P patch branches (PATCH.md) and the architectures each drives: Ampere
//! and Ada from the 550 branches on, Blackwell only on the 575 and later ones (the older
//! branches fail to map peer memory on 5090s). No branch drives a pair of different
//! generations: CUDA refuses those even when patched.

use serde::Serialize;

use crate::facts::Architecture;

/// Who publishes a branch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Line {
    /// tinygrad/open-gpu-kernel-modules, the original.
    Tinygrad,
    /// aikitoria/open-gpu-kernel-modules, the maintained line.
    Aikitoria,
}

impl Line {
    /// The repository, as PATCH.md names it.
    pub fn repository(self) -> &'static str {
        match self {
            Line::Tinygrad => "tinygrad/open-gpu-kernel-modules",
            Line::Aikitoria => "aikitoria/open-gpu-kernel-modules",
        }
    }
}

/// One branch of the patched open kernel modules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Branch {
    /// The NVIDIA driver version it patches; the module must be built at exactly this one.
    pub version: &'static str,
    /// The git branch.
    pub name: &'static str,
    /// Who publishes it.
    pub line: Line,
    /// The architectures it drives.
    pub architectures: &'static [Architecture],
    /// Maps BAR1 per allocation instead of all VRAM at once (experimental; for cards whose
    /// BAR1 cannot hold their VRAM). Never offered for an ordinary pair.
    pub per_allocation_bar1: bool,
}

const AMPERE_ADA: &[Architecture] = &[Architecture::Ampere, Architecture::Ada];
const AMPERE_ADA_BLACKWELL: &[Architecture] = &[Architecture::Ampere, Architecture::Ada, Architecture::Blackwell];

const fn branch(
    version: &'static str,
    name: &'static str,
    line: Line,
    architectures: &'static [Architecture],
) -> Branch {
    Branch { version, name, line, architectures, per_allocation_bar1: false }
}

/// Every branch the probe knows, oldest driver first.
pub const PATCH_BRANCHES: &[Branch] = &[
    branch("550.54.15", "550.54.15-p2p", Line::Tinygrad, AMPERE_ADA),
    branch("550.90.07", "550.90.07-p2p", Line::Tinygrad, AMPERE_ADA),
    branch("550.127.08", "550.127.08-p2p", Line::Tinygrad, AMPERE_ADA),
    branch("560.35.03", "560.35.03-p2p", Line::Tinygrad, AMPERE_ADA),
    branch("565.57.01", "565.57.01-p2p", Line::Tinygrad, AMPERE_ADA),
    branch("565.77", "565.77-p2p", Line::Aikitoria, AMPERE_ADA),
    branch("570.86.16", "570.86.16-p2p", Line::Aikitoria, AMPERE_ADA),
    branch("570.148.08", "570.148.08-p2p", Line::Tinygrad, AMPERE_ADA),
    branch("575.64.05", "575.64.05-p2p", Line::Aikitoria, AMPERE_ADA_BLACKWELL),
    branch("580.82.09", "580.82.09-p2p", Line::Aikitoria, AMPERE_ADA_BLACKWELL),
    branch("580.95.05", "580.95.05-p2p", Line::Aikitoria, AMPERE_ADA_BLACKWELL),
    branch("590.48.01", "590.48.01-p2p", Line::Aikitoria, AMPERE_ADA_BLACKWELL),
    Branch {
        version: "590.48.01",
        name: BAR1_PER_ALLOCATION_BRANCH,
        line: Line::Aikitoria,
        architectures: &[Architecture::Ada],
        per_allocation_bar1: true,
    },
    branch("595.58.03", "595.58.03-p2p", Line::Aikitoria, AMPERE_ADA_BLACKWELL),
    branch("595.71.05", "595.71.05-p2p", Line::Aikitoria, AMPERE_ADA_BLACKWELL),
];

/// The experimental branch for cards whose BAR1 cannot hold their VRAM (48 GB 4090s top
/// out at a 32 GiB BAR1): it maps BAR1 per allocation instead of all VRAM at once.
pub const BAR1_PER_ALLOCATION_BRANCH: &str = "590.48.01-p2p-48g";

/// The ordinary branch for driver `version`, if one is published.
pub fn branch_for_version(version: &str) -> Option<&'static Branch> {
    PATCH_BRANCHES.iter().find(|b| b.version == version && !b.per_allocation_bar1)
}

/// The driver versions whose ordinary branch drives `arch`, oldest first.
pub fn versions_for(arch: Architecture) -> Vec<&'static str> {
    PATCH_BRANCHES
        .iter()
        .filter(|b| !b.per_allocation_bar1 && b.architectures.contains(&arch))
        .map(|b| b.version)
        .collect()
}

/// The architectures some branch drives, as a list in words.
pub fn architectures_driven() -> String {
    let mut archs: Vec<Architecture> = PATCH_BRANCHES.iter().flat_map(|b| b.architectures.iter().copied()).collect();
    archs.sort();
    archs.dedup();
    let names: Vec<&str> = archs.iter().map(|a| a.name()).collect();
    match names.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
        _ => names.concat(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blackwell_only_from_575_and_ampere_ada_from_550() {
        let blackwell = versions_for(Architecture::Blackwell);
        assert_eq!(blackwell.first(), Some(&"575.64.05"));
        assert!(!blackwell.contains(&"570.86.16") && !blackwell.contains(&"570.148.08"));
        for arch in [Architecture::Ampere, Architecture::Ada] {
            assert_eq!(versions_for(arch).first(), Some(&"550.54.15"));
            assert_eq!(versions_for(arch).len(), PATCH_BRANCHES.len() - 1, "every ordinary branch");
        }
        for arch in [Architecture::Older, Architecture::Turing, Architecture::Hopper, Architecture::Newer] {
            assert!(versions_for(arch).is_empty(), "{arch:?}");
        }
        assert_eq!(architectures_driven(), "Ampere, Ada and Blackwell");
    }

    #[test]
    fn one_ordinary_branch_per_version_and_the_48g_variant_apart() {
        let ordinary: Vec<&str> = PATCH_BRANCHES.iter().filter(|b| !b.per_allocation_bar1).map(|b| b.version).collect();
        let numeric = |v: &str| v.split('.').map(|p| p.parse::<u32>().expect("numeric version")).collect::<Vec<_>>();
        for pair in ordinary.windows(2) {
            assert!(
                numeric(pair[0]) < numeric(pair[1]),
                "oldest first, no version twice: {} then {}",
                pair[0],
                pair[1]
            );
        }
        assert_eq!(branch_for_version("590.48.01").map(|b| b.name), Some("590.48.01-p2p"));
        assert!(PATCH_BRANCHES.iter().any(|b| b.name == BAR1_PER_ALLOCATION_BRANCH && b.per_allocation_bar1));
        assert_eq!(branch_for_version("580.159.04"), None);
    }
}
