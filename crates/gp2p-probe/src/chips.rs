//! The largest BAR1 the GeForce cards of each chip offer, with where that is reported: what
//! a verdict falls back on when the sizes a card itself offers (sysfs `resource1_resize`,
//! [`DeviceFacts::bar1_sizes`]) were not read. What a card offers always wins over this
//! table: a VBIOS may offer less than its chip's cards usually do (GA102 cards without a
//! Resizable BAR VBIOS stay at 256 MiB).
//!
//! | chip | cards | largest BAR1 | source |
//! | --- | --- | --- | --- |
//! | AD102 | RTX 4090, RTX 4090 D (and their 48 GB mods) | 32 GiB | aikitoria/open-gpu-kernel-modules#14, terminatorul/NvStrapsReBar#133, tinygrad/open-gpu-kernel-modules#28 |
//! | GA102 | RTX 3090 (Ti), RTX 3080 (Ti) | 32 GiB | xCuri0/ReBarUEFI#11 (a 3090's `lspci`); noonghunna/club-3090#734 (VBIOSes offering 256 MiB only) |
//! | GB202 | RTX 5090 | 32 GiB | aikitoria/open-gpu-kernel-modules#9 (the patched module asks a 5090 for its largest size: 32 GiB), #7 |
//! | AD103 | RTX 4080 (SUPER) | 32 GiB | assumption: no report read; taken to match AD102 |
//!
//! Only a reported row lets a verdict say a card's BAR1 cannot grow enough (a hard
//! verdict, certainty "likely": it assumes the card offers no more than its chip's cards
//! are reported to). An assumption row is named in the advice and decides nothing.

use crate::facts::{CardClass, DeviceFacts};

const GIB: u64 = 1 << 30;

/// Where a row's size comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Reports that show it (issues and their `lspci`/`nvidia-smi` output), as
    /// `owner/repository#number`, comma-separated; what each shows is noted at the row.
    Reported(&'static str),
    /// No report found: the size is a guess, named as such, and never decides a verdict.
    Assumption(&'static str),
}

impl Source {
    /// Whether a report shows the size.
    pub fn reported(self) -> bool {
        matches!(self, Source::Reported(_))
    }

    /// The source in words, as a verdict cites it.
    pub fn describe(self) -> String {
        match self {
            Source::Reported(what) => format!("reported in {what}"),
            Source::Assumption(why) => format!("an assumption: {why}"),
        }
    }
}

/// One chip's row: which cards it is, and the largest BAR1 they offer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChipBar1 {
    /// The chip, e.g. "AD102".
    pub chip: &'static str,
    /// What the CUDA names of its GeForce cards contain, lower case ("rtx 4090" also matches
    /// "RTX 4090 D"). Laptop parts of the same name are other chips and never match.
    pub cards: &'static [&'static str],
    /// The chip's compute capability, which a card must have too.
    pub compute_capability: (u32, u32),
    /// The largest BAR1 its cards offer, bytes.
    pub largest_bar1: u64,
    /// Where that comes from.
    pub source: Source,
}

