//! What a GPU test needs to run, and the one line it prints when this machine lacks it.
//!
//! A test states its needs with [`needs!`](crate::needs): `let [d0, d1] = needs!(gpus: 2);`.
//! Where the machine has them, the devices are opened and handed over; where it does not,
//! the test prints one [`NOT_RUN`] line and returns, and the bundle's runner counts it as
//! not run instead of passed (libtest itself knows only passed and failed). The test's name
//! is what decides nothing: the runner reads the line, not a name prefix.

use geforce_p2p::cuda::PtxTarget;
use geforce_p2p::{Device, Stream};

/// How every not-run line starts. The bundle's runner (xtask/src/bundle.rs) greps for it;
/// the rest of the line is `<test path> <reason>`, the path without spaces.
pub const NOT_RUN: &str = "gp2p-not-run:";

/// What a test needs from the machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Needs {
    /// Visible CUDA devices, opened as ordinals `0..gpus`.
    pub gpus: usize,
}

impl Needs {
    /// `n` CUDA devices.
    pub const fn gpus(n: usize) -> Needs {
        Needs { gpus: n }
    }

    /// Why these needs are not met, given how many devices the driver reports (`Err`: why
    /// it could not say, e.g. no driver); `None` when they are. Pure, so the decision is
    /// tested on machines without a GPU.
    pub fn unmet(&self, present: Result<usize, String>) -> Option<String> {
        let want = match self.gpus {
            1 => "needs 1 GPU".to_owned(),
            n => format!("needs {n} GPUs"),
        };
        match present {
            Ok(have) if have >= self.gpus => None,
            Ok(0) => Some(format!("{want}, none present")),
            Ok(have) => Some(format!("{want}, {have} present")),
            Err(why) => Some(format!("{want}, the driver reports none: {why}")),
        }
    }
}

/// The line a test prints when it is not run: `gp2p-not-run: <test> <reason>`, on one line
/// whatever `reason` holds, so the runner can count lines.
pub fn not_run_line(test: &str, reason: &str) -> String {
    let test = if test.is_empty() { "?".to_owned() } else { test.replace(char::is_whitespace, "_") };
    let reason = reason.replace(['\n', '\r'], " ");
    format!("{NOT_RUN} {test} {reason}")
}

/// Devices `0..N` when the machine has them; otherwise prints the not-run line for `test`
/// and gives `None`. [`needs!`](crate::needs) calls it with the test's path.
#[allow(clippy::expect_used)] // a test helper: failing is how it reports
pub fn gpus<const N: usize>(test: &str) -> Option<[Device; N]> {
    let present = Device::count().map_err(|e| e.to_string());
    if let Some(reason) = Needs::gpus(N).unmet(present) {
        println!("{}", not_run_line(test, &reason));
        return None;
    }
    // Present but not openable (an unsupported card, a driver failure) is a failure of the
    // test, not a missing need: the machine claims to have what the test asked for.
    Some(std::array::from_fn(device))
}

/// Set (by the bundle's runner) to the compute-sanitizer tool a test runs under.
pub const SANITIZER_ENV: &str = "GP2P_SANITIZER";

/// The compute-sanitizer tool this test runs under ([`SANITIZER_ENV`]), if any.
pub fn sanitizer() -> Option<String> {
    std::env::var(SANITIZER_ENV).ok().filter(|tool| !tool.is_empty())
}

/// Why kernels on different GPUs cannot be counted on to run at the same time here, if they
/// cannot: compute-sanitizer runs one kernel at a time, so a kernel that waits for its
/// peer's (the line exchange) waits until its timeout.
pub fn kernels_serialized(sanitizer: Option<&str>) -> Option<String> {
    sanitizer.filter(|s| !s.is_empty()).map(|tool| format!("compute-sanitizer {tool} runs kernels one at a time"))
}

/// Like [`gpus`], for a test whose kernels must run at the same time on their GPUs.
pub fn concurrent_gpus<const N: usize>(test: &str) -> Option<[Device; N]> {
    if let Some(why) = kernels_serialized(sanitizer().as_deref()) {
        println!("{}", not_run_line(test, &format!("needs kernels that run at once: {why}")));
        return None;
    }
    gpus::<N>(test)
}

