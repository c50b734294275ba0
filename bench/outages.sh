#!/usr/bin/env bash
# outages.sh — which etcd and S3 outages a job rides out with default settings.
#
# etcd: two agents on loopback meet through a real etcd (--rdzv-backend etcd, --max-restarts 0)
#   and run ranks that sleep; once they run, etcd is killed, and started again on the same data
#   and ports after each outage in --etcd-outages. Ridden out: both agents exit 0 with no restart.
# S3: the recipe (2 ranks, --max-restarts 0) checkpoints every step to a local S3 server, which is
#   frozen (SIGSTOP: requests hang, the harder case) for each outage in --s3-outages and then
#   continued. Ridden out: the job finishes.
# Each line gives the outage, the outcome and the job's wall time; the job's log shows the
# warnings it printed meanwhile (--keep keeps them).
#
#   bench/outages.sh                                  # etcd 20 45 75 s, S3 20 45 75 s
#   bench/outages.sh --etcd-outages "30" --s3-outages ""
#
# Flags (environment variable, default):
#   --etcd-outages "S ..."  BENCH_ETCD_OUTAGES  "20 45 75"
#   --s3-outages "S ..."    BENCH_S3_OUTAGES    "20 45 75"
#   --keep                  keep the temporary folder (logs)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TRAINYARD=${BENCH_TRAINYARD:-$ROOT/build/trainyard}
ETCD=${BENCH_ETCD:-/usr/bin/etcd}
ETCD_OUTAGES=${BENCH_ETCD_OUTAGES-20 45 75}
S3_OUTAGES=${BENCH_S3_OUTAGES-20 45 75}
KEEP=0
die() { echo "outages.sh: error: $*" >&2; exit 2; }
while (($#)); do
  case $1 in
    --etcd-outages) ETCD_OUTAGES=${2?}; shift 2 ;;
    --s3-outages) S3_OUTAGES=${2?}; shift 2 ;;
    --keep) KEEP=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
[[ -x $TRAINYARD ]] || die "$TRAINYARD is missing: build the project first (cmake --build build)."
[[ -z $ETCD_OUTAGES || -x $ETCD ]] || die "$ETCD is missing: run scripts/setup.sh"

TMP=$(mktemp -d "${TMPDIR:-/tmp}/outages_bench.XXXXXX")
server=
cleanup() {
  [[ -n $server ]] && kill -CONT "$server" 2>/dev/null && kill "$server" 2>/dev/null
  jobs -p | xargs -r kill 2>/dev/null
  wait 2>/dev/null
  if ((KEEP)); then echo "logs kept in $TMP" >&2; else rm -rf "$TMP"; fi
}
trap cleanup EXIT

free_port() { "${PYTHON:-/usr/bin/python3}" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# wait_for FILE TEXT SECONDS
wait_for() {
  local deadline=$((SECONDS + $3))
  until grep -q -- "$2" "$1" 2>/dev/null; do
    ((SECONDS < deadline)) || return 1
    sleep 0.1
  done
}

start_etcd() {  # data dir, client port, peer port
  "$ETCD" --name bench --data-dir "$1" --listen-client-urls "http://127.0.0.1:$2" \
    --advertise-client-urls "http://127.0.0.1:$2" --listen-peer-urls "http://127.0.0.1:$3" \
    --initial-advertise-peer-urls "http://127.0.0.1:$3" \
    --initial-cluster "bench=http://127.0.0.1:$3" >>"$1.log" 2>&1 &
  server=$!
  local deadline=$((SECONDS + 20))
  until curl -sf "http://127.0.0.1:$2/health" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || die "etcd did not start; see $1.log"
    sleep 0.1
  done
}

echo "outage_s  backend  outcome      job_s"
for outage in $ETCD_OUTAGES; do
  dir=$TMP/etcd-$outage
  client=$(free_port); peer=$(free_port)
  start_etcd "$dir" "$client" "$peer"
  start=$SECONDS
  # The ranks sleep through the outage and a little more; they need no etcd while they run.
  agents=()
  for node in 0 1; do
    "$TRAINYARD" run --nnodes 2 --nproc-per-node 1 --rdzv-backend etcd \
      --rdzv-endpoint "127.0.0.1:$client" --rdzv-id "outage-$outage" --max-restarts 0 -- \
      /bin/sh -c "echo started; sleep $((outage + 15))" >"$dir.node$node.log" 2>&1 &
    agents+=($!)
  done
  wait_for "$dir.node1.log" "]: started" 60 || die "the agents did not start; see $dir.node*.log"
  wait_for "$dir.node0.log" "]: started" 60 || die "the agents did not start; see $dir.node*.log"
  kill "$server"; wait "$server" 2>/dev/null || true; server=
  sleep "$outage"
  start_etcd "$dir" "$client" "$peer"
  ok=1
  for agent in "${agents[@]}"; do wait "$agent" || ok=0; done
  grep -q "Worker group FAILED\|restart_count=1\|Stopping the worker group" \
    "$dir.node0.log" "$dir.node1.log" && ok=0
  printf '%8s  %-7s  %-11s  %5s\n' "$outage" etcd "$( ((ok)) && echo ridden-out || echo job-failed)" \
    "$((SECONDS - start))"
  kill "$server"; wait "$server" 2>/dev/null || true; server=
done

if [[ -n $S3_OUTAGES ]]; then
  # shellcheck source=bench/s3_server.sh
  source "$ROOT/bench/s3_server.sh"
  start_s3_server "$TMP/s3.log" bench || die "the S3 server did not start; see $TMP/s3.log"
  server=$S3_SERVER_PID
fi
for outage in $S3_OUTAGES; do
  log=$TMP/s3-$outage.log
  start=$SECONDS
  TRAINYARD_LOG_LEVEL=debug "$TRAINYARD" train fashion-mnist --workers 2 --threads 1 --epochs 1 \
    --batch-size 64 --limit 3840 --checkpoint-every 1 --num-to-keep 2 --max-restarts 0 \
    --storage s3://bench/runs --name "outage-$outage" --no-progress >"$log" 2>&1 &
  job=$!
  wait_for "$log" "train\] step 3 done" 120 || die "the job did not reach step 3; see $log"
  kill -STOP "$server"
  sleep "$outage"
  kill -CONT "$server"
  ok=1
  wait "$job" || ok=0
  printf '%8s  %-7s  %-11s  %5s\n' "$outage" S3 "$( ((ok)) && echo ridden-out || echo job-failed)" \
    "$((SECONDS - start))"
done
