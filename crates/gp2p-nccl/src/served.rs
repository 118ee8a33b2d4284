//! A communicator the door serves: one rank of a `gp2p_comm::Communicator`, its
//! pre-multiplying ops, and the executor that enqueues a call's steps ([`crate::plan`]) on the
//! caller's stream. Nothing here blocks the host on another rank: every wait is the
//! communicator's, on the GPU.

use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use geforce_p2p::comm::Communicator;
use geforce_p2p::half::{bf16, f16};
use geforce_p2p::{Device, DeviceBuffer, Element, ReduceOp};
use parking_lot::Mutex;

use crate::abi::{DataType, NUM_BUILTIN_OPS, RawStream, builtin_op};
use crate::error::{Error, Result};
use crate::memory::{Caller, allow_graphs};
use crate::plan::{Buf, Call, Op, Scalar, Step};

/// Run `f::<T>(args...)` with `T` the element type of a reducible [`DataType`]; the fp8
/// types were refused by `Call::check` before any step exists.
macro_rules! by_type {
    ($dtype:expr, $f:ident($($arg:expr),* $(,)?)) => {
        match $dtype {
            DataType::Float32 => $f::<f32>($($arg),*),
            DataType::Float64 => $f::<f64>($($arg),*),
            DataType::Float16 => $f::<f16>($($arg),*),
            DataType::Bfloat16 => $f::<bf16>($($arg),*),
            DataType::Int8 => $f::<i8>($($arg),*),
            DataType::Uint8 => $f::<u8>($($arg),*),
            DataType::Int32 => $f::<i32>($($arg),*),
            DataType::Uint32 => $f::<u32>($($arg),*),
            DataType::Int64 => $f::<i64>($($arg),*),
            DataType::Uint64 => $f::<u64>($($arg),*),
            DataType::Float8e4m3 | DataType::Float8e5m2 => Err(Error::NotServed {
                what: format!("a reduction of {}: the door's kernels do not reduce fp8 yet", $dtype.name()),
            }),
        }
    };
}

/// A pre-multiplying op made by `ncclRedOpCreatePreMulSum`.
struct PreMul {
    /// The type it was made for.
    dtype: DataType,
    /// Where its scalar is read.
    scalar: Scalar,
    /// The op's own device copy of a host scalar (none for a device scalar).
    _own: Option<DeviceBuffer<u8>>,
}

/// A pre-multiplying op's scalar as `ncclRedOpCreatePreMulSum` passes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScalarArg {
    /// `ncclScalarHostImmediate`: the element's bytes, read at creation.
    Host(Vec<u8>),
    /// `ncclScalarDevice`: its device address, read as each call runs.
    Device(u64),
}

/// One rank of a served communicator.
pub struct Served {
    /// This rank.
    pub rank: usize,
    /// The number of ranks.
    pub world: usize,
    /// The device it runs on.
    pub device: Device,
    comm: Mutex<Communicator>,
    /// Ops made by `ncclRedOpCreatePreMulSum`, by raw value minus `ncclNumOps`; `None` once
    /// destroyed.
    ops: Mutex<Vec<Option<PreMul>>>,
    /// Set by `ncclCommAbort`: later calls are refused.
    aborted: AtomicBool,
    /// Communicators made from this one so far (every rank counts alike: splits and shrinks
    /// are collective), for their ids.
    derived: AtomicU32,
}

impl std::fmt::Debug for Served {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Served(rank {} of {} on device {})", self.rank, self.world, self.device.ordinal())
    }
}

impl Served {
    /// Serve `comm`, whose calls may be captured into CUDA graphs from now on.
    pub fn new(mut comm: Communicator) -> Served {
        allow_graphs(&mut comm);
        Served {
            rank: comm.rank(),
            world: comm.world(),
            device: comm.device().clone(),
            comm: Mutex::new(comm),
            ops: Mutex::new(Vec::new()),
            aborted: AtomicBool::new(false),
            derived: AtomicU32::new(0),
        }
    }

