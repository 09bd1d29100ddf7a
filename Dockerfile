# `arbor serve` as a container image (docs/deploy.md). Two stages:
#   build    compiles the `arbor` target on a devel base: the CUDA backend (sm_90a) when the base
#            has nvcc, the CPU engine when it does not (CMake ARBOR_CUDA=ON / OFF);
#   runtime  the matching runtime base holding the binary, the shared libraries it links that the
#            base lacks, the container config, configs/ and proto/; a non-root user; HTTP on
#            0.0.0.0:8000 and gRPC on 0.0.0.0:50051.
#
#   CUDA 13, Hopper:  docker build -t arbor:cuda .
#   CPU only:         docker build --build-arg BASE=debian:12 -t arbor:cpu .
#
# podman / buildah need `--format docker` to keep the HEALTHCHECK (the OCI image format has no
# field for it). scripts/test_image.sh builds and tests the CPU variant from a local Debian base.
ARG BASE=
ARG BUILD_BASE=${BASE:-nvidia/cuda:13.0.1-devel-ubuntu24.04}
ARG RUNTIME_BASE=${BASE:-nvidia/cuda:13.0.1-runtime-ubuntu24.04}

FROM ${BUILD_BASE} AS build
# Parallel compile jobs (default: the builder's cores) and the CUDA architectures (Hopper).
ARG JOBS=
ARG CUDA_ARCHITECTURES=90a
# scripts/setup_debian.sh's packages that the `arbor` target needs (no tests, no fuzzing), plus
# ccache for the cache mount below. apt reads the base's own sources.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      g++ cmake ninja-build pkg-config ccache nlohmann-json3-dev libspdlog-dev \
      libopenblas-dev libcli11-dev libcpp-httplib-dev libyaml-cpp-dev libgrpc++-dev \
      libprotobuf-dev protobuf-compiler protobuf-compiler-grpc libabsl-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY CMakeLists.txt ./
COPY engine engine
COPY kernels kernels
COPY server server
COPY proto proto
COPY deploy/container-cpu.yaml deploy/container-cuda.yaml deploy/
# One layer: configure, build, stage into /out, drop the build tree. RelWithDebInfo's -O2 without
# its -g: the code of the tested builds, 10-30% less compile time per file, a 4 MB binary.
# Warnings do not fail this build (ARBOR_WERROR=OFF): another base's compiler may warn where the
# CI's does not, and CI builds with -Werror. ccache keeps its objects in a cache mount that
# outlives the build, so a rebuild after a source change recompiles only what changed. The
# shared libraries the binary resolves are copied unless the runtime base provides them (glibc,
# libstdc++, libgcc_s, and on CUDA cuBLAS; libcuda comes from the host's driver).
RUN --mount=type=cache,target=/ccache,id=arbor-ccache \
    set -eu; \
    export CCACHE_DIR=/ccache CCACHE_MAXSIZE=2G; \
    if command -v nvcc >/dev/null; then cuda=ON; variant=cuda; else cuda=OFF; variant=cpu; fi; \
    cmake -S . -B /tmp/build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DARBOR_TESTS=OFF \
      -DARBOR_WERROR=OFF \
      -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -DNDEBUG" \
      -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -DNDEBUG" \
      -DCMAKE_CUDA_FLAGS_RELWITHDEBINFO="-O2 -DNDEBUG" \
      -DARBOR_CUDA=$cuda -DARBOR_GRPC=ON -DCMAKE_CUDA_ARCHITECTURES=$CUDA_ARCHITECTURES \
      -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache \
      -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache; \
    cmake --build /tmp/build --target arbor -j "${JOBS:-$(nproc)}"; \
    mkdir -p /out/bin /out/lib /out/etc; \
    cp /tmp/build/server/arbor /out/bin/arbor; \
    ldd /out/bin/arbor | awk '$2 == "=>" && $3 ~ /^\// {print $3}' \
      | grep -Ev '/(libc|libm|libdl|libpthread|librt|libresolv|libgcc_s|libstdc\+\+|libcuda|libcublas|libcublasLt)\.so' \
      | xargs -r cp -L -t /out/lib; \
    cp deploy/container-$variant.yaml /out/etc/arbor.yaml; \
    rm -rf /tmp/build; \
    echo "arbor ($variant):"; ls -la /out/bin /out/lib

FROM ${RUNTIME_BASE} AS runtime
COPY --from=build /out/lib/ /usr/local/lib/arbor/
COPY --from=build /out/bin/arbor /usr/local/bin/arbor
COPY --from=build /out/etc/arbor.yaml /etc/arbor/arbor.yaml
COPY configs /opt/arbor/configs
COPY proto /opt/arbor/proto
# `arbor --help` fails the build here if a library does not resolve.
RUN echo /usr/local/lib/arbor > /etc/ld.so.conf.d/arbor.conf && ldconfig \
 && groupadd --system --gid 10001 arbor \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin arbor \
 && mkdir -p /models \
 && arbor --help > /dev/null
WORKDIR /opt/arbor
# The config when no --config is given (HTTP and gRPC on 0.0.0.0, the model at
# /models/model.gguf); flags override any field. The API key: ARBOR_API_KEY or --api-key-file.
ENV ARBOR_CONFIG=/etc/arbor/arbor.yaml
USER 10001:10001
EXPOSE 8000 50051
STOPSIGNAL SIGTERM
# /health over bash's /dev/tcp (no HTTP client in the image): 200 while serving, 503 draining.
HEALTHCHECK --interval=15s --timeout=5s --start-period=300s --retries=3 \
  CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/8000 && printf 'GET /health HTTP/1.1\\r\\nHost: localhost\\r\\nConnection: close\\r\\n\\r\\n' >&3 && read -r -t 4 status <&3 && [[ $status == *' 200 '* ]]"]
ENTRYPOINT ["arbor", "serve"]
