#!/usr/bin/env bash
# Retrains the SmolLM2-135M-Instruct speculation heads (Medusa, EAGLE-1/2, EAGLE-3) by
# self-distillation on the instruction prompt set (scripts/make_instruction_prompts.py), one
# phase per device call (docs/heads.md, "SmolLM2 on the instruction set"):
#
#   bash scripts/gpu_train_heads.sh stage    # the carried .stage/smol.part.* to /tmp/stage
#                                            # (one part per call, as gpu_bars.sh stage)
#   bash scripts/gpu_train_heads.sh gen      # prompts, the base as an fp32 HF directory, the
#                                            # model's replies (outside set, MT-bench, training
#                                            # set); resumable: exit 3 = call gen again
#   bash scripts/gpu_train_heads.sh train    # the three heads side by side on the one GPU
#   bash scripts/gpu_train_heads.sh train-medusa | train-eagle | train-eagle3   # one per call
#   bash scripts/gpu_train_heads.sh eval     # new and committed heads on the held-out training
#                                            # prompts, the outside set and MT-bench
#
# The work lives in $ARBOR_HEADS_WORK (default /tmp/heads_work), which lasts only while the
# machine stays warm; what a later call needs comes back under $OUT (data in parts of at most
# 15 MB, each head as a tar) and can be carried back in .stage/heads (see restore_carried).
# Carry: .whl (the gguf wheel: transformers loads GGUF through it) and .stage/heads (at least
# mt_bench.jsonl: the prompt builder checks its prompts against it) in the gen call, with the
# last GGUF part. Logs and results go to $OUT, or gpu-logs/heads here.
#
# Environment (defaults for one H200): ARBOR_HEADS_GGUF (else /tmp/stage/smol.part.* joined),
# ARBOR_HEADS_PYTHON (python3), ARBOR_HEADS_DEVICE (cuda), ARBOR_HEADS_PROMPTS (12000),
# ARBOR_HEADS_OUTSIDE (64), ARBOR_HEADS_REPLIES ("0,0.7|1.0": greedy + one sample per prompt),
# ARBOR_HEADS_SELF_PROMPTS (0: Magpie-style self-written prompts on top), ARBOR_HEADS_MAX_NEW
# (384), ARBOR_HEADS_GEN_BATCH (1024), ARBOR_HEADS_GEN_S (480: generation time per call),
# ARBOR_HEADS_TRAIN_S (420: training time per head), ARBOR_HEADS_BATCH_TOKENS (16384),
# ARBOR_HEADS_EAGLE3_VOCAB (8192: EAGLE-3's draft vocabulary, the most frequent reply tokens),
# ARBOR_HEADS_SPEC_BENCH (1: eval also runs arbor spec-bench on the outside set when a payload
# from run_gpu_suite.sh pack and the GGUF are there). ARBOR_HEADS_TINY=1: the CPU dry run (32
# prompts, 32 new tokens, 3 training steps, ARBOR_HEADS_ARBOR = a CPU arbor binary to load the
# heads with).
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT" || exit 1
PHASE="${1:-}"
T_START=$(date +%s)
W="${ARBOR_HEADS_WORK:-/tmp/heads_work}"
LOG="${OUT:-$ROOT/gpu-logs/heads}"
PY="${ARBOR_HEADS_PYTHON:-python3}"
GGUF_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
BASE_NAME=SmolLM2-135M-Instruct.Q4_1.gguf
mkdir -p "$W/prompts" "$W/data" "$W/heads" "$LOG"
export PYTHONUNBUFFERED=1

if [ "${ARBOR_HEADS_TINY:-0}" = 1 ]; then
  DEVICE=cpu N_PROMPTS=32 N_OUTSIDE=11 MAX_NEW=32 GEN_BATCH=16 REPLIES="0|0.7" MT_LIMIT=8
  TRAIN_ARGS="--steps 3 --warmup 1 --batch-tokens 2048 --log-every 1 --threads 1"
  HELDOUT_EVERY=8 NICE="nice -n 19" EVAL_TOKENS=2048
else
  DEVICE="${ARBOR_HEADS_DEVICE:-cuda}" N_PROMPTS="${ARBOR_HEADS_PROMPTS:-12000}"
  N_OUTSIDE="${ARBOR_HEADS_OUTSIDE:-64}" MAX_NEW="${ARBOR_HEADS_MAX_NEW:-384}"
  GEN_BATCH="${ARBOR_HEADS_GEN_BATCH:-1024}" REPLIES="${ARBOR_HEADS_REPLIES:-0,0.7|1.0}" MT_LIMIT=
  TRAIN_ARGS="--steps 100000 --time-budget ${ARBOR_HEADS_TRAIN_S:-420} --batch-tokens ${ARBOR_HEADS_BATCH_TOKENS:-16384}"
  HELDOUT_EVERY=25 NICE="" EVAL_TOKENS=16384
