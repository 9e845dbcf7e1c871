#!/bin/bash
# One call on a lent GPU machine (docs/performance.md): set-up from the carried wheels in .whl,
# the smoke check, the CUDA-marked tests, then cuda_bench.py's and head_costs.py's measurements,
# each printed as it runs into $OUT/log.txt, and the whole call held under CALL_S seconds (default 560).
# PHASE=check runs the smoke check and the CUDA-marked tests alone (a first short call), PHASE=measure
# the measurements alone (the next call, on the machine still warm), PHASE=all (the default) both,
# PHASE=gguf the GGUF tests and cuda_gguf.py's 8B-shape Q4_K_M against bf16 alone (~4 min).
set -u
PHASE=${PHASE:-all}
OUT=${OUT:-/tmp/gpu-call}; mkdir -p "$OUT"; LOG=$OUT/log.txt; : >"$LOG"
CALL_S=${CALL_S:-560}
rm -rf /tmp/site /tmp/th /tmp/cb  # a warm machine keeps /tmp between calls
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  2>&1 | tail -3 | tee -a "$LOG"
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TANDEM_HOME=/tmp/th HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee -a "$LOG"
step() {  # step SECONDS command...: at most SECONDS, and never past the call's end
  local left=$((CALL_S - SECONDS)); local limit=$(( $1 < left ? $1 : left )); shift
  echo "=== $* (at most ${limit} s, ${SECONDS} s into the call)" | tee -a "$LOG"
  [ "$limit" -gt 5 ] && timeout "$limit" "$@" 2>&1 | tee -a "$LOG"
}
if [ "$PHASE" = gguf ]; then
  step 120 python3 -m pytest -q -m cuda tests/test_gguf_gpu_layers.py -p no:cacheprovider
  step 400 python3 benchmarks/cuda_gguf.py --tokenizer .whl/tok --out /tmp/cb
  echo "=== done at ${SECONDS} s" | tee -a "$LOG"; exit 0
fi
if [ "$PHASE" != measure ]; then
  step 100 python3 benchmarks/cuda_bench.py --smoke --tokenizer .whl/tok --out /tmp/cb
  step 240 python3 -m pytest -q -m cuda tests/test_cuda_graphs.py tests/test_head_graphs.py \
    tests/test_gguf_gpu_layers.py -p no:cacheprovider
fi
if [ "$PHASE" != check ]; then
  # an EAGLE-3 token and a DFlash block of the published shapes against the 8B pass, captured and eager
  step 240 python3 benchmarks/head_costs.py --shape t8b --device cuda --whole --repeats 5
  step 600 python3 benchmarks/cuda_bench.py --tokenizer .whl/tok --out /tmp/cb "$@"
fi
echo "=== done at ${SECONDS} s" | tee -a "$LOG"
