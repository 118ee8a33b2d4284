//! Limits the environment may override, for measuring crossovers on a machine without a
//! rebuild.

/// The byte count `value` of the environment variable `var` gives, at most `limit`; unset:
/// `default`. Anything else is ignored (`default`), with a note on stderr that ends in `hint`.
pub(crate) fn parse_byte_limit(var: &str, value: Option<&str>, default: usize, limit: usize, hint: &str) -> usize {
    match value.map(|v| v.trim().parse::<usize>()) {
        None => default,
        Some(Ok(bytes)) if bytes <= limit => bytes,
        Some(_) => {
            eprintln!(
                "geforce-p2p: ignoring {var}={:?}: not a byte count up to {limit} ({hint})",
                value.unwrap_or_default(),
            );
            default
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_byte_limit;

    #[test]
    fn byte_limits_from_the_environment_take_byte_counts_up_to_their_limit_only() {
        let parse = |value| parse_byte_limit("GP2P_TEST_LIMIT", value, 10, 100, "a hint");
        assert_eq!(parse(None), 10, "unset: the default");
        assert_eq!(parse(Some("100")), 100);
        assert_eq!(parse(Some("0")), 0);
        assert_eq!(parse(Some("101")), 10, "above the limit");
        assert_eq!(parse(Some("-1")), 10, "not a byte count");
        assert_eq!(parse(Some("1G")), 10, "no suffixes");
    }
}
