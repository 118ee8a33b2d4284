"""The exceptions geforce-p2p raises from the library (the native code raises these by name).

Argument checks done in Python raise the built-in ``TypeError`` or ``ValueError``; a bad
argument that only the library can see (unpinned host memory from a non-torch object,
say) raises ``InvalidArgumentError``, which is a ``ValueError`` too.
"""

__all__ = [
    "Error",
    "UnavailableError",
    "UnsupportedDeviceError",
    "InvalidArgumentError",
    "NotPinnedError",
    "CudaError",
]


class Error(Exception):
    """Every error of the geforce-p2p library; the message is the library's own."""


class UnavailableError(Error):
    """No NVIDIA driver on this machine, or no such CUDA device."""


class UnsupportedDeviceError(Error):
    """A device geforce-p2p cannot use (compute capability below 7.5, no host mapping)."""


class InvalidArgumentError(Error, ValueError):
    """Bad input refused by the library before any GPU work (nothing was written)."""


class NotPinnedError(InvalidArgumentError):
    """Host memory that is not page-locked: pin it (``tensor.pin_memory()``)."""


class CudaError(Error):
    """A CUDA driver call failed."""


# Shown as geforce_p2p.Error (and so on) in tracebacks: that is where users import them (the
# build's unique id for a copy loaded through Hugging Face `kernels`).
for _class in (Error, UnavailableError, UnsupportedDeviceError, InvalidArgumentError, NotPinnedError, CudaError):
    _class.__module__ = __name__.rpartition(".")[0] or "geforce_p2p"
del _class
