#!/usr/bin/env bash
# recipe_vs_python.sh — training throughput of trainyard's FashionMNIST recipe against the Python
# PyTorch peer (bench/python/fashion_mnist_ddp.py, the venv's torch) on the same machine, the
# same data subset and the same hyper-parameters, measured side by side in one invocation.
#
# What it measures: train_samples_per_s from each run's result JSON (samples trained by all ranks
# / the slowest rank's training time; no startup, no evaluation), the test accuracy, and the ratio
# of the medians, trainyard / python. Runs alternate (trainyard, python, trainyard, python, ...) so
# that drift on the machine hits both alike. Absolute numbers move with the machine's load: read
# the ratio, and the "busy%" column (how busy the CPUs were in the second before each run).
#
#   bench/recipe_vs_python.sh                      # 2 ranks x 1 thread, --limit 6000, 1 epoch
#   bench/recipe_vs_python.sh --repeats 3 --limit 12000
#   BENCH_LIMIT=512 bench/recipe_vs_python.sh      # every flag has a BENCH_* variable
#
# It runs, per repeat:
#   build/trainyard train fashion-mnist --workers R --threads T --epochs E --batch-size B --lr LR \
#       --limit N --seed S --storage TMP --name trainyard-I --no-progress
#   build/trainyard run --nproc-per-node R -- /opt/trainyard/venv/bin/python bench/python/fashion_mnist_ddp.py \
#       --threads T --epochs E --batch-size B --lr LR --limit N --seed S --out TMP/python-I.json
#
# Flags (environment variable, default):
#   --ranks R        BENCH_RANKS       2     ranks (processes) per implementation
#   --threads T      BENCH_THREADS     1     intra-op threads per rank
#   --limit N        BENCH_LIMIT       6000  first N training images
#   --epochs E       BENCH_EPOCHS      1
#   --batch-size B   BENCH_BATCH_SIZE  128   per rank
#   --lr LR          BENCH_LR          0.001 Adam learning rate
#   --seed S         BENCH_SEED        0
#   --repeats K      BENCH_REPEATS     1     pairs of runs
#   --trainyard P    BENCH_TRAINYARD   build/trainyard (of this checkout)
#   --python P       BENCH_PYTHON      /opt/trainyard/venv/bin/python (the venv)
#   --json FILE      BENCH_JSON        also write the runs and the ratio as JSON to FILE
#   --keep                             keep the temporary folder (logs, result JSON) and print it
#   --verbose                          show the runs' output as they go
# No network is used; all files go to a temporary folder removed on exit.
set -euo pipefail

BENCH_NAME=recipe_vs_python
# shellcheck source=bench/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

while (($#)); do
  case $1 in
    --python) PYTHON=${2:?}; shift 2 ;;
    *)
      bench_common_flag "$@"
      ((BENCH_CONSUMED > 0)) || die "unknown argument '$1' (see --help)"
      shift "$BENCH_CONSUMED" ;;
  esac
done

bench_validate
bench_require_peer --python
bench_start

echo "FashionMNIST ResNet18: trainyard recipe vs Python PyTorch DDP peer" >&2
echo "  $RANKS rank(s) x $THREADS thread(s), limit $LIMIT, $EPOCHS epoch(s), batch $BATCH_SIZE/rank, lr $LR, seed $SEED, $REPEATS repeat(s)" >&2
warn_if_busy

for ((i = 1; i <= REPEATS; i++)); do
  run_trainyard "$RANKS" "$i"
  run_python "$RANKS" "$i"
done

"$PYTHON" - "$RUNS" "$JSON_OUT" "$RANKS" "$THREADS" "$LIMIT" "$EPOCHS" "$BATCH_SIZE" "$LR" "$SEED" <<'EOF'
import json, statistics, sys
runs_path, json_out, ranks, threads, limit, epochs, batch, lr, seed = sys.argv[1:]
rows = []
for line in open(runs_path):
    impl, _world, i, busy, sps, t, acc, loss = line.rstrip("\n").split("\t")
    rows.append(dict(impl=impl, run=int(i), busy_percent_before=float(busy), samples_per_s=float(sps),
                     train_time_s=float(t), accuracy=float(acc), loss=float(loss)))
print(f"{'run':>3}  {'impl':<9}  {'samples/s':>9}  {'train_s':>8}  {'accuracy':>8}  {'loss':>7}  {'busy%':>5}")
for r in rows:
    print(f"{r['run']:>3}  {r['impl']:<9}  {r['samples_per_s']:>9.1f}  {r['train_time_s']:>8.2f}  "
          f"{r['accuracy']:>8.4f}  {r['loss']:>7.4f}  {r['busy_percent_before']:>5.0f}")
med = {impl: statistics.median(r["samples_per_s"] for r in rows if r["impl"] == impl)
       for impl in ("trainyard", "python")}
acc = {impl: statistics.median(r["accuracy"] for r in rows if r["impl"] == impl)
       for impl in ("trainyard", "python")}
ratio = med["trainyard"] / med["python"]
print(f"median samples/s: trainyard {med['trainyard']:.1f}, python {med['python']:.1f}; "
      f"median accuracy: trainyard {acc['trainyard']:.4f}, python {acc['python']:.4f}")
print(f"ratio trainyard/python samples/s: {ratio:.2f}x")
if json_out:
    with open(json_out, "w") as f:
        json.dump({"benchmark": "recipe_vs_python", "ranks": int(ranks), "threads": int(threads),
                   "limit": int(limit), "epochs": int(epochs), "batch_size": int(batch),
                   "lr": float(lr), "seed": int(seed), "runs": rows,
                   "median_samples_per_s": med, "median_accuracy": acc,
                   "ratio_trainyard_over_python": ratio}, f, indent=2)
        f.write("\n")
EOF
