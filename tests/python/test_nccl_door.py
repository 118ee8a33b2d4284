"""The NCCL door as the wheel ships it (geforce_p2p.nccl): the shared object is in the package,
answers to NCCL's name, and is what vLLM's and sglang's pynccl load through ctypes; the
environment and the launcher put it in NCCL's place. No GPU, no torch, no real NCCL: the door
then answers with the header's version and makes ids that carry no real one."""

import ctypes
import os
import subprocess
import sys

import pytest

from geforce_p2p import nccl


def test_the_wheel_ships_the_door_under_nccl_s_name():
    path = nccl.library()
    assert os.path.basename(path) == "libnccl.so.2"
    with open(path, "rb") as f:
        assert f.read(4) == b"\x7fELF"


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_byte * 128)]


def door_lib():
    """The door as vLLM's pynccl loads it: ctypes.CDLL of VLLM_NCCL_SO_PATH, each function
    declared as pynccl declares it."""
    lib = ctypes.CDLL(nccl.library())
    lib.ncclGetVersion.argtypes = [ctypes.POINTER(ctypes.c_int)]
    lib.ncclGetVersion.restype = ctypes.c_int
    lib.ncclGetErrorString.argtypes = [ctypes.c_int]
    lib.ncclGetErrorString.restype = ctypes.c_char_p
    lib.ncclGetUniqueId.argtypes = [ctypes.POINTER(UniqueId)]
    lib.ncclGetUniqueId.restype = ctypes.c_int
    lib.ncclCommInitRank.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, UniqueId, ctypes.c_int]
    lib.ncclCommInitRank.restype = ctypes.c_int
    lib.ncclGetLastError.argtypes = [ctypes.c_void_p]
    lib.ncclGetLastError.restype = ctypes.c_char_p
    return lib


def test_pynccl_s_calls_resolve_and_answer_without_a_gpu(monkeypatch):
    # No real NCCL anywhere: the door answers for itself.
    monkeypatch.setenv("GP2P_NCCL_REAL", "/nonexistent/libnccl.so.2")
    lib = door_lib()
    for name in ["ncclAllReduce", "ncclAllGather", "ncclReduceScatter", "ncclBroadcast", "ncclSend", "ncclRecv",
                 "ncclGroupStart", "ncclGroupEnd", "ncclCommDestroy", "pncclAllReduce"]:
        assert getattr(lib, name) is not None
    version = ctypes.c_int(0)
    assert lib.ncclGetVersion(ctypes.byref(version)) == 0
    assert version.value == 22809, "NCCL 2.28.9's header, without a real NCCL to ask"
    assert lib.ncclGetErrorString(4).startswith(b"invalid argument")
    uid = UniqueId()
    assert lib.ncclGetUniqueId(ctypes.byref(uid)) == 0
    assert bytes(uid.internal)[:8] == b"gp2pDOOR"
    comm = ctypes.c_void_p()
    assert lib.ncclCommInitRank(ctypes.byref(comm), 2, uid, 5) == 4, "rank 5 of 2"
    assert b"rank: 5 is not in 0..2" in lib.ncclGetLastError(None)