fi
GEN_ARGS="--device $DEVICE --max-new $MAX_NEW --gen-batch $GEN_BATCH"
[ "$DEVICE" = cuda ] && GEN_ARGS="$GEN_ARGS --gen-dtype bf16"

note() { echo "== $*" | tee -a "$LOG/heads.log"; }
elapsed() { echo $(($(date +%s) - T_START)); }

# The carried GGUF parts to /tmp/stage (as gpu_bars.sh stage), in every phase.
stage_parts() {
  if compgen -G ".stage/smol.part.*" >/dev/null; then
    mkdir -p /tmp/stage && cp -u .stage/smol.part.* /tmp/stage/ && ls -la /tmp/stage
  fi
}

# The gguf wheel when transformers' GGUF loading needs it (the device image has no gguf).
python_env() {
  if ! "$PY" -c "import gguf" 2>/dev/null && compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl || exit 1
  fi
  [ -d /tmp/site ] && export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
  return 0
}

gguf_path() {
  if [ -n "${ARBOR_HEADS_GGUF:-}" ]; then
    echo "$ARBOR_HEADS_GGUF"
    return
  fi
  if [ ! -f /tmp/smol.gguf ]; then
    compgen -G "/tmp/stage/smol.part.*" >/dev/null || { echo "SmolLM2 is not staged" >&2; exit 1; }
    cat /tmp/stage/smol.part.* >/tmp/smol.gguf
  fi
  echo "$GGUF_SHA  /tmp/smol.gguf" | sha256sum -c --quiet >&2 ||
    { rm -f /tmp/smol.gguf; echo "staged parts are incomplete (sha256)" >&2; exit 1; }
  echo /tmp/smol.gguf
}

# What an earlier call sent back, carried in .stage/heads: prompts, data parts, head tars.
restore_carried() {
  local f name
  for name in instructions outside; do
    [ -f ".stage/heads/$name.jsonl" ] && [ ! -f "$W/prompts/$name.jsonl" ] &&
      cp ".stage/heads/$name.jsonl" "$W/prompts/"
  done
  for name in instructions outside mt_bench; do
    if [ ! -f "$W/data/$name.npz" ] && compgen -G ".stage/heads/$name.npz.part*" >/dev/null; then
      cat .stage/heads/"$name".npz.part* >"$W/data/$name.npz" && note "restored $name.npz"
    fi
  done
  for f in .stage/heads/medusa.tar .stage/heads/eagle.tar .stage/heads/eagle3.tar; do
    name=$(basename "$f" .tar)
    [ -f "$f" ] && [ ! -d "$W/heads/$name" ] && tar -C "$W/heads" -xf "$f" && note "restored $name"
  done
  return 0
}

mt_bench_file() {
  local f
  for f in "${ARBOR_HEADS_MT_BENCH:-}" .stage/heads/mt_bench.jsonl ../shared/data/prompts/mt_bench.jsonl; do
    [ -n "$f" ] && [ -f "$f" ] && { echo "$f"; return; }
  done
  echo "no mt_bench.jsonl: carry .stage/heads/mt_bench.jsonl" >&2
  exit 1
}

ensure_prompts() {
  [ -f "$W/prompts/instructions.jsonl" ] && [ -f "$W/prompts/outside.jsonl" ] && return
  note "prompt set: $N_PROMPTS training + $N_OUTSIDE outside prompts"
  $NICE "$PY" scripts/make_instruction_prompts.py --n "$N_PROMPTS" --outside-n "$N_OUTSIDE" \
    --mt-bench "$(mt_bench_file)" --out "$W/prompts/instructions.jsonl" \
    --outside-out "$W/prompts/outside.jsonl" 2>&1 | tee -a "$LOG/heads.log"
  [ "${PIPESTATUS[0]}" = 0 ] || exit 1
}

# The base as an fp32 HF directory (loads in seconds; transformers dequantizes the GGUF once),
# saved by the first generation: the outside set's replies.
ensure_base() {
  [ -f "$W/base_hf/config.json" ] && [ -f "$W/data/outside.npz" ] && return
  local base
  base=$(gguf_path) || exit 1
  [ -f "$W/base_hf/config.json" ] && base="$W/base_hf"
  note "outside set replies (and the base as $W/base_hf)"
  # shellcheck disable=SC2086
  $NICE "$PY" scripts/spec_train_common.py gen-data --base "$base" --save-base "$W/base_hf" \
    --prompt-set instructions --prompts "$W/prompts/outside.jsonl" --all-heldout \
    --out "$W/data/outside.npz" $GEN_ARGS 2>&1 | grep --line-buffered -v -e '%|' -e Warning | tee -a "$LOG/heads.log"
  [ "${PIPESTATUS[0]}" = 0 ] || exit 1
}

