//! Whether a communicator's all-reduces travel compressed ([`CommOptions::compress`], or else
//! the environment variable [`COMPRESS_VAR`]), and from what size: never by default. Once on,
//! every all-reduce of f32, f16 or bf16 under sum or avg of at least
//! [`Compression::min_bytes`] runs `Communicator::all_reduce_compressed`; the others, and
//! smaller ones, run exact.
//!
//! Where the caller gives no minimum, the cost model (`gp2p_collectives::cost`) sets it: the
//! smallest power of two from 4 KiB at which it prices the compressed all-reduce below the
//! exact one, with the rates measured on H200s. The compressed all-reduce is priced as the
//! two-shot of its wire (scales and codes: about half of bf16's bytes), in N + 1 phases
//! (the exact rounds' N and the fold between its two runs), plus [`COMPRESSED_CALL_US`] a
//! call for its codec's kernels; the exact one as the
//! communicator runs it (the cheaper of the lines and the rounds among more than two ranks,
//! the rounds' bytes between two). `gp2p plan` prints both and the minimum.
//!
//! ```
//! use gp2p_comm::{Compression, compression_from};
//!
//! assert_eq!(compression_from(None).unwrap(), None, "off unless asked");
//! let int8 = compression_from(Some("int8")).unwrap().unwrap();
//! assert_eq!((int8.format.format.name(), int8.format.block.get(), int8.min_bytes), ("int8", 64, None));
//! let fp8 = compression_from(Some("fp8:128")).unwrap().unwrap();
//! assert_eq!(fp8.format.block.get(), 128);
//! assert!(compression_from(Some("int4")).unwrap_err().to_string().contains("int8, fp8 or off"));
//! // Between two H200s the model turns it on from a few MiB.
//! let min = gp2p_comm::compression::min_bytes_h200(2, int8.format);
//! assert!((1 << 20..=16 << 20).contains(&min), "{min}");
//! # let _: Option<Compression> = None;
//! ```

use gp2p_collectives::cost::{Algorithm, Machine, Prediction, price};
use gp2p_collectives::legs::all_reduce_traffic;
use gp2p_cuda::codec::WireFormat;
use gp2p_kernels::compress::{BlockSize, Format, WireLayout};

use crate::choice::ManyChoice;
use crate::{CommOptions, Error, Result};

/// The environment variable that turns compression on for every communicator made without
/// [`CommOptions::compress`]: `int8`, `fp8`, either with `:BLOCK` (values per scale, a power of
/// two from 32 to 256; 64 without), or `off`.
pub const COMPRESS_VAR: &str = "GP2P_COMPRESS";

/// Values per block where none is named.
pub const DEFAULT_BLOCK: usize = 64;

/// The smallest size the cost model considers, and the largest.
const SMALLEST: usize = 4 << 10;
const LARGEST: usize = 1 << 30;

/// A communicator's all-reduces compressed, from a size on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Compression {
    /// How values travel.
    pub format: WireFormat,
    /// All-reduces of fewer bytes run exact; `None`: the cost model's minimum.
    pub min_bytes: Option<usize>,
}

impl Compression {
    /// Never compressed, whatever [`COMPRESS_VAR`] says (where [`CommOptions::compress`]'s
    /// `None` leaves it to the variable).
    pub fn off() -> Compression {
        let format = WireFormat { format: Format::Int8, block: BlockSize::SMALLEST };
        Compression { format, min_bytes: Some(usize::MAX) }
    }
}

/// What a value of [`COMPRESS_VAR`] asks for (`None`: unset or `off`).
pub fn compression_from(value: Option<&str>) -> Result<Option<Compression>> {
    let Some(value) = value.map(str::trim).filter(|v| !v.is_empty()) else { return Ok(None) };
    let bad = |why: String| Error::InvalidOption { name: COMPRESS_VAR, reason: format!("{value:?}: {why}") };
    let (name, block) = match value.split_once(':') {
        Some((name, block)) => {
            (name, block.trim().parse::<usize>().map_err(|_| bad("the block is not a number".into()))?)
        }
        None => (value, DEFAULT_BLOCK),
    };
    let format = match name.trim().to_ascii_lowercase().as_str() {
        "off" => return Ok(None),
        "int8" => Format::Int8,
        "fp8" => Format::Fp8E4m3,
        _ => return Err(bad("expected int8, fp8 or off, with :BLOCK (32 to 256) if you like".into())),
    };
    let block = BlockSize::new(block).map_err(|e| bad(e.to_string()))?;
    Ok(Some(Compression { format: WireFormat { format, block }, min_bytes: None }))
}

