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
#   bash scripts/gpu_bars.sh decode-ab   # plain decode at batch 1 / 8 under the settings that
#                                        # trade latency (GEMM order, split size, invariance),
#                                        # and ncu's per-kernel times of one batch-1 step
#   bash scripts/gpu_bars.sh model-ab    # model_bench decode, this build against .gpu/base.tar.gz
#   bash scripts/gpu_bars.sh env-ab      # model_bench decode under each setting of ARBOR_AB_ENVS
#   bash scripts/gpu_bars.sh stage       # (one call per part) SmolLM2's GGUF parts to /tmp/stage
#   bash scripts/gpu_bars.sh e2e         # SmolLM2 spec-bench: n-gram / EAGLE / Medusa vs plain
#                                        # (and EAGLE-3 with .stage/heads/eagle3.tar carried)
#   bash scripts/gpu_bars.sh e2e-ab      # the same, this build's arbor against .gpu/base_arbor.tar.gz
#   bash scripts/gpu_bars.sh e2e-sweep   # SmolLM2 spec-bench over tree shapes (ARBOR_E2E_SWEEP)
#   bash scripts/gpu_bars.sh plain-after # SmolLM2 plain steps before / after a speculative run
#                                        # and after its draft is freed (EAGLE's slowdown, †)
#   bash scripts/gpu_bars.sh ncu-spec    # ncu's per-kernel times of a short SmolLM2 spec-bench
# The SmolLM2 modes need only the CLI: carry .gpu/payload_cli.tar.gz (written by pack beside
# the whole payload) and not .gpu/payload.tar.gz when a base binary must travel as well.
# The tests alone: ARBOR_GPU_SKIP_SANITIZER=1 ARBOR_GPU_SKIP_BENCH=1 ARBOR_GPU_SKIP_MODEL_BENCH=1
# bash scripts/run_gpu_suite.sh.
#   bash scripts/gpu_bars.sh flashinfer  # our grid (attention_bench from .gpu/attn.tar.gz), then
#                                        # FlashInfer's custom mask at the grid (carry .whl, see
#                                        # scripts/gpu_flashinfer_bench.sh prepare) and the table
#
# Logs go to $OUT (the device machine's return folder) or ./gpu-logs. Environment:
# ARBOR_BARS_ITERS (attention_bench launches per point, default 20), ARBOR_FLEX_BUDGET_S
# (FlexAttention compile budget, default 150), ARBOR_MODEL_BENCH_ARGS (replaces the model
# benchmark's arguments).
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT" || exit 1
# shellcheck source=scripts/gpu_payload.sh
. scripts/gpu_payload.sh
LOG="${OUT:-$ROOT/gpu-logs}"
mkdir -p "$LOG"
MODE="${1:-attention}"
ITERS="${ARBOR_BARS_ITERS:-20}"

# The 80-point attention grid of issue 4 (attention_bench in $BIN) into $LOG/bench_wgmma.log.
run_grid() {
  echo "== attention_bench --kernel wgmma --iters $ITERS (grid)"
  timeout 150 "$BIN/attention_bench" --kernel wgmma --iters "$ITERS" >"$LOG/bench_wgmma.log" 2>&1 ||
    STATUS=1
  grep -E '^(device|shapes)' "$LOG/bench_wgmma.log"
}

if [ "$MODE" = stage ]; then
  # SmolLM2-135M-Instruct's GGUF (93 MB) is over one call's transfer beside the repo: split it
  # here (split -n 3 models/SmolLM2-135M-Instruct.Q4_1.gguf .stage/smol.part.) and carry one
  # part per call; the machine keeps /tmp/stage while it stays warm between calls.
  mkdir -p /tmp/stage && cp .stage/smol.part.* /tmp/stage/ && ls -la /tmp/stage
  exit $?
