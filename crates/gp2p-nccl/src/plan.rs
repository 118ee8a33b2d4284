//! A served call as plain data: what NCCL was asked ([`Call`]), checked against the
//! communicator ([`Call::check`]), and the steps one rank runs for it ([`Call::steps`]):
//! the communicator's own collectives, point-to-point legs and local copies. A group's calls
//! are put in the order every rank agrees on ([`order_group`]) before any is enqueued. No GPU
//! here: `crate::served` runs the steps.

use geforce_p2p::ReduceOp;

use crate::abi::DataType;
use crate::error::{Error, Result};

/// A device address, as NCCL passes buffers.
pub type Address = u64;

/// A buffer a step reads or writes: the caller's memory, or scratch the communicator's calls
/// share (numbered; a call's steps are enqueued before the next call's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Buf {
    /// Caller memory at this address.
    User(Address),
    /// Scratch buffer `buffer`, `offset` bytes in.
    Scratch {
        /// Which buffer.
        buffer: usize,
        /// Bytes into it.
        offset: usize,
    },
}

impl Buf {
    /// Scratch buffer `buffer` from its start.
    pub const fn scratch(buffer: usize) -> Buf {
        Buf::Scratch { buffer, offset: 0 }
    }

    /// This buffer `offset` bytes in.
    pub fn at(self, offset: usize) -> Buf {
        match self {
            Buf::User(a) => Buf::User(a + offset as u64),
            Buf::Scratch { buffer, offset: start } => Buf::Scratch { buffer, offset: start + offset },
        }
    }
}

/// A pre-multiplying op's scalar: a host scalar's value, read when the op was made and set
/// into the call's scratch by a memset (so nothing of the op's needs to outlive it), or the
/// caller's device scalar, read while the call runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scalar {
    /// The element's bits (little-endian, in the low bytes).
    Value(u64),
    /// The device address of one element.
    Device(Address),
}

/// A reduction: one of NCCL's built-in ops, or a `ncclRedOpCreatePreMulSum` op (each rank's
/// input times its scalar, then summed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Sum, prod, max, min or avg.
    Builtin(ReduceOp),
    /// Multiply by the scalar, then sum.
    PreMulSum(Scalar),
}

/// One NCCL call on a served communicator, arguments as given (counts in elements).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    /// `ncclAllReduce`.
    AllReduce { send: Address, recv: Address, count: usize, dtype: DataType, op: Op },
    /// `ncclReduce`.
    Reduce { send: Address, recv: Address, count: usize, dtype: DataType, op: Op, root: usize },
    /// `ncclBroadcast` (and `ncclBcast`, with `send == recv`).
    Broadcast { send: Address, recv: Address, count: usize, dtype: DataType, root: usize },
    /// `ncclAllGather`: `count` elements a rank.
    AllGather { send: Address, recv: Address, count: usize, dtype: DataType },
    /// `ncclReduceScatter`: `count` elements a rank.
    ReduceScatter { send: Address, recv: Address, count: usize, dtype: DataType, op: Op },
    /// `ncclAlltoAll`: `count` elements to each rank.
    AlltoAll { send: Address, recv: Address, count: usize, dtype: DataType },
    /// `ncclGather`.
    Gather { send: Address, recv: Address, count: usize, dtype: DataType, root: usize },
    /// `ncclScatter`.
    Scatter { send: Address, recv: Address, count: usize, dtype: DataType, root: usize },
    /// `ncclSend`.
    Send { send: Address, count: usize, dtype: DataType, peer: usize },
    /// `ncclRecv`.
    Recv { recv: Address, count: usize, dtype: DataType, peer: usize },
    /// A send of a rank to itself met by its receive in one group ([`order_group`]).
    SelfCopy { send: Address, recv: Address, count: usize, dtype: DataType },
}

