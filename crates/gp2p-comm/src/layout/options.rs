//! [`CommOptions`]: how a communicator is made, its defaults for N ranks, and the paths a
//! communicator made with them takes ([`AllReducePaths::of`]).

use std::time::Duration;

use gp2p_collectives::Receive;
use gp2p_collectives::cost::Algorithm;

use super::{DEFAULT_CHUNK_BLOCKS, DEFAULT_LINES_MAX_BYTES, Layout, MAX_LINES_BYTES};
use crate::Result;
use crate::choice::AllReducePaths;

/// How a communicator's pipeline waits for its peers' flags ([`CommOptions::waits`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FlagWaits {
    /// A one-thread kernel a wait, which gives up after [`CommOptions::peer_timeout`] and
    /// returns at once once the communicator is broken or aborted.
    #[default]
    Kernel,
    /// A batch of stream memory operations a wait: one driver call and no kernel. They do not
    /// give up by themselves: a thread of the communicator (its watchdog) watches this rank's
    /// waits and, once one has lasted `peer_timeout`, or the communicator is broken or
    /// aborted, sets every flag to a value that ends every wait, on every rank.
    Watched,
    /// A batch of stream memory operations a wait that nothing ends but its flags: not
    /// `peer_timeout`, not [`crate::Communicator::abort`]. A rank that dies or leaves a call
    /// leaves every peer's stream waiting for good (and the communicator's memory, freed only
    /// once its work is done, held). For measuring what the kernel costs, never in use.
    Unbounded,
}

impl FlagWaits {
    /// Every kind, as `gp2p bench comm --waits` names them.
    pub const ALL: [FlagWaits; 3] = [FlagWaits::Kernel, FlagWaits::Watched, FlagWaits::Unbounded];

    /// Its name: `kernel`, `watched` or `unbounded`.
    pub fn name(self) -> &'static str {
        match self {
            FlagWaits::Kernel => "kernel",
            FlagWaits::Watched => "watched",
            FlagWaits::Unbounded => "unbounded",
        }
    }

    /// Whether its waits are stream memory operations.
    pub fn by_stream(self) -> bool {
        self != FlagWaits::Kernel
    }
}

impl std::str::FromStr for FlagWaits {
    type Err = String;

    fn from_str(text: &str) -> std::result::Result<FlagWaits, String> {
        FlagWaits::ALL
            .into_iter()
            .find(|w| w.name() == text.trim())
            .ok_or_else(|| format!("{text:?}: expected kernel, watched or unbounded"))
    }
}

/// The largest all-reduce the two-shot in one flagged-chunk kernel takes among 3 to 8 ranks
/// by default ([`CommOptions::for_world`], [`CommOptions::many_chunks`]); the rounds take
/// larger ones. Among 4 and 8 processes under MPS on one H200, two rounds in turns (34c1e39,
/// whose kernel this is; `benches/results/h200/many-chunks.txt`), the kernel took 51-59
/// against the rounds' 269-286 us at 128 KiB among 4 and 137-191 against 1021-1120 among 8,
/// 136-138 against 322-335 at 512 KiB among 4 and 407-490 against 1138-1240 among 8, 335-388
/// against 405-412 at 1 MiB among 4 and 1158-1261 against 1318-1409 among 8; at 2 MiB it
/// took 2346-2352 against 1695-1808 among 8. With the ranks on a device taking half its
/// room (9462a91, one H100, `benches/results/h10080gbhbm3/many-chunks-warps.txt`, the
/// `team` rows): 54-61 against 267 us at 128 KiB and 310-315 against 435 at 1 MiB among 4,
/// 172-174 against 1110 and 1073-1090 against 1460 among 8; at 2 MiB 587-602 against 544
/// among 4 and 2130-2151 against 1925 among 8.
pub const MANY_CHUNKS_MAX_BYTES: usize = 1 << 20;

