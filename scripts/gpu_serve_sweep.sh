#!/usr/bin/env bash
# `arbor serve --backend cuda` under load (docs/performance.md "Serving"), measured with
# scripts/bench_serve.py on the GPU machine:
#   * SmolLM2-135M-Instruct with its trained EAGLE heads, configs/h200.yaml (EAGLE, adaptive trees
#     sized from configs/verify_cost_h200.json): chat requests of 128 tokens (ignore_eos) on the
#     MT-bench prompts, closed loop at concurrency 1 / 8 / 32 / 64 and an open-loop Poisson
#     request-rate sweep up to saturation, against the same server with `--spec off`; the
#     closed loop also with the per-request "speculate": false on the EAGLE server and with the
#     cost curve measured at start-up (`--cost-model measure`);
#   * dummy:llama-3-8b (Llama-3-8B shapes, random weights on the device, plain decoding):
#     completions with 512 random token ids in and 128 tokens out (ignore_eos), the same
#     closed loop and a rate sweep.
# Each load level is one bench_serve.py run with its own request count (about three rounds of
# the concurrency, 8 s of arrivals at a rate), joined per server with `bench_serve.py merge`.
#
#   here:   bash scripts/gpu_serve_sweep.sh prepare REPO BUILD_DIR
#             REPO/.serve-sweep/ (add it to REPO/.git/info/exclude): part1/, part2/ (SmolLM2's
#             GGUF, 41.5 MB each) and run/ (the rest of it, the CLI payload, this script,
#             bench_serve.py, the MT-bench prompts); REPO is the checkout the device tool sends
#   device: call 1 (carry .serve-sweep/part1): mkdir -p /tmp/serve_sweep && cp .serve-sweep/part1/* /tmp/serve_sweep/
#           call 2 (carry .serve-sweep/part2): the same with part2 (the machine stays warm 30 s)
#           call 3 (carry .serve-sweep/run):   bash .serve-sweep/run/gpu_serve_sweep.sh all
#   then:   tar -xzf serve_sweep.tar.gz; python3 scripts/bench_serve.py plot ... (the plots
#           are drawn there too when matplotlib is installed)
#
# Modes: all | smollm2 | llama8b | plain-ab (run_plain_ab, below). Environment: SWEEP_DIR
# (default: this script's folder), ARBOR (the arbor binary; default: the payload's), SMOL (the
# GGUF; default: the parts joined), PROMPTS (MT-bench JSONL), and for a dry run of the script
# on the CPU: BACKEND (default cuda),
# QUICK=1 (a few requests per level), CONCS (default "1 8 32 64"), RATES (default
# "4 8 16 32 64 inf"), MAX_TOKENS (default 128), DUMMY (default dummy:llama-3-8b),
# DUMMY_IDS (default 0:128000), SERVE_ARGS (added to every `arbor serve`).
set -uo pipefail
MODE="${1:-all}"
SELF_DIR="$(cd "$(dirname "$0")" && pwd)"

