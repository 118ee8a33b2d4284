//! The one lifetime rule of geforce-p2p: GPU-visible memory, and streams with work still
//! queued, are released only after the GPU work that uses them, and dropping them never
//! blocks the thread that drops them.
//!
//! - [`StreamPoint`]: the work enqueued on one stream up to a moment, captured by an event
//!   that is never re-recorded (so what it stands for cannot change under a waiter).
//! - [`LastUses`]: per allocation, the latest point of every stream that touched it. Every
//!   safe operation of the crates notes one after it enqueues work on a buffer.
//! - The reclaimer: a thread that releases dropped allocations (device memory to its pool,
//!   pinned host memory to a cache for reuse) and destroys dropped streams once the points
//!   they carried have completed. A drop only hands its resource over; the driver calls
//!   that may synchronise run there.
#![allow(unsafe_code)]

use std::any::Any;
use std::ffi::c_void;
use std::mem::ManuallyDrop;
use std::ptr::NonNull;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use cudarc::driver::sys::{self, CUdeviceptr, CUstream};
use parking_lot::{Condvar, Mutex, RwLock, RwLockWriteGuard};

use crate::driver::{check, defer_error};
use crate::{Device, Event, EventKind, Result, Stream};

/// Identifies one driver stream for the life of the process; 0 is no stream. Here, not in
/// `stream.rs`, because a point records its stream's id and the stream module builds on this
/// one: this module imports nothing of those that use it.
pub(crate) type StreamId = u64;

/// The work enqueued on one stream up to the moment the point was taken
/// ([`Stream::point`]). Cheap to clone; its event goes back to a per-device pool when the
/// last clone drops, and is never re-recorded before that.
///
/// Thread safety: `Send + Sync`; a point is immutable once taken.
#[derive(Clone)]
pub struct StreamPoint(Arc<Point>);

struct Point {
    event: ManuallyDrop<Event>,
    stream: StreamId,
    /// Order of the points of one stream: a later point covers every earlier one.
    seq: u64,
}

impl StreamPoint {
    /// Record a point on `stream` with an event taken earlier (a [`ReservedPoint`]'s). The
    /// caller holds the stream's lock, so `seq` follows the driver's order of records on it.
    pub(crate) fn record_with(stream: &Stream, seq: u64, event: Event) -> Result<StreamPoint> {
        if let Err(e) = event.record(stream) {
            give_back_event(event);
            return Err(e);
        }
        Ok(StreamPoint(Arc::new(Point { event: ManuallyDrop::new(event), stream: stream.id(), seq })))
    }

    /// Whether the captured work is done, without blocking.
    pub fn is_complete(&self) -> Result<bool> {
        self.0.event.is_complete()
    }

    /// Block the host until the captured work is done.
    pub fn synchronize(&self) -> Result<()> {
        self.0.event.synchronize()
    }

    /// The device of the stream the point was taken on.
    pub fn device(&self) -> &Device {
        self.0.event.device()
    }

    pub(crate) fn event(&self) -> &Event {
        &self.0.event
    }

    pub(crate) fn stream_id(&self) -> StreamId {
        self.0.stream
    }
}

/// An event set aside for a [`StreamPoint`] still to be taken ([`Stream::reserve_point`]):
/// taking the point then makes one driver call, the record, which never waits. Creating an
/// event can wait for the device to go idle on some drivers, so code that must not stall
/// between two launches (the line exchange, whose kernels wait for each other) reserves its
/// points before the first launch. Dropped unused, the event goes back to the pool.
pub struct ReservedPoint {
    event: ManuallyDrop<Event>,
}

impl ReservedPoint {
    pub(crate) fn new(device: &Device) -> Result<ReservedPoint> {
        Ok(ReservedPoint { event: ManuallyDrop::new(take_pooled_event(device)?) })
    }

    /// The event, for the record.
    pub(crate) fn into_event(self) -> Event {
        let mut reserved = ManuallyDrop::new(self);
        // SAFETY: `reserved` is never dropped, so its event is taken exactly once, here.
        unsafe { ManuallyDrop::take(&mut reserved.event) }
    }
}

