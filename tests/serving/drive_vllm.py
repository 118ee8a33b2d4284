"""vLLM's own plugin and distributed code with this package installed, on a machine without a
GPU (run by tests/serving/check-servers, which builds the environment): vLLM finds the entry
point, calls it (the package stays off: no CUDA here, and says so), resolves its own platform,
resolves this package's communicator as a subclass of its ``CudaCommunicator``, and two CPU
processes over gloo build their tensor-parallel group coordinator and all-reduce through it.
Exits non-zero on the first check that fails."""

import importlib
import logging
import os
import sys

import torch
import torch.multiprocessing as mp


def checks():
    logging.basicConfig(level=logging.INFO)
    from vllm.plugins import load_plugins_by_group

    plugins = load_plugins_by_group("vllm.platform_plugins")
    assert "geforce_p2p" in plugins, "vLLM did not find the entry point: %s" % sorted(plugins)
    assert plugins["geforce_p2p"]() is None, "no CUDA here: the plugin must leave vLLM's choice alone"
    from vllm.platforms import resolve_current_platform_cls_qualname

    chosen = resolve_current_platform_cls_qualname()
    assert "geforce_p2p" not in chosen, chosen
    print("vLLM %s resolved its own platform %s with the plugin in place" % (version("vllm"), chosen))
    from vllm.distributed.device_communicators.cuda_communicator import CudaCommunicator


    module, name = "geforce_p2p._vllm", "GeForceP2PCudaCommunicator"
    cls = getattr(importlib.import_module(module), name)
    assert issubclass(cls, CudaCommunicator), "graph capture asserts CudaCommunicator"
    print("resolved %s.%s, a subclass of vLLM's CudaCommunicator" % (module, name))


def version(dist):
    from importlib.metadata import version as v

    return v(dist)


def rank(r, port):
    from vllm.distributed import (get_tp_group, init_distributed_environment,
                                  initialize_model_parallel, tensor_model_parallel_all_reduce)

    from vllm.config import VllmConfig, set_current_vllm_config

    with set_current_vllm_config(VllmConfig()):
        init_distributed_environment(world_size=2, rank=r, distributed_init_method="tcp://127.0.0.1:%d" % port,
                                     local_rank=r, backend="gloo")
        initialize_model_parallel(tensor_model_parallel_size=2)
        t = torch.full((1000,), float(r + 1))
        out = tensor_model_parallel_all_reduce(t)
    assert torch.equal(out, torch.full((1000,), 3.0)), out[:4]
    print("rank %d: tp group %s, device communicator %s: all_reduce right" % (
        r, get_tp_group().unique_name, type(get_tp_group().device_communicator).__name__))


if __name__ == "__main__":
    try:
        checks()
    except ImportError as e:
        sys.exit("an import vLLM needs is missing: %s" % e)
    # The ranks on vLLM's CPU platform (what it runs on a machine without a GPU).
    os.environ["VLLM_TARGET_DEVICE"] = "cpu"
    mp.spawn(rank, args=(29517,), nprocs=2, join=True)
    print("vLLM checks passed")
