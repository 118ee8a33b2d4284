//! `gp2p bench comm --timeline DIR`: one more call of each size with its steps stamped on the
//! GPU (`Communicator::start_timeline`), every rank's stamps written to
//! `DIR/timeline-<size>-rank<r>.json`, and rank 0's summed by stream and step: where the call's
//! time went, and at what rate each kind of copy ran.
//!
//! A step's time is the gap since the stamp before it on the same stream (for a stream's first
//! step, since the call's start on the caller's stream), so it holds whatever the step waited
//! for before it ran: a flag's wait is the peer's lateness, a copy's time its transfer and
//! launch. The clock is the GPU's, the same for every process on it, so the ranks' files line
//! up on one axis.

use std::collections::BTreeMap;
use std::path::Path;

use geforce_p2p::cuda::{Stamp, Stamps};
use serde::Serialize;

use crate::error::CliError;
use crate::sizes::format_size;

/// One kind of step on one stream, over a traced call.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StepSum {
    pub(crate) stream: &'static str,
    pub(crate) what: &'static str,
    pub(crate) count: usize,
    /// The steps' time, in nanoseconds.
    pub(crate) ns: u64,
    /// The bytes they moved.
    pub(crate) bytes: usize,
}

/// The call's span (nanoseconds from its first stamp to its last) and its steps summed by
/// stream and kind, in the order each kind first appears.
pub(crate) fn sum_steps(stamps: &[Stamp]) -> (u64, Vec<StepSum>) {
    let Some(first) = stamps.first() else { return (0, Vec::new()) };
    let start = stamps.iter().map(|s| s.ns).min().unwrap_or(first.ns);
    let end = stamps.iter().map(|s| s.ns).max().unwrap_or(first.ns);
    let mut last_on: BTreeMap<&str, u64> = BTreeMap::new();
    let mut sums: Vec<StepSum> = Vec::new();
    for stamp in stamps {
        let since = last_on.insert(stamp.mark.stream, stamp.ns).unwrap_or(start);
        let gap = stamp.ns.saturating_sub(since);
        let (stream, what) = (stamp.mark.stream, stamp.mark.what);
        match sums.iter_mut().find(|s| s.stream == stream && s.what == what) {
            Some(sum) => {
                sum.count += 1;
                sum.ns += gap;
                sum.bytes += stamp.mark.bytes;
            }
            None => sums.push(StepSum { stream, what, count: 1, ns: gap, bytes: stamp.mark.bytes }),
        }
    }
    (end - start, sums)
}

/// Rank 0's summary of one traced call of `bytes`, as comment lines under the table.
pub(crate) fn summary(bytes: usize, world: usize, read: &Stamps, file: &Path) -> String {
    let stamps = &read.stamps;
    let (span, sums) = sum_steps(stamps);
    let dropped = match read.dropped {
        0 => String::new(),
        n => format!(", {n} more marks past the timeline's room not stamped"),
    };
    let mut out = format!(
        "# timeline of one call of {} among {world}, rank 0: {:.1} us from its start to its end ({} stamps{dropped}; \
         every rank's in {})\n#   {:<8} {:<16} {:>5} {:>10} {:>6} {:>7}\n",
        format_size(bytes),
        span as f64 / 1e3,
        stamps.len(),
        file.display(),
        "stream",
        "step",
        "count",
        "total us",
        "share",
        "GB/s"
    );
    for s in &sums {
        let share = if span > 0 { 100.0 * s.ns as f64 / span as f64 } else { 0.0 };
        let rate = if s.bytes > 0 && s.ns > 0 { format!("{:.1}", s.bytes as f64 / s.ns as f64) } else { String::new() };
        out.push_str(&format!(
            "#   {:<8} {:<16} {:>5} {:>10.1} {:>5.1}% {:>7}\n",
            s.stream,
            s.what,
            s.count,
            s.ns as f64 / 1e3,
            share,
            rate
        ));
    }
    out
}

/// What each rank writes: its stamps of the call, in the order enqueued.
#[derive(Serialize)]
struct TimelineFile<'a> {
    bytes: usize,
    rank: usize,
    world: usize,
    stamps: Vec<StampRecord<'a>>,
}

