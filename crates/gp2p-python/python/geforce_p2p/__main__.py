"""``python -m geforce_p2p probe|devices|bench ...``: the ``gp2p`` command line, the same code
as the binary (``gp2p_cli::run_cli``)."""

from __future__ import annotations

import sys
from typing import Optional, Sequence

from . import _native


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    # The native side writes to the process's stdout and stderr directly.
    sys.stdout.flush()
    sys.stderr.flush()
    return _native.run_cli(["gp2p", *args])


if __name__ == "__main__":
    sys.exit(main())
