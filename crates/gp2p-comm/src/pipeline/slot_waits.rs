//! How a call in rounds waits for the slots its first chunks take ([`SLOT_WAITS_VAR`]): each
//! copy out for its own slot's readers (`each`, the default), or the first copy out for all of
//! them at once (`together`, [`gp2p_collectives::legs::steps::first_slot_waits_together`]).
//! Those slots were last read in an earlier call, so together waits for the slowest of those
//! readers before the first copy out (all of them within one peer timeout), and enqueues one
//! wait where there were as many as the slots: with the wait kernel, a launch each, which on
//! a GPU shared under MPS costs several microseconds of host time
//! (`benches/results/h10080gbhbm3/driver-call-costs.txt`). Only the wait kernel takes it:
//! watched and unbounded stream waits wait each for its own, as a batch of stream operations
//! holds 16 flags, two slots' among 8 ranks. Each rank may pick its own, as the waits are its
//! own. On one H100 at 2-16 MiB together ran 7-15 % slower than each between two processes,
//! 2-8 % among 4 and -5 to +4 % among 8 (`benches/results/h10080gbhbm3/comm-slot-waits.txt`),
//! so each is the default.

use crate::{Error, Result};

/// The environment variable that picks how a call waits for its first slots: `each` (the
/// default) or `together`.
pub const SLOT_WAITS_VAR: &str = "GP2P_SLOT_WAITS";

/// See the module.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum SlotWaits {
    /// A wait before each copy out, for its slot.
    #[default]
    Each,
    /// One wait before the first copy out, for every slot the first chunks take.
    Together,
}

impl SlotWaits {
    /// The waits `env`, the value of [`SLOT_WAITS_VAR`] if set, names (in any case); unset or
    /// empty: [`SlotWaits::Each`]. Any other value is refused, naming the variable.
    pub(crate) fn resolve(env: Option<&str>) -> Result<SlotWaits> {
        let value = env.map(|v| v.trim().to_ascii_lowercase()).filter(|v| !v.is_empty());
        match value.as_deref() {
            None | Some("each") => Ok(SlotWaits::Each),
            Some("together") => Ok(SlotWaits::Together),
            Some(other) => Err(Error::InvalidOption {
                name: SLOT_WAITS_VAR,
                reason: format!("{other:?} is neither \"each\" nor \"together\": set it to one of them, or unset it"),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_unless_together_is_named_and_anything_else_is_refused_by_name() {
        assert_eq!(SlotWaits::resolve(None).unwrap(), SlotWaits::Each);
        assert_eq!(SlotWaits::resolve(Some(" ")).unwrap(), SlotWaits::Each);
        assert_eq!(SlotWaits::resolve(Some("each")).unwrap(), SlotWaits::Each);
        assert_eq!(SlotWaits::resolve(Some(" together ")).unwrap(), SlotWaits::Together);
        assert_eq!(SlotWaits::resolve(Some("Together")).unwrap(), SlotWaits::Together);
        match SlotWaits::resolve(Some("all")) {
            Err(Error::InvalidOption { name, reason }) => {
                assert_eq!(name, SLOT_WAITS_VAR);
                assert!(reason.contains("\"all\"") && reason.contains("together"), "{reason}");
            }
            other => panic!("a value naming no waits: {other:?}"),
        }
    }
}
