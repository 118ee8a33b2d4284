set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
tar xJf target/carry/bundle.tar.xz
L=$OUT/logs; mkdir -p $L
t0=$(date +%s)
bundle/run > $L/run-4d96ade-suite-h200.log 2>&1; echo "suite rc=$? $(( $(date +%s)-t0 ))s"
t1=$(date +%s)
GP2P_TEST_MAX_LEN=65539 timeout 430 bundle/run --sanitize > $L/run-4d96ade-sanitize-h200.log 2>&1; echo "sanitize rc=$? $(( $(date +%s)-t1 ))s"
tar czf $OUT/logs-x15a.tgz -C $OUT logs; rm -rf $L
