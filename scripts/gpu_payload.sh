# shellcheck shell=bash
# Sourced by the scripts that run on the GPU machine (run_gpu_suite.sh, gpu_bars.sh,
# gpu_serve_smoke.sh, gpu_serve_sweep.sh): the binaries packed here by
# `scripts/run_gpu_suite.sh pack`, and the libraries they load there.

# unpack_payload TARBALL DIR: DIR emptied and filled from TARBALL (.gpu/payload.tar.gz).
unpack_payload() {
  rm -rf "$2" && mkdir -p "$2" && tar -C "$2" -xzf "$1"
}

# use_gpu_libs DIR: DIR/lib (the packed non-system libraries) and cuBLAS (the toolkit's, else
# the one PyTorch's wheels ship) on LD_LIBRARY_PATH.
use_gpu_libs() {
  local cublas
  cublas="$(ls -d /usr/local/cuda/lib64 2>/dev/null)"
  [ -f "$cublas/libcublas.so.13" ] ||
    cublas="$(dirname "$(find /usr/local /opt /usr/lib -name 'libcublas.so.13' 2>/dev/null | head -1)")"
  export LD_LIBRARY_PATH="$1/lib:$cublas:${LD_LIBRARY_PATH:-}"
}
