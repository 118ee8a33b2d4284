//! `Device`: a CUDA device and its primary context.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::ffi::{c_char, c_int};
use std::fmt;
use std::sync::Arc;

use cudarc::driver::sys::{self, CUcontext, CUdevice, CUdevice_attribute};
use parking_lot::Mutex;

use crate::driver::{check, init};
use crate::module::Module;
use crate::pool::MemoryPool;
use crate::{Error, Result};
use gp2p_kernels::PtxTarget;

/// The oldest compute capability the kernels are built for (`compute_75`, Turing).
pub const MIN_COMPUTE_CAPABILITY: (u32, u32) = PtxTarget::ALL[0].min_capability();

/// Set to a PTX target name (`compute_75`) to load that build of the kernels on every device
/// that can run it instead of the newest one: how the Turing build is tested on newer cards.
pub const PTX_TARGET_ENV: &str = "GP2P_PTX_TARGET";

/// What the driver says about one device, without opening it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// CUDA ordinal.
    pub ordinal: usize,
    /// Marketing name, e.g. "NVIDIA GeForce RTX 4090".
    pub name: String,
    /// Compute capability (major, minor).
    pub compute_capability: (u32, u32),
    /// Total device memory in bytes.
    pub total_memory: usize,
    /// PCI bus id, `domain:bus:device.function`.
    pub pci_bus_id: String,
    /// Number of streaming multiprocessors.
    pub multiprocessors: u32,
    /// Whether the device can map pinned host memory into its address space.
    pub can_map_host_memory: bool,
    /// Whether host and device share one virtual address space (UVA).
    pub unified_addressing: bool,
}

impl DeviceInfo {
    /// Whether geforce-p2p can use this device.
    pub fn is_supported(&self) -> bool {
        self.compute_capability >= MIN_COMPUTE_CAPABILITY
    }

    /// The build of the kernels [`Device::open`] would load on it (see
    /// [`Device::ptx_target`]), without opening it.
    pub fn ptx_target(&self) -> Result<PtxTarget> {
        ptx_target_for(self)
    }
}

/// CUDA's view of one ordered device pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct P2pAttributes {
    /// Peer access is possible.
    pub access_supported: bool,
    /// All CUDA atomics work over the link.
    pub native_atomics: bool,
    /// Relative link performance, lower is better.
    pub performance_rank: i32,
}

/// An open CUDA device: cheap to clone, shared, `Send + Sync`.
///
/// Holds the device's primary context, the one the CUDA runtime and most frameworks use, so
/// pointers and streams from them are valid here. Opened devices stay open for the life of
/// the process (like the runtime's), and each call binds the context to the calling thread.
#[derive(Clone)]
pub struct Device {
    inner: Arc<Inner>,
}

struct Inner {
    info: DeviceInfo,
    raw: CUdevice,
    ctx: CUcontext,
    modules: Mutex<HashMap<&'static str, Arc<Module>>>,
    /// The build of the kernels this device loads.
    ptx_target: PtxTarget,
    /// Idle events for [`crate::StreamPoint`]s, reused instead of created per operation.
    spare_events: Mutex<Vec<crate::Event>>,
    /// Where [`crate::DeviceBuffer`]s come from: the library's stream-ordered pool, or
    /// `cuMemAlloc` where the device has none (see `pool.rs`).
    memory: Option<MemoryPool>,
}

// SAFETY: CUdevice is an integer and CUcontext an opaque handle; the driver API is
// thread-safe, and a context may be made current on any number of threads at once.
unsafe impl Send for Inner {}
// SAFETY: as above; the only interior mutability is behind a Mutex.
unsafe impl Sync for Inner {}

static OPEN: Mutex<Vec<Option<Device>>> = Mutex::new(Vec::new());

/// The calling thread's current context, put back when this is dropped: for entry points
/// called by foreign code (the NCCL door), whose callers expect their current device to be
/// as they left it while this library binds the contexts it works in.
pub struct CurrentContext(Option<CUcontext>);

impl CurrentContext {
    /// Remember the calling thread's current context (nothing without a driver).
    pub fn save() -> CurrentContext {
        if init().is_err() {
            return CurrentContext(None);
        }
        CurrentContext(current_context())
    }
}

