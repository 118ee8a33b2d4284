//! A compressed all-reduce's wire crossing between device memory, where the kernels of
//! [`gp2p_cuda::codec`] encode, fold and decode it, and pinned host memory: a DMA of its
//! scales and codes and a kernel for the values of its exact blocks, so only the bytes a
//! reader uses cross the link.
#![allow(unsafe_code)]

use gp2p_cuda::codec::WireFormat;
use gp2p_cuda::raw;
use gp2p_cuda::{DeviceView, DeviceViewMut, Stream};

use crate::{Error, PinnedView, PinnedViewMut, Result};

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
    unsafe {
        raw::wire_to_host(stream, format.block, wire.raw_ptr(), values, host.host_mut_ptr(), mapped, |_| Ok(()))?
    };
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
    unsafe { raw::wire_from_host(stream, format.block, host.host_ptr(), mapped, values, wire.raw_ptr(), |_| Ok(()))? };
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