    /// `ncclRedOpCreatePreMulSum`: a new op that multiplies each rank's input by `scalar` (an
    /// element of `dtype`: its bytes, read from host memory already, or the address of device
    /// memory read as each call runs) and sums.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a type that is not a float type the kernels reduce;
    /// a CUDA error copying a host scalar.
    pub fn create_premul(&self, scalar: ScalarArg, dtype: DataType) -> Result<c_int> {
        if !dtype.is_float() || dtype.kernel_dtype().is_none() {
            return Err(Error::argument(
                "datatype",
                format!(
                    "{}: a pre-multiplying op takes ncclFloat16, ncclBfloat16, ncclFloat32 or ncclFloat64",
                    dtype.name()
                ),
            ));
        }
        let (scalar, own) = match scalar {
            ScalarArg::Device(address) => (Scalar { address }, None),
            ScalarArg::Host(bytes) => {
                if bytes.len() != dtype.size_bytes() {
                    return Err(Error::argument("scalar", format!("{} bytes for one {}", bytes.len(), dtype.name())));
                }
                let stream = geforce_p2p::Stream::new(&self.device).map_err(geforce_p2p::Error::from)?;
                let own = DeviceBuffer::from_host(&stream, &bytes).map_err(geforce_p2p::Error::from)?;
                // Creation is not on any caller's stream: the copy must be there before a
                // call on another stream reads it.
                stream.synchronize().map_err(geforce_p2p::Error::from)?;
                (Scalar { address: own.raw_ptr() }, Some(own))
            }
        };
        let mut ops = self.ops.lock();
        let slot = ops.iter().position(Option::is_none).unwrap_or(ops.len());
        let op = PreMul { dtype, scalar, _own: own };
        if slot == ops.len() {
            ops.push(Some(op));
        } else {
            ops[slot] = Some(op);
        }
        Ok(NUM_BUILTIN_OPS + c_int::try_from(slot).map_err(|_| Error::argument("op", "too many ops"))?)
    }

    /// `ncclRedOpDestroy`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an op this communicator did not make (or already
    /// destroyed), or a built-in one.
    pub fn destroy_op(&self, raw: c_int) -> Result<()> {
        let mut ops = self.ops.lock();
        let slot = self.op_slot(raw)?;
        match ops.get_mut(slot) {
            Some(op @ Some(_)) => {
                *op = None;
                Ok(())
            }
            _ => Err(Error::argument(
                "op",
                format!("{raw} was not made by ncclRedOpCreatePreMulSum on this communicator"),
            )),
        }
    }

    fn op_slot(&self, raw: c_int) -> Result<usize> {
        usize::try_from(raw - NUM_BUILTIN_OPS).map_err(|_| {
            Error::argument(
                "op",
                format!("{raw} is a built-in op; only ops made by ncclRedOpCreatePreMulSum are destroyed"),
            )
        })
    }

    /// The op a raw `ncclRedOp_t` names for a call of `dtype`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a value that is neither built in nor made here for
    /// `dtype`.
    pub fn op(&self, raw: c_int, dtype: DataType) -> Result<Op> {
        if let Some(op) = builtin_op(raw) {
            return Ok(Op::Builtin(op));
        }
        let slot = self.op_slot(raw).map_err(|_| Error::argument("op", format!("{raw} is not an ncclRedOp_t")))?;
        match self.ops.lock().get(slot) {
            Some(Some(op)) if op.dtype == dtype => Ok(Op::PreMulSum(op.scalar)),
            Some(Some(op)) => Err(Error::argument(
                "op",
                format!("{raw} was made for {}, this call is of {}", op.dtype.name(), dtype.name()),
            )),
            _ => Err(Error::argument(
                "op",
                format!("{raw} was not made by ncclRedOpCreatePreMulSum on this communicator"),
            )),
        }
    }

    /// `ncclCommAbort`: every wait of this communicator's calls, on every rank, gives up, and
    /// later calls are refused.
    pub fn abort(&self) {
        self.aborted.store(true, Ordering::Release);
        self.comm.lock().abort();
    }

