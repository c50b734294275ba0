# shellcheck shell=bash
# bench/s3_server.sh: an S3 endpoint on 127.0.0.1 for the benchmarks (checkpoint.sh, outages.sh):
# moto's server with signature checking, as the S3 tests run it (tests/multiproc/python/
# s3_server.py, from the venv scripts/setup.sh makes). Source it, then
#   start_s3_server LOG BUCKET
# starts it with BUCKET made, waits until it serves, exports the AWS_* variables an AWS SDK and
# trainyard read to reach it, and sets S3_SERVER_PID (kill it when done). Objects live in memory.

S3_SERVER_PYTHON=${BENCH_PYTHON:-/opt/trainyard/venv/bin/python}

start_s3_server() {
  local log=$1 bucket=$2 line=
  local root
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  "$S3_SERVER_PYTHON" -c 'import moto.server, boto3' 2>/dev/null \
    || { echo "$S3_SERVER_PYTHON cannot import moto's server: run scripts/setup.sh" >&2; return 2; }
  "$S3_SERVER_PYTHON" "$root/tests/multiproc/python/s3_server.py" "$bucket" >"$log" 2>&1 &
  S3_SERVER_PID=$!
  for _ in $(seq 300); do
    line=$(grep -m1 '^listening on ' "$log" || true)
    [[ -n $line ]] && break
    kill -0 "$S3_SERVER_PID" 2>/dev/null || break
    sleep 0.1
  done
  [[ -n $line ]] || { echo "the S3 server did not start:" >&2; cat "$log" >&2; return 1; }
  read -r _ _ AWS_ENDPOINT_URL_S3 AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY <<<"$line"
  export AWS_ENDPOINT_URL_S3 AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY AWS_REGION=us-east-1
}
