# shellcheck shell=bash
# Sourced by the scripts that run on the GPU machine (run_gpu_suite.sh, gpu_bars.sh,
# gpu_serve_smoke.sh, gpu_serve_sweep.sh): the binaries packed here by
# `scripts/run_gpu_suite.sh pack`, and the libraries they load there.

# Libraries the device machine has (glibc, libstdc++, the driver, cuBLAS, NCCL): not packed.
GPU_MACHINE_LIBS='libc\.so|libm\.so|libstdc\+\+|libgcc_s|libpthread|libdl\.so|librt\.so|ld-linux|libcublas|libcuda|libnccl'

# unpack_payload TARBALL DIR: DIR emptied and filled from TARBALL (.gpu/payload.tar.gz).
unpack_payload() {
  rm -rf "$2" && mkdir -p "$2" && tar -C "$2" -xzf "$1"
}

# use_gpu_libs DIR: DIR/lib (the packed non-system libraries), cuBLAS (the toolkit's, else
# the one PyTorch's wheels ship) and NCCL (the system's, else PyTorch's nvidia-nccl wheel; too
# large to carry) on LD_LIBRARY_PATH.
use_gpu_libs() {
  local cublas nccl
  cublas="$(ls -d /usr/local/cuda/lib64 2>/dev/null)"
  [ -f "$cublas/libcublas.so.13" ] ||
    cublas="$(dirname "$(find /usr/local /opt /usr/lib -name 'libcublas.so.13' 2>/dev/null | head -1)")"
  nccl="$(python3 -c 'import nvidia.nccl as n; print(list(n.__path__)[0] + "/lib")' 2>/dev/null)"
  [ -f "$nccl/libnccl.so.2" ] ||
    nccl="$(dirname "$(find /usr/lib /usr/local /opt -name 'libnccl.so.2' 2>/dev/null | head -1)")"
  export LD_LIBRARY_PATH="$1/lib:$cublas:$nccl:${LD_LIBRARY_PATH:-}"
}
