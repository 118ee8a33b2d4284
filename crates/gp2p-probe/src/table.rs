//! The plain-text table style of everything gp2p prints: the probe's device table and pair
//! matrix here, and the CLI's bench, device and measurement tables (which use this module,
//! so that all of gp2p's tables look alike and are drawn by one piece of code).
//!
//! No borders: every line starts with a space, and a data row with its first cell, so the
//! device scripts' `grep -E '^ +[0-9]'` keeps finding the data rows of a bench's output and
//! a saved result stays readable as plain text. Numbers are right-aligned, text left. Print
//! a table with [`Table::trim_fmt`], which drops the trailing spaces of every line.

use comfy_table::{CellAlignment, presets};

pub use comfy_table::Table;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_rows_start_with_spaces_then_the_first_cell() {
        let mut t = table(&["size", "route", "GB/s"], &["route"]);
        t.add_row(vec!["4K", "staged", "12.35"]);
        t.add_row(vec!["1G", "peer", "-"]);
        let text = t.trim_fmt();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "a header and two rows, no rules:\n{text}");
        assert!(lines[0].trim_start().starts_with("size"), "{text}");
        for (line, first) in lines[1..].iter().zip(["4K", "1G"]) {
            assert!(line.starts_with(' ') && line.trim_start().starts_with(first), "{line:?}");
        }
        assert!(lines[1].contains("staged") && lines[1].ends_with("12.35"), "trailing spaces trimmed:\n{text}");
        assert!(lines[2].ends_with('-'), "{text}");
    }

    #[test]
    fn numbers_align_right_and_text_left() {
        let mut t = table(&["#", "name"], &["name"]);
        t.add_row(vec!["7", "a"]);
        t.add_row(vec!["10", "bcd"]);
        let text = t.trim_fmt();
        let lines: Vec<&str> = text.lines().collect();
        let at = |line: &str, what: &str| line.find(what).unwrap_or(usize::MAX);
        assert_eq!(at(lines[1], "7") + 1, at(lines[2], "10") + 2, "ones line up:\n{text}");
        assert_eq!(at(lines[1], "a"), at(lines[2], "bcd"), "text starts in one column:\n{text}");
    }
}
