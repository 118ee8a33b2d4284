//! What would let a card's BAR1 map its VRAM, for the rules that meet a BAR1 too small
//! (`on`, `patched`, `version`, `bar1`) and the patch step: Resizable BAR where the card or
//! its chip offers enough, the per-allocation branch for cards whose BAR1 cannot grow, a
//! VBIOS update, or nothing.

use super::*;

/// What would let a device's BAR1 map its VRAM, from [`Pair::bar1_fix`].
pub(super) struct Bar1Fix {
    /// What to do, in a sentence.
    pub(super) remedy: String,
    /// What the patch would do then.
    pub(super) outlook: PatchOutlook,
    /// The assumption the advice rests on, where it comes from the chip table rather than
    /// the card's own sizes (the verdict is then "likely" and names it).
    pub(super) assumption: Option<String>,
    /// The remedy is the per-allocation branch (the card's BAR1 cannot grow enough).
    pub(super) per_allocation: bool,
}

impl Pair<'_> {
    /// Whether this pair's BAR1 remedy is the per-allocation branch (a card's BAR1 cannot
    /// grow to hold its VRAM): then that branch's driver version is the one to move to.
    pub(super) fn per_allocation(&self) -> bool {
        self.devices()
            .into_iter()
            .find(|d| d.bar1_covers_vram() == Some(false))
            .is_some_and(|d| self.bar1_fix(d).per_allocation)
    }

    /// What would let device `d`'s BAR1 map its VRAM (the static BAR1 mapping the patch
    /// uses), and what the patch would do then. Resizable BAR is advised only where the card
    /// offers a BAR1 that large: the sizes it offers (sysfs `resource1_resize`) where read,
    /// else its chip's largest where a report shows it ([`chip_bar1`]). A BAR1 already at
    /// that largest size is a limit of the card, never a firmware setting to change.
    pub(super) fn bar1_fix(&self, d: &DeviceFacts) -> Bar1Fix {
        let n = d.ordinal;
        let vram = gib(d.vram_bytes);
        let needed = bar1_needed(d.vram_bytes).map_or("more than any BAR can be".into(), gib);
        let resizes = if self.patch.acted_on() {
            " (the patched module resizes BAR1 itself at load where the firmware leaves room)"
        } else {
            ""
        };
        let chip = chip_bar1(d);
        // The largest BAR1 the card can have, and whether that comes from the chip table
        // (then the verdict names the assumption: this card offers no more than its chip's).
        let (largest, assumption) = match (d.bar1_largest(), chip) {
            (Some(largest), _) => (largest, None),
            (None, Some(row)) if row.source.reported() => {
                let largest = row.largest_bar1.max(d.bar1_bytes.unwrap_or(0));
                let assumption = format!(
                    "assuming device {n} offers no more than the {} reported for {} cards, as its own sizes were not read (sysfs resource1_resize)",
                    gib(row.largest_bar1),
                    row.chip
                );
                (largest, Some(assumption))
            }
            (None, row) => {
                let assumed = row.map_or(String::new(), |row| {
                    format!("; {} cards offer up to {}, {}", row.chip, gib(row.largest_bar1), row.source.describe())
                });
                return Bar1Fix {
                    remedy: format!(
                        "enable Above 4G decoding and Resizable BAR in the firmware, if device {n} offers a BAR1 of at least {needed} (the sizes it offers were not read: sysfs resource1_resize{assumed})"
                    ),
                    outlook: PatchOutlook::AfterChange(format!(
                        "enable Resizable BAR, if device {n} offers a BAR1 of at least {needed}"
                    )),
                    assumption: None,
                    per_allocation: false,
                };
            }
        };
        let offers = match (assumption.is_some(), chip) {
            (true, Some(row)) => format!(
                "{} cards like device {n} offer a BAR1 of up to {} ({}; its own sizes were not read)",
                row.chip,
                gib(row.largest_bar1),
                row.source.describe()
            ),
            _ => format!("device {n} offers a BAR1 of up to {}", gib(largest)),
        };
        if bar1_holds(largest, d.vram_bytes) {
            return Bar1Fix {
                remedy: format!(
                    "enable Above 4G decoding and Resizable BAR in the firmware: {offers}, enough for its {vram} of VRAM{resizes}"
                ),
                outlook: PatchOutlook::AfterChange(format!("enable Resizable BAR ({offers})")),
                assumption,
                per_allocation: false,
            };
        }
        let stuck = match (&assumption, chip) {
            (Some(_), Some(row)) => format!(
                "device {n}'s BAR1 ({}) cannot grow past {}, the largest {} cards offer ({})",
                gib(d.bar1_bytes.unwrap_or(0)),
                gib(largest),
                row.chip,
                row.source.describe()
            ),
            _ if d.bar1_sizes.as_ref().is_some_and(Vec::is_empty) => {
                format!("device {n} offers no resizable BAR1 (it stays at {})", gib(largest))
            }
            _ => format!("device {n}'s BAR1 cannot grow past {}", gib(largest)),
        };
        let geforce = d.class() == Some(CardClass::GeForce);
        if geforce && d.arch() == Architecture::Ada {
            // A BAR1 below the card's largest still grows (the per-allocation branch maps
            // through it too): the firmware setting comes first, then the branch.
            let (rebar, firmware, then) = if d.bar1_bytes.is_some_and(|b| b < largest) {
                let up_to = gib(largest);
                (
                    format!(
                        "enable Above 4G decoding and Resizable BAR in the firmware (up to {up_to}){resizes}; then "
                    ),
                    "",
                    format!("enable Resizable BAR (up to {up_to}), then "),
                )
            } else {
                (String::new(), ", whatever the firmware sets", String::new())
            };
            return Bar1Fix {
                remedy: format!(
                    "{rebar}{stuck}, less than its {vram} of VRAM, so the static BAR1 mapping (it needs {needed}) cannot fit{firmware}: the experimental {BAR1_PER_ALLOCATION_BRANCH} branch maps BAR1 per allocation instead (made for 48 GB 4090s)"
                ),
                outlook: PatchOutlook::AfterChange(format!(
                    "{then}move to the experimental {BAR1_PER_ALLOCATION_BRANCH} branch, which maps BAR1 per allocation"
                )),
                assumption,
                per_allocation: true,
            };
        }
        if geforce && d.bar1_sizes.as_ref().is_some_and(Vec::is_empty) {
            return Bar1Fix {
                remedy: format!(
                    "{stuck}: a VBIOS update from the card's maker may add Resizable BAR (without one nothing covers its VRAM and this pair stays staged)"
                ),
                outlook: PatchOutlook::AfterChange(
                    "a VBIOS update that adds Resizable BAR, where the card's maker has one".into(),
                ),
                assumption,
                per_allocation: false,
            };
        }
        Bar1Fix {
            remedy: format!(
                "none: {stuck}, less than its {vram} of VRAM, and no patch branch maps BAR1 per allocation for this card; this pair stays staged"
            ),
            outlook: PatchOutlook::Cannot(format!(
                "device {n}'s BAR1 cannot map its VRAM ({needed} needed), and it cannot grow past {}",
                gib(largest)
            )),
            assumption,
            per_allocation: false,
        }
    }
}

/// The driver version of the per-allocation branch ([`BAR1_PER_ALLOCATION_BRANCH`]).
pub(super) fn per_allocation_version() -> &'static str {
    crate::branches::PATCH_BRANCHES.iter().find(|b| b.name == BAR1_PER_ALLOCATION_BRANCH).map_or("?", |b| b.version)
}