/// Why devices of these builds (ordinal and build) cannot run the line exchange's kernels,
/// if one cannot: they ship in the compute_80 build only (a Turing card, or
/// `GP2P_PTX_TARGET=compute_75`, loads compute_75). Pure, so it is tested without a GPU.
pub fn lacks_compute_80(builds: &[(usize, PtxTarget)]) -> Option<String> {
    builds.iter().find(|(_, build)| !build.runs_line_exchange()).map(|(ordinal, build)| {
        format!("needs the compute_80 build of the kernels; device {ordinal} runs {}", build.name())
    })
}

/// Like [`gpus`] (or [`concurrent_gpus`] when `concurrent`), for a test of the line exchange
/// or the communicator, whose kernels need the compute_80 build on every device.
pub fn compute_80_gpus<const N: usize>(test: &str, concurrent: bool) -> Option<[Device; N]> {
    let devices = if concurrent { concurrent_gpus::<N>(test)? } else { gpus::<N>(test)? };
    let builds: Vec<(usize, PtxTarget)> = devices.iter().map(|d| (d.ordinal(), d.ptx_target())).collect();
    if let Some(why) = lacks_compute_80(&builds) {
        println!("{}", not_run_line(test, &why));
        return None;
    }
    Some(devices)
}

/// Device `ordinal`, for a helper deep inside a test whose [`needs!`](crate::needs) has
/// already found it.
#[allow(clippy::expect_used)] // a test helper: failing is how it reports
pub fn device(ordinal: usize) -> Device {
    Device::open(ordinal).unwrap_or_else(|e| panic!("CUDA device {ordinal} is present but does not open: {e}"))
}

/// `device` with a fresh stream on it: what most GPU tests start from.
#[allow(clippy::expect_used)] // a test helper: failing is how it reports
pub fn with_stream(device: Device) -> (Device, Stream) {
    let stream = Stream::new(&device).expect("a stream on an open device");
    (device, stream)
}

