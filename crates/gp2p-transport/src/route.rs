//! `Route`: how a copy travels between two devices.

use std::fmt;
use std::str::FromStr;

/// How a device-to-device copy travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Route {
    /// Peer DMA where the pair allows it both ways (and a plain device copy on one device),
    /// else the staged pipeline.
    #[default]
    Auto,
    /// One peer DMA (a device-to-device copy on one device). An error on a pair without P2P.
    Peer,
    /// The pipelined copy through pinned host slots, even where P2P works (tests, benches,
    /// and what a GeForce pair gets).
    Staged,
}

impl Route {
    /// Short lowercase name.
    pub const fn name(self) -> &'static str {
        match self {
            Route::Auto => "auto",
            Route::Peer => "peer",
            Route::Staged => "staged",
        }
    }
}

impl fmt::Display for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A string that names no [`Route`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown route {given:?}: expected auto, peer or staged")]
pub struct UnknownRoute {
    /// What was given.
    pub given: String,
}

impl FromStr for Route {
    type Err = UnknownRoute;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [Route::Auto, Route::Peer, Route::Staged]
            .into_iter()
            .find(|r| r.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| UnknownRoute { given: s.to_owned() })
    }
}

/// The route a copy takes, given what was asked and whether the pair has P2P both ways;
/// `None` when Peer is forced without P2P. Pure: the engine and the tests share it.
pub fn resolve(asked: Route, same_device: bool, peer_both_ways: bool) -> Option<Route> {
    match asked {
        Route::Staged => Some(Route::Staged),
        Route::Peer if same_device || peer_both_ways => Some(Route::Peer),
        Route::Peer => None,
        Route::Auto if same_device || peer_both_ways => Some(Route::Peer),
        Route::Auto => Some(Route::Staged),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_prefers_peer_and_falls_back_to_staged() {
        assert_eq!(resolve(Route::Auto, false, true), Some(Route::Peer));
        assert_eq!(resolve(Route::Auto, false, false), Some(Route::Staged));
        assert_eq!(resolve(Route::Auto, true, false), Some(Route::Peer), "one device: a device copy");
        assert_eq!(resolve(Route::Staged, false, true), Some(Route::Staged));
        assert_eq!(resolve(Route::Peer, false, false), None);
        assert_eq!(resolve(Route::Peer, true, false), Some(Route::Peer));
    }

    #[test]
    fn names_round_trip() {
        for r in [Route::Auto, Route::Peer, Route::Staged] {
            assert_eq!(r.name().parse::<Route>(), Ok(r));
        }
        assert!("p2p".parse::<Route>().is_err());
    }
}