impl Drop for CurrentContext {
    fn drop(&mut self) {
        // Put back only where the work changed it: the caller's context is most often the
        // one the work bound (a rank's device), and setting it again costs a driver call.
        if let Some(ctx) = self.0.filter(|&ctx| current_context() != Some(ctx)) {
            // SAFETY: the context that was current, or null (none); it was alive then, and
            // primary contexts are never destroyed by this library.
            crate::driver::defer_error(check(unsafe { sys::cuCtxSetCurrent(ctx) }, "cuCtxSetCurrent"));
        }
    }
}

/// The calling thread's current context (null for none), or `None` where the driver cannot
/// say. A read of the thread's state, far cheaper than setting it.
fn current_context() -> Option<CUcontext> {
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: out-pointer to a local.
    let ok = unsafe { sys::cuCtxGetCurrent(&mut ctx) } == sys::CUresult::CUDA_SUCCESS;
    ok.then_some(ctx)
}

impl Device {
    /// Refuses a device that cannot map pinned host memory, which every staging path needs.
    pub fn require_host_mapping(&self) -> Result<()> {
        if self.info().can_map_host_memory { Ok(()) } else { Err(Error::NoHostMapping { ordinal: self.ordinal() }) }
    }

    /// How many CUDA devices are visible. `Err(NoDriver)` without a driver.
    pub fn count() -> Result<usize> {
        init()?;
        let mut count: c_int = 0;
        // SAFETY: out-pointer to a local.
        check(unsafe { sys::cuDeviceGetCount(&mut count) }, "cuDeviceGetCount")?;
        Ok(usize::try_from(count).unwrap_or(0))
    }

    /// The ordinal of the device whose context is current on the calling thread (the CUDA
    /// runtime's current device, once it has run anything there), or `None` where no context
    /// is current. Opens nothing.
    pub fn current_ordinal() -> Result<Option<usize>> {
        init()?;
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: out-pointer to a local.
        check(unsafe { sys::cuCtxGetCurrent(&mut ctx) }, "cuCtxGetCurrent")?;
        if ctx.is_null() {
            return Ok(None);
        }
        let mut dev: CUdevice = 0;
        // SAFETY: a context is current; out-pointer to a local.
        check(unsafe { sys::cuCtxGetDevice(&mut dev) }, "cuCtxGetDevice")?;
        Ok(usize::try_from(dev).ok())
    }

