"""minimpi (benches/nccl/minimpi): the MPI stand-in that lets nccl-tests run one process per
rank through the NCCL door on the device machines, which have no MPI. Built with the C
compiler here and run under its launcher, as benches/device/nccl-tests.sh builds it there."""

import os
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
MINIMPI = os.path.join(HERE, "..", "..", "benches", "nccl", "minimpi")
MPIRUN = os.path.join(MINIMPI, "mpirun.py")

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) to build minimpi")


@pytest.fixture(scope="module")
def check(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("minimpi") / "check")
    subprocess.run(["cc", "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-I", MINIMPI,
                    os.path.join(MINIMPI, "check.c"), os.path.join(MINIMPI, "mpi.c"), "-o", out], check=True)
    return out


def mpirun(*args, timeout=120):
    return subprocess.run([sys.executable, MPIRUN, *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("ranks", [1, 2, 3, 4, 8])
def test_every_call_nccl_tests_makes_gives_every_rank_the_right_answer(check, ranks):
    run = mpirun("-n", str(ranks), "--", check)
    assert run.returncode == 0, run.stderr
    lines = sorted(run.stdout.split("\n")[:-1])
    # Every rank printed its line, with the world's size and 200 rounds of its half's sum.
    assert lines == sorted(f"ok {r} {ranks} {200 * ((ranks + 1 - r % 2) // 2)}" for r in range(ranks))


def test_a_binary_built_against_it_runs_alone_as_a_world_of_one(check):
    run = subprocess.run([check], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout == "ok 0 1 200\n"


def test_a_rank_that_fails_stops_the_others_and_gives_its_status(check):
    # Rank 2 exits with 3 before the last barrier, where the other three would wait for ever.
    run = mpirun("-n", "4", "--", check, "2", timeout=60)
    assert run.returncode == 3
    assert "rank 2 ended with status 3; stopping the others" in run.stderr
    assert "ok " not in run.stdout


@pytest.mark.parametrize("mode, message", [
    ("oversize", "MPI_Bcast: 2097152 bytes a rank is more than the 1048576-byte slot; raise mpirun.py's --slot-bytes"),
    ("badop", "MPI_Allreduce: the operation is not sum, min or max"),
])
def test_a_call_it_cannot_serve_ends_the_ranks_with_a_message(check, mode, message):
    # nccl-tests ignores MPI's return codes: a rank that skipped a collective would leave the
    # others' barriers out of step, so such a call ends the process instead.
    run = mpirun("-n", "2", "--", check, mode, timeout=60)
    assert run.returncode == 1, run.stderr
    assert message in run.stderr
    assert "ok " not in run.stdout


def test_a_peer_that_never_arrives_ends_the_wait_with_a_message(check, tmp_path):
    # One rank of a world of two, started by hand: its first collective waits for a peer that
    # never comes, until MINIMPI_TIMEOUT.
    segment = tmp_path / "segment"
    with open(segment, "wb") as f:
        f.truncate(16 * 64 * 64 + 2 * 4096)
    env = dict(os.environ, MINIMPI_SEG=str(segment), MINIMPI_RANK="0", MINIMPI_SIZE="2", MINIMPI_SLOT_BYTES="4096",
               MINIMPI_TIMEOUT="1")
    run = subprocess.run([check], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 1
    assert "MPI_Allgather waited 1 s for its peers (MINIMPI_TIMEOUT)" in run.stderr


def test_a_rank_without_its_segment_is_told_to_use_the_launcher(check, tmp_path):
    env = dict(os.environ, MINIMPI_SEG=str(tmp_path / "absent"), MINIMPI_RANK="0", MINIMPI_SIZE="2",
               MINIMPI_SLOT_BYTES="4096")
    run = subprocess.run([check], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 1
    assert "start the ranks with benches/nccl/minimpi/mpirun.py" in run.stderr


def test_the_launcher_refuses_what_it_cannot_run():
    assert mpirun("-n", "0", "--", "true").returncode == 2
    assert mpirun("-n", "65", "--", "true").returncode == 2
    assert mpirun("-n", "2").returncode == 2
    run = mpirun("-n", "2", "--", "/nonexistent/program")
    assert run.returncode == 127
    assert "cannot start /nonexistent/program" in run.stderr
