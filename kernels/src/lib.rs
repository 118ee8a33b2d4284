//! The CUDA kernels of geforce-p2p as committed PTX, and the vocabulary they are indexed by.
//!
//! The kernels are CUDA C in this crate's folder, one file per [`KernelFamily`]: `reduce.cu`
//! (elementwise reduce), `exchange.cu` (the two-rank exchange in 8-byte lines),
//! `exchange_many.cu` (the same lines among 2 to 8 ranks), `chunks.cu` (the two-rank exchange
//! in flagged chunks) and `flags.cu` (the bounded wait on one flag or several), with
//! what they share in `common.cuh`. `cargo xtask ptx` compiles each with NVRTC 12.0 for
//! `compute_80` and `compute_75` and the PTX is committed next to them, so users need no CUDA
//! toolkit: the driver JIT-compiles the PTX for whatever card it meets (Turing and newer;
//! [`PtxTarget`] picks the build). `cargo xtask ptx --check` fails when the committed PTX is
//! stale.
//!
//! This crate holds data only — PTX text, [`DType`], [`ReduceOp`] and kernel names. Loading
//! and launching belong to `gp2p-cuda`; this crate never touches a GPU. Beside the kernels
//! are their CPU references: [`reference`](mod@reference) for the reduce kernels, [`compress`] for the
//! compressed all-reduce (formats, two roundings, the per-element error bound).
//!
//! ```
//! use gp2p_kernels::{DType, KernelFamily, PtxTarget, ReduceOp, reduce_kernel_name, REDUCE};
//!
//! let name = reduce_kernel_name(ReduceOp::Sum, DType::BF16);
//! assert_eq!(name, "gp2p_reduce_sum_bf16");
//! assert!(REDUCE.ptx.contains(name));
//! assert_eq!(PtxTarget::Compute80.module(KernelFamily::Reduce), REDUCE);
//! assert_eq!("f16".parse::<DType>().unwrap(), DType::F16);
//! ```

pub mod compress;
mod dtype;
mod element;
mod flags;
pub mod fp8;
mod op;
pub mod reference;

pub use dtype::{DType, UnknownDType};
pub use element::Element;
pub use flags::{STAMP_KERNEL, WAIT_FLAG_KERNEL, WAIT_FLAGS_KERNEL};
/// Re-exported so users name the same f16 / bf16 types the kernels are instantiated for.
pub use half;
pub use op::{ReduceOp, UnknownReduceOp};

/// One PTX module: its name (used as the cache key when it is loaded) and its text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PtxModule {
    /// Short name of the module, also the stem of its `.cu` and `.ptx` files.
    pub name: &'static str,
    /// The PTX text, NUL-free, as NVRTC 12.0 produced it.
    pub ptx: &'static str,
}

/// The reduce kernel family (`reduce.cu`): `dst[i] = op(dst[i], src[i])` for every
/// [`ReduceOp`] × [`DType`].
///
/// Every kernel has the signature `(T* dst, const T* src, u64 n, u32 divisor)`; `divisor`
/// is used by [`ReduceOp::Avg`] only and is 1 on every step but the last.
pub const REDUCE: PtxModule = PtxModule { name: "reduce", ptx: include_str!("../reduce.ptx") };

/// The same kernels as [`REDUCE`] built for `compute_75` (Turing, RTX 20-series), which
/// lacks the bfloat16 conversion instruction: bfloat16 is rounded in integer arithmetic,
/// to the same bits.
pub const REDUCE_COMPUTE_75: PtxModule =
    PtxModule { name: "reduce.compute_75", ptx: include_str!("../reduce.compute_75.ptx") };

/// The line exchange family (`exchange.cu`): [`exchange_kernel_name`] for every
/// [`ReduceOp`] × [`DType`].
pub const EXCHANGE: PtxModule = PtxModule { name: "exchange", ptx: include_str!("../exchange.ptx") };

/// [`EXCHANGE`] built for `compute_75`.
pub const EXCHANGE_COMPUTE_75: PtxModule =
    PtxModule { name: "exchange.compute_75", ptx: include_str!("../exchange.compute_75.ptx") };

