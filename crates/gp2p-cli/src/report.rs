//! Benchmark results: rows and the JSON document `gp2p bench --json FILE` writes.

use std::collections::BTreeMap;
use std::path::Path;

use geforce_p2p::Device;

use crate::error::CliError;

/// One measured configuration.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Row {
    pub bench: &'static str,
    /// How the data went: a copy route (`staged`, `peer`), a reduce source (`device`,
    /// `zero-copy`), or a host-copy direction (`to_host`, `from_host`).
    pub route: String,
    pub dtype: String,
    pub op: String,
    pub ranks: usize,
    /// Buffer size in bytes (nccl-tests' "size").
    pub bytes: usize,
    pub count: usize,
    pub time_us: f64,
    /// Buffer bytes per second, GB/s (1e9).
    pub algbw: f64,
    /// Bytes over the bottleneck per second, GB/s — what the ceiling bounds.
    pub busbw: f64,
    /// The ceiling that binds this row, GB/s, and its name in `ceilings`.
    pub ceiling: f64,
    pub ceiling_name: &'static str,
    pub ratio: f64,
    /// Host time spent enqueueing the operation (median), µs, where measured.
    pub enqueue_us: Option<f64>,
    /// The cost model's time for the row, µs, where the bench prices it (`bench comm`'s
    /// exact all-reduce).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_us: Option<f64>,
    pub wrong: usize,
    /// A lossy operation's error against the exact result (compressed all-reduce).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<Deviation>,
}

/// How far a lossy result is from the exact one, over every element of every rank, each as a
/// fraction of the exact result's own scale: the largest error over the largest magnitude,
/// and the root mean square of the errors over that of the exact values.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Deviation {
    pub max_relative: f64,
    pub rms_relative: f64,
}

impl Deviation {
    /// The deviation of `got` from `exact` (pairs of equal length; NaN where both are NaN,
    /// or infinite, counts as equal and is left out).
    pub fn of(pairs: impl Iterator<Item = (f64, f64)>) -> Deviation {
        let (mut max_err, mut max_abs, mut sq_err, mut sq_abs) = (0.0f64, 0.0f64, 0.0f64, 0.0f64);
        for (got, exact) in pairs {
            if !exact.is_finite() {
                continue;
            }
            let err = (got - exact).abs();
            max_err = max_err.max(err);
            max_abs = max_abs.max(exact.abs());
            sq_err += err * err;
            sq_abs += exact * exact;
        }
        let ratio = |a: f64, b: f64| {
            if b > 0.0 {
                a / b
            } else if a > 0.0 {
                f64::INFINITY
            } else {
                0.0
            }
        };
        Deviation { max_relative: ratio(max_err, max_abs), rms_relative: ratio(sq_err.sqrt(), sq_abs.sqrt()) }
    }
}

/// What the GPU was.
#[derive(Debug, Clone, serde::Serialize)]
pub struct GpuInfo {
    pub name: String,
    pub driver: String,
    pub pci_bus_id: String,
    /// PCIe link generation and width come from NVML, which the probe brings.
    pub link: Option<String>,
}

/// The whole report, as written by `--json`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    /// The command line that made the report, where recorded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// The commit the binary was built from, where the caller said it (`GP2P_COMMIT`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// The machine it ran on, where the caller said it (`GP2P_MACHINE`: `h200`, `h200-x2` ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub machine: Option<String>,
    pub gpu: GpuInfo,
    /// Ceilings measured in this run, GB/s, by name.
    pub ceilings: BTreeMap<&'static str, f64>,
    pub repeats: usize,
    /// The streams the bench enqueued on: `own` (new non-blocking ones) or `legacy`.
    pub streams: &'static str,
    pub rows: Vec<Row>,
}

impl Report {
    /// The report of a bench that enqueued on `streams` (`own` unless said).
    pub fn on_streams(mut self, streams: &'static str) -> Report {
        self.streams = streams;
        self
    }

    /// A report for rows measured on `device`.
    pub fn new(
        device: &Device,
        ceilings: BTreeMap<&'static str, f64>,
        repeats: usize,
        rows: Vec<Row>,
    ) -> Result<Report, CliError> {
        let (major, minor) = geforce_p2p::cuda::driver_version()?;
        let gpu = GpuInfo {
            name: device.info().name.clone(),
            driver: format!("CUDA {major}.{minor}"),
            pci_bus_id: device.info().pci_bus_id.clone(),
            link: None,
        };
        Ok(Report { command: None, commit: None, machine: None, gpu, ceilings, repeats, streams: "own", rows })
    }

