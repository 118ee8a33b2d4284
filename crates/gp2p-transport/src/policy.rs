//! `PeerPolicy`: device pairs whose P2P the engine must not choose by itself, because the
//! caller knows something the driver's yes does not say (e.g. a patched driver forcing P2P
//! over a BAR1 smaller than VRAM, or through a translating IOMMU, where copies fail or
//! corrupt data silently). Plain data the layer above fills in; the engine only reads it.

use std::collections::HashMap;

use parking_lot::RwLock;

use crate::Transport;

/// Pairs of devices, by ordinal, whose P2P [`Route::Auto`](crate::Route::Auto) must not
/// use. A copy on such a pair goes staged unless the caller forces
/// [`Route::Peer`](crate::Route::Peer). A pair is unordered: a peer copy enables access
/// both ways, so distrusting (0, 1) covers copies 1 → 0 too.
///
/// Thread-safe: reads (one per copy) and writes may come from any thread; a change applies
/// to copies that start after it.
#[derive(Debug, Default)]
pub struct PeerPolicy {
    distrusted: RwLock<HashMap<(usize, usize), String>>,
}

impl PeerPolicy {
    /// An empty policy: every pair's P2P may be used where the driver offers it.
    pub fn new() -> Self {
        Self::default()
    }

    /// Keep `Route::Auto` off P2P between devices `a` and `b`, for the reason given (shown
    /// to people; the first reason given for a pair is kept).
    pub fn distrust(&self, a: usize, b: usize, why: impl Into<String>) {
        self.distrusted.write().entry(key(a, b)).or_insert_with(|| why.into());
    }

    /// Let `Route::Auto` use P2P between `a` and `b` again where the driver offers it.
    pub fn trust(&self, a: usize, b: usize) {
        self.distrusted.write().remove(&key(a, b));
    }

    /// Why P2P between `a` and `b` is distrusted, or `None` when it is not.
    pub fn distrusted(&self, a: usize, b: usize) -> Option<String> {
        self.distrusted.read().get(&key(a, b)).cloned()
    }

    /// Whether P2P between `a` and `b` is distrusted (what each copy asks; no allocation).
    pub fn is_distrusted(&self, a: usize, b: usize) -> bool {
        self.distrusted.read().contains_key(&key(a, b))
    }
}

fn key(a: usize, b: usize) -> (usize, usize) {
    (a.min(b), a.max(b))
}

impl Transport {
    /// The pairs whose P2P this engine's `Route::Auto` does not use. The facade fills it
    /// from the probe's verdicts; fill it yourself for an engine of your own.
    pub fn peer_policy(&self) -> &PeerPolicy {
        &self.policy
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_are_unordered_and_the_first_reason_is_kept() {
        let policy = PeerPolicy::new();
        assert_eq!(policy.distrusted(0, 1), None);
        policy.distrust(1, 0, "the IOMMU translates device 0's DMA");
        policy.distrust(0, 1, "a second reason");
        assert_eq!(policy.distrusted(0, 1).as_deref(), Some("the IOMMU translates device 0's DMA"));
        assert_eq!(policy.distrusted(1, 0), policy.distrusted(0, 1));
        assert_eq!(policy.distrusted(0, 2), None, "other pairs are untouched");
        assert!(policy.is_distrusted(1, 0) && !policy.is_distrusted(0, 2));
        policy.trust(0, 1);
        assert_eq!(policy.distrusted(1, 0), None);
    }

    #[test]
    fn an_engine_starts_trusting_every_pair() {
        // Creating an engine touches no GPU, so this runs anywhere.
        let transport = Transport::new();
        assert_eq!(transport.peer_policy().distrusted(0, 1), None);
        transport.peer_policy().distrust(0, 1, "why");
        assert!(transport.peer_policy().distrusted(1, 0).is_some());
    }
}
