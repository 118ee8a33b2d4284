//! The fast paths of `geforce_p2p.all_reduce` and `copy_` (which `copy` takes too, into the
//! tensor it allocates), and of the communicator's `all_reduce` (in [`crate::comm`]), over
//! torch tensors: the tensors are read here, not by the Python layer, because reading them
//! there (a dozen attribute lookups per tensor, a tuple per tensor, the checks between them)
//! took about 10 us of host time per all_reduce on the device machine; here it takes 2-3
//! attribute by attribute, and about half that for a plain tensor read through torch's
//! DLPack export ([`crate::dlpack`]) in one call. The
//! Python layer calls them first, with the arguments as the user gave them: what they read
//! torch tensors with is found here once per torch module ([`Torch`]), and the op and route
//! names are parsed here.
//!
//! They take only the usual case: contiguous CUDA torch tensors of one dtype the kernels
//! take and one shape (a list or tuple of at least two on as many devices for all_reduce;
//! for copy_, two that do not overlap, with the default chunking; for the communicator, one
//! on its device), and op, route and transport names the library knows. Anything else, and
//! any error while reading, gives `False` and the Python layer reads the arguments again and
//! names what is wrong, so the refusals and their messages stay in one place. What is read
//! here is what `_tensors.describe` reads for a torch tensor, and it goes on to the same
//! native call, so the module contract of [`crate::ffi`] holds as it does for the Python
//! layer's calls.

use std::str::FromStr;
use std::sync::{Arc, Mutex};

use geforce_p2p::{CopyOptions, DType};
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyList, PyString, PyTuple};
use pyo3::{intern, types::PyAnyMethods};

use crate::args::{self, Memory};
use crate::dlpack;
use crate::error::Raised;
use crate::ffi::collective_calls::all_reduce_checked;
use crate::ffi::{check_disjoint, copy_checked};

/// What reading a tensor gives: `Ok(None)` where the Python layer must read it (an ordinary
/// exception included: it reads again and says what is wrong), `Err` for an exception that
/// is not an `Exception` (KeyboardInterrupt, SystemExit), raised as it came.
type Read<T> = PyResult<Option<T>>;

