"""Registers and local memory (spills) per thread of the line-exchange kernels, as the driver's
JIT compiles each given PTX file for this GPU: whether a change of launch bounds made the
compiler spill.

    python3 benches/probes/exchange_registers.py [kernels/exchange.ptx kernels/exchange_many.ptx ...]

A file named exchange_many*.ptx holds the many-rank kernels (gp2p_exchange_many_*), any other
the two-rank ones (gp2p_exchange_*)."""

import os
import sys

import cupy as cp

# Every op and dtype the kernels are built for (GP2P_FOR_EACH_OP, GP2P_FOR_EACH_DTYPE).
OPS = ("sum", "avg", "min", "max", "prod")
DTYPES = ("f32", "f64", "f16", "bf16", "i8", "u8", "i32", "u32", "i64", "u64")
SUFFIXES = ["%s_%s" % (op, t) for op in OPS for t in DTYPES]


def main():
    for path in sys.argv[1:] or ["kernels/exchange.ptx", "kernels/exchange_many.ptx"]:
        module = cp.RawModule(path=path)
        prefix = "gp2p_exchange_many_" if os.path.basename(path).startswith("exchange_many") else "gp2p_exchange_"
        rows = []
        for suffix in SUFFIXES:
            f = module.get_function(prefix + suffix)
            rows.append((suffix, f.num_regs, f.local_size_bytes, f.max_threads_per_block))
        print("%s | %s" % (path, "; ".join("%s regs %d local %d maxthr %d" % r for r in rows)))
        regs = [r[1] for r in rows]
        spilled = [r[0] for r in rows if r[2]]
        print("%s: %d kernels, registers %d-%d, spilled: %s" % (path, len(rows), min(regs), max(regs),
                                                              ", ".join(spilled) or "none"))


if __name__ == "__main__":
    main()
