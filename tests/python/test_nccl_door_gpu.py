"""GPU: programs that call NCCL, run with the NCCL door in NCCL's place
(``geforce_p2p.nccl.environment()``), 2, 4 and 8 ranks as processes (each runs
``_door_rank.py``, which checks every result against a float64 CPU reference). On one GPU the
ranks share it under an MPS daemon (``test_many.py``'s rule): the real NCCL refuses that
("Duplicate GPU detected"), so a run that passes was served by the door, which every rank's log
line says too."""

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

from test_many import _run, _runs  # noqa: E402

from geforce_p2p import nccl  # noqa: E402

DOOR_SCRIPT = os.path.join(os.path.dirname(__file__), "_door_rank.py")


def door_env(**extra):
    env = nccl.environment()
    env.update(extra)
    return env


def served_everywhere(outputs):
    for r, out in enumerate(outputs):
        assert "geforce-p2p NCCL door: on: serving" in out, "rank %d was not served:\n%s" % (r, out[-2000:])
        assert "handing" not in out, "rank %d handed a communicator over:\n%s" % (r, out[-2000:])


@pytest.mark.parametrize("world", [2, 4, 8])
def test_torch_s_nccl_backend_runs_on_the_door_with_ddp_fsdp2_dtensor_p2p_and_graphs(world, tmp_path):
    outputs = _run("nccl", world, "file://" + str(tmp_path / "init"), tmp_path, timeout=600, script=DOOR_SCRIPT,
                   env=door_env())
    served_everywhere(outputs)


@pytest.mark.parametrize("world", [2, 4, 8])
def test_vllm_s_pynccl_calls_run_on_the_door_eager_and_in_a_graph(world, tmp_path):
    outputs = _run("pynccl", world, "file://" + str(tmp_path / "init"), tmp_path, script=DOOR_SCRIPT,
                   env=door_env())
    served_everywhere(outputs)


def test_with_the_door_off_one_rank_runs_on_the_real_nccl_through_it(tmp_path):
    outputs = _run("pynccl", 1, "file://" + str(tmp_path / "init"), tmp_path, script=DOOR_SCRIPT,
                   env=door_env(GP2P_NCCL="off"))
    assert "serving" not in outputs[0], outputs[0][-2000:]


@pytest.mark.parametrize("world", [4])
def test_a_rank_killed_mid_collective_ends_the_others_within_the_timeout_and_leaves_no_segment(world, tmp_path):
    _runs(world)
    before = set(glob.glob("/dev/shm/gp2p-*"))
    env = door_env()
    init = "file://" + str(tmp_path / "init")
    logs = [open(tmp_path / ("rank%d.log" % r), "w+") for r in range(world)]
    started = time.monotonic()
    ranks = [subprocess.Popen([sys.executable, DOOR_SCRIPT, "killed", str(r), str(world), init], env=env,
                              stdout=log, stderr=subprocess.STDOUT, text=True) for r, log in enumerate(logs)]
    ended = {}
    try:
        while len(ended) < world and time.monotonic() - started < 120:
            for r, p in enumerate(ranks):
                if r not in ended and p.poll() is not None:
                    ended[r] = time.monotonic() - started
            time.sleep(0.1)
    finally:
        for p in ranks:
            if p.poll() is None:
                p.kill()
                p.wait()
    outs = []
    for log in logs:
        log.seek(0)
        outs.append(log.read())
        log.close()
    assert ranks[-1].returncode == -signal.SIGKILL, outs[-1][-2000:]
    for r in range(world - 1):
        # torch's watchdog aborts the communicator at the group's 20 s timeout and ends the
        # process (its default error handling); the door's abort ends every wait on the GPU.
        assert r in ended and ended[r] < 20 + 40, "rank %d still running after %.0f s:\n%s" % (
            r, time.monotonic() - started, outs[r][-2000:])
        assert ranks[r].returncode != 0, "rank %d ended without an error:\n%s" % (r, outs[r][-2000:])
    left = set(glob.glob("/dev/shm/gp2p-*")) - before
    assert not left, "segments left in /dev/shm: %s" % sorted(left)