/// `r` as a [`Read`]: a value, `None` for an ordinary exception, or the exception to raise.
fn soft<T>(py: Python<'_>, r: PyResult<T>) -> Read<T> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.is_instance_of::<PyException>(py) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The value of a [`soft`] read, or return `Ok(None)` (or the exception) from the function.
macro_rules! read {
    ($py:expr, $e:expr) => {
        match soft($py, $e)? {
            Some(v) => v,
            None => return Ok(None),
        }
    };
}

/// What the fast paths read torch tensors with, as one tuple (`_tensors.torch_fast_parts`):
/// `torch.Tensor`; `torch.strided`, the one layout taken; `torch._C._cuda_getCurrentRawStream`,
/// a device's current stream as an integer; torch dtype → kernel dtype name (None where the
/// kernels do not take it), as the Python layer has learnt them; `torch._C._to_dlpack`, or
/// None where torch has none (every tensor is then read attribute by attribute); and the
/// kernel dtype names whose DLPack type code no other torch dtype is exported with (`int4`
/// shares `int8`'s, for one), which a DLPack read may take from the code alone. Found here
/// once per torch module ([`Torch::find`]); tests pass their own.
#[derive(FromPyObject)]
pub(crate) struct TorchParts(Py<PyAny>, Py<PyAny>, Py<PyAny>, Py<PyDict>, Option<Py<PyAny>>, Vec<String>);

/// [`TorchParts`] as the reads use them: the DLPack names parsed once.
pub(crate) struct Parts {
    tensor_type: Py<PyAny>,
    strided: Py<PyAny>,
    current_stream: Py<PyAny>,
    dtype_names: Py<PyDict>,
    to_dlpack: Option<Py<PyAny>>,
    unshared_code_dtypes: Vec<DType>,
    /// The module's `empty_like`, where the parts were found here rather than given.
    empty_like: Option<Py<PyAny>>,
    /// The module's `is_grad_enabled`, likewise.
    grad_enabled: Option<Py<PyAny>>,
}

impl From<TorchParts> for Parts {
    fn from(TorchParts(tensor_type, strided, current_stream, dtype_names, to_dlpack, unshared): TorchParts) -> Parts {
        let unshared_code_dtypes = unshared.iter().filter_map(|name| DType::from_str(name).ok()).collect();
        Parts {
            tensor_type,
            strided,
            current_stream,
            dtype_names,
            to_dlpack,
            unshared_code_dtypes,
            empty_like: None,
            grad_enabled: None,
        }
    }
}

/// The parts of the torch module that `sys.modules` last named, kept across calls: finding
/// them in Python took about 1 us of host time a call (more after the device was idle).
struct TorchCache {
    module: Py<PyAny>,
    /// None where that torch has no raw-stream getter: its tensors are read in Python.
    parts: Option<Arc<Parts>>,
    /// Torch dtypes seen so far and their kernel dtypes (None: not taken), by identity
    /// (torch's dtypes are singletons; holding them keeps each identity unique).
    dtypes: Vec<(Py<PyAny>, Option<DType>)>,
}

/// Read and written only while attached to the interpreter, in short sections that run no
/// Python code, so it is never contended.
static TORCH: Mutex<Option<TorchCache>> = Mutex::new(None);

/// Where the parts came from: the caller, or the cache (whose learnt dtypes then apply).
pub(crate) struct Torch {
    parts: Arc<Parts>,
    cached: bool,
    /// Whether plain tensors are read through torch's DLPack export, where it has one.
    dlpack: bool,
}

impl Torch {
    /// The parts `given` by the caller, else those of the torch module `sys.modules` holds
    /// now, found once per module (see [`Read`]; `None` where torch is not imported or has no
    /// raw-stream getter).
    pub(crate) fn find(py: Python<'_>, given: Option<TorchParts>) -> Read<Torch> {
        if let Some(parts) = given {
            return Ok(Some(Torch { parts: Arc::new(parts.into()), cached: false, dlpack: true }));
        }
        static MODULES: PyOnceLock<Py<PyDict>> = PyOnceLock::new();
        let modules = read!(py, MODULES.import(py, "sys", "modules"));
        let Some(module) = read!(py, modules.get_item(intern!(py, "torch"))) else {
            return Ok(None);
        };
        let cached = {
            let cache = lock(&TORCH);
            cache.as_ref().filter(|c| c.module.is(&module)).map(|c| c.parts.clone())
        };
        if let Some(parts) = cached {
            return Ok(parts.map(|parts| Torch { parts, cached: true, dlpack: true }));
        }
        // A module not seen before: the Python layer says what its parts are.
        let tensors = read!(py, crate::package::import(py, "_tensors"));
        let found = read!(py, tensors.call_method1(intern!(py, "torch_fast_parts"), (&module,)));
        // Only the servers' out-of-place call needs it, and says so where it is missing.
        let empty_like = soft(py, module.getattr(intern!(py, "empty_like")))?.map(Bound::unbind);
        let grad_enabled = soft(py, module.getattr(intern!(py, "is_grad_enabled")))?.map(Bound::unbind);
        let parts: Option<Arc<Parts>> = read!(py, found.extract::<Option<TorchParts>>())
            .map(|p| Arc::new(Parts { empty_like, grad_enabled, ..p.into() }));
        let kept = parts.clone();
        let replaced = lock(&TORCH).replace(TorchCache { module: module.unbind(), parts: kept, dtypes: Vec::new() });
        drop(replaced); // outside the lock: letting go of the old module's parts may run Python code
        Ok(parts.map(|parts| Torch { parts, cached: true, dlpack: true }))
    }

    /// The kernel dtype of the torch dtype `dtype` (see [`Read`]; `None` where the kernels do
    /// not take it or the Python layer has not learnt it yet).
    fn kernel_dtype(&self, dtype: &Bound<'_, PyAny>) -> Read<DType> {
        let py = dtype.py();
        if self.cached {
            let cache = lock(&TORCH);
            let learnt = cache.as_ref().and_then(|c| c.dtypes.iter().find(|(d, _)| d.is(dtype)));
            if let Some(&(_, kernel)) = learnt {
                return Ok(kernel);
            }
        }
        let Some(name) = read!(py, self.parts.dtype_names.bind(py).get_item(dtype)) else {
            return Ok(None); // not learnt yet: the Python layer learns it
        };
        let kernel = if name.is_none() { None } else { DType::from_str(&read!(py, name.extract::<String>())).ok() };
        if self.cached {
            if let Some(cache) = lock(&TORCH).as_mut() {
                cache.dtypes.push((dtype.clone().unbind(), kernel));
            }
        }
        Ok(kernel)
    }

    /// Read every tensor attribute by attribute, as a subclass is (for the benchmarks, which
    /// set the two reads side by side).
    pub(crate) fn read_by_attributes(&mut self) {
        self.dlpack = false;
    }

    /// `torch.empty_like` of this torch module (None where the caller gave the parts).
    pub(crate) fn empty_like<'py>(&self, py: Python<'py>) -> Option<&Bound<'py, PyAny>> {
        self.parts.empty_like.as_ref().map(|f| f.bind(py))
    }

    /// Whether torch records no gradients now (`torch.no_grad()` or `torch.inference_mode()`;
    /// `false` where the caller gave the parts, or torch could not say).
    pub(crate) fn grad_off(&self, py: Python<'_>) -> bool {
        let Some(enabled) = &self.parts.grad_enabled else {
            return false;
        };
        enabled.bind(py).call0().and_then(|on| on.extract::<bool>()).is_ok_and(|on| !on)
    }

    /// `device`'s current torch stream, as a raw handle.
    pub(crate) fn current_stream(&self, py: Python<'_>, device: usize) -> PyResult<u64> {
        self.parts.current_stream.bind(py).call1((device,))?.extract()
    }
}

