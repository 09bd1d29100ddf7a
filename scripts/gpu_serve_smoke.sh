#!/usr/bin/env bash
# On the GPU machine (device tool, carry .gpu): arbor serve --backend cuda smoke test
# (tests/server/gpu_smoke.py) with stories260K and its EAGLE heads. Pack first:
#   bash scripts/run_gpu_suite.sh pack build-cuda
set -u
. scripts/gpu_payload.sh
BIN=/tmp/arbor_gpu; unpack_payload .gpu/payload.tar.gz $BIN; use_gpu_libs $BIN
export ARBOR_BIN=$BIN/arbor ARBOR_SHARED_DIR=/tmp/shared
mkdir -p /tmp/shared/models/stories260K && cp $BIN/stories260K.bin $BIN/tok512.bin /tmp/shared/models/stories260K/
timeout 300 python3 tests/server/gpu_smoke.py /tmp/shared/models/stories260K/stories260K.bin tests/data/heads/stories260K/eagle eagle 2>&1 | tail -20
for f in /tmp/arbor_serve_*.log; do tail -3 $f; done
