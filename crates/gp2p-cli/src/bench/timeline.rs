//! `gp2p bench comm --timeline DIR`: one more call of each size with its steps stamped on the
//! GPU (`Communicator::start_timeline`), every rank's stamps written to
//! `DIR/timeline-<size>-rank<r>.json`, and rank 0's summed by stream and step: where the call's
//! time went, and at what rate each kind of copy ran. Where the ranks share a GPU, rank 0 also
//! reads every rank's file and says how much of the call some copy was crossing the link, each
//! way ([`link_busy`]): the link's idle time is what the pipeline leaves on the table.
//!
//! A step's time is the gap since the stamp before it on the same stream (for a stream's first
//! step, since the call's start on the caller's stream), so it holds whatever the step waited
//! for before it ran: a flag's wait is the peer's lateness, a copy's time its transfer and
//! launch. The clock is the GPU's, the same for every process on it, so the ranks' files line
//! up on one axis.

use std::collections::BTreeMap;
use std::path::Path;

use geforce_p2p::cuda::{Stamp, Stamps};
use serde::{Deserialize, Serialize};

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
    let began = began(stamps.iter().map(|s| (s.mark.stream, s.ns)), start);
    let mut sums: Vec<StepSum> = Vec::new();
    for (stamp, since) in stamps.iter().zip(began) {
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

/// When each of a rank's steps began, from its stamps' streams and times in the order
/// enqueued: at the stamp before it on its stream, or at `first` for a stream's first step.
fn began<'a>(stamps: impl IntoIterator<Item = (&'a str, u64)>, first: u64) -> Vec<u64> {
    let mut last_on: BTreeMap<&str, u64> = BTreeMap::new();
    stamps.into_iter().map(|(stream, ns)| last_on.insert(stream, ns).unwrap_or(first)).collect()
}

/// Rank 0's summary of one traced call of `bytes`, as comment lines under the table;
/// `untraced_us` the row's time a call, beside which the traced call's own shows what its
/// stamps cost.
pub(crate) fn summary(bytes: usize, world: usize, read: &Stamps, file: &Path, untraced_us: f64) -> String {
    let stamps = &read.stamps;
    let (span, sums) = sum_steps(stamps);
    let dropped = match read.dropped {
        0 => String::new(),
        n => format!(", {n} more marks past the timeline's room not stamped"),
    };
    let mut out = format!(
        "# timeline of one call of {} among {world}, rank 0: {:.1} us from its start to its end, where the row's \
         untraced calls took {untraced_us:.1} us each ({} stamps{dropped}, each a launch of its own, so a step's time \
         also holds any wait for the host to launch what comes after its stamp; every rank's in {})\n\
         #   {:<8} {:<16} {:>5} {:>10} {:>6} {:>7}\n",
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

/// One stamp as a rank's file holds it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct FileStamp {
    pub(crate) stream: String,
    pub(crate) what: String,
    pub(crate) bytes: usize,
    pub(crate) ns: u64,
}

/// What each rank writes: its stamps of the call, in the order enqueued.
#[derive(Serialize, Deserialize)]
struct TimelineFile {
    bytes: usize,
    rank: usize,
    world: usize,
    stamps: Vec<FileStamp>,
}

/// The stamps rank `rank` wrote for a call of `bytes` in `dir`.
pub(crate) fn read(dir: &Path, bytes: usize, rank: usize) -> Result<Vec<FileStamp>, CliError> {
    let path = file_for(dir, bytes, rank);
    let bad = |why: String| CliError::Usage(format!("--timeline: cannot read {}: {why}", path.display()));
    let text = std::fs::read_to_string(&path).map_err(|e| bad(e.to_string()))?;
    let file: TimelineFile = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    Ok(file.stamps)
}

/// How much of a call some copy was crossing the link, each way, over every rank's stamps.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct LinkBusy {
    /// From the first stamp of any rank to the last, ns.
    pub(crate) span_ns: u64,
    /// Time at least one device-to-host copy was running, ns, and the bytes they moved.
    pub(crate) up_ns: u64,
    pub(crate) up_bytes: usize,
    /// The same host to device (DMA landings, and folds that read the slots across the link).
    pub(crate) down_ns: u64,
    pub(crate) down_bytes: usize,
}

/// Which way a step's bytes crossed the link, if it was a crossing: copies out and wires' DMAs
/// on the send stream go up; landings' DMAs, landing copies, wires' DMAs and zero-copy folds on
/// the receive stream come down.
fn direction(stream: &str, what: &str) -> Option<bool> {
    match (stream, what) {
        ("send", "copy out" | "wire dma") => Some(true),
        ("receive", "land dma" | "land copy" | "wire dma" | "fold zero-copy") => Some(false),
        _ => None,
    }
}

/// [`LinkBusy`] of the ranks' stamps (each rank's in the order enqueued): a crossing runs from
/// the stamp before it on its stream (the call's first stamp for a stream's first step) to its
/// own, and the crossings of every rank are merged each way.
pub(crate) fn link_busy(ranks: &[Vec<FileStamp>]) -> LinkBusy {
    let all = ranks.iter().flatten();
    let start = all.clone().map(|s| s.ns).min().unwrap_or(0);
    let end = all.map(|s| s.ns).max().unwrap_or(0);
    let (mut up, mut down) = (Vec::new(), Vec::new());
    let (mut up_bytes, mut down_bytes) = (0, 0);
    for stamps in ranks {
        let first = stamps.iter().map(|s| s.ns).min().unwrap_or(start);
        let began = began(stamps.iter().map(|s| (s.stream.as_str(), s.ns)), first);
        for (s, since) in stamps.iter().zip(began) {
            match direction(&s.stream, &s.what) {
                Some(true) => {
                    up.push((since, s.ns));
                    up_bytes += s.bytes;
                }
                Some(false) => {
                    down.push((since, s.ns));
                    down_bytes += s.bytes;
                }
                None => {}
            }
        }
    }
    LinkBusy { span_ns: end - start, up_ns: union_ns(up), up_bytes, down_ns: union_ns(down), down_bytes }
}

