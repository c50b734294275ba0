# shellcheck shell=bash
# bench/common.sh: what recipe_vs_python.sh and scaling.sh share, sourced after they parse their
# flags: a temporary folder ($TMP, removed on exit unless --keep), the CPU-busy probe, and
# running one training job (trainyard's recipe or the Python peer) whose result JSON becomes a
# row of $RUNS: impl, world size, repeat, busy% before, samples/s, train s, accuracy, loss.
# Expects: BENCH_NAME, TRAINYARD, PYTHON, PEER, THREADS, EPOCHS, BATCH_SIZE, LR, LIMIT, SEED,
# REPEATS, KEEP, VERBOSE and a die() function.

TMP=$(mktemp -d "${TMPDIR:-/tmp}/${BENCH_NAME}.XXXXXX")
cleanup() { if ((KEEP)); then echo "kept: $TMP" >&2; else rm -rf "$TMP"; fi; }
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
RUNS=$TMP/runs.tsv
: >"$RUNS"

# cpu_busy: percent of all cores busy over the next second (others' work, before a run starts).
cpu_busy() {
  local a b
  a=$(head -n 1 /proc/stat); sleep 1; b=$(head -n 1 /proc/stat)
  awk -v a="$a" -v b="$b" 'BEGIN {
    n = split(a, x, " "); split(b, y, " "); total = 0
    for (k = 2; k <= n; k++) total += y[k] - x[k]
    idle = (y[5] - x[5]) + (y[6] - x[6])
    printf "%.0f", (total > 0 ? 100 * (total - idle) / total : 0) }'
}

# run_one IMPL WORLD I LOG RESULT_JSON -- COMMAND...: runs it, appends a row to $RUNS.
run_one() {
  local impl=$1 world=$2 i=$3 log=$4 result=$5; shift 6
  local busy; busy=$(cpu_busy)
  printf '  run %d/%d %-9s %d rank(s) ... ' "$i" "$REPEATS" "$impl" "$world" >&2
  local rc=0
  if ((VERBOSE)); then
    echo >&2
    "$@" 2>&1 | tee "$log" >&2 || rc=$?  # pipefail: the command's failure counts
  else
    "$@" >"$log" 2>&1 || rc=$?
  fi
  if ((rc != 0)) || [[ ! -s $result ]]; then
    echo "FAILED (exit $rc)" >&2
    echo "---- last lines of its output ($*) ----" >&2
    tail -n 30 "$log" >&2
    die "the $impl run on $world rank(s) failed; no result at $result"
  fi
  "$PYTHON" - "$impl" "$world" "$i" "$busy" "$result" >>"$RUNS" <<'EOF'
import json, sys
impl, world, i, busy, path = sys.argv[1:]
r = json.load(open(path))
if int(r["world_size"]) != int(world):
    sys.exit(f"{path}: world_size {r['world_size']}, expected {world}")
print("\t".join(str(x) for x in (impl, world, i, busy, r["train_samples_per_s"],
                                  r["train_time_s"], r["accuracy"], r["loss"])))
EOF
  tail -n 1 "$RUNS" | awk -F'\t' '{printf "%.1f samples/s, accuracy %.4f\n", $5, $7}' >&2
}

run_trainyard() {  # WORLD I
  local name="trainyard-w$1-$2"
  run_one trainyard "$1" "$2" "$TMP/$name.log" "$TMP/$name/result.json" -- \
    "$TRAINYARD" train fashion-mnist --workers "$1" --threads "$THREADS" --epochs "$EPOCHS" \
    --batch-size "$BATCH_SIZE" --lr "$LR" --limit "$LIMIT" --seed "$SEED" \
    --storage "$TMP" --name "$name" --no-progress
}

run_python() {  # WORLD I
  local name="python-w$1-$2"
  run_one python "$1" "$2" "$TMP/$name.log" "$TMP/$name.json" -- \
    "$TRAINYARD" run --nproc-per-node "$1" -- "$PYTHON" "$PEER" --threads "$THREADS" \
    --epochs "$EPOCHS" --batch-size "$BATCH_SIZE" --lr "$LR" --limit "$LIMIT" --seed "$SEED" \
    --out "$TMP/$name.json"
}

# warn_if_busy: a note when other work already loads the CPUs.
warn_if_busy() {
  local busy; busy=$(cpu_busy)
  if ((busy > 10)); then
    echo "  warning: the CPUs are ${busy}% busy before starting; other work on the machine skews the numbers" >&2
  fi
}
