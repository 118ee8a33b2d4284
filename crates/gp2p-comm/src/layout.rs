//! Where everything sits in a communicator's staging area, the same offsets in every process,
//! and the options that decide it ([`CommOptions`], which every rank checks against its
//! peers' at creation).

use gp2p_kernels::{
    CHUNK_BYTES, CHUNK_MAX_BLOCKS, CHUNKS_MANY_WORLD, chunk_area_layout, chunks_many_area, exchange_line_bytes,
};

use crate::{Error, Result};

mod options;
pub use options::{CommOptions, FlagWaits, MANY_CHUNKS_MAX_BYTES, MANY_CHUNKS_VAR};

/// Where things sit in the staging area: the same offsets in every process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    /// The largest all-reduce of the one-kernel path, in bytes.
    pub(crate) small_max: usize,
    /// The largest all-reduce of that path that takes the line kernel, in bytes.
    pub(crate) lines_max: usize,
    /// Bytes of one half of one rank's area for that path (calls alternate halves): the
    /// lines of the smallest calls (`lines_bytes`), then the flagged chunks' data, then
    /// their flags at `flags_offset` from the chunks' start.
    pub(crate) half: usize,
    pub(crate) lines_bytes: usize,
    pub(crate) flags_offset: usize,
    /// Offset of rank 0's area; rank r's follows at `r * 2 * half`.
    pub(crate) areas: usize,
    pub(crate) world: usize,
    /// The pipeline's flags, after the ranks' flag lines: a u32 per rank, slot and reader.
    pub(crate) chunk_flags: usize,
    /// The pipeline's slots: `slot_count` per rank of `slot_bytes` each, rank 0's first,
    /// from this offset.
    pub(crate) slots_offset: usize,
    pub(crate) slot_bytes: usize,
    pub(crate) slot_count: usize,
    /// The forced all-reduce among more than two ranks, as ranks compare it
    /// (`choice::option_word`; 0: the cost model's choice).
    pub(crate) algorithm: u32,
    /// Whether the pipeline's flags carry the watched stream waits' values
    /// ([`crate::FlagWaits::Watched`]), which every rank must agree on.
    pub(crate) watched: bool,
    /// The all-reduces' compression as ranks compare it (`compression::Resolved::option_words`;
    /// zeros: off). Set by the communicator once it has resolved it.
    pub(crate) compress: [u32; 2],
    /// [`CommOptions::chunk_bytes`], 0 where the message sizes them.
    pub(crate) chunk_bytes: usize,
    /// Among more than two ranks, the chunks each area holds for the many-rank flagged-chunk
    /// kernel (`gp2p_kernels::chunks_many_area`), after the lines; 0 where it is not made.
    pub(crate) many_chunks: usize,
}

/// The turn counter of the serialised registration, at the start of the staging area.
pub(crate) const REGISTRATION_TURN: usize = 0;
/// How many ranks have published how their registration went.
pub(crate) const REGISTERED: usize = 4;
/// Set by a rank whose collective gave up waiting: every rank's calls then fail.
pub(crate) const BROKEN: usize = 8;
/// One cache line per rank after the counters' line: its give-up flag (written by its
/// kernel), then how its registration went ([`REGISTERED_OK`] or [`REGISTRATION_FAILED`]),
/// then the options that set the layout, which every rank checks against its own.
pub(crate) const RANK_LINES: usize = 64;
pub(crate) const STATUS: usize = 4;
pub(crate) const OPTIONS: usize = 8;
/// The options' words, after `OPTIONS` in each rank's cache line.
pub(crate) const OPTION_WORDS: usize = 8;
/// Then the progress of the rank's two lanes' stream waits, which its watchdog reads
/// ([`crate::FlagWaits::Watched`]): send, receive.
pub(crate) const PROGRESS: usize = OPTIONS + 4 * OPTION_WORDS;
const _: () = assert!(PROGRESS + 8 <= 64, "a rank's words fit in its cache line");
pub(crate) const REGISTERED_OK: u32 = 1;
pub(crate) const REGISTRATION_FAILED: u32 = 2;
/// Lines and slots start on this alignment (the kernels need 16; a page keeps them apart
/// from flags and from each other).
pub(crate) const LINES_ALIGN: usize = 4096;
/// The most ranks a communicator takes: the one-kernel path's line kernel keeps a line of
/// every rank in registers ([`gp2p_kernels::EXCHANGE_MANY_MAX_WORLD`]).
pub const MAX_RANKS: usize = gp2p_kernels::EXCHANGE_MANY_MAX_WORLD;
/// [`CommOptions::chunk_blocks`] by default (see [`chunk_grid`]).
pub(crate) const DEFAULT_CHUNK_BLOCKS: usize = 128;

