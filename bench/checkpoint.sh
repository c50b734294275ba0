#!/usr/bin/env bash
# checkpoint.sh — checkpoint write/read throughput to a local directory (file://) and to S3 (moto's
# S3 server on loopback, bench/s3_server.sh), with the recipe's real ResNet-18 +
# Adam checkpoint (~135 MB), by build/bench/checkpoint_bench. Both run in one invocation.
#
#   bench/checkpoint.sh [--repeats 5]
#
# The file:// target is a temporary directory under ${TMPDIR:-/tmp}; the S3 server keeps its
# objects in memory (so S3 numbers are HTTP, signing and the server's own work, on loopback).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BENCH=${BENCH_CHECKPOINT:-$ROOT/build/bench/checkpoint_bench}
REPEATS=5
while (($#)); do
  case $1 in
    --repeats) REPEATS=${2:?}; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "checkpoint.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[[ -x $BENCH ]] || { echo "checkpoint.sh: $BENCH is missing: build the project first" >&2; exit 2; }

TMP=$(mktemp -d "${TMPDIR:-/tmp}/checkpoint_bench.XXXXXX")
S3_SERVER_PID=
cleanup() { [[ -n $S3_SERVER_PID ]] && kill "$S3_SERVER_PID" 2>/dev/null; wait 2>/dev/null; rm -rf "$TMP"; }
trap cleanup EXIT

# shellcheck source=bench/s3_server.sh
source "$ROOT/bench/s3_server.sh"
start_s3_server "$TMP/s3.log" bench || exit 1
"$BENCH" --repeats "$REPEATS" "file://$TMP/file" "s3://bench/ckpt"
