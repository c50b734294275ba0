#!/usr/bin/env bash
# dead_node.sh — how long the agents take to notice a node that went silent, with default
# rendezvous settings (keep_alive_interval 5 s x keep_alive_max_attempt 3).
#
# Two agents on loopback meet over c10d (node 0 serves the store) with --nnodes 1:2 and ranks
# that sleep, so no collective can notice anything: only the rendezvous heartbeats can. Once
# both run, node 1 (its agent and its rank) gets SIGSTOP (frozen or cut off: silent, sockets
# open) or SIGKILL (gone); the script reports the seconds until node 0's agent ends the round
# ("Membership changed") and until its new round of world size 1 is complete. (A node whose
# training ranks die is noticed sooner, by the collective that fails: see recovery.sh.)
#
#   bench/dead_node.sh                       # SIGSTOP and SIGKILL, 2 repeats each
#   bench/dead_node.sh --signals STOP --repeats 3 --rdzv-conf keep_alive_interval=1
#
# Flags (environment variable, default):
#   --signals "STOP KILL"  BENCH_SIGNALS    "STOP KILL"
#   --repeats K            BENCH_REPEATS    2
#   --rdzv-conf CONF       BENCH_RDZV_CONF  "" (the defaults)
#   --keep                 keep the temporary folder (logs)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TRAINYARD=${BENCH_TRAINYARD:-$ROOT/build/trainyard}
SIGNALS=${BENCH_SIGNALS:-STOP KILL}
REPEATS=${BENCH_REPEATS:-2}
CONF=${BENCH_RDZV_CONF:-}
KEEP=0
die() { echo "dead_node.sh: error: $*" >&2; exit 2; }
while (($#)); do
  case $1 in
    --signals) SIGNALS=${2:?}; shift 2 ;;
    --repeats) REPEATS=${2:?}; shift 2 ;;
    --rdzv-conf) CONF=${2:?}; shift 2 ;;
    --keep) KEEP=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
[[ -x $TRAINYARD ]] || die "$TRAINYARD is missing: build the project first (cmake --build build)."
[[ $REPEATS =~ ^[1-9][0-9]*$ ]] || die "--repeats must be a positive integer, got '$REPEATS'"
conf=()
[[ -z $CONF ]] || conf=(--rdzv-conf "$CONF")

TMP=$(mktemp -d "${TMPDIR:-/tmp}/dead_node_bench.XXXXXX")
cleanup() {
  jobs -p | xargs -r -n1 sh -c 'kill -CONT -- -$0; kill -KILL -- -$0' 2>/dev/null
  wait 2>/dev/null
  if ((KEEP)); then echo "logs kept in $TMP" >&2; else rm -rf "$TMP"; fi
}
trap cleanup EXIT
set -m  # each agent in a process group of its own: the signal reaches the agent and its rank

now() { date +%s.%N; }
# wait_for FILE TEXT SECONDS
wait_for() {
  local deadline=$((SECONDS + $3))
  until grep -q -- "$2" "$1" 2>/dev/null; do
    ((SECONDS < deadline)) || return 1
    sleep 0.05
  done
}
port=$("${PYTHON:-/usr/bin/python3}" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')

echo "signal  run  ended_round_s  alone_running_s"
for sig in $SIGNALS; do
  for ((i = 1; i <= REPEATS; i++)); do
    log=$TMP/$sig-$i
    agent() {
      "$TRAINYARD" run --nnodes 1:2 --nproc-per-node 1 --rdzv-backend c10d \
        --rdzv-endpoint "127.0.0.1:$port" --rdzv-id "dead-$sig-$i" "${conf[@]}" -- \
        /bin/sh -c 'echo "running at world size $WORLD_SIZE"; exec sleep 600' >"$1" 2>&1 &
    }
    agent "$log.node0"
    n0=$!
    wait_for "$log.node0" "Serving the rendezvous store" 30 || die "node 0 did not start; see $log.node0"
    agent "$log.node1"
    n1=$!
    wait_for "$log.node0" "running at world size 2" 90 || die "no round of 2; see $log.node*"
    wait_for "$log.node1" "running at world size 2" 90 || die "no round of 2; see $log.node*"
    t0=$(now)
    kill -"$sig" -- -"$n1"
    wait_for "$log.node0" "Membership changed" 120 || die "node 0 never noticed; see $log.node0"
    t1=$(now)
    wait_for "$log.node0" "running at world size 1" 120 || die "node 0 never went on alone; see $log.node0"
    t2=$(now)
    printf '%6s  %3d  %13.2f  %15.2f\n' "$sig" "$i" "$(awk "BEGIN{print $t1 - $t0}")" \
      "$(awk "BEGIN{print $t2 - $t0}")"
    for pgid in $n0 $n1; do kill -CONT -- -"$pgid" 2>/dev/null; kill -KILL -- -"$pgid" 2>/dev/null; done
    wait 2>/dev/null || true
  done
done
