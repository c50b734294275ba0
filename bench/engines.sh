#!/usr/bin/env bash
# engines.sh — how long the same 2-node job takes to reach its first training step under each
# way of launching it, on two network-namespace hosts (198.18.217.1-2) of this machine:
#
#   slurm       from just before `sbatch deploy/slurm/fashion-mnist.sbatch` on a real Slurm
#               (slurmctld + a slurmd per host, tests/e2e/slurm_cluster.sh) to rank 0's first step
#   trainer-v2  from starting both "pods" (trainjob.yaml's command with exactly the PET_* variables
#               Kubeflow Trainer v2 sets, pod names in /etc/hosts) to rank 0's first step
#   cluster     from just before `trainyard submit --nodes 2` to a head with a worker per host to
#               rank 0's first step
#
# The job: `trainyard train fashion-mnist --epochs 1 --limit 512 --batch-size 64 --threads 1`,
# 1 rank per node; "first step" is rank 0's `step 1 done` (TRAINYARD_LOG_LEVEL=debug), so every
# figure includes starting the ranks, loading the data and building the model, which are the
# same under each engine; the differences are the engines' own. Needs root.
#
#   bench/engines.sh                       # each engine 3 times, interleaved
#   bench/engines.sh --repeats 5 --engines "slurm cluster"
#
# Flags (environment variable, default):
#   --repeats K        BENCH_REPEATS   3
#   --engines LIST     BENCH_ENGINES   "slurm trainer-v2 cluster"
#   --keep             keep the temporary folder (logs, Slurm's state)
set -euo pipefail
shopt -s inherit_errexit

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TRAINYARD=${BENCH_TRAINYARD:-$ROOT/build/trainyard}
REPEATS=${BENCH_REPEATS:-3}
ENGINES=${BENCH_ENGINES:-slurm trainer-v2 cluster}
KEEP=0
die() { echo "engines.sh: error: $*" >&2; exit 2; }
while (($#)); do
  case $1 in
    --repeats) REPEATS=${2:?}; shift 2 ;;
    --engines) ENGINES=${2:?}; shift 2 ;;
    --keep) KEEP=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
[[ -x $TRAINYARD ]] || die "$TRAINYARD is missing: build the project first (cmake --build build)."
[[ $REPEATS =~ ^[1-9][0-9]*$ ]] || die "--repeats must be a positive integer, got '$REPEATS'"
for e in $ENGINES; do
  [[ $e == slurm || $e == trainer-v2 || $e == cluster ]] ||
    die "unknown engine '$e': slurm, trainer-v2 or cluster"
done
[[ $(id -u) -eq 0 ]] || die "network namespaces need root"

# shellcheck source=bench/netns.sh
. "$ROOT/bench/netns.sh"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/engines_bench.XXXXXX")
SLURM=$ROOT/tests/e2e/slurm_cluster.sh
NS=(tye$$a tye$$b)
ADDR=(198.18.217.1 198.18.217.2)
DAEMONS=()
cleanup() {
  [[ -f $TMP/slurm/slurm.conf ]] && "$SLURM" down "$TMP/slurm" || true
  local pid
  for pid in "${DAEMONS[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done
  for pid in "${DAEMONS[@]}"; do wait "$pid" 2>/dev/null || true; done
  netns_down
  rm -rf "/etc/netns/${NS[0]}" "/etc/netns/${NS[1]}"
  if ((KEEP)); then echo "logs kept in $TMP" >&2; else rm -rf "$TMP"; fi
}
trap cleanup EXIT
set -m  # each daemon in a process group of its own
netns_up tye 198.18.217 "${NS[@]}"
mkdir -p "$TMP/bin" "$TMP/runs"
ln -s "$TRAINYARD" "$TMP/bin/trainyard"
export PATH=$TMP/bin:$PATH
JOB=(trainyard train fashion-mnist --epochs 1 --limit 512 --batch-size 64 --threads 1
     --no-progress)

# Seconds since midnight of an HH:MM:SS.fraction (logs and `date` are both local time).
seconds_of() { awk -F: '{printf "%.3f\n", $1 * 3600 + $2 * 60 + $3}' <<<"$1"; }
now() { seconds_of "$(date +%H:%M:%S.%N)"; }
minus() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.3f\n", a - b}'; }
# first_step COMMAND...: runs COMMAND every 50 ms (90 s at most) until its output holds rank 0's
# first step, and prints when that was.
first_step() {
  local line="" deadline=$((SECONDS + 90))
  until [[ -n $line ]]; do
    ((SECONDS < deadline)) || die "no first step within 90 s in the output of: $*"
    line=$("$@" 2>/dev/null | grep -h "rank 0/2 train\] step 1 done" | head -n 1 || true)
    [[ -n $line ]] || sleep 0.05
  done
  seconds_of "$(sed -E 's/.*\[D ([0-9:.]+) rank.*/\1/' <<<"$line")"
}
# wait_for_result NAME: the run's result.json (the job ended) within 90 s.
wait_for_result() {
  local deadline=$((SECONDS + 90))
  until [[ -s $TMP/runs/$1/result.json ]]; do
    ((SECONDS < deadline)) || die "run $1 wrote no result within 90 s"
    sleep 0.1
  done
}