/// The table, as the module documentation shows it.
pub const CHIP_BAR1: &[ChipBar1] = &[
    ChipBar1 {
        chip: "AD102",
        cards: &["rtx 4090"],
        compute_capability: (8, 9),
        largest_bar1: 32 * GIB,
        // #14: 48 GB 4090s have a 32 GB BAR1 at most; #133: a 48 GB 4090 D offers sizes up
        // to 32 GB, and forcing 64 GB falls back to 256 MB; #28: a 24 GB 4090 at 32 GB.
        source: Source::Reported(
            "aikitoria/open-gpu-kernel-modules#14, terminatorul/NvStrapsReBar#133, tinygrad/open-gpu-kernel-modules#28",
        ),
    },
    ChipBar1 {
        chip: "GA102",
        cards: &["rtx 3090", "rtx 3080"],
        compute_capability: (8, 6),
        largest_bar1: 32 * GIB,
        // #11: an RTX 3090's lspci offers 64 MB to 32 GB; #734: 3090 VBIOSes without
        // Resizable BAR offer 256 MB only (which the card's own sizes show, where read).
        source: Source::Reported("xCuri0/ReBarUEFI#11, noonghunna/club-3090#734"),
    },
    ChipBar1 {
        chip: "GB202",
        cards: &["rtx 5090"],
        compute_capability: (12, 0),
        largest_bar1: 32 * GIB,
        // #9: the patched module, which asks for the largest size a card offers, asks a 5090
        // for 32 GiB (0x800000000); #7: 5090s come up small until resized.
        source: Source::Reported("aikitoria/open-gpu-kernel-modules#9, aikitoria/open-gpu-kernel-modules#7"),
    },
    ChipBar1 {
        chip: "AD103",
        cards: &["rtx 4080"],
        compute_capability: (8, 9),
        largest_bar1: 32 * GIB,
        source: Source::Assumption("no report read; taken to match AD102"),
    },
];

/// The row of the chip `d` is, when its name, class and compute capability say so.
pub fn chip_bar1(d: &DeviceFacts) -> Option<&'static ChipBar1> {
    if d.class() != Some(CardClass::GeForce) {
        return None;
    }
    let name = d.name.to_ascii_lowercase();
    if name.contains("laptop") || name.contains("mobile") {
        return None;
    }
    CHIP_BAR1
        .iter()
        .find(|row| row.compute_capability == d.compute_capability && row.cards.iter().any(|c| name.contains(c)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn card(name: &str, cc: (u32, u32)) -> DeviceFacts {
        DeviceFacts { name: name.into(), compute_capability: cc, ..DeviceFacts::default() }
    }

    #[test]
    fn cards_find_their_chip_and_others_none() {
        let chip = |name, cc| chip_bar1(&card(name, cc)).map(|r| r.chip);
        assert_eq!(chip("NVIDIA GeForce RTX 4090", (8, 9)), Some("AD102"));
        assert_eq!(chip("NVIDIA GeForce RTX 4090 D", (8, 9)), Some("AD102"));
        assert_eq!(chip("NVIDIA GeForce RTX 3090 Ti", (8, 6)), Some("GA102"));
        assert_eq!(chip("NVIDIA GeForce RTX 5090", (12, 0)), Some("GB202"));
        assert_eq!(chip("NVIDIA GeForce RTX 4090 Laptop GPU", (8, 9)), None, "an AD103 under the 4090 name");
        assert_eq!(chip("NVIDIA GeForce RTX 4090", (12, 0)), None, "name and capability must agree");
        assert_eq!(chip("NVIDIA RTX A6000", (8, 6)), None, "GA102 too, but not a GeForce card");
        assert_eq!(chip("NVIDIA GeForce RTX 4060", (8, 9)), None);
    }

    #[test]
    fn every_row_names_its_source_and_the_docs_show_every_row() {
        let doc = include_str!("chips.rs");
        for row in CHIP_BAR1 {
            match row.source {
                Source::Reported(what) => {
                    assert!(what.contains('#') && what.contains('/'), "{}: cite owner/repository#number", row.chip)
                }
                Source::Assumption(why) => assert!(!why.is_empty(), "{}", row.chip),
            }
            let line = format!("//! | {} |", row.chip);
            let gib = format!("| {} GiB |", row.largest_bar1 >> 30);
            assert!(
                doc.lines().any(|l| l.starts_with(&line) && l.contains(&gib)),
                "{} missing from the doc table",
                row.chip
            );
            let assumption = doc.lines().any(|l| l.starts_with(&line) && l.contains("assumption"));
            assert_eq!(
                assumption,
                !row.source.reported(),
                "{}: the doc table says assumption where the row does",
                row.chip
            );
        }
    }
}