#[derive(Serialize)]
struct StampRecord<'a> {
    stream: &'a str,
    what: &'a str,
    bytes: usize,
    ns: u64,
}

/// The file rank `rank`'s stamps of a call of `bytes` go to, in `dir`.
pub(crate) fn file_for(dir: &Path, bytes: usize, rank: usize) -> std::path::PathBuf {
    dir.join(format!("timeline-{}-rank{rank}.json", format_size(bytes)))
}

/// Write this rank's stamps of a call of `bytes` to its file in `dir` (made if missing).
pub(crate) fn write(dir: &Path, bytes: usize, rank: usize, world: usize, stamps: &[Stamp]) -> Result<(), CliError> {
    std::fs::create_dir_all(dir)
        .map_err(|e| CliError::Usage(format!("--timeline {}: cannot make the folder: {e}", dir.display())))?;
    let records = stamps
        .iter()
        .map(|s| StampRecord { stream: s.mark.stream, what: s.mark.what, bytes: s.mark.bytes, ns: s.ns })
        .collect();
    let file = TimelineFile { bytes, rank, world, stamps: records };
    let path = file_for(dir, bytes, rank);
    let text = serde_json::to_string_pretty(&file)
        .map_err(|e| CliError::Usage(format!("--timeline: cannot write {}: {e}", path.display())))?;
    std::fs::write(&path, text)
        .map_err(|e| CliError::Usage(format!("--timeline: cannot write {}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use geforce_p2p::cuda::Mark;

    use super::*;

    fn stamp(stream: &'static str, what: &'static str, bytes: usize, ns: u64) -> Stamp {
        Stamp { mark: Mark { stream, what, bytes }, ns }
    }

    #[test]
    fn each_step_takes_the_gap_since_its_stream_s_last_stamp_and_a_stream_s_first_since_the_start() {
        let stamps = [
            stamp("caller", "start", 0, 1_000),
            stamp("send", "copy out", 4_000, 3_000),
            stamp("receive", "wait flag", 0, 4_000),
            stamp("send", "copy out", 4_000, 5_000),
            stamp("receive", "land copy", 8_000, 6_000),
            stamp("caller", "end", 0, 7_000),
        ];
        let (span, sums) = sum_steps(&stamps);
        assert_eq!(span, 6_000);
        let find = |stream, what| sums.iter().find(|s| s.stream == stream && s.what == what).cloned();
        let copies = find("send", "copy out").expect("copies summed");
        assert_eq!((copies.count, copies.ns, copies.bytes), (2, 2_000 + 2_000, 8_000));
        assert_eq!(find("receive", "wait flag").map(|s| s.ns), Some(3_000), "first on its stream: since the start");
        assert_eq!(find("receive", "land copy").map(|s| s.ns), Some(2_000));
        assert_eq!(find("caller", "end").map(|s| s.ns), Some(6_000), "the caller's stream waited for the join");
        assert_eq!(sums[0].what, "start", "kinds in the order they first appear");
    }

    #[test]
    fn the_summary_gives_each_kind_its_share_of_the_span_and_the_rate_of_what_it_moved() {
        let read = Stamps {
            stamps: vec![stamp("caller", "start", 0, 0), stamp("send", "copy out", 50_000, 2_000)],
            dropped: 3,
        };
        let text = summary(1 << 20, 2, &read, Path::new("out/timeline-1M-rank0.json"));
        assert!(text.contains("3 more marks past the timeline's room not stamped"), "{text}");
        let line = text.lines().find(|l| l.contains("copy out")).expect("a line for the copies");
        assert!(line.contains("100.0%"), "{line}");
        assert!(line.contains("25.0"), "50,000 bytes in 2,000 ns is 25 GB/s: {line}");
        assert!(text.contains("2.0 us from its start"), "{text}");
    }

    #[test]
    fn no_stamps_sum_to_nothing() {
        assert_eq!(sum_steps(&[]), (0, Vec::new()));
    }
}
