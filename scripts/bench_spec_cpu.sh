#!/usr/bin/env bash
# Acceptance of every proposer on stories260K (story openers) and SmolLM2-135M-Instruct
# (MT-bench first turns, chat template), greedy and temperature 0.7, on the CPU backend.
# Writes Markdown rows to stdout (each run's table row; spec-bench prints its step breakdown and
# transfers after it). Usage: bash scripts/bench_spec_cpu.sh [smollm2_prompts]
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
ARBOR=./build/server/arbor
N="${ARBOR_SPEC_PROMPTS:-10}"
TOKENS="${ARBOR_SPEC_TOKENS:-64}"
S=../shared/models/stories260K/stories260K.bin
H=tests/data/heads
echo "## stories260K, story openers (scripts/data/story_openers.txt), 128 tokens"
for t in 0 0.7; do
  extra=""; [ "$t" != 0 ] && extra="--skip-plain"
  $ARBOR spec-bench -m $S --prompts scripts/data/story_openers.txt --max-tokens 128 \
      --temperature $t --spec ngram $extra 2>/dev/null | grep -E '^\| [a-z]' | tail -1
  for m in medusa eagle eagle3; do
    [ -d $H/stories260K/$m ] || continue
    $ARBOR spec-bench -m $S --prompts scripts/data/story_openers.txt --max-tokens 128 \
        --temperature $t --spec $m --spec-heads $H/stories260K/$m $extra 2>/dev/null |
        grep -E '^\| [a-z]' | tail -1
  done
done
M=models/SmolLM2-135M-Instruct.Q4_1.gguf
PROMPTS="${1:-/tmp/mt_bench_smollm2.jsonl}"
[ -s "$PROMPTS" ] || python3 scripts/render_chat_prompts.py --gguf $M --out "$PROMPTS"
echo "## SmolLM2-135M-Instruct, MT-bench first turns ($N prompts), $TOKENS tokens"
for t in 0 0.7; do
  extra=""; [ "$t" != 0 ] && extra="--skip-plain"
  $ARBOR spec-bench -m $M --prompts "$PROMPTS" --limit $N --batch $N --no-bos \
      --max-tokens $TOKENS --temperature $t --spec ngram $extra 2>/dev/null |
      grep -E '^\| [a-z]' | tail -1
  for m in medusa eagle eagle3; do
    [ -d $H/smollm2/$m ] || continue
    $ARBOR spec-bench -m $M --prompts "$PROMPTS" --limit $N --batch $N --no-bos \
        --max-tokens $TOKENS --temperature $t --spec $m --spec-heads $H/smollm2/$m $extra \
        2>/dev/null | grep -E '^\| [a-z]' | tail -1
  done
done
