//! The compressed all-reduce's block codec on typed views: the checked launches of
//! [`crate::raw::compress_encode`], [`crate::raw::compress_fold_encode`],
//! [`crate::raw::compress_fold_decode`] and [`crate::raw::compress_decode`]. A wire is a byte view laid out as
//! [`gp2p_kernels::compress::WireLayout`] says, on 16 bytes.
#![allow(unsafe_code)]

use gp2p_kernels::Element;
use gp2p_kernels::compress::{BlockSize, Format};

use crate::raw::Codec;
use crate::{DeviceView, DeviceViewMut, Error, RawDevicePtr, Result, Stream};

/// How values travel: the format of scaled blocks and the values per block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WireFormat {
    /// int8 or fp8 e4m3 codes.
    pub format: Format,
    /// Values per block, one scale each.
    pub block: BlockSize,
}

impl WireFormat {
    /// Bytes a wire of `len` values takes.
    pub fn wire_bytes(self, len: usize) -> usize {
        gp2p_kernels::compress::WireLayout { values: len, block: self.block }.bytes()
    }

    fn codec<T: Element>(self) -> Codec {
        Codec { dtype: T::DTYPE, format: self.format, block: self.block }
    }
}

fn on_stream(stream: &Stream, what: &'static str, device: &crate::Device) -> Result<()> {
    if device == stream.device() {
        Ok(())
    } else {
        Err(Error::WrongDevice { what, got: device.ordinal(), expected: stream.device().ordinal() })
    }
}

fn holds(what: &'static str, got: usize, expected: usize) -> Result<()> {
    if got >= expected { Ok(()) } else { Err(Error::LengthMismatch { what, got, expected }) }
}

/// Enqueue `wire = encode(src)` on `stream`. `wire` holds at least
/// [`WireFormat::wire_bytes`] of `src.len()`; `T` is f32, f16 or bf16.
pub fn encode<T: Element>(
    stream: &Stream,
    format: WireFormat,
    src: &DeviceView<'_, T>,
    wire: &mut DeviceViewMut<'_, u8>,
) -> Result<()> {
    on_stream(stream, "src", src.device())?;
    on_stream(stream, "wire", wire.device())?;
    holds("wire", wire.len(), format.wire_bytes(src.len()))?;
    // SAFETY: both views are on the stream's device, `wire` large enough (checked); a
    // DeviceViewMut is exclusive, so `wire` and `src` are apart.
    unsafe { crate::raw::compress_encode(stream, format.codec::<T>(), src.raw_ptr(), src.len(), wire.raw_ptr())? };
    let point = stream.point()?;
    src.note_use(&point);
    wire.note_use(&point);
    Ok(())
}

