//! ACS, PCIe Access Control Services, on the bridges between two cards: what a bridge's
//! config space says, read by a pure parser ([`parse_config`]) from the bytes of its sysfs
//! `config` file, and what the control bits mean for P2P.
//!
//! A switch downstream port or root port with P2P Request Redirect (or Completion Redirect,
//! or Egress Control) on sends peer-to-peer requests up to the root complex instead of
//! across to the other card: with the P2P patch that is the common reason P2P works but
//! runs slowly or hangs (PATCH.md). The ACS capability is an extended capability, past the
//! first 256 bytes of config space, which Linux shows only to root: a shorter read is
//! recorded as such ([`Acs::NeedsRoot`]), never guessed.
//!
//! ```
//! use gp2p_probe::acs::{Acs, parse_config};
//!
//! // 4 KiB of config space whose extended list starts with ACS (ID 0x000D) at 0x100,
//! // request and completion redirect on (control 0x001D).
//! let mut config = vec![0u8; 4096];
//! config[0x100..0x104].copy_from_slice(&0x0001_000Du32.to_le_bytes());
//! config[0x104..0x106].copy_from_slice(&0x005Fu16.to_le_bytes());
//! config[0x106..0x108].copy_from_slice(&0x001Du16.to_le_bytes());
//! let acs = parse_config(&config);
//! assert_eq!(acs, Acs::Read { offset: 0x100, capability: 0x5f, control: 0x1d });
//! assert_eq!(acs.redirect_names(), ["ReqRedir", "CmpltRedir"]);
//! assert_eq!(acs.cleared_control(), Some(0x11));
//! // What a user without root reads: the first 64 bytes.
//! assert_eq!(parse_config(&config[..64]), Acs::NeedsRoot { bytes: 64 });
//! ```

use serde::{Deserialize, Serialize};

/// Bytes of config space a PCIe function has, all of which Linux shows to root; other
/// readers get the first 64 (or 256) only.
pub const CONFIG_BYTES: usize = 4096;
/// Where the extended capability list starts.
const EXTENDED_CAPABILITIES: usize = 0x100;
/// The extended capability ID of ACS.
const ACS_ID: u16 = 0x000D;
/// The ACS capability register's offset from the capability's header (16 bits).
const CAPABILITY_REGISTER: usize = 4;
/// The ACS control register's offset from the capability's header (16 bits).
pub const CONTROL_REGISTER: usize = 6;

/// ACS Source Validation.
pub const SOURCE_VALIDATION: u16 = 1 << 0;
/// ACS Translation Blocking.
pub const TRANSLATION_BLOCKING: u16 = 1 << 1;
/// ACS P2P Request Redirect: peer requests go up to the root complex.
pub const P2P_REQUEST_REDIRECT: u16 = 1 << 2;
/// ACS P2P Completion Redirect: peer completions go up to the root complex.
pub const P2P_COMPLETION_REDIRECT: u16 = 1 << 3;
/// ACS Upstream Forwarding.
pub const UPSTREAM_FORWARDING: u16 = 1 << 4;
/// ACS P2P Egress Control: peer requests to some ports are blocked or redirected.
pub const P2P_EGRESS_CONTROL: u16 = 1 << 5;
/// ACS Direct Translated P2P.
pub const DIRECT_TRANSLATED_P2P: u16 = 1 << 6;

/// The control bits that keep peer traffic from going straight across a bridge: what the
/// remedy clears.
pub const REDIRECTS: u16 = P2P_REQUEST_REDIRECT | P2P_COMPLETION_REDIRECT | P2P_EGRESS_CONTROL;

/// Every ACS bit, with the name `lspci -vvv` gives it (`ACSCtl: SrcValid+ TransBlk- …`).
const BIT_NAMES: &[(u16, &str)] = &[
    (SOURCE_VALIDATION, "SrcValid"),
    (TRANSLATION_BLOCKING, "TransBlk"),
    (P2P_REQUEST_REDIRECT, "ReqRedir"),
    (P2P_COMPLETION_REDIRECT, "CmpltRedir"),
    (UPSTREAM_FORWARDING, "UpstreamFwd"),
    (P2P_EGRESS_CONTROL, "EgressCtrl"),
    (DIRECT_TRANSLATED_P2P, "DirectTrans"),
];

