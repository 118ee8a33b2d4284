//! The servers' out-of-place all-reduce's outputs, made ahead a batch at a time.
//!
//! A server's `custom_all_reduce` returns a new tensor, and `torch.empty_like` alone took
//! 2.6-4.8 us of host time a call on the device machine (`server_host_parts.py`), more than
//! everything else the server-facing object adds to the communicator's call. So small
//! outputs are made several at a time: one `new_empty` of `count` outputs stacked, split by
//! one `unbind` into `count` tensors, each handed out once, by later calls on the same shape,
//! dtype and stream. Nothing is ever handed out twice: each output is its own slice of the
//! batch's memory, which torch frees once the batch's last tensor is gone.
//!
//! Only where the result serves as `empty_like`'s would:
//! - where torch records no gradients: under `torch.inference_mode()` (vLLM's model runner;
//!   views of inference tensors carry no autograd record) or `torch.no_grad()` (sglang's,
//!   unless `SGLANG_ENABLE_TORCH_INFERENCE_MODE` is set). Where gradients are recorded an
//!   output of `unbind` could not be written in place by an operation that records them.
//!   Under `no_grad` the output is a view of its batch (`_base` is set), so such a write
//!   later, with gradients on, raises as it does for any view made under `no_grad`; servers
//!   never record gradients. Its storage is the batch's in either mode;
//! - on a stream that is not capturing a CUDA graph: a captured call's output comes from the
//!   graph's memory pool, which the graph reuses between its parts;
//! - up to [`MAX_BYTES`] a tensor, [`BATCH_BYTES`] a batch and [`SHAPES`] shapes at once, so
//!   the memory held ahead stays at most 4 MiB (and a result kept long keeps at most its batch).
//!
//! A batch for a shape not seen before is small, and each refill of the same shape doubles
//! it (up to [`MAX_COUNT`]), so calls whose shape keeps changing do not pay for batches they
//! never use.

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

/// The largest output made ahead, in bytes: above it the all-reduce's own GPU time hides
/// the host's.
pub(crate) const MAX_BYTES: usize = 64 << 10;
/// The most bytes one batch takes.
const BATCH_BYTES: usize = 1 << 20;
/// The most outputs one batch holds.
const MAX_COUNT: usize = 32;
/// The first batch's outputs for a shape.
const FIRST_COUNT: usize = 4;
/// The most shapes kept at once; the one used longest ago goes first.
const SHAPES: usize = 4;

// What the module's docs promise: at most 4 MiB held ahead.
const _: () = assert!(SHAPES * BATCH_BYTES <= 4 << 20);

/// An output made ahead: the tensor and its address.
pub(crate) type Output = (Py<PyAny>, u64);

/// Outputs made ahead, by shape, torch dtype and stream, most recently used last.
#[derive(Default)]
pub(crate) struct Outputs {
    shapes: Vec<Shape>,
}

/// The outputs of one shape, dtype and stream not handed out yet.
struct Shape {
    dims: Vec<i64>,
    /// Held, so its identity stays unique (torch's dtypes are singletons).
    dtype: Py<PyAny>,
    stream: u64,
    /// Handed out from the end.
    ready: Vec<Output>,
    /// How many outputs the next batch of this shape holds.
    next_count: usize,
}

impl Outputs {
    /// An output made ahead for this shape, torch dtype and stream, and how many outputs a
    /// new batch would hold where there is none (the shape then counts as just used).
    pub(crate) fn take(&mut self, dims: &[i64], dtype: &Bound<'_, PyAny>, stream: u64) -> Result<Output, usize> {
        let Some(at) = self.position(dims, dtype, stream) else {
            return Err(FIRST_COUNT);
        };
        let mut shape = self.shapes.remove(at);
        let taken = shape.ready.pop().ok_or(shape.next_count);
        self.shapes.push(shape);
        taken
    }

    /// Where this shape, torch dtype and stream are kept, if they are.
    fn position(&self, dims: &[i64], dtype: &Bound<'_, PyAny>, stream: u64) -> Option<usize> {
        self.shapes.iter().position(|s| s.dims == dims && s.dtype.is(dtype) && s.stream == stream)
    }

    /// Keep `ready` (a new batch's outputs past the one handed out now) for this shape, the
    /// next batch to hold twice `count`; returns what goes out to make room, to be dropped
    /// once no lock is held (dropping tensors may run Python code).
    pub(crate) fn keep(
        &mut self,
        dims: &[i64],
        dtype: &Bound<'_, PyAny>,
        stream: u64,
        ready: Vec<Output>,
        count: usize,
    ) -> Vec<Output> {
        let next_count = (count * 2).min(MAX_COUNT);
        let mut gone = Vec::new();
        if let Some(at) = self.position(dims, dtype, stream) {
            gone.extend(self.shapes.remove(at).ready);
        }
        if self.shapes.len() >= SHAPES {
            gone.extend(self.shapes.remove(0).ready);
        }
        let dtype = dtype.clone().unbind();
        self.shapes.push(Shape { dims: dims.to_vec(), dtype, stream, ready, next_count });
        gone
    }

    /// Every output not handed out yet (to drop once no lock is held).
    pub(crate) fn clear(&mut self) -> Vec<Output> {
        self.shapes.drain(..).flat_map(|s| s.ready).collect()
    }

    /// How many outputs are held ready (for the tests).
    pub(crate) fn held(&self) -> usize {
        self.shapes.iter().map(|s| s.ready.len()).sum()
    }
}

/// How many outputs of `bytes` a batch holds where [`Outputs::take`] asked for `count`
/// (within [`BATCH_BYTES`]); fewer than two: none are made ahead.
pub(crate) fn batch_count(count: usize, bytes: usize) -> usize {
    if bytes == 0 || bytes > MAX_BYTES {
        return 0;
    }
    count.min(BATCH_BYTES / bytes).min(MAX_COUNT)
}

