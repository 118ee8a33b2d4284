//! The in-process collectives' native calls (`all_reduce`, its compressed form, `broadcast`,
//! `all_gather`, `reduce_scatter`): their arguments checked, then the views built by the
//! parent module's callers, under the contract the parent module states.

use geforce_p2p::collectives::{self, Receive, WireFormat};
use geforce_p2p::{DType, Element, ReduceOp};
use pyo3::prelude::*;

use super::{Placed, by_dtype, check_disjoint, open_all, ranks_of, sources_of};
use crate::args::{self, Memory, MemoryArg, memories};
use crate::error::Raised;

/// The collectives that work in place on one buffer per rank.
#[derive(Clone, Copy)]
enum InPlace {
    AllReduce(ReduceOp),
    Broadcast { root: usize },
}

/// Run an in-place collective over the ranks' `len` elements of `T`: all_reduce and
/// broadcast open their callers and views alike and differ only in the call.
fn in_place_t<T: Element>(ranks: &[Memory], len: usize, what: InPlace, receive: Receive) -> Result<(), Raised> {
    let callers = open_all(ranks)?;
    let mut views = ranks_of::<T>(&callers, ranks, len);
    let engine = geforce_p2p::collectives();
    match what {
        InPlace::AllReduce(op) => collectives::all_reduce(engine, &mut views, op, receive)?,
        InPlace::Broadcast { root } => collectives::broadcast(engine, &mut views, root, receive)?,
    }
    Ok(())
}

/// In place: every rank's `len` elements become `op` over all ranks'. One rank per device.
#[pyfunction]
#[pyo3(signature = (dtype, len, ranks, op, transport="auto"))]
pub(crate) fn all_reduce(
    py: Python<'_>,
    dtype: &str,
    len: usize,
    ranks: Vec<MemoryArg>,
    op: &str,
    transport: &str,
) -> PyResult<()> {
    let ranks = memories(ranks);
    let run = || all_reduce_checked(args::dtype(dtype)?, len, &ranks, args::op(op)?, args::receive(transport)?);
    Raised::detached(py, run)
}

/// The all-reduce of [`all_reduce`] (and of the torch fast path) once its arguments are
/// parsed: the ranks checked, then the all-reduce enqueued.
pub(crate) fn all_reduce_checked(
    dtype: DType,
    len: usize,
    ranks: &[Memory],
    op: ReduceOp,
    receive: Receive,
) -> Result<(), Raised> {
    args::check_ranks("tensors", ranks, len, dtype)?;
    by_dtype!(dtype, in_place_t(ranks, len, InPlace::AllReduce(op), receive))
}

fn compressed_t<T: Element>(ranks: &[Memory], len: usize, op: ReduceOp, format: WireFormat) -> Result<(), Raised> {
    let callers = open_all(ranks)?;
    let mut views = ranks_of::<T>(&callers, ranks, len);
    collectives::all_reduce_compressed(geforce_p2p::collectives(), &mut views, op, format)?;
    Ok(())
}

/// In place, compressed: every rank's `len` elements become the sum (or avg) of all ranks',
/// sent as one-byte codes (`compress`: `int8`, `fp8`) in blocks of `block` values.
#[pyfunction]
pub(crate) fn all_reduce_compressed(
    py: Python<'_>,
    dtype: &str,
    len: usize,
    ranks: Vec<MemoryArg>,
    op: &str,
    compress: &str,
    block: usize,
) -> PyResult<()> {
    let ranks = memories(ranks);
    let run = || {
        let (dtype, op, format) = (args::dtype(dtype)?, args::op(op)?, args::wire_format(compress, block)?);
        args::check_ranks("tensors", &ranks, len, dtype)?;
        by_dtype!(dtype, compressed_t(&ranks, len, op, format))
    };
    Raised::detached(py, run)
}

/// The collectives whose inputs and outputs differ in length by the rank count.
#[derive(Clone, Copy)]
enum Segmented {
    AllGather,
    ReduceScatter(ReduceOp),
}

fn segmented_t<T: Element>(
    inputs: &[u64],
    in_len: usize,
    outputs: &[Memory],
    out_len: usize,
    what: Segmented,
    receive: Receive,
) -> Result<(), Raised> {
    let callers = open_all(outputs)?;
    let sources = sources_of::<T>(&callers, inputs, in_len);
    let mut ranks = ranks_of::<T>(&callers, outputs, out_len);
    let engine = geforce_p2p::collectives();
    match what {
        Segmented::AllGather => collectives::all_gather(engine, &sources, &mut ranks, receive)?,
        Segmented::ReduceScatter(op) => collectives::reduce_scatter(engine, &sources, &mut ranks, op, receive)?,
    }
    Ok(())
}

