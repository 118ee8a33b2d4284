//! The arguments of the native calls as plain data, and the checks this crate repeats after
//! the Python layer's (the cheap ones: names, counts, lengths, addresses). Pure: tested
//! without a GPU or an interpreter.

use std::str::FromStr;

use crate::error::Raised;
use geforce_p2p::collectives::{Receive, WireFormat};
use geforce_p2p::kernels::compress::{BlockSize, Format};
use geforce_p2p::{DType, ReduceOp, Route};

/// A contiguous run of device memory from a tensor, as the Python layer hands it over: a
/// `(device, address, stream)` tuple ([`MemoryArg`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Memory {
    /// CUDA ordinal of the device that holds it.
    pub(crate) device: usize,
    /// Address of the first element (0 is allowed only for an empty tensor).
    pub(crate) ptr: u64,
    /// Raw `CUstream` of the stream the op is ordered on, on `device` (0 for the legacy
    /// default stream).
    pub(crate) stream: u64,
}

/// [`Memory`] as Python passes it: `(device, address, stream)`.
pub(crate) type MemoryArg = (usize, u64, u64);

impl From<MemoryArg> for Memory {
    fn from((device, ptr, stream): MemoryArg) -> Memory {
        Memory { device, ptr, stream }
    }
}

/// Many [`MemoryArg`]s as [`Memory`].
pub(crate) fn memories(args: Vec<MemoryArg>) -> Vec<Memory> {
    args.into_iter().map(Memory::from).collect()
}

/// A parsed dtype name (`f32` ... `u64`, the kernels' names).
pub(crate) fn dtype(name: &str) -> Result<DType, Raised> {
    DType::from_str(name).map_err(|e| Raised::argument("dtype", e))
}

/// A parsed reduce op (`sum`, `avg`, `min`, `max`, `prod`).
pub(crate) fn op(name: &str) -> Result<ReduceOp, Raised> {
    ReduceOp::from_str(name).map_err(|e| Raised::argument("op", e))
}

/// A parsed copy route (`auto`, `peer`, `staged`).
pub(crate) fn route(name: &str) -> Result<Route, Raised> {
    Route::from_str(name).map_err(|e| Raised::argument("route", e))
}

/// A parsed receive path of the collectives (`auto`, `scratch`, `zero-copy`), given as the
/// Python argument `transport`.
pub(crate) fn receive(name: &str) -> Result<Receive, Raised> {
    Receive::from_str(name).map_err(|e| Raised::argument("transport", e))
}

/// A compressed all-reduce's wire format: `compress` (`int8`, `fp8`) in blocks of `block`
/// values.
pub(crate) fn wire_format(compress: &str, block: usize) -> Result<WireFormat, Raised> {
    let format = Format::ALL.into_iter().find(|f| f.name().eq_ignore_ascii_case(compress)).ok_or_else(|| {
        let names: Vec<&str> = Format::ALL.iter().map(|f| f.name()).collect();
        Raised::argument("compress", format!("{compress:?} is not one of {}", names.join(", ")))
    })?;
    let block = BlockSize::new(block).map_err(|e| Raised::argument("block", e))?;
    Ok(WireFormat { format, block })
}

/// A duration given in seconds, or an error naming the argument.
pub(crate) fn seconds(name: &str, value: f64) -> Result<std::time::Duration, Raised> {
    std::time::Duration::try_from_secs_f64(value)
        .map_err(|_| Raised::argument(name, format!("{value} is not a number of seconds >= 0")))
}

/// Check that `len` elements of `dtype` at `ptr` can be a tensor's memory: the byte count and
/// the end address do not overflow, the address is aligned to the element, and a non-empty
/// range is not at address 0. What the Python layer checked is checked again here because a
/// wrong address reaches the GPU otherwise.
pub(crate) fn check_range(name: &str, ptr: u64, len: usize, dtype: DType) -> Result<(), Raised> {
    let size = dtype.size_bytes();
    let Some(bytes) = len.checked_mul(size) else {
        return Err(Raised::argument(name, format!("{len} elements of {dtype} overflow the address space")));
    };
    if len == 0 {
        return Ok(());
    }
    if ptr == 0 {
        return Err(Raised::argument(name, format!("address 0 for {len} elements")));
    }
    if ptr.checked_add(bytes as u64).is_none() {
        return Err(Raised::argument(name, format!("{bytes} bytes at {ptr:#x} run past the address space")));
    }
    if ptr % size as u64 != 0 {
        return Err(Raised::argument(name, format!("address {ptr:#x} is not aligned to {size} bytes for {dtype}")));
    }
    Ok(())
}