    /// Make device `ordinal`'s primary context the calling thread's current one, as the CUDA
    /// runtime's `cudaSetDevice` does, without opening the device for this library (no
    /// compute-capability check, no pool): for threads that hand a device to foreign code,
    /// which takes the current device.
    pub fn make_current_ordinal(ordinal: usize) -> Result<()> {
        let (_, dev) = query(ordinal)?;
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: a valid device handle; out-pointer to a local. The reference taken is kept,
        // as the runtime keeps its own for the process's life.
        check(unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, dev) }, "cuDevicePrimaryCtxRetain")?;
        // SAFETY: a retained primary context.
        check(unsafe { sys::cuCtxSetCurrent(ctx) }, "cuCtxSetCurrent")
    }

    /// Whether device `ordinal` can access device `peer`'s memory directly
    /// (`cuDeviceCanAccessPeer`), without opening either: what a process asks of devices it
    /// will not use itself. A device can always access itself.
    pub fn can_access_peer_ordinals(ordinal: usize, peer: usize) -> Result<bool> {
        if ordinal == peer {
            return Ok(true);
        }
        let (_, dev) = query(ordinal)?;
        let (_, peer_dev) = query(peer)?;
        let mut can: c_int = 0;
        // SAFETY: two valid device handles; out-pointer to a local.
        check(unsafe { sys::cuDeviceCanAccessPeer(&mut can, dev, peer_dev) }, "cuDeviceCanAccessPeer")?;
        Ok(can != 0)
    }

    /// Describe every visible device, supported or not.
    pub fn all_info() -> Result<Vec<DeviceInfo>> {
        (0..Self::count()?).map(|o| query(o).map(|(info, _)| info)).collect()
    }

    /// Open device `ordinal` (its primary context). Refuses devices below compute
    /// capability 7.5. Opening the same ordinal again returns the same device.
    pub fn open(ordinal: usize) -> Result<Device> {
        // An open device first: the bindings open one per call, and the count is a driver
        // call that an open device has already passed.
        if let Some(Some(device)) = OPEN.lock().get(ordinal) {
            return Ok(device.clone());
        }
        let count = Self::count()?;
        if ordinal >= count {
            return Err(Error::NoDevice { ordinal, count });
        }
        let mut open = OPEN.lock();
        if let Some(Some(device)) = open.get(ordinal) {
            return Ok(device.clone());
        }
        let (info, raw) = query(ordinal)?;
        if !info.is_supported() {
            let (major, minor) = info.compute_capability;
            return Err(Error::Unsupported { ordinal, name: info.name, major, minor });
        }
        let ptx_target = ptx_target_for(&info)?;
        crate::lifetime::start_reclaimer();
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: `raw` is a valid device handle; out-pointer to a local. The retain is never
        // released: opened devices live for the process, as in the CUDA runtime.
        check(unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, raw) }, "cuDevicePrimaryCtxRetain")?;
        // SAFETY: the context just retained.
        check(unsafe { sys::cuCtxSetCurrent(ctx) }, "cuCtxSetCurrent")?;
        // A device whose pool cannot be made allocates with cuMemAlloc, as before pools (the
        // error is not the caller's to handle: that path works, only slower to free).
        let memory = MemoryPool::for_device(raw, ordinal).ok().flatten();
        let device = Device {
            inner: Arc::new(Inner {
                info,
                raw,
                ctx,
                modules: Mutex::new(HashMap::new()),
                ptx_target,
                spare_events: Mutex::new(Vec::new()),
                memory,
            }),
        };
        // Pool memory is reachable from a peer only where granted, whoever enabled peer access
        // (torch may have, at the context level): grant every pair that can, both ways.
        for other in open.iter().flatten() {
            device.grant_pool_access(other);
            other.grant_pool_access(&device);
        }
        if open.len() <= ordinal {
            open.resize(ordinal + 1, None);
        }
        open[ordinal] = Some(device.clone());
        Ok(device)
    }

    /// The CUDA ordinal.
    pub fn ordinal(&self) -> usize {
        self.inner.info.ordinal
    }

    /// What the driver said about this device when it was opened.
    pub fn info(&self) -> &DeviceInfo {
        &self.inner.info
    }

    /// The build of the kernels this device loads: the newest its compute capability runs,
    /// unless [`PTX_TARGET_ENV`] names an older one.
    pub fn ptx_target(&self) -> PtxTarget {
        self.inner.ptx_target
    }

    /// Make this device's primary context current on the calling thread.
    /// Nothing where it is current already (each call's entry binds, and a caller on one
    /// device keeps its context current: the set would cost a driver call every time).
    pub fn bind(&self) -> Result<()> {
        if current_context() == Some(self.inner.ctx) {
            return Ok(());
        }
        // SAFETY: ctx is a retained primary context, valid for the process lifetime.
        check(unsafe { sys::cuCtxSetCurrent(self.inner.ctx) }, "cuCtxSetCurrent")
    }

    /// Block until all work on this device is done (every stream).
    pub fn synchronize(&self) -> Result<()> {
        self.bind()?;
        // SAFETY: the context is current; no pointers.
        check(unsafe { sys::cuCtxSynchronize() }, "cuCtxSynchronize")
    }

    /// Whether this device can access `peer`'s memory directly (`cuDeviceCanAccessPeer`).
    /// A device can always access itself.
    pub fn can_access_peer(&self, peer: &Device) -> Result<bool> {
        if self == peer {
            return Ok(true);
        }
        let mut can: c_int = 0;
        let (dev, peer_dev) = (self.inner.raw, peer.inner.raw);
        // SAFETY: two valid device handles; out-pointer to a local.
        check(unsafe { sys::cuDeviceCanAccessPeer(&mut can, dev, peer_dev) }, "cuDeviceCanAccessPeer")?;
        Ok(can != 0)
    }

    /// What CUDA says about this device reaching `peer` (`cuDeviceGetP2PAttribute`).
    pub fn p2p_attributes(&self, peer: &Device) -> Result<P2pAttributes> {
        use sys::CUdevice_P2PAttribute as A;
        let get = |attr: A| -> Result<i32> {
            let mut v: c_int = 0;
            let (dev, peer_dev) = (self.inner.raw, peer.inner.raw);
            // SAFETY: two valid, distinct device handles; out-pointer to a local.
            check(unsafe { sys::cuDeviceGetP2PAttribute(&mut v, attr, dev, peer_dev) }, "cuDeviceGetP2PAttribute")?;
            Ok(v)
        };
        Ok(P2pAttributes {
            access_supported: get(A::CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED)? != 0,
            native_atomics: get(A::CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED)? != 0,
            performance_rank: get(A::CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK)?,
        })
    }

    /// Let this device's context access `peer`'s memory. Idempotent: a pair already enabled
    /// is not an error. Check [`Device::can_access_peer`] first.
    pub fn enable_peer_access(&self, peer: &Device) -> Result<()> {
        if self == peer {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: the current context is this device's; peer's ctx is a retained primary context.
        match unsafe { sys::cuCtxEnablePeerAccess(peer.inner.ctx, 0) } {
            sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => {}
            code => check(code, "cuCtxEnablePeerAccess")?,
        }
        Ok(())
    }

    /// Let `accessor` reach this device's pool memory where the pair allows peer access (done
    /// for every pair as devices open). A grant that fails (never seen) is reported at the
    /// next synchronise; the P2P route's own check looks only at context-level peer access,
    /// so a peer copy into that memory would then fail in the driver, or has been reported
    /// to succeed without writing.
    fn grant_pool_access(&self, accessor: &Device) {
        if let Some(pool) = &self.inner.memory
            && accessor.can_access_peer(self).unwrap_or(false)
        {
            crate::driver::defer_error(pool.grant(accessor));
        }
    }

    /// `bytes` of this device's memory, usable by every stream of it when this returns
    /// (from the library's pool, else `cuMemAlloc`).
    pub(crate) fn alloc_memory(&self, bytes: usize) -> Result<sys::CUdeviceptr> {
        self.bind()?;
        if let Some(pool) = &self.inner.memory {
            return pool.alloc(bytes);
        }
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: the context is current (bound above; waiting for the reclaimer on the
        // out-of-memory path leaves this thread's context as it was); out-pointer to a local.
        let code = crate::lifetime::retry_after_releases(|| unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes) });
        check(code, "cuMemAlloc")?;
        Ok(ptr)
    }

    /// Free memory from [`Device::alloc_memory`] without waiting for the device.
    ///
    /// # Safety
    /// `ptr` came from `alloc_memory` of this device, is freed once, and the GPU is done with it.
    pub(crate) unsafe fn free_memory(&self, ptr: sys::CUdeviceptr) -> Result<()> {
        self.bind()?;
        match &self.inner.memory {
            // SAFETY: the caller's contract.
            Some(pool) => unsafe { pool.free(ptr) },
            // SAFETY: as above. (cuMemFree waits until every stream of the device is idle.)
            None => check(unsafe { sys::cuMemFree_v2(ptr) }, "cuMemFree"),
        }
    }

    /// The primary context handle, for driver calls that name a context.
    pub(crate) fn ctx(&self) -> CUcontext {
        self.inner.ctx
    }

    /// The driver's device handle.
    pub fn raw(&self) -> CUdevice {
        self.inner.raw
    }

    /// Idle events of this device, for stream points.
    pub(crate) fn spare_events(&self) -> &Mutex<Vec<crate::Event>> {
        &self.inner.spare_events
    }

    /// The module cache of this device.
    pub(crate) fn modules(&self) -> &Mutex<HashMap<&'static str, Arc<Module>>> {
        &self.inner.modules
    }
}

