#!/usr/bin/env bash
# Build NVIDIA's nccl-tests so that its ranks may share one GPU, to run them through the NCCL
# door on a machine of one GPU. Usage:
#   bash benches/device/nccl-tests.sh SRC [NCCL_HOME [CUDA_HOME]]
# SRC: an nccl-tests source tree (v2.19.6 was used; `fetch` NVIDIA/nccl-tests, then
# `git archive`), edited in place; NCCL_HOME: a folder with include/ (nccl.h and, from NCCL
# 2.28, nccl_device.h with its nccl_device/ folder, which the tests' alltoall includes) and
# lib/libnccl.so; "" or left out: one made in SRC/nccl-home from the NCCL wheel python3 imports
# (nvidia-nccl-cu13: its whole include folder, and a libnccl.so link to its libnccl.so.2; a home
# holding nccl.h alone fails in alltoall.cu, which then takes another nccl_device.h);
# CUDA_HOME: the toolkit (default: the one nvcc on PATH comes from). The binaries land in SRC/build; run them
# through the door with `python3 -m geforce_p2p.nccl -- SRC/build/all_reduce_perf -t 2 ...`.
# A second build, in SRC/build-mp, runs its ranks as processes (MPI=1 against minimpi,
# benches/nccl/minimpi, since the device machines have no MPI):
#   python3 -m geforce_p2p.nccl -- python3 benches/nccl/minimpi/mpirun.py -n 2 -- SRC/build-mp/all_reduce_perf ...
# NCCL_TESTS_BUILDS="threads processes" (the default) names the builds to make: one alone takes
# half the time (about 40 s on a device machine), for a call that runs only its ranks' kind.
# The edits below apply once, so each run takes a fresh SRC (the other build later: start over).
#
# Three changes, each checked to apply exactly once:
# 1. Every rank picks device 0 (the tests give rank r device r, in two places: the main
#    program's device list and the device each thread sets).
# 2. After each data set-up in the timed step and in the check, the threads meet at the tests'
#    own barrier before the collective. The set-up ends in a device-wide synchronisation; with
#    two threads on one device it would wait for the other thread's collective kernel, which
#    waits for this thread's launch, behind that synchronisation: a deadlock of the test bed
#    alone (on separate GPUs each thread synchronises only its own device). Host stacks of
#    the hang, taken with cuda-gdb, show exactly that pair: one thread in the set-up's
#    synchronisation, the other in its stream wait.
# Timings and results are otherwise the tests' own.
set -eu
src=${1:?nccl-tests source folder}
builds=" ${NCCL_TESTS_BUILDS:-threads processes} "
for b in $builds; do
  if [ "$b" != threads ] && [ "$b" != processes ]; then
    echo "NCCL_TESTS_BUILDS: \"$b\" is neither threads nor processes" >&2
    exit 2
  fi
done
nccl_home=${2:-}
if [ -z "$nccl_home" ]; then
  wheel_dir=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])') || {
    echo "no NCCL_HOME given and python3 has no NCCL wheel (nvidia.nccl): pip install nvidia-nccl-cu13, or pass NCCL_HOME" >&2
    exit 1
  }
  library=$(compgen -G "$wheel_dir/lib/libnccl.so.2*" | head -1) || true
  if [ ! -f "$wheel_dir/include/nccl.h" ] || [ -z "$library" ]; then
    echo "$wheel_dir has no include/nccl.h or lib/libnccl.so.2: pass NCCL_HOME" >&2
    exit 1
  fi
  nccl_home=$src/nccl-home
  mkdir -p "$nccl_home/lib"
  ln -sfn "$wheel_dir/include" "$nccl_home/include"
  ln -sf "$library" "$nccl_home/lib/libnccl.so"
fi
cuda_home=${3:-$(dirname "$(dirname "$(command -v nvcc)")")}

python3 - "$src" <<'PY'
import re, sys
src = sys.argv[1]

def edit(path, pattern, replace, count):
    with open(path) as f:
        text = f.read()
    new, n = re.subn(pattern, replace, text)
    if n != count:
        sys.exit(f"{path}: expected {count} match(es) of {pattern!r}, found {n}: "
                 "another nccl-tests version? (v2.19.6 is the one this was written for)")
    with open(path, "w") as f:
        f.write(new)

# 1. device 0 for every rank
edit(f"{src}/src/common.cu", r"gpus\[i\] = \(gpu0 != -1 \? gpu0 : localRank\*nThreads\*nGpus\) \+ i;",
     "gpus[i] = 0; /* gp2p: ranks share device 0 */", 1)
edit(f"{src}/src/util.cu", r"const int cudaDev = \(gpu0 != -1 \? gpu0 : localRank\*nThreads\*nGpus\) \+ i;",
     "const int cudaDev = 0; /* gp2p: ranks share device 0 */", 1)
# 2. a barrier after each data set-up of BenchTime (the timed step's and the check's)
edit(f"{src}/src/common.cu",
     r"(TESTCHECK\(args->collTest->initData\(args, type, op, root, (?:99|rep), in_place\)\);)",
     r"\1 Barrier(args); /* gp2p: no rank launches while another synchronises the shared device */", 2)
PY

if [[ $builds == *" threads "* ]]; then
  make -C "$src/src" -j"$(nproc)" CUDA_HOME="$cuda_home" NCCL_HOME="$nccl_home" CUDARTLIB=cudart_static \
    NVCC_GENCODE="${NVCC_GENCODE:--gencode=arch=compute_90,code=sm_90}"
  echo "nccl-tests built in $src/build (ranks share device 0)"
fi
[[ $builds == *" processes "* ]] || exit 0

# The process build: minimpi as a static libmpi, so the binaries need nothing at run time.
minimpi=$(cd "$(dirname "$0")/../nccl/minimpi" && pwd)
mpi_home=$src/minimpi
mkdir -p "$mpi_home/include" "$mpi_home/lib"
cp "$minimpi/mpi.h" "$mpi_home/include/"
cc -std=c11 -O2 -fPIC -Wall -Werror -c "$minimpi/mpi.c" -o "$mpi_home/mpi.o"
ar rcs "$mpi_home/lib/libmpi.a" "$mpi_home/mpi.o"
make -C "$src/src" -j"$(nproc)" CUDA_HOME="$cuda_home" NCCL_HOME="$nccl_home" CUDARTLIB=cudart_static \
  NVCC_GENCODE="${NVCC_GENCODE:--gencode=arch=compute_90,code=sm_90}" MPI=1 MPI_HOME="$mpi_home" BUILDDIR=../build-mp
echo "nccl-tests built in $src/build-mp (ranks as processes through minimpi)"
