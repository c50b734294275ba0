#!/usr/bin/env bash
# Quick start 2: install dependencies, build, and run the whole test suite with ctest.
# Arguments go to ctest (e.g. -L unit for the quick loop).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
cd build
# No test may reach EC2's instance metadata address (the S3 credential chain's last resort): only
# loopback and the tests' own namespaces are targets.
export AWS_EC2_METADATA_DISABLED=true
exec ctest --output-on-failure --timeout 120 -j "${CTEST_JOBS:-1}" "$@"
