//! What the door says on stderr: one line per process when it first decides a communicator's
//! fate (and again only when a later decision differs), warnings where `NCCL_DEBUG` asks for
//! them, and every decision with `NCCL_DEBUG=INFO`, in the words NCCL's own log uses.

use std::sync::Mutex;

/// `NCCL_DEBUG`: how much NCCL programs expect to hear.
const DEBUG_VAR: &str = "NCCL_DEBUG";

/// How much to say, by `NCCL_DEBUG`'s levels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Unset or `VERSION`: the one line per process only.
    Quiet,
    /// `WARN`: every error, as it is returned.
    Warn,
    /// `INFO` or `TRACE`: every decision too.
    Info,
}

impl Level {
    /// The level `NCCL_DEBUG`'s value asks for (case as NCCL takes it: any).
    pub fn from_value(value: Option<&str>) -> Level {
        match value.map(str::to_ascii_uppercase).as_deref() {
            Some("WARN") => Level::Warn,
            Some("INFO" | "TRACE" | "ABORT") => Level::Info,
            _ => Level::Quiet,
        }
    }

    /// This process's level.
    pub fn current() -> Level {
        Level::from_value(std::env::var(DEBUG_VAR).ok().as_deref())
    }
}

/// Write `line` to stderr in one write, so the lines of ranks that share a terminal or a log
/// never interleave mid-line (`eprintln!` writes its pieces one by one). A failed write is
/// nothing a caller can act on: the line is lost.
fn say(line: &str) {
    use std::io::Write;
    let _ = std::io::stderr().lock().write_all(format!("{line}\n").as_bytes());
}

/// Say `text` where warnings are asked for.
pub fn warn(text: &str) {
    if Level::current() >= Level::Warn {
        say(text);
    }
}

/// Say `text` whatever `NCCL_DEBUG` says: what a measurement the user turned on found.
pub fn measured(text: &str) {
    say(text);
}

/// Say `text` where `NCCL_DEBUG=INFO` asks for details.
pub fn info(text: &str) {
    if Level::current() >= Level::Info {
        say(&format!("geforce-p2p NCCL door: {text}"));
    }
}

/// The last decision line this process printed.
static SAID: Mutex<Option<String>> = Mutex::new(None);

/// Say what a communicator's decision was: always the first time in a process, then only
/// where it differs from the last line said (or with `NCCL_DEBUG=INFO`). Every rank's process
/// says it, so each worker's log shows what its own communicators run on.
pub fn decision(line: &str) {
    let mut said = SAID.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if should_say(said.as_deref(), line, Level::current()) {
        say(&format!("geforce-p2p NCCL door: {line}"));
        *said = Some(line.to_owned());
    }
}

/// Whether [`decision`] prints `line` after `last`.
fn should_say(last: Option<&str>, line: &str, level: Level) -> bool {
    level >= Level::Info || last != Some(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_follow_nccl_debug() {
        assert_eq!(Level::from_value(None), Level::Quiet);
        assert_eq!(Level::from_value(Some("VERSION")), Level::Quiet);
        assert_eq!(Level::from_value(Some("warn")), Level::Warn);
        assert_eq!(Level::from_value(Some("INFO")), Level::Info);
    }

    #[test]
    fn a_repeated_decision_is_said_once_unless_info() {
        assert!(should_say(None, "served", Level::Quiet));
        assert!(!should_say(Some("served"), "served", Level::Quiet));
        assert!(should_say(Some("served"), "handed over", Level::Quiet));
        assert!(should_say(Some("served"), "served", Level::Info));
    }
}
