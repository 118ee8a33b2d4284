//! How a rank's pipeline folds the chunks that land in its slots
//! ([`CommOptions::receive`](crate::CommOptions::receive)): read in place across the link
//! (zero-copy), or copied into device memory by DMA first (scratch). Scratch is the default:
//! on one H100 shared by N processes under MPS, f32 sum
//! (`benches/results/h10080gbhbm3/comm-receive.txt`), it took two ranks' exchange from 0.57
//! to 0.88 of bound at 256 MiB (18.7 to 12.2 ms) and four ranks' rounds from 0.79 to 0.85,
//! and it was faster at every size from 4 MiB on; the in-process engine had measured the
//! same on an H200. Each rank picks its own, since both folds give the same bits.

use gp2p_collectives::Receive;

use crate::{Error, Result};

/// The environment variable that picks the receive path where the options leave it to
/// [`Receive::Auto`]: `auto`, `scratch` or `zero-copy`.
pub const RECEIVE_VAR: &str = "GP2P_RECEIVE";

/// The path a communicator made with `option` takes, given `env`, the value of
/// [`RECEIVE_VAR`] if set: the option where it names one, else the variable's, else
/// scratch. A value that names no path is refused, naming the variable.
pub(crate) fn resolve(option: Receive, env: Option<&str>) -> Result<Receive> {
    let asked = match (option, env.map(str::trim).filter(|v| !v.is_empty())) {
        (Receive::Auto, Some(value)) => value.parse().map_err(|e: gp2p_collectives::UnknownReceive| {
            Error::InvalidOption { name: RECEIVE_VAR, reason: e.to_string() }
        })?,
        (option, _) => option,
    };
    Ok(match asked {
        Receive::Auto => Receive::Scratch,
        path => path,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_option_wins_then_the_variable_then_scratch() {
        assert_eq!(resolve(Receive::Scratch, Some("zero-copy")).unwrap(), Receive::Scratch);
        assert_eq!(resolve(Receive::ZeroCopy, Some("scratch")).unwrap(), Receive::ZeroCopy);
        assert_eq!(resolve(Receive::Auto, Some("zero-copy")).unwrap(), Receive::ZeroCopy);
        assert_eq!(resolve(Receive::Auto, Some(" Zero-Copy ")).unwrap(), Receive::ZeroCopy);
        assert_eq!(resolve(Receive::Auto, Some("auto")).unwrap(), Receive::Scratch);
        assert_eq!(resolve(Receive::Auto, Some("")).unwrap(), Receive::Scratch);
        assert_eq!(resolve(Receive::Auto, None).unwrap(), Receive::Scratch);
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