/// The many-rank line exchange family (`exchange_many.cu`): [`exchange_many_kernel_name`]
/// for every [`ReduceOp`] × [`DType`].
pub const EXCHANGE_MANY: PtxModule = PtxModule { name: "exchange_many", ptx: include_str!("../exchange_many.ptx") };

/// [`EXCHANGE_MANY`] built for `compute_75`.
pub const EXCHANGE_MANY_COMPUTE_75: PtxModule =
    PtxModule { name: "exchange_many.compute_75", ptx: include_str!("../exchange_many.compute_75.ptx") };

/// The flagged-chunk family (`chunks.cu`): [`chunks_kernel_name`] for every [`ReduceOp`] ×
/// [`DType`].
pub const CHUNKS: PtxModule = PtxModule { name: "chunks", ptx: include_str!("../chunks.ptx") };

/// [`CHUNKS`] built for `compute_75`.
pub const CHUNKS_COMPUTE_75: PtxModule =
    PtxModule { name: "chunks.compute_75", ptx: include_str!("../chunks.compute_75.ptx") };

/// The flag family (`flags.cu`): [`WAIT_FLAG_KERNEL`].
pub const FLAGS: PtxModule = PtxModule { name: "flags", ptx: include_str!("../flags.ptx") };

/// [`FLAGS`] built for `compute_75`.
pub const FLAGS_COMPUTE_75: PtxModule =
    PtxModule { name: "flags.compute_75", ptx: include_str!("../flags.compute_75.ptx") };

/// The compressed all-reduce's codec (`compress.cu`): [`compress_kernel_name`] for every
/// [`CodecKernel`] × [`compress::Format`] × f32, f16 and bf16.
pub const COMPRESS: PtxModule = PtxModule { name: "compress", ptx: include_str!("../compress.ptx") };

/// [`COMPRESS`] built for `compute_75`.
pub const COMPRESS_COMPUTE_75: PtxModule =
    PtxModule { name: "compress.compute_75", ptx: include_str!("../compress.compute_75.ptx") };

/// Every module this crate ships, for tools that compile or check them all.
pub const MODULES: &[PtxModule] = &[
    REDUCE,
    REDUCE_COMPUTE_75,
    EXCHANGE,
    EXCHANGE_COMPUTE_75,
    EXCHANGE_MANY,
    EXCHANGE_MANY_COMPUTE_75,
    CHUNKS,
    CHUNKS_COMPUTE_75,
    FLAGS,
    FLAGS_COMPUTE_75,
    COMPRESS,
    COMPRESS_COMPUTE_75,
];

/// A family of kernels: one `.cu` file in this crate's folder, one [`PtxModule`] per
/// [`PtxTarget`] ([`PtxTarget::module`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KernelFamily {
    /// Elementwise reduce ([`reduce_kernel_name`]).
    Reduce,
    /// The two-rank exchange in 8-byte lines ([`exchange_kernel_name`]).
    Exchange,
    /// The same lines among 2 to 8 ranks ([`exchange_many_kernel_name`]).
    ExchangeMany,
    /// The two-rank exchange in flagged chunks ([`chunks_kernel_name`]).
    Chunks,
    /// The bounded wait on a flag ([`WAIT_FLAG_KERNEL`]) or several ([`WAIT_FLAGS_KERNEL`]),
    /// and the clock stamp of timelines ([`STAMP_KERNEL`]).
    Flags,
    /// The compressed all-reduce's block codec ([`compress_kernel_name`]).
    Compress,
}

impl KernelFamily {
    /// Every family.
    pub const ALL: [KernelFamily; 6] = [
        KernelFamily::Reduce,
        KernelFamily::Exchange,
        KernelFamily::ExchangeMany,
        KernelFamily::Chunks,
        KernelFamily::Flags,
        KernelFamily::Compress,
    ];

    /// The family's name: the stem of its `.cu` and `.ptx` files.
    pub fn name(self) -> &'static str {
        match self {
            KernelFamily::Reduce => "reduce",
            KernelFamily::Exchange => "exchange",
            KernelFamily::ExchangeMany => "exchange_many",
            KernelFamily::Chunks => "chunks",
            KernelFamily::Flags => "flags",
            KernelFamily::Compress => "compress",
        }
    }
}