/// One step a rank enqueues for a call. Lengths in bytes, reductions with their type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The communicator's all-reduce: `output = op(every rank's input)`; in place where the
    /// two are one buffer.
    AllReduce { input: Buf, output: Buf, count: usize, dtype: DataType, op: ReduceOp },
    /// The communicator's all-gather of `part` bytes a rank into `whole`; in place where
    /// `input` is this rank's part of `whole`.
    AllGather { input: Buf, whole: Buf, part: usize },
    /// The communicator's reduce-scatter of `count` elements a rank from `whole` into `output`;
    /// in place where `output` is this rank's part of `whole`.
    ReduceScatter { whole: Buf, output: Buf, count: usize, dtype: DataType, op: ReduceOp },
    /// The communicator's broadcast from `root`, in place.
    Broadcast { buf: Buf, bytes: usize, root: usize },
    /// Send `bytes` to `peer`.
    Send { buf: Buf, bytes: usize, peer: usize },
    /// Receive `bytes` from `peer`.
    Recv { buf: Buf, bytes: usize, peer: usize },
    /// A copy on this rank's device.
    Copy { dst: Buf, src: Buf, bytes: usize },
    /// `buf *= scalar`, `count` elements.
    Scale { buf: Buf, count: usize, dtype: DataType, scalar: Scalar },
}

/// The bytes of `count` elements of `dtype`, or an error naming `argument`.
fn bytes_of(argument: &'static str, count: usize, dtype: DataType) -> Result<usize> {
    count.checked_mul(dtype.size_bytes()).filter(|&b| b <= isize::MAX as usize).ok_or_else(|| {
        Error::argument(argument, format!("{count} elements of {} overflow the address space", dtype.name()))
    })
}

