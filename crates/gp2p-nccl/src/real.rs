//! The real NCCL: found where torch's is, or where `GP2P_NCCL_REAL` says, loaded by path
//! (never by name: preloaded, the door itself answers to `libnccl.so.2`) with its own
//! symbols kept to itself, once per process and never unloaded. Every entry point is looked
//! up on its own, so an older NCCL that lacks one still serves the rest, and a call to what it
//! lacks is refused by name.
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_void};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};

use crate::abi::{Code, RawComm, RawConfig, RawResult, RawSimInfo, RawStream, RawTeam, RawUniqueId, RawWindow};
use crate::config::ConfigArg;
use crate::env::REAL_VAR;
use crate::error::{Error, Result};

/// The real NCCL's entry points from a table of `name(args) -> result;` rows.
macro_rules! functions {
    ($($name:ident($($arg:ty),*) -> $ret:ty;)*) => {
        /// The real NCCL's entry points, each where its library exports it (`nccl.h`'s
        /// signatures).
        #[allow(non_snake_case)]
        pub struct Functions {
            $(
                #[doc = concat!("`", stringify!($name), "`.")]
                pub $name: Option<unsafe extern "C" fn($($arg),*) -> $ret>,
            )*
        }

        impl Functions {
            /// Look every entry point up in `lib`.
            ///
            /// # Safety
            /// `lib` is an NCCL whose exports have the signatures of NCCL 2.28's `nccl.h`.
            unsafe fn load(lib: &Library) -> Functions {
                Functions {
                    $(
                        // SAFETY: by this function's contract, the symbol (where present) is
                        // the function of this signature.
                        $name: unsafe { lib.get::<unsafe extern "C" fn($($arg),*) -> $ret>(stringify!($name)) }
                            .ok()
                            .map(|symbol| *symbol),
                    )*
                }
            }

            /// The names of the entry points the library lacks.
            pub fn missing(&self) -> Vec<&'static str> {
                let mut missing = Vec::new();
                $(
                    if self.$name.is_none() {
                        missing.push(stringify!($name));
                    }
                )*
                missing
            }
        }
    };
}