/// A PTX target the kernels are built for, oldest first (a card runs every target up to its own).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PtxTarget {
    /// `compute_75`: Turing.
    Compute75,
    /// `compute_80`: Ampere and every later card.
    Compute80,
}

impl PtxTarget {
    /// Every target, oldest first.
    pub const ALL: [PtxTarget; 2] = [PtxTarget::Compute75, PtxTarget::Compute80];

    /// The oldest compute capability that runs this target.
    pub const fn min_capability(self) -> (u32, u32) {
        match self {
            PtxTarget::Compute75 => (7, 5),
            PtxTarget::Compute80 => (8, 0),
        }
    }

    /// The newest target a card of compute capability `(major, minor)` runs, if any.
    pub fn for_capability(capability: (u32, u32)) -> Option<PtxTarget> {
        PtxTarget::ALL.into_iter().rev().find(|t| capability >= t.min_capability())
    }

    /// The name NVRTC and the driver use: `compute_75`, `compute_80`.
    pub fn name(self) -> &'static str {
        match self {
            PtxTarget::Compute75 => "compute_75",
            PtxTarget::Compute80 => "compute_80",
        }
    }

    /// The target named `name` (`compute_75`, `compute_80`).
    pub fn from_name(name: &str) -> Option<PtxTarget> {
        PtxTarget::ALL.into_iter().find(|t| t.name() == name)
    }

    /// Whether the line exchange (two kernels that wait for each other's data in mapped host
    /// memory) is offered on this build. Not on compute_75: with the Turing build forced on
    /// two H200s, an f64 exchange after an f32 one waited out its timeout every time, with
    /// kernels whose PTX is identical in both builds; until that is understood, Turing cards
    /// take the DMA paths.
    pub fn runs_line_exchange(self) -> bool {
        self >= PtxTarget::Compute80
    }

    /// The reduce kernels built for this target.
    pub fn reduce_module(self) -> PtxModule {
        self.module(KernelFamily::Reduce)
    }

    /// The kernels of `family` built for this target.
    pub fn module(self, family: KernelFamily) -> PtxModule {
        match (self, family) {
            (PtxTarget::Compute75, KernelFamily::Reduce) => REDUCE_COMPUTE_75,
            (PtxTarget::Compute80, KernelFamily::Reduce) => REDUCE,
            (PtxTarget::Compute75, KernelFamily::Exchange) => EXCHANGE_COMPUTE_75,
            (PtxTarget::Compute80, KernelFamily::Exchange) => EXCHANGE,
            (PtxTarget::Compute75, KernelFamily::ExchangeMany) => EXCHANGE_MANY_COMPUTE_75,
            (PtxTarget::Compute80, KernelFamily::ExchangeMany) => EXCHANGE_MANY,
            (PtxTarget::Compute75, KernelFamily::Chunks) => CHUNKS_COMPUTE_75,
            (PtxTarget::Compute80, KernelFamily::Chunks) => CHUNKS,
            (PtxTarget::Compute75, KernelFamily::Flags) => FLAGS_COMPUTE_75,
            (PtxTarget::Compute80, KernelFamily::Flags) => FLAGS,
            (PtxTarget::Compute75, KernelFamily::Compress) => COMPRESS_COMPUTE_75,
            (PtxTarget::Compute80, KernelFamily::Compress) => COMPRESS,
        }
    }
}

/// Threads per block the reduce kernels are compiled for (`__launch_bounds__`).
pub const REDUCE_BLOCK_THREADS: u32 = 256;

/// Bytes one vector load or store moves in the reduce kernels' aligned body.
pub const REDUCE_VECTOR_BYTES: usize = 16;