/// The blocks the chunk kernel runs for `bytes`, at most `chunk_blocks`: a block per 4 KiB
/// chunk up to 32 blocks, up to 64 only with 4 chunks each or more, and more only with 8 or
/// more. Between processes on two H200s (the tenth session in `git show 92b0a7c:benches/results/README.md`), grids of
/// many blocks with few chunks each ran in two modes that switch from one 50-call loop to the
/// next: 256 blocks of 1 chunk (1 MiB) took 50 us or 225-280, 256 of 4 (4 MiB) 152 or
/// 307-363, 128 of 2 (1 MiB) 49 or 124-143, 64 of 1 (256 KiB) 20 or 55-61. These did not:
/// 32 of 2 (256 KiB, 22-24 us, a few loops to 40), 64 of 4 (1 MiB, 48-52 in 35 of 36 loops),
/// 128 of 8 (4 MiB, 147-153 in 18 of 18); fewer blocks are slower (256 KiB: 16 blocks 29 us,
/// 8 blocks 43). Never seen with both ranks in one process, which keeps 256.
pub(crate) fn chunk_grid(bytes: usize, chunk_blocks: usize) -> usize {
    let chunks = bytes.div_ceil(gp2p_kernels::CHUNK_BYTES);
    let one_each = chunks.min(32);
    let four_each = (chunks / 4).min(64);
    let eight_each = chunks / 8;
    one_each.max(four_each).max(eight_each).min(chunk_blocks)
}

/// The bounds of [`CommOptions::slot_bytes`] and [`CommOptions::slots`].
const SLOT_BYTES: std::ops::RangeInclusive<usize> = crate::slots::MIN_SLOT_BYTES..=(256 << 20);
const SLOTS: std::ops::RangeInclusive<usize> = 2..=16;
/// [`CommOptions::lines_max_bytes`] by default. Two H200s, one kernel per rank per call
/// (benches/probes/small_exchange.py), with the lines side by side as they were until
/// 7774b2d: lines 6.0 us at 64 B and 6.5 at 2 KiB, chunks 7.7 and 8.3 (their fence); at 8 KiB
/// lines 20 us, chunks 8.3.
pub(crate) const DEFAULT_LINES_MAX_BYTES: usize = 2 << 10;
/// The bound of [`CommOptions::lines_max_bytes`]: one block of the line kernel for the whole
/// buffer, each thread a few batches of groups.
pub(crate) const MAX_LINES_BYTES: usize = 64 << 10;
/// The largest small-message size a communicator is made for: the one-kernel path is for small
/// messages, and the bound keeps the layout's arithmetic far from overflow.
const MAX_SMALL_BYTES: usize = 16 << 20;