/// `mutex` locked; a poisoned one (a panic while it was held, which the sections above
/// cannot raise) is taken as it is.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// One torch tensor as the fast paths take it: a contiguous, strided CUDA tensor of a dtype
/// the kernels take, with at least one element.
pub(crate) struct CudaTensor {
    pub(crate) dtype: DType,
    shape: Vec<i64>,
    pub(crate) len: usize,
    pub(crate) memory: Memory,
}

/// `t` read as a [`CudaTensor`] (see [`Read`]): a plain `torch.Tensor` by one DLPack export
/// where this torch's is trusted (about a quarter of the host time of reading its attributes
/// one by one), anything else (a subclass, whose attributes may be its own) attribute by
/// attribute. `stream_of` is a tensor already read in this call: one on the same device has
/// the same current stream, which is not asked for again.
pub(crate) fn cuda_tensor(t: &Bound<'_, PyAny>, torch: &Torch, stream_of: Option<&CudaTensor>) -> Read<CudaTensor> {
    let py = t.py();
    let Some((dtype, shape, len, device, ptr)) = tensor_fields(t, torch)? else {
        return Ok(None);
    };
    let stream = match stream_of {
        Some(other) if other.memory.device == device => other.memory.stream,
        _ => read!(py, torch.current_stream(py, device)),
    };
    Ok(Some(CudaTensor { dtype, shape, len, memory: Memory { device, ptr, stream } }))
}

/// What [`cuda_tensor`] reads of `t` before its stream, which a check that enqueues nothing
/// does not need.
pub(crate) fn tensor_fields(t: &Bound<'_, PyAny>, torch: &Torch) -> Read<Fields> {
    let py = t.py();
    match &torch.parts.to_dlpack {
        Some(to_dlpack) if torch.dlpack && t.get_type().is(torch.parts.tensor_type.bind(py)) => {
            by_dlpack(t, to_dlpack.bind(py), torch)
        }
        _ => by_attributes(t, torch),
    }
}

/// What a read of one tensor gives before its stream: `(dtype, shape, elements, device, address)`.
pub(crate) type Fields = (DType, Vec<i64>, usize, usize, u64);

/// `t`, a plain torch tensor, through `to_dlpack` (torch's `_to_dlpack`, which refuses what
/// has no storage, sparse tensors among them).
fn by_dlpack(t: &Bound<'_, PyAny>, to_dlpack: &Bound<'_, PyAny>, torch: &Torch) -> Read<Fields> {
    let py = t.py();
    let capsule = read!(py, to_dlpack.call1((t,)));
    let dl = read!(py, dlpack::read(&capsule));
    drop(capsule); // its destructor frees torch's export; `t` keeps the memory
    if dl.device_type != dlpack::DL_CUDA || !dl.contiguous() {
        return Ok(None);
    }
    let dtype = match dl.dtype() {
        Some(named) if torch.parts.unshared_code_dtypes.contains(&named) => named,
        // A code torch gives another dtype too (int4's is int8's), or none the kernels take:
        // the torch dtype by identity.
        _ => match torch.kernel_dtype(&read!(py, t.getattr(intern!(py, "dtype"))))? {
            Some(dtype) => dtype,
            None => return Ok(None),
        },
    };
    let (Some(len), Ok(device)) = (dl.len(), usize::try_from(dl.device_id)) else {
        return Ok(None);
    };
    if len == 0 {
        return Ok(None);
    }
    Ok(Some((dtype, dl.shape, len, device, dl.ptr)))
}

