//! The flag family's kernels ([`crate::FLAGS`], kernels/flags.cu): the bounded waits a
//! pipeline's streams hand chunks over with, and the clock stamp of timelines.

/// The exported name of the bounded wait on a flag in mapped host memory, in [`crate::FLAGS`].
///
/// Signature `(const u32* flag, u32 value, u64 timeout_ns, u32* failed, u32* broken)`: one
/// thread waits until `*flag == value`. A wait longer than `timeout_ns` sets `*failed` and
/// `*broken` to 1 and returns; a wait that finds either set returns at once.
pub const WAIT_FLAG_KERNEL: &str = "gp2p_wait_flag";

/// The exported name of the bounded wait on several flags at once, in [`crate::FLAGS`].
///
/// Signature `(const u32* flags, u32 count, u32 value, u64 timeout_ns, u32* failed,
/// u32* broken)`: one thread waits until each of the `count` consecutive `u32`s at `flags`
/// equals `value`; giving up as [`WAIT_FLAG_KERNEL`] does.
pub const WAIT_FLAGS_KERNEL: &str = "gp2p_wait_flags";

/// The exported name of the clock stamp, in [`crate::FLAGS`].
///
/// Signature `(u64* at)`: one thread writes the GPU's global clock (nanoseconds, the same
/// clock for every context on the device) to `*at`, once its stream's earlier work is done.
pub const STAMP_KERNEL: &str = "gp2p_stamp";
