//! Reading a DLPack capsule: what a `__dlpack__()` or torch's `_to_dlpack` hands out, an
//! unversioned `DLManagedTensor` in a capsule named "dltensor". Read in place, not consumed:
//! the capsule keeps its name, so its producer's destructor frees the managed tensor when the
//! capsule goes, while the tensor object the caller holds keeps the memory itself.
//!
//! One reader for both users: the Python layer's DLPack arguments (`_native.read_dlpack`) and
//! the torch fast paths ([`crate::fast`]), where one `_to_dlpack` call reads what a dozen
//! attribute lookups did.

#![allow(unsafe_code)]

use std::ffi::c_void;

use geforce_p2p::DType;
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyCapsuleMethods};

/// `kDLCUDA` of DLPack's `DLDeviceType`: device memory.
pub(crate) const DL_CUDA: i32 = 2;

/// DLPack's `DLDevice`.
#[repr(C)]
struct DlDevice {
    device_type: i32,
    device_id: i32,
}

/// DLPack's `DLDataType`.
#[repr(C)]
#[derive(Clone, Copy)]
struct DlDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

/// DLPack's `DLTensor`, the first member of a `DLManagedTensor` (the rest, the manager's
/// context and deleter, is its producer's business).
#[repr(C)]
struct DlTensorAbi {
    data: *mut c_void,
    device: DlDevice,
    ndim: i32,
    dtype: DlDataType,
    shape: *const i64,
    strides: *const i64,
    byte_offset: u64,
}

// dlpack.h's layout on 64-bit targets: `DLTensor` is 48 bytes, `shape` at 24.
#[cfg(target_pointer_width = "64")]
const _: () = assert!(std::mem::size_of::<DlTensorAbi>() == 48 && std::mem::offset_of!(DlTensorAbi, shape) == 24);

/// A DLPack tensor as read: its device, address, element type, shape and strides (in
/// elements; `None` where the producer gave none, which means row-major).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DlTensor {
    pub(crate) device_type: i32,
    pub(crate) device_id: i32,
    /// `data + byte_offset`: the first element.
    pub(crate) ptr: u64,
    /// The type as DLPack codes it: `(code, bits, lanes)`.
    pub(crate) type_code: (u8, u8, u16),
    pub(crate) shape: Vec<i64>,
    pub(crate) strides: Option<Vec<i64>>,
}

impl DlTensor {
    /// The kernel dtype DLPack's type code names, or `None` for one the kernels do not take.
    pub(crate) fn dtype(&self) -> Option<DType> {
        let (code, bits, lanes) = self.type_code;
        if lanes != 1 {
            return None;
        }
        Some(match (code, bits) {
            (0, 8) => DType::I8,
            (0, 32) => DType::I32,
            (0, 64) => DType::I64,
            (1, 8) => DType::U8,
            (1, 32) => DType::U32,
            (1, 64) => DType::U64,
            (2, 16) => DType::F16,
            (2, 32) => DType::F32,
            (2, 64) => DType::F64,
            (4, 16) => DType::BF16,
            // DLPack 1.1's kDLFloat8_e4m3fn and kDLFloat8_e5m2.
            (10, 8) => DType::F8E4M3,
            (12, 8) => DType::F8E5M2,
            _ => return None,
        })
    }

    /// Elements, or `None` where a dimension is negative or the product overflows.
    pub(crate) fn len(&self) -> Option<usize> {
        self.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(usize::try_from(d).ok()?))
    }

    /// Row-major contiguity as torch counts it: strides of extent-1 dimensions do not
    /// matter, nor any of an empty tensor.
    pub(crate) fn contiguous(&self) -> bool {
        let Some(strides) = &self.strides else {
            return true;
        };
        if self.shape.contains(&0) {
            return true;
        }
        let mut expected = 1i64;
        for (&extent, &stride) in self.shape.iter().zip(strides).rev() {
            if extent != 1 && stride != expected {
                return false;
            }
            expected = expected.saturating_mul(extent);
        }
        true
    }
}

/// The most dimensions a capsule may claim: far more than any tensor has (torch allows 64),
/// few enough that a corrupt count is an error rather than a read of gigabytes.
const MAX_DIMENSIONS: usize = 1024;

