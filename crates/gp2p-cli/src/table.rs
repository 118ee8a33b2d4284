//! The tables `gp2p` prints (bench rows, devices, probe measurements), through comfy-table.
//!
//! No borders: every line starts with a space, and a data row with its first cell, so the
//! device scripts' `grep -E '^ +[0-9]'` keeps finding the data rows of a bench's output and
//! a saved result stays readable as plain text. Numbers are right-aligned, text left.

use comfy_table::{CellAlignment, Table, presets};

/// An empty table with `header`; the columns named in `text_columns` are left-aligned,
/// every other column right-aligned.
pub fn table(header: &[&str], text_columns: &[&str]) -> Table {
    let mut table = Table::new();
    table.load_style(presets::NOTHING).set_header(header.to_vec());
    for (i, name) in header.iter().enumerate() {
        if let Some(column) = table.column_mut(i) {
            let align = if text_columns.contains(name) { CellAlignment::Left } else { CellAlignment::Right };
            column.set_cell_alignment(align);
        }
    }
    table
}

/// `value` with `decimals` places, `-` where it is unknown (NaN), as the tables print rates.
pub fn num(value: f64, decimals: usize) -> String {
    if value.is_nan() { "-".to_owned() } else { format!("{value:.decimals$}") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_rows_start_with_spaces_then_the_first_cell() {
        let mut t = table(&["size", "route", "GB/s"], &["route"]);
        t.add_row(vec!["4K".to_owned(), "staged".to_owned(), num(12.345, 2)]);
        t.add_row(vec!["1G".to_owned(), "peer".to_owned(), num(f64::NAN, 2)]);
        let text = t.trim_fmt();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "a header and two rows, no rules:\n{text}");
        assert!(lines[0].trim_start().starts_with("size"), "{text}");
        for (line, first) in lines[1..].iter().zip(["4K", "1G"]) {
            assert!(line.starts_with(' ') && line.trim_start().starts_with(first), "{line:?}");
        }
        assert!(lines[1].contains("staged") && lines[1].trim_end().ends_with("12.35"), "{text}");
        assert!(lines[2].trim_end().ends_with('-'), "{text}");
    }
}
