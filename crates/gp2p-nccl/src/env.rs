//! The door's environment variables: `GP2P_NCCL` (serve, hand over, or decide) and
//! `GP2P_NCCL_REAL` (where the real NCCL is), read where they are needed.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The variable that turns the door on, off, or on everywhere.
pub const MODE_VAR: &str = "GP2P_NCCL";
/// The variable that names the real NCCL's shared object.
pub const REAL_VAR: &str = "GP2P_NCCL_REAL";
/// The variable that bounds how long a rank waits for the others at creation, in seconds.
pub const TIMEOUT_VAR: &str = "GP2P_NCCL_TIMEOUT";
/// The variable that bounds how long a served call's wait for another rank spins on the GPU,
/// in seconds.
pub const PEER_TIMEOUT_VAR: &str = "GP2P_NCCL_PEER_TIMEOUT";
/// How long a wait for another rank spins where [`PEER_TIMEOUT_VAR`] is unset: torch's own
/// default timeout, at which its watchdog aborts the communicator anyway. NCCL's waits have
/// no bound; a rank that exits is seen sooner, at the next `ncclCommGetAsyncError` that finds
/// the communicator free (`crate::served::Served::async_error`).
pub const DEFAULT_PEER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

/// How long creation waits for every rank where [`TIMEOUT_VAR`] is unset: NCCL's bootstrap
/// has no shorter bound, and torch's own init timeout (10 minutes) sits above it.
pub const DEFAULT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);

/// What `GP2P_NCCL` asks of the door.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Mode {
    /// Unset or `auto`: serve a communicator whose ranks share a host, are at most eight,
    /// and whose devices have no usable P2P between any two; hand over every other.
    Auto,
    /// `force`: serve wherever the door can (one host, at most eight ranks), P2P or not: for
    /// measuring the door against NCCL on cards that have P2P.
    Force,
    /// `off`: hand every communicator to the real NCCL, untouched.
    Off,
}

impl Mode {
    /// The mode `GP2P_NCCL`'s value names (`None`: unset).
    ///
    /// # Errors
    /// [`Error::Environment`] for any other value than `auto`, `force`, `off` (any case) or
    /// blank.
    pub fn from_value(value: Option<&str>) -> Result<Mode> {
        let Some(value) = value.map(str::trim).filter(|v| !v.is_empty()) else {
            return Ok(Mode::Auto);
        };
        match value.to_ascii_lowercase().as_str() {
            "auto" => Ok(Mode::Auto),
            "force" => Ok(Mode::Force),
            "off" | "0" => Ok(Mode::Off),
            _ => Err(Error::Environment {
                name: MODE_VAR,
                value: value.to_owned(),
                expected: "expected auto, force or off",
            }),
        }
    }

    /// This process's mode.
    ///
    /// # Errors
    /// As [`Mode::from_value`].
    pub fn current() -> Result<Mode> {
        Mode::from_value(std::env::var(MODE_VAR).ok().as_deref())
    }
}

/// How long creation waits for the other ranks: [`TIMEOUT_VAR`] in seconds, else
/// [`DEFAULT_TIMEOUT`].
///
/// # Errors
/// [`Error::Environment`] for a value that is not a positive number of seconds.
pub fn timeout() -> Result<std::time::Duration> {
    timeout_from(std::env::var(TIMEOUT_VAR).ok().as_deref())
}

/// How long a served call's wait for another rank spins: [`PEER_TIMEOUT_VAR`] in seconds,
/// else [`DEFAULT_PEER_TIMEOUT`].
///
/// # Errors
/// [`Error::Environment`] for a value that is not a positive number of seconds.
pub fn peer_timeout() -> Result<std::time::Duration> {
    let value = std::env::var(PEER_TIMEOUT_VAR).ok();
    let timeout = seconds_from(PEER_TIMEOUT_VAR, value.as_deref(), DEFAULT_PEER_TIMEOUT)?;
    if timeout > MAX_PEER_TIMEOUT {
        return Err(Error::Environment {
            name: PEER_TIMEOUT_VAR,
            value: value.unwrap_or_default(),
            expected: "expected at most 3600 seconds (a wait spins on the GPU for that long at most)",
        });
    }
    Ok(timeout)
}

/// The longest wait a communicator spins for (`gp2p_comm`'s own bound).
const MAX_PEER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3600);

fn timeout_from(value: Option<&str>) -> Result<std::time::Duration> {
    seconds_from(TIMEOUT_VAR, value, DEFAULT_TIMEOUT)
}

fn seconds_from(name: &'static str, value: Option<&str>, default: std::time::Duration) -> Result<std::time::Duration> {
    let Some(value) = value.map(str::trim).filter(|v| !v.is_empty()) else {
        return Ok(default);
    };
    value
        .parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s > 0.0 && *s <= 3600.0 * 24.0)
        .map(std::time::Duration::from_secs_f64)
        .ok_or_else(|| Error::Environment {
            name,
            value: value.to_owned(),
            expected: "expected a positive number of seconds",
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_anything_else_is_refused_by_name() {
        assert_eq!(Mode::from_value(None).ok(), Some(Mode::Auto));
        assert_eq!(Mode::from_value(Some(" ")).ok(), Some(Mode::Auto));
        assert_eq!(Mode::from_value(Some("FORCE")).ok(), Some(Mode::Force));
        assert_eq!(Mode::from_value(Some("off")).ok(), Some(Mode::Off));
        let e = Mode::from_value(Some("yes")).err().map(|e| e.to_string()).unwrap_or_default();
        assert_eq!(e, "GP2P_NCCL=yes: expected auto, force or off");
    }

    #[test]
    fn timeouts_are_positive_seconds() {
        assert_eq!(timeout_from(None).ok(), Some(DEFAULT_TIMEOUT));
        assert_eq!(timeout_from(Some("2.5")).ok(), Some(std::time::Duration::from_millis(2500)));
        assert!(timeout_from(Some("0")).is_err());
        assert!(timeout_from(Some("soon")).is_err());
    }
}