impl Layout {
    pub(crate) fn new(world: usize, options: &CommOptions) -> Result<Layout> {
        let CommOptions { small_max_bytes, slot_bytes, slots: slot_count, .. } = *options;
        if world == 0 || world > MAX_RANKS {
            return Err(Error::World { world, max: MAX_RANKS });
        }
        if !(1..=CHUNK_MAX_BLOCKS).contains(&options.chunk_blocks) {
            return Err(Error::InvalidOption {
                name: "chunk_blocks",
                reason: format!("{} is outside 1..={CHUNK_MAX_BLOCKS}", options.chunk_blocks),
            });
        }
        if small_max_bytes == 0 || small_max_bytes > MAX_SMALL_BYTES {
            return Err(Error::InvalidOption {
                name: "small_max_bytes",
                reason: format!(
                    "{small_max_bytes} is outside 1..={MAX_SMALL_BYTES}; the one-kernel path is for small messages"
                ),
            });
        }
        if !SLOT_BYTES.contains(&slot_bytes) || slot_bytes % LINES_ALIGN != 0 {
            return Err(Error::InvalidOption {
                name: "slot_bytes",
                reason: format!("{slot_bytes} is not a multiple of {LINES_ALIGN} in {SLOT_BYTES:?}"),
            });
        }
        if !SLOTS.contains(&slot_count) {
            return Err(Error::InvalidOption { name: "slots", reason: format!("{slot_count} is outside {SLOTS:?}") });
        }
        let smallest_chunk = *SLOT_BYTES.start();
        if let Some(chunk) = options.chunk_bytes
            && (chunk < smallest_chunk || chunk > slot_bytes || chunk % LINES_ALIGN != 0)
        {
            return Err(Error::InvalidOption {
                name: "chunk_bytes",
                reason: format!(
                    "{chunk} is not a multiple of {LINES_ALIGN} from {smallest_chunk} to this communicator's slot of \
                     {slot_bytes} bytes (a chunk is one DMA through a slot; smaller ones cost a handoff each); leave it \
                     unset to size chunks by the message"
                ),
            });
        }
        let lines_max = options.lines_max_bytes;
        if lines_max > MAX_LINES_BYTES {
            return Err(Error::InvalidOption {
                name: "lines_max_bytes",
                reason: format!("{lines_max} is outside 0..={MAX_LINES_BYTES}; the line kernel runs in one block"),
            });
        }
        // Bounded above, so none of this overflows.
        let lines_max = lines_max.min(small_max_bytes);
        // More than two ranks: the line kernel up to lines_max, and above it, where asked for
        // (CommOptions::many_chunks) and small_max_bytes is larger, the many-rank flagged-chunk
        // kernel, whose areas hold small_max_bytes in whole chunks.
        let many_chunks = match world {
            w if options.many_chunks && CHUNKS_MANY_WORLD.contains(&w) && small_max_bytes > lines_max => {
                small_max_bytes.div_ceil(CHUNK_BYTES)
            }
            _ => 0,
        };
        let small_max_bytes = if world == 2 || many_chunks > 0 { small_max_bytes } else { lines_max };
        let lines_bytes = exchange_line_bytes(lines_max).next_multiple_of(256);
        let (flags_offset, chunks) = match world {
            2 => chunk_area_layout(small_max_bytes),
            _ if many_chunks > 0 => (0, chunks_many_area(many_chunks * CHUNK_BYTES, world).bytes),
            _ => (0, 0),
        };
        let half = (lines_bytes + chunks).next_multiple_of(256).max(256);
        let chunk_flags = RANK_LINES + 64 * world;
        let areas = (chunk_flags + 4 * slot_count * world * world).next_multiple_of(LINES_ALIGN);
        // Page-aligned slots: the DMA copies in and out of them run at full speed.
        let slots_offset = (areas + world * 2 * half).next_multiple_of(LINES_ALIGN);
        Ok(Layout {
            small_max: small_max_bytes,
            lines_max,
            half,
            lines_bytes,
            flags_offset,
            areas,
            world,
            chunk_flags,
            slots_offset,
            slot_bytes,
            slot_count,
            algorithm: crate::choice::option_word(options.algorithm),
            watched: options.waits == crate::FlagWaits::Watched,
            compress: [0, 0],
            chunk_bytes: options.chunk_bytes.unwrap_or(0),
            many_chunks,
        })
    }

    /// The staging area's size: whole multiples of the alignment that covers every page size,
    /// so the registered range ends on a page boundary.
    pub(crate) fn staging_bytes(&self) -> usize {
        (self.slots_offset + self.world * self.slot_count * self.slot_bytes).next_multiple_of(crate::STAGING_ALIGN)
    }