/// Opens the devices a test needs, or reports the test as not run and returns from it.
///
/// `needs!(gpus: N)` evaluates to `[Device; N]` (ordinals `0..N`); where fewer than `N`
/// devices are visible it prints `gp2p-not-run: <test> needs N GPUs, M present` and returns
/// from the calling test, which libtest then lists as passed and the bundle's runner as not
/// run. Use it first in the test, before anything that needs a device.
///
/// ```no_run
/// # fn test() {
/// let [d0, d1] = gp2p_tests::needs!(gpus: 2);
/// # }
/// ```
#[macro_export]
macro_rules! needs {
    (gpus: $n:literal) => {
        $crate::needs!(@open $crate::gpus::<$n>)
    };
    // Kernels on the GPUs must run at the same time (each waits for the other's).
    (gpus: $n:literal, concurrent_kernels) => {
        $crate::needs!(@open $crate::concurrent_gpus::<$n>)
    };
    // The line exchange's kernels (compute_80 build only), in one process: they must also
    // run at the same time.
    (gpus: $n:literal, concurrent_kernels, compute_80) => {
        $crate::needs!(@open |test: &str| $crate::compute_80_gpus::<$n>(test, true))
    };
    // The communicator's kernels (compute_80 build only), one process per GPU.
    (gpus: $n:literal, compute_80) => {
        $crate::needs!(@open |test: &str| $crate::compute_80_gpus::<$n>(test, false))
    };
    // The opener is a parameter so that the unit tests run the macro without a GPU and
    // without printing a not-run line of their own (the runner would count it).
    (@open $open:expr) => {{
        // The test's path, e.g. `gpu_two::two_gpu_copies`, from a function nested in it:
        // unlike the test thread's name it holds with --test-threads=1 too.
        fn here() {}
        let test = ::std::any::type_name_of_val(&here);
        let test = test.strip_suffix("::here").unwrap_or(test);
        match ($open)(test) {
            ::std::option::Option::Some(devices) => devices,
            ::std::option::Option::None => return,
        }
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn needs_are_met_by_enough_devices_and_no_fewer() {
        let two = Needs::gpus(2);
        assert_eq!(two.unmet(Ok(2)), None);
        assert_eq!(two.unmet(Ok(8)), None);
        assert_eq!(two.unmet(Ok(1)).as_deref(), Some("needs 2 GPUs, 1 present"));
        assert_eq!(two.unmet(Ok(0)).as_deref(), Some("needs 2 GPUs, none present"));
        let one = Needs::gpus(1);
        assert_eq!(one.unmet(Ok(1)), None);
        assert_eq!(
            one.unmet(Err("no CUDA driver".into())).as_deref(),
            Some("needs 1 GPU, the driver reports none: no CUDA driver")
        );
        assert_eq!(
            Needs::gpus(0).unmet(Err("no CUDA driver".into())).as_deref(),
            Some("needs 0 GPUs, the driver reports none: no CUDA driver")
        );
    }

    #[test]
    fn kernels_are_serialized_only_under_a_sanitizer() {
        assert_eq!(kernels_serialized(None), None);
        assert_eq!(kernels_serialized(Some("")), None);
        assert_eq!(
            kernels_serialized(Some("memcheck")).as_deref(),
            Some("compute-sanitizer memcheck runs kernels one at a time")
        );
    }

    #[test]
    fn the_line_exchange_needs_the_compute_80_build_on_every_device() {
        let (new, turing) = (PtxTarget::Compute80, PtxTarget::Compute75);
        assert_eq!(lacks_compute_80(&[(0, new), (1, new)]), None);
        assert_eq!(
            lacks_compute_80(&[(0, new), (1, turing)]).as_deref(),
            Some("needs the compute_80 build of the kernels; device 1 runs compute_75")
        );
    }

    #[test]
    fn the_not_run_line_is_one_line_the_runner_can_split() {
        let line = not_run_line("gpu_two::two_gpu_copies", "needs 2 GPUs, 1 present");
        assert_eq!(line, "gp2p-not-run: gpu_two::two_gpu_copies needs 2 GPUs, 1 present");
        // The runner takes the reason as everything after the second space-separated field.
        let reason = line.splitn(3, ' ').nth(2);
        assert_eq!(reason, Some("needs 2 GPUs, 1 present"));
        let odd = not_run_line("a b", "driver said\nno");
        assert_eq!(odd, "gp2p-not-run: a_b driver said no");
        assert_eq!(not_run_line("", "x"), "gp2p-not-run: ? x");
    }

    /// The macro hands the opener the test's path and returns from the test when the
    /// opener finds nothing (a stand-in opener: `gpus` would print a real not-run line).
    #[test]
    fn the_macro_names_the_test_and_returns_from_it_when_needs_are_unmet() {
        fn test_body(found: Option<[u8; 2]>, asked_for: &mut String, got: &mut Option<[u8; 2]>) {
            let devices = crate::needs!(@open |test: &str| {
                *asked_for = test.to_owned();
                found
            });
            *got = Some(devices);
        }
        let (mut asked_for, mut got) = (String::new(), None);
        test_body(Some([0, 1]), &mut asked_for, &mut got);
        assert_eq!(got, Some([0, 1]));
        assert_eq!(
            asked_for,
            "gp2p_tests::needs::tests::the_macro_names_the_test_and_returns_from_it_when_needs_are_unmet::test_body"
        );
        got = None;
        test_body(None, &mut asked_for, &mut got);
        assert_eq!(got, None, "returned before the rest of the test");
    }
}

/// A tidy check in the manner of rust-analyzer's: every GPU test in `tests/tests` states what
/// it needs, so none can pass on a machine where it did not run.
#[cfg(test)]
mod tidy {
    #[test]
    #[allow(clippy::unwrap_used)] // a test: failing is how it reports
    fn every_gpu_test_states_its_needs() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
        if !dir.is_dir() {
            // A bundle on a GPU machine carries the binaries, not the sources.
            let reason = format!("needs the sources, {} is absent", dir.display());
            println!("{}", super::not_run_line("gp2p_tests::needs::tidy::every_gpu_test_states_its_needs", &reason));
            return;
        }
        let mut checked = 0;
        let mut missing = Vec::new();
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            // Each `#[ignore = ...]` test, up to the next test: its body must call needs!.
            for test in text.split("#[ignore").skip(1) {
                let body = test.split("#[test]").next().unwrap_or(test);
                checked += 1;
                if !body.contains("needs!(gpus:") {
                    let name = body.split("fn ").nth(1).and_then(|s| s.split('(').next()).unwrap_or("?");
                    missing.push(format!("{}: {name}", path.display()));
                }
            }
        }
        assert!(checked > 0, "no GPU tests found under {}", dir.display());
        assert!(missing.is_empty(), "GPU tests without needs!(gpus: N): {missing:#?}");
    }
}
