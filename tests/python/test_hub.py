"""CPU tests of the Hugging Face ``kernels`` repository that ``cargo xtask hub`` writes
(``crates/gp2p-python/hub/make_repo.py``), checked with ``kernels`` 0.17.2's own parser,
variant resolver and importer, which run without torch.

They need the wheel the package's CPU tests were installed from (``GP2P_WHEEL``, which
``tests/python/run-cpu-tests`` sets) and ``kernels``; run by hand without them they skip.
"""

import importlib
import json
import os
import pathlib
import re
import subprocess
import sys
import zipfile

import pytest

import geforce_p2p as gp

REPO = pathlib.Path(__file__).resolve().parents[2]
MAKE_REPO = REPO / "crates" / "gp2p-python" / "hub" / "make_repo.py"
WHEEL = os.environ.get("GP2P_WHEEL")
if not WHEEL:
    pytest.skip("GP2P_WHEEL is not set (tests/python/run-cpu-tests sets it)", allow_module_level=True)
kernels_rust = pytest.importorskip("kernels._rust")
variants = pytest.importorskip("kernels.variants")

from kernels.backends import CUDA  # noqa: E402
from kernels.importer import _import_from_path  # noqa: E402
from kernels.python_deps import validate_dependencies  # noqa: E402
from packaging.version import Version  # noqa: E402

VARIANTS = {"torch-stable-abi29-cu126-x86_64-linux", "torch-stable-abi29-cu130-x86_64-linux"}
ID_PATTERN = re.compile(r"^_geforce_p2p_cuda_[0-9a-f]{7}_[0-9a-f]{8}$")