    /// Offset of `rank`'s give-up flag (set by its kernels when a wait times out).
    pub(crate) fn flag(&self, rank: usize) -> usize {
        RANK_LINES + 64 * rank
    }

    /// Offset of the progress word of `rank`'s `lane` (0 send, 1 receive), which its watched
    /// stream waits write and its watchdog reads (`communicator::watchdog`).
    pub(crate) fn progress(&self, rank: usize, lane: usize) -> usize {
        self.flag(rank) + PROGRESS + 4 * lane
    }

    /// The pipeline's flags, every writer's, slot's and reader's: their first offset and how
    /// many (a `u32` each, side by side).
    pub(crate) fn all_flags(&self) -> (usize, usize) {
        (self.full(0, 0, 0), self.slot_count * self.world * self.world)
    }

    /// What the layout was made from, as every rank publishes it to be compared: the
    /// one-kernel path's largest size, the slot size, the slot count and the line kernel's
    /// largest size (each bounded well below `u32::MAX`), the forced all-reduce
    /// (`choice::option_word`) with whether waits are watched and the flagged chunks made among
    /// more than two, the compression's two words and the fixed chunk (0: by the message).
    pub(crate) fn options(&self) -> [u32; OPTION_WORDS] {
        let [format, min_kib] = self.compress;
        [
            self.small_max as u32,
            self.slot_bytes as u32,
            self.slot_count as u32,
            self.lines_max as u32,
            self.algorithm | u32::from(self.watched) << 8 | u32::from(self.many_chunks > 0) << 9,
            format,
            min_kib,
            self.chunk_bytes as u32,
        ]
    }

    /// How an all-reduce among more than two ranks picks its path with this layout (the
    /// lines' and the flagged chunks' room) and `forced`, priced at the H200's rates.
    pub(crate) fn many_choice(&self, forced: Option<gp2p_collectives::cost::Algorithm>) -> crate::choice::ManyChoice {
        crate::choice::ManyChoice {
            machine: gp2p_collectives::cost::Machine::h200(self.world),
            lines_max: self.lines_max,
            chunks_max: if self.many_chunks > 0 { self.small_max } else { 0 },
            forced,
        }
    }

    /// The chunk size [`CommOptions::chunk_bytes`] fixed, if it did.
    pub(crate) fn fixed_chunk(&self) -> Option<usize> {
        (self.chunk_bytes != 0).then_some(self.chunk_bytes)
    }

    /// Bytes of each chunk of the exchange of `bytes` ([`crate::pipeline_chunk`]).
    pub(crate) fn exchange_chunk(&self, bytes: usize) -> usize {
        crate::chunking::pipeline_chunk(bytes, self.slot_bytes, self.fixed_chunk())
    }

    /// Bytes of each chunk of the rounds' legs: the fixed chunk, else a slot (as
    /// [`crate::choice::AllReducePaths::rounds_chunk`] prices them).
    pub(crate) fn rounds_chunk(&self) -> usize {
        self.fixed_chunk().unwrap_or(self.slot_bytes)
    }

    /// Offset of the communicator's broken flag, which every rank's host and pipeline waits
    /// read, and set when they give up.
    pub(crate) fn broken(&self) -> usize {
        BROKEN
    }

    /// Bytes of one pipeline slot.
    pub(crate) fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// Offset of `rank`'s pipeline slot `slot`.
    pub(crate) fn slot(&self, rank: usize, slot: usize) -> usize {
        self.slots_offset + (rank * self.slot_count + slot) * self.slot_bytes
    }

    /// Offset of `reader`'s handshake flag of `writer`'s pipeline slot `slot` (1: it holds a
    /// chunk for `reader`; 0: `reader` has read it). A slot's flags lie side by side, so its
    /// writer waits for all of them in one wait.
    pub(crate) fn full(&self, writer: usize, slot: usize, reader: usize) -> usize {
        self.chunk_flags + 4 * ((writer * self.slot_count + slot) * self.world + reader)
    }

