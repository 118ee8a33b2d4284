//! NCCL's C types as NCCL 2.28's `nccl.h` lays them out: result codes, data types, reduction
//! ops, `ncclConfig_t`, `ncclSimInfo_t`, the unique id and the device API's team. Values
//! arrive from C as plain integers and become Rust enums only through the checked
//! conversions here, so an unknown value is an error, never undefined behaviour.
//! `tests/abi.rs` compiles a C program against the real header and compares every value,
//! size and offset with these.

use std::ffi::{c_char, c_float, c_int, c_uint, c_void};

use geforce_p2p::{DType, ReduceOp};

/// `ncclResult_t`.
pub type RawResult = c_int;
/// `ncclComm_t`: an opaque pointer.
pub type RawComm = *mut c_void;
/// `cudaStream_t`: an opaque pointer (a `CUstream`).
pub type RawStream = *mut c_void;
/// `ncclWindow_t`: an opaque pointer.
pub type RawWindow = *mut c_void;

/// `NCCL_UNIQUE_ID_BYTES`.
pub const UNIQUE_ID_BYTES: usize = 128;
/// `NCCL_SPLIT_NOCOLOR`.
pub const SPLIT_NOCOLOR: c_int = -1;
/// `NCCL_CONFIG_UNDEF_INT`: a config field left to the library.
pub const CONFIG_UNDEF_INT: c_int = c_int::MIN;
/// The `magic` of an `ncclConfig_t` made with `NCCL_CONFIG_INITIALIZER`.
pub const CONFIG_MAGIC: c_uint = 0xcafe_beef;
/// The `magic` of an `ncclSimInfo_t` made with `NCCL_SIM_INFO_INITIALIZER`.
pub const SIM_INFO_MAGIC: c_uint = 0x7468_5283;
/// `NCCL_VERSION_CODE` of the header this door implements (2.28.9).
pub const HEADER_VERSION_CODE: c_int = 22809;

/// `ncclResult_t`'s values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum Code {
    /// `ncclSuccess`.
    Success = 0,
    /// `ncclUnhandledCudaError`.
    UnhandledCudaError = 1,
    /// `ncclSystemError`.
    SystemError = 2,
    /// `ncclInternalError`.
    InternalError = 3,
    /// `ncclInvalidArgument`.
    InvalidArgument = 4,
    /// `ncclInvalidUsage`.
    InvalidUsage = 5,
    /// `ncclRemoteError`.
    RemoteError = 6,
    /// `ncclInProgress`.
    InProgress = 7,
}

impl Code {
    /// Every code, in value order (`ncclNumResults` is their count).
    pub const ALL: [Code; 8] = [
        Code::Success,
        Code::UnhandledCudaError,
        Code::SystemError,
        Code::InternalError,
        Code::InvalidArgument,
        Code::InvalidUsage,
        Code::RemoteError,
        Code::InProgress,
    ];

    /// The code a C caller gets.
    pub fn raw(self) -> RawResult {
        self as RawResult
    }

    /// The code of a raw value, if it is one.
    pub fn from_raw(raw: RawResult) -> Option<Code> {
        usize::try_from(raw).ok().and_then(|i| Code::ALL.get(i)).copied()
    }

    /// What `ncclGetErrorString` says of it: NCCL's own wording.
    pub fn describe(self) -> &'static std::ffi::CStr {
        match self {
            Code::Success => c"no error",
            Code::UnhandledCudaError => c"unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
            Code::SystemError => c"unhandled system error (run with NCCL_DEBUG=INFO for details)",
            Code::InternalError => c"internal error - please report this issue to the NCCL developers",
            Code::InvalidArgument => c"invalid argument (run with NCCL_DEBUG=WARN for details)",
            Code::InvalidUsage => c"invalid usage (run with NCCL_DEBUG=WARN for details)",
            Code::RemoteError => c"remote process exited or there was a network error",
            Code::InProgress => c"NCCL operation in progress",
        }
    }
}

/// `ncclDataType_t`: NCCL's twelve types, each one of geforce-p2p's kernel types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataType {
    /// `ncclInt8`, `ncclChar`.
    Int8,
    /// `ncclUint8`.
    Uint8,
    /// `ncclInt32`, `ncclInt`.
    Int32,
    /// `ncclUint32`.
    Uint32,
    /// `ncclInt64`.
    Int64,
    /// `ncclUint64`.
    Uint64,
    /// `ncclFloat16`, `ncclHalf`.
    Float16,
    /// `ncclFloat32`, `ncclFloat`.
    Float32,
    /// `ncclFloat64`, `ncclDouble`.
    Float64,
    /// `ncclBfloat16`.
    Bfloat16,
    /// `ncclFloat8e4m3`.
    Float8e4m3,
    /// `ncclFloat8e5m2`.
    Float8e5m2,
}