def test_the_environment_puts_the_door_first_once_and_names_torch_s_nccl(tmp_path, monkeypatch):
    site = tmp_path / "site"
    (site / "nvidia" / "nccl" / "lib").mkdir(parents=True)
    real = site / "nvidia" / "nccl" / "lib" / "libnccl.so.2"
    real.write_bytes(b"")
    monkeypatch.setattr(sys, "path", [str(tmp_path / "empty"), str(site)])
    assert nccl.real_nccl() == str(real)
    door = "/opt/door/libnccl.so.2"
    env = nccl.environment({"LD_PRELOAD": "libfoo.so " + door + ":libbar.so", "PATH": "/bin"}, door=door, mps=False)
    assert env["LD_PRELOAD"] == door + ":libfoo.so:libbar.so"
    assert env["VLLM_NCCL_SO_PATH"] == env["SGLANG_NCCL_SO_PATH"] == door
    assert env["GP2P_NCCL_REAL"] == str(real)
    assert env["PATH"] == "/bin"
    assert env["CUDA_DEVICE_MAX_CONNECTIONS"] == "32"
    kept = nccl.environment({"GP2P_NCCL_REAL": "/mine/libnccl.so.2", "CUDA_DEVICE_MAX_CONNECTIONS": "1"}, door=door, mps=False)
    # Under an MPS daemon CUDA's own number stands: the server's channels are the device's.
    pipe = tmp_path / "mps"
    assert not nccl.mps_serves({"CUDA_MPS_PIPE_DIRECTORY": str(pipe)})
    pipe.mkdir()
    (pipe / "control").write_bytes(b"")
    assert nccl.mps_serves({"CUDA_MPS_PIPE_DIRECTORY": str(pipe)})
    assert not nccl.mps_serves({"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path)})
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in nccl.environment({"CUDA_MPS_PIPE_DIRECTORY": str(pipe)}, door=door)
    assert nccl.environment({"CUDA_MPS_PIPE_DIRECTORY": str(pipe)}, door=door, mps=False)["CUDA_DEVICE_MAX_CONNECTIONS"] == "32"
    assert kept["GP2P_NCCL_REAL"] == "/mine/libnccl.so.2"
    assert kept["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    assert "export VLLM_NCCL_SO_PATH=/opt/door/libnccl.so.2" in nccl.exports(env)
    quoted = nccl.exports({"LD_PRELOAD": "/a b/libnccl.so.2"})
    assert quoted == ["export LD_PRELOAD='/a b/libnccl.so.2'"]
    # A real NCCL the user named for vLLM or sglang is the one the door hands over to; the door
    # itself, or another installation's, never is.
    pinned = nccl.environment({"VLLM_NCCL_SO_PATH": "/opt/nccl-2.18/libnccl.so.2"}, door=door, mps=False)
    assert pinned["GP2P_NCCL_REAL"] == "/opt/nccl-2.18/libnccl.so.2"
    assert pinned["VLLM_NCCL_SO_PATH"] == door
    again = nccl.environment({"SGLANG_NCCL_SO_PATH": door}, door=door, mps=False)
    assert again["GP2P_NCCL_REAL"] == str(real)
    other = nccl.environment({"VLLM_NCCL_SO_PATH": "/v/site/geforce_p2p/_nccl/libnccl.so.2"}, door=door, mps=False)
    assert other["GP2P_NCCL_REAL"] == str(real)
    built = nccl.environment({"VLLM_NCCL_SO_PATH": "/w/target/release/libgp2p_nccl.so"}, door=door, mps=False)
    assert built["GP2P_NCCL_REAL"] == str(real), "a cargo-built door is a door too"
    assert nccl.environment({"VLLM_NCCL_SO_PATH": "/x/libnccl.so.2", "GP2P_NCCL_REAL": "/mine/libnccl.so.2"},
                            door=door, mps=False)["GP2P_NCCL_REAL"] == "/mine/libnccl.so.2"
    # The dynamic linker splits LD_PRELOAD at spaces and colons: such a door is refused, naming why.
    for bad in ("/My Projects/venv/libnccl.so.2", "/a:b/libnccl.so.2"):
        with pytest.raises(ValueError, match="space or a colon"):
            nccl.environment({}, door=bad, mps=False)


def run(*args, env=None):
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, env=env, timeout=120)


def test_the_launcher_runs_a_command_with_the_door_preloaded():
    show = "import os; print(os.environ['LD_PRELOAD']); print(os.environ['VLLM_NCCL_SO_PATH'])"
    out = run("geforce_p2p.nccl", "--", sys.executable, "-c", show)
    assert out.returncode == 0, out.stderr
    preload, vllm = out.stdout.split()
    assert preload.split(":")[0] == nccl.library() == vllm
    # The same through `python -m geforce_p2p nccl`.
    env = run("geforce_p2p", "nccl", "env")
    assert env.returncode == 0, env.stderr
    assert "export LD_PRELOAD=" + nccl.library() in env.stdout
    assert run("geforce_p2p.nccl", "path").stdout.strip() == nccl.library()


def test_the_launcher_refuses_what_it_cannot_run_by_name(tmp_path):
    assert run("geforce_p2p.nccl", "--").returncode == 2
    assert run("geforce_p2p.nccl", "--", "").returncode == 2, "an empty command name is no command"
    assert run("geforce_p2p.nccl", "frobnicate").returncode == 2
    bare = run("geforce_p2p.nccl")
    assert bare.returncode == 2 and bare.stdout == "" and "usage:" in bare.stderr, "usage on stderr, not for eval"
    missing = run("geforce_p2p.nccl", "--", "/nonexistent/program")
    assert missing.returncode == 127 and "cannot run /nonexistent/program" in missing.stderr
    script = tmp_path / "not-executable.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o644)
    assert run("geforce_p2p.nccl", "--", str(script)).returncode == 126, "found but not runnable, as a shell says"


def test_the_command_gets_sigpipe_as_a_shell_would_start_it():
    # Python ignores SIGPIPE; a command run through the launcher must not inherit that, or
    # `all_reduce_perf | head` would run on after head exits.
    out = run("geforce_p2p.nccl", "--", "sh", "-c", "grep SigIgn /proc/self/status")
    assert out.returncode == 0, out.stderr
    ignored = int(out.stdout.split()[1], 16)
    assert not ignored & (1 << (13 - 1)), "SIGPIPE (13) ignored: %s" % out.stdout


def test_a_python_program_runs_with_the_door_preloaded():
    # Preloaded into an interpreter that never calls NCCL, the door costs nothing and breaks
    # nothing.
    out = run("geforce_p2p.nccl", "--", sys.executable, "-c", "print(sum(range(10)))")
    assert out.returncode == 0 and out.stdout.strip() == "45", out.stderr


def test_door_vs_comm_compares_the_medians_of_every_run(tmp_path):
    """benches/nccl/door_vs_comm.py, as figures.sh door runs it on the device: several
    nccl-tests tables against several gp2p bench reports, size by size by their medians."""
    import json

    script = os.path.join(os.path.dirname(__file__), "..", "..", "benches", "nccl", "door_vs_comm.py")
    row = "%12d %13d float sum -1 %8.2f %6.2f %6.2f %d %8.2f %6.2f %6.2f %d\n"
    runs = [(10.0, 9.0), (20.0, 19.0), (30.0, 29.0)]  # 64 KiB's busbw (oop, ip), run by run
    table = tmp_path / "door-t2-all_reduce.txt"
    table.write_text("# nccl-tests header\n" + "".join(
        row % (65536, 16384, 1.0, oop, oop, 0, 1.0, ip, ip, 0) + row % (1 << 20, 1 << 18, 1.0, 40.0, 40.0, 0, 1.0, 40.0, 40.0, 0)
        for oop, ip in runs))
    reports = []
    for k, bw in enumerate([20.0, 22.0, 90.0]):
        report = tmp_path / ("comm-%d.json" % k)
        report.write_text(json.dumps({"rows": [{"bytes": 65536, "busbw": bw, "wrong": 0},
                                               {"bytes": 1 << 20, "busbw": 40.0, "wrong": 0}]}))
        reports.append(str(report))
    done = subprocess.run([sys.executable, script, str(table), *reports], capture_output=True, text=True)
    lines = done.stdout.splitlines()
    small = next(line for line in lines if line.split()[0] == "65536").split()
    # Door: medians 20 (oop) and 19 (ip); comm: median 22; ratio 19 / 22.
    assert small[1:5] == ["20.00", "19.00", "22.00", "%.3f" % (19 / 22)], done.stdout
    assert small[5] == "3/3" and "below 0.95" in " ".join(small), done.stdout
    assert lines[-1] == "door/comm: NOT MET" and done.returncode == 1, done.stdout
    # A wrong element anywhere fails the size, and a report alone is refused.
    table.write_text(table.read_text().replace(" 40.00 0\n", " 40.00 3\n", 1))
    done = subprocess.run([sys.executable, script, str(table), *reports, "--min-bytes", "1048576"],
                          capture_output=True, text=True)
    assert "wrong 3" in done.stdout and done.returncode == 1, done.stdout
    # So does one in a communicator's report.
    table.write_text(table.read_text().replace(" 40.00 3\n", " 40.00 0\n", 1))
    bad = json.loads(open(reports[0]).read())
    bad["rows"][1]["wrong"] = 2
    open(reports[0], "w").write(json.dumps(bad))
    done = subprocess.run([sys.executable, script, str(table), *reports, "--min-bytes", "1048576"],
                          capture_output=True, text=True)
    assert "wrong 2" in done.stdout and done.returncode == 1, done.stdout
    refused = subprocess.run([sys.executable, script, *reports], capture_output=True, text=True)
    assert refused.returncode == 2 and "nccl-tests output" in refused.stderr