    /// Offset of `rank`'s one-kernel area for the call numbered `seq`.
    pub(crate) fn area_of(&self, rank: usize, seq: u32) -> usize {
        self.areas + rank * 2 * self.half + (seq & 1) as usize * self.half
    }
}

#[cfg(test)]
mod tests {
    use gp2p_collectives::cost::Algorithm;

    use super::*;

    fn small(small_max_bytes: usize) -> CommOptions {
        CommOptions { small_max_bytes, ..CommOptions::default() }
    }

    #[test]
    fn more_than_two_ranks_get_chunk_areas_only_where_the_one_kernel_passes_the_lines() {
        let plain = Layout::new(4, &CommOptions { many_chunks: false, ..CommOptions::for_world(4) }).unwrap();
        assert_eq!((plain.many_chunks, plain.small_max), (0, plain.lines_max), "not where turned off");
        let unasked = Layout::new(4, &CommOptions { small_max_bytes: 1 << 20, ..CommOptions::default() }).unwrap();
        assert_eq!((unasked.many_chunks, unasked.small_max), (0, unasked.lines_max), "a larger size alone is capped");
        for world in 3..=8 {
            let made = Layout::new(world, &CommOptions::for_world(world)).unwrap();
            assert_eq!((made.many_chunks, made.small_max), (256, MANY_CHUNKS_MAX_BYTES), "{world} ranks by default");
        }
        let default = Layout::new(4, &CommOptions::default()).unwrap();
        assert_eq!((default.many_chunks, default.small_max), (0, default.lines_max), "two ranks' defaults too");
        let options = CommOptions { small_max_bytes: 1 << 20, many_chunks: true, ..CommOptions::for_world(4) };
        let chunks = Layout::new(4, &options).unwrap();
        assert_eq!((chunks.many_chunks, chunks.small_max), (256, 1 << 20));
        let area = chunks_many_area(1 << 20, 4);
        assert!(chunks.half >= chunks.lines_bytes + area.bytes, "the lines, then the chunk area, in each half");
        assert_eq!((chunks.area_of(0, 0) + chunks.lines_bytes) % 64, 0, "the kernel's 64-byte alignment");
        assert!(chunks.area_of(3, 1) + chunks.half <= chunks.slot(0, 0), "the areas end before the slots");
        assert_ne!(chunks.options(), plain.options(), "ranks made differently are refused");
        assert_eq!(chunks.many_choice(None).chunks_max, 1 << 20);
        assert_eq!(plain.many_choice(None).chunks_max, 0);
        // Two ranks have their own kernel; one rank none.
        let two =
            Layout::new(2, &CommOptions { small_max_bytes: 1 << 20, many_chunks: true, ..CommOptions::default() })
                .unwrap();
        assert_eq!(two.many_chunks, 0);
        assert_eq!(Layout::new(1, &options).unwrap().many_chunks, 0);
    }