impl Call {
    /// What NCCL calls it, for messages.
    pub fn name(&self) -> &'static str {
        match self {
            Call::AllReduce { .. } => "ncclAllReduce",
            Call::Reduce { .. } => "ncclReduce",
            Call::Broadcast { .. } => "ncclBroadcast",
            Call::AllGather { .. } => "ncclAllGather",
            Call::ReduceScatter { .. } => "ncclReduceScatter",
            Call::AlltoAll { .. } => "ncclAlltoAll",
            Call::Gather { .. } => "ncclGather",
            Call::Scatter { .. } => "ncclScatter",
            Call::Send { .. } => "ncclSend",
            Call::Recv { .. } => "ncclRecv",
            Call::SelfCopy { .. } => "ncclSend to the sending rank itself",
        }
    }

    /// Whether it is a point-to-point call (ordered by its leg in a group).
    pub fn is_point_to_point(&self) -> bool {
        matches!(self, Call::Send { .. } | Call::Recv { .. })
    }

    /// Refuse what NCCL refuses, and what the door does not serve, before anything runs.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the argument (a root or peer out of range, a null
    /// buffer, a count whose bytes overflow, buffers that overlap where they must not).
    pub fn check(&self, rank: usize, world: usize) -> Result<()> {
        let rank_in = |argument: &'static str, r: usize| {
            if r < world { Ok(()) } else { Err(Error::argument(argument, format!("{r} is not below nranks {world}"))) }
        };
        let (count, dtype) = self.count_and_type();
        let bytes = bytes_of("count", count, dtype)?;
        let world_bytes = bytes_of("count", count.saturating_mul(world), dtype)?;
        match *self {
            Call::Reduce { root, .. }
            | Call::Broadcast { root, .. }
            | Call::Gather { root, .. }
            | Call::Scatter { root, .. } => rank_in("root", root)?,
            Call::Send { peer, .. } | Call::Recv { peer, .. } => rank_in("peer", peer)?,
            _ => {}
        }
        if bytes == 0 {
            return Ok(());
        }
        let is_root = |root: usize| root == rank;
        let (send_bytes, recv_bytes) = match *self {
            Call::AllReduce { .. } => (bytes, bytes),
            Call::Reduce { root, .. } => (bytes, if is_root(root) { bytes } else { 0 }),
            Call::Broadcast { root, .. } => (if is_root(root) { bytes } else { 0 }, bytes),
            Call::AllGather { .. } => (bytes, world_bytes),
            Call::ReduceScatter { .. } => (world_bytes, bytes),
            Call::AlltoAll { .. } => (world_bytes, world_bytes),
            Call::Gather { root, .. } => (bytes, if is_root(root) { world_bytes } else { 0 }),
            Call::Scatter { root, .. } => (if is_root(root) { world_bytes } else { 0 }, bytes),
            Call::SelfCopy { .. } => (bytes, bytes),
            Call::Send { .. } => (bytes, 0),
            Call::Recv { .. } => (0, bytes),
        };
        let (send, recv) = self.buffers();
        if send_bytes > 0 && send == 0 {
            return Err(Error::argument("sendbuff", format!("null, for {send_bytes} bytes to send")));
        }
        if recv_bytes > 0 && recv == 0 {
            return Err(Error::argument("recvbuff", format!("null, for {recv_bytes} bytes to receive")));
        }
        if send_bytes == 0 || recv_bytes == 0 || self.in_place(rank, bytes) {
            return Ok(());
        }
        let overlap = send < recv + recv_bytes as u64 && recv < send + send_bytes as u64;
        if overlap {
            return Err(Error::argument(
                "recvbuff",
                format!(
                    "[{recv:#x}, +{recv_bytes}) overlaps sendbuff [{send:#x}, +{send_bytes}) without being {}'s in-place form",
                    self.name()
                ),
            ));
        }
        Ok(())
    }

    /// Whether the buffers are this call's in-place form (for rank `rank`, `bytes` a rank).
    fn in_place(&self, rank: usize, bytes: usize) -> bool {
        let (send, recv) = self.buffers();
        let part = |r: usize| (r * bytes) as u64;
        match *self {
            Call::AllReduce { .. } | Call::Reduce { .. } | Call::Broadcast { .. } | Call::SelfCopy { .. } => {
                send == recv
            }
            Call::AllGather { .. } => send == recv + part(rank),
            Call::ReduceScatter { .. } => recv == send + part(rank),
            Call::Gather { root, .. } => rank == root && send == recv + part(root),
            Call::Scatter { root, .. } => rank == root && recv == send + part(root),
            Call::AlltoAll { .. } => send == recv,
            Call::Send { .. } | Call::Recv { .. } => false,
        }
    }

    fn count_and_type(&self) -> (usize, DataType) {
        match *self {
            Call::AllReduce { count, dtype, .. }
            | Call::Reduce { count, dtype, .. }
            | Call::Broadcast { count, dtype, .. }
            | Call::AllGather { count, dtype, .. }
            | Call::ReduceScatter { count, dtype, .. }
            | Call::AlltoAll { count, dtype, .. }
            | Call::Gather { count, dtype, .. }
            | Call::Scatter { count, dtype, .. }
            | Call::Send { count, dtype, .. }
            | Call::Recv { count, dtype, .. }
            | Call::SelfCopy { count, dtype, .. } => (count, dtype),
        }
    }

    /// (send, recv) addresses, 0 where the call has none.
    fn buffers(&self) -> (Address, Address) {
        match *self {
            Call::AllReduce { send, recv, .. }
            | Call::Reduce { send, recv, .. }
            | Call::Broadcast { send, recv, .. }
            | Call::AllGather { send, recv, .. }
            | Call::ReduceScatter { send, recv, .. }
            | Call::AlltoAll { send, recv, .. }
            | Call::Gather { send, recv, .. }
            | Call::Scatter { send, recv, .. }
            | Call::SelfCopy { send, recv, .. } => (send, recv),
            Call::Send { send, .. } => (send, 0),
            Call::Recv { recv, .. } => (0, recv),
        }
    }

    /// The steps rank `rank` of `world` runs for this call (checked with [`Call::check`]).
    /// Reduce runs as an all-reduce (non-roots into scratch), the pre-multiplying ops scale a
    /// copy, and all-to-all, gather and scatter run as legs in the order every rank agrees on
    /// (sender, then receiver).
    pub fn steps(&self, rank: usize, world: usize) -> Vec<Step> {
        let (count, dtype) = self.count_and_type();
        let bytes = count * dtype.size_bytes();
        if bytes == 0 {
            return Vec::new();
        }
        let mut steps = Vec::new();
        match *self {
            Call::AllReduce { send, recv, op, .. } => {
                all_reduce(&mut steps, Buf::User(send), Buf::User(recv), count, dtype, op);
            }
            Call::Reduce { send, recv, op, root, .. } => {
                let output = if rank == root { Buf::User(recv) } else { Buf::scratch(0) };
                all_reduce(&mut steps, Buf::User(send), output, count, dtype, op);
            }
            Call::Broadcast { send, recv, root, .. } => {
                if rank == root && send != recv {
                    steps.push(Step::Copy { dst: Buf::User(recv), src: Buf::User(send), bytes });
                }
                steps.push(Step::Broadcast { buf: Buf::User(recv), bytes, root });
            }
            Call::AllGather { send, recv, .. } => {
                steps.push(Step::AllGather { input: Buf::User(send), whole: Buf::User(recv), part: bytes });
            }
            Call::ReduceScatter { send, recv, op, .. } => match op {
                Op::Builtin(op) => {
                    steps.push(Step::ReduceScatter {
                        whole: Buf::User(send),
                        output: Buf::User(recv),
                        count,
                        dtype,
                        op,
                    });
                }
                Op::PreMulSum(scalar) => {
                    let whole = Buf::scratch(0);
                    steps.push(Step::Copy { dst: whole, src: Buf::User(send), bytes: bytes * world });
                    steps.push(Step::Scale { buf: whole, count: count * world, dtype, scalar });
                    let output = Buf::User(recv);
                    steps.push(Step::ReduceScatter { whole, output, count, dtype, op: ReduceOp::Sum });
                }
            },
            Call::AlltoAll { send, recv, .. } => {
                let (mut send, recv) = (Buf::User(send), Buf::User(recv));
                if send == recv {
                    // In place: a part received lands where a part still to be sent lies, so
                    // the parts to send are read from a copy (this rank's own part stays).
                    let copy = Buf::scratch(0);
                    steps.push(Step::Copy { dst: copy, src: send, bytes: bytes * world });
                    send = copy;
                } else {
                    steps.push(Step::Copy { dst: recv.at(rank * bytes), src: send.at(rank * bytes), bytes });
                }
                for from in 0..world {
                    for to in (0..world).filter(|&to| to != from) {
                        if from == rank {
                            steps.push(Step::Send { buf: send.at(to * bytes), bytes, peer: to });
                        } else if to == rank {
                            steps.push(Step::Recv { buf: recv.at(from * bytes), bytes, peer: from });
                        }
                    }
                }
            }
            Call::Gather { send, recv, root, .. } => {
                if rank == root {
                    let recv = Buf::User(recv);
                    if recv.at(root * bytes) != Buf::User(send) {
                        steps.push(Step::Copy { dst: recv.at(root * bytes), src: Buf::User(send), bytes });
                    }
                    for from in (0..world).filter(|&r| r != root) {
                        steps.push(Step::Recv { buf: recv.at(from * bytes), bytes, peer: from });
                    }
                } else {
                    steps.push(Step::Send { buf: Buf::User(send), bytes, peer: root });
                }
            }
            Call::Scatter { send, recv, root, .. } => {
                if rank == root {
                    let send = Buf::User(send);
                    if send.at(root * bytes) != Buf::User(recv) {
                        steps.push(Step::Copy { dst: Buf::User(recv), src: send.at(root * bytes), bytes });
                    }
                    for to in (0..world).filter(|&r| r != root) {
                        steps.push(Step::Send { buf: send.at(to * bytes), bytes, peer: to });
                    }
                } else {
                    steps.push(Step::Recv { buf: Buf::User(recv), bytes, peer: root });
                }
            }
            Call::Send { send, peer, .. } => steps.push(Step::Send { buf: Buf::User(send), bytes, peer }),
            Call::Recv { recv, peer, .. } => steps.push(Step::Recv { buf: Buf::User(recv), bytes, peer }),
            Call::SelfCopy { send, recv, .. } => {
                if send != recv {
                    steps.push(Step::Copy { dst: Buf::User(recv), src: Buf::User(send), bytes });
                }
            }
        }
        steps
    }
}