/// The tensor in `capsule`, a "dltensor" capsule not yet consumed; an error (TypeError or
/// ValueError) where it is anything else, or claims a shape no tensor has.
pub(crate) fn read(capsule: &Bound<'_, PyAny>) -> PyResult<DlTensor> {
    let capsule = capsule.cast::<PyCapsule>()?;
    let managed = capsule.pointer_checked(Some(c"dltensor"))?;
    // SAFETY: a capsule named "dltensor" holds a `DLManagedTensor` (DLPack's contract), whose
    // first member is the `DLTensor` read here; the producer keeps it, and the `ndim` entries
    // its `shape` and `strides` (where not null) point to, alive until the capsule's
    // destructor runs. That cannot run during this read: `capsule` is borrowed, and the
    // interpreter is held (the package is built for the stable ABI, which no free-threaded
    // Python loads), so no other thread can consume or drop it meanwhile.
    let raw = unsafe { &*managed.as_ptr().cast::<DlTensorAbi>() };
    let invalid = |what: String| pyo3::exceptions::PyValueError::new_err(format!("DLPack tensor: {what}"));
    let ndim = usize::try_from(raw.ndim)
        .ok()
        .filter(|&n| n <= MAX_DIMENSIONS)
        .ok_or_else(|| invalid(format!("{} dimensions", raw.ndim)))?;
    let entries = |p: *const i64| -> Option<Vec<i64>> {
        if p.is_null() {
            return None;
        }
        if ndim == 0 {
            return Some(Vec::new()); // a scalar's pointer may dangle: nothing is read
        }
        // SAFETY: as above: `p` points to `ndim` (at least one) dimensions that live as long
        // as the capsule.
        Some(unsafe { std::slice::from_raw_parts(p, ndim) }.to_vec())
    };
    let shape = match entries(raw.shape) {
        Some(shape) => shape,
        None if ndim == 0 => Vec::new(),
        None => return Err(invalid(format!("{ndim} dimensions but no shape"))),
    };
    let ptr = (raw.data as u64)
        .checked_add(raw.byte_offset)
        .ok_or_else(|| invalid(format!("byte offset {} past the end of the address space", raw.byte_offset)))?;
    Ok(DlTensor {
        device_type: raw.device.device_type,
        device_id: raw.device.device_id,
        ptr,
        type_code: (raw.dtype.code, raw.dtype.bits, raw.dtype.lanes),
        shape,
        strides: entries(raw.strides),
    })
}

/// `read_dlpack(capsule)`: the tensor in a "dltensor" capsule, for the Python layer's DLPack
/// arguments: `(device_type, device_id, address, dtype name or None, (code, bits, lanes),
/// shape, strides in elements or None)`.
#[pyfunction]
#[allow(clippy::type_complexity)]
pub(crate) fn read_dlpack(
    capsule: &Bound<'_, PyAny>,
) -> PyResult<(i32, i32, u64, Option<&'static str>, (u8, u8, u16), Vec<i64>, Option<Vec<i64>>)> {
    let t = read(capsule)?;
    let dtype = t.dtype().map(DType::name);
    Ok((t.device_type, t.device_id, t.ptr, dtype, t.type_code, t.shape, t.strides))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(shape: &[i64], strides: Option<&[i64]>) -> DlTensor {
        DlTensor {
            device_type: DL_CUDA,
            device_id: 0,
            ptr: 0x1000,
            type_code: (2, 32, 1),
            shape: shape.to_vec(),
            strides: strides.map(<[i64]>::to_vec),
        }
    }

    #[test]
    fn contiguity_is_torch_s_row_major_ignoring_extent_one_dimensions() {
        assert!(tensor(&[3, 4], None).contiguous());
        assert!(tensor(&[3, 4], Some(&[4, 1])).contiguous());
        assert!(!tensor(&[3, 4], Some(&[1, 3])).contiguous(), "a transpose");
        assert!(!tensor(&[4], Some(&[2])).contiguous(), "every other element");
        assert!(tensor(&[3, 1, 4], Some(&[4, 99, 1])).contiguous(), "extent 1: any stride");
        assert!(tensor(&[0, 4], Some(&[7, 7])).contiguous(), "empty");
        assert!(tensor(&[], Some(&[])).contiguous(), "a scalar");
    }

    #[test]
    fn length_is_the_product_of_the_shape_and_refuses_negative_or_overflowing_ones() {
        assert_eq!(tensor(&[3, 1, 4], None).len(), Some(12));
        assert_eq!(tensor(&[], None).len(), Some(1));
        assert_eq!(tensor(&[5, 0], None).len(), Some(0));
        assert_eq!(tensor(&[-1, 4], None).len(), None);
        assert_eq!(tensor(&[i64::MAX, i64::MAX], None).len(), None);
    }

    #[test]
    fn dtype_codes_name_the_kernel_dtypes_and_nothing_else() {
        let with = |code: (u8, u8, u16)| DlTensor { type_code: code, ..tensor(&[1], None) }.dtype();
        assert_eq!(with((2, 32, 1)), Some(DType::F32));
        assert_eq!(with((4, 16, 1)), Some(DType::BF16));
        assert_eq!(with((1, 8, 1)), Some(DType::U8));
        assert_eq!(with((0, 64, 1)), Some(DType::I64));
        assert_eq!(with((2, 32, 4)), None, "four lanes");
        assert_eq!(with((6, 8, 1)), None, "bool");
        assert_eq!(with((0, 16, 1)), None, "int16");
        assert_eq!(with((5, 64, 1)), None, "complex64");
    }
}
