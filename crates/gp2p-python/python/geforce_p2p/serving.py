"""vLLM and sglang find this package by themselves: ``pip install geforce-p2p``, nothing else.

The wheel declares two entry points, which the servers load in every worker through their own
plugin mechanisms:

- ``vllm.platform_plugins``: :func:`vllm_platform` names a platform that is vLLM's CUDA
  platform in every way but one: its device communicator, a subclass of vLLM's
  ``CudaCommunicator``, checks after vLLM has set up its own custom all-reduce whether that
  one runs. Where it does (P2P works), it stays. Where vLLM turned it off (no P2P between the
  group's GPUs), this package's :class:`~geforce_p2p.distributed.CustomAllreduce` takes its
  place for the sizes it serves; every other size goes vLLM's usual way (PyNccl).
- ``sglang.srt.plugins``: :func:`sglang_plugin` wraps sglang's
  ``dispatch_custom_allreduce`` (a hook of its ``HookRegistry``) so that the class it returns
  builds sglang's own custom all-reduce first and this package's only where sglang's fails or
  is disabled.

Each worker logs one line at start-up (logger ``geforce_p2p.serving``) saying whether it is
on, for which ranks and sizes, or why not. ``GP2P_SERVING=0`` turns it off (the servers then
run exactly as without this package). A server version outside the tested range logs a
warning and stays off rather than risk the server.
"""

import logging
import os
from typing import Any, Callable, Optional

#: The environment variable that turns the server plugins off ("0", "off", "false", "no").
ENV = "GP2P_SERVING"

#: The server versions the plugins were written and tested against: (first, past last).
TESTED = {"vllm": ((0, 33), (0, 34)), "sglang": ((0, 5, 23), (0, 5, 24))}

#: What vLLM's platform plugin names (see :func:`vllm_platform`).
VLLM_PLATFORM = "geforce_p2p._vllm_platform.GeForceP2PCudaPlatform"

#: The sglang function the plugin wraps.
SGLANG_TARGET = "sglang.srt.distributed.device_communicators.custom_all_reduce.dispatch_custom_allreduce"

log = logging.getLogger("geforce_p2p.serving")


def _say(level: int, message: str, *args: Any) -> None:
    """Log the start-up line where a server's logging shows it: its handlers, or stderr."""
    if not log.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s geforce-p2p: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False
    log.log(level, message, *args)


def enabled() -> bool:
    """Whether ``GP2P_SERVING`` leaves the plugins on (unset: on)."""
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "off", "false", "no")