impl Drop for ReservedPoint {
    fn drop(&mut self) {
        // SAFETY: dropped once; `into_event` (the only other taker) never lets it drop.
        give_back_event(unsafe { ManuallyDrop::take(&mut self.event) });
    }
}

impl std::fmt::Debug for ReservedPoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReservedPoint")
    }
}

impl std::fmt::Debug for StreamPoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StreamPoint(stream {} #{} on device {})", self.0.stream, self.0.seq, self.device().ordinal())
    }
}

impl Drop for Point {
    fn drop(&mut self) {
        // SAFETY: taken once, here; the field is never used again.
        give_back_event(unsafe { ManuallyDrop::take(&mut self.event) });
    }
}

/// Spare events per device: points are taken at every operation, and creating an event
/// costs a driver call; more than this many idle ones are destroyed instead of kept.
const MAX_POOLED_EVENTS: usize = 4096;

fn take_pooled_event(device: &Device) -> Result<Event> {
    // The pool's lock is let go before a new event is created: the driver call can wait
    // behind another thread's allocation, and no other thread should wait on the pool for it.
    let spare = device.spare_events().lock().pop();
    match spare {
        Some(event) => Ok(event),
        None => Event::new(device, EventKind::Sync),
    }
}

pub(crate) fn give_back_event(event: Event) {
    let device = event.device().clone();
    let mut pool = device.spare_events().lock();
    if pool.len() < MAX_POOLED_EVENTS {
        pool.push(event);
    }
}

/// What a view reports its uses to (see `DeviceView::note_use`): the [`LastUses`] of an
/// allocation this crate owns, or whatever orders foreign memory's owner after the work
/// (the cudarc wrappers make cudarc's stream wait at once).
pub(crate) trait UseSink: Sync {
    /// Work up to `point` uses the memory.
    fn note(&self, point: &StreamPoint);
}

impl UseSink for LastUses {
    fn note(&self, point: &StreamPoint) {
        LastUses::note(self, point);
    }
}

/// Where GPU work last touched one allocation: the latest [`StreamPoint`] of each stream
/// that did. The allocation may be released once all of them are complete.
///
/// Thread safety: `Send + Sync`; noting and taking are serialised by a lock held for a few
/// instructions.
#[derive(Default)]
pub struct LastUses {
    points: Mutex<Vec<StreamPoint>>,
}

/// Points of distinct streams kept before completed ones are pruned (streams borrowed per
/// call, as from a framework, would otherwise grow the list without bound).
const PRUNE_AT: usize = 8;

impl LastUses {
    /// An empty record: nothing uses the allocation yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Record that work up to `point` used the allocation. A point of a stream already
    /// present replaces the older one of that stream (it covers it).
    pub fn note(&self, point: &StreamPoint) {
        let mut points = self.points.lock();
        if let Some(known) = points.iter_mut().find(|p| p.stream_id() == point.stream_id()) {
            if known.0.seq < point.0.seq {
                *known = point.clone();
            }
            return;
        }
        if points.len() >= PRUNE_AT {
            points.retain(|p| !p.is_complete().unwrap_or(false));
        }
        points.push(point.clone());
    }

    /// How many streams' latest uses are recorded (completed ones are pruned only once
    /// there are several).
    pub fn stream_count(&self) -> usize {
        self.points.lock().len()
    }

    /// Make `stream` wait, on the GPU, for every recorded use (other than its own, which its
    /// order already puts first): what reusing the allocation on another stream needs.
    pub fn wait_on(&self, stream: &Stream) -> Result<()> {
        let points = self.points.lock().clone();
        for p in &points {
            stream.wait_point(p)?;
        }
        Ok(())
    }

    /// Block the host until every recorded use is done, and forget them. On an error the
    /// record is left as it was: a use not known to be done must still hold the release.
    pub fn synchronize(&self) -> Result<()> {
        let waited = self.points.lock().clone();
        for p in &waited {
            p.synchronize()?;
        }
        // Points noted meanwhile by other threads are newer: only those waited on go.
        self.points.lock().retain(|p| !waited.iter().any(|w| w.stream_id() == p.stream_id() && w.0.seq >= p.0.seq));
        Ok(())
    }