functions! {
    ncclMemAlloc(*mut *mut c_void, usize) -> RawResult;
    ncclMemFree(*mut c_void) -> RawResult;
    ncclGetVersion(*mut c_int) -> RawResult;
    ncclGetUniqueId(*mut RawUniqueId) -> RawResult;
    ncclCommInitRankConfig(*mut RawComm, c_int, RawUniqueId, c_int, *mut RawConfig) -> RawResult;
    ncclCommInitRank(*mut RawComm, c_int, RawUniqueId, c_int) -> RawResult;
    ncclCommInitAll(*mut RawComm, c_int, *const c_int) -> RawResult;
    ncclCommFinalize(RawComm) -> RawResult;
    ncclCommDestroy(RawComm) -> RawResult;
    ncclCommAbort(RawComm) -> RawResult;
    ncclCommRevoke(RawComm, c_int) -> RawResult;
    ncclCommSplit(RawComm, c_int, c_int, *mut RawComm, *mut RawConfig) -> RawResult;
    ncclCommShrink(RawComm, *mut c_int, c_int, *mut RawComm, *mut RawConfig, c_int) -> RawResult;
    ncclCommInitRankScalable(*mut RawComm, c_int, c_int, c_int, *mut RawUniqueId, *mut RawConfig) -> RawResult;
    ncclGetErrorString(RawResult) -> *const c_char;
    ncclGetLastError(RawComm) -> *const c_char;
    ncclResetDebugInit() -> ();
    ncclCommGetAsyncError(RawComm, *mut RawResult) -> RawResult;
    ncclCommCount(RawComm, *mut c_int) -> RawResult;
    ncclCommCuDevice(RawComm, *mut c_int) -> RawResult;
    ncclCommUserRank(RawComm, *mut c_int) -> RawResult;
    ncclCommRegister(RawComm, *mut c_void, usize, *mut *mut c_void) -> RawResult;
    ncclCommDeregister(RawComm, *mut c_void) -> RawResult;
    ncclCommWindowRegister(RawComm, *mut c_void, usize, *mut RawWindow, c_int) -> RawResult;
    ncclCommWindowDeregister(RawComm, RawWindow) -> RawResult;
    ncclRedOpCreatePreMulSum(*mut c_int, *mut c_void, c_int, c_int, RawComm) -> RawResult;
    ncclRedOpDestroy(c_int, RawComm) -> RawResult;
    ncclReduce(*const c_void, *mut c_void, usize, c_int, c_int, c_int, RawComm, RawStream) -> RawResult;
    ncclBcast(*mut c_void, usize, c_int, c_int, RawComm, RawStream) -> RawResult;
    ncclBroadcast(*const c_void, *mut c_void, usize, c_int, c_int, RawComm, RawStream) -> RawResult;
    ncclAllReduce(*const c_void, *mut c_void, usize, c_int, c_int, RawComm, RawStream) -> RawResult;
    ncclReduceScatter(*const c_void, *mut c_void, usize, c_int, c_int, RawComm, RawStream) -> RawResult;
    ncclAllGather(*const c_void, *mut c_void, usize, c_int, RawComm, RawStream) -> RawResult;
    ncclAlltoAll(*const c_void, *mut c_void, usize, c_int, RawComm, RawStream) -> RawResult;
    ncclGather(*const c_void, *mut c_void, usize, c_int, c_int, RawComm, RawStream) -> RawResult;
    ncclScatter(*const c_void, *mut c_void, usize, c_int, c_int, RawComm, RawStream) -> RawResult;
    ncclSend(*const c_void, usize, c_int, c_int, RawComm, RawStream) -> RawResult;
    ncclRecv(*mut c_void, usize, c_int, c_int, RawComm, RawStream) -> RawResult;
    ncclGroupStart() -> RawResult;
    ncclGroupEnd() -> RawResult;
    ncclGroupSimulateEnd(*mut RawSimInfo) -> RawResult;
    ncclDevCommCreate(RawComm, *const c_void, *mut c_void) -> RawResult;
    ncclDevCommDestroy(RawComm, *const c_void) -> RawResult;
    ncclTeamWorld(RawComm) -> RawTeam;
    ncclTeamLsa(RawComm) -> RawTeam;
    ncclTeamRail(RawComm) -> RawTeam;
    ncclTeamRankToWorld(RawComm, RawTeam, c_int) -> c_int;
    ncclTeamRankToLsa(RawComm, RawTeam, c_int) -> c_int;
    ncclGinBarrierCreateRequirement(RawComm, RawTeam, c_int, *mut c_void, *mut c_void) -> RawResult;
    ncclLLA2ACalcSlots(c_int, c_int) -> c_int;
    ncclLLA2ACreateRequirement(c_int, c_int, *mut c_void, *mut c_void) -> RawResult;
    ncclLsaBarrierCreateRequirement(RawTeam, c_int, *mut c_void, *mut c_void) -> RawResult;
}

/// The loaded real NCCL.
pub struct Real {
    /// Where it was loaded from.
    pub path: PathBuf,
    /// Its `ncclGetVersion`.
    pub version: c_int,
    /// Its entry points.
    pub functions: Functions,
    /// Kept for the process's life: its functions are called through the table above.
    _library: Library,
}

impl Real {
    /// The entry point `pick` selects, or an error naming `name` where this NCCL lacks it.
    ///
    /// # Errors
    /// [`Error::RealNccl`] naming the function, the library and its version.
    pub fn get<F>(&self, name: &'static str, pick: impl FnOnce(&Functions) -> Option<F>) -> Result<F> {
        pick(&self.functions).ok_or_else(|| Error::RealNccl {
            problem: format!(
                "{} (version {}) has no {name}, which this program calls; install NCCL 2.28 or newer there",
                self.path.display(),
                self.version
            ),
        })
    }
}

/// The calls the door makes of the real NCCL with arguments of its own (what it forwards for
/// a caller is in `crate::exports`).
impl Real {
    /// `ncclGroupStart`.
    ///
    /// # Errors
    /// The real NCCL's code, but `ncclInProgress`.
    pub fn group_start(&self) -> Result<()> {
        let f = self.get("ncclGroupStart", |f| f.ncclGroupStart)?;
        // SAFETY: no arguments.
        check_in_progress("ncclGroupStart", unsafe { f() }).map(drop)
    }

    /// `ncclGroupEnd`: `ncclInProgress` where a non-blocking communicator's calls are still
    /// being made (the caller polls `ncclCommGetAsyncError`, as NCCL says), else success.
    ///
    /// # Errors
    /// The real NCCL's code, but `ncclInProgress`.
    pub fn group_end(&self) -> Result<Code> {
        let f = self.get("ncclGroupEnd", |f| f.ncclGroupEnd)?;
        // SAFETY: no arguments.
        check_in_progress("ncclGroupEnd", unsafe { f() })
    }

