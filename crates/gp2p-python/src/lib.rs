//! `geforce_p2p._native`: the native half of the `geforce_p2p` Python package, over the
//! geforce-p2p facade.
//!
//! What it does: copies between devices (P2P where the pair has it, else staged through
//! pinned host memory), host copies, the zero-copy reduce, and the collectives, on memory
//! and streams handed over by the Python layer as raw addresses and `CUstream` handles; the
//! probe; and the `gp2p` command line (`python -m geforce_p2p`), which is
//! [`gp2p_cli::run_cli`] itself.
//!
//! What it leaves to the Python layer (`python/geforce_p2p/`): DLPack and
//! `__cuda_array_interface__`, choosing streams, allocating outputs and the user-facing
//! checks and their messages. Torch tensors in the usual case are read here (`fast.rs`, with
//! the parts of torch the Python layer names, found once per torch module), because reading
//! them in Python cost several microseconds a call; anything unusual goes back to the Python
//! layer. This crate checks again what is cheap (`args.rs`) and turns the library's errors
//! into the package's exception classes (`error.rs`). Every native call
//! releases the GIL while it enqueues work; none waits for the GPU.
//!
//! `unsafe` is confined to `ffi.rs`, whose module docs state the contract the Python layer
//! keeps, and `dlpack.rs`, which reads the DLPack capsules torch exports.
//!
//! The pure parts are usable from Rust, for instance the argument checks:
//!
//! ```
//! use gp2p_python::check_range;
//!
//! assert!(check_range("src", 0x1000, 4, "f32").is_ok());
//! let refused = check_range("src", 0x1002, 4, "f32").unwrap_err();
//! assert!(refused.contains("not aligned to 4 bytes"));
//! ```
#![deny(unsafe_code)]

mod args;
mod bench;
mod comm;
mod dlpack;
mod error;
mod fast;
mod ffi;
mod outputs;
mod package;

use geforce_p2p::{DType, Device, ReduceOp};
use pyo3::prelude::*;

use crate::error::Raised;

/// Check that `len` elements of the dtype named `dtype` at `ptr` can be a tensor's memory (no
/// overflow, aligned, not at address 0 unless empty), as every native call does; the error
/// is the message a Python caller would see.
pub fn check_range(name: &str, ptr: u64, len: usize, dtype: &str) -> Result<(), String> {
    args::dtype(dtype).and_then(|d| args::check_range(name, ptr, len, d)).map_err(|e| e.message)
}

/// What [`probe`] returns: the report as JSON and as the table `gp2p probe` prints, and
/// with `measure` the link rates as JSON and as the tables `gp2p probe --measure` prints.
type Probed = (String, String, Option<(String, String)>);

/// The facade's probe (see [`Probed`]); `measure` adds the link rates, which takes a few
/// seconds per device and pair. Raises `UnavailableError` without a driver.
#[pyfunction]
#[pyo3(signature = (measure = false))]
fn probe(py: Python<'_>, measure: bool) -> PyResult<Probed> {
    let run = || -> Result<Probed, Raised> {
        let report = geforce_p2p::probe()?;
        let links = if measure {
            let rates = gp2p_cli::measure_links(&report)?;
            Some((rates.to_json(), rates.render()))
        } else {
            None
        };
        Ok((report.to_json(), report.render(), links))
    };
    Raised::detached(py, run)
}

/// The number of visible CUDA devices. Raises `UnavailableError` without a driver.
#[pyfunction]
fn device_count(py: Python<'_>) -> PyResult<usize> {
    Raised::detached(py, || Device::count().map_err(Raised::from))
}

/// Hand the pinned host memory the library keeps for reuse back to the driver, with device
/// `device`'s context; returns the bytes handed back. Blocks until the device is idle.
#[pyfunction]
fn release_cached_host_memory(py: Python<'_>, device: usize) -> PyResult<usize> {
    Raised::detached(py, || {
        let device = Device::open(device)?;
        Ok(geforce_p2p::cuda::release_cached_host_memory(&device)?)
    })
}

/// Bytes of pinned host memory the library keeps for reuse.
#[pyfunction]
fn cached_host_bytes() -> usize {
    geforce_p2p::cuda::cached_host_bytes()
}

/// Run the `gp2p` command line with `args` (the first is the program name); returns its exit
/// code. Output goes to the process's stdout and stderr, as the binary's does.
#[pyfunction]
fn run_cli(py: Python<'_>, args: Vec<String>) -> i32 {
    py.detach(|| gp2p_cli::run_cli(args))
}

