//! How large a communicator's slots are by default: big enough that a call queues few GPU
//! operations, small enough for the host's /dev/shm.

/// One slot of every rank together, by default among more than two ranks (and for every
/// compressing communicator, `compressed_slot_bytes`): the rounds cut a
/// leg into chunks of a slot, and each chunk costs about 13 GPU operations a rank, so the
/// slot sets how many operations a call queues. On one H100, N processes under MPS, f32
/// all-reduce, one machine (`benches/results/h10080gbhbm3/comm-slots2M-8.txt`, the
/// default then, against `comm-slots8M-8.txt` and `comm-slots4M-8.txt`): among 8 at 64 MiB / 256 MiB, slots
/// of 2 MiB (16 MiB / N, the default before) ran at 0.829 / 0.818 of the bound with 2.6 / 87.5 ms of
/// host enqueue a call (its queue full), 4 MiB at 0.895 / 0.909 (0.3 / 58 ms), 8 MiB at 0.956
/// / 0.934 (0.2 / 9.4 ms); among 4, 16 MiB against 4 MiB: 0.910 / 0.916 against 0.892 / 0.892
/// (`comm-slots16M-4.txt`, `comm-slots4M-4.txt`), enqueue 0.27 ms against 21 ms at
/// 256 MiB. Among 8 with 8 MiB slots the other collectives rose too (another H100:
/// `comm-slots8M-<collective>-8.txt`): reduce-scatter 0.85 of its bound at 64-256 MiB
/// (0.70-0.73 with 2 MiB, `comm-slots2M-reduce-scatter-8.txt`), all-gather 0.97.
pub const SLOT_SPAN_BYTES: usize = 64 << 20;

/// Two ranks' slot by default. Measured on two H200s, one process each, f32 all-reduce at
/// 16 MiB / 64 MiB / 256 MiB / 1 GiB, ratio of the duplex ceiling (one call): 8 MiB x 3 slots
/// 0.80/0.88/0.88/0.94, 16 MiB x 2 0.68/0.87/0.90/0.93, 4 MiB x 3 (the single-process
/// engine's best) 0.63/0.76/0.81/0.79, 4 MiB x 4 0.75/0.79/0.82/0.79; 1-2 MiB slots
/// 0.55-0.70 (the sixth session in `git show 92b0a7c:benches/results/README.md`).
pub(crate) const TWO_RANK_SLOT_BYTES: usize = 8 << 20;

/// Slots a rank has by default between two ranks: three.
pub(crate) const TWO_RANK_SLOTS: usize = 3;

/// Slots a rank has by default among more than two ranks (two keep [`TWO_RANK_SLOTS`],
/// `CommOptions::default`): a chunk more in flight each way. On one H100 host, 4 and 8
/// processes under MPS, f32 all-reduce, each beside the three-slot default in the same call,
/// two rounds (`benches/results/h10080gbhbm3/comm-slots-tuning.txt`): among 4 at 4 / 16 / 64 /
/// 256 MiB four slots ran at 0.791 / 0.971 / 1.005 / 0.952 and 0.819 / 0.990 / 0.981 / 0.978
/// of the bound where three ran at 0.789 / 0.924 / 0.969 / 0.958 and 0.762 / 0.935 / 0.918 /
/// 0.954; among 8 at 0.629 / 0.907 / 0.993 / 0.972 and 0.648 / 0.907 / 0.963 / 0.955 against
/// 0.611 / 0.908 / 0.986 / 0.959 and 0.623 / 0.909 / 0.970 / 0.950. The cost: a third more
/// /dev/shm and pinned memory (256 MiB at the span's slots). Where /dev/shm has not the room
/// for four of the default size, a communicator takes three, larger (larger slots measured
/// far ahead of one more: [`SLOT_SPAN_BYTES`]), as it did before four.
pub(crate) const MANY_RANK_SLOTS: usize = 4;

/// The smallest slot; the defaults and the fitted slots keep to whole multiples of it.
pub(crate) const MIN_SLOT_BYTES: usize = 64 << 10;

/// [`SLOT_SPAN_BYTES`] / `world`, rounded down to 64 KiB.
pub(crate) fn span_slot_bytes(world: usize) -> usize {
    (SLOT_SPAN_BYTES / world.max(1) / MIN_SLOT_BYTES * MIN_SLOT_BYTES).max(MIN_SLOT_BYTES)
}