/// Enqueue `out = encode(fold)` on `stream`: the fold, in rank order, of `own` (rank
/// `owner`'s values, exact) and each other rank r's `wires[r]` (a wire of `own.len()` values
/// made by [`encode`] with this format; `wires[owner]` is `None`), times the f32 reciprocal of
/// the ranks for `average`. Every rank that decodes `out` gets the same bits.
pub fn fold_encode<T: Element>(
    stream: &Stream,
    format: WireFormat,
    own: &DeviceView<'_, T>,
    wires: &[Option<&DeviceView<'_, u8>>],
    owner: usize,
    average: bool,
    out: &mut DeviceViewMut<'_, u8>,
) -> Result<()> {
    let len = own.len();
    on_stream(stream, "own", own.device())?;
    on_stream(stream, "out", out.device())?;
    holds("out", out.len(), format.wire_bytes(len))?;
    let mut placed = Vec::with_capacity(wires.len());
    for wire in wires {
        if let Some(wire) = wire {
            on_stream(stream, "wires", wire.device())?;
        }
        placed.push(wire.map(|w| (w.raw_ptr(), w.len())));
    }
    let addresses = fold_wire_addresses(format, len, owner, &placed)?;
    // SAFETY: every view is on the stream's device and large enough (checked); `out` is
    // exclusive, so apart from the shared views it reads.
    unsafe {
        crate::raw::compress_fold_encode(
            stream,
            format.codec::<T>(),
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

/// Enqueue `dst = fold` on `stream`: the fold, in rank order, of every rank r's values decoded
/// from `wires[r]` (a wire of `dst.len()` values made by [`encode`] with this format), times
/// the f32 reciprocal of the ranks for `average`, rounded once to `T`: the one-shot compressed
/// all-reduce's result, the same bits wherever the same wires are folded.
pub fn fold_decode<T: Element>(
    stream: &Stream,
    format: WireFormat,
    wires: &[&DeviceView<'_, u8>],
    average: bool,
    dst: &mut DeviceViewMut<'_, T>,
) -> Result<()> {
    let len = dst.len();
    on_stream(stream, "dst", dst.device())?;
    for wire in wires {
        on_stream(stream, "wires", wire.device())?;
        holds("wires", wire.len(), format.wire_bytes(len))?;
    }
    let addresses: Vec<RawDevicePtr> = wires.iter().map(|w| w.raw_ptr()).collect();
    // SAFETY: every view is on the stream's device and large enough (checked); `dst` is
    // exclusive, so apart from the shared views it reads.
    unsafe { crate::raw::compress_fold_decode(stream, format.codec::<T>(), &addresses, len, average, dst.raw_ptr())? };
    let point = stream.point()?;
    wires.iter().for_each(|w| w.note_use(&point));
    dst.note_use(&point);
    Ok(())
}

/// The addresses [`fold_encode`]'s kernel reads, in rank order (0 for the owner), from each
/// rank's wire as an address and its length in bytes: checked that `owner` is one of the
/// ranks, its entry is `None` (its values are exact, not a wire) and every other rank's wire
/// holds `len` values in `format`. For the launchers of wires in other memory
/// (`gp2p_pinned`'s host wires) as for this module's.
pub fn fold_wire_addresses(
    format: WireFormat,
    len: usize,
    owner: usize,
    wires: &[Option<(RawDevicePtr, usize)>],
) -> Result<Vec<RawDevicePtr>> {
    if owner >= wires.len() {
        return Err(Error::InvalidArgument { name: "owner", reason: format!("rank {owner} of {}", wires.len()) });
    }
    let need = format.wire_bytes(len);
    let mut addresses = Vec::with_capacity(wires.len());
    for (r, wire) in wires.iter().enumerate() {
        match (r == owner, wire) {
            (true, None) => addresses.push(0),
            (false, Some((address, bytes))) => {
                holds("wires", *bytes, need)?;
                addresses.push(*address);
            }
            (true, Some(_)) => {
                return Err(Error::InvalidArgument {
                    name: "wires",
                    reason: format!("rank {r} is the owner: its values are `own`, so its entry must be None"),
                });
            }
            (false, None) => {
                return Err(Error::InvalidArgument { name: "wires", reason: format!("rank {r}'s wire is missing") });
            }
        }
    }
    Ok(addresses)
}

/// Enqueue `dst = decode(wire)` on `stream`, each value rounded once to `T`. `wire` is a wire
/// of `dst.len()` values made with this format.
pub fn decode<T: Element>(
    stream: &Stream,
    format: WireFormat,
    wire: &DeviceView<'_, u8>,
    dst: &mut DeviceViewMut<'_, T>,
) -> Result<()> {
    on_stream(stream, "wire", wire.device())?;
    on_stream(stream, "dst", dst.device())?;
    holds("wire", wire.len(), format.wire_bytes(dst.len()))?;
    // SAFETY: both views on the stream's device, `wire` large enough (checked); `dst` is
    // exclusive, so apart from `wire`.
    unsafe { crate::raw::compress_decode(stream, format.codec::<T>(), wire.raw_ptr(), dst.len(), dst.raw_ptr())? };
    let point = stream.point()?;
    wire.note_use(&point);
    dst.note_use(&point);
    Ok(())
}

#[cfg(test)]
mod tests {
    use gp2p_kernels::compress::{BlockSize, Format};

    use super::{WireFormat, fold_wire_addresses};
    use crate::Error;

    #[test]
    fn fold_wires_are_checked_rank_by_rank() {
        let format = WireFormat { format: Format::Int8, block: BlockSize::new(32).unwrap() };
        let need = format.wire_bytes(100);
        let wire = |a| Some((a, need));
        assert_eq!(fold_wire_addresses(format, 100, 1, &[wire(0x100), None, wire(0x900)]), Ok(vec![0x100, 0, 0x900]));
        let refused =
            |owner, wires: &[Option<(u64, usize)>]| fold_wire_addresses(format, 100, owner, wires).unwrap_err();
        assert!(matches!(refused(3, &[wire(1), None, wire(2)]), Error::InvalidArgument { name: "owner", .. }));
        assert!(refused(0, &[wire(1), wire(2)]).to_string().contains("rank 0 is the owner"));
        assert!(refused(0, &[None, None]).to_string().contains("rank 1's wire is missing"));
        let short = refused(0, &[None, Some((0x100, need - 1))]);
        assert!(matches!(short, Error::LengthMismatch { what: "wires", .. }), "{short}");
    }
}