/// Nanoseconds covered by the union of `spans` (start, end).
fn union_ns(mut spans: Vec<(u64, u64)>) -> u64 {
    spans.sort_unstable();
    let (mut covered, mut reach) = (0, 0);
    for (start, end) in spans {
        let start = start.max(reach);
        if end > start {
            covered += end - start;
            reach = end;
        }
    }
    covered
}

/// The line rank 0 prints under its summary for every rank's files.
pub(crate) fn link_line(busy: &LinkBusy, world: usize) -> String {
    let share = |ns: u64| if busy.span_ns > 0 { 100.0 * ns as f64 / busy.span_ns as f64 } else { 0.0 };
    let rate = |bytes: usize, ns: u64| if ns > 0 { bytes as f64 / ns as f64 } else { 0.0 };
    format!(
        "#   all {world} ranks on the link: some copy up {:.1}% of the call ({:.1} GB/s while one ran), some copy \
         down {:.1}% ({:.1} GB/s)\n",
        share(busy.up_ns),
        rate(busy.up_bytes, busy.up_ns),
        share(busy.down_ns),
        rate(busy.down_bytes, busy.down_ns)
    )
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
        .map(|s| FileStamp { stream: s.mark.stream.into(), what: s.mark.what.into(), bytes: s.mark.bytes, ns: s.ns })
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
        let text = summary(1 << 20, 2, &read, Path::new("out/timeline-1M-rank0.json"), 1.5);
        assert!(text.contains("the row's untraced calls took 1.5 us each"), "{text}");
        assert!(text.contains("3 more marks past the timeline's room not stamped"), "{text}");
        let line = text.lines().find(|l| l.contains("copy out")).expect("a line for the copies");
        assert!(line.contains("100.0%"), "{line}");
        assert!(line.contains("25.0"), "50,000 bytes in 2,000 ns is 25 GB/s: {line}");
        assert!(text.contains("2.0 us from its start"), "{text}");
    }

    #[test]
    fn the_link_is_busy_where_any_rank_s_crossing_runs_each_way() {
        let at =
            |stream: &str, what: &str, bytes, ns| FileStamp { stream: stream.into(), what: what.into(), bytes, ns };
        // Rank 0 copies out from 1,000 to 3,000 ns and lands from 3,000 to 5,000; rank 1 copies
        // out from 2,000 to 4,000 (overlapping rank 0's) and folds from its slots across the
        // link from 4,500 to 6,000. Waits cross nothing.
        let rank0 = vec![
            at("caller", "start", 0, 1_000),
            at("send", "copy out", 4_000, 3_000),
            at("receive", "wait flag", 0, 3_000),
            at("receive", "land dma", 4_000, 5_000),
            at("caller", "end", 0, 6_000),
        ];
        let rank1 = vec![
            at("caller", "start", 0, 1_500),
            at("send", "wait slot free", 0, 2_000),
            at("send", "copy out", 4_000, 4_000),
            at("receive", "wait flag", 0, 4_500),
            at("receive", "fold zero-copy", 4_000, 6_000),
            at("caller", "end", 0, 6_500),
        ];
        let busy = link_busy(&[rank0, rank1]);
        assert_eq!(busy.span_ns, 5_500);
        assert_eq!((busy.up_ns, busy.up_bytes), (3_000, 8_000), "1,000..4,000 merged");
        assert_eq!((busy.down_ns, busy.down_bytes), (3_000, 8_000), "3,000..5,000 and 4,500..6,000 merged");
        let line = link_line(&busy, 2);
        assert!(line.contains("up 54.5% of the call (2.7 GB/s") && line.contains("down 54.5%"), "{line}");
        assert_eq!(union_ns(vec![(5, 9), (1, 3), (2, 4), (9, 9)]), 7);
    }

    #[test]
    fn a_rank_s_file_reads_back_as_it_was_written() {
        let dir = std::env::temp_dir().join(format!("gp2p-timeline-{}", std::process::id()));
        let stamps = [stamp("caller", "start", 0, 7), stamp("send", "copy out", 4096, 9)];
        write(&dir, 1 << 20, 1, 2, &stamps).expect("written");
        let back = read(&dir, 1 << 20, 1).expect("read");
        let _ = std::fs::remove_dir_all(&dir);
        let want: Vec<FileStamp> = stamps
            .iter()
            .map(|s| FileStamp {
                stream: s.mark.stream.into(),
                what: s.mark.what.into(),
                bytes: s.mark.bytes,
                ns: s.ns,
            })
            .collect();
        assert_eq!(back, want);
        assert!(read(&dir, 1 << 20, 0).is_err_and(|e| e.to_string().contains("--timeline: cannot read")));
    }

    #[test]
    fn no_stamps_sum_to_nothing() {
        assert_eq!(sum_steps(&[]), (0, Vec::new()));
    }
}
