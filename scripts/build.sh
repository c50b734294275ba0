#!/usr/bin/env bash
# Configures and builds trainyard into build/ (Release, Ninja, two jobs).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-Release}" ${CMAKE_ARGS:-}
cmake --build build -j "${JOBS:-2}"
