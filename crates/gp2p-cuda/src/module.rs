//! PTX modules, loaded once per device and cached, and kernel launches.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::ffi::{CString, c_void};
use std::sync::Arc;

use cudarc::driver::sys::{self, CUfunction, CUmodule};
use gp2p_kernels::{KernelFamily, PtxModule};
use parking_lot::Mutex;

use crate::driver::check;
use crate::{Device, Error, Result, Stream};

/// A PTX module loaded into one device's primary context. Obtained with [`Module::load`],
/// which caches it: the JIT compile happens once per device and process.
pub struct Module {
    device: Device,
    name: &'static str,
    raw: CUmodule,
    functions: Mutex<HashMap<&'static str, CUfunction>>,
    /// Whether [`Module::warm_once`] has run; held while it runs.
    warmed: Mutex<bool>,
}

// SAFETY: CUmodule and CUfunction are opaque driver handles, usable from any thread; the
// function cache is behind a Mutex.
unsafe impl Send for Module {}
// SAFETY: as above.
unsafe impl Sync for Module {}

impl Module {
    /// The reduce kernels, in the build `device` runs ([`Device::ptx_target`]); as
    /// [`Module::kernels`] of [`KernelFamily::Reduce`].
    pub fn reduce_kernels(device: &Device) -> Result<Arc<Module>> {
        Module::kernels(device, KernelFamily::Reduce)
    }

    /// The kernels of `family`, in the build `device` runs ([`Device::ptx_target`]).
    ///
    /// The first call on a device loads every family's module, not only this one: a module
    /// load may wait for the device to go idle, and the exchange kernels spin until their
    /// peer's kernel runs, so a load of another family between two ranks' launches (a first
    /// flag wait, say) could hold up the second launch until the first kernel's timeout.
    /// Later calls only look the module up.
    pub fn kernels(device: &Device, family: KernelFamily) -> Result<Arc<Module>> {
        let target = device.ptx_target();
        let wanted = target.module(family);
        if let Some(module) = device.modules().lock().get(wanted.name) {
            return Ok(module.clone());
        }
        for other in KernelFamily::ALL {
            Module::load(device, target.module(other))?;
        }
        Module::load(device, wanted)
    }

    /// The module `ptx` on `device`, loaded (and JIT-compiled by the driver) on first use.
    /// Loads that one module only: the kernels of this crate are loaded by family, all at
    /// once ([`Module::kernels`]).
    pub fn load(device: &Device, ptx: PtxModule) -> Result<Arc<Module>> {
        let mut cache = device.modules().lock();
        if let Some(module) = cache.get(ptx.name) {
            return Ok(module.clone());
        }
        let image = CString::new(ptx.ptx).map_err(|_| Error::InvalidArgument {
            name: "ptx",
            reason: format!("module {} contains a NUL byte", ptx.name),
        })?;
        device.bind()?;
        let mut raw: CUmodule = std::ptr::null_mut();
        // SAFETY: the context is current; the image is a NUL-terminated PTX string that the
        // driver copies during the call.
        check(unsafe { sys::cuModuleLoadData(&mut raw, image.as_ptr().cast()) }, "cuModuleLoadData")?;
        let module = Arc::new(Module {
            device: device.clone(),
            name: ptx.name,
            raw,
            functions: Mutex::new(HashMap::new()),
            warmed: Mutex::new(false),
        });
        cache.insert(ptx.name, module.clone());
        Ok(module)
    }

    /// Run `warm` once for this module (concurrent first callers wait for it): for loading
    /// every kernel up front, see `reduce.rs`.
    pub(crate) fn warm_once(self: &Arc<Self>, warm: impl FnOnce(&Arc<Module>) -> Result<()>) -> Result<()> {
        let mut warmed = self.warmed.lock();
        if !*warmed {
            warm(self)?;
            *warmed = true;
        }
        Ok(())
    }

    /// Look up a kernel by name (cached).
    pub fn function(self: &Arc<Self>, name: &'static str) -> Result<Function> {
        let mut functions = self.functions.lock();
        let raw = match functions.get(name) {
            Some(&f) => f,
            None => {
                let c_name = CString::new(name).map_err(|_| Error::InvalidArgument {
                    name: "name",
                    reason: "kernel names contain no NUL".into(),
                })?;
                let mut f: CUfunction = std::ptr::null_mut();
                self.device.bind()?;
                // SAFETY: live module, NUL-terminated name, out-pointer to a local.
                let code = unsafe { sys::cuModuleGetFunction(&mut f, self.raw, c_name.as_ptr()) };
                if code == sys::CUresult::CUDA_ERROR_NOT_FOUND {
                    return Err(Error::KernelNotFound { name, module: self.name });
                }
                check(code, "cuModuleGetFunction")?;
                functions.insert(name, f);
                f
            }
        };
        Ok(Function { module: self.clone(), name, raw })
    }

    /// The device this module is loaded on.
    pub fn device(&self) -> &Device {
        &self.device
    }
}

/// Grid and block shape of a launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Blocks in the (1-D) grid.
    pub grid: u32,
    /// Threads per block.
    pub block: u32,
    /// Dynamic shared memory bytes.
    pub shared_bytes: u32,
}

/// A kernel of a loaded [`Module`].
#[derive(Clone)]
pub struct Function {
    module: Arc<Module>,
    name: &'static str,
    raw: CUfunction,
}

// SAFETY: CUfunction is an opaque driver handle, usable from any thread.
unsafe impl Send for Function {}
// SAFETY: as above.
unsafe impl Sync for Function {}

impl Function {
    /// The kernel's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    pub(crate) fn raw(&self) -> CUfunction {
        self.raw
    }

    /// The device whose context the kernel is loaded in.
    pub fn device(&self) -> &Device {
        &self.module.device
    }

    /// Refuse a launch on another device's stream, or of an empty grid.
    pub(crate) fn check_launch(&self, stream: &Stream, config: LaunchConfig) -> Result<()> {
        if stream.device() != &self.module.device {
            return Err(Error::WrongDevice {
                what: "kernel module",
                got: self.module.device.ordinal(),
                expected: stream.device().ordinal(),
            });
        }
        if config.grid == 0 || config.block == 0 {
            return Err(Error::InvalidArgument { name: "config", reason: format!("empty launch {config:?}") });
        }
        Ok(())
    }

    /// Enqueue the kernel on `stream`.
    ///
    /// # Safety
    /// `params` must point to one value per kernel parameter, of exactly the parameter's type
    /// and in order; every pointer among them must be valid for what the kernel does with it
    /// until the kernel completes.
    pub unsafe fn launch(&self, stream: &Stream, config: LaunchConfig, params: &mut [*mut c_void]) -> Result<()> {
        self.check_launch(stream, config)?;
        self.module.device.bind()?;
        // SAFETY: live function and stream of the current context; params per the contract.
        let code = unsafe {
            sys::cuLaunchKernel(
                self.raw,
                config.grid,
                1,
                1,
                config.block,
                1,
                1,
                config.shared_bytes,
                stream.raw(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        check(code, "cuLaunchKernel")
    }
}