/// The kernels' dtypes as `(name, bytes)`, in the kernels' order: the Python layer's tables
/// are tested against it.
#[pyfunction]
fn dtypes() -> Vec<(&'static str, usize)> {
    DType::ALL.iter().map(|d| (d.name(), d.size_bytes())).collect()
}

/// The reduce ops' names.
#[pyfunction]
fn reduce_ops() -> Vec<&'static str> {
    ReduceOp::ALL.iter().map(|o| o.name()).collect()
}

/// The exception classes this module raises, by name (all defined in `geforce_p2p._errors`).
#[pyfunction]
fn error_classes() -> Vec<&'static str> {
    error::Class::ALL.iter().map(|c| c.name()).collect()
}

/// This process's host as every part of geforce-p2p tells hosts apart
/// (`geforce_p2p::comm::host_id_from`): `forced` where it is given and not blank (the caller's
/// `GP2P_HOST_ID`), else the host name and the boot id.
#[pyfunction]
#[pyo3(signature = (forced=None))]
fn host_id(forced: Option<&str>) -> String {
    let read = |path| std::fs::read_to_string(path).ok();
    let (name, boot) = (read("/proc/sys/kernel/hostname"), read("/proc/sys/kernel/random/boot_id"));
    geforce_p2p::comm::host_id_from(forced, name.as_deref(), boot.as_deref())
}

/// The package this copy of the module belongs to: `geforce_p2p`, or the build's unique id
/// when loaded through Hugging Face `kernels`.
#[pyfunction]
fn package_name() -> &'static str {
    package::name()
}

/// The module `<package>._native`: `geforce_p2p._native` when pip-installed, the build's
/// unique id when loaded through Hugging Face `kernels` (see `package.rs`).
#[pymodule]
#[pyo3(name = "_native")]
fn native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    package::remember(&m.name()?.to_string());
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(probe, m)?)?;
    m.add_function(wrap_pyfunction!(device_count, m)?)?;
    m.add_function(wrap_pyfunction!(release_cached_host_memory, m)?)?;
    m.add_function(wrap_pyfunction!(cached_host_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(run_cli, m)?)?;
    m.add_function(wrap_pyfunction!(dtypes, m)?)?;
    m.add_function(wrap_pyfunction!(reduce_ops, m)?)?;
    m.add_function(wrap_pyfunction!(error_classes, m)?)?;
    m.add_function(wrap_pyfunction!(package_name, m)?)?;
    m.add_function(wrap_pyfunction!(host_id, m)?)?;
    m.add_class::<ffi::Gate>()?;
    // The benches' aids live apart, in `_native.bench`, never in the package's own names.
    let aids = PyModule::new(m.py(), "bench")?;
    aids.add_class::<bench::RustCalls>()?;
    aids.add_function(wrap_pyfunction!(bench::read_torch_pair, &aids)?)?;
    aids.add_function(wrap_pyfunction!(bench::copy_call_only, &aids)?)?;
    aids.add_function(wrap_pyfunction!(bench::copy_timed, &aids)?)?;
    aids.add_function(wrap_pyfunction!(bench::trace_start, &aids)?)?;
    aids.add_function(wrap_pyfunction!(bench::trace_finish, &aids)?)?;
    m.add_submodule(&aids)?;
    m.add_function(wrap_pyfunction!(dlpack::read_dlpack, m)?)?;
    m.add_function(wrap_pyfunction!(ffi::copy, m)?)?;
    m.add_function(wrap_pyfunction!(ffi::copy_to_host, m)?)?;
    m.add_function(wrap_pyfunction!(ffi::copy_from_host, m)?)?;
    m.add_function(wrap_pyfunction!(ffi::reduce, m)?)?;
    m.add_function(wrap_pyfunction!(ffi::collective_calls::all_reduce_compressed, m)?)?;
    m.add_function(wrap_pyfunction!(ffi::collective_calls::all_reduce, m)?)?;
    m.add_function(wrap_pyfunction!(fast::all_reduce_torch, m)?)?;
    m.add_function(wrap_pyfunction!(fast::copy_torch, m)?)?;
    m.add_function(wrap_pyfunction!(fast::read_torch, m)?)?;
    m.add_function(wrap_pyfunction!(ffi::collective_calls::all_gather, m)?)?;
    m.add_function(wrap_pyfunction!(ffi::collective_calls::reduce_scatter, m)?)?;
    m.add_function(wrap_pyfunction!(ffi::collective_calls::broadcast, m)?)?;
    m.add_function(wrap_pyfunction!(comm::unique_id, m)?)?;
    m.add_class::<comm::PyCommunicator>()?;
    Ok(())
}
