#!/usr/bin/env bash
# On the two-GPU machine (device tool, kind nvidia-h200-x2; carry .gpu/payload.tar.gz from
# `bash scripts/run_gpu_suite.sh pack build-cuda`): tensor parallelism's tests and bars
# (docs/tensor_parallel.md).
# 1. arbor_cuda_tests --gtest_filter='CudaTp*': TP=2 against TP=1 (random model logits and 96
#    greedy tokens, the Llama-3-8B shape's 96 greedy tokens, n-gram speculation with step
#    graphs at TP=2);
# 2. tp_bench, Llama-3-8B shape at TP=1 and TP=2 (decode at batch 1/8/32, a 60-token verify
#    step, the all-reduce alone);
# 3. tp_bench, Llama-3-70B shape at TP=2 (decode at batch 1/8/32 against the weight floor) and
#    an EAGLE-3-shaped draft's speculative step against a plain step.
# TP_STAGES picks stages (default "1 2 3").
set -u
. scripts/gpu_payload.sh
BIN=/tmp/arbor_gpu
unpack_payload .gpu/payload.tar.gz $BIN
use_gpu_libs $BIN
export NCCL_NVLS_ENABLE=0
OUTDIR=${OUT:-/tmp/out}
mkdir -p "$OUTDIR"
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
nvidia-smi topo -m 2>/dev/null | head -4
for stage in ${TP_STAGES:-1 2 3}; do
  case $stage in
  1)
    echo "== CudaTp tests"
    (cd $BIN && timeout 300 ./arbor_cuda_tests --gtest_filter='CudaTp*' 2>&1 |
      grep -E '^\[ *(OK|FAILED|SKIPPED|PASSED) |TP=|Failure|error|equal' | head -40)
    ;;
  2)
    echo "== tp_bench 8b"
    timeout 300 $BIN/tp_bench --shape 8b --tp 1,2 --batch 1,8,32 --json "$OUTDIR/tp_8b.json" 2>&1
    ;;
  3)
    echo "== tp_bench 70b"
    timeout 400 $BIN/tp_bench --shape 70b --tp 2 --batch 1,8,32 --eagle3 1:60,8:16 \
      --json "$OUTDIR/tp_70b.json" 2>&1
    ;;
  esac
done
