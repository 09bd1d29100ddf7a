#!/usr/bin/env bash
# FlashInfer's paged prefill with a custom (tree) mask at attention_bench's points, on a GPU
# machine without network access (issue 4's peer comparison).
#
#   bash scripts/gpu_flashinfer_bench.sh prepare   # on a machine with PyPI: the two wheels
#                                                  # into .whl/ (git-ignored, ~37 MB)
#   bash scripts/gpu_flashinfer_bench.sh [ARGS]    # on the GPU machine (carry .whl): install
#                                                  # to /tmp/site, JIT-compile FlashInfer's FA2
#                                                  # batch-prefill module (~50 s on 16 cores),
#                                                  # check it against SDPA, run
#                                                  # tests/cuda/flashinfer_attention_bench.py ARGS
#
# Only flashinfer-python and apache-tvm-ffi are carried: the device image has torch 2.11
# (cu130), nvcc 13.0, ninja, numpy, cuda-bindings and the rest of FlashInfer's import-time
# needs; its optional packages (cutlass-dsl, cudnn-frontend, cuda-tile, nccl4py) are imported
# guarded or only by other backends. FlashInfer 0.7.0.post1 is the newest release whose wheel
# fits one 64 MiB transfer with the repo (0.7.1 / 0.7.2 are 62-64 MB).
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
FLASHINFER_VERSION=0.7.0.post1
TVM_FFI_VERSION=0.1.15.post2

if [ "${1:-}" = prepare ]; then
  mkdir -p .whl
  for pkg in "flashinfer-python==$FLASHINFER_VERSION" "apache-tvm-ffi==$TVM_FFI_VERSION"; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
      --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 \
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl "$pkg" || exit 1
  done
  ls -la .whl
  exit 0
fi

LOG="${OUT:-$ROOT/gpu-logs}"
mkdir -p "$LOG"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || { echo "no wheels in .whl: run '$0 prepare' first"; exit 1; }
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")}
export CUDA_HOME
# JIT: sm_90a, the kernel cache inside the repo copy (.cache/ is git-ignored).
export FLASHINFER_CUDA_ARCH_LIST=9.0 FLASHINFER_WORKSPACE_BASE="$ROOT" MAX_JOBS="$(nproc)"
{
  date -u
  nvcc --version | tail -1
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__)'
} 2>&1 | tee "$LOG/flashinfer_env.txt"
python3 tests/cuda/flashinfer_attention_bench.py --out "$LOG/flashinfer_attention.json" "$@" 2>&1 |
  tee "$LOG/flashinfer_attention.log"
exit "${PIPESTATUS[0]}"
