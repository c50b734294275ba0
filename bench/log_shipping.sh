#!/usr/bin/env bash
# log_shipping.sh — how fast a job's lines reach the head, and how long an ended job stays
# RUNNING (holding its CPUs) after its ranks exit (Note [A job ends before its logs]).
#
# A head (--num-cpus 0) and one worker on loopback; a one-rank job prints --lines lines with
# `seq` and records when it started and ended. A poller reads the job every 50 ms: when its state
# became SUCCEEDED, when the head held every line (trainyard.logs_complete; a head without the
# field holds them all when the job ends). With --baseline BIN the same runs with another build
# of trainyard (e.g. one from before the change) and the ratios are printed, measured side by side.
#
#   bench/log_shipping.sh                                   # 500,000 lines, this build
#   bench/log_shipping.sh --baseline /tmp/old/build/trainyard --lines 500000
#
# Flags (environment variable, default):
#   --lines N        BENCH_LINES      500000
#   --baseline BIN   BENCH_BASELINE   (none)
#   --keep           keep the temporary folder (logs)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TRAINYARD=${BENCH_TRAINYARD:-$ROOT/build/trainyard}
LINES=${BENCH_LINES:-500000}
BASELINE=${BENCH_BASELINE:-}
PYTHON=${PYTHON:-/usr/bin/python3}
KEEP=0
die() { echo "log_shipping.sh: error: $*" >&2; exit 2; }
while (($#)); do
  case $1 in
    --lines) LINES=${2?}; shift 2 ;;
    --baseline) BASELINE=${2?}; shift 2 ;;
    --keep) KEEP=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
[[ $LINES =~ ^[1-9][0-9]*$ ]] || die "--lines must be a whole number >= 1, got '$LINES'"
[[ -x $TRAINYARD ]] || die "$TRAINYARD is missing: build the project first (scripts/build.sh)."
[[ -z $BASELINE || -x $BASELINE ]] || die "--baseline $BASELINE is not an executable"

TMP=$(mktemp -d "${TMPDIR:-/tmp}/log_shipping_bench.XXXXXX")
cleanup() {
  jobs -p | xargs -r kill 2>/dev/null
  wait 2>/dev/null
  if ((KEEP)); then echo "logs kept in $TMP" >&2; else rm -rf "$TMP"; fi
}
trap cleanup EXIT

free_port() { "$PYTHON" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# measure NAME BIN: prints "NAME lines run_s state_lag_s logs_lag_s lines_per_s"
measure() {
  local name=$1 bin=$2 dir=$TMP/$1 port
  mkdir -p "$dir"
  port=$(free_port)
  "$PYTHON" -c 'import secrets; print(secrets.token_hex(32))' > "$dir/token"
  chmod 600 "$dir/token"
  "$bin" head --port "$port" --num-cpus 0 --token-file "$dir/token" --state-dir "$dir/head" \
    > "$dir/head.log" 2>&1 &
  local head=$!
  "$bin" worker --head "127.0.0.1:$port" --num-cpus 2 --token-file "$dir/token" \
    --state-dir "$dir/worker" > "$dir/worker.log" 2>&1 &
  local worker=$!
  export TRAINYARD_ADDRESS="http://127.0.0.1:$port" TRAINYARD_TOKEN
  TRAINYARD_TOKEN=$(cat "$dir/token")
  local tries=0
  until "$bin" status > /dev/null 2>&1; do
    ((++tries < 100)) || die "$name: the head did not answer; see $dir/head.log"
    sleep 0.1
  done
  "$bin" submit --no-wait --submission-id "lines-$name" -- \
    sh -c "date +%s.%N > '$dir/ranks_started'; seq 1 $LINES; date +%s.%N > '$dir/ranks_ended'" \
    > /dev/null
  "$PYTHON" - "$port" "$dir" "$LINES" "$name" <<'EOF'
import json, os, sys, time, urllib.request
port, folder, lines, name = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
token = os.environ["TRAINYARD_TOKEN"]
url = f"http://127.0.0.1:{port}/api/jobs/lines-{name}"
def job():
    req = urllib.request.Request(url, headers={"Authorization": "Bearer " + token})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.load(r)
start = time.time()
ended = complete = None
while complete is None:
    if time.time() - start > 1800:
        sys.exit(f"{name}: the job did not end with all its logs within 30 minutes")
    j = job()
    now = time.time()
    if ended is None and j["status"] in ("SUCCEEDED", "FAILED", "STOPPED"):
        if j["status"] != "SUCCEEDED":
            sys.exit(f"{name}: the job {j['status']}: {j.get('message')}")
        ended = now
    if ended is not None and j.get("trainyard", {}).get("logs_complete", True):
        complete = now
    time.sleep(0.05)
def when(file):
    with open(os.path.join(folder, file)) as f:
        return float(f.read())
started, ranks_ended = when("ranks_started"), when("ranks_ended")
print(f"{name} {lines} {ranks_ended - started:.2f} {ended - ranks_ended:.2f} "
      f"{complete - ranks_ended:.2f} {lines / (complete - started):.0f}")
EOF
  kill "$worker" "$head" 2>/dev/null
  wait "$worker" "$head" 2>/dev/null || true
}

{
  measure this "$TRAINYARD"
  [[ -z $BASELINE ]] || measure baseline "$BASELINE"
} > "$TMP/rows"
# lines/s: the lines over the time from the ranks' start until the head held them all.
printf '%-9s %10s %12s %22s %21s %12s\n' build lines "ranks' run s" "ranks' end->SUCCEEDED s" \
  "ranks' end->all logs s" "lines/s"
while read -r name lines run lag logs rate; do
  printf '%-9s %10s %12s %22s %21s %12s\n' "$name" "$lines" "$run" "$lag" "$logs" "$rate"
done < "$TMP/rows"
if [[ -n $BASELINE ]]; then
  read -r _ _ _ lag_a logs_a rate_a < <(sed -n 1p "$TMP/rows")
  read -r _ _ _ lag_b logs_b rate_b < <(sed -n 2p "$TMP/rows")
  "$PYTHON" -c "import sys; a, b = map(float, sys.argv[1:3]); print(f'lines/s: this build is {a / b:.1f}x the baseline')" "$rate_a" "$rate_b"
  echo "an ended job's state: ${lag_a} s after its ranks here, ${lag_b} s in the baseline"
fi
