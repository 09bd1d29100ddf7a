#!/usr/bin/env bash
# Issue 4's performance bars in a few device calls on one machine (the H100 the issue names, or
# whichever GPU the call gets): our kernel and its peers side by side, then the model.
#
#   bash scripts/run_gpu_suite.sh pack build-cuda   # here: .gpu/payload.tar.gz (carry .gpu)
#   bash scripts/gpu_bars.sh attention   # the 80-point grid (wgmma), the issue's SDPA points,
#                                        # PyTorch SDPA with the tree mask and FlexAttention at
#                                        # the same points, the joined table and the bar counts
#   bash scripts/gpu_bars.sh model       # model_bench: plain decode at batch 1-64 and the
#                                        # verify-cost curve at batch 1, 8, 32
#   bash scripts/gpu_bars.sh flashinfer  # FlashInfer's custom mask at the grid (carry .whl, see
#                                        # scripts/gpu_flashinfer_bench.sh prepare), then our
#                                        # kernel again at the issue's points
#
# Logs go to $OUT (the device machine's return folder) or ./gpu-logs. Environment:
# ARBOR_BARS_ITERS (attention_bench launches per point, default 20), ARBOR_FLEX_BUDGET_S
# (FlexAttention compile budget, default 150), ARBOR_MODEL_BENCH_ARGS (replaces the model
# benchmark's arguments).
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
LOG="${OUT:-$ROOT/gpu-logs}"
mkdir -p "$LOG"
MODE="${1:-attention}"
ITERS="${ARBOR_BARS_ITERS:-20}"

if [ "$MODE" = flashinfer ]; then
  bash scripts/gpu_flashinfer_bench.sh "${@:2}"
  exit $?
fi

[ -f .gpu/payload.tar.gz ] || { echo "no .gpu/payload.tar.gz: run scripts/run_gpu_suite.sh pack"; exit 1; }
BIN=/tmp/arbor_gpu
rm -rf "$BIN" && mkdir -p "$BIN" && tar -C "$BIN" -xzf .gpu/payload.tar.gz
CUBLAS="$(ls -d /usr/local/cuda/lib64 2>/dev/null)"
[ -f "$CUBLAS/libcublas.so.13" ] ||
  CUBLAS="$(dirname "$(find /usr/local /opt /usr/lib -name 'libcublas.so.13' 2>/dev/null | head -1)")"
export LD_LIBRARY_PATH="$BIN/lib:$CUBLAS:${LD_LIBRARY_PATH:-}"
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit \
    --format=csv,noheader
} | tee "$LOG/gpu_$MODE.txt"
STATUS=0

case "$MODE" in
  attention)
    echo "== attention_bench --kernel wgmma --iters $ITERS (grid)"
    timeout 150 "$BIN/attention_bench" --kernel wgmma --iters "$ITERS" >"$LOG/bench_wgmma.log" 2>&1 ||
      STATUS=1
    grep -E '^(device|shapes)' "$LOG/bench_wgmma.log"
    echo "== the issue's SDPA points, --iters 30"
    { timeout 60 "$BIN/attention_bench" --batch 8,16 --context 2048 --tree 64 --iters 30 &&
      timeout 60 "$BIN/attention_bench" --batch 32 --context 4096 --tree 32 --iters 30; } \
      >"$LOG/bench_issue_points.log" 2>&1 || STATUS=1
    grep '^| [0-9]' "$LOG/bench_issue_points.log"
    echo "== PyTorch SDPA (tree mask) and FlexAttention (mask_mod)"
    PYTHONUNBUFFERED=1 timeout 330 python3 tests/cuda/torch_attention_bench.py \
      --flex-budget-s "${ARBOR_FLEX_BUDGET_S:-150}" --out "$LOG/torch_attention.json" \
      >"$LOG/torch_attention.log" 2>&1 || STATUS=1
    head -3 "$LOG/torch_attention.log"
    echo "== joined table"
    python3 scripts/attention_peers_table.py \
      --ours "$LOG/bench_wgmma.log,$LOG/bench_issue_points.log" --torch "$LOG/torch_attention.json" \
      >"$LOG/peers_table.md" 2>&1 || STATUS=1
    grep -E '^\* ' "$LOG/peers_table.md"
    grep -E '^\| (8 \| 2048 \| 64|16 \| 2048 \| 64|32 \| 4096 \| 32) ' "$LOG/peers_table.md"
    ;;
  model)
    ARGS="${ARBOR_MODEL_BENCH_ARGS:---batch 1,8,32,64 --decode-steps 16 --verify-batch 1,8,32}"
    echo "== model_bench $ARGS"
    # shellcheck disable=SC2086
    timeout 400 "$BIN/model_bench" --json "$LOG/model_bench.json" \
      --verify-json "$LOG/verify_cost.json" $ARGS >"$LOG/model_bench.log" 2>&1 || STATUS=1
    grep -vE '^\s*$' "$LOG/model_bench.log" | tail -60
    ;;
  *)
    echo "unknown mode '$MODE' (attention | model | flashinfer)"
    exit 2
    ;;
esac
exit $STATUS