    /// Whether every recorded use is done (non-blocking).
    pub fn is_idle(&self) -> Result<bool> {
        let points = self.points.lock();
        for p in points.iter() {
            if !p.is_complete()? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The points, for the release of the allocation.
    pub(crate) fn take(&self) -> Vec<StreamPoint> {
        std::mem::take(&mut *self.points.lock())
    }
}

/// What the reclaimer releases once a resource's points are complete.
pub(crate) enum Release {
    /// Device memory back to its pool (`cuMemFreeAsync`), or `cuMemFree` without one.
    DeviceMemory { device: Device, ptr: CUdeviceptr },
    /// Pinned host memory (a block of `block` bytes) back to the cache for reuse: no
    /// driver call. `give_back` is the cache's own keeping (`host_cache::put`), handed in by
    /// the allocation, so this module needs nothing of the cache (which itself uses
    /// [`not_paused`]); a function pointer, so a drop allocates nothing for it.
    HostMemory { ptr: NonNull<u8>, block: usize, give_back: fn(usize, NonNull<u8>) },
    /// `cuStreamDestroy` of an owned stream.
    Stream { device: Device, raw: CUstream },
    /// `cuMemHostUnregister` of registered host memory, then the drop of the mapping's owner
    /// (which may unmap it: only once the driver has let go of the pages). The owner is the
    /// registration's `MappingOwner`, spelt out so this module does not import the one that
    /// uses it.
    HostRegistration { device: Device, ptr: *mut c_void, owner: Option<Arc<dyn Any + Send + Sync>> },
}

// SAFETY: the raw handles are owned by the release and used once, by one thread; the driver
// API may be called from any thread.
unsafe impl Send for Release {}

impl Release {
    fn run(self) {
        let result = match self {
            // SAFETY: owned allocation from the device's alloc_memory, freed once, after all
            // recorded GPU use.
            Release::DeviceMemory { device, ptr } => unsafe { device.free_memory(ptr) },
            Release::HostMemory { ptr, block, give_back } => {
                give_back(block, ptr);
                Ok(())
            }
            Release::Stream { device, raw } => device.bind().and_then(|()| {
                // SAFETY: owned stream, destroyed once, after the work enqueued on it.
                check(unsafe { sys::cuStreamDestroy_v2(raw) }, "cuStreamDestroy")
            }),
            Release::HostRegistration { device, ptr, owner } => {
                let result = device.bind().and_then(|()| {
                    // SAFETY: registered once by its owner, unregistered once, after all recorded
                    // GPU use; the mapping is still held by `owner`.
                    check(unsafe { sys::cuMemHostUnregister(ptr) }, "cuMemHostUnregister")
                });
                match result {
                    Ok(()) => drop(owner),
                    // Still registered: the mapping is leaked rather than unmapped under the driver.
                    Err(_) => std::mem::forget(owner),
                }
                result
            }
        };
        defer_error(result);
    }
}

/// A released resource waiting for its points.
struct Grave {
    /// Its place among every grave queued (the first is 1).
    number: u64,
    points: Vec<StreamPoint>,
    release: Release,
}

struct Queue {
    graves: Vec<Grave>,
    /// Graves queued since the process started.
    queued: u64,
    /// The numbers of the graves the reclaimer thread has taken and not yet released (or
    /// leaked), kept by that thread, so a drop's push never grows it.
    in_hand: Vec<u64>,
    /// Whether the reclaimer thread runs (it could not start: nothing is ever released).
    reclaiming: bool,
}

/// Graves the queue and the reclaimer's lists hold without growing: a drop's push then finds
/// room, since growing touches fresh pages, and a page fault waits on the process's
/// memory-map lock, which the driver holds while it pins host memory (a first run's drop took
/// 1.2 ms so, on a machine just started).
const GRAVES_RESERVED: usize = 256;

struct Reclaimer {
    queue: Mutex<Queue>,
    /// Wakes the reclaimer thread (new graves).
    wake: Condvar,
    /// Wakes [`flush_releases`] and [`wait_for_releases_since`] callers (graves settled).
    emptied: Condvar,
}

/// How long the reclaimer sleeps between polls while graves wait: short at first (a small
/// op completes in microseconds), longer while the GPU stays busy.
const POLL_MIN: Duration = Duration::from_micros(50);
const POLL_MAX: Duration = Duration::from_millis(2);

fn reclaimer() -> &'static Reclaimer {
    static RECLAIMER: OnceLock<&'static Reclaimer> = OnceLock::new();
    RECLAIMER.get_or_init(|| {
        let r: &'static Reclaimer = Box::leak(Box::new(Reclaimer {
            queue: Mutex::new(Queue {
                graves: Vec::with_capacity(GRAVES_RESERVED),
                queued: 0,
                in_hand: Vec::with_capacity(GRAVES_RESERVED),
                reclaiming: false,
            }),
            wake: Condvar::new(),
            emptied: Condvar::new(),
        }));
        let spawned = std::thread::Builder::new().name("gp2p-reclaimer".into()).spawn(move || reclaim_forever(r));
        r.queue.lock().reclaiming = spawned.is_ok();
        if spawned.is_err() {
            // Without the thread nothing would ever be released: leak instead (the memory
            // stays mapped, which is safe), and say so at the next synchronisation.
            defer_error(Err(crate::Error::InvalidArgument {
                name: "reclaimer",
                reason: "could not start the reclaimer thread; dropped GPU memory is leaked".into(),
            }));
        }
        r
    })
}

