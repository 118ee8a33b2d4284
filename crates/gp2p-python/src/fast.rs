//! The fast paths of `geforce_p2p.all_reduce` and `copy_`, and of the communicator's
//! `all_reduce` (in [`crate::comm`]), over torch tensors: the tensors are read here, not by
//! the Python layer, because reading them there (a dozen attribute lookups per tensor, a
//! tuple per tensor, the checks between them) took about 10 us of host time per all_reduce
//! on the device machine; here it takes 2-3.
//!
//! They take only the usual case: contiguous CUDA torch tensors of one dtype the kernels
//! take and one shape, each on another device (a list or tuple of at least two for
//! all_reduce; for copy_, the default chunking; for the communicator, one on its device).
//! Anything else, and any error while reading, gives `False` and the Python layer reads the
//! tensors again and names what is wrong, so the refusals and their messages stay in one
//! place. What is read here is what
//! `_tensors.describe` reads for a torch tensor, and it goes on to the same native call, so
//! the module contract of [`crate::ffi`] holds as it does for the Python layer's calls.

use std::str::FromStr;

use geforce_p2p::{CopyOptions, DType};
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use pyo3::{intern, types::PyAnyMethods};

use crate::args::{self, Memory};
use crate::error::Raised;
use crate::ffi::{all_reduce_checked, copy_checked};

/// What the Python layer hands over for reading torch tensors (`_tensors.torch_fast_args`,
/// found once per torch module), as one tuple: `torch.Tensor`; `torch.strided`, the one
/// layout taken; `torch._C._cuda_getCurrentRawStream`, a device's current stream as an
/// integer; and torch dtype → kernel dtype name (None where the kernels do not take it), as
/// the Python layer has learnt them.
#[derive(FromPyObject)]
pub(crate) struct TorchParts<'py>(Bound<'py, PyAny>, Bound<'py, PyAny>, Bound<'py, PyAny>, Bound<'py, PyDict>);

impl<'py> TorchParts<'py> {
    fn tensor_type(&self) -> &Bound<'py, PyAny> {
        &self.0
    }
    fn strided(&self) -> &Bound<'py, PyAny> {
        &self.1
    }
    fn current_stream(&self) -> &Bound<'py, PyAny> {
        &self.2
    }
    fn dtype_names(&self) -> &Bound<'py, PyDict> {
        &self.3
    }
}

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

/// One torch tensor as the fast paths take it: a contiguous, strided CUDA tensor of a dtype
/// the kernels take, with at least one element.
pub(crate) struct CudaTensor<'py> {
    dtype_obj: Bound<'py, PyAny>,
    pub(crate) dtype: DType,
    shape: Bound<'py, PyAny>,
    pub(crate) len: usize,
    pub(crate) memory: Memory,
}

/// `t` read as a [`CudaTensor`] (see [`Read`]).
pub(crate) fn cuda_tensor<'py>(t: &Bound<'py, PyAny>, parts: &TorchParts<'py>) -> Read<CudaTensor<'py>> {
    let py = t.py();
    if !read!(py, t.is_instance(parts.tensor_type()))
        || !read!(py, t.getattr(intern!(py, "layout"))).is(parts.strided())
        || !read!(py, t.getattr(intern!(py, "is_cuda")).and_then(|b| b.is_truthy()))
        || !read!(py, t.call_method0(intern!(py, "is_contiguous")).and_then(|b| b.is_truthy()))
    {
        return Ok(None);
    }
    let dtype_obj = read!(py, t.getattr(intern!(py, "dtype")));
    let Some(name) = read!(py, parts.dtype_names().get_item(&dtype_obj)) else {
        return Ok(None); // not learnt yet: the Python layer learns it
    };
    let Ok(dtype) = DType::from_str(&read!(py, name.extract::<String>())) else {
        return Ok(None);
    };
    let len: usize = read!(py, t.call_method0(intern!(py, "numel")).and_then(|n| n.extract()));
    if len == 0 {
        return Ok(None);
    }
    let shape = read!(py, t.getattr(intern!(py, "shape")));
    let device: usize = read!(py, t.call_method0(intern!(py, "get_device")).and_then(|d| d.extract()));
    let stream: u64 = read!(py, parts.current_stream().call1((device,)).and_then(|s| s.extract()));
    let ptr: u64 = read!(py, t.call_method0(intern!(py, "data_ptr")).and_then(|p| p.extract()));
    Ok(Some(CudaTensor { dtype_obj, dtype, shape, len, memory: Memory { device, ptr, stream } }))
}

