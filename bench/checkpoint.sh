#!/usr/bin/env bash
# checkpoint.sh — checkpoint write/read throughput to a local directory (file://) and to S3 (a
# local s3rver, the npm package scripts/setup.sh installs), with the recipe's real ResNet-18 +
# Adam checkpoint (~135 MB), by build/bench/checkpoint_bench. Both run in one invocation.
#
#   bench/checkpoint.sh [--repeats 5]
#
# The file:// target is a temporary directory under ${TMPDIR:-/tmp}; s3rver keeps its objects in
# another temporary directory (so S3 numbers include s3rver's own disk writes, on loopback).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BENCH=${BENCH_CHECKPOINT:-$ROOT/build/bench/checkpoint_bench}
S3RVER=${BENCH_S3RVER:-/opt/trainyard/node/node_modules/.bin/s3rver}
REPEATS=5
while (($#)); do
  case $1 in
    --repeats) REPEATS=${2:?}; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "checkpoint.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[[ -x $BENCH ]] || { echo "checkpoint.sh: $BENCH is missing: build the project first" >&2; exit 2; }
[[ -x $S3RVER ]] || { echo "checkpoint.sh: $S3RVER is missing: run scripts/setup.sh" >&2; exit 2; }

TMP=$(mktemp -d "${TMPDIR:-/tmp}/checkpoint_bench.XXXXXX")
s3pid=
cleanup() { [[ -n $s3pid ]] && kill "$s3pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$TMP"; }
trap cleanup EXIT

# s3rver prints "listening on 127.0.0.1:PORT" once it serves the bucket.
NODE_OPTIONS=--openssl-legacy-provider "$S3RVER" --directory "$TMP/s3" --address 127.0.0.1 \
  --port 0 --configure-bucket bench >"$TMP/s3rver.log" 2>&1 &
s3pid=$!
for _ in $(seq 100); do
  port=$(grep -o 'listening on [^ ]*' "$TMP/s3rver.log" | sed 's/.*://' || true)
  [[ -n $port ]] && break
  sleep 0.1
done
[[ -n ${port:-} ]] || { echo "checkpoint.sh: s3rver did not start:" >&2; cat "$TMP/s3rver.log" >&2; exit 1; }

AWS_ACCESS_KEY_ID=S3RVER AWS_SECRET_ACCESS_KEY=S3RVER AWS_REGION=us-east-1 \
AWS_ENDPOINT_URL_S3=http://127.0.0.1:$port \
  "$BENCH" --repeats "$REPEATS" "file://$TMP/file" "s3://bench/ckpt"
