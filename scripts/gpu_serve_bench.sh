#!/usr/bin/env bash
# On the GPU machine (device tool; carry .gpu and the SmolLM2 GGUF staged at /tmp/stage/smol.gguf,
# see docs/performance.md "Serving"): SmolLM2-135M-Instruct end to end with the trained heads,
# written for the H100 (the serve line's cost curve is configs/verify_cost_h100.json).
# 1. `arbor spec-bench --backend cuda` plain vs each proposer on the held-out MT-bench prompts;
# 2. `arbor serve --backend cuda` under scripts/bench_serve.py: chat requests at concurrency
#    1/8/32, speculation on (EAGLE, adaptive trees from configs/verify_cost_h100.json) vs the
#    per-request override "speculate": false on the same server.
set -u
. scripts/gpu_payload.sh
BIN=/tmp/arbor_gpu; unpack_payload .gpu/payload.tar.gz $BIN; use_gpu_libs $BIN
MODEL=${MODEL:-/tmp/stage/smol.gguf}
PROMPTS=${PROMPTS:-.stage/heldout.jsonl}
[ -f "$MODEL" ] || { echo "missing $MODEL (stage it first)"; exit 1; }
OUTDIR=${OUT:-/tmp/out}; mkdir -p $OUTDIR
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== spec-bench (greedy, 128 tokens, batch 1)"
for m in eagle medusa ngram; do
  H=""; [ $m != ngram ] && H="--spec-heads tests/data/heads/smollm2/$m"
  timeout 200 $BIN/arbor spec-bench --backend cuda -m $MODEL --prompts $PROMPTS --no-bos \
    --max-tokens 128 --temperature 0 --spec $m $H 2>&1 | grep -v "^\[load\]\|^\r" | tail -6
done
echo "== serve + bench_serve"
$BIN/arbor serve --backend cuda -m $MODEL --port 8400 --grpc-port 0 --kv-blocks 16384 \
  --spec eagle --spec-heads tests/data/heads/smollm2/eagle --cost-model configs/verify_cost_h100.json \
  --max-running 128 > $OUTDIR/serve.log 2>&1 &
PID=$!
for _ in $(seq 300); do python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:8400/health', timeout=1)" 2>/dev/null && break; sleep 0.2; done
for spec in true false; do
  timeout 200 python3 scripts/bench_serve.py --base-url http://127.0.0.1:8400 --dataset mt-bench \
    --dataset-path ${CHAT_PROMPTS:-.stage/mt_bench.jsonl} --endpoint chat --concurrency 1,8,32 \
    --num-prompts 48 --max-tokens 128 --label "speculate=$spec" --ignore-eos \
    --extra-body "{\"speculate\": $spec}" --result-json $OUTDIR/serve_speculate_$spec.json 2>&1 | tail -4
done
python3 -c "import urllib.request as u; print(u.urlopen('http://127.0.0.1:8400/metrics').read().decode())" | grep -E "^arbor_spec|^arbor_engine_steps" | head -20
kill -TERM $PID; wait $PID; tail -3 $OUTDIR/serve.log
