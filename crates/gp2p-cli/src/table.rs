//! The tables `gp2p` prints (bench rows, devices, probe measurements): the probe's table
//! style ([`geforce_p2p::probe::table`]: no borders, numbers right, text left) and how
//! the tables write numbers.

// One table helper for all of gp2p: the probe's report draws its tables with it too.
pub use geforce_p2p::probe::table::{Table, table};

/// `value` with `decimals` places, `-` where it is unknown (NaN), as the tables print rates.
pub fn num(value: f64, decimals: usize) -> String {
    if value.is_nan() { "-".to_owned() } else { format!("{value:.decimals$}") }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The table's look is tested where it is drawn (gp2p-probe's `table`).
    #[test]
    fn numbers_have_their_places_and_unknown_is_a_dash() {
        assert_eq!(num(12.345, 2), "12.35");
        assert_eq!(num(3.0, 0), "3");
        assert_eq!(num(f64::NAN, 2), "-");
    }
}
