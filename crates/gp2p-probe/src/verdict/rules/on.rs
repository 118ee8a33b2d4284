//! Rule `on`: CUDA offers P2P. Where an override forces it (the patch, or a ForceP2P key)
//! the driver skipped its own BAR1 and IOMMU checks, so this rule makes them: what makes
//! a pair UNSAFE or OK?, and what undoes the override.

use super::*;

/// Rule `on`: CUDA can access the peer. Where an override forces P2P on (the patch, or a
/// ForceP2P key), the driver skipped its own BAR1 and IOMMU checks, so those are checked
/// here: a failed one makes the pair UNSAFE, an unknown one OK?, and `Route::Auto` copies
/// either staged.
pub(super) fn on(p: &Pair<'_>) -> Option<Verdict> {
    if p.pair.can_access_peer != Some(true) {
        return None;
    }
    let forced = forced(p.facts, p.patch);
    let link = if p.pair.nvml_nvlink == Some(P2pStatus::Ok) {
        Link::NvLink
    } else if forced.is_some() || p.pair.performance_rank.is_some_and(|r| r > 0) {
        Link::PcieBar1
    } else {
        Link::Pcie
    };
    let used = ["cuDeviceCanAccessPeer", "nvml p2p nvlink", "nvml p2p atomics", "kernel module"];
    let over = link_name(link);
    let Some(Forced { certainty, why, by_key }) = forced.filter(|_| link != Link::NvLink) else {
        let mut v = p.off(
            "OK",
            Certainty::Shown,
            format!("CUDA can access the peer (over {over}); the driver's own decision"),
            "nothing to do: geforce-p2p copies by P2P on this pair".into(),
            PatchOutlook::NotNeeded,
            &used,
        );
        v.on = Some(link);
        v.warnings.extend(p.acs_warning().filter(|_| link != Link::NvLink));
        return Some(v);
    };
    let (mut hazards, mut unchecked, mut lacking) = (Vec::new(), Vec::new(), Vec::new());
    let (mut bar1_remedy, mut iommu_remedy) = (None, None);
    let mut branch_remedy = None;
    if let Some(wrong) = p.branch_lacking_arch().filter(|_| !by_key && p.geforce()) {
        hazards
            .push(format!("{wrong}: enabling peer access fails (cudaErrorMapBufferObjectFailed) or copies go wrong"));
        branch_remedy = Some(format!("move to a branch that drives {} cards: {}", p.a.arch().name(), p.versions()));
    }
    for d in p.devices() {
        match d.bar1_covers_vram() {
            Some(false) => {
                hazards.push(format!(
                    "{}: forced peer mappings fail (cudaErrorMapBufferObjectFailed) or copies land in the wrong place",
                    bar1_too_small(d)
                ));
                // One BAR1 remedy, for the first card: a pair's two cards are (almost
                // always) the same model, and the hazards name both. Only GeForce cards
                // need BAR1 to hold VRAM: the stock driver's own P2P does not.
                if p.geforce() {
                    bar1_remedy.get_or_insert_with(|| p.bar1_fix(d).remedy);
                }
            }
            None => {
                unchecked.push(p.missing(Missing::Bar1, d));
                lacking.push(Missing::Bar1);
            }
            Some(true) => {}
        }
        match p.iommu_translates(d) {
            Some(true) => {
                hazards.push(format!(
                    "{}: peer copies finish with zeros or garbage (IO_PAGE_FAULT in dmesg)",
                    iommu_translates(d)
                ));
                iommu_remedy = Some(IOMMU_REMEDY.to_owned());
            }
            None => {
                unchecked.push(p.missing(Missing::Iommu, d));
                lacking.push(Missing::Iommu);
            }
            Some(false) => {}
        }
    }
    // Without the override the driver checks BAR1 and the IOMMU itself: where the key
    // forces P2P, or the patch does on cards the stock driver serves, undoing it is the fix.
    let undo = if by_key {
        Some(format!(
            "remove ForceP2P from NVreg_RegistryDwords so the driver decides P2P itself{}",
            if p.geforce() { "" } else { " (it does so safely on these cards)" }
        ))
    } else if !p.geforce() {
        Some("go back to NVIDIA's stock module (PATCH.md, Going back): its own P2P on these cards checks BAR1 and the IOMMU".into())
    } else {
        None
    };
    // What the patch, where it forces P2P, still needs for this pair to be safe.
    let outlook = |needs: Vec<&str>| {
        if by_key { PatchOutlook::NotNeeded } else { p.geforce_outlook(PatchOutlook::InEffect(needs.join(", "))) }
    };
    let needs: Vec<&str> = [
        branch_remedy.as_ref().map(|_| "a branch for these cards"),
        bar1_remedy.as_ref().map(|_| "a BAR1 that holds VRAM"),
        iommu_remedy.as_ref().map(|_| "the IOMMU in passthrough"),
    ]
    .into_iter()
    .flatten()
    .collect();
    let remedies: Vec<String> = [undo, branch_remedy, bar1_remedy, iommu_remedy].into_iter().flatten().collect();
    let staged =
        "until then geforce-p2p copies this pair staged (Route::Auto); Route::Peer still forces P2P, at your own risk";
    let mut v = if !hazards.is_empty() {
        p.off(
            "UNSAFE",
            certainty,
            format!(
                "CUDA can access the peer (over {over}), but {why}, past the driver's own BAR1 and IOMMU checks, and this pair fails them ({} hazard{})",
                hazards.len(),
                if hazards.len() == 1 { "" } else { "s" }
            ),
            format!("{}; {staged}", remedies.join("; ")),
            outlook(needs),
            &used,
        )
    } else if !unchecked.is_empty() {
        p.off(
            "OK?",
            Certainty::Possible,
            format!(
                "CUDA can access the peer (over {over}) and {why}, past the driver's own checks; whether that is safe cannot be checked without: {}",
                unchecked.join(", ")
            ),
            format!(
                "provide the missing facts ({}), or check by hand with `gp2p bench copy --route peer` (zero wrong elements at every size) and force Route::Peer; {staged}",
                p.provide(&lacking)
            ),
            outlook(vec!["the BAR1 and IOMMU facts to check it against"]),
            &used,
        )
    } else {
        p.off(
            "OK",
            certainty,
            format!("CUDA can access the peer (over {over}); {why}, and BAR1 and the IOMMU allow it"),
            "nothing to do: geforce-p2p copies by P2P on this pair".into(),
            outlook(Vec::new()),
            &used,
        )
    };
    v.on = Some(link);
    v.hazards = hazards;
    v.unchecked = unchecked;
    v.warnings.extend(p.acs_warning());
    Some(v)
}
