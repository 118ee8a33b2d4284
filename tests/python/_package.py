"""Which copy of the package the Python tests run against: the pip-installed
``geforce_p2p``, or (``GP2P_TEST_VIA_KERNELS=<org>/geforce-p2p``, with ``LOCAL_KERNELS``
pointing that id at a ``cargo xtask hub`` repository) the copy Hugging Face ``kernels``
loads, which is then also what ``import geforce_p2p`` gives in this process (its modules
are aliased), so every test runs against it unchanged."""

import os
import sys


def load():
    """The package under test (aliased as ``geforce_p2p`` when it is the ``kernels`` copy)."""
    repo_id = os.environ.get("GP2P_TEST_VIA_KERNELS")
    if not repo_id:
        import geforce_p2p

        return geforce_p2p
    if sys.modules.get("geforce_p2p") is not None and sys.modules["geforce_p2p"].__name__ != "geforce_p2p":
        return sys.modules["geforce_p2p"]
    import importlib

    import torch  # noqa: F401  (kernels resolves the variant from torch's versions)
    from kernels import get_kernel

    gp = get_kernel(repo_id, version=1, trust_remote_code=True)
    assert gp.__name__ != "geforce_p2p" and gp._native.package_name() == gp.__name__
    for sub in ("_api", "_compile", "_errors", "_native", "_probe", "_tensors", "ops", "distributed",
                "_hosts", "_two_level", "_torch_backend"):
        importlib.import_module("%s.%s" % (gp.__name__, sub))
    for name in [m for m in list(sys.modules) if m == gp.__name__ or m.startswith(gp.__name__ + ".")]:
        sys.modules["geforce_p2p" + name[len(gp.__name__):]] = sys.modules[name]
    return gp
