//! Plots of bench results as SVG: busbw (GB/s) against size, one line per series with every
//! measured point marked, each ceiling dashed; the size axis is logarithmic and labelled in
//! binary units at powers of two (`4 KiB` … `1 GiB`); under the title, the machine and the
//! commit the run was made at.
//!
//! `gp2p bench … --plot FILE.svg` draws the run it just made. `gp2p bench plot --from A.json
//! [--from B.json …] --plot FILE.svg` draws saved reports again, with no GPU: the first
//! file's bench picks the rows of every file, so NCCL's rows (`benches/nccl/nccl_shm.py`) or
//! torch's (`benches/python/compare_torch.py`) are drawn beside ours where a run measured
//! them. A live plot is drawn through the same JSON it writes, so the two drawings agree.
//!
//! Machine and commit: a report's `machine` and `commit` fields (`gp2p bench` fills them from
//! `GP2P_MACHINE` and `GP2P_COMMIT`, which `benches/device/figures.sh` sets); `--machine` and
//! `--commit` override them; without either the GPU's name stands for the machine and the
//! subtitle says the commit was not recorded.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use clap::Args;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use serde::Deserialize;

use crate::error::CliError;
use crate::report::Report;

const WIDTH: u32 = 960;
const HEIGHT: u32 = 600;
/// At most this many labelled sizes; a light grid line marks every power of two between.
const MAX_SIZE_LABELS: usize = 10;
/// Each series' colour, in order: ours first, then the rivals; the ceilings follow.
const PALETTE: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

/// `gp2p bench plot`: draw saved reports again.
#[derive(Args)]
pub struct PlotArgs {
    /// A report saved by `gp2p bench … --json`, or any JSON object whose `rows` carry
    /// `bench`, `route` (or `way`), `bytes` and `busbw` (or `GBps`), as nccl_shm.py's and
    /// compare_torch.py's do. Repeat to draw several files' series together; the first file's
    /// bench picks the rows, its ceilings are drawn, its machine and commit go under the title.
    #[arg(long = "from", value_name = "FILE", required = true)]
    from: Vec<PathBuf>,
    /// The SVG file to write.
    #[arg(long, value_name = "FILE.svg")]
    plot: PathBuf,
    /// Draw only this series (a route as the files name it: `staged`, `auto`, `nccl-shm`,
    /// `a.cpu().to(dst)`); repeat for several. Default: every series of the bench.
    #[arg(long = "series", value_name = "NAME")]
    series: Vec<String>,
    /// The machine named under the title (default: the first file's `machine`, else its GPU).
    #[arg(long)]
    machine: Option<String>,
    /// The commit named under the title (default: the first file's `commit`).
    #[arg(long)]
    commit: Option<String>,
    /// The title (default: `gp2p bench <the first file's bench>`).
    #[arg(long)]
    title: Option<String>,
}

/// `gp2p bench plot`.
pub fn run(args: &PlotArgs) -> Result<(), CliError> {
    let mut docs = Vec::new();
    for path in &args.from {
        let read = |why: String| CliError::Read { path: path.display().to_string(), why };
        let text = std::fs::read_to_string(path).map_err(|e| read(e.to_string()))?;
        let doc: Doc = serde_json::from_str(&text).map_err(|e| read(e.to_string()))?;
        docs.push(doc);
    }
    let options = Options {
        series: args.series.clone(),
        machine: args.machine.clone(),
        commit: args.commit.clone(),
        title: args.title.clone(),
    };
    let figure = figure(&docs, &options).map_err(CliError::Usage)?;
    draw_to(&args.plot, &figure)?;
    eprintln!("wrote {}", args.plot.display());
    Ok(())
}

