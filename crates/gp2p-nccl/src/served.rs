//! A communicator the door serves: one rank of a `gp2p_comm::Communicator`, its
//! pre-multiplying ops, what other threads may do to it without waiting (abort, the host
//! exchange of a split), and the runner that enqueues a call's steps ([`crate::plan`]) on the
//! caller's stream (`served/steps.rs`, with the scratch its calls share in
//! `served/scratch.rs`). Nothing here blocks the host on another rank but a split, which is
//! NCCL's blocking collective on the host too.

use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use geforce_p2p::Device;
use geforce_p2p::comm::{Communicator, Control};
use parking_lot::Mutex;

use crate::abi::{DataType, NUM_BUILTIN_OPS, RawStream, builtin_op};
use crate::error::{Error, Result};
use crate::memory::{Caller, allow_graphs};
use crate::plan::{Call, Op, Scalar};

mod scratch;
mod steps;

use scratch::Scratch;

/// A pre-multiplying op made by `ncclRedOpCreatePreMulSum`.
struct PreMul {
    /// The type it was made for.
    dtype: DataType,
    /// Its scalar: a value, or a device address read as each call runs.
    scalar: Scalar,
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
    /// Abort and the host exchange, for any thread without `comm`'s lock.
    control: Control,
    /// Scratch the calls share (taken after `comm`'s lock, never before it).
    scratch: Mutex<Scratch>,
    /// Ops made by `ncclRedOpCreatePreMulSum`, by raw value minus `ncclNumOps`; `None` once
    /// destroyed.
    ops: Mutex<Vec<Option<PreMul>>>,
    /// Set by `ncclCommAbort`: later calls are refused.
    aborted: AtomicBool,
    /// Whether an asynchronous error was said already (torch's watchdog asks again and again).
    reported: AtomicBool,
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
            control: comm.control(),
            comm: Mutex::new(comm),
            scratch: Mutex::new(Scratch::default()),
            ops: Mutex::new(Vec::new()),
            aborted: AtomicBool::new(false),
            reported: AtomicBool::new(false),
            derived: AtomicU32::new(0),
        }
    }

    /// `ncclRedOpCreatePreMulSum`: a new op that multiplies each rank's input by `scalar` (an
    /// element of `dtype`: its bytes, read from host memory already, or the address of device
    /// memory read as each call runs) and sums. Any type, as NCCL takes any.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a host scalar of the wrong size.
    pub fn create_premul(&self, scalar: ScalarArg, dtype: DataType) -> Result<c_int> {
        let scalar = match scalar {
            ScalarArg::Device(address) => Scalar::Device(address),
            ScalarArg::Host(bytes) => {
                if bytes.len() != dtype.size_bytes() {
                    return Err(Error::argument("scalar", format!("{} bytes for one {}", bytes.len(), dtype.name())));
                }
                let mut bits = [0u8; 8];
                bits[..bytes.len()].copy_from_slice(&bytes);
                Scalar::Value(u64::from_le_bytes(bits))
            }
        };
        let mut ops = self.ops.lock();
        let slot = ops.iter().position(Option::is_none).unwrap_or(ops.len());
        let op = PreMul { dtype, scalar };
        if slot == ops.len() {
            ops.push(Some(op));
        } else {
            ops[slot] = Some(op);
        }
        Ok(NUM_BUILTIN_OPS + c_int::try_from(slot).map_err(|_| Error::argument("op", "too many ops"))?)
    }

    /// `ncclRedOpDestroy`. A call made with the op keeps what it needs (its value is in the
    /// call), so the op may go as soon as the call returns, as NCCL allows.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an op this communicator did not make (or already
    /// destroyed), or a built-in one.
    pub fn destroy_op(&self, raw: c_int) -> Result<()> {
        let mut ops = self.ops.lock();
        let slot = op_slot(raw)?;
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

    /// The op a raw `ncclRedOp_t` names for a call of `dtype`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a value that is neither built in nor made here for
    /// `dtype`.
    pub fn op(&self, raw: c_int, dtype: DataType) -> Result<Op> {
        if let Some(op) = builtin_op(raw) {
            return Ok(Op::Builtin(op));
        }
        let slot = op_slot(raw).map_err(|_| Error::argument("op", format!("{raw} is not an ncclRedOp_t")))?;
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
    /// later calls are refused. Takes no lock, so it ends a split waiting for a late rank too.
    pub fn abort(&self) {
        self.aborted.store(true, Ordering::Release);
        self.control.abort();
    }

    /// `ncclCommSplit`: every rank of this communicator gives its `color` and `key` (on the
    /// host, without this communicator's lock); the ranks of each colour other than
    /// `NCCL_SPLIT_NOCOLOR` form a new served communicator, ranked by key, then by rank here.
    /// `None` for `NCCL_SPLIT_NOCOLOR`.
    ///
    /// # Errors
    /// A rank that does not take part in time; the new communicator's join.
    pub fn split(&self, color: c_int, key: c_int) -> Result<Option<Served>> {
        let words = [i64::from(color) as u64, i64::from(key) as u64, 0, 0, 0, 0];
        let all = self.control.exchange_host(words).map_err(|e| Error::Library(e.into()))?;
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
        let id = self.control.id().derive(format!("split {made} colour {color}").as_bytes());
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
        self.check_shrink(excluded)?;
        if abort {
            self.abort();
        }
        let members: Vec<usize> = (0..self.world).filter(|r| !excluded.contains(r)).collect();
        let rank = members.iter().position(|&r| r == self.rank).unwrap_or(0);
        let made = self.derived.fetch_add(1, Ordering::AcqRel) + 1;
        let id = self.control.id().derive(format!("shrink {made}").as_bytes());
        self.child(&id, rank, members.len())
    }

    /// Refuse an `ncclCommShrink` list [`Served::shrink`] cannot take: a rank out of range, or
    /// this rank (excluded ranks do not call it).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming `excludeRanksList`.
    pub fn check_shrink(&self, excluded: &[usize]) -> Result<()> {
        if let Some(&bad) = excluded.iter().find(|&&r| r >= self.world) {
            return Err(Error::argument("excludeRanksList", format!("rank {bad} is not below nranks {}", self.world)));
        }
        if excluded.contains(&self.rank) {
            return Err(Error::argument(
                "excludeRanksList",
                format!("holds this rank, {}: excluded ranks do not call it", self.rank),
            ));
        }
        Ok(())
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
    /// or broke the communicator), or a rank whose process exited while this rank's calls wait
    /// for it, without waiting for anything; and whether it is said for the first time. A rank
    /// gone aborts the communicator here, so every wait for it ends now.
    ///
    /// Until an error has been said, a call that holds the communicator (one enqueueing,
    /// which at 256 MiB among 8 ranks takes milliseconds) makes this answer "none yet" at once
    /// rather than wait for it: a framework's watchdog asks several times a call (torch's:
    /// 4-8, `GP2P_NCCL_TRACE`), and must not stall behind the caller's thread. What the call
    /// meets, it reports itself; anything else is seen at the next ask.
    pub fn async_error(&self) -> Option<(Error, bool)> {
        let comm = if self.reported.load(Ordering::Acquire) { self.comm.lock() } else { self.comm.try_lock()? };
        let error = comm.async_error()?;
        drop(comm);
        if matches!(error, geforce_p2p::comm::Error::PeerGone { .. }) {
            self.abort();
        }
        let first = !self.reported.swap(true, Ordering::AcqRel);
        Some((Error::Library(error.into()), first))
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
        let mut scratch = self.scratch.lock();
        for &(call, stream) in calls {
            let steps = call.steps(self.rank, self.world);
            if steps.is_empty() {
                continue;
            }
            let caller = Caller::open(&self.device, stream)?;
            steps::run(&mut comm, &caller, &mut scratch, &steps)?;
        }
        Ok(())
    }
}

/// A created op's index in the table.
fn op_slot(raw: c_int) -> Result<usize> {
    usize::try_from(raw - NUM_BUILTIN_OPS).map_err(|_| {
        Error::argument(
            "op",
            format!("{raw} is a built-in op; only ops made by ncclRedOpCreatePreMulSum are destroyed"),
        )
    })
}