def make_repo(out, wheel=WHEEL, commit="0123456789abcdef0123456789abcdef01234567"):
    done = subprocess.run([sys.executable, str(MAKE_REPO), "--wheel", str(wheel), "--out", str(out), "--commit",
                           commit], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    return make_repo(tmp_path_factory.mktemp("hub") / "geforce-p2p")


def test_the_repository_holds_a_card_and_the_two_variants_only(repo):
    assert sorted(p.name for p in repo.iterdir()) == ["README.md", "build"]
    assert {p.name for p in (repo / "build").iterdir()} == VARIANTS
    card = (repo / "README.md").read_text()
    assert 'get_kernel("<org>/geforce-p2p", version=1, trust_remote_code=True)' in card
    assert "gp.ops.geforce_p2p_staged_copy" in card
    with zipfile.ZipFile(WHEEL) as zf:
        in_wheel = sorted(n[len("geforce_p2p/"):] for n in zf.namelist() if n.startswith("geforce_p2p/"))
    for variant in VARIANTS:
        root = repo / "build" / variant
        files = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
        # The package's files directly in the variant folder, beside metadata.json; nothing
        # the loader does not read (no dist-info, no build files).
        assert files == sorted(in_wheel + ["metadata.json"]), files
        assert any(f.startswith("_native") and f.endswith(".so") for f in files)


def test_metadata_passes_the_kernels_parser_and_its_dependency_check(repo):
    ids = set()
    for variant in VARIANTS:
        meta = kernels_rust.Metadata.read_from_file(repo / "build" / variant / "metadata.json")
        assert str(meta.name.python_name) == "geforce_p2p"
        assert meta.version == 1
        assert meta.license == "Apache-2.0"
        assert meta.backend.backend_type == kernels_rust.Backend.CUDA
        assert meta.backend.archs == ["7.5+PTX", "8.0+PTX"]
        assert meta.python_depends == []
        validate_dependencies(meta.name.python_name, meta.python_depends, CUDA(version=Version("12.8")))
        assert ID_PATTERN.match(meta.id), meta.id
        assert meta.id.startswith("_geforce_p2p_cuda_0123456_")
        ids.add(meta.id)
    assert len(ids) == 1, "one build, one id across its variants"


def test_the_parser_refuses_what_make_repo_must_never_write(repo):
    good = json.loads(next(repo.glob("build/*/metadata.json")).read_text())
    kernels_rust.Metadata.from_bytes(json.dumps(good).encode())
    for field, value in (("name", "geforce_p2p"), ("backend", {"type": "gpu"}), ("version", "one")):
        bad = dict(good, **{field: value})
        with pytest.raises(Exception):
            kernels_rust.Metadata.from_bytes(json.dumps(bad).encode())


def test_the_loader_picks_a_variant_for_cuda_torch_from_2_9():
    parsed = [variants.parse_variant(v) for v in VARIANTS]

    def accepted(cuda, torch):
        decisions = variants._check_variants(parsed, CUDA(version=Version(cuda)), "x86_64", "linux", Version(torch),
                                              True, None)
        return {d.variant.variant_str for d in decisions if isinstance(d, variants.VariantAccepted)}

    assert accepted("12.8", "2.11") == {"torch-stable-abi29-cu126-x86_64-linux"}
    assert accepted("12.6", "2.9") == {"torch-stable-abi29-cu126-x86_64-linux"}
    assert accepted("13.0", "2.11") == {"torch-stable-abi29-cu130-x86_64-linux"}
    assert accepted("12.8", "2.8") == set()


def test_each_build_gets_its_own_id(tmp_path, repo):
    first = kernels_rust.Metadata.read_from_file(next(repo.glob("build/*/metadata.json"))).id
    again = make_repo(tmp_path / "again")
    assert kernels_rust.Metadata.read_from_file(next(again.glob("build/*/metadata.json"))).id == first, \
        "the same files and commit: the same id"
    # Another build: the same wheel with one file changed.
    other_wheel = tmp_path / "other.whl"
    with zipfile.ZipFile(WHEEL) as src, zipfile.ZipFile(other_wheel, "w") as dst:
        for item in src.infolist():
            data = src.read(item)
            if item.filename == "geforce_p2p/_probe.py":
                data += b"\n# another build\n"
            dst.writestr(item, data)
    other = make_repo(tmp_path / "other", wheel=other_wheel)
    other_id = kernels_rust.Metadata.read_from_file(next(other.glob("build/*/metadata.json"))).id
    assert other_id != first and ID_PATTERN.match(other_id)


def test_kernels_imports_it_beside_the_pip_installed_copy_sharing_nothing(repo):
    variant = repo / "build" / "torch-stable-abi29-cu126-x86_64-linux"
    meta = kernels_rust.Metadata.read_from_file(variant / "metadata.json")
    hub = _import_from_path(variant, {})
    try:
        assert hub.__name__ == meta.id and sys.modules[meta.id] is hub
        assert hub is not gp and hub._native is not gp._native
        assert hub._native.__name__ == meta.id + "._native"
        # Each copy's native half knows its own package, so it raises its own classes.
        assert hub._native.package_name() == meta.id
        assert gp._native.package_name() == "geforce_p2p"
        assert hub.Error is not gp.Error and hub.Error.__module__ == meta.id
        with pytest.raises(hub.UnavailableError) as raised:
            hub.device_count()  # no driver here
        assert not isinstance(raised.value, gp.Error)
        with pytest.raises(gp.UnavailableError):
            gp.device_count()
        # The names users are given, and the rest of the package through the same object.
        for name in ("staged_copy", "reduce_from_host", "copy_to_host", "copy_from_host"):
            assert getattr(hub.ops, "geforce_p2p_" + name) is getattr(hub.ops, name)
        assert hub.distributed.__name__ == meta.id + ".distributed"
        assert importlib.import_module(meta.id + ".distributed") is hub.distributed
        with pytest.raises(hub.UnavailableError):
            hub.probe(measure=True)
    finally:
        for name in [m for m in sys.modules if m == meta.id or m.startswith(meta.id + ".")]:
            del sys.modules[name]