/// `gp2p bench … --plot`: the report just measured, drawn as `bench plot` would draw its JSON.
pub fn plot_rows(path: &Path, title: &str, report: &Report) -> Result<(), CliError> {
    let invalid = |e: serde_json::Error| CliError::Io {
        path: path.display().to_string(),
        source: std::io::Error::other(format!("the report as JSON: {e}")),
    };
    let doc: Doc = serde_json::to_value(report).and_then(serde_json::from_value).map_err(invalid)?;
    let options = Options { title: Some(format!("gp2p bench {title}")), ..Options::default() };
    let figure = figure(&[doc], &options).map_err(CliError::Usage)?;
    draw_to(path, &figure)
}

/// A saved report as the plot reads it: only the fields it draws, each optional, so that
/// files written by other tools (with the same row fields) are read too.
#[derive(Debug, Default, Deserialize)]
struct Doc {
    #[serde(default)]
    commit: Option<String>,
    #[serde(default)]
    machine: Option<String>,
    #[serde(default, alias = "gpus")]
    gpu: Option<Gpu>,
    #[serde(default)]
    ceilings: BTreeMap<String, f64>,
    #[serde(default)]
    rows: Vec<DocRow>,
}

/// `gpu` as `gp2p bench` writes it (an object with a name), as nccl_shm.py does (a name), or
/// `gpus` as compare_torch.py does (a list of names).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Gpu {
    Name(String),
    Info { name: String },
    Names(Vec<String>),
}

impl Gpu {
    fn name(&self) -> String {
        match self {
            Gpu::Name(name) | Gpu::Info { name } => name.clone(),
            Gpu::Names(names) => match names.first() {
                Some(first) if names.iter().all(|n| n == first) => format!("{} x {first}", names.len()),
                _ => names.join(", "),
            },
        }
    }
}

#[derive(Debug, Deserialize)]
struct DocRow {
    #[serde(default)]
    bench: Option<String>,
    #[serde(default, alias = "way")]
    route: Option<String>,
    #[serde(default)]
    dtype: Option<String>,
    #[serde(default)]
    bytes: Option<f64>,
    #[serde(default, alias = "GBps")]
    busbw: Option<f64>,
    #[serde(default)]
    ceiling_name: Option<String>,
    /// The binding link's bytes per direction per second over `ceiling`: busbw / ceiling,
    /// except where several ranks share one link (logical ranks on one card), whose traffic
    /// all crosses it.
    #[serde(default)]
    ratio: Option<f64>,
}

/// What `bench plot`'s flags choose.
#[derive(Debug, Default)]
struct Options {
    series: Vec<String>,
    machine: Option<String>,
    commit: Option<String>,
    title: Option<String>,
}

/// One line of the plot.
#[derive(Debug, PartialEq)]
struct Series {
    name: String,
    /// (bytes, GB/s), in the files' order.
    points: Vec<(f64, f64)>,
    /// From a `gp2p bench` report (one with ceilings: filled circles), or from another
    /// tool's file (NCCL's, torch's: triangles).
    ours: bool,
}

/// Everything drawn, decided before drawing (and tested without it).
#[derive(Debug)]
struct Figure {
    title: String,
    subtitle: String,
    series: Vec<Series>,
    /// (legend name, GB/s), dashed.
    ceilings: Vec<(String, f64)>,
}