/// The environment variable that turns the many-rank flagged chunks ([`CommOptions::many_chunks`])
/// on or off for the communicators of 3 to 8 ranks this process makes, whatever their options
/// say: `on` (or `1`, `true`), where a communicator whose `small_max_bytes` is no more than the
/// lines' takes [`MANY_CHUNKS_MAX_BYTES`], or `off` (`0`, `false`: the rounds above the lines,
/// as before the kernel was the default). Every rank must see the same (ranks compare the
/// option at creation).
pub const MANY_CHUNKS_VAR: &str = "GP2P_MANY_CHUNKS";

/// How a communicator is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommOptions {
    /// The largest buffer, in bytes, a small-message call takes (its areas are sized for it).
    /// Two ranks that share one GPU may stop sooner, where the cost model prices the one
    /// kernel more than `choice::ONE_KERNEL_HOST_TIE` times the rounds (not within the default
    /// 4 MiB; `Communicator::small_max_bytes` says where). Among more than two ranks the
    /// lines' size caps it, unless [`CommOptions::many_chunks`] is on.
    pub small_max_bytes: usize,
    /// How long a rank's kernel waits for its peer's data before it gives up (the next call
    /// then says so). It must exceed how far one rank's stream may fall behind another's.
    /// The pipeline's waits under [`FlagWaits::Unbounded`] never give up.
    pub peer_timeout: Duration,
    /// How long creation waits for every rank to join and register.
    pub join_timeout: Duration,
    /// Bytes of one slot of the pipeline that carries larger messages: a chunk's DMA copy.
    /// A multiple of 4096 in 64 KiB..=256 MiB. Where it is the default
    /// ([`CommOptions::for_world`]'s, or that value given), two ranks that compress take
    /// [`crate::SLOT_SPAN_BYTES`] / 2 instead, and a /dev/shm too small for the slots makes
    /// them smaller ([`crate::fit_slot_to_shm`]).
    pub slot_bytes: usize,
    /// Slots per rank of that pipeline: chunks in flight at once, 2..=16. Where both are the
    /// defaults of more than two ranks (four slots of [`crate::SLOT_SPAN_BYTES`] / N, or those
    /// values given) and /dev/shm has not the room for them, three larger ones are made.
    pub slots: usize,
    /// The most blocks the one-kernel path's flagged-chunk kernel runs, 1..=256 (default 128:
    /// a block per 4 KiB chunk up to 32, up to 64 with 4 chunks each, more only with 8 each,
    /// see `chunk_grid`). Each rank may pick its own.
    pub chunk_blocks: usize,
    /// All-reduces of up to this many bytes take the line kernel (8-byte lines of 4 data
    /// bytes and the call's number, one block: no fence, one read of the peer's data), larger
    /// ones up to `small_max_bytes` the flagged chunks. 0..=64 KiB, default 2 KiB; every rank
    /// must give the same. For tuning: since the lines lie in two planes (7774b2d) the two
    /// kernels came within half a microsecond of each other at 4-8 KiB on one H200, and
    /// where they cross between two GPUs is not measured yet.
    pub lines_max_bytes: usize,
    /// Among 3 to 8 ranks, whether all-reduces above the lines, up to `small_max_bytes`, run
    /// the two-shot in one flagged-chunk kernel per rank (areas for it are made) rather than
    /// the rounds: on in [`CommOptions::for_world`]'s defaults there, up to
    /// [`MANY_CHUNKS_MAX_BYTES`], where it measured faster; off in [`CommOptions::default`]'s
    /// (two ranks'), whose `small_max_bytes` is theirs. Its blocks all poll, so ranks sharing
    /// a device take half its room of resident blocks between them: with the whole room
    /// (514ac93), among 8 Python processes under MPS on one H200 the first all-reduces of
    /// `tests/python/test_many.py` waited out their 60 s timeout
    /// (`benches/results/h200/python-many-chunks-on.log`); with half, the file and its 8-rank
    /// tests passed three times on one H100, as did `gpu_comm_many`
    /// (`benches/results/h10080gbhbm3/python-many-chunks-on.log`, `comm-many-chunks-on.log`).
    /// [`MANY_CHUNKS_VAR`] (`GP2P_MANY_CHUNKS`) overrides it. Every rank must give the same;
    /// ranks compare it at creation.
    pub many_chunks: bool,
    /// Among more than two ranks, the all-reduce to run: `None` (the default) for the cost
    /// model's choice per call, unless the environment variable [`crate::ALGORITHM_VAR`]
    /// (`GP2P_ALGORITHM`) names one; [`Algorithm::OneShot`] for the line kernel wherever the
    /// buffer fits its lines, [`Algorithm::TwoShot`] for the rounds at every size.
    /// [`Algorithm::Ring`] is refused at creation (the one-process engine runs the ring).
    /// Every rank must force the same (ranks compare it at creation). Two ranks keep their
    /// one-kernel paths for the sizes those take and otherwise run the exchange, or the
    /// rounds where both share one GPU (one link: see
    /// `crate::choice::AllReducePaths::two_ranks_take_rounds`); [`Algorithm::TwoShot`] forces
    /// the rounds and [`Algorithm::OneShot`] the exchange. Two ranks' compressed all-reduce
    /// runs its one-shot unless [`Algorithm::TwoShot`] is forced
    /// (`crate::compression::compressed_shots`).
    pub algorithm: Option<Algorithm>,
    /// All-reduces of f32, f16 and bf16 under sum or avg, from a size on, compressed
    /// (`Communicator::all_reduce_compressed`): `None` (the default) unless the environment
    /// variable [`crate::COMPRESS_VAR`] (`GP2P_COMPRESS`) asks for it, never by itself. Every
    /// rank must ask for the same (ranks compare it at creation). See [`crate::compression`].
    pub compress: Option<crate::Compression>,
    /// How this rank's pipeline folds a chunk that lands in its slots:
    /// [`Receive::ZeroCopy`] reads the slot in place across the link, [`Receive::Scratch`]
    /// copies it into device memory of a slot's size by DMA and folds from there.
    /// [`Receive::Auto`] (the default) takes [`crate::RECEIVE_VAR`] (`GP2P_RECEIVE`) where
    /// it names one, else zero-copy for landings of at most [`crate::ZERO_COPY_MAX_LANDING`]
    /// (256 KiB) and scratch above (as measured on one H100 shared under MPS: see
    /// `crate::receive`). Each rank may pick its own: the fold's bits are the same.
    pub receive: Receive,
    /// Bytes of one chunk of the pipeline, each a DMA through a slot: `None` (the default)
    /// sizes two ranks' exchange by the message ([`crate::pipeline_chunk`]: the buffer in up to four
    /// chunks of at least 1 MiB, at most a slot) and makes the rounds' chunks a slot; else
    /// this many for both (a multiple of 4096, at most `slot_bytes`; `slot_bytes` itself runs
    /// every chunk a slot, as before chunks were sized). Every rank must give the same (ranks
    /// compare it at creation).
    pub chunk_bytes: Option<usize>,
    /// Whether the pipeline's calls (two ranks' exchange, the rounds) replay from
    /// CUDA graphs: captured the second time a call with the same buffers, sizes and op comes,
    /// then launched as one driver call, then and at every later such call
    /// (`crate::replay`'s module docs). `None` (the
    /// default) leaves it to the environment variable [`crate::REPLAY_VAR`] (`GP2P_REPLAY`),
    /// off where unset; never where a peer rank is a thread of this process. Each rank may
    /// pick its own: the calls pair up alike.
    pub replay_calls: Option<bool>,
    /// How the pipeline waits for a peer's flags: [`FlagWaits::Kernel`] (the default), a
    /// bounded one-thread kernel a wait; [`FlagWaits::Watched`], stream memory operations that
    /// a thread of the communicator ends after `peer_timeout` without progress or on
    /// [`crate::Communicator::abort`]; [`FlagWaits::Unbounded`], stream memory operations that
    /// nothing ends, for measuring only. Every rank must give Watched or none (ranks compare
    /// it at creation: its flags mean other values); stream waits are refused where ranks
    /// are threads of one process.
    pub waits: FlagWaits,
}

