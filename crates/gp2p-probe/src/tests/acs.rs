//! ACS on the bridges between two cards, through every rule that speaks of it: a step of
//! its own (`acs`), a warning where P2P is on, a cause for professional cards and a patched
//! module, and a note where it needs root to read; in the report's tables and its JSON.

use super::*;
use crate::acs::Acs;
use crate::facts::BridgeFacts;

/// Two 4090s behind one switch whose downstream ports redirect peer traffic, on a
/// patched driver (CUDA yes).
const SWITCH: &str = "4090-pair-patched-switch-acs-redirect.json";
/// Two 4090s on two root complexes, patched, ACS of the root ports not readable (no root).
const NEEDS_ROOT: &str = "4090-pair-patched-acs-needs-root.json";

/// The remedy of the switch fixture's pair 0 -> 1.
const SWITCH_REMEDY: &str = "clear ACS redirect on bridges 0000:02:08.0 and 0000:02:10.0: add `pci=disable_acs_redir=0000:02:08.0;0000:02:10.0` to the kernel command line (or turn ACS off in the firmware), or until the next boot run `sudo setpci -s 0000:02:08.0 ECAP_ACS+0x6.w=0051; sudo setpci -s 0000:02:10.0 ECAP_ACS+0x6.w=0011`; either lets the devices behind those ports reach each other unchecked";

/// The switch fixture as NVIDIA's stock open module at a version with a branch leaves it:
/// P2P refused (NVML CNS), everything else the patch needs in place.
fn switch_stock() -> Facts {
    let mut f = load_fixture(SWITCH);
    f.host.kernel_module = parse::kernel_module(
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  565.57.01  Release Build  (dvs-builder@U16)  2024",
    );
    for p in &mut f.pairs {
        (p.can_access_peer, p.nvml_read, p.nvml_write) =
            (Some(false), Some(P2pStatus::ChipsetNotSupported), Some(P2pStatus::ChipsetNotSupported));
        p.nvml_atomics = Some(P2pStatus::NotSupported);
    }
    f
}

#[test]
fn p2p_on_through_a_redirecting_switch_is_warned_with_both_remedies() {
    let f = load_fixture(SWITCH);
    let v = first(&f);
    assert_eq!((v.code.as_str(), v.on.is_some(), v.peer_trusted()), ("OK", true, true));
    assert_eq!(
        v.warnings,
        [format!(
            "ACS on bridges 0000:02:08.0 (ReqRedir+ CmpltRedir+) and 0000:02:10.0 (ReqRedir+ CmpltRedir+) between the cards redirects their peer traffic up to the root complex: P2P goes that way, slower than straight across, and hangs on some platforms; {SWITCH_REMEDY}"
        )]
    );
    assert!(v.notes.is_empty(), "every bridge was read: {:?}", v.notes);
    // The root port above the switch redirects too, but the pair's traffic turns below it.
    assert!(!v.warnings[0].contains("0000:00:01.0"), "{}", v.warnings[0]);
}

#[test]
fn a_refused_pair_gets_an_acs_step_before_the_patch() {
    let v = first(&switch_stock());
    assert_eq!((v.code.as_str(), v.certainty), ("ACS", Certainty::Shown));
    assert_eq!(
        v.reason,
        "the driver refuses P2P (NVML: read CNS, write CNS, atomics NS); ACS on bridges 0000:02:08.0 (ReqRedir+ CmpltRedir+) and 0000:02:10.0 (ReqRedir+ CmpltRedir+) between the cards redirects peer traffic up to the root complex, where P2P would then go: slowly, or to a hang"
    );
    assert_eq!(step_codes(&v), ["ACS", "PATCH"]);
    assert_eq!(v.steps[0].remedy, SWITCH_REMEDY);
    assert_eq!(v.patch, PatchOutlook::AfterChange("clear ACS redirect on the bridges between the cards".into()));
    // Cleared on one port: only the other is named, with its own control word.
    let mut f = switch_stock();
    f.bridges[2].acs = Acs::Read { offset: 0x1c0, capability: 0x7f, control: 0x51 };
    let v = first(&f);
    assert!(
        v.steps[0]
            .remedy
            .starts_with("clear ACS redirect on bridge 0000:02:10.0: add `pci=disable_acs_redir=0000:02:10.0`"),
        "{}",
        v.steps[0].remedy
    );
    // Cleared on both: no ACS step; a never-working pair (mixed) gets none either.
    f.bridges[3].acs = Acs::Read { offset: 0x1c0, capability: 0x7f, control: 0x11 };
    assert_eq!(step_codes(&first(&f)), ["PATCH"]);
    let mut f = switch_stock();
    f.devices[1].compute_capability = (8, 6);
    f.devices[1].architecture = Some("Ampere".into());
    assert_eq!(step_codes(&first(&f)), ["MIX"]);
}

#[test]
fn professional_cards_and_a_patched_module_name_the_bridges_they_read() {
    let mut f = switch_stock();
    for d in &mut f.devices {
        (d.name, d.brand) = ("NVIDIA RTX 6000 Ada Generation".into(), Some("NvidiaRTX".into()));
    }
    let v = first(&f);
    assert_eq!(v.code, "TOPO");
    assert!(v.remedy.ends_with(&format!("does not carry P2P; ACS on bridges 0000:02:08.0 (ReqRedir+ CmpltRedir+) and 0000:02:10.0 (ReqRedir+ CmpltRedir+) sends peer traffic up to the root complex: {SWITCH_REMEDY}")), "{}", v.remedy);
    // Read, and nothing redirects: no ACS advice at all.
    for b in &mut f.bridges {
        b.acs = Acs::Absent;
    }
    assert!(!first(&f).remedy.contains("ACS"), "{}", first(&f).remedy);
    // Nothing read: the check by hand, as before the probe read ACS.
    f.bridges.clear();
    assert!(first(&f).remedy.contains("`sudo lspci -vvv | grep ACSCtl`"), "{}", first(&f).remedy);
    // The patch in effect and CUDA refusing: ACS is named among the further causes.
    let mut f = load_fixture(SWITCH);
    f.pairs.iter_mut().for_each(|p| p.can_access_peer = Some(false));
    let v = first(&f);
    assert_eq!(v.code, "PFAIL");
    assert!(
        v.remedy.contains("; ACS on bridges 0000:02:08.0 (ReqRedir+ CmpltRedir+) and 0000:02:10.0"),
        "{}",
        v.remedy
    );
    assert!(!v.remedy.contains("grep ACSCtl"), "{}", v.remedy);
}

