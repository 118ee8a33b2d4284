//! Byte sizes as `gp2p` reads and prints them (`4K`, `1M`, `1G`, plain numbers; binary
//! units), and nccl-tests style `-b/-e/-f` sweeps. Sizes are read by the library's
//! `parse_size` (as `GP2P_COMPRESS`'s minimum is) and printed here: what a table prints, `-b`
//! reads back.

pub use geforce_p2p::comm::parse_size;

/// A size as [`parse_size`] reads it: the largest binary unit that divides it exactly
/// (`4K`, `16M`, `1G`), else plain bytes.
pub fn format_size(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{}G", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{}M", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{}K", b >> 10),
        b => format!("{b}"),
    }
}

/// Sizes from `begin` to `end` inclusive, each `factor` times the last.
pub fn sweep(begin: usize, end: usize, factor: usize) -> Result<Vec<usize>, String> {
    if begin == 0 || begin > end {
        return Err(format!("sizes: need 0 < begin <= end, got -b {begin} -e {end}"));
    }
    if factor < 2 {
        return Err(format!("-f {factor}: the step factor must be at least 2"));
    }
    let mut sizes = Vec::new();
    let mut size = begin;
    while size <= end {
        sizes.push(size);
        size = match size.checked_mul(factor) {
            Some(s) => s,
            None => break,
        };
    }
    Ok(sizes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_are_binary() {
        assert_eq!(parse_size("4K"), Ok(4096));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert_eq!(parse_size("16MB"), Ok(16 << 20));
        assert_eq!(parse_size("123"), Ok(123));
        assert!(parse_size("x").is_err());
    }

    #[test]
    fn sizes_print_in_binary_units_and_parse_back() {
        assert_eq!(format_size(4096), "4K");
        assert_eq!(format_size(1 << 30), "1G");
        assert_eq!(format_size(3 << 20), "3M");
        assert_eq!(format_size(1000), "1000");
        for bytes in [0, 1, 8, 1000, 4096, 4097, 3 << 20, (1 << 30) + 1024, 5 << 30] {
            assert_eq!(parse_size(&format_size(bytes)), Ok(bytes), "{bytes}");
        }
    }

    #[test]
    fn sweeps_include_both_ends() {
        assert_eq!(sweep(4096, 65536, 4), Ok(vec![4096, 16384, 65536]));
        assert_eq!(sweep(8, 8, 2), Ok(vec![8]));
        assert!(sweep(0, 8, 2).is_err());
        assert!(sweep(8, 4, 2).is_err());
        assert!(sweep(8, 64, 1).is_err());
    }
}
