#!/usr/bin/env bash
# scaling.sh — scaling efficiency of trainyard's FashionMNIST recipe from 1 rank to 2 ranks on
# this machine: the same per-rank batch (128), the same threads per rank (1), the same --limit
# (6000 images, so one rank takes twice the steps of each of two), measured side by side in one
# invocation, the runs alternating (1 rank, 2 ranks, 1 rank, 2 ranks, ...).
#
#   efficiency = samples/s(2 ranks) / (2 x samples/s(1 rank))     (medians over --repeats)
#
# samples/s is train_samples_per_s from each run's result JSON (samples trained by all ranks / the
# slowest rank's training time; no startup, no evaluation). With --python the Python PyTorch DDP
# peer (bench/python/fashion_mnist_ddp.py, Debian's torch 1.13) is measured the same way, for
# reference. Absolute numbers move with the machine's load: the "busy%" column says how busy the
# CPUs were in the second before each run started.
#
#   bench/scaling.sh                          # trainyard, 1 vs 2 ranks x 1 thread, --limit 6000
#   bench/scaling.sh --python --repeats 3     # and the Python peer alike
#   BENCH_LIMIT=512 bench/scaling.sh          # every flag has a BENCH_* variable
#
# It runs, per repeat, for W in 1 2:
#   build/trainyard train fashion-mnist --workers W --threads T --epochs E --batch-size B --lr LR \
#       --limit N --seed S --storage TMP --name trainyard-wW-I --no-progress
# and with --python, for W in 1 2:
#   build/trainyard run --nproc-per-node W -- /opt/trainyard/venv/bin/python bench/python/fashion_mnist_ddp.py \
#       --threads T --epochs E --batch-size B --lr LR --limit N --seed S --out TMP/python-wW-I.json
#
# Flags (environment variable, default):
#   --ranks R        BENCH_RANKS       2     the larger world size (compared with 1 rank)
#   --threads T      BENCH_THREADS     1     intra-op threads per rank
#   --limit N        BENCH_LIMIT       6000  first N training images
#   --epochs E       BENCH_EPOCHS      1
#   --batch-size B   BENCH_BATCH_SIZE  128   per rank
#   --lr LR          BENCH_LR          0.001 Adam learning rate
#   --seed S         BENCH_SEED        0
#   --repeats K      BENCH_REPEATS     1
#   --python         BENCH_WITH_PYTHON=1     also measure the Python peer
#   --trainyard P    BENCH_TRAINYARD   build/trainyard (of this checkout)
#   --python-bin P   BENCH_PYTHON      /opt/trainyard/venv/bin/python (the venv)
#   --json FILE      BENCH_JSON        also write the runs and the efficiencies as JSON to FILE
#   --keep                             keep the temporary folder (logs, result JSON) and print it
#   --verbose                          show the runs' output as they go
# No network is used; all files go to a temporary folder removed on exit.
set -euo pipefail

BENCH_NAME=scaling
# shellcheck source=bench/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
WITH_PYTHON=${BENCH_WITH_PYTHON:-0}

while (($#)); do
  case $1 in
    --python) WITH_PYTHON=1; shift ;;
    --python-bin) PYTHON=${2:?}; shift 2 ;;
    *)
      bench_common_flag "$@"
      ((BENCH_CONSUMED > 0)) || die "unknown argument '$1' (see --help)"
      shift "$BENCH_CONSUMED" ;;
  esac
done

bench_validate
((RANKS >= 2)) || die "--ranks must be >= 2 (it is compared with 1 rank), got $RANKS"
[[ $WITH_PYTHON == 0 || $WITH_PYTHON == 1 ]] || die "BENCH_WITH_PYTHON must be 0 or 1"
if ((WITH_PYTHON)); then bench_require_peer --python-bin; fi
bench_start

echo "FashionMNIST ResNet18: scaling from 1 to $RANKS rank(s)" >&2
echo "  $THREADS thread(s)/rank, limit $LIMIT, $EPOCHS epoch(s), batch $BATCH_SIZE/rank, lr $LR, seed $SEED, $REPEATS repeat(s)$( ((WITH_PYTHON)) && echo ', with the Python peer')" >&2
if (( RANKS * THREADS > $(nproc) )); then
  echo "  note: $RANKS ranks x $THREADS thread(s) oversubscribes this machine's $(nproc) cores" >&2
fi
warn_if_busy

for ((i = 1; i <= REPEATS; i++)); do
  run_trainyard 1 "$i"
  run_trainyard "$RANKS" "$i"
  if ((WITH_PYTHON)); then
    run_python 1 "$i"
    run_python "$RANKS" "$i"
  fi
done

"$PYTHON" - "$RUNS" "$JSON_OUT" "$RANKS" "$THREADS" "$LIMIT" "$EPOCHS" "$BATCH_SIZE" "$LR" "$SEED" <<'EOF'
import json, statistics, sys
runs_path, json_out, ranks, threads, limit, epochs, batch, lr, seed = sys.argv[1:]
ranks = int(ranks)
rows = []
for line in open(runs_path):
    impl, world, i, busy, sps, t, acc, _loss = line.rstrip("\n").split("\t")
    rows.append(dict(impl=impl, world_size=int(world), run=int(i), busy_percent_before=float(busy),
                     samples_per_s=float(sps), train_time_s=float(t), accuracy=float(acc)))
print(f"{'run':>3}  {'impl':<9}  {'ranks':>5}  {'samples/s':>9}  {'train_s':>8}  {'accuracy':>8}  {'busy%':>5}")
for r in rows:
    print(f"{r['run']:>3}  {r['impl']:<9}  {r['world_size']:>5}  {r['samples_per_s']:>9.1f}  "
          f"{r['train_time_s']:>8.2f}  {r['accuracy']:>8.4f}  {r['busy_percent_before']:>5.0f}")
summary = {}
for impl in ("trainyard", "python"):
    mine = [r for r in rows if r["impl"] == impl]
    if not mine:
        continue
    one = statistics.median(r["samples_per_s"] for r in mine if r["world_size"] == 1)
    many = statistics.median(r["samples_per_s"] for r in mine if r["world_size"] == ranks)
    eff = many / (ranks * one)
    summary[impl] = {"samples_per_s_1": one, f"samples_per_s_{ranks}": many, "efficiency": eff}
    print(f"{impl}: 1 rank {one:.1f} samples/s, {ranks} ranks {many:.1f} samples/s; "
          f"scaling efficiency {many:.1f} / ({ranks} x {one:.1f}) = {eff:.2f} ({eff * 100:.0f}%)")
if json_out:
    with open(json_out, "w") as f:
        json.dump({"benchmark": "scaling", "ranks": ranks, "threads": int(threads),
                   "limit": int(limit), "epochs": int(epochs), "batch_size": int(batch),
                   "lr": float(lr), "seed": int(seed), "runs": rows, "summary": summary},
                  f, indent=2)
        f.write("\n")
EOF