def _version(text: str) -> tuple:
    parts = []
    for piece in text.split("+")[0].split("."):
        digits = "".join(c for c in piece if c.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def tested(server: str, version: str) -> bool:
    """Whether ``version`` of ``server`` ("vllm" or "sglang") is in the tested range."""
    first, past = TESTED[server]
    v = _version(version)
    return first <= v[:len(first)] and v[:len(past)] < past


def _server_version(server: str) -> Optional[str]:
    try:
        from importlib.metadata import version

        return version(server)
    except Exception:  # noqa: BLE001  (not installed as a distribution: unknown)
        return None


def _allowed(server: str) -> bool:
    """The checks both plugins make before anything else, each saying why not."""
    if not enabled():
        _say(logging.INFO, "off in this %s worker: %s=%s", server, ENV, os.environ.get(ENV))
        return False
    version = _server_version(server)
    if version is None or not tested(server, version):
        first, past = (".".join(map(str, v)) for v in TESTED[server])
        _say(logging.WARNING, "off: %s %s is outside the tested range (>= %s, < %s); the server runs as without "
             "geforce-p2p", server, version or "(version unknown)", first, past)
        return False
    return True


def vllm_platform() -> Optional[str]:
    """vLLM's ``vllm.platform_plugins`` entry point: the qualified name of this package's CUDA
    platform where vLLM's own CUDA platform would be chosen (it is vLLM's, with one more check
    in its device communicator), else None (vLLM chooses as it would without this package)."""
    if not _allowed("vllm"):
        return None
    try:
        import vllm.platforms as platforms

        cuda = getattr(platforms, "cuda_platform_plugin", None)
        if cuda is None or cuda() is None:
            _say(logging.INFO, "off: vLLM's platform here is not CUDA (no NVIDIA GPU seen); vLLM runs as without "
                 "geforce-p2p")
            return None
    except Exception as e:  # noqa: BLE001  (never break the server's platform choice)
        _say(logging.WARNING, "off: vLLM's CUDA platform check failed (%s)", e)
        return None
    return VLLM_PLATFORM


def sglang_plugin() -> None:
    """sglang's ``sglang.srt.plugins`` entry point: wrap ``dispatch_custom_allreduce`` (an
    AROUND hook) so that a group whose ranks lack P2P gets this package's all-reduce."""
    if not _allowed("sglang"):
        return
    try:
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    except Exception as e:  # noqa: BLE001
        _say(logging.WARNING, "off: sglang's hook registry is not there (%s)", e)
        return
    HookRegistry.register(SGLANG_TARGET, _sglang_dispatch, HookType.AROUND)


def _sglang_dispatch(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Callable[..., Any]:
    """The AROUND hook: sglang's choice of class, built through :func:`take_over`."""
    theirs_cls = original(*args, **kwargs)

    def build(group: Any, device: Any, **more: Any) -> Any:
        try:
            theirs = theirs_cls(group=group, device=device, **more)
        except Exception as e:  # noqa: BLE001  (sglang logs and gives up here; we step in)
            theirs = None
            why = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
        else:
            why = None
        return take_over(theirs, group=group, device=device, server="sglang", why=why)

    return build


def _build_ours(group: Any, device: Any) -> Any:
    """This package's object for the group, built as the servers build theirs."""
    from .distributed import CustomAllreduce

    return CustomAllreduce(group=group, device=device)


def take_over(theirs: Any, *, group: Any, device: Any, server: str, why: Optional[str] = None) -> Any:
    """The custom all-reduce a group should use: ``theirs`` where it runs (P2P works), else this
    package's where it can serve the group, else ``theirs`` (possibly None or disabled), with
    the start-up line saying which. Every rank of the group decides alike (the server's
    object is disabled on all ranks or none), as this package's join is a collective."""
    ranks = _ranks(group)
    if theirs is not None and not getattr(theirs, "disabled", True):
        _say(logging.INFO, "off for ranks %s: %s's own custom all-reduce runs (P2P works)", ranks, server)
        return theirs
    ours = _build_ours(group, device)
    if ours is None or ours.disabled:
        _say(logging.WARNING, "off for ranks %s: this package's communicator could not join (%d ranks; 2 to 8 "
             "are served)", ranks, _size(group))
        return theirs
    reason = why or "the server's custom all-reduce is off (no P2P between the group's GPUs)"
    _say(logging.INFO, "on for ranks %s on %s: %s, so geforce-p2p all-reduces up to %s through host memory; "
         "larger ones go the server's usual way", ranks, device, reason, _size_text(ours.comm.max_bytes))
    return ours


def _ranks(group: Any) -> str:
    try:
        import torch.distributed as dist

        ranks = dist.get_process_group_ranks(group)
    except Exception:  # noqa: BLE001  (a group torch does not know: say what we can)
        return "of the group"
    if ranks == list(range(ranks[0], ranks[0] + len(ranks))) and len(ranks) > 1:
        return "%d-%d" % (ranks[0], ranks[-1])
    return ",".join(map(str, ranks))


def _size(group: Any) -> int:
    try:
        import torch.distributed as dist

        return dist.get_world_size(group=group)
    except Exception:  # noqa: BLE001
        return 0


def _size_text(n: int) -> str:
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return "%d %s" % (n >> shift, unit)
    return "%d bytes" % n
