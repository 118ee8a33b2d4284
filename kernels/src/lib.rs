//! The CUDA kernels of geforce-p2p as committed PTX, and the vocabulary they are indexed by.
//!
//! The kernels are CUDA C in this crate's folder (`reduce.cu`); `cargo xtask ptx` compiles
//! them with NVRTC 12.0 for `compute_80` and the PTX is committed next to them, so users need
//! no CUDA toolkit: the driver JIT-compiles the PTX for whatever card it meets (Ampere and
//! newer). `cargo xtask ptx --check` fails when the committed PTX is stale.
//!
//! This crate holds data only — PTX text, [`DType`], [`ReduceOp`] and kernel names. Loading
//! and launching belong to `gp2p-cuda`; this crate never touches a GPU.
//!
//! ```
//! use gp2p_kernels::{DType, ReduceOp, reduce_kernel_name, REDUCE};
//!
//! let name = reduce_kernel_name(ReduceOp::Sum, DType::BF16);
//! assert_eq!(name, "gp2p_reduce_sum_bf16");
//! assert!(REDUCE.ptx.contains(name));
//! assert_eq!("f16".parse::<DType>().unwrap(), DType::F16);
//! ```

mod dtype;
mod element;
mod op;
pub mod reference;

pub use dtype::{DType, UnknownDType};
pub use element::Element;
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

/// The reduce kernel family: `dst[i] = op(dst[i], src[i])` for every [`ReduceOp`] × [`DType`].
///
/// Every kernel has the signature `(T* dst, const T* src, u64 n, u32 divisor)`; `divisor`
/// is used by [`ReduceOp::Avg`] only and is 1 on every step but the last.
pub const REDUCE: PtxModule = PtxModule { name: "reduce", ptx: include_str!("../reduce.ptx") };

/// Every module this crate ships, for tools that compile or check them all.
pub const MODULES: &[PtxModule] = &[REDUCE];

/// Threads per block the reduce kernels are compiled for (`__launch_bounds__`).
pub const REDUCE_BLOCK_THREADS: u32 = 256;

/// Bytes one vector load or store moves in the reduce kernels' aligned body.
pub const REDUCE_VECTOR_BYTES: usize = 16;

/// The exported name of the reduce kernel for `op` on `dtype`.
pub fn reduce_kernel_name(op: ReduceOp, dtype: DType) -> &'static str {
    // A table rather than format!: names are looked up on every launch and must be 'static.
    const NAMES: [[&str; DType::ALL.len()]; ReduceOp::ALL.len()] = {
        macro_rules! row {
            ($op:literal) => {
                [
                    concat!("gp2p_reduce_", $op, "_f32"),
                    concat!("gp2p_reduce_", $op, "_f64"),
                    concat!("gp2p_reduce_", $op, "_f16"),
                    concat!("gp2p_reduce_", $op, "_bf16"),
                    concat!("gp2p_reduce_", $op, "_i8"),
                    concat!("gp2p_reduce_", $op, "_u8"),
                    concat!("gp2p_reduce_", $op, "_i32"),
                    concat!("gp2p_reduce_", $op, "_u32"),
                    concat!("gp2p_reduce_", $op, "_i64"),
                    concat!("gp2p_reduce_", $op, "_u64"),
                ]
            };
        }
        [row!("sum"), row!("avg"), row!("min"), row!("max"), row!("prod")]
    };
    NAMES[op.index()][dtype.index()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_name_is_in_the_ptx_and_ends_in_its_dtype() {
        for op in ReduceOp::ALL {
            for dtype in DType::ALL {
                let name = reduce_kernel_name(op, dtype);
                assert!(name.ends_with(&format!("_{}", dtype.name())), "{name}");
                assert!(name.contains(&format!("_{}_", op.name())), "{name}");
                assert!(REDUCE.ptx.contains(&format!(".entry {name}(")), "{name} missing from reduce.ptx");
            }
        }
    }

    #[test]
    fn ptx_targets_compute_80_and_has_no_nul() {
        assert!(REDUCE.ptx.contains(".target sm_80"));
        assert!(!REDUCE.ptx.contains('\0'));
    }
}