    /// `ncclGetUniqueId`.
    ///
    /// # Errors
    /// The real NCCL's code.
    pub fn unique_id(&self) -> Result<RawUniqueId> {
        let f = self.get("ncclGetUniqueId", |f| f.ncclGetUniqueId)?;
        let mut id = RawUniqueId { internal: [0; crate::abi::UNIQUE_ID_BYTES] };
        // SAFETY: writes one id through its pointer, a local.
        check("ncclGetUniqueId", unsafe { f(&mut id) })?;
        Ok(id)
    }

    /// `ncclCommInitRank`, or `ncclCommInitRankConfig` with `config`, on the calling thread's
    /// current device. A non-blocking config may leave the communicator in progress.
    ///
    /// # Errors
    /// The real NCCL's code.
    pub fn init_rank(&self, nranks: c_int, id: &RawUniqueId, rank: c_int, config: &ConfigArg) -> Result<RawComm> {
        let mut comm: RawComm = std::ptr::null_mut();
        let code = match config {
            ConfigArg::Caller(address) => {
                let f = self.get("ncclCommInitRankConfig", |f| f.ncclCommInitRankConfig)?;
                let config: *mut RawConfig = std::ptr::with_exposed_provenance_mut(*address);
                // SAFETY: the caller's own config, passed untouched during its call (the door
                // makes this creation on the caller's thread before the call returns).
                unsafe { f(&mut comm, nranks, *id, rank, config) }
            }
            ConfigArg::None => {
                let f = self.get("ncclCommInitRank", |f| f.ncclCommInitRank)?;
                // SAFETY: writes one communicator through its pointer (a local); the id by value.
                unsafe { f(&mut comm, nranks, *id, rank) }
            }
            ConfigArg::Owned(config) => {
                let f = self.get("ncclCommInitRankConfig", |f| f.ncclCommInitRankConfig)?;
                let mut raw = config.to_raw();
                // SAFETY: as above; `raw` and the strings it points into (`config`'s) live
                // until the call returns, and NCCL copies what it keeps.
                unsafe { f(&mut comm, nranks, *id, rank, &mut raw) }
            }
        };
        if code == Code::InProgress.raw() {
            return Ok(comm);
        }
        check("ncclCommInitRank", code)?;
        Ok(comm)
    }
}

impl Real {
    /// `ncclCommAbort` of a communicator the door itself made through this NCCL (its address)
    /// and never handed out.
    ///
    /// # Errors
    /// The real NCCL's code.
    pub fn abort_made(&self, comm: usize) -> Result<()> {
        let f = self.get("ncclCommAbort", |f| f.ncclCommAbort)?;
        // SAFETY: a communicator this NCCL made for the door, which nobody else holds.
        check("ncclCommAbort", unsafe { f(std::ptr::with_exposed_provenance_mut(comm)) })
    }
}

/// A real NCCL result as this crate's.
///
/// # Errors
/// [`Error::Real`] for anything but success.
pub fn check(call: &'static str, code: RawResult) -> Result<()> {
    match Code::from_raw(code) {
        Some(Code::Success) => Ok(()),
        Some(code) => Err(Error::Real { call, code }),
        None => Err(Error::Real { call, code: Code::InternalError }),
    }
}

/// [`check`] for a call of a non-blocking communicator, whose `ncclInProgress` is no failure:
/// the code, success or in progress.
///
/// # Errors
/// As [`check`], for any other code.
pub fn check_in_progress(call: &'static str, code: RawResult) -> Result<Code> {
    if code == Code::InProgress.raw() {
        return Ok(Code::InProgress);
    }
    check(call, code).map(|()| Code::Success)
}

/// A symbol only the door exports (`crate::exports` defines it): how it tells a copy of itself
/// (the door under the real library's file name, earlier in a search path) from the real NCCL.
pub const DOOR_MARK: &std::ffi::CStr = c"gp2p_nccl_door";

/// An address inside the door's own code, to find its file among the mappings.
fn own_address() -> usize {
    own_address as *const () as usize
}

/// The real NCCL, loaded on first use.
static REAL: OnceLock<std::result::Result<Real, String>> = OnceLock::new();

