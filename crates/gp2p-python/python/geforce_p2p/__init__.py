"""geforce_p2p: fast copies and collectives between NVIDIA GPUs whose driver refuses P2P.

Works on torch tensors (torch is never imported by this package; it is used when the
tensors are torch's) and on any object with ``__cuda_array_interface__`` or DLPack. Every op
is ordered on the current torch stream of each tensor's device, without synchronisation.

    import torch, geforce_p2p as gp
    print(gp.probe())                         # devices, pairs, verdicts
    print(gp.probe(measure=True).links)       # and the measured link rates
    b = gp.copy(a, device="cuda:1")           # P2P where on, else staged through pinned memory
    gp.all_reduce([g0, g1], op="avg")         # in place, one tensor per device

Loaded through Hugging Face ``kernels`` it is the same package under the build's unique
module name: ``gp = get_kernel("<org>/geforce-p2p", version=1, trust_remote_code=True)``.
Every function is a torch custom op under ``torch.compile`` (``torch.ops.<package>``), so
compiled graphs keep one piece through them.

Errors of the library are ``geforce_p2p.Error`` subclasses (``UnavailableError`` without a
driver or device); bad arguments raise ``TypeError`` or ``ValueError`` naming the argument.
"""

import sys as _sys

from . import _compile, _errors, ops
from ._api import (all_gather, all_reduce, broadcast, cached_host_bytes, copy, copy_, device_count, reduce_scatter,
                   release_cached_host_memory)
from ._errors import CudaError, Error, InvalidArgumentError, NotPinnedError, UnavailableError, UnsupportedDeviceError
from ._native import __version__
from ._probe import ProbeReport, probe
from ._tensors import supported_torch_dtypes

__all__ = [
    "probe",
    "ProbeReport",
    "copy",
    "copy_",
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "device_count",
    "cached_host_bytes",
    "release_cached_host_memory",
    "ops",
    "supported_torch_dtypes",
    # The exceptions, named once (in _errors, where the native module looks them up).
    *_errors.__all__,
    "__version__",
    "distributed",
]

def _load_torch_ops():
    """The torch custom ops' module, imported (and so registered) at the first need."""
    from . import _torch_ops

    return _torch_ops


_compile.load_ops = _load_torch_ops

if "torch" in _sys.modules:
    # torch came first (as it does under ``kernels``): the custom ops exist from the start.
    _compile.register()


def __getattr__(name: str):
    # ``gp.distributed`` without an import of its own, which a ``kernels`` copy, registered
    # under its unique id, could not spell as ``import geforce_p2p.distributed``.
    if name == "distributed":
        import importlib

        return importlib.import_module(".distributed", __name__)
    raise AttributeError("module %r has no attribute %r" % (__name__, name))
