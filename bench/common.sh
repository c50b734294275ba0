# shellcheck shell=bash
# shellcheck disable=SC2034  # the variables are read by the scripts that source this file
# bench/common.sh: what recipe_vs_python.sh and scaling.sh share. Source it first (after setting
# BENCH_NAME), parse the script's own flags, hand the rest to bench_common_flag, then call
# bench_validate and bench_start. It provides the defaults below (each from its BENCH_* variable),
# a temporary folder ($TMP, removed on exit unless --keep), the CPU-busy probe, and running one
# training job (trainyard's recipe or the Python peer) whose result JSON becomes a row of $RUNS:
# impl, world size, repeat, busy% before, samples/s, train s, accuracy, loss.

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
RANKS=${BENCH_RANKS:-2}
THREADS=${BENCH_THREADS:-1}
LIMIT=${BENCH_LIMIT:-6000}
EPOCHS=${BENCH_EPOCHS:-1}
BATCH_SIZE=${BENCH_BATCH_SIZE:-128}
LR=${BENCH_LR:-0.001}
SEED=${BENCH_SEED:-0}
REPEATS=${BENCH_REPEATS:-1}
TRAINYARD=${BENCH_TRAINYARD:-$ROOT/build/trainyard}
PYTHON=${BENCH_PYTHON:-/opt/trainyard/venv/bin/python}
JSON_OUT=${BENCH_JSON:-}
KEEP=0
VERBOSE=0
PEER=$ROOT/bench/python/fashion_mnist_ddp.py

die() { echo "$BENCH_NAME.sh: error: $*" >&2; exit 2; }
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

# bench_common_flag ARGS...: consumes one flag every script takes; BENCH_CONSUMED says how many
# words it used (0: not a common flag).
bench_common_flag() {
  BENCH_CONSUMED=2
  case $1 in
    --ranks) RANKS=${2:?} ;;
    --threads) THREADS=${2:?} ;;
    --limit) LIMIT=${2:?} ;;
    --epochs) EPOCHS=${2:?} ;;
    --batch-size) BATCH_SIZE=${2:?} ;;
    --lr) LR=${2:?} ;;
    --seed) SEED=${2:?} ;;
    --repeats) REPEATS=${2:?} ;;
    --trainyard) TRAINYARD=${2:?} ;;
    --json) JSON_OUT=${2:?} ;;
    --keep) KEEP=1; BENCH_CONSUMED=1 ;;
    --verbose) VERBOSE=1; BENCH_CONSUMED=1 ;;
    -h|--help) usage; exit 0 ;;
    *) BENCH_CONSUMED=0 ;;
  esac
}

# bench_validate: the common values, the trainyard binary, and an interpreter to parse results.
bench_validate() {
  local v
  for v in RANKS THREADS LIMIT EPOCHS BATCH_SIZE REPEATS; do
    [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "$v must be a positive integer, got '${!v}'"
  done
  [[ $SEED =~ ^[0-9]+$ ]] || die "SEED must be a non-negative integer, got '$SEED'"
  [[ -x $TRAINYARD ]] || die "$TRAINYARD is missing or not executable: build the project first (cmake --build build)."
  [[ -x $PYTHON ]] || die "$PYTHON not found: Debian's python3 is needed (with python3-torch and python3-torchvision for the Python peer)."
}

# bench_require_peer FLAG: the Python peer and an interpreter with torch; FLAG names the option
# that picks the interpreter, for the message.
bench_require_peer() {
  [[ -f $PEER ]] || die "the Python peer $PEER is missing."
  "$PYTHON" -c 'import torch, torchvision, numpy' 2>/dev/null ||
    die "$PYTHON cannot import torch, torchvision and numpy: install python3-torch and python3-torchvision (apt-get install python3-torch python3-torchvision), or point $1 at an interpreter that has them."
}

# bench_start: the temporary folder and the rows file.
bench_start() {
  TMP=$(mktemp -d "${TMPDIR:-/tmp}/${BENCH_NAME}.XXXXXX")
  cleanup() { if ((KEEP)); then echo "kept: $TMP" >&2; else rm -rf "$TMP"; fi; }
  trap cleanup EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  RUNS=$TMP/runs.tsv
  : >"$RUNS"
}

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