/// The slot of `world` ranks by default (`CommOptions::for_world`): [`TWO_RANK_SLOT_BYTES`]
/// for two (or one), [`span_slot_bytes`] for more.
pub(crate) fn default_slot_bytes(world: usize) -> usize {
    if world <= 2 { TWO_RANK_SLOT_BYTES } else { span_slot_bytes(world) }
}

/// Whether `slot_bytes` is `world` ranks' default slot, which a communicator sizes itself
/// (larger where it compresses, `compressed_slot_bytes`; smaller where /dev/shm is small,
/// [`fit_slot_to_shm`]); a slot the caller chose stays as it is.
pub(crate) fn is_default_slot(slot_bytes: usize, world: usize) -> bool {
    slot_bytes == default_slot_bytes(world)
}

/// The share of /dev/shm a communicator's segment may take with its default slots: where it
/// would need more, [`fit_slot_to_shm`] makes the slots smaller. Docker's default /dev/shm of
/// 64 MiB then gets three slots a rank of a little under 16 MiB / N among 3 to 8 ranks without
/// the flagged chunks (what every communicator took before [`SLOT_SPAN_BYTES`]; four would be
/// 12 MiB / N, and three larger ones are taken instead, `communicator::shm_fit`), less with
/// their areas (9-20 MiB among 3 to 8: about 9 MiB / N among 8), and two ranks, whose
/// one-kernel areas take 16 MiB more, slots of about 5 MiB (where 8 MiB ones did not fit at
/// all).
pub(crate) const SHM_SHARE: (u64, u64) = (3, 4);

/// The largest slot of at most `slot_bytes` (whole 64 KiB, at least 64 KiB) with which a
/// segment of `other_bytes` besides its `world` × `slots` slots takes at most three quarters
/// of `shm_bytes`, the size of /dev/shm (`None`: not known, the slot stays). Only for a
/// default slot: one the caller chose stays, and where there is no room segment creation says
/// so (`Error::NoRoom`). Every rank of a host sees the same size, so every rank comes to the
/// same slot. Each communicator fits itself alone: several on one host may still find no room.
///
/// ```
/// use gp2p_comm::fit_slot_to_shm;
///
/// const MIB: usize = 1 << 20;
/// assert_eq!(fit_slot_to_shm(8 * MIB, 8, 3, 0, Some(16 << 30)), 8 * MIB, "room enough");
/// assert_eq!(fit_slot_to_shm(8 * MIB, 8, 3, 0, Some(64 << 20)), 2 * MIB, "docker's 64 MiB");
/// assert_eq!(fit_slot_to_shm(8 * MIB, 8, 3, 0, None), 8 * MIB, "size unknown");
/// ```
pub fn fit_slot_to_shm(
    slot_bytes: usize,
    world: usize,
    slots: usize,
    other_bytes: usize,
    shm_bytes: Option<u64>,
) -> usize {
    let Some(shm) = shm_bytes else { return slot_bytes };
    let room = (shm / SHM_SHARE.1 * SHM_SHARE.0).saturating_sub(other_bytes as u64);
    let per_slot = room / (world.max(1) as u64).saturating_mul(slots.max(1) as u64);
    let fitted =
        (usize::try_from(per_slot).unwrap_or(usize::MAX) / MIN_SLOT_BYTES * MIN_SLOT_BYTES).max(MIN_SLOT_BYTES);
    slot_bytes.min(fitted)
}

