//! What ACS on the bridges between a pair's cards means for its verdict: which bridges
//! redirect peer traffic up to the root complex (and the two ways to clear that), and which
//! could not be read. Rule `acs` makes a step of it, rule `on` a warning, rules `card` and
//! `patched` name it among the causes, and every verdict notes a bridge it could not read.

use super::*;

use crate::acs::Acs;
use crate::facts::BridgeFacts;
use crate::topology::acs_between;

impl Pair<'_> {
    /// The bridges between this pair's cards that redirect peer traffic, with their ACS
    /// read, and the addresses of those whose ACS is not known.
    pub(super) fn acs_path(&self) -> (Vec<&BridgeFacts>, Vec<String>) {
        // Lower ordinal first, so both directions of a pair name the bridges alike.
        let (a, b) = if self.a.ordinal <= self.b.ordinal { (self.a, self.b) } else { (self.b, self.a) };
        let (redirect, unread) = acs_between(self.facts, a, b);
        (redirect.iter().filter_map(|bdf| self.facts.bridge(bdf)).collect(), unread)
    }

    /// The redirecting bridges in words, each with its redirect bits as `lspci` shows them:
    /// `bridges 0000:18:00.0 (ReqRedir+ CmpltRedir+) and 0000:18:01.0 (ReqRedir+)`.
    pub(super) fn redirecting(bridges: &[&BridgeFacts]) -> String {
        let each: Vec<String> = bridges
            .iter()
            .map(|b| {
                let bits: Vec<String> = b.acs.redirect_names().iter().map(|n| format!("{n}+")).collect();
                format!("{} ({})", b.bdf, bits.join(" "))
            })
            .collect();
        format!("{} {}", if each.len() == 1 { "bridge" } else { "bridges" }, in_words(&each))
    }

    /// How to clear ACS redirect on `bridges`: the kernel parameter that leaves it off for
    /// good, and the `setpci` lines that clear it until the next boot, each writing the
    /// bridge's control word with only the redirect bits cleared.
    pub(super) fn acs_remedy(bridges: &[&BridgeFacts]) -> String {
        let bdfs: Vec<&str> = bridges.iter().map(|b| b.bdf.as_str()).collect();
        let setpci: Vec<String> = bridges
            .iter()
            .filter_map(|b| {
                let control = b.acs.cleared_control()?;
                Some(format!("sudo setpci -s {} ECAP_ACS+0x{:x}.w={control:04x}", b.bdf, crate::acs::CONTROL_REGISTER))
            })
            .collect();
        let named: Vec<String> = bdfs.iter().map(|b| (*b).to_owned()).collect();
        format!(
            "clear ACS redirect on {} {}: add `pci=disable_acs_redir={}` to the kernel command line (or turn ACS off in the firmware), or until the next boot run `{}`; either lets the devices behind those ports reach each other unchecked",
            if bdfs.len() == 1 { "bridge" } else { "bridges" },
            in_words(&named),
            bdfs.join(";"),
            setpci.join("; ")
        )
    }

    /// What the pair's verdict says of ACS where the driver refuses P2P for a reason of
    /// its own (rules `card` and `patched`): the bridges that redirect and the remedy; or,
    /// where every bridge was read and none redirects, nothing; or, where not every one
    /// was read, `by_hand`: the check to make by hand.
    pub(super) fn acs_cause(&self, by_hand: &str) -> Option<String> {
        let (redirect, unread) = self.acs_path();
        if !redirect.is_empty() {
            return Some(format!(
                "ACS on {} sends peer traffic up to the root complex: {}",
                Self::redirecting(&redirect),
                Self::acs_remedy(&redirect)
            ));
        }
        let read = !self.facts.bridges.is_empty() && bridges_known(self);
        (!read || !unread.is_empty()).then(|| by_hand.to_owned())
    }

    /// The warning of a pair P2P is on for whose path redirects it (rule `on`).
    pub(super) fn acs_warning(&self) -> Option<String> {
        let (redirect, _) = self.acs_path();
        (!redirect.is_empty()).then(|| {
            format!(
                "ACS on {} between the cards redirects their peer traffic up to the root complex: P2P goes that way, slower than straight across, and hangs on some platforms; {}",
                Self::redirecting(&redirect),
                Self::acs_remedy(&redirect)
            )
        })
    }

    /// The note of a pair with bridges whose ACS could not be read, and how to read it.
    pub(super) fn acs_note(&self) -> Option<String> {
        let (_, unread) = self.acs_path();
        if unread.is_empty() {
            return None;
        }
        let needs_root =
            unread.iter().all(|bdf| self.facts.bridge(bdf).is_some_and(|b| matches!(b.acs, Acs::NeedsRoot { .. })));
        let which = format!("{} {}", if unread.len() == 1 { "bridge" } else { "bridges" }, in_words(&unread));
        Some(if needs_root {
            format!(
                "ACS of {which} between the cards was not read: the kernel shows a bridge's extended config space only to root; run the probe as root (`sudo gp2p probe`) to read it"
            )
        } else {
            let why: Vec<String> = unread
                .iter()
                .map(|bdf| {
                    let why = self.facts.bridge(bdf).and_then(|b| b.acs.unknown_because());
                    format!("{bdf}: {}", why.unwrap_or_else(|| "not in the saved facts".into()))
                })
                .collect();
            format!("ACS of {which} between the cards was not read ({})", why.join("; "))
        })
    }
}

/// Whether every bridge on the pair's path was read (ACS present or not).
fn bridges_known(p: &Pair<'_>) -> bool {
    crate::topology::bridges_between(p.a, p.b)
        .is_some_and(|path| path.iter().all(|bdf| p.facts.bridge(bdf).is_some_and(|b| b.acs.known())))
}

/// Items in words: `a`, `a and b`, `a, b and c`.
fn in_words(items: &[String]) -> String {
    match items.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
        _ => items.concat(),
    }
}