/// Every output (n × `in_len` elements) becomes the concatenation of all inputs (`in_len`
/// each), in rank order; input r is on output r's device.
#[pyfunction]
#[pyo3(signature = (dtype, in_len, inputs, outputs, transport="auto"))]
pub(crate) fn all_gather(
    py: Python<'_>,
    dtype: &str,
    in_len: usize,
    inputs: Vec<u64>,
    outputs: Vec<MemoryArg>,
    transport: &str,
) -> PyResult<()> {
    let outputs = memories(outputs);
    let run = || -> Result<(), Raised> {
        let (dtype, receive) = (args::dtype(dtype)?, args::receive(transport)?);
        let out_len = args::times("outputs", outputs.len(), in_len)?;
        check_segmented(&inputs, in_len, &outputs, out_len, dtype)?;
        by_dtype!(dtype, segmented_t(&inputs, in_len, &outputs, out_len, Segmented::AllGather, receive))
    };
    Raised::detached(py, run)
}

/// Output r (`out_len` elements) becomes `op` over segment r of every input (n × `out_len`
/// each); input r is on output r's device and is left unchanged.
#[pyfunction]
#[pyo3(signature = (dtype, out_len, inputs, outputs, op, transport="auto"))]
pub(crate) fn reduce_scatter(
    py: Python<'_>,
    dtype: &str,
    out_len: usize,
    inputs: Vec<u64>,
    outputs: Vec<MemoryArg>,
    op: &str,
    transport: &str,
) -> PyResult<()> {
    let outputs = memories(outputs);
    let run = || -> Result<(), Raised> {
        let (dtype, op, receive) = (args::dtype(dtype)?, args::op(op)?, args::receive(transport)?);
        let in_len = args::times("inputs", outputs.len(), out_len)?;
        check_segmented(&inputs, in_len, &outputs, out_len, dtype)?;
        by_dtype!(dtype, segmented_t(&inputs, in_len, &outputs, out_len, Segmented::ReduceScatter(op), receive))
    };
    Raised::detached(py, run)
}

/// Every rank's `len` elements become a copy of rank `root`'s. One rank per device.
#[pyfunction]
#[pyo3(signature = (dtype, len, ranks, root, transport="auto"))]
pub(crate) fn broadcast(
    py: Python<'_>,
    dtype: &str,
    len: usize,
    ranks: Vec<MemoryArg>,
    root: usize,
    transport: &str,
) -> PyResult<()> {
    let ranks = memories(ranks);
    let run = || -> Result<(), Raised> {
        let (dtype, receive) = (args::dtype(dtype)?, args::receive(transport)?);
        args::check_ranks("tensors", &ranks, len, dtype)?;
        if root >= ranks.len() {
            return Err(Raised::argument("root", format!("{root} is out of range for {} tensors", ranks.len())));
        }
        by_dtype!(dtype, in_place_t(&ranks, len, InPlace::Broadcast { root }, receive))
    };
    Raised::detached(py, run)
}

/// The checks of a gather or scatter, before any work: one output of `out_len` elements per
/// device, one input of `in_len` per output (on its device), and no input overlapping an
/// output.
fn check_segmented(
    inputs: &[u64],
    in_len: usize,
    outputs: &[Memory],
    out_len: usize,
    dtype: DType,
) -> Result<(), Raised> {
    args::check_ranks("outputs", outputs, out_len, dtype)?;
    args::check_inputs("inputs", inputs, outputs.len(), in_len, dtype)?;
    let (ins, outs) = on_devices(inputs, outputs);
    check_disjoint("inputs", &ins, in_len, "outputs", &outs, out_len, dtype)
}

/// Pair each input address with its output's device.
fn on_devices(inputs: &[u64], outputs: &[Memory]) -> (Vec<Placed>, Vec<Placed>) {
    let ins = inputs.iter().zip(outputs).map(|(&p, m)| (m.device, p)).collect();
    let outs = outputs.iter().map(|m| (m.device, m.ptr)).collect();
    (ins, outs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gathers_and_scatters_check_outputs_inputs_and_overlap() {
        let f = DType::F32;
        let out = |device, ptr| Memory { device, ptr, stream: 0 };
        let outputs = [out(0, 0x1000), out(1, 0x1000)];
        // Inputs of 2 f32 beside outputs of 4: an all_gather over two ranks.
        assert_eq!(check_segmented(&[0x100, 0x100], 2, &outputs, 4, f), Ok(()), "same address, other device");
        let missing = check_segmented(&[0x100], 2, &outputs, 4, f).expect_err("one input for two outputs");
        assert!(missing.message.contains("1 tensors for 2"), "{}", missing.message);
        let shared = check_segmented(&[0x100, 0x200], 2, &[out(0, 0x1000), out(0, 0x2000)], 4, f)
            .expect_err("two outputs on one device");
        assert!(shared.message.contains("outputs[0] and outputs[1] are both on cuda:0"), "{}", shared.message);
        let inside = check_segmented(&[0x1008, 0x100], 2, &outputs, 4, f).expect_err("inputs[0] inside outputs[0]");
        assert!(inside.message.contains("inputs[0] overlaps outputs[0] on cuda:0"), "{}", inside.message);
    }
}