/// Whether `t` has `like`'s dtype and shape (see [`Read`]).
fn alike(t: &CudaTensor<'_>, like: &CudaTensor<'_>) -> Read<bool> {
    let py = t.shape.py();
    Ok(Some(t.dtype_obj.is(&like.dtype_obj) && read!(py, t.shape.eq(&like.shape))))
}

/// The ranks of an all_reduce read from torch tensors: `(dtype, elements, memories, the
/// tensors)`, the tensors held so that none is freed while the call runs without the GIL
/// (another thread may empty the list meanwhile). See [`Read`].
#[allow(clippy::type_complexity)]
fn torch_ranks<'py>(
    objs: &Bound<'py, PyAny>,
    parts: &TorchParts<'py>,
) -> Read<(DType, usize, Vec<Memory>, Vec<Bound<'py, PyAny>>)> {
    let items: Vec<Bound<'py, PyAny>> = if let Ok(list) = objs.cast::<PyList>() {
        list.iter().collect()
    } else if let Ok(tuple) = objs.cast::<PyTuple>() {
        tuple.iter().collect()
    } else {
        return Ok(None);
    };
    if items.len() < 2 {
        return Ok(None);
    }
    let Some(first) = cuda_tensor(&items[0], parts)? else {
        return Ok(None);
    };
    let mut ranks = vec![first.memory];
    for t in &items[1..] {
        let Some(t) = cuda_tensor(t, parts)? else {
            return Ok(None);
        };
        if alike(&t, &first)? != Some(true) || ranks.iter().any(|m| m.device == t.memory.device) {
            return Ok(None);
        }
        ranks.push(t.memory);
    }
    Ok(Some((first.dtype, first.len, ranks, items)))
}

/// `copy_(dst, src)` of two torch tensors on two devices, read here: `False` where the
/// Python layer must read them (nothing was enqueued then), `True` once the copy is
/// enqueued on both tensors' current streams. Errors of the library raise as from
/// `_native.copy`.
#[pyfunction]
pub(crate) fn copy_torch(
    py: Python<'_>,
    dst: &Bound<'_, PyAny>,
    src: &Bound<'_, PyAny>,
    route: &str,
    parts: TorchParts<'_>,
) -> PyResult<bool> {
    let (Some(d), Some(s)) = (cuda_tensor(dst, &parts)?, cuda_tensor(src, &parts)?) else {
        return Ok(false);
    };
    // One device: the Python layer checks the two do not overlap first. (`dst` and `src`
    // are held by the caller's frame for the whole call.)
    if alike(&d, &s)? != Some(true) || d.memory.device == s.memory.device {
        return Ok(false);
    }
    let run = || -> Result<(), Raised> {
        let options = CopyOptions { route: args::route(route)?, chunk_bytes: None, slots: None };
        copy_checked(s.dtype, s.len, &s.memory, &d.memory, options).map(|_| ())
    };
    Raised::detached(py, run).map(|()| true)
}

/// `all_reduce` over torch tensors read here: `False` where the Python layer must read them
/// (nothing was enqueued then); `True` once the all-reduce is enqueued on the tensors' current
/// streams. Errors of the library raise as from `_native.all_reduce`.
#[pyfunction]
pub(crate) fn all_reduce_torch(
    py: Python<'_>,
    tensors: &Bound<'_, PyAny>,
    op: &str,
    transport: &str,
    parts: TorchParts<'_>,
) -> PyResult<bool> {
    let Some((dtype, len, ranks, _held)) = torch_ranks(tensors, &parts)? else {
        return Ok(false);
    };
    let run = || all_reduce_checked(dtype, len, &ranks, args::op(op)?, args::receive(transport)?);
    Raised::detached(py, run).map(|()| true)
}
