//! Byte sizes on the command line (`4K`, `1M`, `1G`, plain numbers) and nccl-tests style
//! `-b/-e/-f` sweeps.

/// Parse `4096`, `4K`, `16M`, `1G` (binary units, case-insensitive, optional trailing `B`).
pub fn parse_size(text: &str) -> Result<usize, String> {
    let t = text.trim().trim_end_matches(['b', 'B']);
    let (digits, shift) = match t.chars().last() {
        Some('k' | 'K') => (&t[..t.len() - 1], 10),
        Some('m' | 'M') => (&t[..t.len() - 1], 20),
        Some('g' | 'G') => (&t[..t.len() - 1], 30),
        _ => (t, 0),
    };
    let n: usize =
        digits.parse().map_err(|_| format!("size {text:?}: expected a number with an optional K, M or G"))?;
    n.checked_mul(1 << shift).ok_or_else(|| format!("size {text:?} is too large"))
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
    fn sweeps_include_both_ends() {
        assert_eq!(sweep(4096, 65536, 4), Ok(vec![4096, 16384, 65536]));
        assert_eq!(sweep(8, 8, 2), Ok(vec![8]));
        assert!(sweep(0, 8, 2).is_err());
        assert!(sweep(8, 4, 2).is_err());
        assert!(sweep(8, 64, 1).is_err());
    }
}