# Sends FILE back under $OUT, in parts of at most 15 MB (cat PART* > FILE joins them).
send_back() {
  [ -n "${OUT:-}" ] || return 0
  split -b 15000000 -d -a 1 "$1" "$OUT/$(basename "$1").part"
}

gen() {
  ensure_prompts
  ensure_base
  if [ ! -f "$W/data/mt_bench.npz" ]; then
    note "MT-bench replies (all 80 first turns held out)"
    # shellcheck disable=SC2086
    $NICE "$PY" scripts/spec_train_common.py gen-data --base "$W/base_hf" --prompt-set mt_bench \
      --mt-bench "$(mt_bench_file)" --self-prompts 0 --all-heldout ${MT_LIMIT:+--limit-prompts $MT_LIMIT} \
      --out "$W/data/mt_bench.npz" $GEN_ARGS 2>&1 | grep --line-buffered -v -e '%|' -e Warning | tee -a "$LOG/heads.log"
    [ "${PIPESTATUS[0]}" = 0 ] || exit 1
  fi
  local budget=$((${ARBOR_HEADS_GEN_S:-480} - $(elapsed)))
  note "training set replies ($REPLIES per prompt, generation budget ${budget} s)"
  # shellcheck disable=SC2086
  $NICE "$PY" scripts/spec_train_common.py gen-data --base "$W/base_hf" --prompt-set instructions \
    --prompts "$W/prompts/instructions.jsonl" --replies "$REPLIES" --heldout-every "$HELDOUT_EVERY" \
    --self-prompts "${ARBOR_HEADS_SELF_PROMPTS:-0}" --out "$W/data/instructions.npz" \
    --gen-chunks "$W/data/chunks" --gen-time-budget "$budget" $GEN_ARGS 2>&1 |
    grep --line-buffered -v -e '%|' -e Warning | tee -a "$LOG/heads.log"
  local rc=${PIPESTATUS[0]}
  if [ "$rc" = 3 ]; then
    note "generation not finished: call gen again while the machine is warm (it resumes)"
    exit 3
  fi
  [ "$rc" = 0 ] || exit 1
  # shellcheck disable=SC2012
  ls -la "$W/data"/*.npz | tee -a "$LOG/heads.log"
  sha256sum "$W/prompts"/*.jsonl | tee -a "$LOG/heads.log"
  for f in instructions outside mt_bench; do send_back "$W/data/$f.npz"; done
}

train_one() {  # KIND
  local out="$W/heads/$1" common
  common="--base $W/base_hf --base-name $BASE_NAME --data $W/data/instructions.npz --device $DEVICE --save-dtype bf16 $TRAIN_ARGS"
  rm -rf "$out"
  # shellcheck disable=SC2086
  case "$1" in
    medusa) $NICE "$PY" scripts/train_medusa.py $common --out "$out" --share-lm-head --lr 1e-3 ;;
    eagle) $NICE "$PY" scripts/train_eagle.py $common --out "$out" --ttt-steps 3 --lr 5e-4 ;;
    eagle3) $NICE "$PY" scripts/train_eagle.py $common --out "$out" --version 3 \
      --draft-vocab "${ARBOR_HEADS_EAGLE3_VOCAB:-8192}" \
      --ttt-steps 4 --lr 5e-4 ;;
  esac
}

train() {  # KIND...
  [ -f "$W/data/instructions.npz" ] || { echo "no training data: run gen first"; exit 1; }
  ensure_base
  local kind pids=() status=0 i=0
  for kind in "$@"; do
    note "train $kind"
    if [ "$DEVICE" = cpu ]; then  # one at a time on a CPU
      train_one "$kind" >"$LOG/train_$kind.log" 2>&1 || status=1
    else
      train_one "$kind" >"$LOG/train_$kind.log" 2>&1 &
      pids+=($!)
    fi
  done
  for kind in "$@"; do
    if [ "$DEVICE" != cpu ]; then wait "${pids[$i]}" || status=1; fi
    i=$((i + 1))
    grep -E '^\[|^saved|^eagle3:|Error|error' "$LOG/train_$kind.log" | tee -a "$LOG/heads.log"
    [ -n "${OUT:-}" ] && [ -d "$W/heads/$kind" ] && tar -C "$W/heads" -cf "$OUT/$kind.tar" "$kind"
  done
  return $status
}

eval_heads() {
  local heads=() new=() data=() k status=0
  for k in medusa eagle eagle3; do
    [ -d "$W/heads/$k" ] && new+=("new_$k=$W/heads/$k")
  done
  heads=("${new[@]}")
  for k in medusa eagle; do heads+=("old_$k=tests/data/heads/smollm2/$k"); done
  [ -d models/heads/smollm2/eagle3 ] && heads+=("old_eagle3=models/heads/smollm2/eagle3")
  [ -d .stage/heads/old_eagle3 ] && heads+=("old_eagle3=.stage/heads/old_eagle3")
  for k in outside mt_bench; do [ -f "$W/data/$k.npz" ] && data+=("$k=$W/data/$k.npz"); done
  [ -f "$W/data/instructions.npz" ] && data+=("heldout=$W/data/instructions.npz")
  ensure_base
  if [ ${#new[@]} -gt 0 ]; then
    note "format: the new heads against the committed ones (EAGLE-3: stories260K's, names only)"
    "$PY" scripts/eval_heads.py --check-only --heads "${new[@]}" \
      --reference medusa=tests/data/heads/smollm2/medusa eagle=tests/data/heads/smollm2/eagle \
      2>&1 | tee -a "$LOG/heads.log" || status=1
  fi
  if [ -d "$W/heads/eagle3" ]; then
    "$PY" scripts/eval_heads.py --check-only --names-only --heads "new_eagle3=$W/heads/eagle3" \
      --reference eagle3=tests/data/heads/stories260K/eagle3 2>&1 | tee -a "$LOG/heads.log" || status=1
  fi
  note "held-out acceptance proxies"
  $NICE "$PY" scripts/eval_heads.py --base "$W/base_hf" --device "$DEVICE" --heads "${heads[@]}" \
    --data "${data[@]}" --batch-tokens "$EVAL_TOKENS" --out "$LOG/eval.json" 2>&1 |
    grep --line-buffered -v -e '%|' -e Warning | tee -a "$LOG/heads.log"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
  spec_bench || status=1
  return $status
}

# The C++ engine on the new heads: arbor spec-bench (the payload's CUDA build, or in the dry run
# a CPU binary) on the outside prompts rendered with the GGUF's chat template.
spec_bench() {
  local exe="" backend=cuda limit=24 tokens=128 m gguf
  if [ "${ARBOR_HEADS_TINY:-0}" = 1 ]; then
    [ -n "${ARBOR_HEADS_ARBOR:-}" ] || return 0
    exe="$ARBOR_HEADS_ARBOR" backend=cpu limit=2 tokens=8
  elif [ "${ARBOR_HEADS_SPEC_BENCH:-1}" = 1 ]; then
    local payload=.gpu/payload_cli.tar.gz
    [ -f .gpu/payload.tar.gz ] && payload=.gpu/payload.tar.gz
    [ -f "$payload" ] || return 0
    # shellcheck source=scripts/gpu_payload.sh
    . scripts/gpu_payload.sh
    unpack_payload "$payload" /tmp/arbor_gpu && use_gpu_libs /tmp/arbor_gpu
    exe=/tmp/arbor_gpu/arbor
  else
    return 0
  fi
  gguf=$(gguf_path) || return 0
  "$PY" scripts/render_chat_prompts.py --gguf "$gguf" --prompts "$W/prompts/outside.jsonl" \
    --out "$W/prompts/outside_rendered.jsonl" || return 1
  local dir
  for m in medusa eagle eagle3; do
    # The heads trained in this work folder, else the committed ones.
    dir="$W/heads/$m"
    [ -d "$dir" ] || dir="tests/data/heads/smollm2/$m"
    [ -d "$dir" ] || continue
    note "arbor spec-bench --spec $m ($dir) on the outside prompts ($limit x $tokens tokens, greedy)"
    $NICE timeout 150 "$exe" spec-bench --backend "$backend" -m "$gguf" \
      --prompts "$W/prompts/outside_rendered.jsonl" --no-bos --limit "$limit" --max-tokens "$tokens" \
      --temperature 0 --threads 1 --skip-plain --spec "$m" --spec-heads "$dir" 2>&1 |
      grep -v '^\[load\]' | tr '\r' '\n' | grep -vE '^\s*$' | tail -6 | tee -a "$LOG/heads.log"
    [ "${PIPESTATUS[0]}" = 0 ] || return 1
  done
}

stage_parts
python_env
restore_carried
case "$PHASE" in
  stage) ;;
  gen) gen ;;
  train) train medusa eagle eagle3 ;;
  train-medusa) train medusa ;;
  train-eagle) train eagle ;;
  train-eagle3) train eagle3 ;;
  eval) eval_heads ;;
  *)
    echo "usage: $0 stage | gen | train | train-medusa | train-eagle | train-eagle3 | eval"
    exit 2
    ;;
esac
STATUS=$?
note "$PHASE: exit $STATUS after $(elapsed) s"
exit $STATUS