/// Decide the figure: the bench of the first file's first row picks every file's rows; a
/// series per route (and per dtype where a file holds several); the first file's ceilings
/// that its drawn rows name; the subtitle's machine and commit. A series from a file whose
/// commit differs from the first file's names that commit in its legend entry.
fn figure(docs: &[Doc], options: &Options) -> Result<Figure, String> {
    let first = docs.first().ok_or("no report to plot")?;
    let bench = first.rows.iter().find_map(|r| r.bench.clone()).ok_or("the first file has no rows with a bench")?;
    let mut series: Vec<Series> = Vec::new();
    // Each ceiling the first file's drawn rows name, with how many times their busbw the
    // link carries (1, or the ranks sharing one link).
    let mut ceiling_names: Vec<(String, f64)> = Vec::new();
    for (i, doc) in docs.iter().enumerate() {
        let rows: Vec<&DocRow> = doc.rows.iter().filter(|r| r.bench.as_deref().is_none_or(|b| b == bench)).collect();
        let several_dtypes = rows.iter().any(|r| r.dtype != rows[0].dtype);
        let other_commit = match (doc.commit.as_deref().map(commit_id), first.commit.as_deref().map(commit_id)) {
            (Some(c), Some(f)) if i > 0 && c != f => Some(c.to_owned()),
            (Some(c), None) if i > 0 => Some(c.to_owned()),
            _ => None,
        };
        let ours = !doc.ceilings.is_empty();
        let mut lines: Vec<Series> = Vec::new();
        for row in rows {
            let (Some(bytes), Some(gbps)) = (row.bytes, row.busbw) else { continue };
            if !(bytes > 0.0 && gbps.is_finite()) {
                continue;
            }
            let route = row.route.clone().unwrap_or_else(|| "?".into());
            if !options.series.is_empty() && !options.series.contains(&route) {
                continue;
            }
            let mut name = match (&row.dtype, several_dtypes) {
                (Some(dtype), true) => format!("{route} {dtype}"),
                _ => route,
            };
            if let Some(commit) = &other_commit {
                name = format!("{name} (at {commit})");
            }
            if let (0, Some(c)) = (i, &row.ceiling_name) {
                let ceiling = first.ceilings.get(c).copied().unwrap_or(0.0);
                let share = match row.ratio {
                    Some(ratio) if ratio > 0.0 && gbps > 0.0 && ceiling > 0.0 => (ratio * ceiling / gbps).max(1.0),
                    _ => 1.0,
                };
                if !ceiling_names.iter().any(|(n, _)| n == c) {
                    ceiling_names.push((c.clone(), share));
                }
            }
            match lines.iter_mut().find(|s| s.name == name) {
                Some(line) => line.points.push((bytes, gbps)),
                None => lines.push(Series { name, points: vec![(bytes, gbps)], ours }),
            }
        }
        for mut line in lines {
            // Two files with a series of one name: the later one is told apart by its file's place.
            if series.iter().any(|s| s.name == line.name) {
                line.name = format!("{} (file {})", line.name, i + 1);
            }
            series.push(line);
        }
    }
    if series.is_empty() {
        return Err(format!("no {bench} rows with bytes and GB/s to plot (series asked: {:?})", options.series));
    }
    // Beside other tools' series, ours say whose they are.
    if series.iter().any(|s| !s.ours) {
        for s in series.iter_mut().filter(|s| s.ours) {
            s.name = format!("gp2p {}", s.name);
        }
    }
    // A ceiling that ranks share (their rows' ratio counts every rank's bytes on the one link)
    // is drawn at each rank's part of it, so it bounds the busbw drawn.
    let ceilings = ceiling_names
        .into_iter()
        .filter_map(|(name, share)| {
            let v = *first.ceilings.get(&name)?;
            Some(if (share - 1.0).abs() < 0.05 {
                (format!("ceiling {name} {v:.1} GB/s"), v)
            } else {
                let ranks = share.round();
                (format!("ceiling {name} {v:.1} GB/s / {ranks} ranks on one link = {:.1}", v / ranks), v / ranks)
            })
        })
        .collect();
    let gpu = first.gpu.as_ref().map(Gpu::name);
    let machine = match (options.machine.clone().or_else(|| first.machine.clone()), gpu) {
        (Some(machine), Some(gpu)) if machine != gpu => format!("{machine} ({gpu})"),
        (Some(machine), _) => machine,
        (None, Some(gpu)) => gpu,
        (None, None) => "machine not recorded".into(),
    };
    // A commit recorded with a note ("279f61d (the commit that wrote ...)") is named by its
    // hash and points at the note.
    let commit = match options.commit.as_deref().or(first.commit.as_deref()) {
        Some(commit) if commit_id(commit) != commit.trim() => {
            format!("commit {} (see the file's note)", commit_id(commit))
        }
        Some(commit) => format!("commit {}", commit.trim()),
        None => "commit not recorded".into(),
    };
    Ok(Figure {
        title: options.title.clone().unwrap_or_else(|| format!("gp2p bench {}", bench.replace('_', "-"))),
        subtitle: format!("{machine} · {commit}"),
        series,
        ceilings,
    })
}

