#!/usr/bin/env bash
# Builds everything and runs the whole test suite (CPU): installs the Debian build
# dependencies, fetches the default model (some tests compare it with transformers), builds
# with -Werror, runs ctest and prints its summary. ARBOR_SANITIZE=1 builds with ASan+UBSan.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
bash scripts/setup_debian.sh
bash scripts/setup_python.sh
bash scripts/fetch_default_model.sh
BUILD="${ARBOR_BUILD_DIR:-build}"
SAN=OFF
if [ "${ARBOR_SANITIZE:-0}" = 1 ]; then SAN=ON; BUILD="${BUILD}-asan"; fi
JOBS="${ARBOR_JOBS:-$(nproc)}"
# The sanitizer build compiles at -O1 with line tables only (-g1), as ASan is usually run: half
# the compile time of -O2 -g on the 2-core CI machine, same reports with file:line stacks.
SAN_FLAGS=()
if [ "$SAN" = ON ]; then
  SAN_FLAGS=(-DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG"
    -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG")
fi
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DARBOR_SANITIZE=$SAN "${SAN_FLAGS[@]}"
cmake --build "$BUILD" -j "$JOBS"
cd "$BUILD"
ctest --output-on-failure -j "$JOBS" --timeout 900
