//! geforce-p2p's NCCL door: a shared object with NCCL's C interface (`libnccl.so.2`, every
//! function of NCCL 2.28's `nccl.h` and its `pncclX` alias), loaded in the real NCCL's place
//! (`LD_PRELOAD`, or `VLLM_NCCL_SO_PATH` for vLLM's own wrapper), so programs that call NCCL
//! run on geforce-p2p unchanged where their ranks have no usable P2P, and on the real NCCL,
//! untouched, everywhere else.
//!
//! What it does:
//! - `ncclGetUniqueId` hands out an id naming a rendezvous in the calling process (with a
//!   random secret every rank must present) and carrying the real NCCL's own id.
//! - Each communicator is decided once, identically for every rank, from what every rank
//!   tells the rendezvous (`decision`): served where its ranks share one host, are at most
//!   eight, and no two of their devices have usable P2P (`GP2P_NCCL=force`: P2P or not);
//!   else handed to the real NCCL for its whole life (`GP2P_NCCL=off`: always).
//! - A served communicator is one rank of `geforce_p2p::comm::Communicator`; NCCL's calls
//!   become its collectives and point-to-point legs (`plan`), groups are enqueued at
//!   `ncclGroupEnd` in an order every rank agrees on, and nothing waits for another rank on
//!   the host.
//! - The real NCCL is loaded by path (torch's `nvidia/nccl/lib`, or `GP2P_NCCL_REAL`) and
//!   gets every call on a communicator it runs, arguments untouched.
//!
//! What it does not: the device API and symmetric-memory windows on a served communicator
//! (they need P2P), more than one host or more than eight ranks (those go to the real NCCL). Such calls return `ncclInvalidUsage`,
//! and `ncclGetLastError` says what and how to turn the door off. docs/nccl-door.md has the
//! table, function by function.
//!
//! Nothing here is called from Rust: the crate is the shared object. Its parts are tested
//! below the C boundary (`cargo test -p gp2p-nccl`) and through it, from C
//! (`crates/gp2p-nccl/tests/`).
#![deny(unsafe_code)]

pub mod abi;
mod config;
mod decision;
mod env;
mod error;
mod exports;
mod facts;
mod group;
mod handles;
mod host_trace;
mod id;
mod init;
mod log;
mod memory;
mod memory_pool;
mod plan;
mod real;
mod rendezvous;
mod served;
