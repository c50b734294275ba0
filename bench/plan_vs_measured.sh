#!/usr/bin/env bash
# plan_vs_measured.sh — `trainyard plan`'s predictions against what trainyard's engine measures:
# for each variant it runs train_gpt_fsdp's ranks (one job at a time, under a lock shared with
# the builds) and compares, per rank (the largest of the ranks):
#   model state   fp32 parameters, gradients and both AdamW moments the rank keeps, as the example
#                 prints it, against the plan's persistent bytes (`persistent` in --format csv)
#   peak RSS      getrusage's ru_maxrss, as the example prints it, against the plan's engine total
#                 with the CPU runtime overhead (trainyard plan --cpu; Note [Runtime overhead] in
#                 src/plan/memory_plan.cpp)
# and prints planned, measured and planned / measured, marking a ratio outside [0.9, 1.1].
# The example has no ZeRO-1 (ShardedAdam) mode, so ZeRO-1 is planned but not measured here.
# HYBRID_SHARD on one node of R ranks shards over the node and has no replicas; the variant
# hybrid_shard:PRECISION:2n runs two launchers on this machine (--nnodes 2, R/2 ranks each, a
# static rendezvous on 127.0.0.1) so the shard group is a "node" and the replicas all-reduce over
# TCP: ~5 minutes a run, so not part of "all".
#
#   bench/plan_vs_measured.sh                      # pythia-70m, seq 256, batch 4, 2 ranks: ~7 min
#   bench/plan_vs_measured.sh --variants ddp:fp32,full_shard:bf16-mixed
#   bench/plan_vs_measured.sh --calibrate          # also: the runtime constant these runs imply
#   bench/plan_vs_measured.sh --logs DIR           # compare the logs a --keep DIR run left; runs
#                                                  # nothing
#
# Flags (environment variable, default):
#   --preset P      BENCH_PRESET      pythia-70m
#   --seq-len T     BENCH_SEQ_LEN     256
#   --batch-size B  BENCH_BATCH_SIZE  4        sequences per rank
#   --steps N       BENCH_STEPS       4
#   --ranks R       BENCH_RANKS       2
#   --variants L    BENCH_VARIANTS    all      comma-separated STRATEGY:PRECISION[:ac][:2n], from
#                   ddp no_shard shard_grad_op full_shard hybrid_shard x fp32 bf16-mixed; all is
#                   every strategy in both precisions plus full_shard with checkpointing (12);
#                   all,hybrid_shard:fp32:2n adds one
#   --trainyard P   BENCH_TRAINYARD   build/trainyard (the launcher)
#   --example P     BENCH_EXAMPLE     build/examples/train_gpt_fsdp
#   --plan P        BENCH_PLAN        build/trainyard-plan
#   --lock FILE     BENCH_LOCK        /tmp/ty-build.lock (flock'ed around each run)
#   --keep DIR                        keep each run's output in DIR
#   --logs DIR                        read the runs' output from DIR instead of running them
#   --calibrate                       print the runtime constant (median of measured peak RSS
#                                     minus the plan without runtime) these runs imply
# Exit status: 0 when every ratio is within [0.9, 1.1], 1 otherwise, 2 on bad usage.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PRESET=${BENCH_PRESET:-pythia-70m}
SEQ_LEN=${BENCH_SEQ_LEN:-256}
BATCH_SIZE=${BENCH_BATCH_SIZE:-4}
STEPS=${BENCH_STEPS:-4}
RANKS=${BENCH_RANKS:-2}
VARIANTS=${BENCH_VARIANTS:-all}
TRAINYARD=${BENCH_TRAINYARD:-$ROOT/build/trainyard}
EXAMPLE=${BENCH_EXAMPLE:-$ROOT/build/examples/train_gpt_fsdp}
PLAN=${BENCH_PLAN:-$ROOT/build/trainyard-plan}
LOCK=${BENCH_LOCK:-/tmp/ty-build.lock}
KEEP=""
LOGS=""
CALIBRATE=0
ALL_VARIANTS=(ddp:fp32 ddp:bf16-mixed no_shard:fp32 no_shard:bf16-mixed shard_grad_op:fp32
  shard_grad_op:bf16-mixed full_shard:fp32 full_shard:bf16-mixed hybrid_shard:fp32
  hybrid_shard:bf16-mixed full_shard:fp32:ac full_shard:bf16-mixed:ac)

