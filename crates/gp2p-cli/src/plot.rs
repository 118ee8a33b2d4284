//! `--plot FILE.svg`: GB/s against size, one line per route, each ceiling dashed.

use std::collections::BTreeMap;
use std::path::Path;

use plotters::prelude::*;

use crate::error::CliError;
use crate::report::{Report, Row};

const WIDTH: u32 = 960;
const HEIGHT: u32 = 600;

/// Draw every route of `report` (busbw against bytes, log-scaled size axis) and its
/// ceilings as dashed horizontal lines.
pub fn plot_rows(path: &Path, title: &str, report: &Report) -> Result<(), CliError> {
    let lines = lines(&report.rows);
    let used: Vec<&'static str> = report.rows.iter().map(|r| r.ceiling_name).collect();
    let ceilings: Vec<(&str, f64)> =
        report.ceilings.iter().filter(|(n, _)| used.contains(n)).map(|(n, v)| (*n, *v)).collect();
    let x_min = report.rows.iter().map(|r| r.bytes as f64).fold(f64::INFINITY, f64::min).max(1.0);
    let x_max = report.rows.iter().map(|r| r.bytes as f64).fold(1.0, f64::max).max(x_min * 2.0);
    let y_max = lines.values().flatten().map(|p| p.1).chain(ceilings.iter().map(|c| c.1)).fold(1.0, f64::max) * 1.1;
    draw(path, title, &lines, &ceilings, (x_min, x_max), y_max)
        .map_err(|e| CliError::Io { path: path.display().to_string(), source: std::io::Error::other(e.to_string()) })
}

/// One line per route, and per element type too when the rows hold several (as
/// `bench reduce --dtype all` does), so no line mixes two dtypes.
fn lines(rows: &[Row]) -> BTreeMap<String, Vec<(f64, f64)>> {
    let several_dtypes = rows.iter().any(|r| r.dtype != rows[0].dtype);
    let mut lines: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for row in rows {
        let name = if several_dtypes { format!("{} {}", row.route, row.dtype) } else { row.route.clone() };
        lines.entry(name).or_default().push((row.bytes as f64, row.busbw));
    }
    lines
}

fn draw(
    path: &Path,
    title: &str,
    lines: &BTreeMap<String, Vec<(f64, f64)>>,
    ceilings: &[(&str, f64)],
    (x_min, x_max): (f64, f64),
    y_max: f64,
) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(format!("gp2p bench {title}"), ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d((x_min..x_max).log_scale(), 0.0..y_max)?;
    chart
        .configure_mesh()
        .x_desc("bytes")
        .y_desc("GB/s")
        .x_label_formatter(&|x| crate::sizes::format_size(x.round() as usize))
        .draw()?;
    for (i, (name, points)) in lines.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(points.iter().copied(), color.stroke_width(2)))?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], color.stroke_width(2)));
    }
    for (i, (name, value)) in ceilings.iter().enumerate() {
        let color = Palette99::pick(i + lines.len()).to_rgba();
        chart
            .draw_series(DashedLineSeries::new([(x_min, *value), (x_max, *value)], 8, 6, color.stroke_width(1)))?
            .label(format!("ceiling {name} {value:.1}"))
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], color.stroke_width(1)));
    }
    chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw()?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(route: &str, dtype: &str, bytes: usize) -> Row {
        Row {
            bench: "reduce",
            route: route.into(),
            dtype: dtype.into(),
            op: "sum".into(),
            ranks: 1,
            bytes,
            count: bytes / 4,
            time_us: 1.0,
            algbw: 1.0,
            busbw: bytes as f64,
            ceiling: 50.0,
            ceiling_name: "h2d",
            ratio: 0.5,
            enqueue_us: None,
            wrong: 0,
        }
    }

    #[test]
    fn a_line_never_mixes_dtypes() {
        let one = lines(&[row("device", "u8", 4), row("device", "u8", 16), row("zero-copy", "u8", 4)]);
        assert_eq!(one.keys().collect::<Vec<_>>(), ["device", "zero-copy"]);
        let all = lines(&[row("device", "f32", 4), row("device", "u32", 4), row("device", "f32", 16)]);
        assert_eq!(all.keys().collect::<Vec<_>>(), ["device f32", "device u32"]);
        assert_eq!(all["device f32"], [(4.0, 4.0), (16.0, 16.0)]);
    }
}
