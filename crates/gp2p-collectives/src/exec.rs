//! Executing a schedule on GPUs: each rank sends on one internal stream and receives on
//! another (so its link carries both directions), every ring edge has a staging ring, and
//! events carry the chunk-level dependencies — a rank forwards a chunk as soon as that
//! chunk has arrived, not when the whole step is done.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::Arc;

use gp2p_cuda::{Device, DeviceBuffer, DeviceViewMut, Event, EventKind, Stream, StreamFork};
use gp2p_kernels::{Element, ReduceOp};
use gp2p_pinned::{Fold, StagingRing};
use gp2p_transport::plan::{Chunking, DEFAULT_SLOTS};
use parking_lot::Mutex;

use crate::calibrate::{Path, choose};
use crate::schedule::{Action, Schedule};
use crate::{Error, Result, Transport, step_divisor};

/// Staging slots per ring edge: the transport's default.
const SLOTS: usize = DEFAULT_SLOTS;
/// Index of the send and the receive stream in a rank's fork.
const SEND: usize = 0;
const RECV: usize = 1;

/// One rank of a collective: its buffer and the stream the collective is ordered on.
pub struct Rank<'a, T: Element> {
    /// The rank's buffer (input and output of in-place collectives).
    pub buffer: DeviceViewMut<'a, T>,
    /// The caller's stream on the buffer's device: the collective starts after work already
    /// enqueued there, and work enqueued later sees its result.
    pub stream: &'a Stream,
}

/// What a group of ranks (an ordered list of devices) keeps between calls.
struct Group {
    forks: Vec<StreamFork>,
    rings: Vec<Option<StagingRing>>,
    /// Per rank, per use (scratch, work) and element type: a device buffer, reused while
    /// big enough.
    buffers: Vec<BufferCache>,
    /// Rings and buffers replaced while GPU work may still use them.
    retired: Vec<Retired>,
    events: Vec<Vec<Event>>,
    /// Per rank: recorded after the last use of the work buffer, on the caller's stream.
    work_done: Vec<Option<Event>>,
}

/// The collective engine: per group of devices, internal streams, staging rings, scratch
/// buffers and events, created on first use and reused. `Send + Sync`; calls on one group
/// are serialised.
#[derive(Default)]
pub struct Engine {
    groups: Mutex<HashMap<Vec<usize>, Arc<Mutex<Group>>>>,
    paths: Mutex<HashMap<usize, Path>>,
    chunk_bytes: Option<usize>,
}

impl Engine {
    /// An engine with nothing cached yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// An engine whose schedules cut buffers into chunks of `chunk_bytes` (rounded to whole,
    /// 16-byte aligned elements) instead of sizing them by the buffer: for tuning and
    /// benchmarks. Zero is refused.
    pub fn with_chunk_bytes(chunk_bytes: usize) -> Result<Self> {
        Chunking::check_overrides(Some(chunk_bytes), None)?;
        Ok(Engine { chunk_bytes: Some(chunk_bytes), ..Self::default() })
    }

    /// The chunk size given to [`Engine::with_chunk_bytes`], if any.
    pub fn chunk_bytes(&self) -> Option<usize> {
        self.chunk_bytes
    }