/// The slot of a compressing communicator of `world` ranks (two or more) whose options keep
/// the default slot: [`SLOT_SPAN_BYTES`] / `world`, never less than [`default_slot_bytes`]. A
/// wire's room (about 5 bytes a value, its exact area included) fills a slot whose DMA carries
/// about a fifth of it, so small slots cut long shards into many pieces, each a step of GPU
/// operations (`crate::compression::COMPRESSED_STEP_OPS`). On one H100, 4 processes under
/// MPS, bf16 int8/64 (`benches/results/h10080gbhbm3/comm-compress-slots.txt`): 64 MiB took
/// 5.57 ms with 16 MiB slots against 7.94 with 4 MiB (1.86× the exact all-reduce's 10.37 ms,
/// where it was 1.31×). Between two ranks the model as of 366695a priced 64 MiB at 2.26 ms
/// with 32 MiB slots against 2.70 with the exact default of 8 MiB, which measured 2.60 on an
/// H100 (the two-shot, which still runs there, above the one-shot's size).
pub(crate) fn compressed_slot_bytes(world: usize) -> usize {
    span_slot_bytes(world).max(default_slot_bytes(world))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    #[test]
    fn the_span_is_cut_among_the_ranks_on_64_kib() {
        assert_eq!([2, 3, 4, 8].map(span_slot_bytes), [32 * MIB, 21 * MIB + 5 * MIN_SLOT_BYTES, 16 * MIB, 8 * MIB]);
        for world in 1..=8 {
            let slot = span_slot_bytes(world);
            assert!(
                slot % MIN_SLOT_BYTES == 0
                    && slot * world <= SLOT_SPAN_BYTES
                    && (slot + MIN_SLOT_BYTES) * world > SLOT_SPAN_BYTES
            );
        }
    }

    #[test]
    fn slots_shrink_to_three_quarters_of_a_small_shm_and_no_further() {
        let gib = 1u64 << 30;
        for world in 2..=8 {
            let slot = span_slot_bytes(world);
            assert_eq!(fit_slot_to_shm(slot, world, 3, 0, Some(gib)), slot, "{world} ranks: 1 GiB holds 192 MiB");
            assert_eq!(fit_slot_to_shm(slot, world, 3, 0, None), slot);
            // Docker's default: with three slots a rank the 16 MiB / N of before, as whole
            // 64 KiB; four would get 12 MiB / N (the communicator then takes three).
            let fitted = fit_slot_to_shm(slot, world, 3, 0, Some(64 << 20));
            assert_eq!(fitted, (16 * MIB / world) / MIN_SLOT_BYTES * MIN_SLOT_BYTES, "{world} ranks");
            assert!((world * 3 * fitted) as u64 <= 48 << 20);
            let four = fit_slot_to_shm(slot, world, MANY_RANK_SLOTS, 0, Some(64 << 20));
            assert_eq!(four, (12 * MIB / world) / MIN_SLOT_BYTES * MIN_SLOT_BYTES, "{world} ranks, four slots");
            for shm in [1u64, 4096, 100 << 20, 200 << 20, 5 * gib] {
                let fitted = fit_slot_to_shm(slot, world, 3, 0, Some(shm));
                assert!(
                    fitted <= slot && fitted >= MIN_SLOT_BYTES && fitted % MIN_SLOT_BYTES == 0,
                    "{world} ranks, {shm}"
                );
                assert!(fitted == MIN_SLOT_BYTES || (world * 3 * fitted) as u64 <= shm / 4 * 3, "{world} ranks, {shm}");
            }
        }
        assert_eq!(fit_slot_to_shm(MIB, 8, 3, 0, Some(64 << 20)), MIB, "a small slot stays");
        assert_eq!(fit_slot_to_shm(8 * MIB, 8, 16, 0, Some(64 << 20)), 384 * 1024, "more slots, smaller ones");
        // Two ranks' 16 MiB of one-kernel areas come off the room first: 32 MiB of slots.
        assert_eq!(fit_slot_to_shm(8 * MIB, 2, 3, 16 * MIB, Some(64 << 20)), 5 * MIB + 5 * MIN_SLOT_BYTES);
        assert_eq!(fit_slot_to_shm(8 * MIB, 2, 3, 64 * MIB, Some(64 << 20)), MIN_SLOT_BYTES, "no room: the floor");
        assert_eq!(fit_slot_to_shm(8 * MIB, usize::MAX, usize::MAX, 0, Some(1 << 40)), MIN_SLOT_BYTES, "no overflow");
    }

    #[test]
    fn compressing_takes_the_span_or_the_exact_default() {
        assert_eq!(
            [2, 3, 4, 8].map(compressed_slot_bytes),
            [32 * MIB, 21 * MIB + 5 * MIN_SLOT_BYTES, 16 * MIB, 8 * MIB]
        );
        for world in 1..=16 {
            let (compressed, exact) = (compressed_slot_bytes(world), default_slot_bytes(world));
            assert!(compressed >= exact, "{world} ranks: never below the exact slot");
        }
        assert_eq!(compressed_slot_bytes(1), 64 * MIB, "one rank: the whole span");
    }
}
