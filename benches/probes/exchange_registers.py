"""Registers and local memory (spills) per thread of the line-exchange kernels, as the driver's
JIT compiles each given PTX file for this GPU: whether a change of launch bounds made the
compiler spill.

    python3 benches/probes/exchange_registers.py [kernels/reduce.ptx ...]"""

import sys

import cupy as cp

# Every op and dtype the kernels are built for (GP2P_FOR_EACH_OP, GP2P_FOR_EACH_DTYPE).
OPS = ("sum", "avg", "min", "max", "prod")
DTYPES = ("f32", "f64", "f16", "bf16", "i8", "u8", "i32", "u32", "i64", "u64")
NAMES = ["gp2p_exchange_%s_%s" % (op, t) for op in OPS for t in DTYPES]


def main():
    for path in sys.argv[1:] or ["kernels/reduce.ptx"]:
        module = cp.RawModule(path=path)
        rows = []
        for name in NAMES:
            f = module.get_function(name)
            rows.append((name.replace("gp2p_exchange_", ""), f.num_regs, f.local_size_bytes, f.max_threads_per_block))
        print("%s | %s" % (path, "; ".join("%s regs %d local %d maxthr %d" % r for r in rows)))
        regs = [r[1] for r in rows]
        spilled = [r[0] for r in rows if r[2]]
        print("%s: %d kernels, registers %d-%d, spilled: %s" % (path, len(rows), min(regs), max(regs),
                                                              ", ".join(spilled) or "none"))


if __name__ == "__main__":
    main()
