#!/usr/bin/env bash
# Quick start 2: install dependencies, build, and run the whole test suite with ctest.
# Arguments go to ctest (e.g. -L unit for the quick loop).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
cd build
exec ctest --output-on-failure --timeout 120 -j "${CTEST_JOBS:-1}" "$@"
