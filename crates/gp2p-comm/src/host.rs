//! Which host a process runs on, as every part of geforce-p2p that groups ranks by host tells
//! them apart (the NCCL door's decision, the torch backend's two-level groups): the host name
//! and the kernel's boot id, as NCCL does, or [`HOST_ID_VAR`] where it is set, so one machine
//! can act as several hosts in tests.

/// The environment variable that names this process's host instead of [`host_id`]'s default.
pub const HOST_ID_VAR: &str = "GP2P_HOST_ID";
/// The kernel's random id of the current boot.
const BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";
/// The host name of this process's UTS namespace (what `gethostname` returns).
const HOST_NAME_PATH: &str = "/proc/sys/kernel/hostname";

/// This process's host: [`HOST_ID_VAR`] where set and not blank, else `name:boot-id` (the
/// name alone on a machine that publishes no boot id). Two processes on one host agree; two
/// boots of one machine do not.
pub fn host_id() -> String {
    let forced = std::env::var(HOST_ID_VAR).ok();
    let read = |path| std::fs::read_to_string(path).ok();
    host_id_from(forced.as_deref(), read(HOST_NAME_PATH).as_deref(), read(BOOT_ID_PATH).as_deref())
}

/// This process on its host, `pid@pid-namespace`: ranks that are threads of one process share
/// it (and, on one device, that device's CUDA context); two processes do not, containers
/// sharing a pid number included, wherever `/proc` names the namespace (the namespace is 0
/// where it does not).
pub fn process_id() -> String {
    format!("{}@{}", std::process::id(), crate::segment::pid_namespace())
}

/// [`host_id`] from what it reads: the variable, the host name and the boot id, each as found.
pub fn host_id_from(forced: Option<&str>, name: Option<&str>, boot_id: Option<&str>) -> String {
    if let Some(forced) = forced.map(str::trim).filter(|f| !f.is_empty()) {
        return forced.to_owned();
    }
    let name = name.map(str::trim).filter(|n| !n.is_empty()).unwrap_or("localhost");
    match boot_id.map(str::trim).filter(|b| !b.is_empty()) {
        Some(boot) => format!("{name}:{boot}"),
        None => name.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_named_by_its_pid_and_threads_agree() {
        let here = process_id();
        assert!(here.starts_with(&format!("{}@", std::process::id())), "{here}");
        let Ok(there) = std::thread::spawn(process_id).join() else { unreachable!("the thread returns") };
        assert_eq!(here, there);
    }

    #[test]
    fn the_variable_wins_then_name_and_boot_id() {
        assert_eq!(host_id_from(Some(" fake-a "), Some("box"), Some("b1")), "fake-a");
        assert_eq!(host_id_from(Some("  "), Some("box\n"), Some("b1\n")), "box:b1");
        assert_eq!(host_id_from(None, Some("box"), None), "box");
        assert_eq!(host_id_from(None, None, Some("b1")), "localhost:b1");
    }

    #[test]
    fn this_process_has_a_host() {
        assert!(!host_id().is_empty());
    }
}