impl DataType {
    /// Every type, in value order (`ncclNumTypes` is their count).
    pub const ALL: [DataType; 12] = [
        DataType::Int8,
        DataType::Uint8,
        DataType::Int32,
        DataType::Uint32,
        DataType::Int64,
        DataType::Uint64,
        DataType::Float16,
        DataType::Float32,
        DataType::Float64,
        DataType::Bfloat16,
        DataType::Float8e4m3,
        DataType::Float8e5m2,
    ];

    /// The type of a raw `ncclDataType_t`, if it is one.
    pub fn from_raw(raw: c_int) -> Option<DataType> {
        usize::try_from(raw).ok().and_then(|i| DataType::ALL.get(i)).copied()
    }

    /// NCCL's name, for messages.
    pub fn name(self) -> &'static str {
        match self {
            DataType::Int8 => "ncclInt8",
            DataType::Uint8 => "ncclUint8",
            DataType::Int32 => "ncclInt32",
            DataType::Uint32 => "ncclUint32",
            DataType::Int64 => "ncclInt64",
            DataType::Uint64 => "ncclUint64",
            DataType::Float16 => "ncclFloat16",
            DataType::Float32 => "ncclFloat32",
            DataType::Float64 => "ncclFloat64",
            DataType::Bfloat16 => "ncclBfloat16",
            DataType::Float8e4m3 => "ncclFloat8e4m3",
            DataType::Float8e5m2 => "ncclFloat8e5m2",
        }
    }

    /// Bytes per element.
    pub fn size_bytes(self) -> usize {
        match self {
            DataType::Int8 | DataType::Uint8 | DataType::Float8e4m3 | DataType::Float8e5m2 => 1,
            DataType::Float16 | DataType::Bfloat16 => 2,
            DataType::Int32 | DataType::Uint32 | DataType::Float32 => 4,
            DataType::Int64 | DataType::Uint64 | DataType::Float64 => 8,
        }
    }

    /// geforce-p2p's kernel type for it: every NCCL type has one, fp8 included.
    pub fn kernel_dtype(self) -> DType {
        match self {
            DataType::Int8 => DType::I8,
            DataType::Uint8 => DType::U8,
            DataType::Int32 => DType::I32,
            DataType::Uint32 => DType::U32,
            DataType::Int64 => DType::I64,
            DataType::Uint64 => DType::U64,
            DataType::Float16 => DType::F16,
            DataType::Float32 => DType::F32,
            DataType::Float64 => DType::F64,
            DataType::Bfloat16 => DType::BF16,
            DataType::Float8e4m3 => DType::F8E4M3,
            DataType::Float8e5m2 => DType::F8E5M2,
        }
    }

    /// Whether it is a floating-point type (what `ncclRedOpCreatePreMulSum` takes a scalar
    /// of, and what avg divides exactly).
    pub fn is_float(self) -> bool {
        matches!(
            self,
            DataType::Float16
                | DataType::Float32
                | DataType::Float64
                | DataType::Bfloat16
                | DataType::Float8e4m3
                | DataType::Float8e5m2
        )
    }
}

/// `ncclNumOps`: the first value `ncclRedOpCreatePreMulSum` hands out.
pub const NUM_BUILTIN_OPS: c_int = 5;

/// The built-in `ncclRedOp_t` values, as geforce-p2p's ops (their order is NCCL's:
/// sum, prod, max, min, avg); `None` for any other value (a created op, or garbage).
pub fn builtin_op(raw: c_int) -> Option<ReduceOp> {
    Some(match raw {
        0 => ReduceOp::Sum,
        1 => ReduceOp::Prod,
        2 => ReduceOp::Max,
        3 => ReduceOp::Min,
        4 => ReduceOp::Avg,
        _ => return None,
    })
}

/// `ncclScalarResidence_t`: where a pre-multiplying op's scalar lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Residence {
    /// `ncclScalarDevice`: device memory, read while each collective runs.
    Device,
    /// `ncclScalarHostImmediate`: host memory, read once before the op is made.
    HostImmediate,
}

impl Residence {
    /// The residence of a raw value, if it is one.
    pub fn from_raw(raw: c_int) -> Option<Residence> {
        match raw {
            0 => Some(Residence::Device),
            1 => Some(Residence::HostImmediate),
            _ => None,
        }
    }
}

/// `ncclUniqueId`: 128 opaque bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct RawUniqueId {
    /// `internal`.
    pub internal: [u8; UNIQUE_ID_BYTES],
}

