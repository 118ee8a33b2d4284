"""GPU: 3, 4 and 8 processes through the communicator, the ``gp2p`` torch.distributed backend
and ``CustomAllreduce`` (each rank runs ``_many_rank.py``, which checks every result against a
float64 CPU reference).

Rank r runs on GPU r modulo the GPUs visible. Where there are fewer GPUs than ranks the
processes share them, which is only useful under an MPS control daemon (otherwise they take
turns in ~2 ms time slices): those cases are skipped unless CUDA_MPS_PIPE_DIRECTORY names one
(``benches/device/suite.sh many`` starts it)."""

import glob
import os
import signal
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (torch.cuda.is_available() is False)", allow_module_level=True)

import _package  # noqa: E402

gp = _package.load()

NDEV = torch.cuda.device_count()
RANK_SCRIPT = os.path.join(os.path.dirname(__file__), "_many_rank.py")


def _runs(world):
    if NDEV >= world or os.environ.get("CUDA_MPS_PIPE_DIRECTORY"):
        return
    pytest.skip("%d ranks on %d GPU(s) need an MPS daemon (benches/device/suite.sh many)" % (world, NDEV))


def _run(scenario, world, init, tmp_path, timeout=240, killed=(), script=RANK_SCRIPT, env=None):
    """Every rank of `scenario` (of `script`, in environment `env`) as a process; each must
    pass, but those in `killed`, which must die of SIGKILL. None is left behind; a rank that
    fails or stalls shows the end of its output. Returns every rank's output."""
    _runs(world)
    logs = [open(tmp_path / ("rank%d.log" % r), "w+") for r in range(world)]
    ranks = [subprocess.Popen([sys.executable, script, scenario, str(r), str(world), init], env=env,
                              stdout=log, stderr=subprocess.STDOUT, text=True) for r, log in enumerate(logs)]
    deadline = time.monotonic() + timeout
    try:
        for p in ranks:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pass
    finally:
        stalled = [r for r, p in enumerate(ranks) if p.poll() is None]
        for p in ranks:
            if p.poll() is None:
                p.kill()
                p.wait()
    failed, outputs = [], []
    for r, (p, log) in enumerate(zip(ranks, logs)):
        log.seek(0)
        out = log.read()
        outputs.append(out)
        log.close()
        want = -signal.SIGKILL if r in killed else 0
        if r in stalled or p.returncode != want:
            why = "stalled past %d s" % timeout if r in stalled else "exit %s, not %s" % (p.returncode, want)
            failed.append("rank %d (%s):\n%s" % (r, why, out[-3000:]))
    assert not failed, "\n".join(failed)
    return outputs


@pytest.mark.parametrize("world", [3, 4, 8])
def test_the_communicator_runs_every_collective_capture_and_calls_back_to_back(world, tmp_path):
    _run("comm", world, gp.distributed.unique_id(), tmp_path)


@pytest.mark.parametrize("world", [2, 4, 8])
def test_torch_distributed_on_the_gp2p_backend_with_ddp_fsdp2_dtensor_and_a_subgroup(world, tmp_path):
    _run("backend", world, "file://" + str(tmp_path / "init"), tmp_path)


@pytest.mark.parametrize("world", [2, 4])
def test_custom_allreduce_through_the_calls_vllm_and_sglang_make(world, tmp_path):
    _run("server", world, "file://" + str(tmp_path / "init"), tmp_path)


COMPRESS_SCRIPT = os.path.join(os.path.dirname(__file__), "_compress_rank.py")


@pytest.mark.parametrize("world", [2, 4, 8])
def test_a_tensor_parallel_mlp_block_runs_compressed_within_its_error_and_replays_from_a_graph(world, tmp_path):
    outputs = _run("compress-mlp", world, gp.distributed.unique_id(), tmp_path, script=COMPRESS_SCRIPT)
    print(next(line for line in outputs[0].splitlines() if "tp-mlp" in line))


@pytest.mark.parametrize("world", [2, 4])
def test_ddp_with_compressed_gradients_converges_like_the_exact_run(world, tmp_path):
    outputs = _run("compress-ddp", world, "file://" + str(tmp_path / "init"), tmp_path, script=COMPRESS_SCRIPT)
    print(next(line for line in outputs[0].splitlines() if "compressed: last loss" in line))


@pytest.mark.parametrize("world", [4])
def test_two_fake_hosts_run_the_two_level_backend_with_gloo_between_them(world, tmp_path):
    _run("hosts", world, "file://" + str(tmp_path / "init"), tmp_path)


@pytest.mark.parametrize("world", [4])
def test_a_fake_host_killed_mid_call_makes_the_other_host_raise_and_leaves_no_segment(world, tmp_path):
    # No segment is left because each is unlinked once every rank joined it: this guards that
    # rule (a segment kept linked until close would be left by the killed host).
    before = set(glob.glob("/dev/shm/gp2p-*"))
    _run("host-killed", world, "file://" + str(tmp_path / "init"), tmp_path, killed=range(world // 2, world))
    left = set(glob.glob("/dev/shm/gp2p-*")) - before
    assert not left, "segments left in /dev/shm: %s" % sorted(left)
