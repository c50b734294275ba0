# shellcheck shell=bash
# Hosts stood in for by network namespaces on one bridge, for the benchmarks that run across
# "machines" on one (sourced by bench/collectives_netns.sh and bench/scaling_netns.sh). Addresses
# come from 198.18.0.0/15, the range reserved for benchmarking; there is no route anywhere else.
# Needs root (ip netns).
#
#   trap netns_down EXIT
#   netns_up tyx 198.18.216 tyx$$a tyx$$b   # eth0 198.18.216.1 in tyx<pid>a, .2 in tyx<pid>b
#
# netns_up LINK_PREFIX SUBNET NAME...: one bridge, <LINK_PREFIX>b<pid>, and for the i-th NAME
#   (from 0) a namespace with lo up and eth0 at SUBNET.<i+1>/24, the peer of the veth
#   <LINK_PREFIX>v<pid>_<i> on the bridge. Fails (set -e) at the first step that does; what it
#   made by then is what netns_down removes.
# netns_down: kills every process in those namespaces (SIGKILL), deletes them and the bridge.
#   Never fails, so it can run from an EXIT trap after a partial netns_up, or before any.

NETNS_NAMES=()
NETNS_BRIDGE=

netns_up() {
  local link_prefix=$1 subnet=$2
  shift 2
  NETNS_NAMES=("$@")
  NETNS_BRIDGE=${link_prefix}b$$
  ip link add "$NETNS_BRIDGE" type bridge
  ip link set "$NETNS_BRIDGE" up
  local i
  for ((i = 0; i < ${#NETNS_NAMES[@]}; i++)); do
    ip netns add "${NETNS_NAMES[$i]}"
    ip link add "${link_prefix}v$$_$i" type veth peer name eth0 netns "${NETNS_NAMES[$i]}"
    ip link set "${link_prefix}v$$_$i" master "$NETNS_BRIDGE" up
    ip -n "${NETNS_NAMES[$i]}" addr add "$subnet.$((i + 1))/24" dev eth0
    ip -n "${NETNS_NAMES[$i]}" link set eth0 up
    ip -n "${NETNS_NAMES[$i]}" link set lo up
  done
}

netns_down() {
  local ns
  for ns in "${NETNS_NAMES[@]}"; do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
  done
  if [[ -n $NETNS_BRIDGE ]]; then ip link del "$NETNS_BRIDGE" 2>/dev/null || true; fi
}