/// Start the reclaimer thread now (opening a device does), so that no drop ever waits for
/// the thread to be spawned.
pub(crate) fn start_reclaimer() {
    reclaimer();
}

/// Held (shared) by the reclaimer around each release's driver call, and exclusively by
/// [`pause_releases`]'s guard.
static RELEASING: RwLock<()> = RwLock::new(());

/// While the guard lives, the reclaimer makes no driver call. Taking the guard waits for the
/// release in hand, if any, to finish (a free may itself wait for its device to go idle).
///
/// For enqueueing kernels that wait for each other across devices (the line exchange). A
/// free (`cuMemFree` without a pool, `cuMemHostUnregister`) may wait for its device to go
/// idle while holding a lock of the driver that a launch on another device of the process
/// also needs: if the first rank's kernel is already waiting for the second's, the free
/// waits for a kernel that waits for a launch that waits for the free, until the kernel's
/// timeout. With the guard held across both launches no release falls between them. Hold it
/// only that long: drops go on queueing meanwhile (they never block), and nothing is
/// released.
pub fn pause_releases() -> ReleasesPaused {
    ReleasesPaused { _guard: RELEASING.write() }
}

/// Held by a driver call that frees outside the reclaimer (the host cache's release), so it
/// does not fall between launches made under [`pause_releases`] either.
pub(crate) fn not_paused() -> parking_lot::RwLockReadGuard<'static, ()> {
    RELEASING.read()
}

/// The guard of [`pause_releases`]: releases resume when it drops.
#[must_use = "releases resume as soon as the guard is dropped"]
pub struct ReleasesPaused {
    _guard: RwLockWriteGuard<'static, ()>,
}

impl std::fmt::Debug for ReleasesPaused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReleasesPaused")
    }
}

/// Release `release` once every point in `points` is complete, on the reclaimer thread.
/// Never blocks: a drop calls this and returns.
pub(crate) fn release_after(points: Vec<StreamPoint>, release: Release) {
    let r = reclaimer();
    {
        let mut queue = r.queue.lock();
        queue.queued += 1;
        let number = queue.queued;
        queue.graves.push(Grave { number, points, release });
    }
    r.wake.notify_one();
}

/// How many releases have been handed to the reclaimer so far: a mark for
/// [`wait_for_releases_since`].
pub fn releases_queued() -> u64 {
    reclaimer().queue.lock().queued
}

/// Block until every release handed over after `mark` ([`releases_queued`]) and before this
/// call has run, waiting for the GPU work each waits for; releases handed over before `mark`
/// or after this call are not waited for, but those other threads hand over in between are.
/// For an owner that must know its own resources are gone before it returns (NCCL's
/// `ncclCommDestroy`, after which a program may reset the device), without waiting for other
/// owners' work as [`flush_releases`] does. Returns at once where the reclaimer thread could
/// not start (nothing is released then).
pub fn wait_for_releases_since(mark: u64) {
    let r = reclaimer();
    let mut queue = r.queue.lock();
    let end = queue.queued;
    let since = |n: u64| n > mark && n <= end;
    while queue.reclaiming && (queue.graves.iter().any(|g| since(g.number)) || queue.in_hand.iter().any(|&n| since(n)))
    {
        r.wake.notify_one();
        r.emptied.wait(&mut queue);
    }
}

