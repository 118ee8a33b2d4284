//! The door exports every function NCCL 2.28.9 exports, under its name and its `pncclX`
//! alias, and every NCCL function `libtorch_cuda.so` (torch 2.11) imports, so programs and
//! torch resolve all of them with the door preloaded.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: failing is how it reports

mod support;

/// The 38 NCCL functions torch 2.11's `libtorch_cuda.so` imports (`nm -D --undefined-only`
/// on it): `import torch` fails if any does not resolve.
const TORCH_IMPORTS: [&str; 38] = [
    "ncclAllGather",
    "ncclAllReduce",
    "ncclAlltoAll",
    "ncclBcast",
    "ncclBroadcast",
    "ncclCommAbort",
    "ncclCommCount",
    "ncclCommDeregister",
    "ncclCommDestroy",
    "ncclCommFinalize",
    "ncclCommGetAsyncError",
    "ncclCommInitAll",
    "ncclCommInitRank",
    "ncclCommInitRankConfig",
    "ncclCommInitRankScalable",
    "ncclCommRegister",
    "ncclCommShrink",
    "ncclCommSplit",
    "ncclCommUserRank",
    "ncclCommWindowDeregister",
    "ncclCommWindowRegister",
    "ncclDevCommCreate",
    "ncclDevCommDestroy",
    "ncclGetErrorString",
    "ncclGetLastError",
    "ncclGetUniqueId",
    "ncclGetVersion",
    "ncclGroupEnd",
    "ncclGroupSimulateEnd",
    "ncclGroupStart",
    "ncclMemAlloc",
    "ncclMemFree",
    "ncclRecv",
    "ncclRedOpCreatePreMulSum",
    "ncclRedOpDestroy",
    "ncclReduce",
    "ncclReduceScatter",
    "ncclSend",
];

/// What NCCL exports that is no part of its interface (no header declares it).
const NCCL_INTERNAL: [&str; 1] = ["ncclResetDebugInitInternal"];

#[test]
fn every_function_of_nccl_2_28_and_its_alias_is_exported_and_nothing_of_rust() {
    let real = support::exported(&support::nccl_2_28().join("lib").join("libnccl.so.2"));
    let real: Vec<&String> =
        real.iter().filter(|n| n.contains("nccl") && !NCCL_INTERNAL.contains(&n.as_str())).collect();
    assert!(real.len() >= 104, "NCCL 2.28.9 exports 52 functions and their aliases, found {}", real.len());
    let door = support::exported(&support::door());
    let missing: Vec<&&String> = real.iter().filter(|n| !door.contains(n)).collect();
    assert!(missing.is_empty(), "the door lacks {missing:?}");
    let extra: Vec<&String> = door.iter().filter(|n| !real.contains(n) && n.as_str() != "gp2p_nccl_door").collect();
    assert!(extra.is_empty(), "the door exports what NCCL does not: {extra:?}");
    for name in TORCH_IMPORTS {
        assert!(door.iter().any(|n| n == name), "torch imports {name}");
    }
}

#[test]
fn the_shared_object_answers_to_nccl_s_soname() {
    let out =
        std::process::Command::new("readelf").arg("-d").arg(support::door()).output().expect("readelf runs (binutils)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Library soname: [libnccl.so.2]"), "{text}");
}
