"""The NCCL door from Python: where its shared object is, the environment that loads it in the
real NCCL's place, and a launcher that runs a command in that environment.

Programs that call NCCL (torch's ``"nccl"`` backend, vLLM's and sglang's own NCCL wrappers,
nccl-tests) then run on geforce-p2p where their ranks have no usable P2P, and on the real NCCL,
untouched, everywhere else (``GP2P_NCCL=auto``, the default; ``force`` serves even where P2P
works, for measuring; ``off`` hands everything over). docs/nccl-door.md has the details.

    python -m geforce_p2p.nccl -- torchrun --nproc-per-node 2 train.py
    eval "$(python -m geforce_p2p.nccl env)"      # the same, for a shell

torch's ``libtorch_cuda.so`` finds its NCCL through an RPATH, which ``LD_LIBRARY_PATH`` does
not override: the door comes in through ``LD_PRELOAD``. vLLM and sglang load NCCL themselves
by name or by ``VLLM_NCCL_SO_PATH`` / ``SGLANG_NCCL_SO_PATH``, which the environment sets too.
The real NCCL is the one beside torch (``nvidia/nccl/lib`` of the same site-packages), named in
``GP2P_NCCL_REAL``.
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
from typing import Dict, List, Mapping, Optional, Sequence

#: The door's file name: the real library's, so it stands in for it wherever it is looked up.
LIBRARY_NAME = "libnccl.so.2"

#: What the environment sets, and why each.
VARIABLES = {
    "LD_PRELOAD": "loads the door before anything that links NCCL (torch, cupy, nccl-tests)",
    "VLLM_NCCL_SO_PATH": "vLLM's pynccl loads this file",
    "SGLANG_NCCL_SO_PATH": "sglang's pynccl loads this file",
    "GP2P_NCCL_REAL": "the real NCCL, for the communicators the door hands over: where unset, one "
    "VLLM_NCCL_SO_PATH or SGLANG_NCCL_SO_PATH named, else torch's",
    "CUDA_DEVICE_MAX_CONNECTIONS": "where unset and no MPS daemon serves the command, 32 hardware queues: "
    "ranks that are threads of one process on one device (nccl-tests -t N) need one for each of their streams",
}

#: Where an MPS control daemon listens when ``CUDA_MPS_PIPE_DIRECTORY`` names no folder.
MPS_DEFAULT_PIPE = "/tmp/nvidia-mps"

#: The hardware queues the launcher asks CUDA for where the environment names none (CUDA's most).
HARDWARE_QUEUES = "32"


def library() -> str:
    """The door's shared object in this installation.

    Raises ``FileNotFoundError`` naming the path where a build of the package lacks it."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_nccl", LIBRARY_NAME)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            "%s: this build of geforce_p2p has no NCCL door; install a wheel built with it "
            "(pip install geforce-p2p) or build one (tests/python/run-cpu-tests)" % path
        )
    return path


def real_nccl(search: Optional[Sequence[str]] = None) -> Optional[str]:
    """The real NCCL torch uses: ``nvidia/nccl/lib/libnccl.so.2`` in the first folder of
    ``search`` (default ``sys.path``) that has one, without importing torch; ``None`` if none
    does."""
    for folder in sys.path if search is None else search:
        path = os.path.join(folder or ".", "nvidia", "nccl", "lib", LIBRARY_NAME)
        if os.path.isfile(path):
            return os.path.abspath(path)
    return None


def mps_serves(env: Mapping[str, str]) -> bool:
    """Whether an MPS control daemon serves processes started with ``env``: its pipe folder
    (``CUDA_MPS_PIPE_DIRECTORY``, else :data:`MPS_DEFAULT_PIPE`) holds its ``control`` pipe."""
    pipe = env.get("CUDA_MPS_PIPE_DIRECTORY") or MPS_DEFAULT_PIPE
    return os.path.exists(os.path.join(pipe, "control"))


def check_preloadable(door: str) -> str:
    """``door`` where ``LD_PRELOAD`` can carry it; ``ValueError`` where it holds a space or a
    colon, where the dynamic linker would split it (and torch would quietly run on the real
    NCCL)."""
    if " " in door or ":" in door:
        raise ValueError(
            "the door's path %r holds a space or a colon, where LD_PRELOAD splits it, so torch would "
            "not load it: install geforce-p2p where its path has neither (a virtual environment "
            "elsewhere), or copy %s to such a folder and preload it yourself" % (door, LIBRARY_NAME)
        )
    return door