#[test]
fn acs_that_needs_root_is_a_note_never_a_guess() {
    let f = load_fixture(NEEDS_ROOT);
    let note = "ACS of bridges 0000:00:01.1 and 0000:40:01.1 between the cards was not read: the kernel shows a bridge's extended config space only to root; run the probe as root (`sudo gp2p probe`) to read it";
    for v in verdicts(&f) {
        assert_eq!((v.code.as_str(), v.notes.as_slice()), ("OK", &[note.to_owned()][..]));
        assert!(v.warnings.is_empty(), "{:?}", v.warnings);
    }
    // Refused, the same note, and no ACS step (nothing is known to redirect).
    let mut refused = f.clone();
    refused.pairs.iter_mut().for_each(|p| {
        (p.can_access_peer, p.nvml_read, p.nvml_write, p.nvml_atomics) = (
            Some(false),
            Some(P2pStatus::ChipsetNotSupported),
            Some(P2pStatus::ChipsetNotSupported),
            Some(P2pStatus::NotSupported),
        )
    });
    refused.host.kernel_module = parse::kernel_module(
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  565.57.01  Release Build  (dvs-builder@U16)  2024",
    );
    let v = first(&refused);
    assert_eq!((step_codes(&v), v.notes.as_slice()), (vec!["PATCH"], &[note.to_owned()][..]));
    // Unreadable for another reason: the reason, and no root advice.
    let mut f = f;
    f.bridges[0].acs = Acs::Unreadable { reason: "0000:00:01.1/config: Input/output error".into() };
    f.bridges[1].acs = Acs::Absent;
    assert_eq!(
        first(&f).notes,
        [
            "ACS of bridge 0000:00:01.1 between the cards was not read (0000:00:01.1: 0000:00:01.1/config: Input/output error)"
        ]
    );
}

#[test]
fn the_report_shows_acs_in_its_tables_and_json() {
    let report = Report::new(load_fixture(SWITCH));
    let text = report.render();
    let bridges = "\
bridges between the cards (ACS, from their config space)
 bridge        ACS     ACSCtl                                                       redirects
 0000:00:01.0  read    0x001d SrcValid ReqRedir CmpltRedir UpstreamFwd              YES: ReqRedir CmpltRedir
 0000:01:00.0  no ACS  -                                                            no
 0000:02:08.0  read    0x005d SrcValid ReqRedir CmpltRedir UpstreamFwd DirectTrans  YES: ReqRedir CmpltRedir
 0000:02:10.0  read    0x001d SrcValid ReqRedir CmpltRedir UpstreamFwd              YES: ReqRedir CmpltRedir
";
    assert!(text.contains(bridges), "{text}");
    assert!(text.contains("\n 0    X  SW*     0  ?     0000:00:01.0\n"), "{text}");
    assert!(text.contains("\n    WARNING: ACS on bridges 0000:02:08.0 (ReqRedir+ CmpltRedir+)"), "{text}");
    let json: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
    assert_eq!(
        json["facts"]["bridges"][2]["acs"],
        serde_json::json!({"state": "read", "offset": 448, "capability": 127, "control": 93})
    );
    assert_eq!(json["topology"]["pairs"][0]["acs_redirect"], serde_json::json!(["0000:02:08.0", "0000:02:10.0"]));
    assert!(json["verdicts"][0]["warnings"][0].as_str().is_some_and(|w| w.contains("pci=disable_acs_redir=")));
    let text = Report::new(load_fixture(NEEDS_ROOT)).render();
    assert!(text.contains("\n 0000:00:01.1  needs root (64 bytes read)  ?       ?\n"), "{text}");
    assert!(
        text.contains(
            "\nACS not read on 0000:00:01.1, 0000:40:01.1 between the cards (run the probe as root to read it)"
        ),
        "{text}"
    );
    assert!(
        text.contains("\n    note: ACS of bridges 0000:00:01.1 and 0000:40:01.1 between the cards was not read"),
        "{text}"
    );
    let json: serde_json::Value = serde_json::from_str(&Report::new(load_fixture(NEEDS_ROOT)).to_json()).unwrap();
    assert_eq!(json["facts"]["bridges"][0]["acs"], serde_json::json!({"state": "needs_root", "bytes": 64}));
    assert_eq!(json["topology"]["pairs"][0]["acs_unread"], serde_json::json!(["0000:00:01.1", "0000:40:01.1"]));
    assert!(json["verdicts"][0]["notes"][0].as_str().is_some_and(|n| n.contains("run the probe as root")));
}

#[test]
fn a_bridge_listed_twice_is_refused() {
    let mut f = load_fixture(SWITCH);
    f.bridges.push(BridgeFacts { bdf: "0000:02:08.0".into(), acs: Acs::Absent });
    assert_eq!(f.check(), Err("bridge 0000:02:08.0 is listed twice: each bridge appears once in `bridges`".into()));
}
