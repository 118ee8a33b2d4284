//! Running the tools a chore calls (cargo, python, maturin), failing with their names.

use std::process::Command;

/// Run `command`, failing with its name if it cannot start or exits non-zero.
pub fn run(command: &mut Command) -> Result<(), String> {
    let shown = format!("{:?}", command);
    let status = command.status().map_err(|e| format!("running {shown}: {e}"))?;
    if status.success() { Ok(()) } else { Err(format!("{shown} failed: {status}")) }
}
