//! The door's C types against NCCL 2.28.9's own `nccl.h`: every result code, data type and op
//! value, `NCCL_UNIQUE_ID_BYTES`, `ncclConfig_t`'s size and every field's offset, what its
//! initializer sets, and `ncclSimInfo_t`: a C program built against the header prints them.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: failing is how it reports

use std::collections::HashMap;
use std::mem::offset_of;
use std::process::Command;

use geforce_p2p::ReduceOp;
use gp2p_nccl::abi::{
    CONFIG_MAGIC, CONFIG_UNDEF_INT, Code, DataType, HEADER_VERSION_CODE, NUM_BUILTIN_OPS, RawConfig, RawSimInfo,
    RawUniqueId, SIM_INFO_MAGIC, SPLIT_NOCOLOR, UNIQUE_ID_BYTES, builtin_op,
};

mod support;

/// What the header says, by name.
fn header_facts() -> HashMap<String, i64> {
    let nccl = support::nccl_2_28();
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("gp2p-nccl-abi");
    let stubs = dir.join("cuda-stubs");
    std::fs::create_dir_all(&stubs).expect("a scratch folder");
    // The header includes the CUDA runtime's headers for cudaStream_t (and, past 11.0, the
    // half types it never uses); these stand-ins give it that and nothing else.
    let runtime = "typedef struct CUstream_st *cudaStream_t;\n#define CUDART_VERSION 13000\n";
    std::fs::write(stubs.join("cuda_runtime.h"), runtime).expect("write");
    std::fs::write(stubs.join("cuda_fp16.h"), "").expect("write");
    std::fs::write(stubs.join("cuda_bf16.h"), "").expect("write");
    let source = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join("c").join("layout.c");
    let exe = dir.join("layout");
    let out = Command::new("gcc")
        .arg("-I")
        .arg(&stubs)
        .arg("-I")
        .arg(nccl.join("include"))
        .arg("-o")
        .arg(&exe)
        .arg(&source)
        .output()
        .expect("gcc runs");
    assert!(out.status.success(), "gcc: {}", String::from_utf8_lossy(&out.stderr));
    let out = Command::new(&exe).output().expect("the layout program runs");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            Some((name.to_owned(), value.parse().ok()?))
        })
        .collect()
}

#[test]
fn the_door_s_types_are_nccl_2_28_s() {
    let h = header_facts();
    let is = |name: &str, value: i64| {
        assert_eq!(h.get(name).copied(), Some(value), "{name}");
    };
    is("NCCL_VERSION_CODE", HEADER_VERSION_CODE.into());
    is("NCCL_UNIQUE_ID_BYTES", UNIQUE_ID_BYTES as i64);
    is("sizeof(ncclUniqueId)", size_of::<RawUniqueId>() as i64);
    let results = [
        "ncclSuccess",
        "ncclUnhandledCudaError",
        "ncclSystemError",
        "ncclInternalError",
        "ncclInvalidArgument",
        "ncclInvalidUsage",
        "ncclRemoteError",
        "ncclInProgress",
    ];
    for (name, code) in results.iter().zip(Code::ALL) {
        is(name, code.raw().into());
    }
    is("ncclNumResults", Code::ALL.len() as i64);
    for t in DataType::ALL {
        let raw = DataType::ALL.iter().position(|&x| x == t).expect("listed") as i64;
        is(t.name(), raw);
    }
    for (alias, of) in [
        ("ncclChar", "ncclInt8"),
        ("ncclInt", "ncclInt32"),
        ("ncclHalf", "ncclFloat16"),
        ("ncclFloat", "ncclFloat32"),
        ("ncclDouble", "ncclFloat64"),
    ] {
        assert_eq!(h.get(alias), h.get(of), "{alias}");
    }
    is("ncclNumTypes", DataType::ALL.len() as i64);
    for (name, op) in [
        ("ncclSum", ReduceOp::Sum),
        ("ncclProd", ReduceOp::Prod),
        ("ncclMax", ReduceOp::Max),
        ("ncclMin", ReduceOp::Min),
        ("ncclAvg", ReduceOp::Avg),
    ] {
        let raw = h[name];
        assert_eq!(builtin_op(raw as i32), Some(op), "{name}");
    }
    is("ncclNumOps", NUM_BUILTIN_OPS.into());
    for name in ["sizeof(ncclRedOp_t)", "sizeof(ncclDataType_t)", "sizeof(ncclResult_t)"] {
        is(name, size_of::<i32>() as i64);
    }
    is("ncclScalarDevice", 0);
    is("ncclScalarHostImmediate", 1);
    is("NCCL_SPLIT_NOCOLOR", SPLIT_NOCOLOR.into());
    is("NCCL_CONFIG_UNDEF_INT", CONFIG_UNDEF_INT.into());
    is("sizeof(ncclConfig_t)", size_of::<RawConfig>() as i64);
    let fields = [
        ("size", offset_of!(RawConfig, size)),
        ("magic", offset_of!(RawConfig, magic)),
        ("version", offset_of!(RawConfig, version)),
        ("blocking", offset_of!(RawConfig, blocking)),
        ("cgaClusterSize", offset_of!(RawConfig, cga_cluster_size)),
        ("minCTAs", offset_of!(RawConfig, min_ctas)),
        ("maxCTAs", offset_of!(RawConfig, max_ctas)),
        ("netName", offset_of!(RawConfig, net_name)),
        ("splitShare", offset_of!(RawConfig, split_share)),
        ("trafficClass", offset_of!(RawConfig, traffic_class)),
        ("commName", offset_of!(RawConfig, comm_name)),
        ("collnetEnable", offset_of!(RawConfig, collnet_enable)),
        ("CTAPolicy", offset_of!(RawConfig, cta_policy)),
        ("shrinkShare", offset_of!(RawConfig, shrink_share)),
        ("nvlsCTAs", offset_of!(RawConfig, nvls_ctas)),
        ("nChannelsPerNetPeer", offset_of!(RawConfig, n_channels_per_net_peer)),
        ("nvlinkCentricSched", offset_of!(RawConfig, nvlink_centric_sched)),
    ];
    for (field, offset) in fields {
        is(&format!("offsetof(ncclConfig_t, {field})"), offset as i64);
    }
    let undefined = RawConfig::undefined();
    is("config.size", undefined.size as i64);
    is("config.magic", CONFIG_MAGIC.into());
    is("config.version", i64::from(undefined.version));
    is("config.blocking", undefined.blocking.into());
    is("sizeof(ncclSimInfo_t)", size_of::<RawSimInfo>() as i64);
    is("offsetof(ncclSimInfo_t, estimatedTime)", offset_of!(RawSimInfo, estimated_time) as i64);
    is("sim.magic", SIM_INFO_MAGIC.into());
}