# --- Slurm ---------------------------------------------------------------------------------------
if [[ " $ENGINES " == *" slurm "* ]]; then
  "$SLURM" up "$TMP/slurm" "${NS[0]}:${ADDR[0]}" "${NS[1]}:${ADDR[1]}"
fi
run_slurm() {
  local name=slurm-$1 t0 step
  t0=$(now)
  TRAINYARD_LOG_LEVEL=debug "$SLURM" on "$TMP/slurm" 1 sbatch --output="$TMP/$name.out" \
    "$ROOT/deploy/slurm/fashion-mnist.sbatch" "${JOB[@]:3}" --storage "$TMP/runs" \
    --name "$name" >/dev/null
  step=$(first_step cat "$TMP/$name.out")
  minus "$step" "$t0"
  wait_for_result "$name"
}

# --- Kubeflow Trainer v2 pods ------------------------------------------------------------------
# trainjob.yaml's job name; its pods meet at <job>-node-0-0.<job>:29500.
V2_JOB=fashion-mnist-v2
for i in 0 1; do
  mkdir -p "/etc/netns/${NS[$i]}"
  printf '127.0.0.1 localhost\n%s %s-node-0-0 %s-node-0-0.%s\n%s %s-node-0-1 %s-node-0-1.%s\n' \
    "${ADDR[0]}" $V2_JOB $V2_JOB $V2_JOB "${ADDR[1]}" $V2_JOB $V2_JOB $V2_JOB \
    >"/etc/netns/${NS[$i]}/hosts"
done
run_trainer_v2() {
  local name=trainer-v2-$1 t0 i step pods=()
  t0=$(now)
  for i in 0 1; do
    ip netns exec "${NS[$i]}" env TRAINYARD_LOG_LEVEL=debug KUBERNETES_SERVICE_HOST=10.96.0.1 \
      PET_NNODES=2 PET_NPROC_PER_NODE=1 PET_NODE_RANK=$i \
      PET_MASTER_ADDR=$V2_JOB-node-0-0.$V2_JOB PET_MASTER_PORT=29500 \
      trainyard run -- "${JOB[@]}" --storage "$TMP/runs" --name "$name" \
      >"$TMP/$name.$i.log" 2>&1 &
    pods+=($!)
  done
  step=$(first_step cat "$TMP/$name.0.log" "$TMP/$name.1.log")
  minus "$step" "$t0"
  wait "${pods[@]}"  # the two pods only, not the cluster's daemons
}

# --- head and workers ----------------------------------------------------------------------------
if [[ " $ENGINES " == *" cluster "* ]]; then
  head -c 24 /dev/urandom | base64 >"$TMP/token"
  chmod 600 "$TMP/token"
  ip netns exec "${NS[0]}" "$TRAINYARD" head --bind "${ADDR[0]}" --port 8265 \
    --token-file "$TMP/token" --state-dir "$TMP/head" --num-cpus 0 >"$TMP/head.log" 2>&1 &
  DAEMONS+=($!)
  for i in 0 1; do
    ip netns exec "${NS[$i]}" "$TRAINYARD" worker --head "${ADDR[0]}:8265" \
      --token-file "$TMP/token" --state-dir "$TMP/worker$i" >"$TMP/worker$i.log" 2>&1 &
    DAEMONS+=($!)
  done
  deadline=$((SECONDS + 30))
  until [[ $(ip netns exec "${NS[0]}" "$TRAINYARD" status --address "${ADDR[0]}:8265" \
      --token-file "$TMP/token" --json 2>/dev/null |
      jq '[.nodes[] | select(.state == "alive")] | length' 2>/dev/null) == 2 ]]; do
    ((SECONDS < deadline)) || die "the head and 2 workers were not up in 30 s; see $TMP/*.log"
    sleep 0.2
  done
fi
run_cluster() {
  local name=cluster-$1 t0 step
  t0=$(now)
  ip netns exec "${NS[0]}" "$TRAINYARD" submit --address "${ADDR[0]}:8265" \
    --token-file "$TMP/token" --no-wait --nodes 2 --nproc-per-node 1 \
    --submission-id "$name" --env TRAINYARD_LOG_LEVEL=debug -- "${JOB[@]}" --storage "$TMP/runs" --name "$name" >/dev/null
  # The ranks' output reaches the head, which `trainyard logs` reads.
  step=$(first_step ip netns exec "${NS[0]}" "$TRAINYARD" logs "$name" \
    --address "${ADDR[0]}:8265" --token-file "$TMP/token" --rank 0)
  minus "$step" "$t0"
  wait_for_result "$name"
}

printf '%-4s' run
for e in $ENGINES; do printf ' %12s' "$e"; done
echo "   (seconds to rank 0's first step)"
for ((r = 1; r <= REPEATS; r++)); do
  printf '%-4s' "$r"
  for e in $ENGINES; do
    s=$(run_"${e//-/_}" "$r")
    printf ' %12.2f' "$s"
    echo "$s" >>"$TMP/$e.all"
  done
  echo
done
printf '%-4s' med
for e in $ENGINES; do
  printf ' %12.2f' "$(sort -g "$TMP/$e.all" | awk '{v[NR]=$1} END {print NR % 2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}')"
done
echo