/// `count` new outputs shaped like `tensor` (`dims`, `bytes` each), in one allocation on the
/// current stream, in the order they are to be handed out (the first last). `None` where torch
/// did not give `count` contiguous outputs side by side on `device`.
pub(crate) fn make(
    tensor: &Bound<'_, PyAny>,
    dims: &[i64],
    bytes: usize,
    count: usize,
    device: usize,
) -> PyResult<Option<Vec<Output>>> {
    let py = tensor.py();
    let stacked: Vec<i64> = std::iter::once(count as i64).chain(dims.iter().copied()).collect();
    let stacked = PyTuple::new(py, stacked)?;
    let batch = tensor.call_method1(intern!(py, "new_empty"), (stacked,))?;
    let base: u64 = batch.call_method0(intern!(py, "data_ptr"))?.extract()?;
    let total: usize = batch.getattr(intern!(py, "nbytes"))?.extract()?;
    let on: i64 = batch.call_method0(intern!(py, "get_device"))?.extract()?;
    let contiguous: bool = batch.call_method0(intern!(py, "is_contiguous"))?.extract()?;
    if base == 0 || total != count * bytes || on != device as i64 || !contiguous {
        return Ok(None);
    }
    let parts = batch.call_method1(intern!(py, "unbind"), (0,))?;
    let parts = parts.cast::<PyTuple>()?;
    if parts.len() != count {
        return Ok(None);
    }
    let mut outputs: Vec<Output> =
        parts.iter().enumerate().map(|(i, part)| (part.unbind(), base + (i * bytes) as u64)).collect();
    outputs.reverse();
    Ok(Some(outputs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use pyo3::types::{PyInt, PyString};

    /// `count` stand-ins for outputs (Python ints), at addresses 0x1000 apart.
    fn ready(py: Python<'_>, count: usize, from: u64) -> Vec<Output> {
        (0..count as u64).map(|i| (PyInt::new(py, from + i).into_any().unbind(), 0x1000 * (from + i))).collect()
    }

    fn value(output: &Output, py: Python<'_>) -> u64 {
        output.0.bind(py).extract().unwrap()
    }

    #[test]
    fn each_output_is_handed_out_once_and_batches_double_per_shape_dtype_and_stream() {
        Python::initialize();
        Python::attach(|py| {
            let (f32, bf16) = (PyString::new(py, "f32").into_any(), PyString::new(py, "bf16").into_any());
            let mut outputs = Outputs::default();
            assert_eq!(outputs.take(&[512], &f32, 7).err(), Some(FIRST_COUNT), "none yet: a first batch");
            assert!(outputs.keep(&[512], &f32, 7, ready(py, 3, 1), FIRST_COUNT).is_empty());
            let taken: Vec<u64> = (0..3).map(|_| value(&outputs.take(&[512], &f32, 7).unwrap(), py)).collect();
            assert_eq!(taken, [3, 2, 1], "from the end, each once");
            assert_eq!(outputs.take(&[512], &f32, 7).err(), Some(2 * FIRST_COUNT), "the next batch twice as big");
            outputs.keep(&[512], &f32, 7, ready(py, 2, 10), 16);
            assert_eq!(outputs.take(&[512], &f32, 7).err(), None);
            for (dims, dtype, stream) in [(&[8, 64][..], &f32, 7), (&[512][..], &bf16, 7), (&[512][..], &f32, 8)] {
                assert_eq!(outputs.take(dims, dtype, stream).err(), Some(FIRST_COUNT), "{dims:?} is another key");
            }
            outputs.take(&[512], &f32, 7).unwrap();
            assert_eq!(outputs.take(&[512], &f32, 7).err(), Some(MAX_COUNT), "16 doubled, at most MAX_COUNT");
        });
    }

    #[test]
    fn at_most_shapes_are_kept_and_the_one_used_longest_ago_goes_first() {
        Python::initialize();
        Python::attach(|py| {
            let f32 = PyString::new(py, "f32").into_any();
            let mut outputs = Outputs::default();
            for shape in 0..SHAPES as i64 {
                assert!(outputs.keep(&[shape], &f32, 0, ready(py, 2, 100 * shape as u64), 4).is_empty());
            }
            assert_eq!(outputs.held(), 2 * SHAPES);
            outputs.take(&[0], &f32, 0).unwrap(); // shape 0 used last now: shape 1 goes first
            let gone = outputs.keep(&[99], &f32, 0, ready(py, 3, 900), 4);
            assert_eq!(gone.iter().map(|o| value(o, py)).collect::<Vec<_>>(), [100, 101], "shape 1's two");
            assert_eq!(outputs.held(), 1 + 2 * (SHAPES - 2) + 3);
            let gone = outputs.keep(&[0], &f32, 0, ready(py, 2, 500), 4);
            assert_eq!(gone.len(), 1, "a refill replaces what was left of its shape");
            let held = outputs.held();
            assert_eq!(outputs.clear().len(), held, "clear gives back every one");
            assert_eq!(outputs.held(), 0);
        });
    }

    #[test]
    fn a_batch_stays_within_its_bytes_and_count_and_big_outputs_are_made_one_by_one() {
        assert_eq!(batch_count(4, 2048), 4);
        assert_eq!(batch_count(64, 2048), MAX_COUNT, "at most MAX_COUNT");
        assert_eq!(batch_count(32, MAX_BYTES), BATCH_BYTES / MAX_BYTES, "at most BATCH_BYTES");
        assert_eq!(batch_count(4, MAX_BYTES + 16), 0, "past MAX_BYTES: none ahead");
        assert_eq!(batch_count(4, 0), 0);
    }
}