/// `t`, any torch tensor, attribute by attribute.
fn by_attributes(t: &Bound<'_, PyAny>, torch: &Torch) -> Read<Fields> {
    let py = t.py();
    let parts = &torch.parts;
    if !read!(py, t.is_instance(parts.tensor_type.bind(py)))
        || !read!(py, t.getattr(intern!(py, "layout"))).is(parts.strided.bind(py))
        || !read!(py, t.getattr(intern!(py, "is_cuda")).and_then(|b| b.is_truthy()))
        || !read!(py, t.call_method0(intern!(py, "is_contiguous")).and_then(|b| b.is_truthy()))
    {
        return Ok(None);
    }
    let Some(dtype) = torch.kernel_dtype(&read!(py, t.getattr(intern!(py, "dtype"))))? else {
        return Ok(None);
    };
    let len: usize = read!(py, t.call_method0(intern!(py, "numel")).and_then(|n| n.extract()));
    if len == 0 {
        return Ok(None);
    }
    let shape: Vec<i64> = read!(py, t.getattr(intern!(py, "shape")).and_then(|s| s.extract()));
    let device: usize = read!(py, t.call_method0(intern!(py, "get_device")).and_then(|d| d.extract()));
    let ptr: u64 = read!(py, t.call_method0(intern!(py, "data_ptr")).and_then(|p| p.extract()));
    Ok(Some((dtype, shape, len, device, ptr)))
}

/// Whether `t` has `like`'s dtype and shape. (Kernel dtypes and torch's are one to one.)
fn alike(t: &CudaTensor, like: &CudaTensor) -> bool {
    t.dtype == like.dtype && t.shape == like.shape
}

/// Whether `copy_` may take `dst` and `src` here: ranges the native checks accept, apart
/// where they share a device. Anything else goes to the Python layer, which names it.
fn apart(dst: &CudaTensor, src: &CudaTensor) -> bool {
    let valid = |t: &CudaTensor| args::check_range("", t.memory.ptr, t.len, t.dtype).is_ok();
    let at = |t: &CudaTensor| [(t.memory.device, t.memory.ptr)];
    valid(dst) && valid(src) && check_disjoint("src", &at(src), src.len, "dst", &at(dst), dst.len, src.dtype).is_ok()
}

/// The ranks of an all_reduce read from torch tensors: `(dtype, elements, memories, the
/// tensors)`, the tensors held so that none is freed while the call runs without the GIL
/// (another thread may empty the list meanwhile). See [`Read`].
#[allow(clippy::type_complexity)]
fn torch_ranks<'py>(
    objs: &Bound<'py, PyAny>,
    torch: &Torch,
) -> Read<(DType, usize, Vec<Memory>, Vec<Bound<'py, PyAny>>)> {
    // Exactly a list or tuple: a subclass may iterate otherwise than its storage reads, and
    // the Python layer iterates.
    let items: Vec<Bound<'py, PyAny>> = if let Ok(list) = objs.cast_exact::<PyList>() {
        list.iter().collect()
    } else if let Ok(tuple) = objs.cast_exact::<PyTuple>() {
        tuple.iter().collect()
    } else {
        return Ok(None);
    };
    if items.len() < 2 {
        return Ok(None);
    }
    let Some(first) = cuda_tensor(&items[0], torch, None)? else {
        return Ok(None);
    };
    let mut ranks = vec![first.memory];
    for t in &items[1..] {
        let Some(t) = cuda_tensor(t, torch, None)? else {
            return Ok(None);
        };
        if !alike(&t, &first) || ranks.iter().any(|m| m.device == t.memory.device) {
            return Ok(None);
        }
        ranks.push(t.memory);
    }
    Ok(Some((first.dtype, first.len, ranks, items)))
}

