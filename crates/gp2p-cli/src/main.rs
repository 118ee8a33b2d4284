//! `gp2p`: the command line over [`gp2p_cli::run_cli`], which the Python package calls too.

// No unsafe here: raw driver calls go through gp2p_cuda::raw and the safe APIs above it.
#![forbid(unsafe_code)]

use std::process::ExitCode;

fn main() -> ExitCode {
    let code = gp2p_cli::run_cli(std::env::args_os());
    // Codes are 0, 1 and 2 (clap's usage error); anything else would be a bug, reported as 1.
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}
