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
# TP_STAGES picks stages (default "1 2 3"); TP_TIMEOUT_S caps each stage (default 300, 300,
# 400). Each stage's whole output goes to $OUT/tp_stage<N>.log as it is written (line by line,
# so a stage stopped by its timeout still shows how far it got), NCCL's warnings included.
set -u
. scripts/gpu_payload.sh
BIN=/tmp/arbor_gpu
unpack_payload .gpu/payload.tar.gz $BIN
use_gpu_libs $BIN
export NCCL_NVLS_ENABLE=0 NCCL_DEBUG=${NCCL_DEBUG:-WARN}
OUTDIR=${OUT:-/tmp/out}
mkdir -p "$OUTDIR"
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
nvidia-smi topo -m 2>/dev/null | head -4
for stage in ${TP_STAGES:-1 2 3}; do
  case $stage in
  1)
    echo "== CudaTp tests"
    (cd $BIN && timeout "${TP_TIMEOUT_S:-300}" stdbuf -oL ./arbor_cuda_tests --gtest_filter='CudaTp*' 2>&1 |
      tee "$OUTDIR/tp_stage1.log" |
      grep --line-buffered -E '^\[ *(OK|FAILED|SKIPPED|PASSED|RUN) |TP=|Failure|error|equal|NCCL WARN' | head -60)
    ;;
  2)
    echo "== tp_bench 8b"
    timeout "${TP_TIMEOUT_S:-300}" stdbuf -oL $BIN/tp_bench --shape 8b --tp 1,2 --batch 1,8,32 \
      --json "$OUTDIR/tp_8b.json" 2>&1 | tee "$OUTDIR/tp_stage2.log"
    ;;
  3)
    echo "== tp_bench 70b"
    timeout "${TP_TIMEOUT_S:-400}" stdbuf -oL $BIN/tp_bench --shape 70b --tp 2 --batch 1,8,32 \
      --eagle3 1:60,8:16 --json "$OUTDIR/tp_70b.json" 2>&1 | tee "$OUTDIR/tp_stage3.log"
    ;;
  esac
done