/// Run a driver allocation; if it fails for lack of memory, wait until what was dropped has
/// been released (waiting for its GPU work) and try once more. The out-of-memory path is the
/// one place an allocation may block on other work.
pub(crate) fn retry_after_releases(mut allocate: impl FnMut() -> sys::CUresult) -> sys::CUresult {
    match allocate() {
        sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
            flush_releases();
            allocate()
        }
        code => code,
    }
}

/// Block until everything handed to the reclaimer so far has been released (waiting for the
/// GPU work it waits for). For the out-of-memory path of allocations, which retry once after
/// this, and for tests.
pub fn flush_releases() {
    wait_for_releases_since(0);
}

fn reclaim_forever(r: &'static Reclaimer) {
    // Relaxed capture mode: this thread's event queries and frees are neither refused nor
    // breaking while another thread of the process captures a CUDA graph in the default,
    // global mode (torch's). It only releases what finished uncaptured work last used.
    if crate::driver::is_driver_present() {
        let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: in/out pointer to a local; the driver is loaded (checked above). A failure
        // leaves the thread's mode as it was (global).
        let _ = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) };
    }
    let mut waiting: Vec<Grave> = Vec::with_capacity(GRAVES_RESERVED);
    let mut arrived: Vec<Grave> = Vec::with_capacity(GRAVES_RESERVED);
    let mut settled_numbers: Vec<u64> = Vec::with_capacity(GRAVES_RESERVED);
    let mut poll = POLL_MIN;
    loop {
        {
            let mut queue = r.queue.lock();
            if waiting.is_empty() && queue.graves.is_empty() {
                r.wake.wait(&mut queue);
            } else if queue.graves.is_empty() {
                r.wake.wait_for(&mut queue, poll);
            }
            // Swapped with an emptied vector that keeps its capacity, so a drop's push rarely
            // allocates (an allocation can wait on the process's memory-map lock, which the
            // driver holds while it pins host memory).
            std::mem::swap(&mut queue.graves, &mut arrived);
            queue.in_hand.extend(arrived.iter().map(|grave| grave.number));
        }
        // Outside the lock: `waiting` may grow, and a drop must not wait for that.
        waiting.append(&mut arrived);
        let mut settled = Vec::new();
        let mut i = 0;
        while i < waiting.len() {
            match waiting[i].readiness() {
                Readiness::Pending => i += 1,
                readiness => settled.push((readiness, waiting.swap_remove(i))),
            }
        }
        settled_numbers.clear();
        settled_numbers.extend(settled.iter().map(|(_, grave)| grave.number));
        // Release outside the lock: a free may synchronise with the device.
        for (readiness, grave) in settled {
            // Broken: the context failed, so the work may never be known to be done; the
            // resource is leaked rather than released under it.
            if readiness == Readiness::Ready {
                let _not_paused = RELEASING.read();
                grave.release.run();
            } else {
                // Forgotten, not dropped: a release may own the mapping of registered memory,
                // whose drop would unmap pages the driver and the GPU may still use.
                std::mem::forget(grave);
            }
        }
        poll = if settled_numbers.is_empty() { (poll * 2).min(POLL_MAX) } else { POLL_MIN };
        if !settled_numbers.is_empty() {
            let mut queue = r.queue.lock();
            settled_numbers.sort_unstable();
            queue.in_hand.retain(|n| settled_numbers.binary_search(n).is_err());
            r.emptied.notify_all();
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Readiness {
    Ready,
    Pending,
    Broken,
}

impl Grave {
    fn readiness(&self) -> Readiness {
        for point in &self.points {
            match point.is_complete() {
                Ok(true) => {}
                Ok(false) => return Readiness::Pending,
                Err(e) => {
                    defer_error(Err(e));
                    return Readiness::Broken;
                }
            }
        }
        Readiness::Ready
    }
}

#[cfg(test)]
mod tests;
