#!/usr/bin/env bash
# Configures and builds trainyard (Release, Ninja, two jobs):
#   scripts/build.sh          build/: the CPU build against the venv's LibTorch (scripts/setup.sh),
#                             linking no CUDA library; everything, tests and benchmarks included
#   scripts/build.sh --cuda   build-cuda/: the same LibTorch's CUDA libraries and NCCL, compiled
#                             with the machine's CUDA toolkit: the library, the CLI, the examples
#                             and the GPU tests (which skip without a GPU), not the CPU-only suites
# CMAKE_ARGS adds configure flags (e.g. -DCMAKE_PREFIX_PATH=<another LibTorch>), BUILD_TYPE and
# JOBS override the defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  "") dir=build; flags=() ;;
  --cuda)
    dir=build-cuda
    # No GPU here to detect an architecture from: name one (LibTorch's CUDA set-up asks), H100's.
    flags=(-DTRAINYARD_CUDA=ON -DTRAINYARD_BUILD_TESTS=OFF -DTRAINYARD_BUILD_GPU_TESTS=ON
           -DTRAINYARD_BUILD_BENCH=OFF "-DTORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}") ;;
  *) echo "build: unknown option '$1'; the only option is --cuda (build-cuda/)" >&2; exit 2 ;;
esac
# shellcheck disable=SC2086  # CMAKE_ARGS is a list of flags
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-Release}" "${flags[@]}" ${CMAKE_ARGS:-}
cmake --build "$dir" -j "${JOBS:-2}"
