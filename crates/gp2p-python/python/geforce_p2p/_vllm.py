"""The device communicator vLLM resolves through this package's platform
(:mod:`geforce_p2p._vllm_platform`, named by :func:`geforce_p2p.serving.vllm_platform`):
vLLM's own ``CudaCommunicator`` plus one check (see :mod:`geforce_p2p.serving`). Imported by
vLLM only, after vLLM itself; apart from the platform, whose base needs CUDA to import."""

from typing import Any

from vllm.distributed.device_communicators.cuda_communicator import CudaCommunicator

from . import serving


class GeForceP2PCudaCommunicator(CudaCommunicator):
    """vLLM's ``CudaCommunicator`` (graph capture asserts the type), whose custom all-reduce is
    this package's where vLLM's own is off in a tensor-parallel group."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        if getattr(self, "use_custom_allreduce", False) and self.world_size > 1:
            self.ca_comm = serving.take_over(self.ca_comm, group=self.cpu_group, device=self.device, server="vllm")