def environment(base: Optional[Mapping[str, str]] = None, door: Optional[str] = None,
                mps: Optional[bool] = None) -> Dict[str, str]:
    """``base`` (default ``os.environ``) with the door in NCCL's place: ``LD_PRELOAD`` gets the
    door first (once), vLLM's and sglang's library variables name it, and ``GP2P_NCCL_REAL``
    names torch's NCCL unless it is set already, and ``CUDA_DEVICE_MAX_CONNECTIONS`` is
    :data:`HARDWARE_QUEUES` unless set or an MPS daemon serves the command (``mps``; default
    :func:`mps_serves`): the processes an MPS server runs likely draw their queues from one
    device's channels: on one H100 torchrun's four processes of 32 queues each failed at a rank's
    first CUDA call with "out of memory", where CUDA's own 8 ran. A real NCCL the user named
    in ``VLLM_NCCL_SO_PATH`` or ``SGLANG_NCCL_SO_PATH`` becomes ``GP2P_NCCL_REAL`` (where that is
    unset), so what the door hands over runs where the user said. ``ValueError`` where the
    door's path cannot be preloaded (:func:`check_preloadable`)."""
    env = dict(os.environ if base is None else base)
    door = check_preloadable(library() if door is None else door)
    named = [env.get(v, "") for v in ("VLLM_NCCL_SO_PATH", "SGLANG_NCCL_SO_PATH")]
    if not env.get("GP2P_NCCL_REAL"):
        mine = next((p for p in named if p and not _is_a_door(p, door)), None)
        real = mine if mine is not None else real_nccl()
        if real is not None:
            env["GP2P_NCCL_REAL"] = real
    preload = [p for p in env.get("LD_PRELOAD", "").replace(" ", ":").split(":") if p and p != door]
    env["LD_PRELOAD"] = ":".join([door, *preload])
    env["VLLM_NCCL_SO_PATH"] = door
    env["SGLANG_NCCL_SO_PATH"] = door
    if not (mps_serves(env) if mps is None else mps):
        env.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", HARDWARE_QUEUES)
    return env


def _is_a_door(path: str, door: str) -> bool:
    """Whether ``path`` is ``door``, or another installation's door (a wheel keeps it in
    ``geforce_p2p/_nccl``, a cargo build names it ``libgp2p_nccl.so``): never the real NCCL."""
    full = os.path.abspath(path)
    if os.path.basename(os.path.dirname(full)) == "_nccl" or os.path.basename(full) == "libgp2p_nccl.so":
        return True
    try:
        return os.path.samefile(path, door)
    except OSError:
        return os.path.abspath(path) == os.path.abspath(door)


def exports(env: Mapping[str, str]) -> List[str]:
    """Shell lines that set the door's variables as ``env`` has them."""
    return ["export %s=%s" % (name, shlex.quote(env[name])) for name in VARIABLES if name in env]


USAGE = """usage: python -m geforce_p2p.nccl -- COMMAND [ARGS...]   run COMMAND with the door in NCCL's place
       python -m geforce_p2p.nccl env                      print the variables, for eval in a shell
       python -m geforce_p2p.nccl path                     print the door's file

Variables set:
""" + "".join("  %-28s %s\n" % item for item in VARIABLES.items())


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The launcher. Exit codes: 0 done, 1 the door is missing, 2 a usage error."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        sys.stderr.write(USAGE)
        return 2
    if args[0] in ("-h", "--help"):
        sys.stdout.write(USAGE)
        return 0
    try:
        if args[0] == "path":
            print(library())
            return 0
        if args[0] == "env":
            print("\n".join(exports(environment())))
            return 0
        if args[0] == "--":
            command = args[1:]
            if not command or not command[0]:
                sys.stderr.write("no command after --\n" + USAGE)
                return 2
            env = environment()
            sys.stdout.flush()
            sys.stderr.flush()
            # Python ignores these two; the command gets them as a shell would start it.
            for name in ("SIGPIPE", "SIGXFSZ"):
                if hasattr(signal, name):
                    signal.signal(getattr(signal, name), signal.SIG_DFL)
            try:
                os.execvpe(command[0], command, env)
            except OSError as e:
                sys.stderr.write("cannot run %s: %s\n" % (command[0], e.strerror or e))
                # As a shell says it: found but not runnable, or not found.
                return 126 if isinstance(e, PermissionError) else 127
    except (FileNotFoundError, ValueError) as e:
        sys.stderr.write("geforce-p2p NCCL door: %s\n" % e)
        return 1
    sys.stderr.write("unknown argument %r\n%s" % (args[0], USAGE))
    return 2


if __name__ == "__main__":
    sys.exit(main())
