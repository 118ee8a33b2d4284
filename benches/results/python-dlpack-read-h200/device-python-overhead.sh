set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
pip install -q --no-deps --target /tmp/site-new target/whl/new/*.whl 2>&1 | grep -v WARN
L=$OUT/logs; mkdir -p $L; R=$PWD
cd benches/python
for st in legacy side; do
  t0=$(date +%s)
  PYTHONPATH=/tmp/site-new timeout 200 python3 overhead_parts.py --streams $st --rounds 5 --bind-cpus --json $L/overhead-parts-$st.json > $L/overhead-parts-$st.txt 2>&1; echo "$st rc=$? $(( $(date +%s)-t0 ))s"
done
cd $R
t0=$(date +%s)
PYTHONPATH=/tmp/site-new timeout 150 compute-sanitizer --tool memcheck --error-exitcode 86 python3 -m pytest -q -x -p no:cacheprovider tests/python/test_gpu.py -k "fast_path or fast_read or one_device or copy_between_devices" > $L/memcheck-python-fast-paths.log 2>&1; echo "memcheck rc=$? $(( $(date +%s)-t0 ))s: $(grep -E 'passed|ERROR SUMMARY' $L/memcheck-python-fast-paths.log | tail -2 | tr '\n' ' ')"
tar czf $OUT/logs-x15c.tgz -C $OUT logs
for st in legacy side; do echo "== $st"; tail -12 $L/overhead-parts-$st.txt; done
rm -rf $L
