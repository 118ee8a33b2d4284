//! Saved facts of common machines, bundled into the binary, so that someone without a GPU
//! (or before buying one) sees what the probe reports and why: `gp2p probe --example NAME`.
//! Each is a facts file as `gp2p probe --json` writes one, marked with [`Facts::example`],
//! so that every report of it says it is an example.

use crate::Result;
use crate::error::Error;
use crate::facts::Facts;

/// One bundled example.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Example {
    /// What `--example` takes.
    pub name: &'static str,
    /// The facts, as JSON.
    pub json: &'static str,
}

/// Every bundled example, in the order `gp2p probe --example` lists them.
pub const EXAMPLES: &[Example] = &[
    Example { name: "2x4090", json: include_str!("../data/examples/2x4090.json") },
    Example { name: "8x4090-epyc", json: include_str!("../data/examples/8x4090-epyc.json") },
    Example { name: "4x3090-switch", json: include_str!("../data/examples/4x3090-switch.json") },
];

/// The example called `name`.
pub fn example(name: &str) -> Option<&'static Example> {
    EXAMPLES.iter().find(|e| e.name == name)
}

impl Example {
    /// Its facts, read and checked as `--from` reads a saved file.
    pub fn facts(&self) -> Result<Facts> {
        let path = format!("bundled example {}", self.name);
        let facts: Facts =
            serde_json::from_str(self.json).map_err(|e| Error::Facts { path: path.clone(), reason: e.to_string() })?;
        facts.check().map_err(|reason| Error::Inconsistent { path, reason })?;
        Ok(facts)
    }

    /// The machine it describes, in words.
    pub fn machine(&self) -> String {
        self.facts().ok().and_then(|f| f.example).unwrap_or_default()
    }
}

/// The list `gp2p probe --example` prints: one line per example, its name and machine.
pub fn list() -> String {
    EXAMPLES.iter().map(|e| format!("  {:<14} {}\n", e.name, e.machine())).collect()
}