/// [`CommOptions::compress`], or else what [`COMPRESS_VAR`] (`env`) asks, with the minimum
/// resolved for `world` ranks: what every rank compares at creation.
pub(crate) fn resolve(options: &CommOptions, world: usize, env: Option<&str>) -> Result<Option<Resolved>> {
    let asked = match options.compress {
        Some(c) => Some(c),
        None => compression_from(env)?,
    };
    Ok(asked.filter(|c| c.min_bytes != Some(usize::MAX)).map(|c| Resolved {
        format: c.format,
        min_bytes: c.min_bytes.unwrap_or_else(|| min_bytes(&Machine::h200(world), options.lines_max_bytes, c.format)),
    }))
}

/// How many times the default slot a communicator of more than two ranks that compresses
/// takes: a wire's room (about 5 bytes a value, its exact area included) fills a slot whose
/// DMA carries about a fifth of it, so default slots leave the link waiting on handoffs. On
/// one H100, 4 processes under MPS, bf16 int8/64 (`benches/results/h10080gbhbm3/
/// comm-compress-slots.txt`): 64 MiB took 5.57 ms with 16 MiB slots against 7.94 with the
/// default 4 MiB (1.86× the exact all-reduce's 10.37 ms, where it was 1.31×). The segment
/// grows as much: about 192 MiB of /dev/shm at 4 or 8 ranks.
pub const COMPRESSED_SLOT_FACTOR: usize = 4;

/// The slot size of a communicator of `world` ranks made with `options`, compressing or not:
/// [`COMPRESSED_SLOT_FACTOR`] times the default among more than two ranks that compress
/// where the options keep [`CommOptions::for_world`]'s slot, else the options' own.
pub(crate) fn slot_bytes(options: &CommOptions, world: usize, compress: Option<Resolved>) -> usize {
    let default = CommOptions::for_world(world).slot_bytes;
    if compress.is_some() && world > 2 && options.slot_bytes == default {
        default * COMPRESSED_SLOT_FACTOR
    } else {
        options.slot_bytes
    }
}

/// A compression with its minimum settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Resolved {
    pub(crate) format: WireFormat,
    pub(crate) min_bytes: usize,
}

impl Resolved {
    /// The two words ranks compare: the format and block (format + 1, block above), and
    /// the minimum in KiB, saturated.
    pub(crate) fn option_words(this: Option<Resolved>) -> [u32; 2] {
        match this {
            None => [0, 0],
            Some(r) => {
                let format = match r.format.format {
                    Format::Int8 => 1,
                    Format::Fp8E4m3 => 2,
                };
                let kib = u32::try_from(r.min_bytes.div_ceil(1024)).unwrap_or(u32::MAX);
                [format | (r.format.block.get() as u32) << 8, kib]
            }
        }
    }
}

/// What a compressed all-reduce costs beyond its wire's traffic, µs a call: its encodes,
/// folds and decodes and the join between its two runs. Fitted so that the model's switch
/// falls where one H200 measured it, N processes under MPS, bf16, int8 in blocks of 64
/// (`benches/results/h200/comm-compress-int8-2.txt` against `comm-exact-2.txt`, and the same
/// for 4): compressed lost at 1 MiB (179 µs against 90 for two ranks, 426 against 420 for
/// four) and won from 4 MiB (293 against 424, 651 against 864).
pub const COMPRESSED_CALL_US: f64 = 30.0;

/// The model's time for the compressed all-reduce of `bytes` per rank (see the module doc).
pub fn compressed_prediction(machine: &Machine, bytes: usize, format: WireFormat, element_bytes: usize) -> Prediction {
    let wire = WireLayout { values: bytes / element_bytes.max(1), block: format.block }.scaled_bytes();
    let mut t = all_reduce_traffic(machine.ranks, wire);
    t.phases += 1;
    let mut prediction = price(machine, Algorithm::TwoShot, t);
    prediction.seconds += COMPRESSED_CALL_US * 1e-6;
    prediction
}

/// The model's time for the exact all-reduce as the communicator runs it.
pub fn exact_prediction(machine: &Machine, bytes: usize, lines_max: usize) -> Prediction {
    let rounds = price(machine, Algorithm::TwoShot, all_reduce_traffic(machine.ranks, bytes));
    if machine.ranks <= 2 || bytes > lines_max {
        return rounds;
    }
    let choice = ManyChoice { machine: *machine, lines_max, forced: None };
    let (lines, rounds) = choice.predictions(bytes);
    if lines.seconds <= rounds.seconds { lines } else { rounds }
}