/// `ncclConfig_t` of NCCL 2.28 (`ncclConfig_v22800`). A caller built against an older
/// header passes a shorter one, whose `size` says how much of it there is: fields past it
/// are never read.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RawConfig {
    /// `size`: `sizeof(ncclConfig_t)` of the caller's header.
    pub size: usize,
    /// `magic`: [`CONFIG_MAGIC`].
    pub magic: c_uint,
    /// `version`: the caller's `NCCL_VERSION_CODE`.
    pub version: c_uint,
    /// `blocking`: 0 for non-blocking creation and calls.
    pub blocking: c_int,
    /// `cgaClusterSize`.
    pub cga_cluster_size: c_int,
    /// `minCTAs`.
    pub min_ctas: c_int,
    /// `maxCTAs`.
    pub max_ctas: c_int,
    /// `netName`.
    pub net_name: *const c_char,
    /// `splitShare`.
    pub split_share: c_int,
    /// `trafficClass`.
    pub traffic_class: c_int,
    /// `commName`.
    pub comm_name: *const c_char,
    /// `collnetEnable`.
    pub collnet_enable: c_int,
    /// `CTAPolicy`.
    pub cta_policy: c_int,
    /// `shrinkShare`.
    pub shrink_share: c_int,
    /// `nvlsCTAs`.
    pub nvls_ctas: c_int,
    /// `nChannelsPerNetPeer`.
    pub n_channels_per_net_peer: c_int,
    /// `nvlinkCentricSched`.
    pub nvlink_centric_sched: c_int,
}

impl RawConfig {
    /// What `NCCL_CONFIG_INITIALIZER` makes: every field left to the library.
    pub fn undefined() -> RawConfig {
        RawConfig {
            size: size_of::<RawConfig>(),
            magic: CONFIG_MAGIC,
            version: HEADER_VERSION_CODE as u32,
            blocking: CONFIG_UNDEF_INT,
            cga_cluster_size: CONFIG_UNDEF_INT,
            min_ctas: CONFIG_UNDEF_INT,
            max_ctas: CONFIG_UNDEF_INT,
            net_name: std::ptr::null(),
            split_share: CONFIG_UNDEF_INT,
            traffic_class: CONFIG_UNDEF_INT,
            comm_name: std::ptr::null(),
            collnet_enable: CONFIG_UNDEF_INT,
            cta_policy: CONFIG_UNDEF_INT,
            shrink_share: CONFIG_UNDEF_INT,
            nvls_ctas: CONFIG_UNDEF_INT,
            n_channels_per_net_peer: CONFIG_UNDEF_INT,
            nvlink_centric_sched: CONFIG_UNDEF_INT,
        }
    }
}

/// Where `blocking` ends in every `ncclConfig_t` that has it (2.14 on): a config shorter than
/// this is read as blocking.
pub const CONFIG_BLOCKING_END: usize = std::mem::offset_of!(RawConfig, blocking) + size_of::<c_int>();

/// `ncclSimInfo_t` (`ncclSimInfo_v22200`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RawSimInfo {
    /// `size`.
    pub size: usize,
    /// `magic`: [`SIM_INFO_MAGIC`].
    pub magic: c_uint,
    /// `version`.
    pub version: c_uint,
    /// `estimatedTime`, in microseconds.
    pub estimated_time: c_float,
}

/// `ncclTeam_t` of the device API, returned by value.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawTeam {
    /// `nRanks`.
    pub n_ranks: c_int,
    /// `rank`.
    pub rank: c_int,
    /// `stride`.
    pub stride: c_int,
}

// The layouts NCCL 2.28's header gives on 64-bit Linux (tests/abi.rs checks them against the
// header itself; these fail the build first).
const _: () = {
    assert!(size_of::<RawUniqueId>() == UNIQUE_ID_BYTES);
    assert!(size_of::<RawConfig>() == 80);
    assert!(std::mem::offset_of!(RawConfig, blocking) == 16);
    assert!(std::mem::offset_of!(RawConfig, net_name) == 32);
    assert!(std::mem::offset_of!(RawConfig, comm_name) == 48);
    assert!(std::mem::offset_of!(RawConfig, nvlink_centric_sched) == 76);
    assert!(size_of::<RawSimInfo>() == 24);
    assert!(size_of::<RawTeam>() == 12);
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_values_round_trip_and_unknown_ones_are_refused() {
        for (i, t) in DataType::ALL.iter().enumerate() {
            assert_eq!(DataType::from_raw(i as c_int), Some(*t));
        }
        assert_eq!(DataType::from_raw(12), None);
        assert_eq!(DataType::from_raw(-1), None);
        for code in Code::ALL {
            assert_eq!(Code::from_raw(code.raw()), Some(code));
        }
        assert_eq!(Code::from_raw(8), None);
        assert_eq!(builtin_op(4), Some(ReduceOp::Avg));
        assert_eq!(builtin_op(NUM_BUILTIN_OPS), None);
        assert_eq!(Residence::from_raw(2), None);
    }

    #[test]
    fn every_kernel_type_has_the_size_of_its_nccl_type() {
        for t in DataType::ALL {
            let d = t.kernel_dtype();
            assert_eq!(d.size_bytes(), t.size_bytes(), "{}", t.name());
            assert_eq!(d.is_float(), t.is_float(), "{}", t.name());
        }
        let kernel_types: std::collections::HashSet<DType> = DataType::ALL.iter().map(|t| t.kernel_dtype()).collect();
        assert_eq!(kernel_types.len(), DType::ALL.len(), "every kernel type is some NCCL type's");
    }

    #[test]
    fn a_config_from_before_2_14_is_read_only_up_to_its_size() {
        assert_eq!(CONFIG_BLOCKING_END, 20);
    }
}
