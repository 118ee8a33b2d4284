//! The shared staging segment: one POSIX shared-memory object per communicator, mapped by
//! every rank, with a header of atomics that lets the ranks find each other.
//!
//! Layout of the segment (offsets are what crosses processes, never pointers):
//!
//! | offset | bytes | what |
//! | --- | --- | --- |
//! | 0 | 64 | [`Header`]: magic, layout version, world size, staging size, creator pid, joined count |
//! | 64 + 64 × rank | 64 | [`RankSlot`] of `rank`: the pid that joined as it (0 while nobody has), and its words of the host exchange |
//! | [`staging_offset`]`(world)` | staging bytes | the staging area, [`STAGING_ALIGN`]-aligned |

#![allow(unsafe_code)]

use std::ffi::c_void;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicI32, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rustix::fs::Mode;
use rustix::io::Errno;
use rustix::mm::{MapFlags, ProtFlags};
use rustix::process::Pid;
use rustix::shm;

use crate::error::{Error, Result};
use crate::id::{NAME_PREFIX, SHM_DIR, UniqueId};

mod exchange;
mod liveness;

pub(crate) use liveness::pid_namespace;

pub use exchange::WORDS as HOST_WORDS;

/// The largest world size a segment is made for.
pub const MAX_WORLD: usize = 1024;
/// How long [`Segment::join`] waits for the other ranks where the caller has no better figure.
pub const DEFAULT_JOIN_TIMEOUT: Duration = Duration::from_secs(30);
/// Alignment of the staging area inside the segment: a multiple of every Linux page size
/// (4, 16 and 64 KiB), so the staging area alone can be registered with the driver.
pub const STAGING_ALIGN: usize = 64 * 1024;

/// Longer timeouts are cut to this, so a deadline never overflows (a year: "forever").
pub(crate) const LONGEST_TIMEOUT: Duration = Duration::from_secs(365 * 24 * 60 * 60);
/// `b"gp2pcomm"`: a header the creator has finished setting up.
const SEGMENT_MAGIC: u64 = u64::from_le_bytes(*b"gp2pcomm");
/// Version of the segment layout above and of what the communicator keeps in it; raised
/// whenever either changes. 2: the one-kernel areas hold lines, then flagged chunks, and
/// ranks publish the one-kernel size (not the lines' half) for each other to compare, so a
/// build of version 1 must not join. 3: each rank's slot holds the host exchange's words.
const LAYOUT_VERSION: u32 = 3;
/// One cache line: the header and each rank's slot have one of their own, so no two writers
/// share a line.
const LINE: usize = 64;
/// Permissions of a segment: its owner only.
const SEGMENT_MODE: u32 = 0o600;
/// First pause while polling the header; pauses double up to [`POLL_MAX`].
const POLL_FIRST: Duration = Duration::from_micros(20);
/// Longest pause while polling the header.
const POLL_MAX: Duration = Duration::from_millis(1);