/// The smallest power of two from 4 KiB at which the model prices the compressed all-reduce
/// of bf16 below the exact one on `machine` (1 GiB where it never does below that).
pub fn min_bytes(machine: &Machine, lines_max: usize, format: WireFormat) -> usize {
    let mut bytes = SMALLEST;
    while bytes < LARGEST {
        let exact = exact_prediction(machine, bytes, lines_max).seconds;
        if compressed_prediction(machine, bytes, format, 2).seconds < exact {
            return bytes;
        }
        bytes *= 2;
    }
    LARGEST
}

/// [`min_bytes`] for `world` H200s with the default line kernel size for that world.
pub fn min_bytes_h200(world: usize, format: WireFormat) -> usize {
    min_bytes(&Machine::h200(world), CommOptions::for_world(world).lines_max_bytes, format)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compressing_among_more_than_two_takes_larger_default_slots_only() {
        let on = Some(Resolved { format: int8(), min_bytes: 1 });
        for world in 1..=8 {
            let options = CommOptions::for_world(world);
            let want = if world > 2 { COMPRESSED_SLOT_FACTOR * options.slot_bytes } else { options.slot_bytes };
            assert_eq!(slot_bytes(&options, world, on), want, "{world} ranks");
            assert_eq!(slot_bytes(&options, world, None), options.slot_bytes, "{world} ranks, exact");
            let chosen = CommOptions { slot_bytes: 1 << 20, ..options };
            assert_eq!(slot_bytes(&chosen, world, on), 1 << 20, "{world} ranks: a chosen slot stays");
        }
        assert!(CommOptions::for_world(3).slot_bytes * COMPRESSED_SLOT_FACTOR <= 256 << 20);
    }

    fn int8() -> WireFormat {
        WireFormat { format: Format::Int8, block: BlockSize::new(64).unwrap() }
    }

    #[test]
    fn the_variable_names_a_format_and_maybe_a_block_or_off() {
        assert_eq!(compression_from(Some("off")).unwrap(), None);
        assert_eq!(compression_from(Some(" ")).unwrap(), None);
        let c = compression_from(Some("FP8:32")).unwrap().unwrap();
        assert_eq!((c.format.format, c.format.block.get()), (Format::Fp8E4m3, 32));
        for (value, says) in [("int4", "expected int8, fp8 or off"), ("int8:48", "48"), ("int8:x", "not a number")] {
            let e = compression_from(Some(value)).unwrap_err().to_string();
            assert!(e.contains(says) && e.contains(COMPRESS_VAR), "{value}: {e}");
        }
    }

    #[test]
    fn the_option_wins_over_the_variable_and_the_minimum_comes_from_the_model() {
        let options = CommOptions::default();
        assert_eq!(resolve(&options, 2, None).unwrap(), None);
        let from_env = resolve(&options, 2, Some("int8")).unwrap().unwrap();
        assert_eq!(from_env.min_bytes, min_bytes_h200(2, int8()));
        let given = Compression { format: int8(), min_bytes: Some(12345) };
        let options = CommOptions { compress: Some(given), ..options };
        assert_eq!(resolve(&options, 2, Some("fp8")).unwrap().unwrap(), Resolved { format: int8(), min_bytes: 12345 });
        let words = Resolved::option_words(Some(Resolved { format: int8(), min_bytes: 12345 }));
        assert_eq!(words, [1 | 64 << 8, 13]);
        assert_eq!(Resolved::option_words(None), [0, 0]);
        let off = CommOptions { compress: Some(Compression::off()), ..CommOptions::default() };
        assert_eq!(resolve(&off, 2, Some("int8")).unwrap(), None, "off whatever the variable says");
    }

    #[test]
    fn above_its_minimum_the_model_prices_compressed_below_exact_and_not_below_it() {
        for world in [2, 4, 8] {
            let machine = Machine::h200(world);
            let lines_max = CommOptions::for_world(world).lines_max_bytes;
            let min = min_bytes(&machine, lines_max, int8());
            assert!(min > SMALLEST && min < LARGEST, "{world} ranks: {min}");
            let compressed = |b| compressed_prediction(&machine, b, int8(), 2).seconds;
            let exact = |b| exact_prediction(&machine, b, lines_max).seconds;
            assert!(compressed(min / 2) >= exact(min / 2), "{world} ranks at {}", min / 2);
            for bytes in [min, 4 * min, 256 << 20] {
                assert!(compressed(bytes) < exact(bytes), "{world} ranks at {bytes}");
            }
            // Large buffers: about half the bytes, so close to twice as fast.
            let speedup = exact(256 << 20) / compressed(256 << 20);
            assert!((1.7..2.0).contains(&speedup), "{world} ranks: {speedup}");
        }
    }
}
