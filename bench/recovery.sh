#!/usr/bin/env bash
# recovery.sh — how fast a training job recovers from a killed or hung rank, and how much work it
# loses.
#
# Runs the FashionMNIST recipe bare with --max-restarts 1 and --checkpoint-every N, waits until
# the job is half-way between its first and second checkpoint (step N + N/2), sends rank 1 SIGKILL
# (a crash) or SIGSTOP (a hang: only the agent's hang watchdog notices it), and reads the job's
# own timestamped log (TRAINYARD_LOG_LEVEL=debug) to report:
#   detect_s    kill -> the agent reports the failed worker group
#   recovery_s  kill -> the first training step completed after the restart (all ranks)
#   steps_lost  the last step completed before the kill - the step resumed from
# and checks that the job still finishes. Loopback only, on this machine.
#
#   bench/recovery.sh                          # N = 4, 3 repeats
#   bench/recovery.sh --checkpoint-every 8 --repeats 5
#   bench/recovery.sh --signal STOP --repeats 1   # a hung rank, default --hang-timeout (30 s)
#
# Flags (environment variable, default):
#   --checkpoint-every N  BENCH_CHECKPOINT_EVERY  4
#   --limit L             BENCH_LIMIT             6000  (enough steps for 2 checkpoints)
#   --signal KILL|STOP    BENCH_SIGNAL            KILL
#   --hang-timeout S      BENCH_HANG_TIMEOUT      the recipe's default (30)
#   --repeats K, --ranks R, --threads T, --batch-size B, --seed S, --keep, --verbose, --json FILE
#                         as in bench/common.sh
set -euo pipefail

BENCH_NAME=recovery
# shellcheck source=bench/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
EVERY=${BENCH_CHECKPOINT_EVERY:-4}
REPEATS=${BENCH_REPEATS:-3}
SIGNAL=${BENCH_SIGNAL:-KILL}
HANG_TIMEOUT=${BENCH_HANG_TIMEOUT:-}

while (($#)); do
  case $1 in
    --checkpoint-every) EVERY=${2:?}; shift 2 ;;
    --signal) SIGNAL=${2:?}; shift 2 ;;
    --hang-timeout) HANG_TIMEOUT=${2:?}; shift 2 ;;
    *)
      bench_common_flag "$@"
      ((BENCH_CONSUMED > 0)) || die "unknown argument '$1' (see --help)"
      shift "$BENCH_CONSUMED" ;;
  esac
done
bench_validate
[[ $EVERY =~ ^[1-9][0-9]*$ ]] || die "--checkpoint-every must be a positive integer, got '$EVERY'"
[[ $SIGNAL == KILL || $SIGNAL == STOP ]] || die "--signal must be KILL or STOP, got '$SIGNAL'"
hang_flag=()
[[ -z $HANG_TIMEOUT ]] || hang_flag=(--hang-timeout "$HANG_TIMEOUT")
steps_per_epoch=$(( (LIMIT / RANKS + BATCH_SIZE - 1) / BATCH_SIZE ))
KILL_AT=$(( EVERY + (EVERY + 1) / 2 ))
(( steps_per_epoch * EPOCHS > KILL_AT )) ||
  die "--limit $LIMIT gives $steps_per_epoch steps per epoch; need more than $KILL_AT to kill between checkpoints"
bench_start

# pid of the rank with RANK=$2 in the run whose TORCHELASTIC_RUN_ID is $1
rank_pid() {
  local f
  for f in /proc/[0-9]*/environ; do
    # Processes come and go while this reads: ignore the ones that vanish.
    if { tr '\0' '\n' <"$f"; } 2>/dev/null | grep -qx "TORCHELASTIC_RUN_ID=$1" &&
       { tr '\0' '\n' <"$f"; } 2>/dev/null | grep -qx "RANK=$2"; then
      echo "$f" | cut -d/ -f3
      return 0
    fi
  done
  return 1
}

