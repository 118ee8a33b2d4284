"""Runs the Python tests against the copy of the package ``_package.load`` names (the
pip-installed one unless ``GP2P_TEST_VIA_KERNELS`` is set)."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

if os.environ.get("GP2P_TEST_VIA_KERNELS"):
    import _package

    _package.load()
