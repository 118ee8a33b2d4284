//! Byte sizes as the library's variables (`GP2P_COMPRESS=int8@4M`) and the `gp2p` CLI read
//! them: one parser for both.
//!
//! ```
//! assert_eq!(gp2p_comm::parse_size("16M"), Ok(16 << 20));
//! assert!(gp2p_comm::parse_size("4X").is_err());
//! ```

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