/// An all-reduce's steps: the communicator's own for a built-in op; for a pre-multiplying
/// one, the input copied to the output, scaled there, and summed in place.
fn all_reduce(steps: &mut Vec<Step>, input: Buf, output: Buf, count: usize, dtype: DataType, op: Op) {
    match op {
        Op::Builtin(op) => steps.push(Step::AllReduce { input, output, count, dtype, op }),
        Op::PreMulSum(scalar) => {
            let bytes = count * dtype.size_bytes();
            if input != output {
                steps.push(Step::Copy { dst: output, src: input, bytes });
            }
            steps.push(Step::Scale { buf: output, count, dtype, scalar });
            steps.push(Step::AllReduce { input: output, output, count, dtype, op: ReduceOp::Sum });
        }
    }
}

/// A group's calls for one rank, each with the caller's stream, in the order they run:
/// collectives as called (every rank makes the same ones in the same order), then the
/// point-to-point calls by their leg (sender, then receiver; calls of one leg as called), so
/// every pair of ranks meets its sends and receives in the same order whatever order each
/// made them in. A send to this rank itself meets its receive as one local copy.
///
/// # Errors
/// [`Error::Usage`] where a send to this rank itself has no receive of the same size in the
/// group, or the other way round.
pub fn order_group<S: Copy>(calls: &[(Call, S)], rank: usize) -> Result<Vec<(Call, S)>> {
    let (p2p, mut ordered): (Vec<_>, Vec<_>) = calls.iter().copied().partition(|(c, _)| c.is_point_to_point());
    let leg = |c: &Call| match *c {
        Call::Send { peer, .. } => (rank, peer),
        Call::Recv { peer, .. } => (peer, rank),
        _ => (rank, rank),
    };
    let (to_self, mut p2p): (Vec<_>, Vec<_>) = p2p.into_iter().partition(|(c, _)| leg(c) == (rank, rank));
    p2p.sort_by_key(|(c, _)| leg(c));
    ordered.extend(p2p);
    let sends = to_self.iter().filter(|(c, _)| matches!(c, Call::Send { .. }));
    let recvs: Vec<&(Call, S)> = to_self.iter().filter(|(c, _)| matches!(c, Call::Recv { .. })).collect();
    if sends.clone().count() != recvs.len() {
        return Err(Error::Usage {
            what: format!(
                "{} send(s) and {} receive(s) of rank {rank} with itself in one group: each send to itself needs its receive in the group",
                sends.count(),
                recvs.len()
            ),
        });
    }
    for (&(send, stream), &&(recv, _)) in sends.zip(&recvs) {
        let (Call::Send { send, count, dtype, .. }, Call::Recv { recv, count: recv_count, dtype: recv_dtype, .. }) =
            (send, recv)
        else {
            continue;
        };
        if (count * dtype.size_bytes()) != (recv_count * recv_dtype.size_bytes()) {
            return Err(Error::Usage {
                what: format!(
                    "rank {rank} sends itself {count} {} but receives {recv_count} {}",
                    dtype.name(),
                    recv_dtype.name()
                ),
            });
        }
        ordered.push((Call::SelfCopy { send, recv, count, dtype }, stream));
    }
    Ok(ordered)
}

#[cfg(test)]
mod tests;
