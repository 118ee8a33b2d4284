"""``python -m geforce_p2p probe|devices|bench ...``: the ``gp2p`` command line, the same code
as the binary (``gp2p_cli::run_cli``); ``python -m geforce_p2p nccl ...`` is the NCCL door's
launcher (``geforce_p2p.nccl``), which knows where this installation keeps the door."""

from __future__ import annotations

import sys
from typing import Optional, Sequence

from . import _native


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["nccl"]:
        from . import nccl

        return nccl.main(args[1:])
    # The native side writes to the process's stdout and stderr directly.
    sys.stdout.flush()
    sys.stderr.flush()
    return _native.run_cli(["gp2p", *args])


if __name__ == "__main__":
    sys.exit(main())
