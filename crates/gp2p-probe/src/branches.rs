//! The published P2P patch branches (PATCH.md) and the architectures each drives: Ampere
//! and Ada from the 550 branches on, Blackwell only on the 575 and later ones (the older
//! branches fail to map peer memory on 5090s). No branch drives a pair of different
//! generations: CUDA refuses those even when patched.
//!
//! The table is data: `data/branches.json` in this crate, one entry per branch with where
//! it was found and when, and the date it was last checked against the published branches
//! ([`TABLE_CHECKED`]). `build.rs` checks it and turns it into the constants here, so a
//! lookup costs nothing and a table that does not hold together does not build. To bring
//! it up to date, edit the file (and the date), then the test that names the date.

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

/// One branch of the patched open kernel modules: an entry of `data/branches.json`, with
/// where it was found.
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
    /// Where it is published: the branch, or the pull request that adds it.
    pub url: &'static str,
    /// When it was published, seen or checked (YYYY-MM-DD), as [`Branch::dated`] says.
    pub date: &'static str,
    /// What [`Branch::date`] is.
    pub dated: Dated,
    /// Where it was found, in words.
    pub evidence: &'static str,
    /// Known only from third parties naming it (notes, write-ups), not from the repository
    /// itself (its refs, pull requests, issues or the branch's README): worth a look at
    /// [`Branch::url`] before building.
    pub third_party_only: bool,
}

/// What a branch's date is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Dated {
    /// When it was published: its pull request, or its head commit.
    Published,
    /// The first dated mention found (an issue, a pull request comment, a note).
    Seen,
    /// Known only as of the table's check ([`TABLE_CHECKED`]).
    Checked,
}

// PATCH_BRANCHES, TABLE_CHECKED, TABLE_NOTE and BRANCH_LISTS, from data/branches.json
// (build.rs checks the file and writes them).
include!(concat!(env!("OUT_DIR"), "/branches.rs"));

/// The experimental branch for cards whose BAR1 cannot hold their VRAM (48 GB 4090s top
/// out at a 32 GiB BAR1): it maps BAR1 per allocation instead of all VRAM at once.
pub const BAR1_PER_ALLOCATION_BRANCH: &str = "590.48.01-p2p-48g";

/// The ordinary branch for driver `version`, if one is published.
pub fn branch_for_version(version: &str) -> Option<&'static Branch> {
    PATCH_BRANCHES.iter().find(|b| b.version == version && !b.per_allocation_bar1)
}

/// The driver version of the newest ordinary branch: where the table ends.
pub fn newest_version() -> &'static str {
    PATCH_BRANCHES.iter().rfind(|b| !b.per_allocation_bar1).map_or("", |b| b.version)
}

/// Whether driver `version` is newer than every branch the table holds: then whether a
/// branch for it exists is not known (one may have been published after the check), and
/// a verdict must not say there is none. `false` for a version that is not dotted numbers.
pub fn past_table(version: &str) -> bool {
    match (numeric(version), numeric(newest_version())) {
        (Some(v), Some(newest)) => v > newest,
        _ => false,
    }
}

/// A driver version's numbers (`570.86.16` → [570, 86, 16]); `None` unless dotted numbers.
fn numeric(version: &str) -> Option<Vec<u32>> {
    version.split('.').map(|p| p.parse().ok()).collect()
}

/// The driver versions whose ordinary branch drives `arch`, oldest first.
pub fn versions_for(arch: Architecture) -> Vec<&'static str> {
    PATCH_BRANCHES
        .iter()
        .filter(|b| !b.per_allocation_bar1 && b.architectures.contains(&arch))
        .map(|b| b.version)
        .collect()
}

/// How many versions a verdict names before it counts the rest: the table holds dozens,
/// and the newest are the ones worth moving to.
const VERSIONS_NAMED: usize = 6;

/// Driver versions (oldest first, as [`versions_for`] gives them) in words, newest first:
/// all of them where they are few, else the newest few and how many there are from the
/// oldest on (PATCH.md lists every one).
pub fn versions_in_words(versions: &[&str]) -> String {
    let newest: Vec<&str> = versions.iter().rev().take(VERSIONS_NAMED).copied().collect();
    let named = match newest.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        _ => newest.concat(),
    };
    match versions.first() {
        Some(oldest) if versions.len() > VERSIONS_NAMED => {
            format!(
                "{named}, the newest {} of the {} from {oldest} on that PATCH.md lists",
                newest.len(),
                versions.len()
            )
        }
        _ => named,
    }
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
    fn the_table_was_last_checked_on_2026_12_06() {
        // Re-check the published branches (PATCH.md names the two lines) before moving
        // this date: verdicts name it, and past it they cannot know.
        assert_eq!(TABLE_CHECKED, "2026-12-06");
        assert!(PATCH_BRANCHES.iter().all(|b| b.date <= TABLE_CHECKED && b.url.starts_with("https://github.com/")));
        assert!(PATCH_BRANCHES.iter().all(|b| b.url.contains(b.line.repository())), "each entry's URL is in its line");
        assert_eq!(BRANCH_LISTS.len(), 2);
        assert!(TABLE_NOTE.contains("one ordinary branch per driver version"));
    }

    #[test]
    fn a_version_past_the_newest_branch_is_past_the_table() {
        assert_eq!(newest_version(), "615.71.09");
        for past in ["625.20.03", "615.71.10", "616", "615.78.08"] {
            assert!(past_table(past), "{past}");
        }
        for inside in ["615.71.09", "610.43.02", "570.195.03", "550.54.14", "", "6x0.1", "not a version"] {
            assert!(!past_table(inside), "{inside:?}");
        }
    }

    #[test]
    fn many_versions_are_named_newest_first_and_counted() {
        assert_eq!(versions_in_words(&["1.0", "2.0"]), "2.0 or 1.0");
        assert_eq!(versions_in_words(&["1.0"]), "1.0");
        assert_eq!(versions_in_words(&[]), "");
        let many = ["1", "2", "3", "4", "5", "6", "7", "8"];
        assert_eq!(versions_in_words(&many), "8, 7, 6, 5, 4 or 3, the newest 6 of the 8 from 1 on that PATCH.md lists");
    }

    #[test]
    fn the_table_reaches_the_610_and_615_branches() {
        // Issue #50: 610.43.02 on two 4090s has a branch, and the newest found is 615.71.09.
        let found = branch_for_version("610.43.02").map(|b| (b.name, b.line, b.third_party_only));
        assert_eq!(found, Some(("610.43.02-p2p", Line::Aikitoria, false)));
        assert_eq!(PATCH_BRANCHES.iter().rfind(|b| !b.per_allocation_bar1).map(|b| b.version), Some("615.71.09"));
        assert!(branch_for_version("615.71.09").is_some_and(|b| b.third_party_only));
        assert!(branch_for_version("560.35.03").is_some_and(|b| b.line == Line::Aikitoria));
    }

    #[test]
    fn blackwell_only_from_575_and_ampere_ada_from_550() {
        let blackwell = versions_for(Architecture::Blackwell);
        assert_eq!(blackwell.first(), Some(&"575.51.02"));
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
