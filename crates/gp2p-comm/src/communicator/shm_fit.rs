//! The slot a communicator makes (the caller's, or the default sized for compression and
//! fitted to this host's /dev/shm, `crate::fit_slot_to_shm`), and compression's minimum priced
//! with it.

use crate::compression::{Resolved, requested, resolve};
use crate::layout::{CommOptions, Layout};
use crate::slots::{MANY_RANK_SLOTS, SHM_SHARE, TWO_RANK_SLOTS, is_default_slot};
use crate::{Result, fit_slot_to_shm};

/// `options` with their slot settled ([`settled_slot`]) for `world` ranks on a host of `shm`
/// bytes of /dev/shm, and the compression they or `env` (the value of `crate::COMPRESS_VAR`)
/// ask for, its minimum priced with that slot: what a communicator makes and every rank
/// compares.
///
/// # Errors
/// [`crate::Error::InvalidOption`] for options or a variable a communicator refuses.
pub(crate) fn settle(
    options: CommOptions,
    world: usize,
    env: Option<&str>,
    shm: Option<u64>,
) -> Result<(CommOptions, Option<Resolved>)> {
    let asked = requested(&options, env)?;
    let options = chunks_fitted(options, world, shm)?;
    let options = settled_slot(options, world, asked.is_some(), shm)?;
    let compress = resolve(asked, world, &options)?;
    Ok((options, compress))
}

/// The size of /dev/shm, where the communicators' segments live (its file system's, as
/// statvfs gives it); `None` where it cannot be read or has no limit (a tmpfs mounted with
/// size=0 reports no blocks).
pub(crate) fn shm_bytes() -> Option<u64> {
    let fs = rustix::fs::statvfs(crate::id::SHM_DIR).ok()?;
    Some(fs.f_blocks.saturating_mul(fs.f_frsize)).filter(|&bytes| bytes > 0)
}

/// `options` without the many-rank flagged chunks where their areas (each rank's two halves
/// of room for `small_max_bytes`: about 9, 11 and 20 MiB among 3, 4 and 8 ranks at 1 MiB)
/// would take more than half the share of /dev/shm the segment may have: a small /dev/shm
/// (16 MiB, say) then still holds the rounds' slots, where the areas alone would have left no
/// room; Docker's 64 MiB keeps them, at smaller slots. Every rank sees the same /dev/shm, so
/// all decide alike (and compare the option at creation).
fn chunks_fitted(options: CommOptions, world: usize, shm: Option<u64>) -> Result<CommOptions> {
    let Some(shm) = shm else { return Ok(options) };
    if !options.many_chunks {
        return Ok(options);
    }
    let with = Layout::new(world, &options)?;
    let without = CommOptions { many_chunks: false, ..options };
    let areas = with.slots_offset.saturating_sub(Layout::new(world, &without)?.slots_offset) as u64;
    let room = shm / SHM_SHARE.1 * SHM_SHARE.0;
    Ok(if areas > room / 2 { without } else { options })
}

/// `options` with the slot a communicator of `world` ranks makes, before anything is priced
/// with it: a slot the caller chose stays; the default grows where the communicator compresses
/// (`compressing`, `crate::compression::slot_bytes`), then shrinks to fit `shm` bytes of
/// /dev/shm ([`fitted_to_shm`]). Where that shrinks the four slots more than two ranks take by
/// default ([`MANY_RANK_SLOTS`]) below three quarters of their size, they take three, a third
/// larger each, as before there were four: much larger slots measured far ahead of a slot more
/// (`crate::SLOT_SPAN_BYTES` and [`MANY_RANK_SLOTS`] say by how much), so Docker's 64 MiB
/// keeps 16 MiB / N; slightly smaller ones keep the fourth.
///
/// # Errors
/// [`crate::Error::InvalidOption`] for options a communicator refuses.
fn settled_slot(options: CommOptions, world: usize, compressing: bool, shm: Option<u64>) -> Result<CommOptions> {
    if !is_default_slot(options.slot_bytes, world) {
        return Ok(options);
    }
    let slot_bytes = crate::compression::slot_bytes(&options, world, compressing);
    let fitted = fitted_to_shm(CommOptions { slot_bytes, ..options }, world, shm)?;
    if world > 2 && options.slots == MANY_RANK_SLOTS && fitted.slot_bytes < slot_bytes / 4 * 3 {
        let three = fitted_to_shm(CommOptions { slot_bytes, slots: TWO_RANK_SLOTS, ..options }, world, shm)?;
        if three.slot_bytes > fitted.slot_bytes {
            return Ok(three);
        }
    }
    Ok(fitted)
}