impl Default for CommOptions {
    fn default() -> Self {
        CommOptions {
            // Two H200s, one process each, NCCL's shared-memory path in the same processes
            // (the tenth session in `git show 92b0a7c:benches/results/README.md`): one kernel took 15.8 us at 128 KiB
            // (NCCL 23.6-32.0), 20.1-22.7 at 256 KiB (35.8-37.7), 48.1-50.0 at 1 MiB (63.2-64.5)
            // and 147.4-152.1 at 4 MiB with 128 blocks (171.5-173.0), where the pipeline took
            // 36-40, 70 and 190-194 in earlier runs. The chunk kernel's block cap
            // (`chunk_grid`) keeps it out of the two-mode timing seen above 128 KiB before.
            small_max_bytes: 4 << 20,
            peer_timeout: Duration::from_secs(5),
            join_timeout: crate::DEFAULT_JOIN_TIMEOUT,
            slot_bytes: crate::slots::TWO_RANK_SLOT_BYTES,
            slots: crate::slots::TWO_RANK_SLOTS,
            chunk_blocks: DEFAULT_CHUNK_BLOCKS,
            lines_max_bytes: DEFAULT_LINES_MAX_BYTES,
            many_chunks: false,
            algorithm: None,
            compress: None,
            receive: Receive::Auto,
            chunk_bytes: None,
            replay_calls: None,
            waits: FlagWaits::Kernel,
        }
    }
}