    /// Run `schedule` over `ranks` (in place), reducing with `op`.
    pub(crate) fn execute<T: Element>(
        &self,
        ranks: &mut [Rank<'_, T>],
        schedule: &Schedule,
        op: ReduceOp,
        transport: Transport,
    ) -> Result<()> {
        let n = ranks.len();
        if schedule.transfers.is_empty() {
            return Ok(());
        }
        let devices: Vec<Device> = ranks.iter().map(|r| r.buffer.device().clone()).collect();
        // Copy-only collectives (all_gather, broadcast) need no receive path.
        let reduces = schedule.transfers.iter().any(|t| matches!(t.action, Action::Reduce { .. }));
        let paths = if reduces {
            devices.iter().map(|d| self.path(d, transport)).collect::<Result<Vec<Path>>>()?
        } else {
            vec![Path::ZeroCopy; n]
        };
        let group = self.group(&devices)?;
        let mut group = group.lock();
        let chunk = schedule.transfers.iter().map(|t| t.range.len()).max().unwrap_or(1);
        let Group { forks, rings, buffers, events, retired, .. } = &mut *group;
        retired.retain(|r| !r.is_idle());
        for (r, ring) in rings.iter_mut().enumerate() {
            let fits = ring.as_ref().is_some_and(|g| g.slot_bytes() >= chunk * size_of::<T>());
            if !fits {
                // The old ring retires until its GPU work is done: replacing never blocks.
                retired.extend(ring.take().map(Retired::Ring));
                *ring = Some(StagingRing::new(&devices[r], &devices[(r + 1) % n], SLOTS, chunk * size_of::<T>())?);
            }
        }
        // Events only where a later transfer waits on them: allocate them before the loop.
        let marks = Marks::of(schedule);
        let mut needed = vec![0; n];
        for (t, mark) in schedule.transfers.iter().zip(&marks.0) {
            needed[t.from] += usize::from(mark.sent);
            needed[t.to] += usize::from(mark.received);
        }
        for (r, pool) in events.iter_mut().enumerate() {
            while pool.len() < needed[r] {
                pool.push(Event::new(&devices[r], EventKind::Sync)?);
            }
        }
        let mut scratch: Vec<Option<DeviceBuffer<T>>> = Vec::with_capacity(n);
        for (r, cache) in buffers.iter_mut().enumerate() {
            let recv = &forks[r].streams()[RECV];
            scratch.push(if paths[r] == Path::Scratch {
                Some(take_buffer(cache, retired, "scratch", &devices[r], chunk, recv)?)
            } else {
                None
            });
        }

        for (r, rank) in ranks.iter().enumerate() {
            forks[r].fork(rank.stream)?;
        }
        let result = run_transfers(ranks, schedule, &marks, op, forks, rings, events, &mut scratch);
        // Join and keep the scratch buffers even after a failure: the callers' later work
        // (freeing their buffers, say) must still wait for what was enqueued.
        let mut joined = Ok(());
        for (r, rank) in ranks.iter().enumerate() {
            joined = joined.and(forks[r].join(rank.stream));
        }
        for (cache, buf) in buffers.iter_mut().zip(scratch) {
            if let Some(buf) = buf {
                cache.insert(("scratch", TypeId::of::<T>()), Box::new(buf));
            }
        }
        result?;
        Ok(joined?)
    }

    /// A typed work buffer of at least `len` elements for rank `r` of the group of
    /// `devices`, kept between calls, made safe to overwrite on `stream`: the stream waits
    /// for the last use recorded by [`Engine::put_work`]. Give it back with `put_work`.
    pub(crate) fn take_work<T: Element>(
        &self,
        devices: &[Device],
        r: usize,
        len: usize,
        stream: &Stream,
    ) -> Result<DeviceBuffer<T>> {
        let group = self.group(devices)?;
        let mut group = group.lock();
        if let Some(done) = group.work_done[r].as_ref() {
            stream.wait(done)?;
        }
        let Group { buffers, retired, .. } = &mut *group;
        retired.retain(|r| !r.is_idle());
        take_buffer(&mut buffers[r], retired, "work", &devices[r], len, stream)
    }

    /// Return a work buffer taken with [`Engine::take_work`], whose last use was enqueued on
    /// `stream`.
    pub(crate) fn put_work<T: Element>(
        &self,
        devices: &[Device],
        r: usize,
        buffer: DeviceBuffer<T>,
        stream: &Stream,
    ) -> Result<()> {
        let group = self.group(devices)?;
        let mut group = group.lock();
        let done = match group.work_done[r].take() {
            Some(e) => e,
            None => Event::new(&devices[r], EventKind::Sync)?,
        };
        done.record(stream)?;
        group.work_done[r] = Some(done);
        // A concurrent call may have put one back meanwhile: that one retires, not frees.
        if let Some(old) = group.buffers[r].insert(("work", TypeId::of::<T>()), Box::new(buffer)) {
            let old_done = Event::new(&devices[r], EventKind::Sync)?;
            old_done.record(stream)?;
            group.retired.push(Retired::Buffer { _held: old, done: old_done });
        }
        Ok(())
    }

    fn group(&self, devices: &[Device]) -> Result<Arc<Mutex<Group>>> {
        let key: Vec<usize> = devices.iter().map(Device::ordinal).collect();
        let mut groups = self.groups.lock();
        if let Some(g) = groups.get(&key) {
            return Ok(g.clone());
        }
        let group = Group {
            forks: devices.iter().map(|d| StreamFork::new(d, 2)).collect::<Result<Vec<_>, _>>()?,
            rings: devices.iter().map(|_| None).collect(),
            buffers: devices.iter().map(|_| HashMap::new()).collect(),
            events: devices.iter().map(|_| Vec::new()).collect(),
            work_done: devices.iter().map(|_| None).collect(),
            retired: Vec::new(),
        };
        let group = Arc::new(Mutex::new(group));
        groups.insert(key, group.clone());
        Ok(group)
    }

    /// The receive path of `device`: as asked, or for Auto the faster one measured on it
    /// (once per device and process).
    fn path(&self, device: &Device, transport: Transport) -> Result<Path> {
        match transport {
            Transport::Scratch => Ok(Path::Scratch),
            Transport::ZeroCopy => Ok(Path::ZeroCopy),
            Transport::Auto => {
                // Calibrate under the lock: a concurrent first call waits for the result
                // instead of timing its own run beside this one (each would skew the other).
                let mut paths = self.paths.lock();
                if let Some(&p) = paths.get(&device.ordinal()) {
                    return Ok(p);
                }
                let p = choose(device)?;
                paths.insert(device.ordinal(), p);
                Ok(p)
            }
        }
    }
}

/// Which transfers' ends a later transfer waits for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Mark {
    /// A later receive into the same range of the sender must wait until this send read it.
    sent: bool,
    /// A later send of the same range by the receiver must wait until this receive wrote it.
    received: bool,
}