die() { echo "plan_vs_measured.sh: error: $*" >&2; exit 2; }
while (($#)); do
  case $1 in
    --preset) PRESET=${2:?}; shift 2 ;;
    --seq-len) SEQ_LEN=${2:?}; shift 2 ;;
    --batch-size) BATCH_SIZE=${2:?}; shift 2 ;;
    --steps) STEPS=${2:?}; shift 2 ;;
    --ranks) RANKS=${2:?}; shift 2 ;;
    --variants) VARIANTS=${2:?}; shift 2 ;;
    --trainyard) TRAINYARD=${2:?}; shift 2 ;;
    --example) EXAMPLE=${2:?}; shift 2 ;;
    --plan) PLAN=${2:?}; shift 2 ;;
    --lock) LOCK=${2:?}; shift 2 ;;
    --keep) KEEP=${2:?}; shift 2 ;;
    --logs) LOGS=${2:?}; shift 2 ;;
    --calibrate) CALIBRATE=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
for v in SEQ_LEN BATCH_SIZE STEPS RANKS; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "--${v,,} must be a positive integer, got '${!v}'"
done
[[ -x $PLAN ]] || die "--plan $PLAN is missing: build it (ninja -C build trainyard_plan)."
if [[ -z $LOGS ]]; then
  [[ -x $TRAINYARD ]] || die "--trainyard $TRAINYARD is missing: build the project first."
  [[ -x $EXAMPLE ]] || die "--example $EXAMPLE is missing: build the project first."
else
  [[ -d $LOGS ]] || die "--logs $LOGS is not a directory."
fi
IFS=, read -r -a named <<<"$VARIANTS"
SELECTED=()
for v in "${named[@]}"; do
  if [[ $v == all ]]; then SELECTED+=("${ALL_VARIANTS[@]}"); else SELECTED+=("$v"); fi
done
for v in "${SELECTED[@]}"; do
  [[ $v =~ ^(ddp|no_shard|shard_grad_op|full_shard|hybrid_shard):(fp32|bf16-mixed)(:ac)?(:2n)?$ ]] ||
    die "--variants: '$v' is not STRATEGY:PRECISION[:ac][:2n] (e.g. full_shard:bf16-mixed:ac)."
  [[ $v != ddp:*:ac* ]] || die "--variants: '$v': the example runs DDP without checkpointing."
  [[ $v != *:2n ]] || { [[ $v == hybrid_shard:* ]] && ((RANKS % 2 == 0)); } ||
    die "--variants: '$v': two nodes are for hybrid_shard, with an even --ranks."
done
OUT=${KEEP:-$(mktemp -d)}
mkdir -p "$OUT"
[[ -n $KEEP ]] || trap 'rm -rf "$OUT"' EXIT

# plan_row STRATEGY PRECISION AC RUNTIME PER_NODE: the plan's csv line for the example's strategy.
plan_row() {
  local name
  case $1 in
    ddp) name=DDP ;; no_shard) name=NO_SHARD ;; shard_grad_op) name=SHARD_GRAD_OP ;;
    full_shard) name=FULL_SHARD ;; hybrid_shard) name=HYBRID_SHARD ;;
  esac
  "$PLAN" plan --model "$PRESET" --gpus "$RANKS" --gpus-per-node "$5" --seq-len "$SEQ_LEN" \
    --batch-size "$BATCH_SIZE" --precision "$2" ${3:+--activation-checkpointing} \
    --cpu --runtime-mem "$4" --format csv | awk -F, -v s="$name" '$1 == s'
}

mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }
ratio() { awk -v p="$1" -v m="$2" 'BEGIN { printf "%.3f", p / m }'; }
within() { awk -v r="$1" 'BEGIN { exit !(r >= 0.9 && r <= 1.1) }'; }

# The runtime constant the planner uses: what `--cpu` adds.
RUNTIME=$("$PLAN" plan --params 1 --cpu --format csv | awk -F, '$1 == "DDP" { print $6 }')
echo "plan_vs_measured: $PRESET, seq $SEQ_LEN, batch $BATCH_SIZE per rank, $RANKS ranks, $STEPS steps;"
echo "runtime overhead in the plan: $(mib "$RUNTIME") MiB (trainyard plan --cpu). MiB = 2^20 bytes."
printf '\n%-26s %10s %10s %6s   %10s %10s %6s  %s\n' variant "state plan" measured ratio \
  "RSS plan" measured ratio "plan's peak at"