/// Poll `ready` on the host until it gives `Some` (returned) or `deadline` passes (`None`),
/// sleeping between polls for a pause that starts at [`POLL_FIRST`] and doubles up to
/// [`POLL_MAX`]; an error from `ready` ends the wait. Every wait for other processes in this
/// crate, all before a communicator exists, goes through here.
pub(crate) fn poll_until<T>(deadline: Instant, mut ready: impl FnMut() -> Result<Option<T>>) -> Result<Option<T>> {
    let mut pause = POLL_FIRST;
    loop {
        if let Some(value) = ready()? {
            return Ok(Some(value));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(POLL_MAX);
    }
}

/// The start of every segment. Atomics only: other processes write it while this one reads.
#[repr(C, align(64))]
struct Header {
    /// [`SEGMENT_MAGIC`] once the creator has set up the fields below (stored last, release).
    magic: AtomicU64,
    /// [`LAYOUT_VERSION`] of the creator.
    version: AtomicU32,
    /// The world size the segment was created for.
    world: AtomicU32,
    /// Bytes of the staging area.
    staging_bytes: AtomicU64,
    /// The process that created the segment.
    creator_pid: AtomicI32,
    /// How many ranks have joined.
    joined: AtomicU32,
}

/// One rank's line after the header.
#[repr(C, align(64))]
struct RankSlot {
    /// The process that joined as this rank, 0 while none has.
    pid: AtomicI32,
    /// The host exchange's round whose words this rank has published (0: none yet).
    round: AtomicU32,
    /// The last round of the host exchange this rank has finished reading.
    read: AtomicU32,
    /// The low 32 bits of the inode of that process's pid namespace (0: unknown): its pid
    /// means something to another rank only where theirs is the same.
    pid_namespace: AtomicU32,
    /// This rank's words of the host exchange's current round.
    words: [AtomicU64; exchange::WORDS],
}

const _: () = assert!(size_of::<Header>() == LINE && align_of::<Header>() == LINE);
const _: () = assert!(size_of::<RankSlot>() == LINE && align_of::<RankSlot>() == LINE);

/// Offset of the staging area in a segment made for `world` ranks (`world` ≤ [`MAX_WORLD`]).
pub const fn staging_offset(world: usize) -> usize {
    (LINE + LINE * world).div_ceil(STAGING_ALIGN) * STAGING_ALIGN
}

/// A `MAP_SHARED` mapping of a whole segment, unmapped on drop.
struct Mapping {
    ptr: NonNull<c_void>,
    len: usize,
}

// SAFETY: the mapping is plain shared memory owned by this value; it is not tied to the thread
// that made it, and every access through `&Mapping` is by atomics.
unsafe impl Send for Mapping {}
// SAFETY: as above: shared references only hand out atomics, which are safe to use from many
// threads (and processes) at once.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `fd` read-write and shared.
    fn new(fd: BorrowedFd<'_>, len: usize, name: &str) -> Result<Self> {
        // SAFETY: a null hint lets the kernel pick an unused range, so no existing memory is
        // replaced; the result is only used through `Mapping`, which unmaps it once.
        let ptr = unsafe {
            rustix::mm::mmap(std::ptr::null_mut(), len, ProtFlags::READ | ProtFlags::WRITE, MapFlags::SHARED, fd, 0)
        }
        .map_err(|e| os(name, "mmap", e))?;
        let ptr = NonNull::new(ptr).ok_or_else(|| os(name, "mmap", Errno::INVAL))?;
        Ok(Self { ptr, len })
    }

    /// The header at offset 0.
    fn header(&self) -> &Header {
        // SAFETY: every mapping is at least `LINE` bytes (checked before mapping) and
        // page-aligned, so it holds an aligned `Header`; `Header` is atomics only, valid for any
        // bytes (a fresh segment is zeros), and other processes touch it only through atomics.
        unsafe { self.ptr.cast::<Header>().as_ref() }
    }

    /// The slots of ranks `0..world`, or `None` if the mapping is too short for them.
    fn slots(&self, world: usize) -> Option<&[RankSlot]> {
        if world > MAX_WORLD || LINE + LINE * world > self.len {
            return None;
        }
        // SAFETY: the slots lie at `LINE..LINE + LINE * world`, inside the mapping (checked
        // above) and `LINE`-aligned; `RankSlot` is atomics only, valid for any bytes, shared
        // through atomics only; the slice lives no longer than `&self`, and so the mapping.
        Some(unsafe { std::slice::from_raw_parts(self.ptr.cast::<u8>().add(LINE).cast::<RankSlot>().as_ptr(), world) })
    }
}

