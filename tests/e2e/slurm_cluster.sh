#!/usr/bin/env bash
# A real Slurm cluster on one machine, for the Slurm tests and bench/engines.sh: Debian's slurmctld
# and one slurmd per "node", each node a network namespace (made by the caller) with its own host
# name and /etc/hosts, all authenticated by one munged with a fresh key. Everything the cluster
# writes (configuration, key, sockets, state, logs) stays under DIR; nothing system-wide is used.
# Needs root and slurm-wlm + munge (scripts/setup.sh).
#
#   slurm_cluster.sh up DIR NAMESPACE:ADDRESS...   # node01 in the first namespace, node02 ...;
#                                                  # the controller runs on node01
#   slurm_cluster.sh on DIR I COMMAND [ARG...]     # COMMAND on node I (from 1) as a login shell
#                                                  # there would run it (SLURM_CONF set)
#   slurm_cluster.sh down DIR                      # stops the daemons (the caller's namespaces
#                                                  # and what still runs in them are its own)
#
# `up` returns once every node is idle in sinfo (30 s at most, else it fails printing the logs).
# Nodes have one CPU each (SlurmdParameters=config_overrides), so one task per node, and are
# marked down after 10 s without an answer (SlurmdTimeout), as a lost machine is.
set -euo pipefail

die() { echo "slurm_cluster: $*" >&2; exit 1; }
usage="usage: slurm_cluster.sh up DIR NAMESPACE:ADDRESS... | on DIR I COMMAND... | down DIR"
[[ $# -ge 2 ]] || die "$usage"
verb=$1 dir=$2
shift 2

node_name() { printf 'node%02d' "$1"; }

# COMMAND in node I's network namespace, with its host name and /etc/hosts, as on that machine.
# (`ip netns exec` would also remount /sys, hiding the cgroup file systems slurmd needs.)
on_node() {
  local i=$1 ns
  shift
  ns=$(sed -n "${i}p" "$dir/namespaces")
  [[ -n $ns ]] || die "there is no node $i (see $dir/namespaces)"
  SLURM_CONF="$dir/slurm.conf" nsenter --net="/run/netns/$ns" unshare --uts --mount \
    sh -c 'mount --bind "$1" /etc/hosts && hostname "$2" && shift 2 && exec "$@"' \
    sh "$dir/hosts" "$(node_name "$i")" "$@"
}

case $verb in
up)
  [[ $# -ge 1 ]] || die "$usage"
  for tool in munged slurmctld slurmd sinfo nsenter unshare; do
    command -v "$tool" >/dev/null || die "$tool is missing: run scripts/setup.sh (slurm-wlm, munge)"
  done
  mkdir -p "$dir/state"
  chmod 755 "$dir"
  : >"$dir/namespaces"
  printf '127.0.0.1 localhost\n' >"$dir/hosts"
  nodes=""
  i=0
  for spec in "$@"; do
    i=$((i + 1))
    ns=${spec%%:*} addr=${spec#*:}
    echo "$ns" >>"$dir/namespaces"
    echo "$addr $(node_name $i)" >>"$dir/hosts"
    nodes+="NodeName=$(node_name $i) NodeAddr=$addr CPUs=1 RealMemory=2000 State=UNKNOWN"$'\n'
    mkdir -p "$dir/spool.$(node_name $i)"
  done
  count=$i
  first_addr=$(sed -n 2p "$dir/hosts" | cut -d' ' -f1)
  cat >"$dir/slurm.conf" <<EOF
ClusterName=trainyard-test
SlurmctldHost=$(node_name 1)($first_addr)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge.socket
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool.%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.%n.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
SwitchType=switch/none
MailProg=/bin/true
ReturnToService=2
SlurmdTimeout=10
KillWait=5
SlurmdParameters=config_overrides
$nodes
PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
  head -c 1024 /dev/urandom >"$dir/munge.key"
  chmod 400 "$dir/munge.key"
  # Each daemon in a session of its own: the caller may kill this script's process group.
  setsid munged --force --socket="$dir/munge.socket" --key-file="$dir/munge.key" \
    --pid-file="$dir/munged.pid" --log-file="$dir/munged.log" --seed-file="$dir/munged.seed"
  on_node 1 setsid slurmctld
  for ((i = 1; i <= count; i++)); do on_node "$i" setsid slurmd; done
  for ((t = 0; t < 150; t++)); do
    idle=$(on_node 1 sinfo --noheader --states=idle --format=%D 2>/dev/null || true)
    [[ ${idle:-0} == "$count" ]] && exit 0
    sleep 0.2
  done
  tail -n 20 "$dir"/*.log >&2
  die "the $count nodes were not idle within 30 s (logs above)"
  ;;
on)
  [[ $# -ge 2 ]] || die "$usage"
  on_node "$@"
  ;;
down)
  for pid_file in "$dir"/slurmd.*.pid "$dir/slurmctld.pid" "$dir/munged.pid"; do
    [[ -f $pid_file ]] && kill "$(cat "$pid_file")" 2>/dev/null || true
  done
  ;;
*) die "$usage" ;;
esac