/// The real NCCL, loading it if this is the first ask.
///
/// # Errors
/// [`Error::RealNccl`] saying where it looked and why each candidate failed.
pub fn real() -> Result<&'static Real> {
    REAL.get_or_init(load).as_ref().map_err(|problem| Error::RealNccl { problem: problem.clone() })
}

/// The real NCCL where it is loaded already; `None` without loading it.
pub fn loaded() -> Option<&'static Real> {
    REAL.get().and_then(|r| r.as_ref().ok())
}

/// Look for it and load the first candidate that is an NCCL and not this door.
fn load() -> std::result::Result<Real, String> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let own = mapping_path(&maps, own_address());
    let forced = std::env::var(REAL_VAR).ok().filter(|v| !v.trim().is_empty());
    let library_path = std::env::var("LD_LIBRARY_PATH").ok();
    let paths = candidates(forced.as_deref(), &maps, own.as_deref(), library_path.as_deref());
    let mut tried = Vec::new();
    for path in paths {
        if !path.exists() {
            continue;
        }
        if own.as_deref().is_some_and(|own| same_file(own, &path)) {
            continue;
        }
        match open(&path) {
            Ok(real) => return Ok(real),
            Err(why) => tried.push(format!("{}: {why}", path.display())),
        }
    }
    let looked = if tried.is_empty() { String::from("no candidate exists") } else { tried.join("; ") };
    Err(match forced {
        Some(f) => format!("{REAL_VAR}={f} could not be loaded ({looked})"),
        None => format!(
            "not found next to torch, in LD_LIBRARY_PATH or the system's library folders ({looked}); name its libnccl.so.2 in {REAL_VAR}"
        ),
    })
}

/// Load `path` and check it is an NCCL other than this door.
fn open(path: &Path) -> std::result::Result<Real, String> {
    // SAFETY: loading runs the library's initialisers: NCCL's set up its own state only. It is
    // loaded with its symbols local, so it changes no lookup of other libraries.
    let library = unsafe { Library::open(Some(path), RTLD_NOW | RTLD_LOCAL) }.map_err(|e| e.to_string())?;
    // SAFETY: every entry point is looked up under NCCL's own name, whose signature is
    // nccl.h's in every NCCL since 2.0 (what each was added in, it has since kept).
    let functions = unsafe { Functions::load(&library) };
    let get_version = functions.ncclGetVersion.ok_or("no ncclGetVersion: not an NCCL")?;
    // SAFETY: only the symbol's presence is asked; it is never read.
    let another_door = unsafe { library.get::<*const ()>(DOOR_MARK.to_bytes_with_nul()) }.is_ok();
    if another_door {
        return Err(String::from("a copy of the NCCL door itself, not the real NCCL"));
    }
    let mut version: c_int = 0;
    // SAFETY: ncclGetVersion writes one int through its pointer, a local here.
    let code = unsafe { get_version(&mut version) };
    if code != 0 {
        return Err(format!("ncclGetVersion returned {code}"));
    }
    crate::log::info(&format!("the real NCCL {version} is {}", path.display()));
    let missing = functions.missing();
    if !missing.is_empty() {
        crate::log::info(&format!("it lacks {}: calls to those on its communicators are refused", missing.join(", ")));
    }
    Ok(Real { path: path.to_owned(), version, functions, _library: library })
}

/// Whether two paths name one file.
fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// Folders NCCL is commonly installed in, after the ones torch and the environment name.
const SYSTEM_FOLDERS: [&str; 5] =
    ["/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/local/cuda/lib64", "/usr/lib"];
/// The real library's file name.
const FILE_NAME: &str = "libnccl.so.2";