FAILED=0
DIFFS=()
# run_job LOG ARGS...: the example's ranks on one node, or (TWO_NODES=1) on two launchers here.
run_job() {
  local log=$1
  shift
  if ((TWO_NODES == 0)); then
    flock "$LOCK" "$TRAINYARD" run --nproc-per-node "$RANKS" -- "$EXAMPLE" "$@" >"$log" 2>&1 || true
    return
  fi
  # The replicas' all-reduce goes over TCP: slower steps than the hang watchdog's 30 s default.
  local port=$((29600 + RANDOM % 1000))
  local launch=("$TRAINYARD" run --hang-timeout 600 --nnodes 2 --nproc-per-node $((RANKS / 2))
    --master-addr 127.0.0.1 --master-port "$port")
  (
    flock 9
    "${launch[@]}" --node-rank 1 -- "$EXAMPLE" "$@" >"$log.node1" 2>&1 &
    "${launch[@]}" --node-rank 0 -- "$EXAMPLE" "$@" >"$log" 2>&1
    wait
  ) 9>>"$LOCK" || true
  cat "$log.node1" >>"$log"
}
for v in "${SELECTED[@]}"; do
  IFS=: read -r strategy precision ac <<<"${v%:2n}"
  TWO_NODES=0
  per_node=$RANKS
  nodes_suffix=""
  if [[ $v == *:2n ]]; then TWO_NODES=1; per_node=$((RANKS / 2)); nodes_suffix=_2n; fi
  log=$OUT/${strategy}_${precision}${ac:+_ac}$nodes_suffix.txt
  if [[ -z $LOGS ]]; then
    ARGS=(--preset "$PRESET" --strategy "$strategy" --precision "$precision"
      ${ac:+--activation-checkpointing} --seq-len "$SEQ_LEN" --batch-size "$BATCH_SIZE"
      --steps "$STEPS")
    run_job "$log" "${ARGS[@]}"
  else
    log=$LOGS/$(basename "$log")
  fi
  # "rank R: ... peak RSS X MiB, model state Y MiB": the largest over the ranks.
  read -r rss state < <(sed -n 's/.*rank [0-9]*: .* peak RSS \([0-9.]*\) MiB, model state \([0-9.]*\) MiB.*/\1 \2/p' \
    "$log" 2>/dev/null | sort -g -k1,1 | tail -1) || true
  if [[ -z ${rss:-} ]]; then
    printf '%-26s failed: no result line (see %s)\n' "$v" "$log"
    FAILED=1
    continue
  fi
  IFS=, read -r _ _ _ _ _ _ total persistent _ _ peak < <(plan_row "$strategy" "$precision" "$ac" "$RUNTIME" "$per_node")
  IFS=, read -r _ _ _ _ _ _ bare _ _ _ _ < <(plan_row "$strategy" "$precision" "$ac" 0 "$per_node")
  state_ratio=$(ratio "$(mib "$persistent")" "$state")
  rss_ratio=$(ratio "$(mib "$total")" "$rss")
  mark=""
  within "$state_ratio" || mark=" <-- model state off by more than 10%"
  within "$rss_ratio" || mark="$mark <-- peak RSS off by more than 10%"
  [[ -z $mark ]] || FAILED=1
  printf '%-26s %10s %10s %6s   %10s %10s %6s  %s%s\n' "$v" "$(mib "$persistent")" "$state" \
    "$state_ratio" "$(mib "$total")" "$rss" "$rss_ratio" "$peak" "$mark"
  DIFFS+=("$(awk -v m="$rss" -v b="$bare" 'BEGIN { printf "%.1f", m - b / 1048576 }')")
done
if ((CALIBRATE)) && ((${#DIFFS[@]})); then
  median=$(printf '%s\n' "${DIFFS[@]}" | sort -g | awk '{ a[NR] = $1 } END { print (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2) }')
  echo
  echo "calibration: measured peak RSS minus the plan without runtime, MiB: ${DIFFS[*]}"
  echo "median: $median MiB (the plan uses $(mib "$RUNTIME") MiB: kCpuRuntimeBytes)"
fi
[[ -z $KEEP ]] || echo "logs in $KEEP"
exit "$FAILED"
