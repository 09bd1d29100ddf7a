#!/usr/bin/env bash
# Installs what building and testing arbor needs on Debian 12 (bookworm), by package name.
set -euo pipefail
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
PKGS=(build-essential cmake ninja-build pkg-config git nlohmann-json3-dev libspdlog-dev
      libgtest-dev libopenblas-dev libcli11-dev python3 python3-pip unzip libcpp-httplib-dev
      libyaml-cpp-dev libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc curl
      libabsl-dev clang-14 libclang-rt-14-dev)
missing=()
for p in "${PKGS[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "[setup] installing: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
else
  echo "[setup] all build dependencies present"
fi
