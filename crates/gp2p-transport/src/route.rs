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
    /// Every route, in the order `--help` lists them.
    pub const ALL: [Route; 3] = [Route::Auto, Route::Peer, Route::Staged];

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
        Route::ALL
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

/// The route a copy between two devices takes, as the engine chooses it: like [`resolve`],
/// except that `Route::Auto` on a pair the [`PeerPolicy`](crate::PeerPolicy) distrusts goes
/// staged. `peer_both_ways` asks the driver (and, in the engine, enables peer access); it
/// runs only when its answer can change the route, so a staged or distrusted copy never
/// maps the peer. `None` when Peer is forced without P2P.
pub fn choose<E>(
    asked: Route,
    same_device: bool,
    distrusted: bool,
    peer_both_ways: impl FnOnce() -> Result<bool, E>,
) -> Result<Option<Route>, E> {
    if same_device {
        return Ok(resolve(asked, true, true));
    }
    match asked {
        Route::Staged => Ok(Some(Route::Staged)),
        Route::Auto if distrusted => Ok(Some(Route::Staged)),
        _ => Ok(resolve(asked, false, peer_both_ways()?)),
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
    fn auto_stays_off_a_distrusted_pair_unless_peer_is_forced() {
        let never = || -> Result<bool, &str> { Err("the driver must not be asked") };
        let yes = || -> Result<bool, &str> { Ok(true) };
        // Distrusted: Auto stages without asking the driver (no peer mapping is made)...
        assert_eq!(choose(Route::Auto, false, true, never), Ok(Some(Route::Staged)));
        // ...Peer forced still goes peer where the driver offers it, and fails where not.
        assert_eq!(choose(Route::Peer, false, true, yes), Ok(Some(Route::Peer)));
        assert_eq!(choose(Route::Peer, false, true, || Ok::<_, &str>(false)), Ok(None));
        // Trusted: Auto takes peer where offered; staged never asks.
        assert_eq!(choose(Route::Auto, false, false, yes), Ok(Some(Route::Peer)));
        assert_eq!(choose(Route::Auto, false, false, || Ok::<_, &str>(false)), Ok(Some(Route::Staged)));
        assert_eq!(choose(Route::Staged, false, false, never), Ok(Some(Route::Staged)));
        // One device is a device copy whatever the policy says, and asks nothing.
        assert_eq!(choose(Route::Auto, true, true, never), Ok(Some(Route::Peer)));
        // A driver failure is the copy's failure.
        assert_eq!(choose(Route::Auto, false, false, never), Err("the driver must not be asked"));
    }

    #[test]
    fn names_round_trip() {
        for r in Route::ALL {
            assert_eq!(r.name().parse::<Route>(), Ok(r));
        }
        assert!("p2p".parse::<Route>().is_err());
    }
}
