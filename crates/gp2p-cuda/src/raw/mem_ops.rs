//! Stream memory operations on `u32` flags: the driver's writes and waits that run on a
//! stream without a kernel, each batch one driver call. Writers signal readers with them in
//! every pipeline between processes; waits on them are the alternative to the bounded wait
//! kernel ([`super::wait_flags`]) that nothing but their flags ends.

use cudarc::driver::sys;

use super::check_aligned;
use crate::driver::{RawDevicePtr, check};
use crate::{Error, Result, Stream};

/// The most flags one [`write_flags`] writes or one [`wait_flags_unbounded`] waits on: a
/// communicator's readers of one slot, or its ranks.
pub const MAX_FLAG_BATCH: usize = 16;

/// The most operations one [`mem_ops`] enqueues (the driver takes fewer than 256 a batch).
pub const MAX_MEM_OPS: usize = 2 * MAX_FLAG_BATCH;

/// One stream memory operation on the `u32` at `flag` (the device's address of it).
#[allow(missing_docs)] // the fields, named alike in every variant, are described above
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemOp {
    /// Write `value`, once the stream's work before has completed and its writes are visible
    /// (the default memory barrier).
    Write { flag: RawDevicePtr, value: u32 },
    /// Hold the stream until the flag equals `value`.
    WaitEq { flag: RawDevicePtr, value: u32 },
    /// Hold the stream until the flag has one of `mask`'s bits set.
    WaitAny { flag: RawDevicePtr, mask: u32 },
}

impl MemOp {
    fn flag(self) -> RawDevicePtr {
        match self {
            MemOp::Write { flag, .. } | MemOp::WaitEq { flag, .. } | MemOp::WaitAny { flag, .. } => flag,
        }
    }

    /// The driver's form of the operation.
    fn params(self) -> sys::CUstreamBatchMemOpParams {
        // Written over zero bytes: the bytes past the variant's fields stay zero.
        let mut op = sys::CUstreamBatchMemOpParams { pad: [0; 6] };
        let wait = |address, value: u32, flags: sys::CUstreamWaitValue_flags| {
            sys::CUstreamBatchMemOpParams_union_CUstreamMemOpWaitValueParams_st {
                operation: sys::CUstreamBatchMemOpType::CU_STREAM_MEM_OP_WAIT_VALUE_32,
                address,
                // The whole word set, its low half the value (the driver reads only that).
                __bindgen_anon_1: sys::CUstreamBatchMemOpParams_union_CUstreamMemOpWaitValueParams_st__bindgen_ty_1 {
                    value64: u64::from(value),
                },
                flags: flags as u32,
                alias: 0,
            }
        };
        let write = |address, value: u32, flags: sys::CUstreamWriteValue_flags| {
            sys::CUstreamBatchMemOpParams_union_CUstreamMemOpWriteValueParams_st {
                operation: sys::CUstreamBatchMemOpType::CU_STREAM_MEM_OP_WRITE_VALUE_32,
                address,
                // As above.
                __bindgen_anon_1: sys::CUstreamBatchMemOpParams_union_CUstreamMemOpWriteValueParams_st__bindgen_ty_1 {
                    value64: u64::from(value),
                },
                flags: flags as u32,
                alias: 0,
            }
        };
        match self {
            MemOp::Write { flag, value } => {
                op.writeValue = write(flag, value, sys::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT);
            }
            MemOp::WaitEq { flag, value } => {
                op.waitValue = wait(flag, value, sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_EQ);
            }
            MemOp::WaitAny { flag, mask } => {
                op.waitValue = wait(flag, mask, sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_AND);
            }
        }
        op
    }
}

/// Enqueue `ops` on `stream` in order, as one driver call. No wait gives up: a wait holds the
/// stream until its flag satisfies it, whatever happens elsewhere. No fence follows a wait,
/// where the wait kernel has one: what a flag vouches for was written before the flag, under
/// the writer's write's default memory barrier. At most [`MAX_MEM_OPS`]; none is nothing.
///
/// # Safety
/// Every flag is a 4-byte aligned `u32` addressable from the stream's device (mapped pinned
/// host memory as this device maps it, say), writable where written, that stays allocated
/// until its operation completes on `stream`; whoever must set a flag a wait holds for must
/// set it, or `stream`, and everything that waits for it, never moves on.
pub unsafe fn mem_ops(stream: &Stream, ops: &[MemOp]) -> Result<()> {
    if ops.len() > MAX_MEM_OPS {
        return Err(Error::InvalidArgument {
            name: "ops",
            reason: format!("{} operations; one batch takes at most {MAX_MEM_OPS}", ops.len()),
        });
    }
    for op in ops {
        if op.flag() == 0 {
            return Err(Error::InvalidArgument {
                name: "flag",
                reason: "an operation needs its flag; got address 0".into(),
            });
        }
        check_aligned(&[("flag", op.flag())], 4)?;
    }
    if ops.is_empty() {
        return Ok(());
    }
    stream.device().bind()?;
    let mut batch = [sys::CUstreamBatchMemOpParams { pad: [0; 6] }; MAX_MEM_OPS];
    for (slot, op) in batch.iter_mut().zip(ops) {
        *slot = op.params();
    }
    // SAFETY: the first `ops.len()` entries are the caller's operations (its contract for
    // their flags); the driver reads the entries during the call only; the stream belongs to
    // the bound context.
    check(
        unsafe { sys::cuStreamBatchMemOp_v2(stream.raw(), ops.len() as u32, batch.as_mut_ptr(), 0) },
        "cuStreamBatchMemOp",
    )
}

