#!/usr/bin/env bash
# The fashion-mnist scaling chart across nodes: three network namespaces on a bridge (addresses
# from 198.18.0.0/15, the range reserved for benchmarking; no route anywhere else), and
# `trainyard bench scaling --nodes-via` running the recipe at 1, 2 and 3 nodes of one rank each
# (one agent per namespace, c10d rendezvous served by node 0's agent, Gloo between the ranks), the
# all_reduce bus bandwidth measured between two of them, the model's prediction at 4, 8 and 16
# nodes. One LibTorch thread per rank. Needs root (ip netns). Everything it makes is removed on
# exit, on failure too; the results stay in OUT.
# Usage: bench/scaling_netns.sh [--out DIR] [--limit SAMPLES] [--nodes N]
#   e.g. sudo bench/scaling_netns.sh --out /tmp/scaling-netns --limit 6144
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TRAINYARD=${TRAINYARD:-$ROOT/build/trainyard}
OUT=/tmp/scaling-netns
LIMIT=6144  # samples in the epoch, split among the ranks: 48 steps of 128 at 1 node
NODES=3
while [[ $# -gt 0 ]]; do
  case $1 in
    --out) OUT=${2:?--out needs a folder}; shift 2 ;;
    --limit) LIMIT=${2:?--limit needs a number of samples}; shift 2 ;;
    --nodes) NODES=${2:?--nodes needs a number}; shift 2 ;;
    *) echo "scaling_netns.sh: unknown argument '$1'. Usage: $0 [--out DIR] [--limit N] [--nodes N]" >&2
       exit 2 ;;
  esac
done
[[ -x $TRAINYARD ]] || { echo "scaling_netns.sh: build $TRAINYARD first (or set TRAINYARD)" >&2; exit 2; }
[[ $(id -u) -eq 0 ]] || {
  echo "scaling_netns.sh: needs root to create network namespaces (ip netns); run it with sudo" >&2
  exit 2
}
[[ $NODES =~ ^[1-9]$ ]] || { echo "scaling_netns.sh: --nodes must be 1..9, got '$NODES'" >&2; exit 2; }

source "$ROOT/bench/netns.sh"
TAG=$$
PREFIX=tys${TAG}n  # namespaces tys<pid>n0, n1, ...
NS=()
for ((i = 0; i < NODES; i++)); do NS+=("$PREFIX$i"); done
trap netns_down EXIT
trap 'exit 130' INT TERM
netns_up tys 198.18.215 "${NS[@]}"

SIZES=$(seq -s, 1 "$NODES")
# In a subshell so that only this command is traced: the exact command, for the record.
(set -x; timeout 1800 "$TRAINYARD" bench scaling --world-sizes "$SIZES" \
  --nodes-via "ip netns exec $PREFIX{node}" --rdzv-endpoint 198.18.215.1:29400 \
  --measure-busbw --predict 4,8,16 --timeout 600 --out "$OUT" \
  -- train fashion-mnist --epochs 1 --limit "$LIMIT" --batch-size 128 --threads 1 --no-progress)
