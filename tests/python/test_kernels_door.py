"""GPU tests of the door users are told about: the ``cargo xtask hub`` repository loaded
through Hugging Face ``kernels`` exactly as the README says, (a) with ``LOCAL_KERNELS``,
(b) from a Hub cache with ``HF_HUB_OFFLINE=1`` and ``version=1``, and (c) beside a
pip-installed copy in one process; each runs the README's usage block with one GPU
(``cuda:0`` to ``cuda:0``), every result checked.

Each case runs in a fresh interpreter (``HF_HUB_OFFLINE`` is read at import). Needs torch,
CUDA, ``kernels`` and ``GP2P_HUB_REPO`` (the repository ``cargo xtask hub`` wrote).
"""

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("kernels")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (torch.cuda.is_available() is False)", allow_module_level=True)
REPO = os.environ.get("GP2P_HUB_REPO")
if not REPO:
    pytest.skip("GP2P_HUB_REPO is not set (cargo xtask hub DIR writes one)", allow_module_level=True)

ORG_REPO = "geforce-p2p/geforce-p2p"

# The README's usage block, as written, on one GPU, then every result checked.
USAGE = r"""
import json, sys, torch
from kernels import get_kernel

gp = get_kernel("%(repo_id)s", version=1, trust_remote_code=True)
print(gp.probe())
report = gp.probe(measure=True)
links = report.links
assert links["devices"][0]["device"] == 0 and links["devices"][0]["duplex_gbps"] > 1, links
a = torch.randn(1 << 20, device="cuda:0")
b = gp.copy(a, device="cuda:0")
grads = [torch.randn(1000, device="cuda:0")]
before = grads[0].clone()
gp.all_reduce(grads, op="avg")
dst, src = torch.empty(4099, device="cuda:0"), torch.randn(4099, device="cuda:0")
gp.ops.geforce_p2p_staged_copy(dst, src)
host = torch.empty(4099, pin_memory=True)
gp.ops.geforce_p2p_copy_to_host(host, src)
back = torch.empty(4099, device="cuda:0")
gp.ops.geforce_p2p_copy_from_host(back, host)
acc = torch.randn(4099, device="cuda:0")
torch.cuda.synchronize()
want = acc.double().cpu() + host.double()
gp.ops.geforce_p2p_reduce_from_host(acc, host, op="sum")
torch.cuda.synchronize()
assert torch.equal(b, a), "copy"
assert torch.equal(grads[0], before), "one rank: all_reduce leaves it as it was"
assert torch.equal(dst, src) and torch.equal(host, src.cpu()) and torch.equal(back, src), "the four ops"
assert torch.equal(acc.cpu(), want.float()), "reduce_from_host"
try:
    gp.copy(a, device="cuda:%%d" %% torch.cuda.device_count())
except ValueError as e:
    assert str(e).startswith("device: "), e
else:
    raise AssertionError("a device that does not exist was taken")
assert gp._native.package_name() == gp.__name__ != "geforce_p2p"
print("LOADED", gp.__name__, gp.__file__)
"""

BESIDE_PIP = r"""
import torch
import geforce_p2p as pip_gp
gp = sys.modules[[m for m in sys.modules if m.startswith("_geforce_p2p_cuda_") and "." not in m][0]]
assert pip_gp is not gp and pip_gp._native is not gp._native
assert pip_gp._native.package_name() == "geforce_p2p"
# Both work, on their own engines; each raises its own classes.
c = pip_gp.copy(a, device="cuda:0")
torch.cuda.synchronize()
assert torch.equal(c, a)
for mine, other in ((gp, pip_gp), (pip_gp, gp)):
    try:
        mine.distributed.Communicator("not-an-id", 0, 2, device=0)  # refused natively
    except mine.InvalidArgumentError as e:
        assert not isinstance(e, other.Error), "a copy raised the other copy's class"
    else:
        raise AssertionError("a malformed id was taken")
# Their torch custom ops live in their own namespaces.
assert torch.ops.geforce_p2p.copy_into.default is not getattr(torch.ops, gp.__name__).copy_into.default
print("BESIDE", pip_gp.__file__)
"""


def run(code, env):
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return done.stdout


def base_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_KERNELS", "HF_HUB_OFFLINE", "KERNELS_CACHE")}
    env.update(extra)
    return env


def test_local_kernels_loads_it_through_the_exact_get_kernel_call():
    out = run(USAGE % {"repo_id": ORG_REPO}, base_env(LOCAL_KERNELS="%s=%s" % (ORG_REPO, REPO)))
    loaded = [line for line in out.splitlines() if line.startswith("LOADED ")]
    assert loaded and pathlib.Path(loaded[0].split()[2]).resolve().is_relative_to(pathlib.Path(REPO).resolve()), out


def test_a_hub_cache_offline_loads_branch_v1(tmp_path):
    commit = "0123456789abcdef0123456789abcdef01234567"
    org, name = ORG_REPO.split("/")
    cached = tmp_path / ("kernels--%s--%s" % (org, name))
    (cached / "refs").mkdir(parents=True)
    (cached / "refs" / "v1").write_text(commit)
    shutil.copytree(REPO, cached / "snapshots" / commit)
    env = base_env(HF_HUB_OFFLINE="1", KERNELS_CACHE=str(tmp_path), HF_HUB_CACHE=str(tmp_path),
                   HF_HOME=str(tmp_path / "home"))
    out = run(USAGE % {"repo_id": ORG_REPO}, env)
    assert "LOADED _geforce_p2p_cuda_" in out and commit in out, out


def test_it_lives_beside_a_pip_installed_copy():
    pytest.importorskip("geforce_p2p")
    out = run(USAGE % {"repo_id": ORG_REPO} + BESIDE_PIP, base_env(LOCAL_KERNELS="%s=%s" % (ORG_REPO, REPO)))
    assert "LOADED _geforce_p2p_cuda_" in out and "BESIDE" in out