impl Drop for Segment {
    /// A communicator that ends leaves its slot empty, so the ranks left do not take its
    /// process's exit for a failure ([`Segment::gone_ranks`]).
    fn drop(&mut self) {
        if let Ok(slots) = self.slots()
            && let Some(slot) = slots.get(self.rank)
        {
            slot.pid.store(0, Ordering::Release);
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr` and `len` are those mmap returned, unmapped only here; every reference
        // into the mapping borrows `self`, so none outlives it.
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr(), self.len) };
    }
}

/// A communicator's shared staging memory, mapped into this process: the foundation the
/// multi-process communicator is built on.
///
/// Every rank calls [`Segment::join`] with the same [`UniqueId`], world size and staging
/// size and its own rank. The first to arrive creates the POSIX shared-memory object
/// `/gp2p-<token>` (`O_CREAT | O_EXCL`, mode 0600); the others open it. `join` returns once
/// every rank has mapped it, and the last rank to join unlinks the name, so nothing is left
/// in `/dev/shm` even if a process later crashes. The creator also removes segments that
/// crashed runs left behind: those whose creator and every joined process are dead.
///
/// Thread safety: `Segment` is `Send` and `Sync`; everything shared lives in atomics. The
/// staging area's pointer differs in every process: exchange offsets into it, never pointers.
pub struct Segment {
    map: Mapping,
    id: UniqueId,
    name: String,
    rank: usize,
    world: usize,
    staging_bytes: usize,
}

impl std::fmt::Debug for Segment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Segment")
            .field("name", &self.name)
            .field("rank", &self.rank)
            .field("world", &self.world)
            .field("staging_bytes", &self.staging_bytes)
            .finish_non_exhaustive()
    }
}

impl Segment {
    /// Joins the communicator `id` as `rank` of `world`, with `staging_bytes` of staging
    /// memory, and waits (on the host, polling, at most `timeout`) until all `world` ranks
    /// have joined.
    ///
    /// # Errors
    /// - [`Error::World`], [`Error::Rank`], [`Error::StagingTooLarge`]: bad arguments, found
    ///   before anything is created.
    /// - [`Error::OtherHost`], [`Error::OtherSharedMemory`], [`Error::NoSharedMemory`]: this
    ///   process cannot see the shared memory of the rank that made `id`.
    /// - [`Error::WorldMismatch`], [`Error::BytesMismatch`]: the segment was created by a rank
    ///   that passed other sizes.
    /// - [`Error::RankTaken`]: a live process already joined as `rank`.
    /// - [`Error::PeersMissing`]: some ranks did not join within `timeout` (a rank whose
    ///   process died counts as missing); the segment's name is then unlinked, so nothing is
    ///   left behind and nobody joins a communicator that failed.
    /// - [`Error::CreatorStalled`], [`Error::Foreign`], [`Error::Os`]: the segment could not
    ///   be set up or is not one of this version.
    pub fn join(id: &UniqueId, rank: usize, world: usize, staging_bytes: usize, timeout: Duration) -> Result<Self> {
        if world == 0 || world > MAX_WORLD {
            return Err(Error::World { world, max: MAX_WORLD });
        }
        if rank >= world {
            return Err(Error::Rank { rank, world });
        }
        let offset = staging_offset(world);
        let total = offset
            .checked_add(staging_bytes)
            .filter(|&t| isize::try_from(t).is_ok())
            .ok_or(Error::StagingTooLarge { bytes: staging_bytes, header: offset })?;
        id.check_same_shm()?;
        let name = id.segment_name();
        let start = Instant::now();
        let deadline = start + timeout.min(LONGEST_TIMEOUT);
        let pid = rustix::process::getpid().as_raw_nonzero().get();
        let want = Want { world, staging_bytes, total };
        // A creator that fails to set the segment up unlinks it there; after that, the segment
        // is good for the other ranks even if this one is refused (a duplicate rank), and a
        // timeout unlinks it in `give_up`.
        let map = open_or_create(&name, want, pid, start, deadline)?;
        let segment = Self { map, id: *id, name, rank, world, staging_bytes };
        segment.enter(pid, start, deadline)?;
        Ok(segment)
    }

    /// Claims this rank's slot, counts this rank in, and waits for the others.
    fn enter(&self, pid: i32, start: Instant, deadline: Instant) -> Result<()> {
        let header = self.map.header();
        let slots = self.slots()?;
        let slot = slots.get(self.rank).ok_or(Error::Rank { rank: self.rank, world: self.world })?;
        match slot.pid.compare_exchange(0, pid, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => {
                slot.pid_namespace.store(liveness::pid_namespace(), Ordering::Release);
                let before = header.joined.fetch_add(1, Ordering::AcqRel);
                if before as usize + 1 == self.world {
                    // Every rank has mapped the segment: the name is no longer needed.
                    unlink(&self.name);
                    return Ok(());
                }
            }
            Err(holder) if is_alive(holder) => return Err(Error::RankTaken { rank: self.rank, pid: holder }),
            // A process that joined as this rank has died: take its place; it was counted.
            Err(holder) => {
                if let Err(now) = slot.pid.compare_exchange(holder, pid, Ordering::AcqRel, Ordering::Acquire) {
                    return Err(Error::RankTaken { rank: self.rank, pid: now });
                }
                slot.pid_namespace.store(liveness::pid_namespace(), Ordering::Release);
            }
        }
        let all_in =
            poll_until(deadline, || Ok((header.joined.load(Ordering::Acquire) as usize == self.world).then_some(())))?;
        match all_in {
            Some(()) => Ok(()),
            None => self.give_up(start),
        }
    }

    /// Takes this rank back out after a timeout, unless the last rank came in the meantime.
    fn give_up(&self, start: Instant) -> Result<()> {
        let header = self.map.header();
        let slots = self.slots()?;
        // The joined count decides: either the last rank's increment comes first and everyone
        // succeeds, or this decrement does and that rank keeps waiting (and times out too).
        let mut n = header.joined.load(Ordering::Acquire);
        loop {
            if n as usize == self.world {
                return Ok(());
            }
            match header.joined.compare_exchange(n, n.saturating_sub(1), Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => break,
                Err(now) => n = now,
            }
        }
        let missing: Vec<usize> = slots
            .iter()
            .enumerate()
            .filter(|&(rank, slot)| rank != self.rank && !is_alive(slot.pid.load(Ordering::Acquire)))
            .map(|(rank, _)| rank)
            .collect();
        // The slot keeps this pid: the name is unlinked, so nobody new can join this segment.
        unlink(&self.name);
        Err(Error::PeersMissing { missing, world: self.world, waited: start.elapsed() })
    }

    fn slots(&self) -> Result<&[RankSlot]> {
        self.map
            .slots(self.world)
            .ok_or_else(|| Error::Foreign { name: self.name.clone(), problem: String::from("too short for its ranks") })
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn world(&self) -> usize {
        self.world
    }

    /// The communicator's id.
    pub fn id(&self) -> &UniqueId {
        &self.id
    }

    /// The segment's POSIX shared-memory name (`/gp2p-<token>`); unlinked once every rank joined.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Offset of the staging area from the start of the segment (a multiple of
    /// [`STAGING_ALIGN`]); the same in every process.
    pub fn staging_offset(&self) -> usize {
        staging_offset(self.world)
    }

    /// Bytes of the staging area.
    pub fn staging_len(&self) -> usize {
        self.staging_bytes
    }

    /// The staging area, as every rank's process sees it. Other processes write it at any
    /// time, so it is only ever touched through atomics (and, later, by the GPU).
    pub fn staging(&self) -> &[AtomicU8] {
        // SAFETY: the mapping holds `staging_offset + staging_bytes` bytes (its length was
        // checked against the header at creation or join); `AtomicU8` has the size and
        // alignment of `u8`, is valid for any byte, and other processes touch these bytes only
        // through atomic or device accesses; the slice borrows `self`, so the mapping outlives it.
        unsafe {
            let base = self.map.ptr.cast::<u8>().add(self.staging_offset()).cast::<AtomicU8>();
            std::slice::from_raw_parts(base.as_ptr(), self.staging_bytes)
        }
    }

    /// The aligned `u32` at byte `offset` of the staging area, for counters and flags that
    /// processes (and their GPUs) share; `None` past the end or unaligned.
    pub fn staging_u32(&self, offset: usize) -> Option<&AtomicU32> {
        let end = offset.checked_add(size_of::<u32>())?;
        if end > self.staging_bytes || offset % align_of::<AtomicU32>() != 0 {
            return None;
        }
        // SAFETY: in bounds and aligned (the staging area starts at a multiple of
        // STAGING_ALIGN, checked above for the offset); AtomicU32 is valid for any bit pattern,
        // and other processes touch these bytes only through atomic or device accesses; the
        // reference borrows `self`, so the mapping outlives it.
        Some(unsafe { &*self.map.ptr.cast::<u8>().add(self.staging_offset() + offset).cast::<AtomicU32>().as_ptr() })
    }

    /// Start and length of the whole mapping in this process, page-aligned: what the
    /// communicator will register with the driver (`cuMemHostRegister`, portable and
    /// device-mapped), one rank at a time. Not registered by this crate.
    ///
    /// The pointer is valid while `self` lives and differs in every process: never send it to
    /// another rank; send offsets from it.
    pub fn mapping(&self) -> (NonNull<u8>, usize) {
        (self.map.ptr.cast(), self.map.len)
    }
}

/// What a rank asks for: the creator writes it, a joiner checks it.
#[derive(Clone, Copy)]
struct Want {
    world: usize,
    staging_bytes: usize,
    total: usize,
}

/// Creates the segment if this rank comes first, else opens and checks the existing one.
fn open_or_create(name: &str, want: Want, pid: i32, start: Instant, deadline: Instant) -> Result<Mapping> {
    let exclusive = shm::OFlags::CREATE | shm::OFlags::EXCL | shm::OFlags::RDWR;
    loop {
        match shm::open(name, exclusive, Mode::from_raw_mode(SEGMENT_MODE)) {
            Ok(fd) => {
                return match set_up(fd, name, want, pid) {
                    Ok(map) => {
                        remove_stale(name);
                        Ok(map)
                    }
                    Err(e) => {
                        unlink(name);
                        Err(e)
                    }
                };
            }
            Err(Errno::EXIST) => match shm::open(name, shm::OFlags::RDWR, Mode::empty()) {
                Ok(fd) => return attach(fd, name, want, start, deadline),
                // Unlinked between the two opens (its ranks all joined, or gave up): try again.
                Err(Errno::NOENT) if Instant::now() < deadline => continue,
                Err(e) => return Err(os(name, "shm_open", e)),
            },
            Err(e) => return Err(os(name, "shm_open", e)),
        }
    }
}

/// Sizes and fills in the header of a segment this rank just created.
fn set_up(fd: OwnedFd, name: &str, want: Want, pid: i32) -> Result<Mapping> {
    // The umask may have taken bits off the mode; the other ranks need read and write.
    rustix::fs::fchmod(&fd, Mode::from_raw_mode(SEGMENT_MODE)).map_err(|e| os(name, "fchmod", e))?;
    rustix::fs::ftruncate(&fd, want.total as u64).map_err(|e| os(name, "ftruncate", e))?;
    // Reserve the pages now: a tmpfs that runs out of room later raises SIGBUS at the first
    // touch of a page it cannot back (here, or in the driver's registration), not an error.
    // tmpfs gives up with EINTR when a signal arrives meanwhile (it is safe to repeat).
    let reserve = || rustix::fs::fallocate(&fd, rustix::fs::FallocateFlags::empty(), 0, want.total as u64);
    match rustix::io::retry_on_intr(reserve) {
        Ok(()) | Err(Errno::OPNOTSUPP) => {}
        Err(Errno::NOSPC | Errno::NOMEM) => return Err(Error::NoRoom { name: name.to_owned(), bytes: want.total }),
        Err(e) => return Err(os(name, "fallocate", e)),
    }
    let map = Mapping::new(fd.as_fd(), want.total, name)?;
    let h = map.header();
    h.version.store(LAYOUT_VERSION, Ordering::Relaxed);
    // Both fit: world ≤ MAX_WORLD, and the staging size fits in the mapping's length.
    h.world.store(want.world as u32, Ordering::Relaxed);
    h.staging_bytes.store(want.staging_bytes as u64, Ordering::Relaxed);
    h.creator_pid.store(pid, Ordering::Relaxed);
    // Last, with release: a joiner that sees the magic sees every field above.
    h.magic.store(SEGMENT_MAGIC, Ordering::Release);
    Ok(map)
}

/// Maps a segment another rank created, once its creator has set it up, and checks that it
/// was made for the same world and staging sizes.
fn attach(fd: OwnedFd, name: &str, want: Want, start: Instant, deadline: Instant) -> Result<Mapping> {
    let file = File::from(fd);
    let stalled = || Error::CreatorStalled { name: name.to_owned(), waited: start.elapsed() };
    // The creator sizes the segment before it writes the header: wait for the size first.
    let sized = poll_until(deadline, || {
        let len = file.metadata().map_err(|e| Error::Os { name: name.to_owned(), call: "fstat", source: e })?.len();
        Ok((len > 0).then_some(len))
    })?;
    let len = sized.ok_or_else(stalled)?;
    let len =
        usize::try_from(len).map_err(|_| Error::Foreign { name: name.to_owned(), problem: format!("{len} bytes") })?;
    if len < LINE {
        return Err(Error::Foreign { name: name.to_owned(), problem: format!("{len} bytes, shorter than its header") });
    }
    let map = Mapping::new(file.as_fd(), len, name)?;
    let h = map.header();
    let set_up = poll_until(deadline, || match h.magic.load(Ordering::Acquire) {
        SEGMENT_MAGIC => Ok(Some(())),
        0 => Ok(None),
        other => Err(Error::Foreign {
            name: name.to_owned(),
            problem: format!("magic {other:#018x}, expected {SEGMENT_MAGIC:#018x}"),
        }),
    })?;
    set_up.ok_or_else(stalled)?;
    let version = h.version.load(Ordering::Relaxed);
    if version != LAYOUT_VERSION {
        return Err(Error::Foreign {
            name: name.to_owned(),
            problem: format!("layout version {version}, this build reads version {LAYOUT_VERSION}"),
        });
    }
    let world = h.world.load(Ordering::Relaxed) as usize;
    if world != want.world {
        return Err(Error::WorldMismatch { here: want.world, segment: world });
    }
    let bytes = h.staging_bytes.load(Ordering::Relaxed);
    if bytes != want.staging_bytes as u64 {
        return Err(Error::BytesMismatch {
            here: want.staging_bytes,
            segment: usize::try_from(bytes).unwrap_or(usize::MAX),
        });
    }
    if len != want.total {
        return Err(Error::Foreign {
            name: name.to_owned(),
            problem: format!("{len} bytes, but {world} ranks and {bytes} staging bytes make {}", want.total),
        });
    }
    Ok(map)
}

/// Removes the segments crashed runs left in `/dev/shm`: those whose creator and every joined
/// process are dead. A segment a live process may still use, one not (yet) set up, or one of
/// another layout version is never touched. `own` is the segment being created now.
fn remove_stale(own: &str) {
    let Ok(dir) = std::fs::read_dir(SHM_DIR) else { return };
    for entry in dir.flatten() {
        let file_name = entry.file_name();
        let Some(file_name) = file_name.to_str() else { continue };
        if !file_name.starts_with(NAME_PREFIX) {
            continue;
        }
        let name = format!("/{file_name}");
        if name != own && is_stale(&name) {
            unlink(&name);
        }
    }
}

/// Whether `name` is a segment of this layout whose creator and joined processes are all dead.
fn is_stale(name: &str) -> bool {
    let Ok(fd) = shm::open(name, shm::OFlags::RDWR, Mode::empty()) else { return false };
    let file = File::from(fd);
    let Some(len) = file.metadata().ok().and_then(|m| usize::try_from(m.len()).ok()) else { return false };
    if len < LINE {
        return false;
    }
    // The header and every possible slot, never the staging area.
    let Ok(map) = Mapping::new(file.as_fd(), len.min(staging_offset(MAX_WORLD)), name) else { return false };
    let h = map.header();
    if h.magic.load(Ordering::Acquire) != SEGMENT_MAGIC || h.version.load(Ordering::Relaxed) != LAYOUT_VERSION {
        return false;
    }
    let Some(slots) = map.slots(h.world.load(Ordering::Relaxed) as usize) else { return false };
    !is_alive(h.creator_pid.load(Ordering::Acquire)) && slots.iter().all(|s| !is_alive(s.pid.load(Ordering::Acquire)))
}

/// Whether process `pid` exists. Pids ≤ 0 stand for "nobody". A process owned by another user
/// counts as alive (EPERM), and so does a reused pid: a segment is kept when in doubt.
fn is_alive(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    match Pid::from_raw(pid) {
        Some(p) => !matches!(rustix::process::test_kill_process(p), Err(Errno::SRCH)),
        None => false,
    }
}

/// Unlinks `name`; already gone is fine (another rank unlinked it first).
fn unlink(name: &str) {
    let _ = shm::unlink(name);
}

fn os(name: &str, call: &'static str, e: Errno) -> Error {
    Error::Os { name: name.to_owned(), call, source: e.into() }
}
