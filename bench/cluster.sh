#!/usr/bin/env bash
# cluster.sh — a standing cluster on loopback, with the real binaries (issue 11):
#
#   submit  the seconds from just before `trainyard submit --no-wait --nodes 2` to each rank's
#           start, on a head with --num-cpus 0 and 2 workers; every rank's entrypoint writes
#           `date +%s.%N` to a file first; each submit waits a random 0-2 s first (a random
#           phase against the heartbeats that bring workers their assignments). Also the
#           seconds `submit` itself took.
#   dead    the seconds from `kill -9` of a worker (its process group: the worker and nothing
#           else, it runs no job) until GET /api/cluster/status calls its node "suspect" and
#           "dead", polled every 50 ms with curl, at each --heartbeat-interval/--dead-after pair.
#
#   bench/cluster.sh                                  # submit x10, dead 2/10 x3 and 0.5/3 x5
#   bench/cluster.sh --parts submit --repeats 20
#
# Flags (environment variable, default):
#   --parts "submit dead"  BENCH_PARTS       "submit dead"
#   --repeats K            BENCH_REPEATS     10 (submit runs)
#   --dead-settings LIST   BENCH_DEAD        "2/10/3 0.5/3/5" (interval/dead-after/repeats ...)
#   --keep                 keep the temporary folder (logs, state dirs)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TRAINYARD=${BENCH_TRAINYARD:-$ROOT/build/trainyard}
PARTS=${BENCH_PARTS:-submit dead}
REPEATS=${BENCH_REPEATS:-10}
DEAD=${BENCH_DEAD:-2/10/3 0.5/3/5}
KEEP=0
die() { echo "cluster.sh: error: $*" >&2; exit 2; }
while (($#)); do
  case $1 in
    --parts) PARTS=${2:?}; shift 2 ;;
    --repeats) REPEATS=${2:?}; shift 2 ;;
    --dead-settings) DEAD=${2:?}; shift 2 ;;
    --keep) KEEP=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
[[ -x $TRAINYARD ]] || die "$TRAINYARD is missing: build the project first (cmake --build build)."
[[ $REPEATS =~ ^[1-9][0-9]*$ ]] || die "--repeats must be a positive integer, got '$REPEATS'"
for tool in curl jq; do command -v $tool >/dev/null || die "$tool is needed (apt-get install $tool)."; done

TMP=$(mktemp -d "${TMPDIR:-/tmp}/cluster_bench.XXXXXX")
PIDS=()  # the daemons started, each the leader of its process group
stop_all() {
  local pid
  for pid in "${PIDS[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  PIDS=()
}
cleanup() {
  stop_all
  if ((KEEP)); then echo "logs kept in $TMP" >&2; else rm -rf "$TMP"; fi
}
trap cleanup EXIT
set -m  # each daemon in a process group of its own

now() { date +%s.%N; }
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
umask 077
head -c 24 /dev/urandom | base64 >"$TMP/token"
chmod 600 "$TMP/token"
TOKEN=$(cat "$TMP/token")

# api PATH: GET from the head at $ADDR.
api() { curl -sf -m 2 -H "Authorization: Bearer $TOKEN" "http://$ADDR$1"; }
# start_head NAME ARGS...: a head on a free port, --num-cpus 0; sets ADDR, HEAD_PID.
start_head() {
  local name=$1; shift
  ADDR=127.0.0.1:$(free_port)
  "$TRAINYARD" head --port "${ADDR#*:}" --token-file "$TMP/token" --state-dir "$TMP/$name" \
    --num-cpus 0 "$@" >"$TMP/$name.log" 2>&1 &
  HEAD_PID=$!
  PIDS+=("$HEAD_PID")
  local deadline=$((SECONDS + 30))
  until api /api/version >/dev/null; do
    ((SECONDS < deadline)) || die "the head did not serve in 30 s; see $TMP/$name.log"
    sleep 0.05
  done
}
# start_worker NAME: a worker of the head at $ADDR; sets WORKER_PID and WORKER_NODE once alive.
start_worker() {
  local name=$1
  "$TRAINYARD" worker --head "$ADDR" --token-file "$TMP/token" --state-dir "$TMP/$name" \
    >"$TMP/$name.log" 2>&1 &
  WORKER_PID=$!
  PIDS+=("$WORKER_PID")
  local deadline=$((SECONDS + 30))
  until [[ -s $TMP/$name/node_id ]] && [[ $(node_state "$(cat "$TMP/$name/node_id")") == alive ]]; do
    ((SECONDS < deadline)) || die "worker $name did not register in 30 s; see $TMP/$name.log"
    sleep 0.05
  done
  WORKER_NODE=$(tr -d '[:space:]' <"$TMP/$name/node_id")
}
node_state() {
  api /api/cluster/status | jq -r --arg id "$1" '.nodes[] | select(.node_id == $id) | .state'
}
stats() {  # stats < numbers: "median max" (3 decimals)
  sort -g | awk '{v[NR]=$1} END {m = NR % 2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2;
    printf "%.3f %.3f\n", m, v[NR]}'
}

