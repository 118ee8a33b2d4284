//! The pipeline in rounds (more than two ranks; two on one GPU, forced to two-shot, or
//! compressed): a call is a list of *legs* (plain data, built and
//! proven on host buffers in [`gp2p_collectives::legs`], with the table of what each
//! collective moves), each one rank (the writer) handing a range of one of its buffers to one
//! or every other rank (its readers) through the writer's slots of the segment, in *rounds*.
//! [`gp2p_collectives::legs::steps`] turns one rank's part of the legs into the steps it
//! enqueues on its two streams (its doc says how slots, flags and the order of the steps
//! keep every chunk whole and every order of running them free of deadlock), which
//! `pipeline` runs here with flags in the segment; the in-process engine runs the same steps
//! with events. The tests here run every rank's steps on a model of the flags, slots and
//! events, in many orders, and check that every chunk lands whole, folded in the right
//! order, and that nothing deadlocks.

pub(crate) use gp2p_collectives::legs::steps::{
    LaneWaits, LegStep, chunk_range, first_slot_waits_together, sent_after, steps,
};
pub(crate) use gp2p_collectives::legs::{Buf, LegLanding, Rounds};
#[cfg(test)]
pub(crate) use gp2p_collectives::legs::{SHARE_ALIGN, share};

#[cfg(test)]
mod tests;