if [ "$MODE" = prepare ]; then
  REPO="${2:?prepare REPO BUILD_DIR}"
  BUILD="${3:-build-cuda}"
  ROOT="$(cd "$SELF_DIR/.." && pwd)"
  DEST="$REPO/.serve-sweep"
  # shellcheck source=scripts/gpu_payload.sh
  . "$SELF_DIR/gpu_payload.sh"
  GGUF="${SMOL_GGUF:-$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
  [ -f "$GGUF" ] || GGUF="$REPO/models/SmolLM2-135M-Instruct.Q4_1.gguf"
  rm -rf "$DEST" && mkdir -p "$DEST/part1" "$DEST/part2" "$DEST/run/lib" || exit 1
  split -b 41500000 -d -a 1 "$GGUF" "$DEST/run/smol.part."
  mv "$DEST/run/smol.part.0" "$DEST/part1/" && mv "$DEST/run/smol.part.1" "$DEST/part2/"
  sha256sum "$GGUF" | cut -d' ' -f1 >"$DEST/run/smol.sha256"
  # The CLI and the non-system libraries it loads (as scripts/run_gpu_suite.sh pack does).
  STAGE="$(mktemp -d)" && mkdir -p "$STAGE/lib"
  cp "$BUILD/server/arbor" "$STAGE/" && strip --strip-debug "$STAGE/arbor"
  ldd "$STAGE/arbor" | awk '/=>/ {print $3}' | sort -u |
    grep -Ev "$GPU_MACHINE_LIBS" |
    while read -r lib; do cp -L "$lib" "$STAGE/lib/"; done
  tar -C "$STAGE" -czf "$DEST/run/payload_cli.tar.gz" . && rm -rf "$STAGE" "$DEST/run/lib"
  cp "$SELF_DIR/gpu_serve_sweep.sh" "$SELF_DIR/bench_serve.py" "$SELF_DIR/gpu_payload.sh" "$DEST/run/"
  cp "${PROMPTS:-$ROOT/../shared/data/prompts/mt_bench.jsonl}" "$DEST/run/mt_bench.jsonl"
  du -sb "$DEST"/*
  exit 0
fi

SWEEP_DIR="${SWEEP_DIR:-$SELF_DIR}"
BENCH="$SWEEP_DIR/bench_serve.py"
PROMPTS="${PROMPTS:-$SWEEP_DIR/mt_bench.jsonl}"
BACKEND="${BACKEND:-cuda}"
QUICK="${QUICK:-0}"
CONCS="${CONCS:-1 8 32 64}"
RATES="${RATES:-4 8 16 32 64 inf}"
MAX_TOKENS="${MAX_TOKENS:-128}"
DUMMY="${DUMMY:-dummy:llama-3-8b}"
OUTDIR="${OUT:-$PWD/serve-sweep-out}"
WORK=/tmp/serve_sweep_work
rm -rf "$WORK" && mkdir -p "$WORK/results" "$WORK/logs" "$OUTDIR"
SUMMARY="$OUTDIR/summary.txt"
: >"$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY"; }
T0=$(date +%s)
elapsed() { echo $(($(date +%s) - T0)); }
# Levels are skipped once BUDGET_S seconds have passed, so that the results are packed before
# the device call's limit (600 s).
BUDGET_S="${BUDGET_S:-520}"
in_budget() { [ "$(elapsed)" -lt "$BUDGET_S" ] || { say "  skipped (over ${BUDGET_S} s): $*"; false; }; }

if [ -z "${ARBOR:-}" ]; then
  # shellcheck source=scripts/gpu_payload.sh
  . "$SWEEP_DIR/gpu_payload.sh"
  unpack_payload "$SWEEP_DIR/payload_cli.tar.gz" /tmp/serve_sweep_bin && use_gpu_libs /tmp/serve_sweep_bin
  ARBOR=/tmp/serve_sweep_bin/arbor
fi
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader 2>/dev/null
  git log -1 --format='checkout %h %s' 2>/dev/null | cut -c1-100
} | tee -a "$SUMMARY"

PORT=8400
SERVER_PID=""
# start_server NAME [arbor serve flags]: waits for /health (3 minutes at most).
start_server() {
  local name=$1
  shift
  PORT=$((PORT + 1))
  # shellcheck disable=SC2086
  "$ARBOR" serve --backend "$BACKEND" --port "$PORT" --grpc-port 0 "$@" ${SERVE_ARGS:-} \
    >"$WORK/logs/$name.log" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 900); do
    python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$PORT/health', timeout=1)" \
      2>/dev/null && { say "[$(elapsed) s] $name up: $*"; return 0; }
    kill -0 "$SERVER_PID" 2>/dev/null || break
    sleep 0.2
  done
  say "[$(elapsed) s] $name did not start:"; tail -5 "$WORK/logs/$name.log" | tee -a "$SUMMARY"
  kill -9 "$SERVER_PID" 2>/dev/null
  SERVER_PID=""
  return 1
}
stop_server() {
  [ -n "$SERVER_PID" ] || return 0
  python3 -c "import urllib.request as u; print(u.urlopen('http://127.0.0.1:$PORT/metrics').read().decode())" \
    >"$WORK/logs/metrics_$1.txt" 2>/dev/null
  kill -TERM "$SERVER_PID" && wait "$SERVER_PID"
  SERVER_PID=""
}

# bench LABEL NAME [bench_serve flags]: one bench_serve run -> results/LABEL_NAME.json.
bench() {
  local label=$1 name=$2
  shift 2
  in_budget "$label $name" || return 0
  timeout 240 python3 "$BENCH" --base-url "http://127.0.0.1:$PORT" --label "$label" \
    --result-json "$WORK/results/${label}_$name.json" "$@" \
    >>"$WORK/logs/bench_$label.txt" 2>>"$WORK/logs/bench_$label.err" ||
    say "  bench $label $name failed: $(tail -2 "$WORK/logs/bench_$label.err" | tr '\n' ' ')"
}
# closed_loop LABEL [flags]: concurrency 1 / 8 / 32 / 64, about three rounds each.
closed_loop() {
  local label=$1 c n files=()
  shift
  for c in $CONCS; do
    n=$((c == 1 ? 16 : 3 * c))
    [ "$QUICK" = 1 ] && n=$((c < 4 ? 2 : c))
    bench "$label" "c$c" --concurrency "$c" --num-prompts "$n" "$@"
    files+=("$WORK/results/${label}_c$c.json")
  done
  merge "$label" closed "${files[@]}"
}
# open_loop LABEL RATES [flags]: Poisson arrivals, 6 s of them per rate (at least 24 requests,
# at most 192); "inf" sends 192 at once.
open_loop() {
  local label=$1 rates=$2 r n files=()
  shift 2
  for r in $rates; do
    if [ "$r" = inf ]; then n=192; else n=$((6 * r < 24 ? 24 : (6 * r > 192 ? 192 : 6 * r))); fi
    [ "$QUICK" = 1 ] && n=4
    bench "$label" "r$r" --request-rate "$r" --num-prompts "$n" "$@"
    files+=("$WORK/results/${label}_r$r.json")
  done
  merge "$label" open "${files[@]}"
}
merge() {
  local label=$1 kind=$2 present=()
  shift 2
  for f in "$@"; do [ -f "$f" ] && present+=("$f"); done
  [ ${#present[@]} -gt 0 ] || return 0
  python3 "$BENCH" merge "${present[@]}" --out "$WORK/results/${label}_$kind.json" \
    --csv "$WORK/results/${label}_$kind.csv" --label "$label"
}

SMOL_CHAT=(--endpoint chat --dataset mt-bench --dataset-path "$PROMPTS" --max-tokens "$MAX_TOKENS"
  --ignore-eos)
# The SmolLM2 GGUF: parts carried by earlier calls to /tmp/serve_sweep, the last one here.
smol_gguf() {
  local smol="${SMOL:-/tmp/serve_sweep/smol.gguf}"
  if [ ! -f "$smol" ]; then
    mkdir -p /tmp/serve_sweep && cp "$SWEEP_DIR"/smol.part.* /tmp/serve_sweep/ 2>/dev/null
    cat /tmp/serve_sweep/smol.part.* >"$smol" || return 1
  fi
  if [ -f "$SWEEP_DIR/smol.sha256" ] && [ "$(sha256sum "$smol" | cut -d' ' -f1)" != "$(cat "$SWEEP_DIR/smol.sha256")" ]; then
    say "SmolLM2 GGUF checksum mismatch"; rm -f "$smol"; return 1
  fi
  echo "$smol"
}

run_smollm2() {
  local smol
  smol=$(smol_gguf) || return 1
  local common=(--config configs/h200.yaml --model "$smol")
  local warm=("${SMOL_CHAT[@]}" --concurrency 64 --num-prompts 64 --max-tokens 32)
  [ "$QUICK" = 1 ] && warm=("${SMOL_CHAT[@]}" --concurrency 2 --num-prompts 2 --max-tokens 4)
  say "== SmolLM2: EAGLE server (configs/h200.yaml)"
  start_server eagle "${common[@]}" || return 1
  bench warmup eagle "${warm[@]}"
  closed_loop eagle "${SMOL_CHAT[@]}"
  closed_loop eagle-speculate-false "${SMOL_CHAT[@]}" --extra-body '{"speculate": false}'
  open_loop eagle "$RATES" "${SMOL_CHAT[@]}"
  stop_server eagle
  say "== SmolLM2: --spec off"
  start_server off "${common[@]}" --spec off || return 1
  bench warmup off "${warm[@]}"
  closed_loop off "${SMOL_CHAT[@]}"
  open_loop off "$RATES" "${SMOL_CHAT[@]}"
  stop_server off
}

# The third SmolLM2 server (last: the first to go when time runs short).
run_smollm2_measured() {
  in_budget "the eagle-measured server" || return 0
  local common=(--config configs/h200.yaml --model "${SMOL:-/tmp/serve_sweep/smol.gguf}")
  local warm=("${SMOL_CHAT[@]}" --concurrency 64 --num-prompts 64 --max-tokens 32)
  [ "$QUICK" = 1 ] && warm=("${SMOL_CHAT[@]}" --concurrency 2 --num-prompts 2 --max-tokens 4)
  say "== SmolLM2: EAGLE with the cost curve measured at start-up"
  start_server eagle-measured "${common[@]}" --cost-model measure || return 1
  bench warmup eagle-measured "${warm[@]}"
  closed_loop eagle-measured "${SMOL_CHAT[@]}"
  stop_server eagle-measured
}

# Plain requests at one client, each server fresh and again after a 64-client load: `--spec off`
# against the EAGLE server with "speculate": false (which ran 0.86-0.93x at one client in four
# sweeps): is it the proposer or the process's age? Two rounds.
run_plain_ab() {
  local smol r
  smol=$(smol_gguf) || return 1
  local common=(--config configs/h200.yaml --model "$smol") ns=(--extra-body '{"speculate": false}')
  local one=16 load=192
  [ "$QUICK" = 1 ] && one=2 load=4
  for r in 1 2; do
    start_server "off-$r" "${common[@]}" --spec off || return 1
    bench ab "off_fresh_$r" "${SMOL_CHAT[@]}" --concurrency 1 --num-prompts "$one"
    bench load "off_$r" "${SMOL_CHAT[@]}" --concurrency 64 --num-prompts "$load"
    bench ab "off_aged_$r" "${SMOL_CHAT[@]}" --concurrency 1 --num-prompts "$one"
    stop_server "off-$r"
    start_server "eagle-$r" "${common[@]}" || return 1
    bench ab "eagle_nospec_fresh_$r" "${SMOL_CHAT[@]}" --concurrency 1 --num-prompts "$one" "${ns[@]}"
    bench load "eagle_$r" "${SMOL_CHAT[@]}" --concurrency 64 --num-prompts "$load" "${ns[@]}"
    bench ab "eagle_nospec_aged_$r" "${SMOL_CHAT[@]}" --concurrency 1 --num-prompts "$one" "${ns[@]}"
    stop_server "eagle-$r"
  done
  python3 - "$WORK/results" <<'PY' | tee -a "$SUMMARY"
import glob, json, os, sys
for f in sorted(glob.glob(os.path.join(sys.argv[1], "ab_*.json"))):
    lv = json.load(open(f))["levels"][0]
    print(f"{os.path.basename(f)[3:-5]}: {lv['output_throughput']:.0f} tok/s, "
          f"TPOT p50 {lv['median_tpot_ms']:.3f} ms")
PY
}

run_llama8b() {
  say "== $DUMMY (random weights), plain decoding"
  local flags=(--dataset random --token-id-range "${DUMMY_IDS:-0:128000}" --random-input-len 512
    --random-output-len "$MAX_TOKENS" --ignore-eos)
  start_server llama8b --config configs/h200.yaml --model "$DUMMY" --name "$DUMMY" --spec off ||
    return 1
  bench warmup llama8b "${flags[@]}" --concurrency 64 --num-prompts 64 --random-output-len 16
  closed_loop llama8b "${flags[@]}"
  open_loop llama8b "$RATES" "${flags[@]}"
  stop_server llama8b
}

case "$MODE" in
  smollm2) run_smollm2 && run_smollm2_measured ;;
  llama8b) run_llama8b ;;
  plain-ab) run_plain_ab ;;
  all)
    run_smollm2 && smol_ok=1
    run_llama8b
    [ -n "${smol_ok:-}" ] && run_smollm2_measured
    ;;
  *) echo "unknown mode '$MODE' (prepare | all | smollm2 | llama8b | plain-ab)"; exit 2 ;;
esac
[ -n "$SERVER_PID" ] && stop_server last
say "[$(elapsed) s] done"

# Tables: every level of every server, and the EAGLE / --spec off ratios.
python3 - "$WORK/results" <<'EOF' | tee -a "$SUMMARY"
import json, os, sys
d = sys.argv[1]
res = {}
for server in ("eagle", "eagle-speculate-false", "off", "eagle-measured", "llama8b"):
    for kind in ("closed", "open"):
        path = os.path.join(d, f"{server}_{kind}.json")
        if os.path.exists(path):
            with open(path) as fh:
                res[f"{server}_{kind}"] = json.load(fh)
def g(lv, k, fmt="{:.1f}"):
    v = lv.get(k)
    return fmt.format(v) if isinstance(v, (int, float)) else "-"
print("| server | level | done | req/s | out tok/s | TTFT p50 | TTFT p99 | TPOT p50 | TPOT p99 | ITL p50 | E2E p99 | accepted len |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for name, r in res.items():
    for lv in r["levels"]:
        lvl = f"c={lv['concurrency']}" if lv["mode"] == "closed" else f"rate={lv['request_rate']}"
        print(f"| {r['label']} | {lvl} | {lv['completed']}/{lv['completed'] + lv['failed']} | "
              f"{g(lv, 'request_throughput', '{:.2f}')} | {g(lv, 'output_throughput')} | "
              f"{g(lv, 'median_ttft_ms')} | {g(lv, 'p99_ttft_ms')} | {g(lv, 'median_tpot_ms', '{:.2f}')} | "
              f"{g(lv, 'p99_tpot_ms', '{:.2f}')} | {g(lv, 'median_itl_ms', '{:.2f}')} | "
              f"{g(lv, 'p99_e2el_ms', '{:.0f}')} | {g(lv, 'mean_accepted_length', '{:.2f}')} |")
def by_conc(name):
    r = res.get(name)
    return {lv["concurrency"]: lv for lv in r["levels"]} if r else {}
off = by_conc("off_closed")
for other in ("eagle_closed", "eagle-speculate-false_closed", "eagle-measured_closed"):
    o = by_conc(other)
    if o and off:
        print(other.replace("_closed", "") + " / --spec off, output tok/s: " + ", ".join(
            f"c={c} {o[c]['output_throughput'] / off[c]['output_throughput']:.2f}x"
            for c in sorted(o) if c in off and off[c]["output_throughput"]))
EOF

# Plots where matplotlib is installed (the JSONs come back either way).
PLOTS="$WORK/plots"
if python3 -c "import matplotlib" 2>/dev/null; then
  R="$WORK/results"
  for set in "smollm2_closed:eagle_closed eagle-speculate-false_closed off_closed eagle-measured_closed" \
    "smollm2_open:eagle_open off_open" "llama8b:llama8b_closed llama8b_open"; do
    name=${set%%:*}
    files=()
    for f in ${set#*:}; do [ -f "$R/$f.json" ] && files+=("$R/$f.json"); done
    [ ${#files[@]} -gt 0 ] && python3 "$BENCH" plot "${files[@]}" --out-dir "$PLOTS/$name" \
      >/dev/null 2>>"$WORK/logs/plots.err"
  done
fi
mkdir -p "$PLOTS"
tar -C "$WORK" -czf "$OUTDIR/serve_sweep.tar.gz" results logs plots
ls -la "$OUTDIR"
