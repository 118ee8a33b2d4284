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

/// The variable that names an MPS control daemon's pipe folder.
pub const MPS_PIPE_VAR: &str = "CUDA_MPS_PIPE_DIRECTORY";
/// Where an MPS control daemon listens when [`MPS_PIPE_VAR`] names no folder.
const MPS_DEFAULT_PIPE: &str = "/tmp/nvidia-mps";

/// Whether an MPS control daemon serves this process's CUDA: its pipe folder ([`MPS_PIPE_VAR`],
/// else `/tmp/nvidia-mps`) holds its `control` pipe. Under one, the server deals out the
/// device's hardware queues to its clients, rather than each context getting its own.
pub fn mps_serves() -> bool {
    mps_control_pipe(std::env::var_os(MPS_PIPE_VAR).as_deref()).exists()
}

/// The control pipe an MPS daemon listens on, for [`MPS_PIPE_VAR`] set to `folder`.
pub fn mps_control_pipe(folder: Option<&std::ffi::OsStr>) -> std::path::PathBuf {
    let folder = folder.filter(|f| !f.is_empty()).unwrap_or(std::ffi::OsStr::new(MPS_DEFAULT_PIPE));
    std::path::Path::new(folder).join("control")
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
    fn an_mps_daemon_is_found_by_its_control_pipe() {
        let dir = std::env::temp_dir().join(format!("gp2p-mps-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temporary folder");
        let pipe = mps_control_pipe(Some(dir.as_os_str()));
        assert_eq!(pipe, dir.join("control"));
        assert!(!pipe.exists(), "no daemon yet");
        std::fs::write(&pipe, b"").expect("a stand-in pipe");
        assert!(mps_control_pipe(Some(dir.as_os_str())).exists());
        std::fs::remove_dir_all(&dir).expect("removed");
        assert_eq!(mps_control_pipe(Some(std::ffi::OsStr::new(""))), std::path::Path::new("/tmp/nvidia-mps/control"));
        assert_eq!(mps_control_pipe(None), std::path::Path::new("/tmp/nvidia-mps/control"));
    }

    #[test]
    fn this_process_has_a_host() {
        assert!(!host_id().is_empty());
    }
}
