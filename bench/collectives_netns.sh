#!/usr/bin/env bash
# The collectives sweep across two hosts: two network namespaces on a bridge (addresses from
# 198.18.0.0/15, the range reserved for benchmarking), one `trainyard run` agent in each with one
# rank, c10d rendezvous on the first; the ranks talk Gloo over the veth pair, as two machines would
# over their network. Needs root (ip netns). Everything it makes is removed on exit.
# Usage: bench/collectives_netns.sh [--ranks-per-node 1] [trainyard bench collectives flags...]
#   e.g. bench/collectives_netns.sh --min-bytes 64K --max-bytes 64M
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TRAINYARD=${TRAINYARD:-$ROOT/build/trainyard}
PER_NODE=1
if [[ ${1:-} == --ranks-per-node ]]; then PER_NODE=${2:?}; shift 2; fi
[[ -x $TRAINYARD ]] || { echo "collectives_netns.sh: build $TRAINYARD first" >&2; exit 2; }
[[ $(id -u) -eq 0 ]] || { echo "collectives_netns.sh: needs root for ip netns" >&2; exit 2; }

source "$ROOT/bench/netns.sh"
TAG=$$
NS=(tyc${TAG}a tyc${TAG}b)
ADDR=(198.18.214.1 198.18.214.2)
TMP=$(mktemp -d)
cleanup() {
  netns_down
  rm -rf "$TMP"
}
trap cleanup EXIT
netns_up tyc 198.18.214 "${NS[@]}"

for i in 1 0; do
  ip netns exec "${NS[$i]}" timeout 300 "$TRAINYARD" run --nnodes 2 --nproc-per-node "$PER_NODE" \
    --rdzv-backend c10d --rdzv-endpoint "${ADDR[0]}:29500" --rdzv-id coll --max-restarts 0 \
    -- "$TRAINYARD" bench collectives "$@" > "$TMP/node$i.log" 2>&1 &
done
status=0
wait || status=$?
grep '^\[rank0\]' "$TMP/node0.log" | sed 's/^\[rank0\]: //' || true
if [[ $status -ne 0 ]]; then
  echo "collectives_netns.sh: a node failed (exit $status); its logs:" >&2
  tail -n 20 "$TMP"/node*.log >&2
  exit 1
fi
