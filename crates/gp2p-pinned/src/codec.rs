//! The compressed all-reduce's codec with its wires in pinned host memory: the kernels of
//! [`gp2p_cuda::codec`] writing and reading the wire through the device's mapping of that
//! memory, so a wire crosses the link once, inside the kernel, with no copy beside it.
#![allow(unsafe_code)]

use gp2p_cuda::codec::{WireFormat, fold_wire_addresses};
use gp2p_cuda::raw::{self, Codec};
use gp2p_cuda::{DeviceView, DeviceViewMut, Stream};
use gp2p_kernels::Element;

use crate::{Error, PinnedView, PinnedViewMut, Result};

fn codec<T: Element>(format: WireFormat) -> Codec {
    Codec { dtype: T::DTYPE, format: format.format, block: format.block }
}

fn on_stream(stream: &Stream, what: &'static str, ordinal: usize) -> Result<()> {
    let expected = stream.device().ordinal();
    if ordinal == expected { Ok(()) } else { Err(Error::WrongDevice { what, got: ordinal, of: "stream", expected }) }
}

fn holds(what: &'static str, got: usize, needed: usize) -> Result<()> {
    if got >= needed {
        Ok(())
    } else {
        Err(Error::InvalidArgument {
            name: what,
            reason: format!(
                "{got} bytes, but the wire needs {needed}: pass a view of WireFormat::wire_bytes(values) bytes or more"
            ),
        })
    }
}

/// Enqueue `wire = encode(src)` on `stream`, the kernel writing the wire into pinned host
/// memory. `wire` holds at least [`WireFormat::wire_bytes`] of `src.len()`; `T` is f32, f16
/// or bf16. Asynchronous; the wire's buffer waits for the kernel before host access.
pub fn encode_to_host<T: Element>(
    stream: &Stream,
    format: WireFormat,
    src: &DeviceView<'_, T>,
    wire: &mut PinnedViewMut<'_, u8>,
) -> Result<()> {
    on_stream(stream, "src", src.device().ordinal())?;
    holds("wire", wire.len(), format.wire_bytes(src.len()))?;
    let mapped = wire.device_ptr(stream.device())?;
    // SAFETY: src is on the stream's device; `mapped` addresses the wire's bytes (enough of
    // them, checked) as this device sees them, host memory apart from src. Both note the
    // point below, so neither is freed nor the wire handed to the host before the kernel ends.
    unsafe { raw::compress_encode(stream, codec::<T>(format), src.raw_ptr(), src.len(), mapped)? };
    let point = stream.point()?;
    src.note_use(&point);
    wire.note_use(&point);
    Ok(())
}

