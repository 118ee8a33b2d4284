set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
for w in old new; do pip install -q --no-deps --target /tmp/site-$w target/whl/$w/*.whl 2>&1 | grep -v WARN; done
L=$OUT/logs; mkdir -p $L; R=$PWD
t0=$(date +%s)
PYTHONPATH=/tmp/site-new timeout 240 python3 -m pytest -q -x -p no:cacheprovider tests/python/test_gpu.py tests/python/test_torch_backend.py > $L/run-python-gpu.log 2>&1; echo "pytest rc=$? $(( $(date +%s)-t0 ))s: $(tail -1 $L/run-python-gpu.log)"
t0=$(date +%s)
PYTHONPATH=/tmp/site-new timeout 120 python3 benches/probes/python_call_costs.py --bind-cpus --calls 1000 --batches 9 --json $L/python-call-costs.json > $L/python-call-costs.txt 2>&1; echo "costs rc=$? $(( $(date +%s)-t0 ))s"
t0=$(date +%s)
cd benches/python
for i in 1 2 3 4 5 6 7 8; do
  if [ $((i % 2)) = 1 ]; then order="old new"; else order="new old"; fi
  for w in $order; do PYTHONPATH=/tmp/site-$w timeout 60 python3 copy_call_turns.py --calls 200 --bind-cpus --label $w$i --json $L/turns-$w$i.json >> $L/turns.txt 2>&1; done
done
echo "turns $(( $(date +%s)-t0 ))s"
cd $R
tar czf $OUT/logs-x15b.tgz -C $OUT logs
grep -E "read_torch_pair|_to_dlpack|empty lambda|describe" $L/python-call-costs.txt
python3 benches/results/python-dlpack-read-h200/turns_summary.py $L
rm -rf $L