impl PartialEq for Device {
    fn eq(&self, other: &Self) -> bool {
        self.ordinal() == other.ordinal()
    }
}
impl Eq for Device {}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Device({}: {})", self.ordinal(), self.inner.info.name)
    }
}

fn query(ordinal: usize) -> Result<(DeviceInfo, CUdevice)> {
    let mut raw: CUdevice = 0;
    let ordinal_c = c_int::try_from(ordinal)
        .map_err(|_| Error::InvalidArgument { name: "ordinal", reason: format!("{ordinal} is too large") })?;
    // SAFETY: out-pointer to a local; the ordinal was range-checked by the callers.
    check(unsafe { sys::cuDeviceGet(&mut raw, ordinal_c) }, "cuDeviceGet")?;
    let attr = |a: CUdevice_attribute| -> Result<u32> {
        let mut v: c_int = 0;
        // SAFETY: out-pointer to a local, valid device handle.
        check(unsafe { sys::cuDeviceGetAttribute(&mut v, a, raw) }, "cuDeviceGetAttribute")?;
        Ok(u32::try_from(v).unwrap_or(0))
    };
    let mut name_buf = [0 as c_char; 256];
    // SAFETY: the buffer is 256 bytes and its length is passed; the driver NUL-terminates.
    check(unsafe { sys::cuDeviceGetName(name_buf.as_mut_ptr(), 256, raw) }, "cuDeviceGetName")?;
    let mut bus_buf = [0 as c_char; 64];
    // SAFETY: as above, 64 bytes.
    check(unsafe { sys::cuDeviceGetPCIBusId(bus_buf.as_mut_ptr(), 64, raw) }, "cuDeviceGetPCIBusId")?;
    let mut total = 0usize;
    // SAFETY: out-pointer to a local.
    check(unsafe { sys::cuDeviceTotalMem_v2(&mut total, raw) }, "cuDeviceTotalMem")?;
    use CUdevice_attribute::*;
    let info = DeviceInfo {
        ordinal,
        name: c_buf_to_string(&name_buf),
        compute_capability: (
            attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        ),
        total_memory: total,
        pci_bus_id: c_buf_to_string(&bus_buf),
        multiprocessors: attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
        can_map_host_memory: attr(CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY)? != 0,
        unified_addressing: attr(CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING)? != 0,
    };
    Ok((info, raw))
}