/// A [`Mark`] per transfer of a schedule. Recording an event costs the host a driver call,
/// and most transfers are never waited on (in a two-rank all-reduce, half of the ends), so
/// only the marked ones are recorded.
struct Marks(Vec<Mark>);

impl Marks {
    fn of(schedule: &Schedule) -> Marks {
        let n = schedule.ranks;
        let mut marks = vec![Mark::default(); schedule.transfers.len()];
        // Per rank, by range start: the transfer that last received into / sent from it.
        let mut received: Vec<HashMap<usize, usize>> = vec![HashMap::new(); n];
        let mut sent: Vec<HashMap<usize, usize>> = vec![HashMap::new(); n];
        for (i, t) in schedule.transfers.iter().enumerate() {
            if let Some(&j) = received[t.from].get(&t.range.start) {
                marks[j].received = true;
            }
            if let Some(&j) = sent[t.to].get(&t.range.start) {
                marks[j].sent = true;
            }
            sent[t.from].insert(t.range.start, i);
            received[t.to].insert(t.range.start, i);
        }
        Marks(marks)
    }
}

/// Enqueue every transfer of `schedule` on the forked streams.
#[allow(clippy::too_many_arguments)]
fn run_transfers<T: Element>(
    ranks: &mut [Rank<'_, T>],
    schedule: &Schedule,
    marks: &Marks,
    op: ReduceOp,
    forks: &[StreamFork],
    rings: &mut [Option<StagingRing>],
    events: &[Vec<Event>],
    scratch: &mut [Option<DeviceBuffer<T>>],
) -> Result<()> {
    let n = ranks.len();
    let mut used = vec![0usize; n];
    // Per rank, by range start: the event after the last receive into the range (a send of
    // it must wait) and after the last send from it (a receive into it must wait).
    let mut received: Vec<HashMap<usize, usize>> = vec![HashMap::new(); n];
    let mut sent: Vec<HashMap<usize, usize>> = vec![HashMap::new(); n];
    for (t, mark) in schedule.transfers.iter().zip(&marks.0) {
        let (from, to, range) = (t.from, t.to, t.range.clone());
        let send = &forks[from].streams()[SEND];
        let recv = &forks[to].streams()[RECV];
        if let Some(&e) = received[from].get(&range.start) {
            send.wait(&events[from][e])?;
        }
        if let Some(&e) = sent[to].get(&range.start) {
            recv.wait(&events[to][e])?;
        }
        let ring = rings[from].as_mut().ok_or(Error::NoRanks)?;
        let (src_rank, dst_rank) = pair_mut(ranks, from, to);
        let whole = src_rank.buffer.as_view();
        let src = whole.slice(range.clone());
        let mut dst = dst_rank.buffer.slice_mut(range.clone());
        let fold = match t.action {
            Action::Copy => Fold::Copy,
            Action::Reduce { last } => {
                let divide_by = step_divisor(op, last, n);
                match &mut scratch[to] {
                    None => Fold::ReduceMapped { op, divide_by },
                    Some(buf) => Fold::ReduceVia { scratch: buf.view_mut(..), op, divide_by },
                }
            }
        };
        ring.pass(send, &src, recv, &mut dst, fold)?;
        if mark.sent {
            events[from][used[from]].record(send)?;
            sent[from].insert(range.start, used[from]);
            used[from] += 1;
        }
        if mark.received {
            events[to][used[to]].record(recv)?;
            received[to].insert(range.start, used[to]);
            used[to] += 1;
        }
    }
    Ok(())
}

/// Something replaced while GPU work may still use it, kept until that work is done.
enum Retired {
    /// A staging ring (its events tell when it is idle).
    Ring(StagingRing),
    /// A device buffer (held only to be freed later), with an event after its last use.
    Buffer { _held: Box<dyn Any + Send>, done: Event },
}

impl Retired {
    fn is_idle(&self) -> bool {
        match self {
            Retired::Ring(r) => r.is_idle(),
            Retired::Buffer { done, .. } => done.is_complete().unwrap_or(false),
        }
    }
}

/// Cached buffers, by use and element type.
type BufferCache = HashMap<(&'static str, TypeId), Box<dyn Any + Send>>;

/// A cached typed buffer of at least `len` elements, or a new one; a cached one that is too
/// small retires until the work enqueued on `last_user` so far is done.
fn take_buffer<T: Element>(
    cache: &mut BufferCache,
    retired: &mut Vec<Retired>,
    key: &'static str,
    device: &Device,
    len: usize,
    last_user: &Stream,
) -> Result<DeviceBuffer<T>> {
    if let Some(boxed) = cache.remove(&(key, TypeId::of::<T>())) {
        let big_enough = boxed.downcast_ref::<DeviceBuffer<T>>().is_some_and(|b| b.len() >= len);
        let boxed = match boxed.downcast::<DeviceBuffer<T>>() {
            Ok(buf) if big_enough => return Ok(*buf),
            Ok(buf) => buf as Box<dyn Any + Send>,
            Err(other) => other,
        };
        let done = Event::new(device, EventKind::Sync)?;
        done.record(last_user)?;
        retired.push(Retired::Buffer { _held: boxed, done });
    }
    Ok(DeviceBuffer::alloc(device, len.max(1))?)
}

/// `(&v[a], &mut v[b])` for a != b.
fn pair_mut<T>(v: &mut [T], a: usize, b: usize) -> (&T, &mut T) {
    if a < b {
        let (left, right) = v.split_at_mut(b);
        (&left[a], &mut right[0])
    } else {
        let (left, right) = v.split_at_mut(a);
        (&right[0], &mut left[b])
    }
}

#[cfg(test)]
mod tests {
    use super::{Engine, Mark, Marks, pair_mut};
    use crate::schedule::Schedule;

    #[test]
    fn a_zero_chunk_override_is_refused_by_the_transport_check() {
        let err = Engine::with_chunk_bytes(0).err().expect("zero refused");
        assert!(err.to_string().contains("chunk_bytes"), "{err}");
        assert_eq!(Engine::with_chunk_bytes(4096).map(|e| e.chunk_bytes()).ok(), Some(Some(4096)));
    }

    #[test]
    fn only_ends_that_are_waited_on_are_marked() {
        // Two ranks, one chunk per segment: rank r sends segment A (reduce-scatter), receives
        // and reduces B, sends the reduced B (all-gather) and receives the final A.
        let marks = Marks::of(&Schedule::all_reduce(2, 8, 4)).0;
        assert_eq!(marks.len(), 4);
        let waited = |m: &Mark| m.sent || m.received;
        assert!(marks[..2].iter().all(|m| m.sent && m.received), "reduce-scatter ends are all waited on");
        assert!(!marks[2..].iter().any(waited), "nothing waits on the all-gather's ends");
        // A broadcast chain only forwards what arrived: receives marked, sends not.
        let chain = Marks::of(&Schedule::broadcast(3, 8, 8, 0)).0;
        assert_eq!(chain, [Mark { sent: false, received: true }, Mark::default()]);
    }

    #[test]
    fn pair_mut_gives_both_orders() {
        let mut v = [1, 2, 3];
        let (a, b) = pair_mut(&mut v, 0, 2);
        *b += *a;
        let (a, b) = pair_mut(&mut v, 2, 1);
        *b += *a;
        assert_eq!(v, [1, 6, 4]);
    }
}
