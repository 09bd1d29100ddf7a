#!/usr/bin/env bash
# Builds everything and runs the whole test suite (CPU): installs the Debian build
# dependencies, fetches the default model (some tests compare it with transformers), builds
# with -Werror, runs ctest and prints its summary. ARBOR_SANITIZE=1 runs the suite in the clang-14
# ASan + UBSan build that also holds the libFuzzer targets (build-asan/, -Wthread-safety), so
# `ARBOR_FUZZ_BUILD_DIR=build-asan bash scripts/fuzz.sh` afterwards fuzzes without a third build.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
bash scripts/setup_debian.sh
bash scripts/setup_python.sh
bash scripts/fetch_default_model.sh
BUILD="${ARBOR_BUILD_DIR:-build}"
JOBS="${ARBOR_JOBS:-$(nproc)}"
if [ "${ARBOR_SANITIZE:-0}" = 1 ]; then
  BUILD="${BUILD}-asan"
  # clang-14 with ASan + UBSan and libFuzzer's coverage hooks (-DARBOR_FUZZ=ON), at -O1 with line
  # tables only (-g1), as ASan is usually run: half the compile time of -O2 -g on the 2-core CI
  # machine, same reports with file:line stacks. The flags are fuzz.sh's, so it reuses the build.
  LAUNCHER=()
  if command -v ccache >/dev/null; then
    LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
  fi
  CC=clang-14 CXX=clang++-14 cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    "${LAUNCHER[@]}" -DARBOR_FUZZ=ON -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
    -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG"
else
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
fi
cmake --build "$BUILD" -j "$JOBS"
cd "$BUILD"
EXCLUDE=()
if [ "${ARBOR_SANITIZE:-0}" = 1 ]; then
  # The statistical tests (thousands of sampled trees and generations compared by chi-square,
  # several minutes under ASan) and the serving benchmark's load run exercise the code paths
  # the rest of the suite runs under ASan too; they run in the release build's pass.
  EXCLUDE=(-E "^(SpecSampling|VerifierStatistical)\\.|^server_bench_serve$")
fi
ctest --output-on-failure -j "$JOBS" --timeout 900 "${EXCLUDE[@]}"
