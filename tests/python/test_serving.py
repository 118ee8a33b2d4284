"""CPU: the vLLM and sglang plugins (geforce_p2p.serving) against stand-ins built to the
interfaces read from vLLM 0.33.0's and sglang 0.5.23's sources: the
entry points the wheel declares, the platform and communicator vLLM resolves, sglang's AROUND
hook, the switch, the version check, and the start-up line. vLLM's own code drives the
plugin in tests/serving/check-servers (too large for CI)."""

import importlib
import logging
import os
import sys
import textwrap
from importlib import metadata

import pytest

import geforce_p2p
from geforce_p2p import serving

via_kernels = pytest.mark.skipif(bool(os.environ.get("GP2P_TEST_VIA_KERNELS")),
                                 reason="a kernels copy carries no entry points")


@via_kernels
def test_the_wheel_declares_an_entry_point_for_each_server():
    for group, target in (("vllm.platform_plugins", "geforce_p2p.serving:vllm_platform"),
                          ("sglang.srt.plugins", "geforce_p2p.serving:sglang_plugin")):
        found = [ep for ep in metadata.entry_points(group=group) if ep.name == "geforce_p2p"]
        assert [ep.value for ep in found] == [target], group
        assert found[0].load() is getattr(serving, target.split(":")[1])


def _write(root, files):
    for path, text in files.items():
        full = root / path
        full.parent.mkdir(parents=True, exist_ok=True)
        full.write_text(textwrap.dedent(text))


_VLLM = {
    "vllm/__init__.py": "",
    "vllm/platforms/__init__.py": """
        import os
        def cuda_platform_plugin():
            return None if os.environ.get("FAKE_NO_CUDA") else "vllm.platforms.cuda.CudaPlatform"
    """,
    "vllm/platforms/cuda.py": """
        class CudaPlatform:
            device_name = "cuda"
            @classmethod
            def get_device_communicator_cls(cls):
                return "vllm.distributed.device_communicators.cuda_communicator.CudaCommunicator"
    """,
    "vllm/distributed/__init__.py": "",
    "vllm/distributed/device_communicators/__init__.py": "",
    "vllm/distributed/device_communicators/cuda_communicator.py": """
        import os
        class VllmCustomAllreduce:
            def __init__(self, group, device, **kw):
                self.disabled = not os.environ.get("FAKE_P2P")
        class CudaCommunicator:
            def __init__(self, cpu_group, device=None, device_group=None, unique_name="", global_ranks=None,
                         global_world_size=None, tcp_store_group=None, use_all2all=False):
                self.cpu_group, self.device, self.world_size = cpu_group, device, int(os.environ.get("FAKE_WORLD", 4))
                self.use_custom_allreduce = unique_name.split(":")[0] == "tp"
                self.ca_comm = None
                if self.use_custom_allreduce and self.world_size > 1:
                    self.ca_comm = VllmCustomAllreduce(group=cpu_group, device=device, symm_mem_enabled=False,
                                                       register_graph_buffers=True)
    """,
}

_SGLANG = {
    "sglang/__init__.py": "",
    "sglang/srt/__init__.py": "",
    "sglang/srt/plugins/__init__.py": "",
    "sglang/srt/plugins/hook_registry.py": """
        import enum
        class HookType(enum.Enum):
            BEFORE = "before"
            AFTER = "after"
            AROUND = "around"
            REPLACE = "replace"
        class HookRegistry:
            hooks = []
            @classmethod
            def register(cls, target, hook, hook_type=HookType.AFTER, *, source=None):
                cls.hooks.append((target, hook, hook_type))
    """,
}


def _dist_info(root, name, version):
    _write(root, {"%s-%s.dist-info/METADATA" % (name, version): "Metadata-Version: 2.1\nName: %s\nVersion: %s\n"
                  % (name, version)})


class _Ours:
    """What serving builds where it takes over (CustomAllreduce needs torch and a GPU)."""

    disabled = False

    class comm:  # noqa: N801  (an attribute, as CustomAllreduce has)
        max_bytes = 64 << 10


@pytest.fixture
def servers(tmp_path, monkeypatch):
    """Stand-in vLLM and sglang on sys.path, at their tested versions; torn down after."""
    _write(tmp_path, _VLLM)
    _write(tmp_path, _SGLANG)
    _dist_info(tmp_path, "vllm", "0.33.0")
    _dist_info(tmp_path, "sglang", "0.5.23")
    monkeypatch.syspath_prepend(str(tmp_path))
    for var in (serving.ENV, "FAKE_NO_CUDA", "FAKE_P2P", "FAKE_WORLD"):
        monkeypatch.delenv(var, raising=False)
    built = []
    monkeypatch.setattr(serving, "_build_ours", lambda group, device: built.append((group, device)) or _Ours())
    importlib.invalidate_caches()
    yield tmp_path, built
    for name in [m for m in sys.modules if m.split(".")[0] in ("vllm", "sglang") or "._vllm" in m]:
        del sys.modules[name]