    #[test]
    fn the_layout_keeps_flags_and_lines_apart_and_aligned() {
        let layout = Layout::new(2, &small(64 << 10)).unwrap();
        assert_eq!(layout.lines_bytes, 4 << 10, "lines for 2 KiB: half data");
        assert_eq!(layout.half, (4 << 10) + (64 << 10) + 16 * 64, "lines, data, then a flag line per 4 KiB chunk");
        assert_eq!(layout.flags_offset, 64 << 10);
        assert_eq!(Layout::new(2, &small(100)).unwrap().lines_bytes, 256, "lines for the one-kernel size only");
        assert_eq!(layout.small_max, 64 << 10);
        assert_eq!(layout.areas % LINES_ALIGN, 0);
        assert!(layout.flag(1) + OPTIONS + 4 * OPTION_WORDS <= layout.full(0, 0, 0), "options end before the flags");
        assert!(layout.full(1, layout.slot_count - 1, 1) + 4 <= layout.areas);
        assert_eq!(layout.area_of(0, 1), layout.areas + layout.half, "odd calls use the second half");
        assert_eq!(layout.area_of(1, 2), layout.areas + 2 * layout.half);
        assert!(layout.staging_bytes() >= layout.area_of(1, 1) + layout.half);
        assert_eq!(layout.staging_bytes() % crate::STAGING_ALIGN, 0, "ends on a page boundary");
        for rank in 0..2 {
            assert_eq!(layout.flag(rank) % 64, 0);
            assert_eq!(layout.area_of(rank, 7) % 256, 0);
        }
        assert_eq!(Layout::new(2, &small(1)).unwrap().half, 512, "an aligned block of lines, one of chunks");
        for (name, layout) in
            [("0 bytes", Layout::new(2, &small(0))), ("1 << 61 bytes", Layout::new(2, &small(1 << 61)))]
        {
            assert!(matches!(layout, Err(Error::InvalidOption { name: "small_max_bytes", .. })), "{name}");
        }
        assert!(matches!(Layout::new(0, &small(1024)), Err(Error::World { .. })));
        assert!(matches!(Layout::new(MAX_RANKS + 1, &small(1024)), Err(Error::World { max: MAX_RANKS, .. })));
    }

    #[test]
    fn the_line_kernels_size_sets_its_lines_and_is_compared_between_ranks() {
        let lines = |lines_max_bytes: usize, small_max_bytes: usize| {
            Layout::new(2, &CommOptions { lines_max_bytes, small_max_bytes, ..CommOptions::default() })
        };
        let wide = lines(16 << 10, 64 << 10).unwrap();
        assert_eq!((wide.lines_max, wide.lines_bytes), (16 << 10, 32 << 10), "lines for 16 KiB: half data");
        assert_eq!(wide.half, (32 << 10) + (64 << 10) + 16 * 64, "the chunks follow the wider lines");
        assert_eq!(wide.options()[3], 16 << 10, "published beside the other options");
        assert_ne!(wide.options(), lines(2 << 10, 64 << 10).unwrap().options(), "a different size is a mismatch");
        let capped = lines(64 << 10, 4 << 10).unwrap();
        assert_eq!((capped.lines_max, capped.lines_bytes), (4 << 10, 8 << 10), "no lines past the one-kernel size");
        let none = lines(0, 64 << 10).unwrap();
        assert_eq!((none.lines_max, none.lines_bytes), (0, 0), "0: every small call takes the chunks");
        assert!(matches!(lines((64 << 10) + 1, 4 << 20), Err(Error::InvalidOption { name: "lines_max_bytes", .. })));
        assert_eq!(CommOptions::default().lines_max_bytes, 2 << 10);
    }

    #[test]
    fn a_forced_algorithm_is_compared_between_ranks() {
        let forcing = |algorithm| Layout::new(4, &CommOptions { algorithm, ..CommOptions::for_world(4) }).unwrap();
        let (model, one, two) = (forcing(None), forcing(Some(Algorithm::OneShot)), forcing(Some(Algorithm::TwoShot)));
        // The algorithm's byte, beside the flags above it (the flagged chunks' bit 9 among 4).
        assert_eq!([model.options()[4], one.options()[4], two.options()[4]].map(|word| word & 0xff), [0, 1, 2]);
        assert_ne!(model.options(), one.options(), "a rank that forces one-shot is refused by one that does not");
        assert_eq!(model.staging_bytes(), two.staging_bytes(), "the same segment either way");
    }

    #[test]
    fn a_fixed_chunk_is_checked_against_the_slot_and_compared_between_ranks() {
        let chunked = |chunk_bytes| Layout::new(2, &CommOptions { chunk_bytes, ..CommOptions::default() });
        let (by_message, slot) = (chunked(None).unwrap(), chunked(Some(8 << 20)).unwrap());
        assert_eq!((by_message.options()[7], slot.options()[7]), (0, 8 << 20));
        assert_eq!((by_message.exchange_chunk(16 << 20), slot.exchange_chunk(16 << 20)), (4 << 20, 8 << 20));
        assert_eq!((by_message.rounds_chunk(), chunked(Some(1 << 20)).unwrap().rounds_chunk()), (8 << 20, 1 << 20));
        for bad in [0, 4096, (64 << 10) + 4095, (8 << 20) + 4096] {
            let refused = chunked(Some(bad)).unwrap_err().to_string();
            assert!(refused.contains("chunk_bytes") && refused.contains("unset"), "{bad}: {refused}");
        }
    }

