//! How a rank's pipeline folds the chunks that land in its slots
//! ([`CommOptions::receive`](crate::CommOptions::receive)): read in place across the link
//! (zero-copy), or copied into device memory by DMA first (scratch). Scratch was faster at
//! every size from 4 MiB on: on one H100 shared by N processes under MPS, f32 sum
//! (`benches/results/h10080gbhbm3/comm-receive.txt`), it took two ranks' exchange from 0.57
//! to 0.88 of bound at 256 MiB (18.7 to 12.2 ms) and four ranks' rounds from 0.79 to 0.85;
//! the in-process engine had measured the same on an H200. Below, the DMA is one more
//! operation a chunk step for little data, and zero-copy won where a landing was at most
//! [`ZERO_COPY_MAX_LANDING`] (`benches/results/h10080gbhbm3/comm-small.txt`, two rounds in
//! turns, 1-4 MiB: among 4, 1 MiB (256 KiB landings) 4 % faster, 2 MiB (512 KiB) 2-3 %
//! slower; among 8, 1 and 2 MiB (128 and 256 KiB) 4-9 % faster, 4 MiB (512 KiB) 3-7 %
//! slower). So the default, [`Receive::Auto`], picks per landing (in two ranks' exchange too,
//! whose chunks are at least 1 MiB but for a short last one). Each rank picks its own, and
//! each landing, since both folds give the same bits.

use gp2p_collectives::Receive;

use crate::{Error, Result};

/// The environment variable that picks the receive path where the options leave it to
/// [`Receive::Auto`]: `auto`, `scratch` or `zero-copy`.
pub const RECEIVE_VAR: &str = "GP2P_RECEIVE";

/// The largest landing [`Receive::Auto`] folds from the slot in place; larger ones land in
/// the scratch first (see the module).
pub const ZERO_COPY_MAX_LANDING: usize = 256 * 1024;

/// The path a communicator made with `option` takes, given `env`, the value of
/// [`RECEIVE_VAR`] if set: the option where it names one, else the variable's, else
/// [`Receive::Auto`] (a scratch, and zero-copy for landings of at most
/// [`ZERO_COPY_MAX_LANDING`]). A value that names no path is refused, naming the variable.
pub(crate) fn resolve(option: Receive, env: Option<&str>) -> Result<Receive> {
    match (option, env.map(str::trim).filter(|v| !v.is_empty())) {
        (Receive::Auto, Some(value)) => value.parse().map_err(|e: gp2p_collectives::UnknownReceive| {
            Error::InvalidOption { name: RECEIVE_VAR, reason: e.to_string() }
        }),
        (option, _) => Ok(option),
    }
}

/// Whether a communicator resolved to `receive` folds a landing of `bytes` from the slot in
/// place rather than from its scratch: never under [`Receive::Scratch`], always under
/// [`Receive::ZeroCopy`], up to [`ZERO_COPY_MAX_LANDING`] under [`Receive::Auto`].
pub(crate) fn in_place(receive: Receive, bytes: usize) -> bool {
    match receive {
        Receive::Scratch => false,
        Receive::Auto => bytes <= ZERO_COPY_MAX_LANDING,
        Receive::ZeroCopy => true,
    }
}

/// Whether a communicator resolved to `receive` with slots of `slot_bytes` needs a scratch:
/// some landing (at most a slot) is not folded in place.
pub(crate) fn needs_scratch(receive: Receive, slot_bytes: usize) -> bool {
    !in_place(receive, slot_bytes)
}

impl crate::pipeline::RankSide<'_> {
    /// Where a landing of `bytes` to fold goes first: the scratch, or None (the slot in place).
    pub(crate) fn scratch_for(&self, bytes: usize) -> Option<gp2p_cuda::RawDevicePtr> {
        self.scratch.filter(|_| !in_place(self.receive, bytes))
    }
}

/// How a communicator resolved to `receive` lands, for reports: its name, and under
/// [`Receive::Auto`] where it switches.
pub fn describe(receive: Receive) -> String {
    match receive {
        Receive::Auto => format!("auto (zero-copy landings up to {} KiB, scratch above)", ZERO_COPY_MAX_LANDING / 1024),
        path => path.name().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_option_wins_then_the_variable_then_auto() {
        assert_eq!(resolve(Receive::Scratch, Some("zero-copy")).unwrap(), Receive::Scratch);
        assert_eq!(resolve(Receive::ZeroCopy, Some("scratch")).unwrap(), Receive::ZeroCopy);
        assert_eq!(resolve(Receive::Auto, Some("zero-copy")).unwrap(), Receive::ZeroCopy);
        assert_eq!(resolve(Receive::Auto, Some(" Zero-Copy ")).unwrap(), Receive::ZeroCopy);
        assert_eq!(resolve(Receive::Auto, Some("scratch")).unwrap(), Receive::Scratch);
        assert_eq!(resolve(Receive::Auto, Some("auto")).unwrap(), Receive::Auto);
        assert_eq!(resolve(Receive::Auto, Some("")).unwrap(), Receive::Auto);
        assert_eq!(resolve(Receive::Auto, None).unwrap(), Receive::Auto);
    }

    #[test]
    fn auto_folds_landings_up_to_256_kib_in_place_and_the_forced_paths_every_one_their_way() {
        assert!(in_place(Receive::Auto, 4096) && in_place(Receive::Auto, 256 * 1024));
        assert!(!in_place(Receive::Auto, 256 * 1024 + 4096) && !in_place(Receive::Auto, 512 * 1024));
        assert!(!in_place(Receive::Scratch, 4096) && !in_place(Receive::Scratch, 1));
        assert!(in_place(Receive::ZeroCopy, 64 << 20));
        assert!(!needs_scratch(Receive::Auto, 256 * 1024) && needs_scratch(Receive::Auto, 256 * 1024 + 4096));
        assert!(needs_scratch(Receive::Scratch, 4096) && !needs_scratch(Receive::ZeroCopy, 64 << 20));
        assert_eq!(describe(Receive::Auto), "auto (zero-copy landings up to 256 KiB, scratch above)");
        assert_eq!(describe(Receive::Scratch), "scratch");
    }

    #[test]
    fn a_value_that_names_no_path_is_refused_with_the_variable_and_the_choices() {
        match resolve(Receive::Auto, Some("dma")) {
            Err(Error::InvalidOption { name, reason }) => {
                assert_eq!(name, RECEIVE_VAR);
                assert!(
                    reason.contains("dma") && reason.contains("scratch") && reason.contains("zero-copy"),
                    "{reason}"
                );
            }
            other => panic!("{other:?}"),
        }
    }
}
