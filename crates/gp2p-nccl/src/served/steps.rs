//! Enqueueing a call's steps ([`crate::plan::Step`]) on the caller's stream: the
//! communicator's collectives and point-to-point legs, local copies, and the scaling of a
//! pre-multiplying op.

use geforce_p2p::comm::Communicator;
use geforce_p2p::{Element, ReduceOp};

use super::scratch::{FILL, Scratch, Use};
use crate::error::{Error, Result};
use crate::memory::Caller;
use crate::plan::{Buf, Scalar, Step};

/// Run `f::<T>(args...)` with `T` the element type of a `DataType`.
macro_rules! by_type {
    ($dtype:expr, $f:ident($($arg:expr),* $(,)?)) => {
        geforce_p2p::with_element!($dtype.kernel_dtype(), |T| $f::<T>($($arg),*))
    };
}

/// Enqueue `steps` (one call's) on the caller's stream, with the scratch the communicator's
/// calls share. Its use is noted even where a step fails part-way (what was enqueued runs).
///
/// # Errors
/// The first step's failure.
pub fn run(comm: &mut Communicator, caller: &Caller, scratch: &mut Scratch, steps: &[Step]) -> Result<()> {
    let mut scratch = scratch.for_call(&caller.device, &caller.stream)?;
    let ran = steps.iter().try_for_each(|step| one(comm, caller, &mut scratch, *step));
    let finished = scratch.finish();
    ran.and(finished)
}

/// The address a step's buffer stands for.
fn address(scratch: &mut Use<'_>, buf: Buf, bytes: usize) -> Result<u64> {
    match buf {
        Buf::User(address) => Ok(address),
        Buf::Scratch { buffer, offset } => Ok(scratch.address(buffer, offset + bytes)? + offset as u64),
    }
}

/// Enqueue one step.
fn one(comm: &mut Communicator, caller: &Caller, scratch: &mut Use<'_>, step: Step) -> Result<()> {
    let lib = |e: geforce_p2p::comm::Error| Error::Library(e.into());
    let (rank, world) = (comm.rank(), comm.world());
    match step {
        Step::AllReduce { input, output, count, dtype, op } => {
            let bytes = count * dtype.size_bytes();
            let (input, output) = (address(scratch, input, bytes)?, address(scratch, output, bytes)?);
            by_type!(dtype, all_reduce(comm, caller, input, output, count, op))
        }
        Step::AllGather { input, whole, part } => {
            let (input, whole) = (address(scratch, input, part)?, address(scratch, whole, part * world)?);
            let mut out = caller.view_mut::<u8>(whole, part * world);
            if input == whole + (rank * part) as u64 {
                comm.all_gather_in_place(&mut out, &caller.stream).map_err(lib)
            } else {
                comm.all_gather(&caller.view::<u8>(input, part), &mut out, &caller.stream).map_err(lib)
            }
        }
        Step::ReduceScatter { whole, output, count, dtype, op } => {
            let part = count * dtype.size_bytes();
            let (whole, output) = (address(scratch, whole, part * world)?, address(scratch, output, part)?);
            by_type!(dtype, reduce_scatter(comm, caller, whole, output, count, op))
        }
        Step::Broadcast { buf, bytes, root } => {
            let buf = address(scratch, buf, bytes)?;
            comm.broadcast(&mut caller.view_mut::<u8>(buf, bytes), &caller.stream, root).map_err(lib)
        }
        Step::Send { buf, bytes, peer } => {
            let buf = address(scratch, buf, bytes)?;
            comm.send(&caller.view::<u8>(buf, bytes), &caller.stream, peer).map_err(lib)
        }
        Step::Recv { buf, bytes, peer } => {
            let buf = address(scratch, buf, bytes)?;
            comm.recv(&mut caller.view_mut::<u8>(buf, bytes), &caller.stream, peer).map_err(lib)
        }
        Step::Copy { dst, src, bytes } => {
            let (dst, src) = (address(scratch, dst, bytes)?, address(scratch, src, bytes)?);
            let copied = caller.view_mut::<u8>(dst, bytes).copy_from(&caller.stream, &caller.view::<u8>(src, bytes));
            copied.map(|_| ()).map_err(|e| Error::Library(e.into()))
        }
        Step::Scale { buf, count, dtype, scalar } => {
            let bytes = count * dtype.size_bytes();
            let buf = address(scratch, buf, bytes)?;
            let fill = scratch.address(FILL, bytes)?;
            by_type!(dtype, scale(caller, buf, fill, count, scalar))
        }
    }
}

/// A typed all-reduce step: in place where input and output are one buffer.
fn all_reduce<T: Element>(
    comm: &mut Communicator,
    caller: &Caller,
    input: u64,
    output: u64,
    count: usize,
    op: ReduceOp,
) -> Result<()> {
    let mut out = caller.view_mut::<T>(output, count);
    let done = if input == output {
        comm.all_reduce(&mut out, &caller.stream, op)
    } else {
        comm.all_reduce_into(&caller.view::<T>(input, count), &mut out, &caller.stream, op)
    };
    done.map_err(|e| Error::Library(e.into()))
}

/// A typed reduce-scatter step: in place where the output is this rank's part of the whole.
fn reduce_scatter<T: Element>(
    comm: &mut Communicator,
    caller: &Caller,
    whole: u64,
    output: u64,
    count: usize,
    op: ReduceOp,
) -> Result<()> {
    let world = comm.world();
    let done = if output == whole + (comm.rank() * count * size_of::<T>()) as u64 {
        comm.reduce_scatter_in_place(&mut caller.view_mut::<T>(whole, count * world), &caller.stream, op)
    } else {
        let mut out = caller.view_mut::<T>(output, count);
        comm.reduce_scatter(&caller.view::<T>(whole, count * world), &mut out, &caller.stream, op)
    };
    done.map_err(|e| Error::Library(e.into()))
}

/// `buf *= scalar`: `fill` (scratch of `count` elements) gets the scalar everywhere, and the
/// reduce kernel multiplies `buf` by it. A value is set by a memset; a device scalar is copied
/// into the first element and doubled by copies within the buffer (log2(count) of them),
/// read as the call runs, as NCCL reads it.
fn scale<T: Element>(caller: &Caller, buf: u64, fill: u64, count: usize, scalar: Scalar) -> Result<()> {
    let cuda = |e: geforce_p2p::cuda::Error| Error::Library(e.into());
    match scalar {
        Scalar::Value(bits) => caller.fill(fill, size_of::<T>(), bits, count)?,
        Scalar::Device(address) => {
            caller.view_mut::<T>(fill, 1).copy_from(&caller.stream, &caller.view::<T>(address, 1)).map_err(cuda)?;
            let mut filled = 1;
            while filled < count {
                let n = filled.min(count - filled);
                let mut tail = caller.view_mut::<T>(fill + (filled * size_of::<T>()) as u64, n);
                tail.copy_from(&caller.stream, &caller.view::<T>(fill, n)).map_err(cuda)?;
                filled += n;
            }
        }
    }
    let mut dst = caller.view_mut::<T>(buf, count);
    geforce_p2p::cuda::reduce(&caller.stream, &mut dst, &caller.view::<T>(fill, count), ReduceOp::Prod, 1).map_err(cuda)
}