/// A recorded commit's hash: its first word (`c729cde` of `c729cde (as the index says)`).
fn commit_id(commit: &str) -> &str {
    commit.split_whitespace().next().unwrap_or("")
}

/// A size in binary units as a person reads it: `8 B`, `4 KiB`, `1 MiB`, `1 GiB`; a size
/// that is not a whole number of its unit keeps up to two decimals (`1.5 MiB`).
pub fn size_label(bytes: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes.round();
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    let text = format!("{value:.2}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    format!("{text} {}", UNITS[unit])
}

/// The labelled sizes between `min` and `max` bytes: powers of two, evenly spaced on the log
/// axis, at most [`MAX_SIZE_LABELS`], the smallest and largest powers of two in the range
/// always among them (4 KiB … 1 GiB by fours: every other power of two).
fn size_ticks(min: f64, max: f64) -> Vec<f64> {
    let lo = (min.log2() - 1e-9).ceil() as i32;
    let hi = (max.log2() + 1e-9).floor() as i32;
    if hi < lo {
        return vec![min];
    }
    let span = (hi - lo) as usize;
    let most = MAX_SIZE_LABELS - 1;
    // The smallest step that divides the span into at most `most` gaps; if that leaves few
    // labels (a prime span), even gaps from the bottom and the top power of two added.
    let step = (1..=span.max(1)).find(|s| span % s == 0 && span / s <= most).unwrap_or(1);
    let mut exponents: Vec<i32> = if span / step >= 3 || span <= most {
        (0..=span / step).map(|k| lo + (k * step) as i32).collect()
    } else {
        let step = span.div_ceil(most - 1) as i32;
        let mut e: Vec<i32> = (0..).map(|k| lo + k * step).take_while(|e| *e <= hi - step / 2).collect();
        e.push(hi);
        e
    };
    exponents.dedup();
    exponents.into_iter().map(|e| 2f64.powi(e)).collect()
}

fn draw_to(path: &Path, figure: &Figure) -> Result<(), CliError> {
    draw(path, figure)
        .map_err(|e| CliError::Io { path: path.display().to_string(), source: std::io::Error::other(e.to_string()) })
}

fn draw(path: &Path, figure: &Figure) -> Result<(), Box<dyn std::error::Error>> {
    let points = || figure.series.iter().flat_map(|s| s.points.iter());
    let x_min = points().map(|p| p.0).fold(f64::INFINITY, f64::min);
    let x_max = points().map(|p| p.0).fold(0.0, f64::max);
    let y_max = points().map(|p| p.1).chain(figure.ceilings.iter().map(|c| c.1)).fold(0.0, f64::max);
    let y_max = if y_max > 0.0 { y_max * 1.12 } else { 1.0 };
    // A third of an octave beyond the outer points, so markers and labels at the ends are whole.
    let pad = 2f64.powf(0.4);
    let (x_lo, x_hi) = (x_min / pad, x_max * pad);
    let light: Vec<f64> = (0..64).map(|e| 2f64.powi(e)).filter(|x| *x >= x_lo && *x <= x_hi).collect();

    let root = SVGBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE)?;
    let (head, body) = root.split_vertically(66);
    let centre = i32::try_from(WIDTH / 2)?;
    let top = Pos::new(HPos::Center, VPos::Top);
    head.draw(&Text::new(figure.title.clone(), (centre, 12), ("sans-serif", 22).into_font().color(&BLACK).pos(top)))?;
    head.draw(&Text::new(
        figure.subtitle.clone(),
        (centre, 42),
        ("sans-serif", 15).into_font().color(&RGBColor(80, 80, 80)).pos(top),
    ))?;

    let mut chart = ChartBuilder::on(&body)
        .margin_left(12)
        .margin_right(44)
        .margin_bottom(8)
        .x_label_area_size(52)
        .y_label_area_size(64)
        .build_cartesian_2d(
            (x_lo..x_hi).log_scale().with_key_points(size_ticks(x_min, x_max)).with_light_points(light),
            0.0..y_max,
        )?;
    chart
        .configure_mesh()
        .x_desc("size")
        .y_desc("busbw, GB/s (1e9 B/s)")
        .x_label_formatter(&|x| size_label(*x))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .y_max_light_lines(1)
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 15))
        .draw()?;
    for (i, series) in figure.series.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        let line = color.stroke_width(if series.ours { 2 } else { 1 });
        chart
            .draw_series(LineSeries::new(series.points.iter().copied(), line))?
            .label(series.name.clone())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], line));
        if series.ours {
            chart.draw_series(series.points.iter().map(|p| Circle::new(*p, 4, color.filled())))?;
        } else {
            chart.draw_series(series.points.iter().map(|p| TriangleMarker::new(*p, 5, color.filled())))?;
        }
    }
    for (i, (name, value)) in figure.ceilings.iter().enumerate() {
        let color = PALETTE[(i + figure.series.len()) % PALETTE.len()].mix(0.8);
        chart
            .draw_series(DashedLineSeries::new([(x_lo, *value), (x_hi, *value)], 8, 6, color.stroke_width(1)))?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(1)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .label_font(("sans-serif", 14))
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK.mix(0.5))
        .draw()?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // a test: failing is how it reports

    use super::*;

    fn row(bench: &str, route: &str, dtype: &str, bytes: f64, busbw: f64) -> DocRow {
        DocRow {
            bench: Some(bench.into()),
            route: Some(route.into()),
            dtype: Some(dtype.into()),
            bytes: Some(bytes),
            busbw: Some(busbw),
            ceiling_name: Some("duplex".into()),
            ratio: Some(busbw / 48.7),
        }
    }

    fn doc(rows: Vec<DocRow>) -> Doc {
        Doc { ceilings: BTreeMap::from([("duplex".into(), 48.7), ("d2h".into(), 55.3)]), rows, ..Doc::default() }
    }

    /// A sweep from `begin` to `end` bytes by fours, GB/s rising with size.
    fn sweep(bench: &str, route: &str, begin: f64, end: f64) -> Vec<DocRow> {
        let mut rows = Vec::new();
        let mut bytes = begin;
        while bytes <= end {
            rows.push(row(bench, route, "f32", bytes, bytes.log2()));
            bytes *= 4.0;
        }
        rows
    }

    fn svg(name: &str, figure: &Figure) -> String {
        let path = std::env::temp_dir().join(format!("gp2p-plot-{name}-{}.svg", std::process::id()));
        draw_to(&path, figure).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        text
    }

    #[test]
    fn a_line_never_mixes_dtypes() {
        let one = figure(
            &[doc(vec![row("reduce", "device", "u8", 4.0, 1.0), row("reduce", "device", "u8", 16.0, 2.0)])],
            &Options::default(),
        )
        .unwrap();
        assert_eq!(one.series.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), ["device"]);
        let all = figure(
            &[doc(vec![
                row("reduce", "device", "f32", 4.0, 4.0),
                row("reduce", "device", "u32", 4.0, 4.0),
                row("reduce", "device", "f32", 16.0, 16.0),
            ])],
            &Options::default(),
        )
        .unwrap();
        assert_eq!(all.series.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), ["device f32", "device u32"]);
        assert_eq!(all.series[0].points, [(4.0, 4.0), (16.0, 16.0)]);
    }

    #[test]
    fn sizes_read_in_binary_units() {
        assert_eq!(size_label(8.0), "8 B");
        assert_eq!(size_label(4096.0), "4 KiB");
        assert_eq!(size_label(65536.0), "64 KiB");
        assert_eq!(size_label(1048576.0), "1 MiB");
        assert_eq!(size_label(268435456.0), "256 MiB");
        assert_eq!(size_label(1073741824.0), "1 GiB");
        assert_eq!(size_label(1.5 * 1048576.0), "1.5 MiB");
        assert_eq!(size_label(1000.0), "1000 B");
    }

    #[test]
    fn size_labels_are_powers_of_two_with_both_ends() {
        let labels = |min: f64, max: f64| size_ticks(min, max).into_iter().map(size_label).collect::<Vec<_>>();
        assert_eq!(
            labels(4096.0, 1073741824.0),
            ["4 KiB", "16 KiB", "64 KiB", "256 KiB", "1 MiB", "4 MiB", "16 MiB", "64 MiB", "256 MiB", "1 GiB"]
        );
        assert_eq!(
            labels(8.0, 1073741824.0),
            ["8 B", "64 B", "512 B", "4 KiB", "32 KiB", "256 KiB", "2 MiB", "16 MiB", "128 MiB", "1 GiB"]
        );
        assert_eq!(labels(268435456.0, 268435456.0), ["256 MiB"]);
        assert_eq!(labels(1048576.0, 1073741824.0), ["1 MiB", "4 MiB", "16 MiB", "64 MiB", "256 MiB", "1 GiB"]);
        // 2^0 .. 2^29: a prime number of octaves, so even steps from the bottom, and the top.
        let prime = labels(1.0, 536870912.0);
        assert_eq!(
            (prime.first().map(String::as_str), prime.last().map(String::as_str)),
            (Some("1 B"), Some("512 MiB"))
        );
        assert!(prime.len() <= MAX_SIZE_LABELS && prime.len() >= 5, "{prime:?}");
        for (min, max) in [(1.0, 2.0), (8.0, 1e12), (3.0, 1000.0), (4096.0, 4096.0)] {
            let ticks = size_ticks(min, max);
            assert!(!ticks.is_empty() && ticks.len() <= MAX_SIZE_LABELS, "{min} {max}: {ticks:?}");
            assert!(ticks.windows(2).all(|w| w[0] < w[1]), "{ticks:?}");
        }
    }

    #[test]
    fn the_svg_labels_sizes_in_binary_units_and_marks_every_point() {
        let mut first = doc(sweep("copy", "staged", 4096.0, 1073741824.0));
        first.commit = Some("c729cde".into());
        first.machine = Some("h200-x2".into());
        let rival = Doc {
            gpu: Some(Gpu::Name("NVIDIA H200".into())),
            commit: Some("eb11308 (as the index of that session says)".into()),
            rows: sweep("copy", "a.cpu().to(dst)", 4096.0, 1073741824.0),
            ..Doc::default()
        };
        let figure = figure(&[first, rival], &Options::default()).unwrap();
        let text = svg("binary", &figure);
        for label in ["4 KiB", "16 KiB", "1 MiB", "256 MiB", "1 GiB"] {
            assert!(text.contains(&format!(">\n{label}\n<")), "no axis label {label}");
        }
        for decimal in ["1000000000", "100000000", "10000\n"] {
            assert!(!text.contains(decimal), "a decimal size label {decimal:?} is left");
        }
        // Every measured point is marked: ours with circles, the rival's with triangles (each
        // a polygon), besides the legend's plain lines.
        assert_eq!(text.matches("<circle").count(), 10, "one circle per point of ours");
        assert_eq!(text.matches("<polygon").count(), 10, "one triangle per point of the rival's");
        assert!(text.contains("h200-x2 · commit c729cde"), "the subtitle names machine and commit");
        assert!(text.contains("a.cpu().to(dst) (at eb11308)"), "a rival from another commit says so");
        assert!(text.contains(">\ngp2p staged\n<"), "beside a rival, ours say they are gp2p's");
        assert!(text.contains("ceiling duplex 48.7 GB/s"));
        assert!(!text.contains("ceiling d2h"), "only the ceilings the rows name are drawn");
    }

    #[test]
    fn the_first_file_picks_the_bench_and_series_filter() {
        let ours = doc(sweep("all_reduce", "auto", 8.0, 1073741824.0));
        let mut nccl = Doc { gpu: Some(Gpu::Name("NVIDIA H200".into())), ..Doc::default() };
        nccl.rows = sweep("all_reduce", "nccl-shm", 8.0, 1073741824.0);
        nccl.rows.extend(sweep("all_gather", "nccl-shm", 8.0, 1024.0));
        let all = figure(&[ours, nccl], &Options::default()).unwrap();
        assert_eq!(all.title, "gp2p bench all-reduce");
        assert_eq!(
            all.series.iter().map(|s| (s.name.as_str(), s.ours)).collect::<Vec<_>>(),
            [("gp2p auto", true), ("nccl-shm", false)]
        );
        assert_eq!(all.series[1].points.len(), all.series[0].points.len(), "no all_gather rows");
        assert_eq!(all.subtitle, "machine not recorded · commit not recorded");
        let noted = Doc {
            commit: Some("279f61d (the run's own was not recorded)".into()),
            ..doc(sweep("all_reduce", "auto", 8.0, 8.0))
        };
        let noted = figure(&[noted], &Options { machine: Some("h200".into()), ..Options::default() }).unwrap();
        assert_eq!(noted.subtitle, "h200 · commit 279f61d (see the file's note)");
        let ours = doc(sweep("all_reduce", "auto", 8.0, 64.0));
        let only = Options { series: vec!["nope".into()], ..Options::default() };
        assert!(figure(&[ours], &only).is_err(), "nothing to draw is an error, not an empty plot");
    }

    #[test]
    fn a_link_shared_by_logical_ranks_draws_each_ranks_part_of_its_ceiling() {
        // Two logical ranks on one card: each row's ratio counts both ranks' bytes on its link.
        let mut rows = sweep("all_reduce", "auto", 1048576.0, 1073741824.0);
        for row in &mut rows {
            row.ratio = row.busbw.map(|b| 2.0 * b / 48.7);
        }
        let shared = figure(&[doc(rows)], &Options::default()).unwrap();
        assert_eq!(shared.ceilings.len(), 1);
        assert!((shared.ceilings[0].1 - 24.35).abs() < 1e-9, "{:?}", shared.ceilings);
        assert_eq!(shared.ceilings[0].0, "ceiling duplex 48.7 GB/s / 2 ranks on one link = 24.4");
        let alone = figure(&[doc(sweep("copy", "staged", 4096.0, 65536.0))], &Options::default()).unwrap();
        assert_eq!(alone.ceilings, [("ceiling duplex 48.7 GB/s".to_owned(), 48.7)]);
    }

    #[test]
    fn other_tools_files_are_read() {
        let nccl: Doc = serde_json::from_str(
            r#"{"gpu": "NVIDIA H200", "rows": [{"bench": "all_reduce", "route": "nccl-shm", "bytes": 8, "busbw": 0.5}]}"#,
        )
        .unwrap();
        assert_eq!(nccl.gpu.as_ref().map(Gpu::name).as_deref(), Some("NVIDIA H200"));
        let torch: Doc = serde_json::from_str(
            r#"{"gpus": ["NVIDIA H200", "NVIDIA H200"], "rows": [
                {"bench": "copy", "way": "a.cpu().to(dst)", "bytes": 4096, "GBps": 0.07},
                {"bench": "overhead", "op": "copy staged 4 B", "python_us_per_call": 115.2}]}"#,
        )
        .unwrap();
        assert_eq!(torch.gpu.as_ref().map(Gpu::name).as_deref(), Some("2 x NVIDIA H200"));
        let figure = figure(&[torch], &Options::default()).unwrap();
        assert_eq!(
            figure.series,
            [Series { name: "a.cpu().to(dst)".into(), points: vec![(4096.0, 0.07)], ours: false }]
        );
        assert_eq!(figure.subtitle, "2 x NVIDIA H200 · commit not recorded");
    }
}
