//! The compressed all-reduce, as a CPU reference: the block formats (int8, fp8 e4m3) and
//! their quantize and dequantize, with a flag per block for blocks that travel exact. The
//! GPU path is to compute the same bits; this module is its oracle. It does not run on a
//! GPU, pick formats or sizes, or move bytes.

mod block;
mod format;
mod fp8;

pub use block::Encoded;
pub use format::{BlockSize, CompressError, Compressible, Format, MIN_SCALED_BLOCK_MAX};
pub use fp8::{E4M3_MAX, e4m3_from_f32, e4m3_to_f32};