/// Enqueue a write of `value` to the `u32` at `flag` on `stream`, after the work queued
/// there so far has completed and its writes are visible (a stream memory operation, with
/// its default memory barrier): the signal half of a pipeline between processes.
///
/// # Safety
/// `flag` is a writable, 4-byte aligned `u32` addressable from the stream's device (mapped
/// pinned host memory as this device maps it, say) that stays allocated until the write
/// completes on `stream`.
pub unsafe fn write_flag(stream: &Stream, flag: RawDevicePtr, value: u32) -> Result<()> {
    check_aligned(&[("flag", flag)], 4)?;
    stream.device().bind()?;
    let flags = sys::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32;
    // SAFETY: the address is the caller's contract; the stream belongs to the bound context.
    check(unsafe { sys::cuStreamWriteValue32_v2(stream.raw(), flag, value, flags) }, "cuStreamWriteValue32")
}

/// Enqueue writes of `value` to each `u32` of `flags` on `stream` as one driver call (a batch
/// of stream memory operations, each with the default memory barrier): what [`write_flag`]
/// does once a flag, for a writer that signals several readers at once. At most
/// [`MAX_FLAG_BATCH`] flags; one flag is a [`write_flag`].
///
/// # Safety
/// As for [`write_flag`], for every flag.
pub unsafe fn write_flags(stream: &Stream, flags: &[RawDevicePtr], value: u32) -> Result<()> {
    if let [flag] = flags {
        // SAFETY: the caller's contract.
        return unsafe { write_flag(stream, *flag, value) };
    }
    if flags.len() > MAX_FLAG_BATCH {
        return Err(Error::InvalidArgument {
            name: "flags",
            reason: format!("{} flags; a batch writes at most {MAX_FLAG_BATCH}", flags.len()),
        });
    }
    let mut ops = [MemOp::Write { flag: 0, value }; MAX_FLAG_BATCH];
    for (op, &flag) in ops.iter_mut().zip(flags) {
        *op = MemOp::Write { flag, value };
    }
    // SAFETY: writes of flags that are the caller's contract.
    unsafe { mem_ops(stream, &ops[..flags.len()]) }
}

/// Enqueue a wait on `count` consecutive `u32` flags from `flags` as one driver call, a batch
/// of stream memory operations rather than a kernel: later work on `stream` starts once every
/// one equals `value`. Nothing but the flags ends it (no timeout, no give-up words): for
/// measuring what [`super::wait_flags`]' kernel costs a pipeline's steps, never where a peer
/// may die. At most [`MAX_FLAG_BATCH`] flags; none is no wait.
///
/// # Safety
/// As for [`super::wait_flags`], for each of the `count` flags; and whoever sets them must
/// set them, or `stream`, and everything that waits for it, never moves on.
pub unsafe fn wait_flags_unbounded(stream: &Stream, flags: RawDevicePtr, count: usize, value: u32) -> Result<()> {
    if count > MAX_FLAG_BATCH {
        return Err(Error::InvalidArgument {
            name: "count",
            reason: format!("{count} flags; an unbounded wait takes at most {MAX_FLAG_BATCH}"),
        });
    }
    if flags == 0 {
        return Err(Error::InvalidArgument { name: "flags", reason: "a wait needs its flags; got address 0".into() });
    }
    check_aligned(&[("flags", flags)], 4)?;
    let mut ops = [MemOp::WaitEq { flag: flags, value }; MAX_FLAG_BATCH];
    for (i, op) in ops.iter_mut().enumerate() {
        *op = MemOp::WaitEq { flag: flags + 4 * i as u64, value };
    }
    // SAFETY: waits on flags that are the caller's contract.
    unsafe { mem_ops(stream, &ops[..count]) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_operation_names_its_flag_and_the_driver_s_kind_and_condition() {
        let cases = [
            (MemOp::Write { flag: 0x1000, value: 7 }, sys::CUstreamBatchMemOpType::CU_STREAM_MEM_OP_WRITE_VALUE_32, 0),
            (
                MemOp::WaitEq { flag: 0x2000, value: 7 },
                sys::CUstreamBatchMemOpType::CU_STREAM_MEM_OP_WAIT_VALUE_32,
                sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_EQ as u32,
            ),
            (
                MemOp::WaitAny { flag: 0x3000, mask: 7 },
                sys::CUstreamBatchMemOpType::CU_STREAM_MEM_OP_WAIT_VALUE_32,
                sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_AND as u32,
            ),
        ];
        for (op, kind, condition) in cases {
            let params = op.params();
            // SAFETY: every variant of the union begins with the operation's kind, and the
            // wait and write variants lay out address, value, flags alike.
            let (got_kind, address, value, flags) = unsafe {
                let wait = params.waitValue;
                (params.operation, wait.address, wait.__bindgen_anon_1.value, wait.flags)
            };
            assert_eq!(got_kind, kind, "{op:?}");
            assert_eq!((address, value), (op.flag(), 7), "{op:?}");
            assert_eq!(flags, condition, "{op:?}");
            // SAFETY: the union's padding words, all written (zero where no field lies).
            let tail = unsafe { params.pad[5] };
            assert_eq!(tail, 0, "{op:?}: the bytes past the fields stay zero");
        }
    }
}