/// A table of kernel names `<prefix><op>_<dtype>`, indexed by op then dtype: names are looked
/// up on every launch and must be `'static`, so they are spelled out at compile time.
macro_rules! kernel_names {
    ($prefix:literal) => {{
        macro_rules! row {
            ($op:literal) => {
                [
                    concat!($prefix, $op, "_f32"),
                    concat!($prefix, $op, "_f64"),
                    concat!($prefix, $op, "_f16"),
                    concat!($prefix, $op, "_bf16"),
                    concat!($prefix, $op, "_i8"),
                    concat!($prefix, $op, "_u8"),
                    concat!($prefix, $op, "_i32"),
                    concat!($prefix, $op, "_u32"),
                    concat!($prefix, $op, "_i64"),
                    concat!($prefix, $op, "_u64"),
                    concat!($prefix, $op, "_f8e4m3"),
                    concat!($prefix, $op, "_f8e5m2"),
                ]
            };
        }
        [row!("sum"), row!("avg"), row!("min"), row!("max"), row!("prod")]
    }};
}

mod chunks_many;
mod codec_kernels;
pub use chunks_many::{CHUNKS_MANY_WORLD, ChunksManyArea, chunks_many_area, chunks_many_kernel_name};
pub use codec_kernels::{CODEC_MAX_RANKS, COPY_EXACT_BLOCKS_KERNEL, CodecKernel, compress_kernel_name};

/// The exported name of the reduce kernel for `op` on `dtype`.
pub fn reduce_kernel_name(op: ReduceOp, dtype: DType) -> &'static str {
    const NAMES: [[&str; DType::ALL.len()]; ReduceOp::ALL.len()] = kernel_names!("gp2p_reduce_");
    NAMES[op.index()][dtype.index()]
}

/// The exported name of the two-rank exchange kernel for `op` on `dtype`, in [`EXCHANGE`].
///
/// Signature `(T* buf, u64 n, u64* out_lines, const u64* in_lines, u32 seq, u32 divisor,
/// u64 timeout_ns, u32* failed, u32* seq_counter, u64 half_stride, u32* broken)`: each rank
/// publishes
/// `buf` into its own lines of mapped host memory as [`EXCHANGE_LINE_BYTES`]-byte lines of
/// [`EXCHANGE_LINE_DATA_BYTES`] data bytes tagged with `seq`, waits for the peer's lines
/// tagged `seq`, and folds `buf = op(own, peer)`. A wait longer than `timeout_ns` sets
/// `*failed` to 1 and returns. With `seq_counter` (device memory; one block only) the number
/// is the next after the count there, which the kernel stores back, and `seq` is ignored;
/// odd numbers use the lines `half_stride` bytes on. With `broken` (a word every rank's waits
/// share), a wait returns at once once it is set, and a timeout sets it too.
pub fn exchange_kernel_name(op: ReduceOp, dtype: DType) -> &'static str {
    const NAMES: [[&str; DType::ALL.len()]; ReduceOp::ALL.len()] = kernel_names!("gp2p_exchange_");
    NAMES[op.index()][dtype.index()]
}

/// The exported name of the line exchange for 2 to [`EXCHANGE_MANY_MAX_WORLD`] ranks for
/// `op` on `dtype`, in [`EXCHANGE_MANY`] (one-shot: every rank reads every other rank's lines).
///
/// Signature `(T* buf, u64 n, u64* lines, u64 area_stride, u32 rank, u32 world, u32 divisor,
/// u64 timeout_ns, u32* failed, u32* seq_counter, u64 half_stride, u32* broken)`: rank `r`'s
/// lines start `r * area_stride` bytes after `lines`; each rank publishes `buf` into its own
/// as [`exchange_kernel_name`]'s kernel does, waits for every other rank's lines tagged with
/// the call's number, and folds all `world` buffers in rank order into `buf` (its own from
/// `buf`), so every rank gets the same bits; avg divides by `divisor` at the last step. The
/// number is the next after the count at `seq_counter` (device memory, one block only),
/// stored back; odd numbers use the lines `half_stride` bytes on.
pub fn exchange_many_kernel_name(op: ReduceOp, dtype: DType) -> &'static str {
    const NAMES: [[&str; DType::ALL.len()]; ReduceOp::ALL.len()] = kernel_names!("gp2p_exchange_many_");
    NAMES[op.index()][dtype.index()]
}

/// The most ranks [`exchange_many_kernel_name`]'s kernel folds (it keeps a line of each in
/// registers).
pub const EXCHANGE_MANY_MAX_WORLD: usize = 8;