impl AllReducePaths {
    /// The paths of a communicator of `world` ranks made with `options`, as
    /// [`crate::Communicator::all_reduce_paths`] reports them once made (`forced` from the
    /// options or `GP2P_ALGORITHM`, as at creation; a small /dev/shm may shrink default slots,
    /// [`crate::fit_slot_to_shm`]): what `gp2p plan` prices.
    ///
    /// # Errors
    /// [`crate::Error::InvalidOption`] for options a communicator refuses.
    pub fn of(world: usize, options: &CommOptions, forced: Option<Algorithm>) -> Result<AllReducePaths> {
        let layout = Layout::new(world, options)?;
        Ok(AllReducePaths {
            world,
            small_max: layout.small_max,
            slot_bytes: layout.slot_bytes,
            chunk_bytes: layout.fixed_chunk(),
            many: layout.many_choice(forced),
            // Cards of their own, each on its link: ranks sharing a GPU are seen only once made.
            shared_link: false,
        })
    }
}

impl CommOptions {
    /// These options as [`MANY_CHUNKS_VAR`]'s value `env` leaves them for `world` ranks.
    pub(crate) fn with_many_chunks_from(self, world: usize, env: Option<&str>) -> Result<CommOptions> {
        let on = match env.map(|v| v.trim().to_ascii_lowercase()).as_deref() {
            None | Some("") => return Ok(self),
            Some("on" | "1" | "true") => true,
            Some("off" | "0" | "false") => false,
            Some(other) => {
                return Err(crate::Error::InvalidOption {
                    name: MANY_CHUNKS_VAR,
                    reason: format!(
                        "{other:?} is neither on nor off: set {MANY_CHUNKS_VAR}=on, {MANY_CHUNKS_VAR}=off, or unset it"
                    ),
                });
            }
        };
        if !on || !gp2p_kernels::CHUNKS_MANY_WORLD.contains(&world) {
            return Ok(CommOptions { many_chunks: false, ..self });
        }
        let small_max_bytes = match self.small_max_bytes {
            bytes if bytes <= self.lines_max_bytes => MANY_CHUNKS_MAX_BYTES,
            bytes => bytes,
        };
        Ok(CommOptions { many_chunks: true, small_max_bytes, ..self })
    }

