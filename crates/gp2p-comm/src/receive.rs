//! How a rank's pipeline folds the chunks that land in its slots
//! ([`CommOptions::receive`](crate::CommOptions::receive)): read in place across the link
//! (zero-copy), or copied into device memory by DMA first (scratch), which the in-process
//! engine measured faster on one shared link (`benches/results/h200/all-reduce-256M-*.txt`).
//! The communicator's choice stays zero-copy until its own runs say otherwise; each rank
//! picks its own, since both folds give the same bits.

use gp2p_collectives::Receive;

use crate::{Error, Result};

/// The environment variable that picks the receive path where the options leave it to
/// [`Receive::Auto`]: `auto`, `scratch` or `zero-copy`.
pub const RECEIVE_VAR: &str = "GP2P_RECEIVE";

/// The path a communicator made with `option` takes, given `env`, the value of
/// [`RECEIVE_VAR`] if set: the option where it names one, else the variable's, else
/// zero-copy. A value that names no path is refused, naming the variable.
pub(crate) fn resolve(option: Receive, env: Option<&str>) -> Result<Receive> {
    let asked = match (option, env.map(str::trim).filter(|v| !v.is_empty())) {
        (Receive::Auto, Some(value)) => value.parse().map_err(|e: gp2p_collectives::UnknownReceive| {
            Error::InvalidOption { name: RECEIVE_VAR, reason: e.to_string() }
        })?,
        (option, _) => option,
    };
    Ok(match asked {
        Receive::Auto => Receive::ZeroCopy,
        path => path,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_option_wins_then_the_variable_then_zero_copy() {
        assert_eq!(resolve(Receive::Scratch, Some("zero-copy")).unwrap(), Receive::Scratch);
        assert_eq!(resolve(Receive::ZeroCopy, Some("scratch")).unwrap(), Receive::ZeroCopy);
        assert_eq!(resolve(Receive::Auto, Some("scratch")).unwrap(), Receive::Scratch);
        assert_eq!(resolve(Receive::Auto, Some(" Zero-Copy ")).unwrap(), Receive::ZeroCopy);
        assert_eq!(resolve(Receive::Auto, Some("auto")).unwrap(), Receive::ZeroCopy);
        assert_eq!(resolve(Receive::Auto, Some("")).unwrap(), Receive::ZeroCopy);
        assert_eq!(resolve(Receive::Auto, None).unwrap(), Receive::ZeroCopy);
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