/// The exported name of the flagged-chunk all-reduce kernel for `op` on `dtype`, in
/// [`CHUNKS`]: small and middling two-rank all-reduces, of the one-process-per-GPU
/// communicator and of gp2p-pinned's `ChunkExchange` (two devices of one process).
///
/// Signature `(T* buf, u64 n, char* out_area, const char* in_area, u32 divisor,
/// u64 timeout_ns, u64 queue_timeout_ns, u32* failed, u32* seq_counter, u64 half_stride,
/// u64 flags_offset, u32* broken)`: each rank stores `buf` into its own data area of mapped
/// host memory in [`CHUNK_BYTES`] chunks, dealt to the blocks grid-stride, and marks each
/// with the call's number in its flag
/// (a word every [`CHUNK_FLAG_STRIDE`] bytes from `flags_offset` on); then it waits for the
/// peer's flags and folds `buf = op(own, peer)` chunk by chunk (half of each block stores,
/// half folds: launch [`CHUNK_BLOCK_THREADS`] threads per block). The number is the next after
/// the count in `seq_counter[0]` (device memory); the kernel's last block stores it back,
/// using `seq_counter[1]` (0 between calls) as its ticket. Odd numbers use the areas
/// `half_stride` bytes on. A wait gives up `timeout_ns` after the peer's first flag of the
/// call was seen, or `queue_timeout_ns` after it began, or once `broken` (unless null) is set.
pub fn chunks_kernel_name(op: ReduceOp, dtype: DType) -> &'static str {
    const NAMES: [[&str; DType::ALL.len()]; ReduceOp::ALL.len()] = kernel_names!("gp2p_chunks_");
    NAMES[op.index()][dtype.index()]
}

/// Bytes of one chunk of the flagged-chunk kernels (one block's share, one flag).
pub const CHUNK_BYTES: usize = 4096;
/// Bytes from one chunk's flag to the next (flags of different chunks on their own lines).
pub const CHUNK_FLAG_STRIDE: usize = 64;
/// The most blocks a flagged-chunk kernel runs (each then takes several chunks): two H200s
/// gained up to 256 (4 MiB: 172 us with 264 blocks against 224 with 64).
pub const CHUNK_MAX_BLOCKS: usize = 256;
/// Threads of a flagged-chunk block: half store chunks, half fold the peer's.
pub const CHUNK_BLOCK_THREADS: u32 = 512;
/// Resident flagged-chunk blocks per multiprocessor the grid is sized for: every block polls,
/// so the grid should fit on the device at once.
pub const CHUNK_BLOCKS_PER_SM: u32 = 2;

/// Where a flagged-chunk area of a `bytes`-byte buffer keeps its flags (the data, in whole
/// 16-byte groups, comes first), and the area's whole size.
pub const fn chunk_area_layout(bytes: usize) -> (usize, usize) {
    let data = bytes.div_ceil(EXCHANGE_GROUP_BYTES) * EXCHANGE_GROUP_BYTES;
    let flags = data.next_multiple_of(CHUNK_FLAG_STRIDE);
    (flags, flags + bytes.div_ceil(CHUNK_BYTES) * CHUNK_FLAG_STRIDE)
}

/// Bytes of one line of the exchange kernels: data and the call's sequence number.
pub const EXCHANGE_LINE_BYTES: usize = 8;
/// Data bytes in one line of the exchange kernels.
pub const EXCHANGE_LINE_DATA_BYTES: usize = 4;
/// The exchange kernels move the buffer in groups of this many bytes, one per thread; the
/// lines of a buffer of `b` bytes take `ceil(b / 16) * 16 * 2` bytes.
pub const EXCHANGE_GROUP_BYTES: usize = 16;

/// The bytes of lines an exchange of `bytes` bytes writes on each side.
pub const fn exchange_line_bytes(bytes: usize) -> usize {
    bytes.div_ceil(EXCHANGE_GROUP_BYTES) * EXCHANGE_GROUP_BYTES / EXCHANGE_LINE_DATA_BYTES * EXCHANGE_LINE_BYTES
}