fn c_buf_to_string(buf: &[c_char]) -> String {
    let bytes: Vec<u8> = buf.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The kernels' build for a supported device: the newest it runs, or the one
/// [`PTX_TARGET_ENV`] names if the device runs that.
fn ptx_target_for(info: &DeviceInfo) -> Result<PtxTarget> {
    let forced = std::env::var(PTX_TARGET_ENV).ok().filter(|v| !v.is_empty());
    choose_ptx_target(info.compute_capability, forced.as_deref())
}

fn choose_ptx_target(capability: (u32, u32), forced: Option<&str>) -> Result<PtxTarget> {
    let newest = PtxTarget::for_capability(capability).ok_or(Error::InvalidArgument {
        name: "device",
        reason: format!("compute capability {}.{} has no build of the kernels", capability.0, capability.1),
    })?;
    let Some(name) = forced else { return Ok(newest) };
    match PtxTarget::from_name(name) {
        Some(target) if target <= newest => Ok(target),
        Some(_) => Err(Error::InvalidArgument {
            name: PTX_TARGET_ENV,
            reason: format!(
                "{name} is newer than this card (compute capability {}.{}) runs; use {} or unset it",
                capability.0,
                capability.1,
                newest.name()
            ),
        }),
        None => Err(Error::InvalidArgument {
            name: PTX_TARGET_ENV,
            reason: format!(
                "unknown PTX target {name:?}; use one of {}, or unset it",
                PtxTarget::ALL.map(PtxTarget::name).join(", ")
            ),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn support_follows_compute_capability() {
        let mut info = DeviceInfo {
            ordinal: 0,
            name: "test".into(),
            compute_capability: (7, 0),
            total_memory: 0,
            pci_bus_id: String::new(),
            multiprocessors: 1,
            can_map_host_memory: true,
            unified_addressing: true,
        };
        assert!(!info.is_supported());
        info.compute_capability = (7, 5);
        assert!(info.is_supported(), "Turing runs the compute_75 build");
        info.compute_capability = (8, 0);
        assert!(info.is_supported());
        info.compute_capability = (12, 0);
        assert!(info.is_supported());
    }

    #[test]
    fn the_forced_ptx_target_must_be_known_and_not_newer_than_the_card() {
        assert_eq!(choose_ptx_target((9, 0), None).unwrap(), PtxTarget::Compute80);
        assert_eq!(choose_ptx_target((7, 5), None).unwrap(), PtxTarget::Compute75);
        assert_eq!(choose_ptx_target((9, 0), Some("compute_75")).unwrap(), PtxTarget::Compute75);
        let newer = choose_ptx_target((7, 5), Some("compute_80")).unwrap_err().to_string();
        assert!(newer.contains(PTX_TARGET_ENV) && newer.contains("use compute_75"), "{newer}");
        let unknown = choose_ptx_target((9, 0), Some("sm_90")).unwrap_err().to_string();
        assert!(unknown.contains("unknown PTX target \"sm_90\""), "{unknown}");
        assert!(choose_ptx_target((7, 0), None).is_err());
    }

    #[test]
    fn without_a_driver_everything_is_a_value_not_a_panic() {
        if crate::is_driver_present() {
            return; // covered by the GPU suite instead
        }
        assert_eq!(Device::count(), Err(Error::NoDriver));
        assert_eq!(Device::open(0).err(), Some(Error::NoDriver));
        assert_eq!(Device::all_info().err(), Some(Error::NoDriver));
        assert_eq!(crate::driver_version(), Err(Error::NoDriver));
    }
}
