//! Events by number for the pipeline: the marks of a call in rounds and the folds of a
//! compressed call's pieces.

use std::sync::Mutex;

use gp2p_cuda::{Device, Event, EventKind};

use crate::Result;

/// Events by number, each made on the first call that needs it (before that call enqueues
/// anything) and kept for the calls after: a call in rounds takes a mark a lane for about
/// each chunk of a leg that a chunk of the other lane waits for (a two-rank all-reduce of 1 GiB
/// in 8 MiB chunks, 64 of each), a compressed call an event a piece.
pub(super) struct Marks(Mutex<Vec<Event>>);

impl Default for Marks {
    fn default() -> Marks {
        Marks(Mutex::new(Vec::new()))
    }
}

impl Marks {
    /// `use_it` on event `number`, made (on `device`) if it is the first use of that number.
    pub(super) fn with<R>(&self, device: &Device, number: usize, use_it: impl FnOnce(&Event) -> R) -> Result<R> {
        let mut events = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        while events.len() <= number {
            events.push(Event::new(device, EventKind::Sync)?);
        }
        Ok(use_it(&events[number]))
    }
}
