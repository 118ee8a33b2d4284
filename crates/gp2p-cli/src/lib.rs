//! `gp2p`: see what the CUDA layer sees, and benchmark the data paths against the link and
//! memory ceilings measured in the same run.
//!
//! The whole command line lives in this library, behind one entry point, [`run_cli`], so the
//! `gp2p` binary and the Python package's `python -m geforce_p2p` run the same code. Besides
//! it only the probe's link measurement is public ([`measure_links`], for
//! `geforce_p2p.probe(measure=True)`): the subcommands are not an API.
//!
//! ```
//! // `gp2p --version` prints the version and succeeds, driver or not.
//! assert_eq!(gp2p_cli::run_cli(["gp2p".to_owned(), "--version".to_owned()]), 0);
//! ```

// No unsafe here: raw driver calls go through gp2p_cuda::raw and the safe APIs above it.
#![forbid(unsafe_code)]

mod bench;
mod devices;
mod error;
mod flags;
mod measure;
mod nccl;
mod plan;
mod plot;
mod probe;
mod report;
mod sizes;
mod table;

use clap::{Parser, Subcommand};

pub use error::{CliError, EXIT_FAILURE, EXIT_UNAVAILABLE, EXIT_USAGE};

/// What a command that found no driver or device says next: `gp2p` for the binary, `python -m
/// geforce_p2p` for pip users, who have no `gp2p` on PATH.
pub(crate) const NO_DRIVER_HINT: &str = "no NVIDIA driver or GPU here? `gp2p probe --example 2x4090` (or `python -m \
     geforce_p2p probe --example 2x4090`) shows the report of a common machine, `gp2p plan --ranks 4` the cost model's \
     plan; neither needs a GPU";
pub use probe::{AllCards, CardTogether, DeviceLink, LinkRates, PairCopy, measure_links};

/// Fast data movement between NVIDIA GPUs without driver P2P.
#[derive(Parser)]
#[command(name = "gp2p", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// For every pair of devices: is P2P on, and if not, exactly why and whether the driver
    /// patch (PATCH.md) would turn it on.
    Probe(probe::ProbeArgs),
    /// List the CUDA devices and what geforce-p2p can use.
    Devices,
    /// Benchmarks, nccl-tests style, with ceilings measured in the same run.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// The cost model's time per all-reduce algorithm (ring, one-shot, two-shot) and size for
    /// N ranks, its choice and what binds it; needs no GPU unless --measure.
    Plan(plan::PlanArgs),
    /// The NCCL door: `gp2p nccl env` prints the shell lines that load it in NCCL's place.
    #[command(subcommand)]
    Nccl(nccl::NcclCommand),
}

/// Run `gp2p` with `args` (the first is the program name, as in `std::env::args`; `String`s or `OsString`s) and return
/// its exit code: 0 on success, 1 for a failure, 2 for a command typed wrong (clap's code for
/// a usage error, and ours for a bad value), 3 where this machine has no driver or device. A
/// command that cannot run here also says what can (the bundled examples). Prints what the
/// binary prints; `--help` and `--version` print and return 0 instead of exiting the process.
pub fn run_cli<I, T>(args: I) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            // What `Cli::parse` does, short of exiting: help and version on stdout, usage
            // errors on stderr, clap's exit code.
            let _ = e.print();
            return e.exit_code();
        }
    };
    let result = match cli.command {
        Command::Probe(args) => probe::run(&args),
        Command::Devices => devices::run(),
        Command::Bench(command) => bench::run(command),
        Command::Plan(args) => plan::run(&args),
        Command::Nccl(command) => nccl::run(&command),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("gp2p: {e}");
            if e.is_unavailable() && !matches!(e, CliError::Hinted { .. }) {
                eprintln!("{NO_DRIVER_HINT}");
            }
            i32::from(e.exit_code())
        }
    }
}
