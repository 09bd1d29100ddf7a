#!/usr/bin/env bash
# Builds the libFuzzer targets (clang-14, ASan + UBSan, build-fuzz/) and runs each for a bounded
# time on a scratch copy of its seed corpus (tests/fuzz/corpus/<target>/ is never written).
# Prints per target the executions, exec/s and the outcome; exits non-zero on any crash, leak,
# timeout or out-of-memory. docs/fuzzing.md describes the targets and their invariants.
#
#   bash scripts/fuzz.sh [SECONDS_PER_TARGET]      (default 30)
#
# Environment: ARBOR_FUZZ_TARGETS="tokenizer_encode gguf_loader" runs only those;
# ARBOR_FUZZ_BUILD_DIR (default build-fuzz); ARBOR_JOBS (default nproc); extra libFuzzer flags
# in ARBOR_FUZZ_FLAGS (e.g. "-runs=1000000" or "-jobs=1"). Each run's log, grown corpus and any
# crash-*/leak-*/timeout-*/oom-* input are kept in $BUILD/fuzz-runs/<target>/.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
SECS="${1:-30}"
bash scripts/setup_debian.sh
bash scripts/fetch_default_model.sh
BUILD="${ARBOR_FUZZ_BUILD_DIR:-build-fuzz}"
JOBS="${ARBOR_JOBS:-$(nproc)}"
LAUNCHER=()
if command -v ccache >/dev/null; then
  LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
fi
# -O1 with line tables, as the sanitizer stage of scripts/test.sh: about half the compile time
# of -O2 -g, and the reports keep file:line stacks.
# A build directory configured with ARBOR_FUZZ=ON (e.g. build-asan from `ARBOR_SANITIZE=1
# bash scripts/test.sh`, which CI runs first) is used as it is: only the targets are built.
if ! grep -qs '^ARBOR_FUZZ:BOOL=ON' "$BUILD/CMakeCache.txt"; then
  CC=clang-14 CXX=clang++-14 cmake -S . -B "$BUILD" -G Ninja -DARBOR_FUZZ=ON -DARBOR_TESTS=OFF \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
    -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" "${LAUNCHER[@]}" >/dev/null
fi
start=$(date +%s)
cmake --build "$BUILD" -j "$JOBS"
echo "[fuzz] build took $(($(date +%s) - start)) s"

if [ -n "${ARBOR_FUZZ_TARGETS:-}" ]; then
  read -r -a TARGETS <<<"$ARBOR_FUZZ_TARGETS"
else
  TARGETS=()
  for src in tests/fuzz/*.cc; do TARGETS+=("$(basename "$src" .cc)"); done
fi

# Flags every run gets: at most 2 GiB RSS and no single allocation of 256 MiB or more (inputs
# are at most tens of KiB, so a loader asking for that much believed a crafted header), and
# 25 s per input (a chat template that runs into the interpreter's step budget takes a few
# seconds in this build).
FLAGS=(-max_total_time="$SECS" -rss_limit_mb=2048 -malloc_limit_mb=256 -timeout=25
  -print_final_stats=1)
read -r -a EXTRA <<<"${ARBOR_FUZZ_FLAGS:-}"
failed=0
summary=()
for t in "${TARGETS[@]}"; do
  bin="$ROOT/$BUILD/tests/fuzz/$t"
  seeds="$ROOT/tests/fuzz/corpus/$t"
  [ -x "$bin" ] || { echo "[fuzz] $t: no binary $bin"; exit 1; }
  [ -d "$seeds" ] || { echo "[fuzz] $t: no seed corpus $seeds"; exit 1; }
  run="$ROOT/$BUILD/fuzz-runs/$t"
  rm -rf "$run"
  mkdir -p "$run/corpus"
  cp "$seeds"/* "$run/corpus/"
  echo "[fuzz] $t: ${SECS}s on $(ls "$run/corpus" | wc -l) seeds"
  t0=$(date +%s)
  set +e
  (cd "$run" && "$bin" "${FLAGS[@]}" "${EXTRA[@]}" -artifact_prefix="$run/" corpus) >"$run/log" 2>&1
  rc=$?
  set -e
  wall=$(($(date +%s) - t0))
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$run/log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$run/log" | tail -1)
  artifacts=$(cd "$run" && ls -d crash-* leak-* timeout-* oom-* 2>/dev/null | tr "\n" " " || true)
  outcome="ok"
  if [ "$rc" != 0 ] || [ -n "$artifacts" ]; then
    outcome="FAILED (exit $rc) ${artifacts}"
    failed=1
    echo "[fuzz] $t failed; the end of $run/log:"
    tail -60 "$run/log"
    for a in $artifacts; do
      echo "[fuzz] $a ($(stat -c %s "$run/$a") bytes), first 256 as hex:"
      od -A d -t x1 -N 256 "$run/$a" | head -20
    done
  fi
  summary+=("$(printf '%-30s %10s execs %7s exec/s %5ss  %s' "$t" "${execs:-?}" "${rate:-?}" \
    "$wall" "$outcome")")
done
echo "[fuzz] summary (${SECS}s per target):"
printf '  %s\n' "${summary[@]}"
exit $failed