    /// The report with its command line (`args`, quoted for a POSIX shell where a word needs
    /// it), and the machine and commit where given (empty values count as not given).
    pub fn described(
        mut self,
        args: impl IntoIterator<Item = String>,
        machine: Option<String>,
        commit: Option<String>,
    ) -> Report {
        let words: Vec<String> = args.into_iter().map(|a| shell_word(&a)).collect();
        self.command = (!words.is_empty()).then(|| words.join(" "));
        self.machine = machine.filter(|m| !m.trim().is_empty());
        self.commit = commit.filter(|c| !c.trim().is_empty());
        self
    }

    /// Write the report as pretty JSON to `path`.
    pub fn write_json(&self, path: &Path) -> Result<(), CliError> {
        let io = |source| CliError::Io { path: path.display().to_string(), source };
        let text = serde_json::to_string_pretty(self).map_err(|e| io(std::io::Error::other(e)))?;
        std::fs::write(path, text + "\n").map_err(io)
    }
}

/// `word` as a POSIX shell reads it back: as it is when it holds only safe characters, else
/// in single quotes.
fn shell_word(word: &str) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || "_-./:=,+@%".contains(c);
    if !word.is_empty() && word.chars().all(safe) {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_serialise_with_the_fields_design_md_names() {
        let row = Row {
            bench: "copy",
            route: "staged".into(),
            dtype: "u32".into(),
            op: "none".into(),
            ranks: 1,
            bytes: 4096,
            count: 1024,
            time_us: 9.5,
            algbw: 0.43,
            busbw: 0.43,
            ceiling: 50.0,
            ceiling_name: "duplex",
            ratio: 0.0086,
            enqueue_us: Some(4.0),
            model_us: None,
            wrong: 0,
            error: None,
        };
        let value = serde_json::to_value(&row).unwrap();
        for field in [
            "bench", "route", "dtype", "op", "ranks", "bytes", "time_us", "algbw", "busbw", "ceiling", "ratio", "wrong",
        ] {
            assert!(value.get(field).is_some(), "row lacks {field}: {value}");
        }
        let report = Report {
            command: None,
            commit: None,
            machine: None,
            gpu: GpuInfo {
                name: "x".into(),
                driver: "CUDA 13.0".into(),
                pci_bus_id: "0000:00:06.0".into(),
                link: None,
            },
            ceilings: BTreeMap::from([("duplex", 50.0)]),
            repeats: 20,
            streams: "own",
            rows: vec![row],
        }
        .on_streams("legacy");
        let value = serde_json::to_value(&report).unwrap();
        assert_eq!(value["streams"], "legacy", "the streams a bench ran on tell its files apart");
        assert_eq!(value["ceilings"]["duplex"], 50.0);
        assert_eq!(value["gpu"]["name"], "x");
        assert_eq!(value["rows"].as_array().map(Vec::len), Some(1));
    }

    #[test]
    fn a_described_report_heads_its_json_with_command_and_commit() {
        let gpu = GpuInfo { name: "x".into(), driver: "CUDA 13.0".into(), pci_bus_id: "0".into(), link: None };
        let bare = Report {
            command: None,
            commit: None,
            machine: None,
            gpu,
            ceilings: BTreeMap::new(),
            repeats: 1,
            streams: "own",
            rows: vec![],
        };
        let text = serde_json::to_string(&bare).unwrap();
        assert!(!text.contains("command") && !text.contains("commit"), "nothing recorded, nothing written: {text}");
        let args = ["bundle/bin/gp2p", "bench", "copy", "-b", "4K", "--label", "it's a run"].map(String::from);
        let described = bare.described(args, Some("h200".into()), Some(String::new()));
        let text = serde_json::to_string(&described).unwrap();
        assert!(
            text.starts_with(
                r#"{"command":"bundle/bin/gp2p bench copy -b 4K --label 'it'\\''s a run'","machine":"h200""#
            ),
            "the command first, quoted as a shell reads it: {text}"
        );
        assert!(!text.contains("commit"), "an empty GP2P_COMMIT is no commit: {text}");
    }
}