    #[test]
    fn every_flag_and_slot_has_its_own_aligned_place_after_the_areas() {
        let options = CommOptions { slot_bytes: 1 << 20, slots: 3, ..CommOptions::default() };
        let layout = Layout::new(2, &options).unwrap();
        let mut flags = Vec::new();
        let mut slots = Vec::new();
        for rank in 0..2 {
            for slot in 0..3 {
                for reader in 0..2 {
                    flags.push(layout.full(rank, slot, reader));
                }
                slots.push(layout.slot(rank, slot));
            }
        }
        let (flag_count, slot_count) = (flags.len(), slots.len());
        flags.sort_unstable();
        flags.dedup();
        slots.sort_unstable();
        slots.dedup();
        assert_eq!((flags.len(), slots.len()), (flag_count, slot_count), "no two share a place");
        assert!(
            flags
                .iter()
                .all(|f| f % 4 == 0 && *f >= layout.flag(1) + OPTIONS + 4 * OPTION_WORDS && f + 4 <= layout.areas)
        );
        assert!(slots.windows(2).all(|w| w[1] - w[0] >= options.slot_bytes), "slots do not overlap");
        assert!(slots.iter().all(|s| s % LINES_ALIGN == 0 && *s >= layout.area_of(1, 1) + layout.half));
        assert!(layout.slot(1, 2) + options.slot_bytes <= layout.staging_bytes());
        assert_eq!(layout.staging_bytes() % crate::STAGING_ALIGN, 0);
    }

    #[test]
    fn more_than_two_ranks_without_the_chunks_have_lines_only_and_a_flag_per_reader() {
        for world in 3..=MAX_RANKS {
            let options = CommOptions { many_chunks: false, ..CommOptions::for_world(world) };
            let layout = Layout::new(world, &options).unwrap();
            assert_eq!((layout.small_max, layout.lines_max), (64 << 10, 64 << 10), "{world} ranks");
            assert_eq!(layout.half, exchange_line_bytes(64 << 10), "no chunk area");
            let slots = world * options.slots * options.slot_bytes;
            assert_eq!(options.slots, 4, "{world} ranks");
            let span = 4 * crate::SLOT_SPAN_BYTES;
            assert!(slots <= span && slots > span - 4 * world * (64 << 10), "{world} ranks: {slots} bytes of slots");
            let mut flags: Vec<usize> = (0..world)
                .flat_map(|w| (0..options.slots).flat_map(move |s| (0..world).map(move |r| (w, s, r))))
                .map(|(w, s, r)| layout.full(w, s, r))
                .collect();
            let count = flags.len();
            assert_eq!(layout.full(2, 1, 1) + 4, layout.full(2, 1, 2), "a slot's flags side by side");
            flags.sort_unstable();
            flags.dedup();
            assert_eq!(flags.len(), count);
            assert!(flags[0] >= layout.flag(world - 1) + 64 && flags[count - 1] + 4 <= layout.areas);
            assert!(layout.area_of(world - 1, 1) + layout.half <= layout.slot(0, 0));
        }
        assert_eq!(CommOptions::for_world(2), CommOptions::default());
        assert_eq!(CommOptions::for_world(8).slot_bytes, 8 << 20);
        // Every wait is bounded unless asked otherwise, at any size of world.
        assert!((2..=crate::MAX_RANKS).all(|n| CommOptions::for_world(n).waits == FlagWaits::Kernel));
        for waits in FlagWaits::ALL {
            assert_eq!(waits.name().parse::<FlagWaits>(), Ok(waits));
        }
        let refused = "spin".parse::<FlagWaits>().unwrap_err();
        assert!(refused.contains("kernel, watched or unbounded"), "{refused}");
    }