/// `options` with their slot fitted to `shm` bytes of /dev/shm ([`fit_slot_to_shm`]), the
/// segment's bytes besides the slots counted, never below a chunk the options fix (a chunk
/// must fit a slot).
fn fitted_to_shm(options: CommOptions, world: usize, shm: Option<u64>) -> Result<CommOptions> {
    let layout = Layout::new(world, &options)?;
    // Slots are whole 64 KiB, so the staging area's tail pads only what comes before them.
    let other = crate::segment::staging_offset(world) + layout.slots_offset.next_multiple_of(crate::STAGING_ALIGN);
    let fitted = fit_slot_to_shm(options.slot_bytes, world, options.slots, other, shm);
    let floor = options.chunk_bytes.unwrap_or(0).min(options.slot_bytes);
    Ok(CommOptions { slot_bytes: fitted.max(floor), ..options })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compression::{compressing_slot_bytes, min_bytes_h200};
    use crate::slots::MIN_SLOT_BYTES;

    const DOCKER_SHM: Option<u64> = Some(64 << 20);

    #[test]
    fn the_flagged_chunks_areas_stay_only_where_they_take_at_most_half_the_room() {
        for world in 3..=8 {
            let options = CommOptions::for_world(world);
            assert!(options.many_chunks, "{world} ranks");
            for shm in [None, Some(1 << 40), DOCKER_SHM] {
                assert_eq!(chunks_fitted(options, world, shm).unwrap(), options, "{world} ranks, {shm:?}");
            }
            // 16 MiB: the areas alone (9-20 MiB) would fill it; the rounds' slots stay.
            let small = settle(options, world, None, Some(16 << 20)).unwrap().0;
            assert!(!small.many_chunks, "{world} ranks");
            assert_eq!(Layout::new(world, &small).unwrap().small_max, 64 << 10, "{world} ranks: the lines only");
        }
        let two = CommOptions::for_world(2);
        assert_eq!(chunks_fitted(two, 2, Some(16 << 20)).unwrap(), two, "two ranks have no such areas");
    }

    #[test]
    fn fitting_keeps_a_valid_layout_and_a_fixed_chunk() {
        for world in 2..=8 {
            let options = CommOptions::for_world(world);
            for shm in [None, Some(1 << 40), DOCKER_SHM, Some(1)] {
                let fitted = settled_slot(options, world, false, shm).unwrap();
                let slot = fitted.slot_bytes;
                assert!(slot <= options.slot_bytes && slot % MIN_SLOT_BYTES == 0, "{world} ranks, {shm:?}");
                // Only the slot changes, and the count where four default slots shrank.
                let slots = options.slots;
                assert_eq!(CommOptions { slot_bytes: options.slot_bytes, slots, ..fitted }, options, "{world} ranks");
                assert!(fitted.slots == options.slots || (fitted.slots == 3 && slot < options.slot_bytes));
                Layout::new(world, &fitted).unwrap();
            }
            assert_eq!(settled_slot(options, world, false, None).unwrap(), options, "{world} ranks, shm unknown");
            let fixed = CommOptions { chunk_bytes: Some(options.slot_bytes), ..options };
            assert_eq!(settled_slot(fixed, world, false, DOCKER_SHM).unwrap().slot_bytes, options.slot_bytes);
            let chosen = CommOptions { slot_bytes: 32 << 20, ..options };
            assert_eq!(settled_slot(chosen, world, true, DOCKER_SHM).unwrap(), chosen, "{world} ranks: chosen");
        }
        let bad = CommOptions { slots: 99, ..CommOptions::for_world(4) };
        assert!(settled_slot(bad, 4, false, DOCKER_SHM).is_err());
    }

    #[test]
    fn four_default_slots_that_a_small_shm_would_shrink_are_three_larger_ones() {
        const MIB: usize = 1 << 20;
        for world in 3..=8 {
            let options = CommOptions::for_world(world);
            assert_eq!(options.slots, MANY_RANK_SLOTS);
            // Docker's 64 MiB: three of a little under 16 MiB / N, as before four, not four
            // of 12 MiB / N.
            let docker = settled_slot(options, world, false, DOCKER_SHM).unwrap();
            assert_eq!(docker.slots, 3, "{world} ranks");
            let four = fitted_to_shm(options, world, DOCKER_SHM).unwrap().slot_bytes;
            assert!(docker.slot_bytes > four && docker.slot_bytes <= 16 * MIB / world, "{world} ranks: {docker:?}");
            // Room for four of the default: four.
            assert_eq!(settled_slot(options, world, false, Some(1 << 30)).unwrap(), options, "{world} ranks");
            // Room for four a little smaller (a tenth less /dev/shm than the slots need, the
            // flagged chunks' areas besides): still four.
            let need = 4 * (world * options.slots * options.slot_bytes) as u64 / 3 / 10 * 9;
            let near = settled_slot(options, world, false, Some(need)).unwrap();
            assert!(near.slots == 4 && near.slot_bytes < options.slot_bytes, "{world} ranks: {near:?}");
            // No room for either: the floor, four of it.
            assert_eq!(settled_slot(options, world, false, Some(1)).unwrap().slots, 4, "{world} ranks");
            // A chosen slot, or a chosen count of slots, stays as it is.
            let chosen = CommOptions { slot_bytes: MIB, ..options };
            assert_eq!(settled_slot(chosen, world, false, DOCKER_SHM).unwrap(), chosen);
            let five = CommOptions { slots: 5, ..options };
            assert_eq!(settled_slot(five, world, false, DOCKER_SHM).unwrap().slots, 5);
        }
        // Two ranks keep their three.
        assert_eq!(settled_slot(CommOptions::for_world(2), 2, false, DOCKER_SHM).unwrap().slots, 3);
    }

    #[test]
    fn compression_is_priced_with_the_slot_the_communicator_makes() {
        let int8 = compression_from_int8();
        // Slots of 64 KiB to about 1 MiB, a piece each: the model prices many more pieces' steps.
        const SMALL_SHM: Option<u64> = Some(16 << 20);
        let mut moved = 0;
        for world in 2..=8 {
            let options = CommOptions::for_world(world);
            let (roomy, at_roomy) = settle(options, world, Some("int8"), None).unwrap();
            assert_eq!(roomy.slot_bytes, compressing_slot_bytes(&options, world), "{world} ranks");
            assert_eq!(at_roomy.unwrap().min_bytes, min_bytes_h200(world, int8), "{world} ranks");
            let (small, at_small) = settle(options, world, Some("int8"), SMALL_SHM).unwrap();
            assert!(small.slot_bytes < roomy.slot_bytes, "{world} ranks: {} bytes", small.slot_bytes);
            let priced_small = crate::compression::min_bytes(
                &gp2p_collectives::cost::Machine::h200(world),
                &crate::choice::AllReducePaths::of(world, &small, None).unwrap(),
                small.slot_bytes,
                int8,
            );
            let at_small = at_small.unwrap().min_bytes;
            assert_eq!(at_small, priced_small, "{world} ranks");
            moved += usize::from(at_small != at_roomy.unwrap().min_bytes);
            let (exact, none) = settle(options, world, None, SMALL_SHM).unwrap();
            assert!(none.is_none() && exact.slot_bytes <= options.slot_bytes, "{world} ranks");
            let given = settle(options, world, Some("int8@3K"), SMALL_SHM).unwrap().1.unwrap();
            assert_eq!(given.min_bytes, 3 << 10, "{world} ranks: a given minimum stays");
        }
        assert!(moved > 0, "the smaller slot moves the minimum somewhere, or this checks nothing");
    }

    fn compression_from_int8() -> gp2p_cuda::codec::WireFormat {
        crate::compression_from(Some("int8")).unwrap().unwrap().format
    }
}