    /// `ncclCommSplit`: every rank of this communicator gives its `color` and `key` (on the
    /// host); the ranks of each colour other than `NCCL_SPLIT_NOCOLOR` form a new served
    /// communicator, ranked by key, then by rank here. `None` for `NCCL_SPLIT_NOCOLOR`.
    ///
    /// # Errors
    /// A rank that does not take part in time; the new communicator's join.
    pub fn split(&self, color: c_int, key: c_int) -> Result<Option<Served>> {
        let words = [i64::from(color) as u64, i64::from(key) as u64, 0, 0, 0, 0];
        let lib = |e: geforce_p2p::comm::Error| Error::Library(e.into());
        let (all, parent) = {
            let mut comm = self.comm.lock();
            (comm.exchange_host(words).map_err(lib)?, *comm.id())
        };
        let made = self.derived.fetch_add(1, Ordering::AcqRel) + 1;
        if color == crate::abi::SPLIT_NOCOLOR {
            return Ok(None);
        }
        let colour_of = |w: &[u64; 6]| w[0] as i64;
        let mut members: Vec<(i64, usize)> = all
            .iter()
            .enumerate()
            .filter(|(_, w)| colour_of(w) == i64::from(color))
            .map(|(rank, w)| (w[1] as i64, rank))
            .collect();
        members.sort_unstable();
        let rank = members.iter().position(|&(_, r)| r == self.rank).unwrap_or(0);
        let id = parent.derive(format!("split {made} colour {color}").as_bytes());
        self.child(&id, rank, members.len()).map(Some)
    }

    /// `ncclCommShrink`: the ranks not in `excluded` form a new served communicator, in their
    /// order here (every one of them calls it with the same list; no exchange). With `abort`,
    /// this communicator's own calls are aborted first (`NCCL_SHRINK_ABORT`).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] where this rank is excluded or a rank is out of range; the
    /// new communicator's join.
    pub fn shrink(&self, excluded: &[usize], abort: bool) -> Result<Served> {
        if let Some(&bad) = excluded.iter().find(|&&r| r >= self.world) {
            return Err(Error::argument("excludeRanksList", format!("rank {bad} is not below nranks {}", self.world)));
        }
        if excluded.contains(&self.rank) {
            return Err(Error::argument(
                "excludeRanksList",
                format!("holds this rank, {}: excluded ranks do not call it", self.rank),
            ));
        }
        if abort {
            self.abort();
        }
        let members: Vec<usize> = (0..self.world).filter(|r| !excluded.contains(r)).collect();
        let rank = members.iter().position(|&r| r == self.rank).unwrap_or(0);
        let made = self.derived.fetch_add(1, Ordering::AcqRel) + 1;
        let id = self.comm.lock().id().derive(format!("shrink {made}").as_bytes());
        self.child(&id, rank, members.len())
    }

    /// Join the communicator `id` made from this one, as `rank` of `world`, on this device.
    fn child(&self, id: &geforce_p2p::comm::UniqueId, rank: usize, world: usize) -> Result<Served> {
        let options = geforce_p2p::comm::CommOptions {
            join_timeout: crate::env::timeout()?,
            peer_timeout: crate::env::peer_timeout()?,
            ..geforce_p2p::comm::CommOptions::for_world(world)
        };
        let comm = Communicator::new(id, rank, world, &self.device, options).map_err(|e| Error::Library(e.into()))?;
        Ok(Served::new(comm))
    }

    /// `ncclCommGetAsyncError`: what a kernel of an earlier call met (a peer that timed out
    /// or broke the communicator), or a rank whose process has exited, without waiting for
    /// anything. A rank gone aborts the communicator here, so every wait for it ends now.
    pub fn async_error(&self) -> Option<Error> {
        let mut comm = self.comm.lock();
        let error = comm.async_error()?;
        if matches!(error, geforce_p2p::comm::Error::PeerGone { .. }) {
            self.aborted.store(true, Ordering::Release);
            comm.abort();
        }
        Some(Error::Library(error.into()))
    }

