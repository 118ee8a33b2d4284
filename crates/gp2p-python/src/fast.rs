//! The fast paths of `geforce_p2p.all_reduce` and `copy_` over torch tensors: the tensors
//! are read here, not by the Python layer, because reading them there (a dozen attribute
//! lookups per tensor, a tuple per tensor, the checks between them) took about 10 us of host
//! time per all_reduce on the device machine; here it takes 2-3.
//!
//! They take only the usual case: contiguous CUDA torch tensors of one dtype the kernels
//! take and one shape, each on another device (a list or tuple of at least two for
//! all_reduce; for copy_, the default chunking). Anything else, and any error while reading,
//! gives `False` and the Python layer reads the tensors again and names what is wrong, so
//! the refusals and their messages stay in one place. What is read here is what
//! `_tensors.describe` reads for a torch tensor, and it goes on to the same native call, so
//! the module contract of [`crate::ffi`] holds as it does for the Python layer's calls.

use std::str::FromStr;

use geforce_p2p::{CopyOptions, DType};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use pyo3::{intern, types::PyAnyMethods};

use crate::args::{self, Memory};
use crate::error::Raised;
use crate::ffi::{InPlace, by_dtype, copy_t, in_place_t};

/// What the Python layer hands over for reading torch tensors, found once per torch module.
struct TorchParts<'a, 'py> {
    /// `torch.Tensor`.
    tensor_type: &'a Bound<'py, PyAny>,
    /// `torch._C._cuda_getCurrentRawStream`: a device's current stream as an integer.
    current_stream: &'a Bound<'py, PyAny>,
    /// Torch dtype → kernel dtype name (or None where the kernels do not take it), as the
    /// Python layer has learnt them.
    dtype_names: &'a Bound<'py, PyDict>,
}

/// One torch tensor as the fast paths take it: a contiguous CUDA tensor of a dtype the
/// kernels take, with at least one element.
struct CudaTensor<'py> {
    dtype_obj: Bound<'py, PyAny>,
    dtype: DType,
    shape: Bound<'py, PyAny>,
    len: usize,
    memory: Memory,
}

/// `t` read as a [`CudaTensor`], or `None` where the Python layer must read it.
fn cuda_tensor<'py>(t: &Bound<'py, PyAny>, parts: &TorchParts<'_, 'py>) -> Option<CudaTensor<'py>> {
    let py = t.py();
    if !t.is_instance(parts.tensor_type).ok()?
        || !t.getattr(intern!(py, "is_cuda")).ok()?.is_truthy().ok()?
        || !t.call_method0(intern!(py, "is_contiguous")).ok()?.is_truthy().ok()?
    {
        return None;
    }
    let dtype_obj = t.getattr(intern!(py, "dtype")).ok()?;
    let name = parts.dtype_names.get_item(&dtype_obj).ok()??;
    let dtype = DType::from_str(&name.extract::<String>().ok()?).ok()?;
    let len: usize = t.call_method0(intern!(py, "numel")).ok()?.extract().ok()?;
    if len == 0 {
        return None;
    }
    let shape = t.getattr(intern!(py, "shape")).ok()?;
    let device: usize = t.call_method0(intern!(py, "get_device")).ok()?.extract().ok()?;
    let stream: u64 = parts.current_stream.call1((device,)).ok()?.extract().ok()?;
    let ptr: u64 = t.call_method0(intern!(py, "data_ptr")).ok()?.extract().ok()?;
    Some(CudaTensor { dtype_obj, dtype, shape, len, memory: Memory { device, ptr, stream } })
}

/// Whether `t` has `like`'s dtype and shape.
fn alike(t: &CudaTensor<'_>, like: &CudaTensor<'_>) -> Option<bool> {
    Some(t.dtype_obj.is(&like.dtype_obj) && t.shape.eq(&like.shape).ok()?)
}

/// The ranks of an all_reduce read from torch tensors: `(dtype, elements, memories)`, or
/// `None` where the Python layer must read them (see the module docs).
fn torch_ranks(objs: &Bound<'_, PyAny>, parts: &TorchParts<'_, '_>) -> Option<(DType, usize, Vec<Memory>)> {
    let items: Vec<Bound<'_, PyAny>> = if let Ok(list) = objs.cast::<PyList>() {
        list.iter().collect()
    } else {
        objs.cast::<PyTuple>().ok()?.iter().collect()
    };
    if items.len() < 2 {
        return None;
    }
    let first = cuda_tensor(&items[0], parts)?;
    let mut ranks = vec![first.memory];
    for t in &items[1..] {
        let t = cuda_tensor(t, parts)?;
        if !alike(&t, &first)? || ranks.iter().any(|m| m.device == t.memory.device) {
            return None;
        }
        ranks.push(t.memory);
    }
    Some((first.dtype, first.len, ranks))
}

/// `copy_(dst, src)` of two torch tensors on two devices, read here: `False` where the
/// Python layer must read them (nothing was enqueued then), `True` once the copy is
/// enqueued on both tensors' current streams. Errors of the library raise as from
/// `_native.copy`.
#[pyfunction]
#[pyo3(signature = (dst, src, route, tensor_type, current_stream, dtype_names))]
pub(crate) fn copy_torch(
    py: Python<'_>,
    dst: &Bound<'_, PyAny>,
    src: &Bound<'_, PyAny>,
    route: &str,
    tensor_type: &Bound<'_, PyAny>,
    current_stream: &Bound<'_, PyAny>,
    dtype_names: &Bound<'_, PyDict>,
) -> PyResult<bool> {
    let parts = TorchParts { tensor_type, current_stream, dtype_names };
    let read = || {
        let (d, s) = (cuda_tensor(dst, &parts)?, cuda_tensor(src, &parts)?);
        // One device: the Python layer checks the two do not overlap first.
        (alike(&d, &s)? && d.memory.device != s.memory.device).then_some((s.dtype, s.len, s.memory, d.memory))
    };
    let Some((dtype, len, src, dst)) = read() else {
        return Ok(false);
    };
    let run = || -> Result<(), Raised> {
        let options = CopyOptions { route: args::route(route)?, chunk_bytes: None, slots: None };
        args::check_range("src", src.ptr, len, dtype)?;
        args::check_range("dst", dst.ptr, len, dtype)?;
        by_dtype!(dtype, copy_t(&src, &dst, len, options)).map(|_| ())
    };
    Raised::detached(py, run).map(|()| true)
}

/// `all_reduce` over torch tensors read here: `False` where the Python layer must read them
/// (nothing was enqueued then); `True` once the all-reduce is enqueued on the tensors' current
/// streams. Errors of the library raise as from `_native.all_reduce`.
#[pyfunction]
#[pyo3(signature = (tensors, op, transport, tensor_type, current_stream, dtype_names))]
pub(crate) fn all_reduce_torch(
    py: Python<'_>,
    tensors: &Bound<'_, PyAny>,
    op: &str,
    transport: &str,
    tensor_type: &Bound<'_, PyAny>,
    current_stream: &Bound<'_, PyAny>,
    dtype_names: &Bound<'_, PyDict>,
) -> PyResult<bool> {
    let parts = TorchParts { tensor_type, current_stream, dtype_names };
    let Some((dtype, len, ranks)) = torch_ranks(tensors, &parts) else {
        return Ok(false);
    };
    let run = || -> Result<(), Raised> {
        let (op, receive) = (args::op(op)?, args::receive(transport)?);
        args::check_ranks("tensors", &ranks, len, dtype)?;
        by_dtype!(dtype, in_place_t(&ranks, len, InPlace::AllReduce(op), receive))
    };
    Raised::detached(py, run).map(|()| true)
}
