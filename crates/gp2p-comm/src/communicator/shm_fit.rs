//! A communicator's default slots fitted to this host's /dev/shm (`crate::fit_slot_to_shm`).

use crate::layout::{CommOptions, Layout};
use crate::{Result, fit_slot_to_shm};

/// The size of /dev/shm, where the communicators' segments live (its file system's, as
/// statvfs gives it); `None` where it cannot be read or has no limit (a tmpfs mounted with
/// size=0 reports no blocks).
fn shm_bytes() -> Option<u64> {
    let fs = rustix::fs::statvfs(crate::id::SHM_DIR).ok()?;
    Some(fs.f_blocks.saturating_mul(fs.f_frsize)).filter(|&bytes| bytes > 0)
}

/// `options` with their slot fitted to this host's /dev/shm ([`fit_slot_to_shm`]), the
/// segment's bytes besides the slots counted, never below a chunk the options fix (a chunk
/// must fit a slot).
///
/// # Errors
/// [`crate::Error::InvalidOption`] for options a communicator refuses.
pub(crate) fn fitted_to_shm(options: CommOptions, world: usize) -> Result<CommOptions> {
    let layout = Layout::new(world, &options)?;
    let slots = world * options.slots * options.slot_bytes;
    let other = (crate::segment::staging_offset(world) + layout.staging_bytes()).saturating_sub(slots);
    let fitted = fit_slot_to_shm(options.slot_bytes, world, options.slots, other, shm_bytes());
    let floor = options.chunk_bytes.unwrap_or(0).min(options.slot_bytes);
    Ok(CommOptions { slot_bytes: fitted.max(floor), ..options })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slots::SLOT_ALIGN;

    #[test]
    fn fitting_keeps_a_valid_layout_and_a_fixed_chunk() {
        for world in 2..=8 {
            let options = CommOptions::for_world(world);
            let fitted = fitted_to_shm(options, world).unwrap();
            assert!(fitted.slot_bytes <= options.slot_bytes && fitted.slot_bytes % SLOT_ALIGN == 0, "{world} ranks");
            assert_eq!(CommOptions { slot_bytes: options.slot_bytes, ..fitted }, options, "only the slot changes");
            Layout::new(world, &fitted).unwrap();
            let fixed = CommOptions { chunk_bytes: Some(options.slot_bytes), ..options };
            assert_eq!(fitted_to_shm(fixed, world).unwrap().slot_bytes, options.slot_bytes, "{world} ranks");
        }
        assert!(fitted_to_shm(CommOptions { slots: 99, ..CommOptions::for_world(4) }, 4).is_err());
    }
}
