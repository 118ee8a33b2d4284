#!/usr/bin/env python3
"""Lay out a Hugging Face ``kernels`` repository from a built ``geforce_p2p`` wheel.

    python3 crates/gp2p-python/hub/make_repo.py --wheel WHEEL --out DIR

``cargo xtask hub DIR`` builds the wheel and runs this. DIR then holds what ``kernels``
(0.17.2) loads and nothing else: ``README.md`` (the model card) and, per variant,
``build/<variant>/`` with ``metadata.json`` and the package's files directly beside it.

Variants: the extension links no torch symbol (it talks to torch through Python and DLPack
only), so one build serves every torch; it is compiled for x86-64 Linux, which a noarch
variant (``torch-cuda``, meant for code that is not compiled) would not say. So it goes in
the stable-ABI arch variants, which the loader accepts for any torch at or above their
version: ``torch-stable-abi29-cu126-x86_64-linux`` for torch built with CUDA 12.6 or newer
12.x, and a ``cu130`` twin for CUDA 13. The loader registers the package under
``metadata.json``'s ``id``, unique per build (the commit and a digest of the files), so two
builds, or a build beside a pip-installed copy, never share a module.

Only the standard library is used: this runs on CI without torch or ``kernels``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Dict, List, Optional

NAME = "geforce-p2p"
PACKAGE = "geforce_p2p"
#: ``kernels``' version number for ``get_kernel(..., version=1)`` (the Hub branch ``v1``).
VERSION = 1
LICENSE = "Apache-2.0"
#: The variants the loader picks on x86-64 Linux with a CUDA torch (see the module docs).
VARIANTS = ("torch-stable-abi29-cu126-x86_64-linux", "torch-stable-abi29-cu130-x86_64-linux")
#: The compute capabilities the committed PTX serves: compute_75 and compute_80, which the
#: driver compiles for any newer card.
ARCHS = ["7.5+PTX", "8.0+PTX"]
#: What ``kernels`` requires of ``metadata.json``'s ``name``.
NAME_PATTERN = re.compile(r"^[a-z][-a-z0-9]*[a-z0-9]$")
CARD = Path(__file__).with_name("model_card.md")


def package_files(wheel: Path) -> Dict[str, bytes]:
    """The package's files in ``wheel``, by path inside the package (no dist-info)."""
    files = {}
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            if info.is_dir() or not info.filename.startswith(PACKAGE + "/"):
                continue
            inner = info.filename[len(PACKAGE) + 1:]
            if "__pycache__" in inner.split("/"):
                continue
            files[inner] = zf.read(info)
    if "__init__.py" not in files or not any(p.startswith("_native") for p in files):
        raise SystemExit("make_repo: %s holds no %s package with its _native extension" % (wheel, PACKAGE))
    return files


def digest(files: Dict[str, bytes]) -> str:
    """A digest of the package's paths and contents: builds that differ get different ids."""
    h = hashlib.sha256()
    for path in sorted(files):
        h.update(path.encode() + b"\0" + hashlib.sha256(files[path]).digest())
    return h.hexdigest()


def git_commit(repo: Path) -> Optional[str]:
    """The checkout's commit, or None outside git."""
    try:
        out = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                             check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip() or None


def metadata(build_id: str) -> dict:
    """``metadata.json``: the fields ``kernels`` 0.17.2 requires, and the archs it checks."""
    return {
        "id": build_id,
        "name": NAME,
        "version": VERSION,
        "license": LICENSE,
        # torch is deliberately absent: kernels refuses it here, and the package never
        # imports it (it uses the torch the caller has).
        "python-depends": [],
        "backend": {"type": "cuda", "archs": ARCHS},
    }


def build_id(commit: Optional[str], files: Dict[str, bytes]) -> str:
    """The module name the loader gives the package: as kernel-builder's
    ``_<python_name>_<backend>_<sha7>``, with a digest of the files after it so that two
    builds of one commit (a dirty tree, another compiler) differ too."""
    sha = commit[:7] if commit else "nogit"
    return "_%s_cuda_%s_%s" % (PACKAGE, sha, digest(files)[:8])


def make_repo(wheel: Path, out: Path, commit: Optional[str]) -> str:
    """Write the repository into ``out`` (replacing what is there); returns the build id."""
    files = package_files(wheel)
    bid = build_id(commit, files)
    if out.exists():
        shutil.rmtree(out)
    for variant in VARIANTS:
        root = out / "build" / variant
        for inner, data in files.items():
            path = root / inner
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            if inner.endswith(".so"):
                path.chmod(0o755)
        (root / "metadata.json").write_text(json.dumps(metadata(bid), indent=2) + "\n")
    card = CARD.read_text().replace("{build_id}", bid).replace("{commit}", commit or "not a git checkout")
    card = card.replace("{variants}", "\n".join("- `build/%s`" % v for v in VARIANTS))
    (out / "README.md").write_text(card)
    return bid


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheel", type=Path, required=True, help="a geforce_p2p wheel (maturin build)")
    parser.add_argument("--out", type=Path, required=True, help="the repository directory to write")
    parser.add_argument("--commit", help="the source commit (default: git rev-parse HEAD here)")
    args = parser.parse_args(argv)
    if not args.wheel.is_file():
        parser.error("--wheel: %s is not a file" % args.wheel)
    commit = args.commit or git_commit(Path(__file__).resolve().parent)
    bid = make_repo(args.wheel, args.out, commit)
    print("make_repo: wrote %s (id %s, variants %s)" % (args.out, bid, ", ".join(VARIANTS)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
