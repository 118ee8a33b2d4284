//! Stream memory operations on `u32` flags: the driver's writes and waits that run on a
//! stream without a kernel, each batch one driver call. Writers signal readers with them in
//! every pipeline between processes; waits on them are the alternative to the bounded wait
//! kernel ([`super::wait_flags`]) that nothing but their flags ends.

use cudarc::driver::sys;

use super::check_words;
use crate::driver::{RawDevicePtr, check};
use crate::{Error, Result, Stream};

/// The most flags one [`write_flags`] writes or one [`wait_flags_stream`] waits on: a
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
        check_words("a stream memory operation", &[("flag", op.flag())], 4)?;
    }
    // SAFETY: the caller's contract; every flag checked above.
    unsafe { enqueue_ops(stream, ops) }
}

/// Enqueue `ops`, already checked (at most [`MAX_MEM_OPS`], every flag set and aligned), as
/// one driver call; none is nothing.
///
/// # Safety
/// As for [`mem_ops`].
unsafe fn enqueue_ops(stream: &Stream, ops: &[MemOp]) -> Result<()> {
    debug_assert!(ops.len() <= MAX_MEM_OPS, "the callers refuse larger batches");
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
    check_words("a write", &[("flag", flag)], 4)?;
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
    for &flag in flags {
        check_words("a write", &[("flag", flag)], 4)?;
    }
    let mut ops = [MemOp::Write { flag: 0, value }; MAX_FLAG_BATCH];
    for (op, &flag) in ops.iter_mut().zip(flags) {
        *op = MemOp::Write { flag, value };
    }
    // SAFETY: writes of flags that are the caller's contract, each checked above.
    unsafe { enqueue_ops(stream, &ops[..flags.len()]) }
}

/// What a stream wait on a flag holds for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Until {
    /// The flag equal to this value.
    Equal(u32),
    /// The flag with any of this mask's bits set.
    AnyBit(u32),
}

/// A word a stream wait writes before it holds (`entered`) and once it has ended (`left`),
/// each write with the default memory barrier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Note {
    /// The device's address of the word.
    pub word: RawDevicePtr,
    /// Written once the wait is reached.
    pub entered: u32,
    /// Written once every flag is as the wait holds for.
    pub left: u32,
}

/// Enqueue a wait on `count` consecutive `u32` flags from `flags` as one driver call, a batch
/// of stream memory operations rather than a kernel: later work on `stream` starts once every
/// one is as `until` says, with `note`'s writes around the wait where given. Nothing but the
/// flags ends it: no timeout, no give-up words (a watchdog that sets the flags may). At most
/// [`MAX_FLAG_BATCH`] flags; none is no wait (and no note).
///
/// # Safety
/// As for [`super::wait_flags`], for each of the `count` flags, and `note`'s word writable as
/// the flags are; whoever must set the flags must set them, or `stream`, and everything that
/// waits for it, never moves on.
pub unsafe fn wait_flags_stream(
    stream: &Stream,
    flags: RawDevicePtr,
    count: usize,
    until: Until,
    note: Option<Note>,
) -> Result<()> {
    if count > MAX_FLAG_BATCH {
        return Err(Error::InvalidArgument {
            name: "count",
            reason: format!("{count} flags; a stream wait takes at most {MAX_FLAG_BATCH}"),
        });
    }
    check_words("a stream wait", &[("flags", flags)], 4)?;
    if let Some(note) = note {
        check_words("a stream wait's note", &[("note", note.word)], 4)?;
    }
    if count == 0 {
        return Ok(());
    }
    let wait = |flag| match until {
        Until::Equal(value) => MemOp::WaitEq { flag, value },
        Until::AnyBit(mask) => MemOp::WaitAny { flag, mask },
    };
    // [entered,] every flag's wait[, left]: at most MAX_FLAG_BATCH + 2 of MAX_MEM_OPS.
    let mut ops = [wait(flags); MAX_MEM_OPS];
    let mut len = 0;
    let mut push = |op| {
        ops[len] = op;
        len += 1;
    };
    if let Some(n) = note {
        push(MemOp::Write { flag: n.word, value: n.entered });
    }
    for i in 0..count {
        push(wait(flags + 4 * i as u64));
    }
    if let Some(n) = note {
        push(MemOp::Write { flag: n.word, value: n.left });
    }
    // SAFETY: waits and writes on words that are the caller's contract, each checked above.
    unsafe { enqueue_ops(stream, &ops[..len]) }
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