/// A choice argument (a route, an op) as `parse` reads it, or `None` for anything else: the
/// Python layer then names what is wrong.
pub(crate) fn choice<T>(value: &Bound<'_, PyAny>, parse: impl FnOnce(&str) -> Result<T, Raised>) -> Option<T> {
    // Exactly a str: the Python layer reads a subclass through its own `lower()`.
    let text = value.cast_exact::<PyString>().ok()?.to_cow().ok()?;
    parse(&text).ok()
}

/// `read_torch(t, parts=None)`: `t` read as the fast paths read it, for tests:
/// `(device, address, shape, dtype name, current stream)` of a contiguous CUDA tensor the
/// kernels take, with at least one element; None for anything else. (The Python layer
/// reads tensors itself: a native call of its own per tensor saved it nothing.)
#[pyfunction]
#[pyo3(signature = (t, parts=None))]
#[allow(clippy::type_complexity)]
pub(crate) fn read_torch<'py>(
    py: Python<'py>,
    t: &Bound<'py, PyAny>,
    parts: Option<TorchParts>,
) -> PyResult<Option<(usize, u64, Bound<'py, PyTuple>, &'static str, u64)>> {
    let Some(torch) = Torch::find(py, parts)? else {
        return Ok(None);
    };
    let Some(t) = cuda_tensor(t, &torch, None)? else {
        return Ok(None);
    };
    let shape = PyTuple::new(py, &t.shape)?;
    Ok(Some((t.memory.device, t.memory.ptr, shape, t.dtype.name(), t.memory.stream)))
}

/// `copy_(dst, src)` of two torch tensors on the GPUs, read here with the torch `parts`
/// found once per module (or given, by tests): `False` where the Python layer must read
/// them or `route` (nothing was enqueued then), `True` once the copy is enqueued on both
/// tensors' current streams. Errors of the library raise as from `_native.copy`.
#[pyfunction]
#[pyo3(signature = (dst, src, route, parts=None))]
pub(crate) fn copy_torch<'py>(
    py: Python<'py>,
    dst: &Bound<'py, PyAny>,
    src: &Bound<'py, PyAny>,
    route: &Bound<'py, PyAny>,
    parts: Option<TorchParts>,
) -> PyResult<bool> {
    let Some(route) = choice(route, args::route) else {
        return Ok(false);
    };
    let Some(torch) = Torch::find(py, parts)? else {
        return Ok(false);
    };
    let Some(d) = cuda_tensor(dst, &torch, None)? else {
        return Ok(false);
    };
    let Some(s) = cuda_tensor(src, &torch, Some(&d))? else {
        return Ok(false);
    };
    // Overlapping tensors on one device are refused by the Python layer, in its words.
    // (`dst` and `src` are held by the caller's frame for the whole call.)
    if !alike(&d, &s) || !apart(&d, &s) {
        return Ok(false);
    }
    let options = CopyOptions { route, chunk_bytes: None, slots: None };
    let run = || copy_checked(s.dtype, s.len, &s.memory, &d.memory, options).map(|_| ());
    Raised::detached(py, run).map(|()| true)
}

/// `all_reduce` over torch tensors read here (`parts` as for [`copy_torch`]): `False` where
/// the Python layer must read them, `op` or `transport` (nothing was enqueued then); `True`
/// once the all-reduce is enqueued on the tensors' current streams. Errors of the library
/// raise as from `_native.all_reduce`.
#[pyfunction]
#[pyo3(signature = (tensors, op, transport, parts=None))]
pub(crate) fn all_reduce_torch<'py>(
    py: Python<'py>,
    tensors: &Bound<'py, PyAny>,
    op: &Bound<'py, PyAny>,
    transport: &Bound<'py, PyAny>,
    parts: Option<TorchParts>,
) -> PyResult<bool> {
    let (Some(op), Some(receive)) = (choice(op, args::op), choice(transport, args::receive)) else {
        return Ok(false);
    };
    let Some(torch) = Torch::find(py, parts)? else {
        return Ok(false);
    };
    let Some((dtype, len, ranks, _held)) = torch_ranks(tensors, &torch)? else {
        return Ok(false);
    };
    let run = || all_reduce_checked(dtype, len, &ranks, op, receive);
    Raised::detached(py, run).map(|()| true)
}
