#!/usr/bin/env bash
# metrics_overhead.sh — what recording training metrics costs a step (issue 12): the FashionMNIST
# recipe on R ranks under `trainyard run`, with metrics on (the step timer, the collective and
# checkpoint counters, the rank file published every second to $TRAINYARD_METRICS_DIR) against
# TRAINYARD_METRICS=0 (nothing recorded, nothing published), runs interleaved (on, off, off, on,
# on, off, ...) so that drift on the machine hits both alike.
#
# What it measures: per-step time = train_time_s / global_step from each run's result.json (the
# slowest rank's training time over its optimizer steps; no startup, no evaluation), the median of
# each mode, the ratio on / off, and the median of each pair's ratio (drift hits a pair least).
# The target is a ratio under 1.01; on a machine others load, the noise is larger than that
# (docs/BENCHMARKS.md, "Metrics and the dashboard"), and the per-call costs the unit test
# MetricsCost measures bound it instead. Absolute numbers move with
# the machine's load: read the ratio, and the "busy%" column.
#
#   bench/metrics_overhead.sh                      # 2 ranks x 1 thread, --limit 6000, 3 pairs
#   bench/metrics_overhead.sh --limit 2048 --repeats 5
#
# It runs, per repeat and mode:
#   [TRAINYARD_METRICS=0 | TRAINYARD_METRICS_DIR=TMP/metrics-I] build/trainyard run \
#       --nproc-per-node R -- build/trainyard train fashion-mnist --threads T --epochs E \
#       --batch-size B --lr LR --limit N --seed S --storage TMP --name MODE-I --no-progress
#
# Flags (environment variable, default):
#   --ranks R        BENCH_RANKS       2     ranks (processes)
#   --threads T      BENCH_THREADS     1     intra-op threads per rank
#   --limit N        BENCH_LIMIT       6000  first N training images
#   --epochs E       BENCH_EPOCHS      1
#   --batch-size B   BENCH_BATCH_SIZE  128   per rank
#   --lr LR          BENCH_LR          0.001 Adam learning rate
#   --seed S         BENCH_SEED        0
#   --repeats K      BENCH_REPEATS     3     pairs of runs (this script's default; common.sh's is 1)
#   --trainyard P    BENCH_TRAINYARD   build/trainyard (of this checkout)
#   --json FILE      BENCH_JSON        also write the runs and the ratio as JSON to FILE
#   --keep                             keep the temporary folder (logs, result JSON) and print it
#   --verbose                          show the runs' output as they go
# No network is used; all files go to a temporary folder removed on exit.
set -euo pipefail

BENCH_NAME=metrics_overhead
BENCH_REPEATS=${BENCH_REPEATS:-3}
# shellcheck source=bench/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