fi
if [ "$MODE" = flashinfer ]; then
  # With .gpu/attn.tar.gz (attention_bench alone, which needs only cuBLAS: the payload does not
  # fit one call beside the wheels) our kernel runs first in the same call, and the table joins
  # both with the torch peers' JSON if $ARBOR_TORCH_JSON names one.
  STATUS=0
  if [ -f .gpu/attn.tar.gz ]; then
    BIN=/tmp/arbor_attn
    unpack_payload .gpu/attn.tar.gz "$BIN" && use_gpu_libs "$BIN"
    run_grid
  fi
  bash scripts/gpu_flashinfer_bench.sh "${@:2}" >"$LOG/flashinfer_run.log" 2>&1 || STATUS=1
  grep -vE '^\| [0-9]' "$LOG/flashinfer_run.log" | tail -15
  if [ -f "$LOG/bench_wgmma.log" ]; then
    python3 scripts/attention_peers_table.py --ours "$LOG/bench_wgmma.log" \
      --flashinfer "$LOG/flashinfer_attention.json" ${ARBOR_TORCH_JSON:+--torch "$ARBOR_TORCH_JSON"} \
      >"$LOG/peers_table_fi.md" 2>&1 || STATUS=1
    grep -E '^\* ' "$LOG/peers_table_fi.md"
  fi
  exit $STATUS
fi

# The whole payload, else the CLI-only one (enough for stage, e2e, e2e-ab, e2e-sweep and
# plain-after).
PAYLOAD=.gpu/payload.tar.gz
[ -f "$PAYLOAD" ] || PAYLOAD=.gpu/payload_cli.tar.gz
[ -f "$PAYLOAD" ] || { echo "no .gpu/payload.tar.gz: run scripts/run_gpu_suite.sh pack"; exit 1; }
BIN=/tmp/arbor_gpu
unpack_payload "$PAYLOAD" "$BIN" && use_gpu_libs "$BIN"
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit \
    --format=csv,noheader
} | tee "$LOG/gpu_$MODE.txt"
STATUS=0

# The SmolLM2 heads for METHOD: ARBOR_E2E_HEADS/METHOD, else the committed ones, else those
# scripts/gpu_train_heads.sh trained on this machine or sent back (EAGLE-3's is not committed:
# carry .stage/heads/eagle3.tar, the tar its train phase writes to $OUT).
heads_dir() {  # METHOD
  local d
  if [ ! -d "/tmp/heads_work/heads/$1" ] && [ -f ".stage/heads/$1.tar" ]; then
    mkdir -p /tmp/heads_work/heads && tar -C /tmp/heads_work/heads -xf ".stage/heads/$1.tar"
  fi
  for d in "${ARBOR_E2E_HEADS:-}" tests/data/heads/smollm2 /tmp/heads_work/heads; do
    [ -n "$d" ] && [ -d "$d/$1" ] && { echo "$d/$1"; return; }
  done
  echo "tests/data/heads/smollm2/$1"
}

# One SmolLM2 spec-bench run (the staged GGUF, the 16 held-out prompts, 128 tokens, greedy, the
# median of 2 rounds as issue 38's bars take it; the trained heads for eagle and medusa): its
# table, rounds, step and draft lines appended to LOGFILE, a failure recorded in STATUS.
spec_bench_run() {  # LOGFILE "VAR=value ..." EXE METHOD BATCH [spec-bench options]
  local logfile=$1 envs=$2 exe=$3 method=$4 batch=$5 heads="" rc
  shift 5
  [ "$method" != ngram ] && heads="--spec-heads $(heads_dir "$method")"
  # shellcheck disable=SC2086
  env $envs timeout 240 "$exe" spec-bench --backend cuda -m /tmp/smol.gguf \
    --prompts .stage/heldout.jsonl --no-bos --max-tokens 128 --temperature 0 --rounds 2 \
    --batch "$batch" --spec "$method" $heads "$@" >/tmp/e2e_run.log 2>&1
  rc=$?
  grep -E '^(\||spec:|plain:|draft:|rounds:)' /tmp/e2e_run.log | grep -v -- '---' | tee -a "$logfile"
  if [ $rc -ne 0 ]; then
    echo "FAILED (exit $rc): $(tail -3 /tmp/e2e_run.log | tr '\n' ' ')" | tee -a "$logfile"
    STATUS=1
  fi
}

