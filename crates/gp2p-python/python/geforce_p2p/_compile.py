"""``torch.compile`` support: whether dynamo is tracing, and the torch custom ops it must
see in place of the native calls it cannot trace.

The public functions start with ``if _compile.tracing(): return <the custom op>``. Eager
calls then pay one cheap check and keep their native fast paths; under ``torch.compile``
dynamo folds the check to True and records the custom op, which runs the same eager
function when the compiled graph runs. The ops live in ``torch.ops.<package>``, the
package being ``geforce_p2p`` when pip-installed and the build's unique id when loaded
through Hugging Face ``kernels``, so two copies in one process never collide
(``_torch_ops.py`` registers them).

torch is never imported here: the ops are registered when this package is imported after
torch, or at the first call that finds torch imported. Nor is ``_torch_ops``, which imports the
modules that import this one: the package root hands :data:`load_ops` its loader, so the
imports run one way (``_api``, ``ops``, ``distributed`` → here; the root → ``_torch_ops`` →
``_api``, ``ops``, here).
"""

from __future__ import annotations

import sys
import threading
import warnings
import weakref
from typing import Any, Callable, Optional

#: The module of registered custom ops (``_torch_ops``), once registered.
ops: Any = None

#: Imports ``_torch_ops`` (which registers the ops) and returns it; set by the package root.
load_ops: Optional[Callable[[], Any]] = None

_lock = threading.Lock()
#: The torch module last judged by :func:`register` (a stand-in torch, as tests use, or one
#: too old for custom ops, is judged once and left alone; another torch is judged afresh).
_judged: Any = None


def _not_registered() -> bool:
    """The check before registration: register once torch is imported (nothing can be
    compiling before that)."""
    if "torch" in sys.modules and register():
        return _is_compiling()
    return False


#: ``torch.compiler.is_compiling`` once the ops are registered.
_is_compiling: Callable[[], bool] = _not_registered


def tracing() -> bool:
    """Whether ``torch.compile`` is tracing the caller (the public functions then return
    the custom op's result instead of running natively)."""
    return _is_compiling()


def register() -> bool:
    """Register the custom ops with the torch in ``sys.modules``, once. Returns whether
    they are registered."""
    global _is_compiling, ops, _judged
    torch = sys.modules.get("torch")
    if ops is not None or torch is None or torch is _judged:
        return ops is not None
    with _lock:
        if ops is None and torch is not _judged:
            _judged = torch
            library = getattr(torch, "library", None)
            if (load_ops is not None and library is not None and hasattr(library, "custom_op")
                    and hasattr(torch, "compiler")):
                try:
                    loaded = load_ops()
                except Exception as e:  # noqa: BLE001  (eager calls must go on working)
                    warnings.warn("geforce_p2p: torch custom ops not registered, torch.compile will break its "
                                  "graph at this package's calls: %s" % e, RuntimeWarning, stacklevel=2)
                else:
                    ops = loaded
                    _is_compiling = torch.compiler.is_compiling
    return ops is not None


_communicators: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()
_next_handle = 0


def remember_communicator(comm: Any) -> int:
    """A number standing for ``comm`` in the custom op's arguments (a graph holds plain
    values, not Python objects); the communicator is not kept alive by it."""
    global _next_handle
    with _lock:
        _next_handle += 1
        _communicators[_next_handle] = comm
        return _next_handle


def communicator(handle: int) -> Optional[Any]:
    """The communicator ``handle`` stands for, or None once it is gone."""
    return _communicators.get(handle)