while (($#)); do
  bench_common_flag "$@"
  ((BENCH_CONSUMED > 0)) || die "unknown argument '$1' (see --help)"
  shift "$BENCH_CONSUMED"
done

bench_validate
bench_start

echo "FashionMNIST ResNet18 under trainyard run: metrics on vs TRAINYARD_METRICS=0" >&2
echo "  $RANKS rank(s) x $THREADS thread(s), limit $LIMIT, $EPOCHS epoch(s), batch $BATCH_SIZE/rank, lr $LR, seed $SEED, $REPEATS pair(s)" >&2
warn_if_busy

# run_mode MODE I: one run with metrics on or off; appends "MODE I busy per_step_s steps samples/s".
run_mode() {
  local mode=$1 i=$2 name="$1-$2"
  local log=$TMP/$name.log result=$TMP/$name/result.json
  local -a env_vars
  if [[ $mode == on ]]; then
    env_vars=(TRAINYARD_METRICS=1 "TRAINYARD_METRICS_DIR=$TMP/metrics-$i")
  else
    env_vars=(TRAINYARD_METRICS=0)
  fi
  local busy; busy=$(cpu_busy)
  printf '  run %d/%d metrics %-3s ... ' "$i" "$REPEATS" "$mode" >&2
  local rc=0
  local -a cmd=(env "${env_vars[@]}" "$TRAINYARD" run --nproc-per-node "$RANKS" --
    "$TRAINYARD" train fashion-mnist --threads "$THREADS" --epochs "$EPOCHS"
    --batch-size "$BATCH_SIZE" --lr "$LR" --limit "$LIMIT" --seed "$SEED"
    --storage "$TMP" --name "$name" --no-progress)
  if ((VERBOSE)); then
    echo >&2
    "${cmd[@]}" 2>&1 | tee "$log" >&2 || rc=$?
  else
    "${cmd[@]}" >"$log" 2>&1 || rc=$?
  fi
  if ((rc != 0)) || [[ ! -s $result ]]; then
    echo "FAILED (exit $rc)" >&2
    tail -n 30 "$log" >&2
    die "the metrics-$mode run failed; no result at $result"
  fi
  if [[ $mode == on ]] && ! compgen -G "$TMP/metrics-$i/rank_*.json" >/dev/null; then
    die "the metrics-on run wrote no rank file to $TMP/metrics-$i"
  fi
  "$PYTHON" - "$mode" "$i" "$busy" "$result" >>"$RUNS" <<'PY'
import json, sys
mode, i, busy, path = sys.argv[1:]
r = json.load(open(path))
steps = int(r["global_step"])
print("\t".join(str(x) for x in (mode, i, busy, float(r["train_time_s"]) / steps, steps,
                                  r["train_samples_per_s"])))
PY
  tail -n 1 "$RUNS" | awk -F'\t' '{printf "%.2f ms/step over %d steps\n", 1000 * $4, $5}' >&2
}

# Pairs alternate which mode goes first, so that neither always runs after the other.
for ((i = 1; i <= REPEATS; i++)); do
  if ((i % 2)); then
    run_mode on "$i"; run_mode off "$i"
  else
    run_mode off "$i"; run_mode on "$i"
  fi
done

"$PYTHON" - "$RUNS" "$JSON_OUT" <<'PY'
import json, statistics, sys
runs_path, json_out = sys.argv[1:]
rows = []
for line in open(runs_path):
    mode, i, busy, per_step, steps, sps = line.rstrip("\n").split("\t")
    rows.append(dict(mode=mode, run=int(i), busy_percent_before=float(busy),
                     step_ms=1000 * float(per_step), steps=int(steps), samples_per_s=float(sps)))
print(f"{'run':>3}  {'metrics':<7}  {'ms/step':>8}  {'steps':>5}  {'samples/s':>9}  {'busy%':>5}")
for r in rows:
    print(f"{r['run']:>3}  {r['mode']:<7}  {r['step_ms']:>8.2f}  {r['steps']:>5}  "
          f"{r['samples_per_s']:>9.1f}  {r['busy_percent_before']:>5.0f}")
med = {m: statistics.median(r["step_ms"] for r in rows if r["mode"] == m) for m in ("on", "off")}
ratio = med["on"] / med["off"]
print(f"median ms/step: metrics on {med['on']:.2f}, off {med['off']:.2f}; "
      f"on / off = {ratio:.4f} ({100 * (ratio - 1):+.2f}%)")
# Each pair ran back to back: the median of the pairs' ratios resists drift of the machine's load.
by_run = {}
for r in rows:
    by_run.setdefault(r["run"], {})[r["mode"]] = r["step_ms"]
pairs = [v["on"] / v["off"] for v in by_run.values() if "on" in v and "off" in v]
pair_ratio = statistics.median(pairs)
print("pair ratios on / off: " + ", ".join(f"{p:.3f}" for p in pairs) +
      f"; median {pair_ratio:.4f} ({100 * (pair_ratio - 1):+.2f}%)")
if json_out:
    json.dump(dict(runs=rows, median_step_ms=med, ratio_on_over_off=ratio,
                   pair_ratios=pairs, median_pair_ratio=pair_ratio), open(json_out, "w"), indent=2)
PY