# One plain-decode run of a model_bench binary: its table rows, prefixed with LABEL, appended to
# $LOG/NAME.log (the run's whole output stays in $LOG/NAME.tmp until the next run).
decode_rows() {  # NAME LABEL "VAR=value ..." EXE [model_bench arguments]
  local name=$1 label=$2 envs=$3 exe=$4
  shift 4
  # shellcheck disable=SC2086
  env $envs timeout 90 "$exe" --no-verify --decode-steps 16 "$@" >"$LOG/$name.tmp" 2>&1 || STATUS=1
  grep -E '^\| [0-9]+ \|' "$LOG/$name.tmp" | sed "s/^/$label /" | tee -a "$LOG/$name.log"
}

case "$MODE" in
  attention)
    run_grid
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
  decode-ab)
    # Plain decode at batch 1 and 8 under the backend's settings that trade batch-1 latency
    # for other things, two rounds in one process order: the default (batch-invariant,
    # cuBLASLt order + chain GEMM, 512-key splits), the chunked GEMM, 256-key splits, and the
    # shape-tuned (not batch-invariant) backend with the skinny GEMM at 1-2 rows.
    for round in 1 2; do
      for cfg in "" "--gemm 2" "--split-keys 256" "--gemm 2 --split-keys 256" \
        "--batch-invariant 0 --skinny-max-rows 2"; do
        # shellcheck disable=SC2086
        decode_rows decode_ab "round $round [${cfg:-default}]" "" "$BIN/model_bench" --batch 1,8 $cfg
      done
    done
    rm -f "$LOG/decode_ab.tmp"
    NCU="$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)"
    if [ -n "$NCU" ]; then
      echo "== ncu: one replayed batch-1 decode step, per kernel"
      timeout 200 "$NCU" --profile-from-start off --graph-profiling node --clock-control none \
        --cache-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv \
        "$BIN/model_bench" --batch 1 --decode-steps 4 --no-verify --ncu-step \
        >"$LOG/ncu_step.csv" 2>&1 || STATUS=1
      wc -l "$LOG/ncu_step.csv"
    fi
    ;;
  model-ab)
    # The payload's model_bench against a base build's (.gpu/base.tar.gz, git-ignored: the
    # stripped model_bench of the base commit), plain decode at batch 1-64, alternating, three
    # rounds in one call.
    mkdir -p "$BIN/base" && tar -C "$BIN/base" -xzf .gpu/base.tar.gz || exit 1
    for round in 1 2 3; do
      for which in base new; do
        exe="$BIN/model_bench"
        [ "$which" = base ] && exe="$BIN/base/model_bench"
        # shellcheck disable=SC2086
        decode_rows model_ab "round $round $which" "" "$exe" --batch 1,8,32,64 ${ARBOR_AB_ARGS:-}
      done
    done
    rm -f "$LOG/model_ab.tmp"
    ;;
  env-ab)
    # Plain decode (batch ${ARBOR_AB_BATCH:-1,8}) under each of the ';'-separated environment
    # settings in ARBOR_AB_ENVS (e.g. "ARBOR_CHAIN_SMALL=44256;ARBOR_CHAIN_SMALL=24256"; an
    # empty entry is the default), three rounds in one call, settings interleaved.
    IFS=';' read -r -a ENVS <<<"${ARBOR_AB_ENVS:-}"
    for round in 1 2 3; do
      for e in "${ENVS[@]}"; do
        # shellcheck disable=SC2086
        decode_rows env_ab "round $round [${e:-default}]" "$e" "$BIN/model_bench" \
          --batch "${ARBOR_AB_BATCH:-1,8}" ${ARBOR_AB_ARGS:-}
        grep -E 'chain GEMM' "$LOG/env_ab.tmp" | sed "s/^.*out \([0-9]*\) in \([0-9]*\).*chain GEMM/\1x\2: chain/" |
          sed "s/^/  [${e:-default}] /" >>"$LOG/env_ab_gemm.log"
      done
    done
    rm -f "$LOG/env_ab.tmp"
    ;;
  e2e)
    # SmolLM2-135M-Instruct end to end with the trained heads (staged parts reassembled), 16
    # held-out MT-bench prompts x 128 tokens greedy (.stage/heldout.jsonl, rendered with the
    # GGUF's chat template), speculation against plain decoding in the same process, the
    # median of 2 rounds.
    cat /tmp/stage/smol.part.* >/tmp/smol.gguf && sha256sum /tmp/smol.gguf | tee "$LOG/e2e.log"
    methods="ngram eagle medusa ngram-adaptive"
    [ -d "$(heads_dir eagle3)" ] && methods="$methods eagle3"
    for batch in 1 8; do
      for m in $methods; do
        method=${m%-adaptive}
        extra=""
        [ "$method" != ngram ] && extra="--spec-heads $(heads_dir "$method")"
        [ "$m" = ngram-adaptive ] && extra="--adaptive-trees --cost-model measure"
        echo "== batch $batch $m" | tee -a "$LOG/e2e.log"
        # shellcheck disable=SC2086
        timeout 150 "$BIN/arbor" spec-bench --backend cuda -m /tmp/smol.gguf \
          --prompts .stage/heldout.jsonl --no-bos --max-tokens 128 --temperature 0 --rounds 2 \
          --batch $batch --spec $method $extra 2>&1 | grep -v '^\[load\]' | tr '\r' '\n' |
          grep -vE '^\s*$' | tail -14 | tee -a "$LOG/e2e.log"
      done
    done
    ;;
  e2e-ab)
    # SmolLM2 spec-bench, this build's arbor against a base one, alternating (the order flips
    # every round), ARBOR_E2E_ROUNDS rounds (default 2) of every method in ARBOR_E2E_METHODS
    # (default "medusa eagle ngram") at every batch in ARBOR_E2E_BATCH (default "1 8"). Each run
    # measures plain decoding in its own process. The base, built here at the base commit:
    #   cp build-cuda/server/arbor /tmp/base_arbor && strip /tmp/base_arbor &&
    #   tar -C /tmp -czf .gpu/base_arbor.tar.gz base_arbor      (carry it with the payload)
    # With ARBOR_E2E_ENVS="A=1;B=2" this build runs under each environment setting instead (an
    # empty entry, written first or between two, is the default environment). Each run has
    # 150 s; keep the product of the lists within the call's 600 s.
    cat /tmp/stage/smol.part.* >/tmp/smol.gguf || { echo "SmolLM2 is not staged"; exit 1; }
    sha256sum /tmp/smol.gguf | tee "$LOG/e2e_ab.log"
    if [ -n "${ARBOR_E2E_ENVS:-}" ]; then
      IFS=';' read -r -a BUILDS <<<"$ARBOR_E2E_ENVS"
    else
      BUILDS=(base new)
      mkdir -p /tmp/arbor_base && tar -C /tmp/arbor_base -xzf .gpu/base_arbor.tar.gz || exit 1
    fi
    for round in $(seq "${ARBOR_E2E_ROUNDS:-2}"); do
      for batch in ${ARBOR_E2E_BATCH:-1 8}; do
        for method in ${ARBOR_E2E_METHODS:-medusa eagle ngram}; do
          order=("${BUILDS[@]}")
          if [ $((round % 2)) -eq 0 ]; then  # the other order on even rounds
            order=()
            for ((i = ${#BUILDS[@]} - 1; i >= 0; i--)); do order+=("${BUILDS[$i]}"); done
          fi
          for build in "${order[@]}"; do
            exe="$BIN/arbor"
            env_set=""
            if [ -n "${ARBOR_E2E_ENVS:-}" ]; then
              env_set="$build"
            elif [ "$build" = base ]; then
              exe=/tmp/arbor_base/base_arbor
            fi
            echo "== round $round batch $batch $method ${build:-default}" | tee -a "$LOG/e2e_ab.log"
            spec_bench_run "$LOG/e2e_ab.log" "$env_set" "$exe" "$method" "$batch"
          done
        done
      done
    done
    ;;
  e2e-sweep)
    # SmolLM2 spec-bench over speculation settings, one run per entry of ARBOR_E2E_SWEEP
    # ("method [spec-bench options]" entries separated by ';'; the trained heads are added for
    # eagle and medusa), at every batch in ARBOR_E2E_BATCH (default 1), ARBOR_E2E_ROUNDS
    # rounds (default 1). Each run measures plain decoding in its own process.
    cat /tmp/stage/smol.part.* >/tmp/smol.gguf || { echo "SmolLM2 is not staged"; exit 1; }
    sha256sum /tmp/smol.gguf | tee "$LOG/e2e_sweep.log"
    IFS=';' read -r -a CONFIGS <<<"${ARBOR_E2E_SWEEP:-eagle;medusa}"
    for round in $(seq "${ARBOR_E2E_ROUNDS:-1}"); do
      for batch in ${ARBOR_E2E_BATCH:-1}; do
        for config in "${CONFIGS[@]}"; do
          read -r method args <<<"$config"
          echo "== round $round batch $batch $config" | tee -a "$LOG/e2e_sweep.log"
          # shellcheck disable=SC2086
          spec_bench_run "$LOG/e2e_sweep.log" "" "$BIN/arbor" "$method" "$batch" $args
        done
      done
    done
    ;;
  plain-after)
    # The plain step after a speculative run (docs/speculation.md, †): per method in
    # ARBOR_PLAIN_AFTER_METHODS (default "eagle ngram"), batch 1, one process each: a plain-only
    # warm-up, 3 rounds plain first (round 1's plain runs before any speculative step), then one
    # more plain pass after the proposer and its draft backend are freed. Each round's tok/s
    # and the last pass are printed.
    cat /tmp/stage/smol.part.* >/tmp/smol.gguf || { echo "SmolLM2 is not staged"; exit 1; }
    for method in ${ARBOR_PLAIN_AFTER_METHODS:-eagle ngram}; do
      heads=""
      [ "$method" != ngram ] && heads="--spec-heads $(heads_dir "$method")"
      echo "== $method" | tee -a "$LOG/plain_after.log"
      # shellcheck disable=SC2086
      timeout 150 "$BIN/arbor" spec-bench --backend cuda -m /tmp/smol.gguf \
        --prompts .stage/heldout.jsonl --no-bos --max-tokens 128 --temperature 0 --batch 1 \
        --rounds 3 --plain-first --no-spec-warmup --plain-after-release --spec "$method" $heads \
        2>&1 | grep -E '^(\| [a-z]|rounds|plain after|plain( after release)? forward, )' |
        tee -a "$LOG/plain_after.log" || STATUS=1
    done
    ;;
  ncu-spec)
    # ncu's per-kernel GPU times of a short SmolLM2 spec-bench run ("method [spec-bench
    # options]" in ARBOR_NCU_SPEC, default eagle; the first held-out prompt, 32 tokens, batch
    # ARBOR_E2E_BATCH (1), no plain run) as CSV in $LOG/ncu_spec.csv; kernels in step graphs
    # are profiled one by one (--graph-profiling node). Summarise with
    # python3 scripts/ncu_kernel_summary.py ncu_spec.csv.
    cat /tmp/stage/smol.part.* >/tmp/smol.gguf || { echo "SmolLM2 is not staged"; exit 1; }
    NCU="$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)"
    [ -n "$NCU" ] || { echo "no ncu on this machine"; exit 1; }
    read -r method args <<<"${ARBOR_NCU_SPEC:-eagle}"
    heads=""
    [ "$method" != ngram ] && heads="--spec-heads $(heads_dir "$method")"
    echo "== ncu: spec-bench --spec $method $args, batch ${ARBOR_E2E_BATCH:-1}"
    # shellcheck disable=SC2086
    timeout 400 "$NCU" --graph-profiling node --clock-control none --cache-control none \
      --metrics gpu__time_duration.sum --csv --log-file "$LOG/ncu_spec.csv" \
      "$BIN/arbor" spec-bench --backend cuda -m /tmp/smol.gguf --prompts .stage/heldout.jsonl \
      --no-bos --limit "${ARBOR_E2E_BATCH:-1}" --max-tokens 32 --temperature 0 \
      --batch "${ARBOR_E2E_BATCH:-1}" --skip-plain --spec "$method" $heads $args \
      >"$LOG/ncu_spec_run.log" 2>&1 || STATUS=1
    grep -E '^(\||spec:|draft:)' "$LOG/ncu_spec_run.log" | grep -v -- '---'
    wc -l "$LOG/ncu_spec.csv"
    ;;
  *)
    echo "unknown mode '$MODE' (attention | model | decode-ab | model-ab | env-ab | e2e | e2e-ab | e2e-sweep | plain-after | ncu-spec | stage | flashinfer)"
    exit 2
    ;;
esac
exit $STATUS