/// Enqueue `out = encode(fold)` on `stream`, as [`gp2p_cuda::codec::fold_encode`] with the
/// other ranks' wires in pinned host memory: the fold, in rank order, of `own` (rank
/// `owner`'s values, exact) and each other rank r's `wires[r]` (`wires[owner]` is `None`),
/// times the f32 reciprocal of the ranks for `average`, encoded into `out`, in device memory:
/// the owner decodes its own result from there, so it never reads it back across the link.
pub fn fold_encode_from_host<T: Element>(
    stream: &Stream,
    format: WireFormat,
    own: &DeviceView<'_, T>,
    wires: &[Option<PinnedView<'_, u8>>],
    owner: usize,
    average: bool,
    out: &mut DeviceViewMut<'_, u8>,
) -> Result<()> {
    let len = own.len();
    on_stream(stream, "own", own.device().ordinal())?;
    on_stream(stream, "out", out.device().ordinal())?;
    holds("out", out.len(), format.wire_bytes(len))?;
    let mut placed = Vec::with_capacity(wires.len());
    for wire in wires {
        placed.push(match wire {
            Some(w) => Some((w.device_ptr(stream.device())?, w.len())),
            None => None,
        });
    }
    let addresses = fold_wire_addresses(format, len, owner, &placed)?;
    // SAFETY: own and out are on the stream's device; every address maps pinned host memory
    // of the checked length into this device; `out` is exclusive, so apart from what the
    // kernel reads. All note the point below.
    unsafe {
        raw::compress_fold_encode(
            stream,
            codec::<T>(format),
            own.raw_ptr(),
            len,
            &addresses,
            owner,
            average,
            out.raw_ptr(),
        )?
    };
    let point = stream.point()?;
    own.note_use(&point);
    wires.iter().flatten().for_each(|w| w.note_use(&point));
    out.note_use(&point);
    Ok(())
}

/// Enqueue `dst = decode(wire)` on `stream`, the kernel reading the wire out of pinned host
/// memory, each value rounded once to `T`. `wire` is a wire of `dst.len()` values made with
/// this format.
pub fn decode_from_host<T: Element>(
    stream: &Stream,
    format: WireFormat,
    wire: &PinnedView<'_, u8>,
    dst: &mut DeviceViewMut<'_, T>,
) -> Result<()> {
    on_stream(stream, "dst", dst.device().ordinal())?;
    holds("wire", wire.len(), format.wire_bytes(dst.len()))?;
    let mapped = wire.device_ptr(stream.device())?;
    // SAFETY: dst is on the stream's device; `mapped` addresses enough wire bytes (checked) as
    // this device sees them, host memory apart from dst. Both note the point below.
    unsafe { raw::compress_decode(stream, codec::<T>(format), mapped, dst.len(), dst.raw_ptr())? };
    let point = stream.point()?;
    wire.note_use(&point);
    dst.note_use(&point);
    Ok(())
}

/// Enqueue a copy of `wire`, a wire of `values` values made in device memory with this
/// format, into `host` on `stream`: a DMA of its words and codes, then a kernel that copies
/// the values of the blocks that travel exact (writing nothing where there are none). So
/// about 1 + 4/block bytes a value cross the link, where a copy of the whole room would carry
/// 4 bytes a value more. The rest of `host`'s room is left as it is; a reader of the wire
/// never looks there.
pub fn copy_wire_to_host(
    stream: &Stream,
    format: WireFormat,
    values: usize,
    wire: &DeviceView<'_, u8>,
    host: &mut PinnedViewMut<'_, u8>,
) -> Result<()> {
    check_crossing(stream, format, values, wire.device().ordinal(), wire.len(), host.len())?;
    let mapped = host.device_ptr(stream.device())?;
    // SAFETY: `wire` is on the stream's device and `host` pinned memory this device maps
    // (`mapped`), both holding the wire's room (checked), apart (a view is exclusive); both
    // note the point below.
    unsafe { raw::wire_to_host(stream, format.block, wire.raw_ptr(), values, host.host_mut_ptr(), mapped)? };
    let point = stream.point()?;
    wire.note_use(&point);
    host.note_use(&point);
    Ok(())
}

/// Enqueue a copy of `host`, a wire of `values` values in pinned host memory made with this
/// format, into `wire` in device memory on `stream`: a DMA of its words and codes, then a
/// kernel that copies the values of its blocks that travel exact, reading the words the DMA
/// put in `wire`. What crosses the link is what [`copy_wire_to_host`] sent.
pub fn copy_wire_from_host(
    stream: &Stream,
    format: WireFormat,
    values: usize,
    host: &PinnedView<'_, u8>,
    wire: &mut DeviceViewMut<'_, u8>,
) -> Result<()> {
    check_crossing(stream, format, values, wire.device().ordinal(), wire.len(), host.len())?;
    let mapped = host.device_ptr(stream.device())?;
    // SAFETY: as in copy_wire_to_host, directions swapped.
    unsafe { raw::wire_from_host(stream, format.block, host.host_ptr(), mapped, values, wire.raw_ptr())? };
    let point = stream.point()?;
    wire.note_use(&point);
    host.note_use(&point);
    Ok(())
}

/// What both crossings check: the device wire on the stream's device, and both rooms holding a
/// wire of `values` values.
fn check_crossing(
    stream: &Stream,
    format: WireFormat,
    values: usize,
    wire_device: usize,
    wire_bytes: usize,
    host_bytes: usize,
) -> Result<()> {
    on_stream(stream, "wire", wire_device)?;
    let need = format.wire_bytes(values);
    holds("wire", wire_bytes, need)?;
    holds("host", host_bytes, need)
}