/// What a bridge's config space says about ACS.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Acs {
    /// The ACS capability, at `offset` of config space: which features the bridge has
    /// (`capability`) and which are on (`control`), bits as the constants of this module.
    Read {
        /// Offset of the capability's header.
        offset: u16,
        /// The ACS capability register.
        capability: u16,
        /// The ACS control register.
        control: u16,
    },
    /// The extended config space was read and lists no ACS capability: nothing redirects.
    Absent,
    /// Only `bytes` of config space could be read: the extended space, where ACS is, needs
    /// root.
    NeedsRoot {
        /// How many bytes were readable (64 or 256 for other users).
        bytes: usize,
    },
    /// The config space could not be read, or its capability list does not hold together.
    Unreadable {
        /// Why, in words.
        reason: String,
    },
}

impl Acs {
    /// The control bits on that keep peer traffic from going straight across ([`REDIRECTS`]);
    /// 0 where none is on or ACS was not read.
    pub fn redirects(&self) -> u16 {
        match self {
            Acs::Read { control, .. } => control & REDIRECTS,
            _ => 0,
        }
    }

    /// The names of [`Acs::redirects`], as `lspci` writes them.
    pub fn redirect_names(&self) -> Vec<&'static str> {
        bit_names(self.redirects())
    }

    /// The control word with the redirect bits cleared and every other bit kept: what
    /// `setpci … ECAP_ACS+0x6.w=` should write. `None` where ACS was not read.
    pub fn cleared_control(&self) -> Option<u16> {
        match self {
            Acs::Read { control, .. } => Some(control & !REDIRECTS),
            _ => None,
        }
    }

    /// Whether ACS was read (present or absent) rather than left unknown.
    pub fn known(&self) -> bool {
        matches!(self, Acs::Read { .. } | Acs::Absent)
    }

    /// Why ACS is not known, in words; `None` where it is.
    pub fn unknown_because(&self) -> Option<String> {
        match self {
            Acs::Read { .. } | Acs::Absent => None,
            Acs::NeedsRoot { bytes } => {
                Some(format!("only {bytes} of {CONFIG_BYTES} bytes of config space readable: it needs root"))
            }
            Acs::Unreadable { reason } => Some(reason.clone()),
        }
    }
}

/// The names of the ACS bits set in `bits`, as `lspci` writes them.
pub fn bit_names(bits: u16) -> Vec<&'static str> {
    BIT_NAMES.iter().filter(|(bit, _)| bits & bit != 0).map(|(_, name)| *name).collect()
}

/// ACS from the bytes of a PCIe function's config space (its sysfs `config` file): the
/// extended capability list from 0x100 (each header: ID in bits 15:0, next offset in bits
/// 31:20), the ACS capability's registers where it is found. Fewer than [`CONFIG_BYTES`]
/// bytes is what a non-root reader gets: [`Acs::NeedsRoot`]. A list that points backwards,
/// outside the space or loops is [`Acs::Unreadable`]; nothing here panics on any input.
pub fn parse_config(config: &[u8]) -> Acs {
    if config.len() < CONFIG_BYTES {
        return Acs::NeedsRoot { bytes: config.len() };
    }
    let mut offset = EXTENDED_CAPABILITIES;
    // Each capability takes at least its 4-byte header: no list is longer than this.
    for _ in 0..(CONFIG_BYTES - EXTENDED_CAPABILITIES) / 4 {
        let Some(header) = read_u32(config, offset) else {
            return malformed(offset, "runs past the end of config space");
        };
        // An empty list reads as all zeros (or all ones where the function has no
        // extended space at all).
        if header == 0 || header == u32::MAX {
            return Acs::Absent;
        }
        if (header & 0xffff) as u16 == ACS_ID {
            return match (read_u16(config, offset + CAPABILITY_REGISTER), read_u16(config, offset + CONTROL_REGISTER)) {
                (Some(capability), Some(control)) => Acs::Read { offset: offset as u16, capability, control },
                _ => malformed(offset, "has its ACS registers past the end of config space"),
            };
        }
        let next = (header >> 20) as usize;
        if next == 0 {
            return Acs::Absent;
        }
        if next <= offset || next % 4 != 0 {
            return malformed(offset, &format!("points to {next:#x}, not forward to a 4-byte boundary"));
        }
        offset = next;
    }
    malformed(offset, "does not end")
}

fn malformed(offset: usize, what: &str) -> Acs {
    Acs::Unreadable { reason: format!("the extended capability list at {offset:#x} {what}") }
}

fn read_u16(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(bytes.get(at..at + 2)?.try_into().ok()?))
}