/// Where to look for the real NCCL, in order: `forced` alone where given; else the NCCL
/// torch's `libtorch_cuda.so` links (its pip package `nvidia/nccl/lib`, found from the
/// mappings in `maps`, `/proc/self/maps`'s text), any other `libnccl.so.2` already mapped, an
/// `nvidia/nccl/lib` above this door's own file `own` (both in one site-packages), the folders
/// of `library_path`, and the system's library folders.
pub fn candidates(forced: Option<&str>, maps: &str, own: Option<&Path>, library_path: Option<&str>) -> Vec<PathBuf> {
    if let Some(forced) = forced {
        return vec![PathBuf::from(forced.trim())];
    }
    let mapped = mapped_files(maps);
    let pip = Path::new("nvidia").join("nccl").join("lib").join(FILE_NAME);
    let mut out: Vec<PathBuf> = Vec::new();
    for file in &mapped {
        if file.file_name().is_some_and(|n| n == "libtorch_cuda.so")
            && let Some(site) = file.parent().and_then(Path::parent).and_then(Path::parent)
        {
            out.push(site.join(&pip));
        }
    }
    out.extend(mapped.iter().filter(|f| f.file_name().is_some_and(|n| n == FILE_NAME)).cloned());
    if let Some(own) = own {
        out.extend(own.ancestors().skip(1).map(|a| a.join(&pip)));
    }
    for folder in library_path.unwrap_or_default().split(':').filter(|f| !f.is_empty()) {
        out.push(Path::new(folder).join(FILE_NAME));
    }
    out.extend(SYSTEM_FOLDERS.iter().map(|f| Path::new(f).join(FILE_NAME)));
    out.retain(|p| own.is_none_or(|own| p != own));
    let mut seen = std::collections::HashSet::new();
    out.retain(|p| seen.insert(p.clone()));
    out
}

/// The files mapped in `maps` (`/proc/self/maps`'s text), each once, in order.
fn mapped_files(maps: &str) -> Vec<PathBuf> {
    let mut seen = std::collections::HashSet::new();
    maps.lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .filter(|path| path.starts_with('/'))
        .map(PathBuf::from)
        .filter(|p| seen.insert(p.clone()))
        .collect()
}

/// The file mapped at `address` in `maps`, if a file is.
fn mapping_path(maps: &str, address: usize) -> Option<PathBuf> {
    maps.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        let (start, end) = fields.next()?.split_once('-')?;
        let (start, end) = (usize::from_str_radix(start, 16).ok()?, usize::from_str_radix(end, 16).ok()?);
        let path = fields.nth(4)?;
        ((start..end).contains(&address) && path.starts_with('/')).then(|| PathBuf::from(path))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
7f0000000000-7f0000001000 r-xp 00000000 08:01 11 /venv/lib/python3.11/site-packages/torch/lib/libtorch_cuda.so
7f0000002000-7f0000003000 r-xp 00000000 08:01 12 /venv/lib/python3.11/site-packages/geforce_p2p/nccl/libnccl.so.2
7f0000004000-7f0000005000 rw-p 00000000 00:00 0
7f0000006000-7f0000007000 r-xp 00000000 08:01 13 /opt/other/libnccl.so.2
7ffd00000000-7ffd00001000 rw-p 00000000 00:00 0 [stack]
";

    #[test]
    fn torch_s_nccl_comes_first_and_the_door_never() {
        let own = mapping_path(MAPS, 0x7f00_0000_2800).expect("the door is mapped");
        assert_eq!(own, Path::new("/venv/lib/python3.11/site-packages/geforce_p2p/nccl/libnccl.so.2"));
        let found = candidates(None, MAPS, Some(&own), Some("/a:/b"));
        let site_nccl = PathBuf::from("/venv/lib/python3.11/site-packages/nvidia/nccl/lib/libnccl.so.2");
        assert_eq!(found[0], site_nccl);
        assert_eq!(found[1], PathBuf::from("/opt/other/libnccl.so.2"));
        assert!(!found.contains(&own));
        assert_eq!(found.iter().filter(|p| **p == site_nccl).count(), 1, "once: {found:?}");
        let a = found.iter().position(|p| p == Path::new("/a/libnccl.so.2")).expect("LD_LIBRARY_PATH");
        let system = found.iter().position(|p| p == Path::new("/usr/lib64/libnccl.so.2")).expect("system");
        assert!(a < system);
    }

    #[test]
    fn a_named_library_is_the_only_candidate() {
        assert_eq!(candidates(Some(" /x/libnccl.so.2 "), MAPS, None, Some("/a")), [PathBuf::from("/x/libnccl.so.2")]);
    }

    #[test]
    fn unmapped_addresses_and_anonymous_mappings_name_no_file() {
        assert_eq!(mapping_path(MAPS, 0x7f00_0000_4800), None);
        assert_eq!(mapping_path(MAPS, 0x10), None);
        assert_eq!(mapped_files(MAPS).len(), 3);
    }

    #[test]
    fn a_missing_library_is_an_error_that_says_where_it_looked() {
        // SAFETY-free: this process has no NCCL beside it in the test's temporary folder.
        let e = open(Path::new("/nonexistent/libnccl.so.2")).err().unwrap_or_default();
        assert!(!e.is_empty());
    }
}