/// The next sequence number of an exchange from its call counter: never 0 (the tag of lines
/// never written), and odd and even in turn, so consecutive calls use different halves of
/// the lines. Every party of an exchange counts its calls alike, so their numbers agree.
pub fn next_exchange_seq(counter: &mut u64) -> u32 {
    *counter += 1;
    if *counter as u32 == 0 {
        *counter += 2;
    }
    *counter as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `module` exports a kernel named `name`.
    fn exports(module: PtxModule, name: &str) -> bool {
        module.ptx.contains(&format!(".entry {name}("))
    }

    /// Every kernel of every family, by name, with its family.
    fn every_kernel() -> Vec<(KernelFamily, &'static str)> {
        let mut all = vec![
            (KernelFamily::Flags, WAIT_FLAG_KERNEL),
            (KernelFamily::Flags, WAIT_FLAGS_KERNEL),
            (KernelFamily::Flags, STAMP_KERNEL),
        ];
        for op in ReduceOp::ALL {
            for dtype in DType::ALL {
                all.push((KernelFamily::Reduce, reduce_kernel_name(op, dtype)));
                all.push((KernelFamily::Exchange, exchange_kernel_name(op, dtype)));
                all.push((KernelFamily::ExchangeMany, exchange_many_kernel_name(op, dtype)));
                all.push((KernelFamily::Chunks, chunks_kernel_name(op, dtype)));
                all.push((KernelFamily::Chunks, chunks_many_kernel_name(op, dtype)));
            }
        }
        for kernel in [CodecKernel::Encode, CodecKernel::FoldEncode, CodecKernel::Decode, CodecKernel::FoldDecode] {
            for format in compress::Format::ALL {
                for dtype in DType::ALL {
                    if let Some(name) = compress_kernel_name(kernel, format, dtype) {
                        all.push((KernelFamily::Compress, name));
                    }
                }
            }
        }
        all.push((KernelFamily::Compress, COPY_EXACT_BLOCKS_KERNEL));
        all
    }

    #[test]
    fn codec_kernels_exist_for_the_three_float_types_only() {
        let takes: Vec<DType> = DType::ALL
            .into_iter()
            .filter(|&d| compress_kernel_name(CodecKernel::Encode, compress::Format::Int8, d).is_some())
            .collect();
        assert_eq!(takes, [DType::F32, DType::F16, DType::BF16]);
        let name = compress_kernel_name(CodecKernel::FoldEncode, compress::Format::Fp8E4m3, DType::BF16);
        assert_eq!(name, Some("gp2p_compress_fold_encode_fp8_bf16"));
        for dtype in takes {
            for format in compress::Format::ALL {
                let name = compress_kernel_name(CodecKernel::Decode, format, dtype).unwrap();
                assert_eq!(name, format!("gp2p_compress_decode_{format}_{}", dtype.name()));
                assert!(exports(COMPRESS, name) && exports(COMPRESS_COMPUTE_75, name), "{name}");
            }
        }
    }

    #[test]
    fn every_kernel_name_is_in_the_ptx_and_ends_in_its_dtype() {
        for op in ReduceOp::ALL {
            for dtype in DType::ALL {
                let name = reduce_kernel_name(op, dtype);
                assert!(name.ends_with(&format!("_{}", dtype.name())), "{name}");
                assert!(name.contains(&format!("_{}_", op.name())), "{name}");
                assert!(exports(REDUCE, name), "{name} missing from reduce.ptx");
            }
        }
    }

    #[test]
    fn every_exchange_kernel_is_in_the_ptx() {
        for op in ReduceOp::ALL {
            for dtype in DType::ALL {
                let name = exchange_kernel_name(op, dtype);
                assert_eq!(name, format!("gp2p_exchange_{}_{}", op.name(), dtype.name()));
                assert!(exports(EXCHANGE, name), "{name} missing from exchange.ptx");
                let many = exchange_many_kernel_name(op, dtype);
                assert_eq!(many, format!("gp2p_exchange_many_{}_{}", op.name(), dtype.name()));
                assert!(exports(EXCHANGE_MANY, many), "{many} missing from exchange_many.ptx");
                let chunks = chunks_kernel_name(op, dtype);
                assert_eq!(chunks, format!("gp2p_chunks_{}_{}", op.name(), dtype.name()));
                assert!(exports(CHUNKS, chunks), "{chunks} missing from chunks.ptx");
            }
        }
        assert_eq!(next_exchange_seq(&mut 0), 1, "the first call is never tagged 0");
        let mut counter = u64::from(u32::MAX) - 2;
        let seqs: Vec<u32> = (0..4).map(|_| next_exchange_seq(&mut counter)).collect();
        assert_eq!(seqs, [u32::MAX - 1, u32::MAX, 2, 3], "0 skipped, parity still alternating");
        assert_eq!(chunk_area_layout(1), (64, 128), "one group, its flag on the next line");
        assert_eq!(chunk_area_layout(CHUNK_BYTES + 1), (CHUNK_BYTES + 64, CHUNK_BYTES + 64 + 2 * CHUNK_FLAG_STRIDE));
        assert_eq!(chunk_area_layout(64 << 10).1, (64 << 10) + 16 * CHUNK_FLAG_STRIDE);
        assert_eq!(exchange_line_bytes(0), 0);
        assert_eq!(exchange_line_bytes(1), 32, "one group of 16 bytes is four lines");
        assert_eq!(exchange_line_bytes(64 << 10), 128 << 10, "lines carry half data");
    }

    #[test]
    fn each_kernel_is_in_its_own_family_only_for_every_target() {
        for target in PtxTarget::ALL {
            for (family, name) in every_kernel() {
                for other in KernelFamily::ALL {
                    let module = target.module(other);
                    assert_eq!(exports(module, name), other == family, "{name} in {}", module.name);
                }
            }
        }
        let entries: usize = MODULES.iter().map(|m| m.ptx.matches(".entry ").count()).sum();
        assert_eq!(entries, every_kernel().len() * PtxTarget::ALL.len(), "no kernel the names do not list");
    }

    #[test]
    fn modules_are_named_after_their_family_and_target() {
        for target in PtxTarget::ALL {
            for family in KernelFamily::ALL {
                let module = target.module(family);
                let suffix = if target == PtxTarget::Compute80 { String::new() } else { format!(".{}", target.name()) };
                assert_eq!(module.name, format!("{}{suffix}", family.name()));
                assert!(MODULES.contains(&module), "{} not in MODULES", module.name);
            }
        }
        assert_eq!(MODULES.len(), KernelFamily::ALL.len() * PtxTarget::ALL.len());
    }

    #[test]
    fn ptx_targets_compute_80_and_has_no_nul() {
        for family in KernelFamily::ALL {
            let module = PtxTarget::Compute80.module(family);
            assert!(module.ptx.contains(".target sm_80"), "{}", module.name);
            assert!(!module.ptx.contains('\0'), "{}", module.name);
        }
    }

    #[test]
    fn the_turing_build_has_every_kernel_and_no_sm_80_instruction() {
        for family in KernelFamily::ALL {
            let module = PtxTarget::Compute75.module(family);
            assert!(module.ptx.contains(".target sm_75") && !module.ptx.contains('\0'), "{}", module.name);
            assert!(!module.ptx.contains("cvt.rn.bf16"), "bfloat16 conversion needs sm_80 ({})", module.name);
        }
        for (family, name) in every_kernel() {
            assert!(exports(PtxTarget::Compute75.module(family), name), "{name} missing from the compute_75 build");
        }
    }

    #[test]
    fn each_card_gets_the_newest_target_it_runs() {
        assert_eq!(PtxTarget::for_capability((7, 0)), None);
        assert_eq!(PtxTarget::for_capability((7, 5)), Some(PtxTarget::Compute75));
        assert_eq!(PtxTarget::for_capability((8, 0)), Some(PtxTarget::Compute80));
        assert_eq!(PtxTarget::for_capability((12, 0)), Some(PtxTarget::Compute80));
        for t in [PtxTarget::Compute75, PtxTarget::Compute80] {
            assert_eq!(PtxTarget::from_name(t.name()), Some(t));
            assert!(t.reduce_module().ptx.contains(&format!(".target sm_{}", &t.name()[8..])));
        }
    }
}