# --- submit to all ranks running, 2 nodes x 1 rank --------------------------------------------
if [[ " $PARTS " == *" submit "* ]]; then
  start_head head-submit
  start_worker w1
  start_worker w2
  export TRAINYARD_ADDRESS=$ADDR
  echo "submit: 2 workers (1 rank each), head --num-cpus 0; seconds from before submit"
  printf '%-4s %10s %10s %10s %10s\n' run submit_s rank0_s rank1_s all_s
  : >"$TMP/submit.all"
  : >"$TMP/submit.cli"
  for ((i = 1; i <= REPEATS; i++)); do
    d=$TMP/run$i
    mkdir -p "$d"
    # a random phase against the workers' heartbeats (which bring them their assignments)
    sleep "$(awk -v r="$RANDOM" 'BEGIN {printf "%.3f", 2 * r / 32768}')"
    t0=$(now)
    "$TRAINYARD" submit --token-file "$TMP/token" --no-wait --nodes 2 --submission-id "bench-$i" -- \
      sh -c "date +%s.%N > $d/start.\$RANK; sleep 1" >"$d/submit.out" 2>&1
    t1=$(now)
    deadline=$((SECONDS + 60))
    until [[ -s $d/start.0 && -s $d/start.1 ]]; do
      ((SECONDS < deadline)) || die "run $i: the ranks did not start in 60 s; see $TMP"
      sleep 0.01
    done
    sleep 0.05
    read -r s0 <"$d/start.0"
    read -r s1 <"$d/start.1"
    row=$(awk -v t0="$t0" -v t1="$t1" -v a="$s0" -v b="$s1" \
      'BEGIN {m = a > b ? a : b; printf "%.3f %.3f %.3f %.3f", t1-t0, a-t0, b-t0, m-t0}')
    read -r sub r0 r1 all <<<"$row"
    printf '%-4s %10s %10s %10s %10s\n' "$i" "$sub" "$r0" "$r1" "$all"
    echo "$all" >>"$TMP/submit.all"
    echo "$sub" >>"$TMP/submit.cli"
    # the next run starts on idle nodes
    deadline=$((SECONDS + 60))
    until [[ $(api "/api/jobs/bench-$i" | jq -r .status) == SUCCEEDED ]]; do
      ((SECONDS < deadline)) || die "run $i did not succeed in 60 s; see $TMP"
      sleep 0.1
    done
  done
  read -r med max < <(stats <"$TMP/submit.all")
  read -r cmed cmax < <(stats <"$TMP/submit.cli")
  echo "submit -> all ranks running: median $med s, max $max s ($REPEATS runs);" \
    "the submit command: median $cmed s, max $cmax s"
  stop_all
  echo
fi

# --- a killed worker's node declared dead -------------------------------------------------------
if [[ " $PARTS " == *" dead "* ]]; then
  echo "dead: kill -9 of a worker; seconds until GET /api/cluster/status says suspect, dead"
  printf '%-10s %-10s %-4s %10s %10s\n' interval dead_after run suspect_s dead_s
  summary=()
  for setting in $DEAD; do
    IFS=/ read -r hb da reps <<<"$setting"
    start_head "head-dead-$hb" --heartbeat-interval "$hb" --dead-after "$da"
    : >"$TMP/dead.$hb"
    for ((i = 1; i <= reps; i++)); do
      rm -rf "$TMP/wd"
      start_worker wd
      # a random phase against the heartbeats, as a real failure would have
      sleep "$(awk -v hb="$hb" -v r="$RANDOM" 'BEGIN {printf "%.3f", 1 + hb * r / 32768}')"
      kill -KILL -- "-$WORKER_PID"
      t0=$(now)
      wait "$WORKER_PID" 2>/dev/null || true
      suspect=""
      deadline=$((SECONDS + da * 3 + 10))
      while :; do
        s=$(node_state "$WORKER_NODE")
        t=$(now)
        [[ -z $suspect && $s == suspect ]] && suspect=$(awk -v a="$t" -v b="$t0" 'BEGIN {printf "%.3f", a-b}')
        [[ $s == dead ]] && break
        ((SECONDS < deadline)) || die "the node was not declared dead in time; see $TMP"
        sleep 0.05
      done
      dead=$(awk -v a="$t" -v b="$t0" 'BEGIN {printf "%.3f", a-b}')
      printf '%-10s %-10s %-4s %10s %10s\n' "$hb" "$da" "$i" "${suspect:--}" "$dead"
      echo "$dead" >>"$TMP/dead.$hb"
    done
    read -r med max < <(stats <"$TMP/dead.$hb")
    summary+=("--heartbeat-interval $hb --dead-after $da: median $med s, max $max s ($reps runs)")
    stop_all
  done
  printf 'dead detected: %s\n' "${summary[@]}"
fi