    #[test]
    fn slot_options_out_of_range_are_refused_by_name() {
        for (slot_bytes, slots, name) in [
            (4096, 3, "slot_bytes"),
            ((64 << 10) + 1, 3, "slot_bytes"),
            (512 << 20, 3, "slot_bytes"),
            (1 << 20, 1, "slots"),
            (1 << 20, 17, "slots"),
        ] {
            let options = CommOptions { slot_bytes, slots, ..CommOptions::default() };
            match Layout::new(2, &options) {
                Err(Error::InvalidOption { name: got, .. }) => assert_eq!(got, name, "{slot_bytes} x {slots}"),
                other => panic!("{slot_bytes} x {slots}: {other:?}"),
            }
        }
        let options = CommOptions { slot_bytes: 64 << 10, slots: 16, ..CommOptions::default() };
        assert!(Layout::new(2, &options).is_ok(), "the bounds themselves are taken");
    }

    #[test]
    fn chunk_grids_take_a_block_per_chunk_up_to_32_then_4_chunks_a_block_up_to_64_then_8() {
        let kib = 1 << 10;
        assert_eq!(chunk_grid(4 * kib, DEFAULT_CHUNK_BLOCKS), 1);
        assert_eq!(chunk_grid(128 * kib, DEFAULT_CHUNK_BLOCKS), 32, "one chunk a block");
        assert_eq!(chunk_grid(256 * kib, DEFAULT_CHUNK_BLOCKS), 32, "two a block");
        assert_eq!(chunk_grid(512 * kib, DEFAULT_CHUNK_BLOCKS), 32, "four a block");
        assert_eq!(chunk_grid(1 << 20, DEFAULT_CHUNK_BLOCKS), 64, "1 MiB: 4 chunks a block");
        assert_eq!(chunk_grid(2 << 20, DEFAULT_CHUNK_BLOCKS), 64);
        assert_eq!(chunk_grid(3 << 20, DEFAULT_CHUNK_BLOCKS), 96, "8 chunks a block");
        assert_eq!(chunk_grid(4 << 20, DEFAULT_CHUNK_BLOCKS), 128);
        assert_eq!(chunk_grid(16 << 20, DEFAULT_CHUNK_BLOCKS), 128, "the default cap");
        assert_eq!(chunk_grid(16 << 20, 256), 256);
        assert_eq!(chunk_grid(1 << 20, 16), 16, "a smaller cap wins");
        for bytes in (1..=4096).map(|k| k * kib) {
            let blocks = chunk_grid(bytes, 256);
            let chunks = bytes.div_ceil(4 * kib);
            assert!(blocks >= 1 && blocks <= chunks, "{bytes}: {blocks} blocks for {chunks} chunks");
            assert!(blocks <= 32 || chunks >= 4 * blocks, "{bytes}: {blocks} blocks for {chunks} chunks");
            assert!(blocks <= 64 || chunks >= 8 * blocks, "{bytes}: {blocks} blocks for {chunks} chunks");
        }
    }

    #[test]
    fn chunk_blocks_outside_one_to_the_kernels_cap_are_refused_by_name() {
        for chunk_blocks in [0, CHUNK_MAX_BLOCKS + 1] {
            let options = CommOptions { chunk_blocks, ..CommOptions::default() };
            match Layout::new(2, &options) {
                Err(Error::InvalidOption { name, reason }) => {
                    assert_eq!(name, "chunk_blocks");
                    assert!(reason.contains(&chunk_blocks.to_string()), "{reason}");
                }
                other => panic!("{chunk_blocks}: {other:?}"),
            }
        }
        for chunk_blocks in [1, CHUNK_MAX_BLOCKS] {
            assert!(Layout::new(2, &CommOptions { chunk_blocks, ..CommOptions::default() }).is_ok());
        }
    }
}