    /// The defaults for `world` ranks: [`CommOptions::default`] for two; for more, the line
    /// kernel up to 64 KiB (the pipeline's N rounds cost more below that), among 3 to 8 the
    /// two-shot in one flagged-chunk kernel above it up to [`MANY_CHUNKS_MAX_BYTES`]
    /// ([`CommOptions::many_chunks`]), and four slots (`crate::slots::MANY_RANK_SLOTS`) of
    /// [`crate::SLOT_SPAN_BYTES`] / N on 64 KiB: about 256 MiB of /dev/shm at any N (less
    /// where it is smaller, [`crate::fit_slot_to_shm`]).
    pub fn for_world(world: usize) -> CommOptions {
        let default = CommOptions::default();
        if world <= 2 {
            return default;
        }
        let slot_bytes = crate::slots::default_slot_bytes(world);
        let many_chunks = gp2p_kernels::CHUNKS_MANY_WORLD.contains(&world);
        CommOptions {
            lines_max_bytes: MAX_LINES_BYTES,
            small_max_bytes: if many_chunks { MANY_CHUNKS_MAX_BYTES } else { MAX_LINES_BYTES },
            many_chunks,
            slot_bytes,
            slots: crate::slots::MANY_RANK_SLOTS,
            ..default
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variable_turns_the_flagged_chunks_on_or_off_among_three_to_eight() {
        let four = CommOptions { many_chunks: false, small_max_bytes: 64 << 10, ..CommOptions::for_world(4) };
        assert_eq!(four.with_many_chunks_from(4, None).unwrap(), four);
        assert_eq!(four.with_many_chunks_from(4, Some(" ")).unwrap(), four);
        for on in ["on", "1", "TRUE"] {
            let made = four.with_many_chunks_from(4, Some(on)).unwrap();
            assert_eq!((made.many_chunks, made.small_max_bytes), (true, MANY_CHUNKS_MAX_BYTES), "{on}");
        }
        let larger = CommOptions { small_max_bytes: 2 << 20, ..four };
        assert_eq!(larger.with_many_chunks_from(4, Some("on")).unwrap().small_max_bytes, 2 << 20, "a size asked for");
        let on = CommOptions { many_chunks: true, ..four };
        assert!(!on.with_many_chunks_from(4, Some("off")).unwrap().many_chunks);
        let two = CommOptions::for_world(2);
        assert_eq!(two.with_many_chunks_from(2, Some("on")).unwrap(), two, "two ranks have their own kernel");
        let e = four.with_many_chunks_from(4, Some("yes please")).unwrap_err().to_string();
        assert!(e.contains(MANY_CHUNKS_VAR) && e.contains("neither on nor off"), "{e}");
    }

    #[test]
    fn the_default_paths_are_the_default_layout_s() {
        let two = AllReducePaths::of(2, &CommOptions::for_world(2), None).unwrap();
        assert_eq!((two.small_max, two.slot_bytes, two.many.lines_max), (4 << 20, 8 << 20, 2 << 10));
        let eight = AllReducePaths::of(8, &CommOptions::for_world(8), Some(Algorithm::TwoShot)).unwrap();
        assert_eq!((eight.small_max, eight.slot_bytes, eight.many.lines_max), (1 << 20, 8 << 20, 64 << 10));
        assert_eq!(eight.many.chunks_max, MANY_CHUNKS_MAX_BYTES, "the flagged chunks above the lines");
        let off = CommOptions::for_world(8).with_many_chunks_from(8, Some("off")).unwrap();
        let off = AllReducePaths::of(8, &off, None).unwrap();
        assert_eq!(
            (off.small_max, off.many.chunks_max),
            (64 << 10, 0),
            "GP2P_MANY_CHUNKS=off: the rounds above the lines"
        );
        assert_eq!(eight.many.forced, Some(Algorithm::TwoShot));
        let bad = CommOptions { slot_bytes: 3, ..CommOptions::for_world(2) };
        assert!(AllReducePaths::of(2, &bad, None).is_err());
    }
}