def test_vllm_resolves_a_cuda_platform_whose_communicator_takes_over_only_where_vllm_s_is_off(servers, caplog):
    _, built = servers
    caplog.set_level(logging.INFO, logger="geforce_p2p.serving")
    assert serving.vllm_platform() == serving.VLLM_PLATFORM
    module, name = serving.VLLM_PLATFORM.rsplit(".", 1)
    platform = getattr(importlib.import_module(module), name)
    from vllm.distributed.device_communicators.cuda_communicator import CudaCommunicator, VllmCustomAllreduce
    from vllm.platforms.cuda import CudaPlatform

    assert issubclass(platform, CudaPlatform)
    module, name = platform.get_device_communicator_cls().rsplit(".", 1)
    communicator = getattr(importlib.import_module(module), name)
    assert issubclass(communicator, CudaCommunicator), "vLLM's graph capture asserts this"
    # No P2P: vLLM's object is disabled, so ours takes its place, built over the CPU group.
    comm = communicator(cpu_group="g", device="cuda:1", device_group="d", unique_name="tp:0", use_all2all=False)
    assert isinstance(comm.ca_comm, _Ours) and built == [("g", "cuda:1")]
    assert "on for ranks" in caplog.text and "up to 64 KiB" in caplog.text
    # P2P works: vLLM's own stays, and ours is never built.
    os.environ["FAKE_P2P"] = "1"
    comm = communicator(cpu_group="g", device="cuda:1", unique_name="tp:0")
    assert isinstance(comm.ca_comm, VllmCustomAllreduce) and len(built) == 1
    assert "own custom all-reduce runs" in caplog.text
    # Not a tensor-parallel group: vLLM makes no custom all-reduce there, nor do we.
    del os.environ["FAKE_P2P"]
    assert communicator(cpu_group="g", device="cuda:1", unique_name="pp:0").ca_comm is None and len(built) == 1


def test_where_ours_cannot_join_vllm_keeps_its_own_disabled_object(servers, monkeypatch, caplog):
    class Disabled(_Ours):
        disabled = True

    monkeypatch.setattr(serving, "_build_ours", lambda group, device: Disabled())
    from geforce_p2p._vllm import GeForceP2PCudaCommunicator
    from vllm.distributed.device_communicators.cuda_communicator import VllmCustomAllreduce

    comm = GeForceP2PCudaCommunicator(cpu_group="g", device="cuda:0", unique_name="tp:0")
    assert isinstance(comm.ca_comm, VllmCustomAllreduce) and comm.ca_comm.disabled
    assert "could not join" in caplog.text


def test_the_switch_a_machine_without_cuda_and_an_untested_version_leave_vllm_alone(servers, monkeypatch, caplog):
    root, _ = servers
    caplog.set_level(logging.INFO, logger="geforce_p2p.serving")
    monkeypatch.setenv(serving.ENV, "0")
    assert serving.vllm_platform() is None
    assert "GP2P_SERVING=0" in caplog.text
    monkeypatch.setenv(serving.ENV, "1")
    monkeypatch.setenv("FAKE_NO_CUDA", "1")
    assert serving.vllm_platform() is None, "vLLM's own choice stands where it is not CUDA"
    assert "vLLM's platform here is not CUDA" in caplog.text
    monkeypatch.delenv("FAKE_NO_CUDA")
    (root / "vllm-0.33.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.34.1\n")
    importlib.invalidate_caches()
    assert serving.vllm_platform() is None
    assert "vllm 0.34.1 is outside the tested range (>= 0.33, < 0.34)" in caplog.text


def test_sglang_gets_an_around_hook_that_builds_its_own_first_and_ours_where_it_fails(servers, caplog):
    _, built = servers
    caplog.set_level(logging.INFO, logger="geforce_p2p.serving")
    serving.sglang_plugin()
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    assert [(t, h, k) for t, h, k in HookRegistry.hooks] == [(serving.SGLANG_TARGET, serving._sglang_dispatch,
                                                            HookType.AROUND)]

    class Theirs:
        disabled = False

        def __init__(self, group, device):
            self.group = group

    class Failing:
        def __init__(self, group, device):
            raise RuntimeError("peer access is not supported between these two devices")

    # sglang calls the hook as hook(original, group=, device=) and then the class it returns.
    make = serving._sglang_dispatch(lambda group, device: Theirs, group="cpu", device="cuda:0")
    assert isinstance(make(group="cpu", device="cuda:0"), Theirs) and built == []
    make = serving._sglang_dispatch(lambda group, device: Failing, group="cpu", device="cuda:0")
    assert isinstance(make(group="cpu", device="cuda:0"), _Ours) and built == [("cpu", "cuda:0")]
    assert "peer access is not supported" in caplog.text


def test_sglang_outside_the_tested_range_or_switched_off_gets_no_hook(servers, monkeypatch):
    root, _ = servers
    monkeypatch.setenv(serving.ENV, "off")
    serving.sglang_plugin()
    monkeypatch.delenv(serving.ENV)
    (root / "sglang-0.5.23.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.6.0\n")
    importlib.invalidate_caches()
    serving.sglang_plugin()
    from sglang.srt.plugins.hook_registry import HookRegistry

    assert HookRegistry.hooks == []


def test_versions_compare_by_release_numbers():
    assert serving.tested("vllm", "0.33.0") and serving.tested("vllm", "0.33.2+cu130")
    assert not serving.tested("vllm", "0.32.9") and not serving.tested("vllm", "0.34.0")
    assert serving.tested("sglang", "0.5.23") and serving.tested("sglang", "0.5.23.post1")
    assert not serving.tested("sglang", "0.5.22") and not serving.tested("sglang", "0.5.24")
    assert geforce_p2p.serving is serving