/// Check one device range per rank: as many as there are ranks, each a valid range, each on
/// another device (the library refuses that too; this names the Python argument).
pub(crate) fn check_ranks(name: &str, ranks: &[Memory], len: usize, dtype: DType) -> Result<(), Raised> {
    if ranks.is_empty() {
        return Err(Raised::argument(name, "no tensors: give one per device"));
    }
    for (r, m) in ranks.iter().enumerate() {
        check_range(&format!("{name}[{r}]"), m.ptr, len, dtype)?;
        if let Some(first) = ranks[..r].iter().position(|o| o.device == m.device) {
            return Err(Raised::argument(
                name,
                format!("{name}[{first}] and {name}[{r}] are both on cuda:{}: give one tensor per device", m.device),
            ));
        }
    }
    Ok(())
}

/// Check per-rank input addresses beside their outputs: one per rank, each a valid range.
pub(crate) fn check_inputs(name: &str, inputs: &[u64], ranks: usize, len: usize, dtype: DType) -> Result<(), Raised> {
    if inputs.len() != ranks {
        return Err(Raised::argument(
            name,
            format!("{} tensors for {ranks} outputs: give one per output", inputs.len()),
        ));
    }
    for (r, &ptr) in inputs.iter().enumerate() {
        check_range(&format!("{name}[{r}]"), ptr, len, dtype)?;
    }
    Ok(())
}

/// `n * len`, refused where it overflows.
pub(crate) fn times(name: &str, n: usize, len: usize) -> Result<usize, Raised> {
    n.checked_mul(len).ok_or_else(|| Raised::argument(name, format!("{n} x {len} elements overflow")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Class;

    #[test]
    fn names_parse_like_the_cli() {
        assert_eq!(dtype("bf16"), Ok(DType::BF16));
        assert_eq!(op("avg"), Ok(ReduceOp::Avg));
        assert_eq!(route("staged"), Ok(Route::Staged));
        assert_eq!(receive("zero-copy"), Ok(Receive::ZeroCopy));
        let bad = dtype("bool").unwrap_err();
        assert_eq!(bad.class, Class::InvalidArgument);
        assert!(bad.message.contains("dtype") && bad.message.contains("\"bool\""), "{}", bad.message);
        assert!(op("mean").unwrap_err().message.contains("invalid argument op"));
    }

    #[test]
    fn ranges_are_checked_for_overflow_alignment_and_null() {
        assert_eq!(check_range("src", 0, 0, DType::F32), Ok(()), "an empty tensor may have no address");
        assert_eq!(check_range("src", 0x1000, 3, DType::F64), Ok(()));
        let null = check_range("src", 0, 1, DType::U8).unwrap_err();
        assert!(null.message.starts_with("invalid argument src: address 0"), "{}", null.message);
        let misaligned = check_range("dst", 0x1002, 1, DType::F32).unwrap_err();
        assert!(misaligned.message.contains("not aligned to 4 bytes for f32"), "{}", misaligned.message);
        assert!(check_range("dst", 8, usize::MAX, DType::U64).is_err(), "byte count overflows");
        assert!(check_range("dst", u64::MAX - 3, 8, DType::U8).is_err(), "end address overflows");
    }

    #[test]
    fn ranks_are_one_per_device_and_named() {
        let m = |device, ptr| Memory { device, ptr, stream: 0 };
        assert_eq!(check_ranks("tensors", &[m(0, 0x100), m(1, 0x200)], 4, DType::F32), Ok(()));
        let shared = check_ranks("tensors", &[m(1, 0x100), m(0, 0x200), m(1, 0x300)], 4, DType::F32).unwrap_err();
        assert!(shared.message.contains("tensors[0] and tensors[2] are both on cuda:1"), "{}", shared.message);
        assert!(check_ranks("tensors", &[], 4, DType::F32).is_err());
        let bad = check_ranks("tensors", &[m(0, 0x101)], 4, DType::F32).unwrap_err();
        assert!(bad.message.contains("tensors[0]"), "{}", bad.message);
        assert!(check_inputs("inputs", &[0x100], 2, 4, DType::F32).unwrap_err().message.contains("1 tensors for 2"));
        assert_eq!(times("outputs", 3, 5), Ok(15));
        assert!(times("outputs", 2, usize::MAX).is_err());
    }
}