echo "Recovery from a SIG$SIGNAL to a rank: $RANKS rank(s) x $THREADS thread(s), checkpoint every $EVERY steps, kill at step $KILL_AT, $REPEATS repeat(s)" >&2
: >"$TMP/kills.tsv"
for ((i = 1; i <= REPEATS; i++)); do
  name=recovery-$i-$$
  log=$TMP/$name.log
  TRAINYARD_LOG_LEVEL=debug "$TRAINYARD" train fashion-mnist --workers "$RANKS" --threads "$THREADS" \
    --epochs "$EPOCHS" --batch-size "$BATCH_SIZE" --limit "$LIMIT" --seed "$SEED" \
    --storage "$TMP/runs" --name "$name" --checkpoint-every "$EVERY" --num-to-keep 2 \
    --max-restarts 1 --no-progress "${hang_flag[@]}" >"$log" 2>&1 &
  job=$!
  deadline=$((SECONDS + 300))
  until grep -q "rank 0/$RANKS train\] step $KILL_AT done" "$log"; do
    kill -0 "$job" 2>/dev/null || die "run $i ended before step $KILL_AT; see $log (use --keep)"
    ((SECONDS < deadline)) || die "run $i did not reach step $KILL_AT in 300 s"
    sleep 0.02
  done
  victim=$(rank_pid "$name" 1) || die "rank 1 of run $i not found"
  kill_time=$(date +%H:%M:%S.%3N)
  kill -"$SIGNAL" "$victim"
  echo -n "  run $i/$REPEATS: SIG$SIGNAL to rank 1 (pid $victim) at $kill_time ... " >&2
  if wait "$job"; then echo "job finished" >&2; else die "run $i failed after the kill; see $log (use --keep)"; fi
  printf '%s\t%s\t%s\n' "$i" "$kill_time" "$log" >>"$TMP/kills.tsv"
  ((VERBOSE)) && cat "$log" >&2
done

"$PYTHON" - "$TMP/kills.tsv" "$JSON_OUT" "$EVERY" "$RANKS" "$SIGNAL" <<'PY'
import json, re, statistics, sys
kills_path, json_out, every, ranks = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
signal = sys.argv[5]
def secs(hms):
    h, m, s = hms.split(":")
    return int(h) * 3600 + int(m) * 60 + float(s)
stamp = re.compile(r"\[[DIWE] (\d\d:\d\d:\d\d\.\d{3}) ")
rows = []
for line in open(kills_path):
    run, kill_time, log = line.rstrip("\n").split("\t")
    t_kill = secs(kill_time)
    last_step, detect, first = 0, None, {}
    resumed = None
    for text in open(log, errors="replace"):
        m = stamp.search(text)
        if not m:
            continue
        t = secs(m.group(1))
        s = re.search(r"train\] step (\d+) done", text)
        if s and t <= t_kill:
            last_step = max(last_step, int(s.group(1)))
        if "Worker group FAILED" in text and detect is None:
            detect = t - t_kill
        f = re.search(r"rank (\d+)/\d+ train\] First step after resuming from \S+ done: step (\d+)", text)
        if f:
            first[int(f.group(1))] = t - t_kill
            resumed = int(f.group(2)) - 1
    if len(first) != ranks or resumed is None:
        sys.exit(f"run {run}: no 'First step after resuming' line from every rank in {log}")
    rows.append(dict(run=int(run), detect_s=detect, recovery_s=max(first.values()),
                     last_step_before_kill=last_step, resumed_from_step=resumed,
                     steps_lost=last_step - resumed))
print(f"{'run':>3}  {'detect_s':>8}  {'recovery_s':>10}  {'last step':>9}  {'resumed at':>10}  {'steps lost':>10}")
for r in rows:
    print(f"{r['run']:>3}  {r['detect_s']:>8.2f}  {r['recovery_s']:>10.2f}  {r['last_step_before_kill']:>9}  "
          f"{r['resumed_from_step']:>10}  {r['steps_lost']:>10}")
med = statistics.median(r["recovery_s"] for r in rows)
print(f"SIG{signal}, checkpoint every {every} steps: median recovery {med:.2f} s (kill -> first step after restart), "
      f"max {max(r['recovery_s'] for r in rows):.2f} s; steps lost {[r['steps_lost'] for r in rows]}")
if json_out:
    with open(json_out, "w") as f:
        json.dump({"benchmark": "recovery", "signal": signal, "checkpoint_every": every, "ranks": ranks, "runs": rows,
                   "median_recovery_s": med}, f, indent=2)
        f.write("\n")
PY
