#!/usr/bin/env bash
# Serving benchmark on the CPU backend (docs/performance.md, "Serving"): stories260K behind
# `arbor serve`, plain decoding vs EAGLE speculation with adaptive tree budgets vs fixed trees,
# at several client concurrencies, driven by scripts/bench_serve.py (streaming completions).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
BIN="${ARBOR_BIN:-build/server/arbor}"
MODEL="${MODEL:-../shared/models/stories260K/stories260K.bin}"
HEADS="${HEADS:-tests/data/heads/stories260K/eagle}"
CONC="${CONC:-1,8,32,64}"
REQ="${REQ:-96}"
PORT="${PORT:-8311}"
run() {
  local label="$1"; shift
  "$BIN" serve --model "$MODEL" --port "$PORT" --grpc-port 0 --kv-blocks 4096 "$@" \
      > "/tmp/bench_serve_$label.log" 2>&1 &
  local pid=$!
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break; sleep 0.1; done
  python3 scripts/bench_serve.py --base-url "http://127.0.0.1:$PORT" --dataset file \
      --dataset-path scripts/data/story_openers.txt --concurrency "$CONC" --num-prompts "$REQ" \
      --max-tokens 128 --label "$label" --ignore-eos | tail -n +3
  kill -TERM $pid; wait $pid || true
}
python3 -c "import sys; sys.path.insert(0, 'scripts'); import bench_serve; print(bench_serve.table_header())"
run plain
run eagle-adaptive --spec eagle --spec-heads "$HEADS" --spec-adaptive true
run eagle-fixed --spec eagle --spec-heads "$HEADS" --spec-adaptive false
