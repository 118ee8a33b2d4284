"""sglang's own plugin code with this package installed (run by tests/serving/check-servers):
its loader finds the ``sglang.srt.plugins`` entry point, runs it, and its hook registry
applies the AROUND hook to ``dispatch_custom_allreduce``, which then wraps sglang's own
function. (Calling the dispatcher needs CUDA or ROCm: not here.) Exits non-zero on the first
check that fails."""

import logging
from importlib.metadata import version

logging.basicConfig(level=logging.INFO)

from sglang.srt.plugins import load_plugins  # noqa: E402

load_plugins()

import sglang.srt.distributed.device_communicators.custom_all_reduce as module  # noqa: E402
from sglang.srt.plugins.hook_registry import HookRegistry, HookType  # noqa: E402

from geforce_p2p import serving  # noqa: E402

target = serving.SGLANG_TARGET
assert target in HookRegistry._patched, "sglang patched no %s" % target
wrapped = getattr(module.dispatch_custom_allreduce, "__wrapped__", None)
assert wrapped is not None and wrapped.__module__ == module.__name__, "the dispatcher is not wrapped"
print("sglang %s: plugin loaded, AROUND hook (%s) applied to %s" % (version("sglang"), HookType.AROUND.value, target))
print("sglang checks passed")
