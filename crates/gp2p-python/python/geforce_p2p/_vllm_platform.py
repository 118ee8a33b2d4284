"""The platform vLLM resolves through :func:`geforce_p2p.serving.vllm_platform`: vLLM's CUDA
platform with :class:`geforce_p2p._vllm.GeForceP2PCudaCommunicator` as its device
communicator. Imported by vLLM only, on a machine where its CUDA platform is active."""

from vllm.platforms.cuda import CudaPlatform

#: What :meth:`GeForceP2PCudaPlatform.get_device_communicator_cls` names.
COMMUNICATOR = "geforce_p2p._vllm.GeForceP2PCudaCommunicator"


class GeForceP2PCudaPlatform(CudaPlatform):
    """vLLM's CUDA platform in every way but its device communicator."""

    @classmethod
    def get_device_communicator_cls(cls) -> str:
        return COMMUNICATOR
