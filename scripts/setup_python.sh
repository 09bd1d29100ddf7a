#!/usr/bin/env bash
# Installs the Python packages the client tests use, by name from PyPI: the official `openai`
# client, grpcio + grpcio-tools (stubs generated from proto/ at test time), jinja2 (reference
# chat-template rendering), gguf (reads the template from the GGUF) and pyyaml (deploy/'s files,
# tests/server/test_deploy.py).
set -euo pipefail
PKGS=(openai grpcio grpcio-tools jinja2 gguf pyyaml)
# grpcio-reflection: the server-reflection client of tests/server/test_grpc_chat.py, pinned to
# the release it was tested with (it needs a grpcio at least as new).
PKGS+=(grpcio-reflection==1.85.1)
missing=()
for p in "${PKGS[@]}"; do
  mod="${p//-/_}"
  [ "$p" = grpcio ] && mod=grpc
  [ "$p" = grpcio-tools ] && mod=grpc_tools
  [ "$p" = pyyaml ] && mod=yaml
  [ "${p%%==*}" = grpcio-reflection ] && mod=grpc_reflection
  python3 -c "import $mod" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "[setup] python packages present"
  exit 0
fi
echo "[setup] pip installing: ${missing[*]}"
if ! python3 -m pip install -q "${missing[@]}" 2>/dev/null; then
  python3 -m pip install -q --break-system-packages "${missing[@]}"
fi
