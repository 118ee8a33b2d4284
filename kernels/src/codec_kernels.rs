//! The compressed all-reduce's codec kernels in [`crate::COMPRESS`] (`kernels/compress.cu`):
//! which there are, what each takes, and their exported names.

use crate::{DType, compress};

/// The four kernels of the compressed all-reduce's codec (`compress.cu`), each over a wire
/// laid out as [`compress::WireLayout`] says, one warp per block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CodecKernel {
    /// `(const T* src, u64 n, u32 block, u8* wire)`: `wire` = the quantized `src`.
    Encode,
    /// `(const T* own, u64 n, u32 block, u8* w0, ..., u8* w7, u32 ranks, u32 owner, u32
    /// average, u8* out)`: `out` = the quantized fold, in rank order, of `own` (rank `owner`'s
    /// values, exact) and every other rank r's wire `wr`, times the f32 reciprocal of `ranks`
    /// where `average` is not 0 (`w<owner>` and those from `ranks` on are not read).
    FoldEncode,
    /// `(const u8* wire, u64 n, u32 block, T* dst)`: `dst` = the wire's values, rounded once to
    /// `T`.
    Decode,
    /// `(u64 n, u32 block, u8* w0, ..., u8* w7, u32 ranks, u32 average, T* dst)`: `dst` = the
    /// fold, in rank order, of every rank r's values decoded from its wire `wr`, times the f32
    /// reciprocal of `ranks` where `average` is not 0, rounded once to `T` (those from `ranks`
    /// on are not read): the one-shot's result, `compress::all_reduce_one_shot`'s bits.
    FoldDecode,
}

/// The codec's one kernel of no type or format, in [`crate::COMPRESS`]: `(const u8* src, u64 n, u32
/// block, u8* dst, const u8* words)` copies the exact area's values of the blocks of a wire of
/// `n` values in blocks of `block` that travel exact, as the words at `words` (`src`'s or
/// `dst`'s) say: what a DMA of the wire's words and codes leaves out, and nothing where no
/// block travels exact.
pub const COPY_EXACT_BLOCKS_KERNEL: &str = "gp2p_compress_copy_exact_blocks";

/// The most ranks a [`CodecKernel::FoldEncode`] or [`CodecKernel::FoldDecode`] folds: the wires it takes by value.
pub const CODEC_MAX_RANKS: usize = 8;

/// The exported name of the codec kernel `kernel` for `format` on `dtype`, in [`crate::COMPRESS`];
/// `None` for a dtype the compressed all-reduce does not take (all but f32, f16 and bf16).
pub fn compress_kernel_name(kernel: CodecKernel, format: compress::Format, dtype: DType) -> Option<&'static str> {
    macro_rules! names {
        ($kind:literal) => {
            [
                [
                    concat!("gp2p_compress_", $kind, "_int8_f32"),
                    concat!("gp2p_compress_", $kind, "_int8_f16"),
                    concat!("gp2p_compress_", $kind, "_int8_bf16"),
                ],
                [
                    concat!("gp2p_compress_", $kind, "_fp8_f32"),
                    concat!("gp2p_compress_", $kind, "_fp8_f16"),
                    concat!("gp2p_compress_", $kind, "_fp8_bf16"),
                ],
            ]
        };
    }
    const NAMES: [[[&str; 3]; 2]; 4] =
        [names!("encode"), names!("fold_encode"), names!("decode"), names!("fold_decode")];
    let t = match dtype {
        DType::F32 => 0,
        DType::F16 => 1,
        DType::BF16 => 2,
        _ => return None,
    };
    let f = match format {
        compress::Format::Int8 => 0,
        compress::Format::Fp8E4m3 => 1,
    };
    let k = match kernel {
        CodecKernel::Encode => 0,
        CodecKernel::FoldEncode => 1,
        CodecKernel::Decode => 2,
        CodecKernel::FoldDecode => 3,
    };
    Some(NAMES[k][f][t])
}