    /// Check `calls`, then enqueue them in order (each on its own stream).
    ///
    /// # Errors
    /// The first bad argument, before anything is enqueued; else the first failure to
    /// enqueue, after which the communicator is broken on every rank.
    pub fn run(&self, calls: &[(Call, RawStream)]) -> Result<()> {
        if self.aborted.load(Ordering::Acquire) {
            return Err(Error::Usage { what: String::from("this communicator was aborted (ncclCommAbort)") });
        }
        for (call, _) in calls {
            call.check(self.rank, self.world)?;
        }
        let mut comm = self.comm.lock();
        for &(call, stream) in calls {
            let steps = call.steps(self.rank, self.world);
            if steps.is_empty() {
                continue;
            }
            let caller = Caller::open(&self.device, stream)?;
            let mut scratch = Scratch::default();
            let ran = steps.iter().try_for_each(|step| self.step(&mut comm, &caller, &mut scratch, *step));
            scratch.release(&caller)?;
            ran?;
        }
        Ok(())
    }

    /// Enqueue one step.
    fn step(&self, comm: &mut Communicator, caller: &Caller, scratch: &mut Scratch, step: Step) -> Result<()> {
        let lib = |e: geforce_p2p::comm::Error| Error::Library(e.into());
        match step {
            Step::AllReduce { input, output, count, dtype, op } => {
                let bytes = count * dtype.size_bytes();
                let (input, output) =
                    (scratch.address(&self.device, input, bytes)?, scratch.address(&self.device, output, bytes)?);
                by_type!(dtype, all_reduce(comm, caller, input, output, count, op))
            }
            Step::AllGather { input, whole, part } => {
                let (input, whole) = (
                    scratch.address(&self.device, input, part)?,
                    scratch.address(&self.device, whole, part * self.world)?,
                );
                let mut out = caller.view_mut::<u8>(whole, part * self.world);
                if input == whole + (self.rank * part) as u64 {
                    comm.all_gather_in_place(&mut out, &caller.stream).map_err(lib)
                } else {
                    comm.all_gather(&caller.view::<u8>(input, part), &mut out, &caller.stream).map_err(lib)
                }
            }
            Step::ReduceScatter { whole, output, count, dtype, op } => {
                let part = count * dtype.size_bytes();
                let (whole, output) = (
                    scratch.address(&self.device, whole, part * self.world)?,
                    scratch.address(&self.device, output, part)?,
                );
                by_type!(dtype, reduce_scatter(comm, caller, whole, output, count, op))
            }
            Step::Broadcast { buf, bytes, root } => {
                let buf = scratch.address(&self.device, buf, bytes)?;
                comm.broadcast(&mut caller.view_mut::<u8>(buf, bytes), &caller.stream, root).map_err(lib)
            }
            Step::Send { buf, bytes, peer } => {
                let buf = scratch.address(&self.device, buf, bytes)?;
                comm.send(&caller.view::<u8>(buf, bytes), &caller.stream, peer).map_err(lib)
            }
            Step::Recv { buf, bytes, peer } => {
                let buf = scratch.address(&self.device, buf, bytes)?;
                comm.recv(&mut caller.view_mut::<u8>(buf, bytes), &caller.stream, peer).map_err(lib)
            }
            Step::Copy { dst, src, bytes } => {
                let (dst, src) =
                    (scratch.address(&self.device, dst, bytes)?, scratch.address(&self.device, src, bytes)?);
                let copied =
                    caller.view_mut::<u8>(dst, bytes).copy_from(&caller.stream, &caller.view::<u8>(src, bytes));
                copied.map(|_| ()).map_err(|e| Error::Library(e.into()))
            }
            Step::Scale { buf, count, dtype, scalar } => {
                let bytes = count * dtype.size_bytes();
                let buf = scratch.address(&self.device, buf, bytes)?;
                let fill = scratch.fresh(&self.device, bytes)?;
                by_type!(dtype, scale(caller, buf, fill, count, scalar))
            }
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

/// `buf *= scalar`: `fill` (scratch of `count` elements) gets the scalar in its first element
/// and then doubles it by copies within itself, so it holds the scalar everywhere after
/// log2(count) copies, and the reduce kernel multiplies `buf` by it.
fn scale<T: Element>(caller: &Caller, buf: u64, fill: u64, count: usize, scalar: Scalar) -> Result<()> {
    let cuda = |e: geforce_p2p::cuda::Error| Error::Library(e.into());
    caller.view_mut::<T>(fill, 1).copy_from(&caller.stream, &caller.view::<T>(scalar.address, 1)).map_err(cuda)?;
    let mut filled = 1;
    while filled < count {
        let n = filled.min(count - filled);
        let mut tail = caller.view_mut::<T>(fill + (filled * size_of::<T>()) as u64, n);
        tail.copy_from(&caller.stream, &caller.view::<T>(fill, n)).map_err(cuda)?;
        filled += n;
    }
    let mut dst = caller.view_mut::<T>(buf, count);
    geforce_p2p::cuda::reduce(&caller.stream, &mut dst, &caller.view::<T>(fill, count), ReduceOp::Prod, 1).map_err(cuda)
}

/// The scratch buffers of one call's steps, kept until its last step is enqueued and then
/// released in the stream's order (or, for a call captured into a graph, kept for the
/// process's life: the graph may be launched at any time).
#[derive(Default)]
struct Scratch {
    /// By the plan's scratch numbers.
    numbered: Vec<Option<DeviceBuffer<u8>>>,
    /// Unnumbered buffers the executor itself needs (a scale's fill).
    extra: Vec<DeviceBuffer<u8>>,
}

impl Scratch {
    /// The address `buf` stands for; scratch `n` is allocated with `bytes` at first use.
    fn address(&mut self, device: &Device, buf: Buf, bytes: usize) -> Result<u64> {
        match buf {
            Buf::User(address) => Ok(address),
            Buf::Scratch(n) => {
                if self.numbered.len() <= n {
                    self.numbered.resize_with(n + 1, || None);
                }
                let slot = &mut self.numbered[n];
                if slot.as_ref().is_none_or(|b| b.len() < bytes) {
                    *slot = Some(DeviceBuffer::alloc(device, bytes.max(1)).map_err(|e| Error::Library(e.into()))?);
                }
                Ok(slot.as_ref().map_or(0, DeviceBuffer::raw_ptr))
            }
        }
    }

    /// A new buffer of `bytes` for this call only.
    fn fresh(&mut self, device: &Device, bytes: usize) -> Result<u64> {
        let buffer = DeviceBuffer::alloc(device, bytes.max(1)).map_err(|e| Error::Library(e.into()))?;
        let address = buffer.raw_ptr();
        self.extra.push(buffer);
        Ok(address)
    }

    /// Release every buffer after the work enqueued on the caller's stream so far.
    fn release(self, caller: &Caller) -> Result<()> {
        let buffers: Vec<DeviceBuffer<u8>> = self.numbered.into_iter().flatten().chain(self.extra).collect();
        if buffers.is_empty() {
            return Ok(());
        }
        let cuda = |e: geforce_p2p::cuda::Error| Error::Library(e.into());
        // Where the point cannot be had, the buffers are kept for good rather than freed under
        // work that may still use them.
        let point = match caller.stream.is_capturing() {
            Ok(false) => caller.stream.point(),
            Ok(true) => {
                buffers.into_iter().for_each(std::mem::forget);
                return Ok(());
            }
            Err(e) => Err(e),
        };
        match point {
            Ok(point) => {
                for buffer in &buffers {
                    buffer.uses().note(&point);
                }
                Ok(())
            }
            Err(e) => {
                buffers.into_iter().for_each(std::mem::forget);
                Err(cuda(e))
            }
        }
    }
}
