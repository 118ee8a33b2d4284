"""The classes vLLM resolves through :func:`geforce_p2p.serving.vllm_platform` (imported by vLLM
only, after vLLM itself): its CUDA platform with another device communicator, and that
communicator, vLLM's own plus one check (see :mod:`geforce_p2p.serving`)."""

from typing import Any

from vllm.distributed.device_communicators.cuda_communicator import CudaCommunicator
from vllm.platforms.cuda import CudaPlatform

from . import serving


class GeForceP2PCudaCommunicator(CudaCommunicator):
    """vLLM's ``CudaCommunicator`` (graph capture asserts the type), whose custom all-reduce is
    this package's where vLLM's own is off in a tensor-parallel group."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        if getattr(self, "use_custom_allreduce", False) and self.world_size > 1:
            self.ca_comm = serving.take_over(self.ca_comm, group=self.cpu_group, device=self.device, server="vllm")


class GeForceP2PCudaPlatform(CudaPlatform):
    """vLLM's CUDA platform with :class:`GeForceP2PCudaCommunicator` as its device communicator."""

    @classmethod
    def get_device_communicator_cls(cls) -> str:
        return "geforce_p2p._vllm.GeForceP2PCudaCommunicator"