fn read_u32(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 4 KiB of config space holding the extended capabilities `caps` (offset, ID, next,
    /// and for ACS its capability and control words).
    fn config(caps: &[(usize, u16, usize, u16, u16)]) -> Vec<u8> {
        let mut bytes = vec![0u8; CONFIG_BYTES];
        for &(at, id, next, capability, control) in caps {
            let header = u32::from(id) | (1 << 16) | ((next as u32) << 20);
            bytes[at..at + 4].copy_from_slice(&header.to_le_bytes());
            bytes[at + 4..at + 6].copy_from_slice(&capability.to_le_bytes());
            bytes[at + 6..at + 8].copy_from_slice(&control.to_le_bytes());
        }
        bytes
    }

    #[test]
    fn acs_is_found_behind_other_extended_capabilities() {
        // AER (0x0001) at 0x100, then secondary PCIe (0x0019) at 0x148, then ACS at 0x1c0:
        // the order a switch downstream port often has them in.
        let bytes =
            config(&[(0x100, 0x0001, 0x148, 0, 0), (0x148, 0x0019, 0x1c0, 0, 0), (0x1c0, ACS_ID, 0, 0x7f, 0x5d)]);
        let acs = parse_config(&bytes);
        assert_eq!(acs, Acs::Read { offset: 0x1c0, capability: 0x7f, control: 0x5d });
        assert_eq!(acs.redirects(), P2P_REQUEST_REDIRECT | P2P_COMPLETION_REDIRECT);
        assert_eq!(bit_names(0x5d), ["SrcValid", "ReqRedir", "CmpltRedir", "UpstreamFwd", "DirectTrans"]);
        // Clearing keeps source validation, upstream forwarding and direct translated P2P.
        assert_eq!(acs.cleared_control(), Some(0x51));
        // Egress control counts as a redirect too.
        let egress = parse_config(&config(&[(0x100, ACS_ID, 0, 0x7f, P2P_EGRESS_CONTROL)]));
        assert_eq!((egress.redirect_names(), egress.cleared_control()), (vec!["EgressCtrl"], Some(0)));
        // ACS present with nothing redirected.
        let clear = parse_config(&config(&[(0x100, ACS_ID, 0, 0x5f, 0x11)]));
        assert_eq!((clear.redirects(), clear.known()), (0, true));
    }

    #[test]
    fn no_acs_and_short_reads_are_told_apart() {
        assert_eq!(parse_config(&config(&[(0x100, 0x0001, 0x148, 0, 0), (0x148, 0x0019, 0, 0, 0)])), Acs::Absent);
        assert_eq!(parse_config(&vec![0u8; CONFIG_BYTES]), Acs::Absent, "an empty list");
        assert_eq!(parse_config(&vec![0xffu8; CONFIG_BYTES]), Acs::Absent, "no extended space");
        for bytes in [0, 64, 256, CONFIG_BYTES - 1] {
            let acs = parse_config(&vec![0u8; bytes]);
            assert_eq!(acs, Acs::NeedsRoot { bytes });
            assert!(!acs.known() && acs.unknown_because().is_some_and(|why| why.contains("needs root")));
            assert_eq!((acs.redirects(), acs.cleared_control()), (0, None));
        }
    }

    #[test]
    fn malformed_lists_are_unreadable_never_a_panic() {
        // A next pointer backwards (a loop), unaligned, or an ACS header in the last bytes.
        let backwards = config(&[(0x100, 0x0001, 0x140, 0, 0), (0x140, 0x0019, 0x100, 0, 0)]);
        let unaligned = config(&[(0x100, 0x0001, 0x142, 0, 0)]);
        let mut at_end = vec![0u8; CONFIG_BYTES];
        at_end[0x100..0x104].copy_from_slice(&(0x0001u32 | (0xffc << 20)).to_le_bytes());
        at_end[0xffc..0x1000].copy_from_slice(&u32::from(ACS_ID).to_le_bytes());
        for bytes in [backwards, unaligned, at_end] {
            let acs = parse_config(&bytes);
            assert!(
                matches!(&acs, Acs::Unreadable { reason } if reason.starts_with("the extended capability list at")),
                "{acs:?}"
            );
        }
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_give_a_result(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..CONFIG_BYTES + 64)) {
            let acs = parse_config(&bytes);
            proptest::prop_assert_eq!(acs.known(), bytes.len() >= CONFIG_BYTES && !matches!(acs, Acs::Unreadable { .. }));
        }
    }
}
