"""Registers and local memory (spills) per thread of the line-exchange kernels, as the driver's
JIT compiles each given PTX file for this GPU: whether a change of launch bounds made the
compiler spill.

    python3 benches/probes/exchange_registers.py [kernels/reduce.ptx ...]"""

import sys

import cupy as cp

NAMES = ["gp2p_exchange_%s_%s" % (op, t) for op in ("sum", "max", "avg") for t in ("f32", "bf16", "f64", "u8")]


def main():
    for path in sys.argv[1:] or ["kernels/reduce.ptx"]:
        module = cp.RawModule(path=path)
        rows = []
        for name in NAMES:
            f = module.get_function(name)
            rows.append("%s regs %d local %d maxthr %d" % (name.replace("gp2p_exchange_", ""), f.num_regs,
                                                           f.local_size_bytes, f.max_threads_per_block))
        print("%s | %s" % (path, "; ".join(rows)))


if __name__ == "__main__":
    main()
