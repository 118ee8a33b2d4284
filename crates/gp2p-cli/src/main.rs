//! `gp2p`: see what the CUDA layer sees, and benchmark the data paths against the link and
//! memory ceilings measured in the same run.

mod bench;
mod devices;
mod error;
mod measure;
mod plot;
mod probe;
mod report;
mod sizes;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Probe(args) => probe::run(&args),
        Command::Devices => devices::run(),
        Command::Bench(command) => bench::run(command),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gp2p: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
