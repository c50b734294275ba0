#!/usr/bin/env bash
# gpt_fsdp.sh — GPT-NeoX and Llama training throughput and memory under trainyard's FSDP
# strategies, its DDP, and the Python PyTorch peers (the venv's torch: its DDP and its FSDP2),
# measured side by side in one invocation: the variants alternate within each round, and every
# round runs them all, so drift on the shared machine hits all alike; the table takes the median
# over rounds.
# The peer follows the preset's family: GPT-NeoX presets (pythia-*, ...) run
# bench/python/gpt_neox_ddp.py, Llama presets (llama-*, smollm2-*, tinyllama-*) run
# bench/python/llama_ddp.py; each mirrors the C++ model, its per-name initialisation and its data,
# so that fp32 losses match.
#
# Variants (names for --variants):
#   ddp:fp32 ddp:bf16                     train_gpt_fsdp --strategy ddp
#   no_shard:fp32 no_shard:bf16           train_gpt_fsdp --strategy no_shard
#   shard_grad_op:fp32 shard_grad_op:bf16 train_gpt_fsdp --strategy shard_grad_op
#   full_shard:fp32 full_shard:bf16       train_gpt_fsdp --strategy full_shard
#   full_shard:fp32:ac full_shard:bf16:ac ... with --activation-checkpointing
#   python:fp32 python:bf16               the Python peer, torch DDP over Gloo
#   fsdp2:fp32 fsdp2:bf16                 the Python peer under PyTorch's FSDP2 (fully_shard on
#                                         each decoder layer and the root, a CPU mesh over Gloo)
# and, only when named: python:fp32:reuse python:bf16:reuse, the peer with glibc told to keep freed
# memory for reuse (MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=2147483647), as trainyard's ranks do
# by themselves (Note [Reusing freed memory]).
# bf16 is --precision bf16-mixed (C++ FSDP: bf16 parameters, fp32 reduction; C++ DDP and the
# Python DDP peer: CPU autocast to bf16; FSDP2: bf16 parameters, fp32 reduction, as ours); fp32 is
# --precision fp32. A variant that fails (exit code,
# timeout, or no result line) is reported as "failed" and the others go on.
#
# Columns: tokens/s over steps 1.. (the warm-up step 0 left out: the script stamps each
# "step N loss X" line as it arrives, so it needs --steps >= 2), median over rounds, and each
# round's; "as printed", what the runs themselves report (all steps, the first included; the
# slowest rank's); peak RSS of the largest rank; model state per rank (fp32 parameters,
# gradients and both AdamW moments that the rank owns); the losses of the first and last step
# (the mean over ranks; fp32 variants compute the same ones); and
#   MFU = 6 x parameters x tokens/s / peak,
# where peak is this machine's measured matmul throughput in the variant's compute dtype (fp32 or
# bf16) with R ranks x 1 thread running at once: the sum of R processes, started by `trainyard
# run` like the ranks, each timing square N x N torch.mm with torch.set_num_threads(1) in the
# venv's torch, which loads the same LibTorch library as the C++ example (the script checks and
# prints both paths). 6 x parameters counts model FLOPs only (no attention scores, no
# recomputation under activation checkpointing), and counts the input embedding, a lookup (the
# output says by how much).
# (For a tied model, smollm2-135m and llama-3.2-1b, the embedding is also the output projection,
# so every parameter is a matmul one.)
# Then the ratios, with each round's own ratio beside the ratio of the medians. GPT-NeoX:
# FULL_SHARD bf16 / DDP bf16 tokens/s (bar >= 0.9), FULL_SHARD bf16 / Python DDP bf16 tokens/s
# (bar >= 1.5; also against python:bf16:reuse when it ran), FULL_SHARD fp32 / DDP fp32 peak RSS,
# and FULL_SHARD against PyTorch's DDP and FSDP2 in fp32 and bf16 (unbarred).
# Llama (issue 27): FULL_SHARD bf16 / Python DDP bf16 tokens/s (bar >= 1.25) and the MFU of
# FULL_SHARD bf16 (bar >= 50 %), with the same ratios as GPT-NeoX's otherwise, unbarred.
#
#   bench/gpt_fsdp.sh                       # pythia-70m, seq 256, batch 4/rank, 2 ranks x 1 thread:
#                                           # ~12 minutes on a quiet machine
#   bench/gpt_fsdp.sh --smoke               # ~1.5 minutes: pythia-14m, seq 64, batch 1, 2 steps, 1 round
#   bench/gpt_fsdp.sh --smoke --preset llama-tiny   # an explicit flag wins over --smoke's
#   bench/gpt_fsdp.sh --preset smollm2-135m --variants ddp:bf16,full_shard:bf16,python:bf16
#   bench/gpt_fsdp.sh --preset tinyllama-1.1b --variants ddp:bf16,full_shard:bf16,python:bf16 \
#       --rounds 1 --run-timeout 1800       # ~1B: C++ DDP and the peer hold 16 bytes x 1.1B =
#                                           # 17.6 GB of model state per rank (2 ranks: ~45 GB of
#                                           # RAM with activations), FULL_SHARD half of it
#   bench/gpt_fsdp.sh --variants all,python:fp32:reuse,python:bf16:reuse --rounds 3
#   bench/gpt_fsdp.sh --variants ddp:fp32,full_shard:fp32,python:fp32,fsdp2:fp32 --profile
#   bench/gpt_fsdp.sh --rounds 5 --steps 6 --variants ddp:bf16,full_shard:bf16,python:bf16
#   BENCH_STEPS=2 bench/gpt_fsdp.sh          # every flag has a BENCH_* variable
#
# It runs, per round and variant:
#   build/trainyard run --nproc-per-node R -- stdbuf -oL build/examples/train_gpt_fsdp --preset P \
#       --strategy S --precision X [--activation-checkpointing] --seq-len T --batch-size B \
#       --steps N --lr LR --seed SEED --data FILE
#   build/trainyard run --nproc-per-node R -- /opt/trainyard/venv/bin/python bench/python/PEER \
#       --parallel ddp|fsdp2 --preset P --precision X --seq-len T --batch-size B --steps N --lr LR \
#       --seed SEED --data FILE
# (PEER: gpt_neox_ddp.py or llama_ddp.py, by the preset's family). With --profile, each variant
# then runs once more with --profile FILE (rank 0's step 1 under LibTorch's profiler, on both
# sides) and bench/profile_step.py prints where each one's step went, operator by operator.
#
# Flags (environment variable, default):
#   --preset P        BENCH_PRESET       pythia-70m  (llama-tiny takes --seq-len <= 64)
#   --seq-len T       BENCH_SEQ_LEN      256
#   --batch-size B    BENCH_BATCH_SIZE   4      sequences per rank
#   --steps N         BENCH_STEPS        3      steps per run (>= 2; the first is warm-up)
#   --rounds K        BENCH_ROUNDS       2      (--repeats is the same)
#   --variants LIST   BENCH_VARIANTS     all    comma-separated names from the list above; "all"
#                                               is the default twelve (all,python:bf16:reuse adds one)
#   --ranks R         BENCH_RANKS        2
#   --lr LR           BENCH_LR           1e-4   AdamW learning rate
#   --seed S          BENCH_SEED         0
#   --data FILE       BENCH_DATA         /usr/share/games/fortunes/fortunes (its bytes are tokens)
#   --peak-size N     BENCH_PEAK_SIZE    2048   matmul size for the peak
#   --peak-seconds S  BENCH_PEAK_SECONDS 4      seconds per dtype for the peak
#   --run-timeout S   BENCH_RUN_TIMEOUT  600    a run taking longer is stopped and counts as failed
#   --profile                                   after the rounds, one profiled run per variant
#   --smoke                                     --preset pythia-14m --seq-len 64 --batch-size 1
#                                               --steps 2 --rounds 1 --peak-size 1024 --peak-seconds 1,
#                                               each unless given as a flag (in any order)
#   --trainyard P     BENCH_TRAINYARD    build/trainyard (of this checkout)
#   --example P       BENCH_EXAMPLE      build/examples/train_gpt_fsdp (of this checkout)
#   --python P        BENCH_PYTHON       /opt/trainyard/venv/bin/python (the venv)
#   --json FILE       BENCH_JSON         also write the runs, the table and the ratios as JSON
#   --keep                               keep the temporary folder (logs) and print it
#   --verbose                            show the runs' output as they go
# No network is used; all files go to a temporary folder removed on exit.
set -euo pipefail

BENCH_NAME=gpt_fsdp
# shellcheck source=bench/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
# This benchmark's defaults where common.sh's (FashionMNIST's) differ.
BATCH_SIZE=${BENCH_BATCH_SIZE:-4}
LR=${BENCH_LR:-1e-4}
REPEATS=${BENCH_ROUNDS:-${BENCH_REPEATS:-2}}
PRESET=${BENCH_PRESET:-pythia-70m}
SEQ_LEN=${BENCH_SEQ_LEN:-256}
STEPS=${BENCH_STEPS:-3}
VARIANTS=${BENCH_VARIANTS:-all}
DATA=${BENCH_DATA:-/usr/share/games/fortunes/fortunes}
PEAK_SIZE=${BENCH_PEAK_SIZE:-2048}
PEAK_SECONDS=${BENCH_PEAK_SECONDS:-4}
RUN_TIMEOUT=${BENCH_RUN_TIMEOUT:-600}
EXAMPLE=${BENCH_EXAMPLE:-$ROOT/build/examples/train_gpt_fsdp}
SMOKE=0
PROFILE=0
declare -A GIVEN=()  # the flags given, which --smoke leaves alone
ALL_VARIANTS=(ddp:fp32 ddp:bf16 no_shard:fp32 no_shard:bf16 shard_grad_op:fp32 shard_grad_op:bf16
  full_shard:fp32 full_shard:bf16 full_shard:fp32:ac full_shard:bf16:ac python:fp32 python:bf16
  fsdp2:fp32 fsdp2:bf16)
OPTIONAL_VARIANTS=(python:fp32:reuse python:bf16:reuse)

while (($#)); do
  [[ -z $1 ]] || GIVEN[$1]=1
  case $1 in
    --preset) PRESET=${2:?}; shift 2 ;;
    --seq-len) SEQ_LEN=${2:?}; shift 2 ;;
    --steps) STEPS=${2:?}; shift 2 ;;
    --rounds) REPEATS=${2:?}; shift 2 ;;
    --variants) VARIANTS=${2:?}; shift 2 ;;
    --data) DATA=${2:?}; shift 2 ;;
    --peak-size) PEAK_SIZE=${2:?}; shift 2 ;;
    --peak-seconds) PEAK_SECONDS=${2:?}; shift 2 ;;
    --run-timeout) RUN_TIMEOUT=${2:?}; shift 2 ;;
    --example) EXAMPLE=${2:?}; shift 2 ;;
    --python) PYTHON=${2:?}; shift 2 ;;
    --smoke) SMOKE=1; shift ;;
    --profile) PROFILE=1; shift ;;
    --threads|--limit|--epochs) die "$1 does not apply here (1 thread per rank, as the C++ example runs)" ;;
    *)
      bench_common_flag "$@"
      ((BENCH_CONSUMED > 0)) || die "unknown argument '$1' (see --help)"
      shift "$BENCH_CONSUMED" ;;
  esac
done

if ((SMOKE)); then
  smoke_default() {  # VARIABLE VALUE FLAG...: VALUE unless one of the flags was given
    local flag
    for flag in "${@:3}"; do [[ -v GIVEN[$flag] ]] && return 0; done
    printf -v "$1" '%s' "$2"
  }
  smoke_default PRESET pythia-14m --preset
  smoke_default SEQ_LEN 64 --seq-len
  smoke_default BATCH_SIZE 1 --batch-size
  smoke_default STEPS 2 --steps
  smoke_default REPEATS 1 --rounds --repeats
  smoke_default PEAK_SIZE 1024 --peak-size
  smoke_default PEAK_SECONDS 1 --peak-seconds
fi
# The model family, by the preset's name: its Python peer and its bars.
case $PRESET in
  llama-*|smollm2-*|tinyllama-*) FAMILY=Llama; GPT_PEER=$ROOT/bench/python/llama_ddp.py ;;
  *) FAMILY=GPT-NeoX; GPT_PEER=$ROOT/bench/python/gpt_neox_ddp.py ;;
esac

bench_validate
for v in SEQ_LEN STEPS PEAK_SIZE PEAK_SECONDS RUN_TIMEOUT; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "$v must be a positive integer, got '${!v}'"
done
((SEQ_LEN >= 2)) || die "SEQ_LEN must be at least 2, got $SEQ_LEN"
((STEPS >= 2)) || die "STEPS must be at least 2 (the first step is warm-up and not timed), got $STEPS"
[[ -x $EXAMPLE ]] || die "$EXAMPLE is missing or not executable: build the project first (cmake --build build --target train_gpt_fsdp)."
[[ -f $GPT_PEER ]] || die "the Python peer $GPT_PEER is missing."
[[ -r $DATA ]] || die "--data $DATA cannot be read (Debian's fortunes package installs the default: apt-get install fortunes)."
"$PYTHON" -c 'import torch' 2>/dev/null ||
  die "$PYTHON cannot import torch: install python3-torch, or point --python at an interpreter that has it."
peer_presets=$("$PYTHON" -c '
import importlib.util, sys
spec = importlib.util.spec_from_file_location("peer", sys.argv[1])
peer = importlib.util.module_from_spec(spec)
spec.loader.exec_module(peer)
print(" ".join(sorted(peer.PRESETS)))' "$GPT_PEER") || die "cannot read the presets of $GPT_PEER."
[[ " $peer_presets " == *" $PRESET "* ]] ||
  die "--preset $PRESET: $FAMILY's Python peer $(basename "$GPT_PEER") knows $peer_presets."
if [[ $VARIANTS == all ]]; then
  SELECTED=("${ALL_VARIANTS[@]}")
else
  IFS=, read -r -a named <<<"$VARIANTS"
  SELECTED=()
  for v in "${named[@]}"; do
    if [[ $v == all ]]; then SELECTED+=("${ALL_VARIANTS[@]}"); continue; fi
    SELECTED+=("$v")
    [[ " ${ALL_VARIANTS[*]} ${OPTIONAL_VARIANTS[*]} " == *" $v "* ]] ||
      die "unknown variant '$v'; known: ${ALL_VARIANTS[*]} ${OPTIONAL_VARIANTS[*]}"
  done
fi
bench_start

# --- what runs where: the machine, the BLAS kernels, and the LibTorch both sides load -------------
libtorch_of() {  # FILE: the libtorch_cpu it resolves to
  ldd "$1" 2>/dev/null | awk '/libtorch_cpu/ && !found {print $3; found = 1}' || true
}
cpp_libtorch=$(libtorch_of "$EXAMPLE")
py_libtorch=$(libtorch_of "$("$PYTHON" -c 'import torch._C; print(torch._C.__file__)')")
py_torch_version=$("$PYTHON" -c 'import torch; print(torch.__version__)')
same_libtorch="the same library"
if [[ -z $cpp_libtorch || -z $py_libtorch ]] ||
  [[ $(readlink -f "$cpp_libtorch") != $(readlink -f "$py_libtorch") ]]; then
  same_libtorch="DIFFERENT libraries: the peak may not apply to the C++ side"
fi
{
  echo "$FAMILY $PRESET: trainyard FSDP / DDP vs Python PyTorch DDP ($(basename "$GPT_PEER"))"
  echo "  $RANKS rank(s) x 1 thread, seq $SEQ_LEN, batch $BATCH_SIZE/rank, $STEPS step(s)/run (the first is warm-up), $REPEATS round(s), lr $LR, seed $SEED"
  echo "  data: $DATA"
  echo "  machine: $(lscpu | sed -n 's/^Model name: *//p' | head -n 1), $(nproc) CPU(s), OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-(unset: trainyard run picks it)}"
  echo "  LibTorch: train_gpt_fsdp loads ${cpp_libtorch:-?}; $PYTHON (torch $py_torch_version) loads ${py_libtorch:-?}: $same_libtorch"
} >&2
warn_if_busy

# --- the peak: R processes x 1 thread, square matmuls, in each dtype, at the same time ------------
cat >"$TMP/matmul_peak.py" <<'EOF'
import os, sys, time
import torch
import torch.distributed as dist
n, seconds = int(sys.argv[1]), float(sys.argv[2])
dist.init_process_group("gloo", init_method="env://")
torch.set_num_threads(1)
for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    c = torch.empty(n, n, dtype=dtype)
    torch.mm(a, b, out=c)  # warm-up
    dist.barrier()  # all ranks time the same window
    count, start = 0, time.perf_counter()
    while True:
        torch.mm(a, b, out=c)
        count += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            break
    print(f"peak {name} rank {dist.get_rank()} {2 * n**3 * count / elapsed / 1e9:.2f} GFLOPS", flush=True)
    dist.barrier()
dist.destroy_process_group()
EOF
printf '  matmul peak (%d ranks x 1 thread, %dx%d, %d s per dtype) ... ' "$RANKS" "$PEAK_SIZE" "$PEAK_SIZE" "$PEAK_SECONDS" >&2
"$TRAINYARD" run --nproc-per-node "$RANKS" -- "$PYTHON" "$TMP/matmul_peak.py" "$PEAK_SIZE" "$PEAK_SECONDS" \
  >"$TMP/peak.log" 2>&1 || { echo "FAILED" >&2; tail -n 20 "$TMP/peak.log" >&2; die "the matmul peak could not be measured"; }
PEAKS=$TMP/peaks.tsv  # dtype, rank, GFLOPS
grep -oE 'peak (fp32|bf16) rank [0-9]+ [0-9.]+ GFLOPS' "$TMP/peak.log" | awk '{print $2 "\t" $4 "\t" $5}' >"$PEAKS"
awk -F'\t' '{s[$1] += $3} END {printf "fp32 %.1f GFLOPS, bf16 %.1f GFLOPS\n", s["fp32"], s["bf16"]}' "$PEAKS" >&2

# --- the runs -----------------------------------------------------------------------------------
# stamp: each input line with the time it arrived (seconds since the epoch) in front. The ranks
# print "step N loss X" as each step ends (the C++ example under stdbuf -oL, the peer flushes),
# so the stamps time the steps: steady tokens/s = (N - 1) x B x T x R / (stamp of the last step -
# stamp of step 0), the warm-up step left out.
stamp() {
  local line
  while IFS= read -r line; do printf '%s %s\n' "$EPOCHREALTIME" "$line"; done
}

# variant_command VARIANT: the rank's command line, into the array CMD.
variant_command() {
  local kind precision ac=""
  IFS=: read -r kind precision ac <<<"$1"
  local prec_flag=fp32
  [[ $precision == bf16 ]] && prec_flag=bf16-mixed
  local common=(--preset "$PRESET" --precision "$prec_flag" --seq-len "$SEQ_LEN"
    --batch-size "$BATCH_SIZE" --steps "$STEPS" --lr "$LR" --seed "$SEED" --data "$DATA")
  if [[ $kind == python || $kind == fsdp2 ]]; then
    local parallel=ddp
    [[ $kind == fsdp2 ]] && parallel=fsdp2
    CMD=("$PYTHON" "$GPT_PEER" --parallel "$parallel" "${common[@]}")
    [[ $ac == reuse ]] && CMD=(env MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=2147483647 "${CMD[@]}")
  else
    CMD=(stdbuf -oL "$EXAMPLE" --strategy "$kind" "${common[@]}")
    [[ $ac == ac ]] && CMD+=(--activation-checkpointing)
  fi
  return 0
}

# run_variant ROUND VARIANT: runs it once, appends a row to $RUNS: round, variant, status, busy%,
# steady tokens/s, tokens/s as printed (slowest rank), peak RSS MiB (largest rank), model state MiB
# (largest rank), first loss, last loss, wall seconds (or, for a failed run, why), exposed
# communication % (FSDP's own figure, largest rank; empty where the run prints none).
run_variant() {
  local round=$1 variant=$2
  variant_command "$variant"
  local cmd=("${CMD[@]}")
  local log=$TMP/round$round-${variant//:/-}.log busy rc t0 t1
  busy=$(cpu_busy)
  printf '  round %d/%d %-20s ... ' "$round" "$REPEATS" "$variant" >&2
  ((VERBOSE)) && echo >&2
  t0=$EPOCHREALTIME
  {
    local status=0
    timeout --foreground --kill-after=10 "$RUN_TIMEOUT" "$TRAINYARD" run --nproc-per-node "$RANKS" -- "${cmd[@]}" 2>&1 ||
      status=$?
    echo "$status" >"$log.rc"
  } | stamp | if ((VERBOSE)); then tee "$log" >&2; else cat >"$log"; fi
  rc=$(<"$log.rc")
  t1=$EPOCHREALTIME
  local results
  results=$(grep -oE 'rank [0-9]+: [0-9.]+ tokens/s, peak RSS [0-9.]+ MiB, model state [0-9.]+ MiB(, cached blocks [0-9]+ MiB)?(, exposed comm [0-9.]+%)?' "$log" || true)
  if ((rc != 0)) || (($(grep -c . <<<"$results") != RANKS)); then
    local why="exit $rc"
    local first_error=""
    if ((rc == 124 || rc == 137)); then
      why="timed out after $RUN_TIMEOUT s"
    else
      first_error=": $(grep -m 1 -iE 'error|refuse|train_gpt_fsdp:|Traceback' "$log" | cut -d ' ' -f 2- | cut -c 1-160 || true)"
    fi
    echo "failed ($why)$first_error" >&2
    printf '%s\t%s\tfailed\t%s\t\t\t\t\t\t\t%s\t\n' "$round" "$variant" "$busy" "$why" >>"$RUNS"
    return 0
  fi
  # The stamped step lines: "STAMP [rank0]: step N loss X".
  local steady
  steady=$(grep -E '^[0-9.]+ .*step [0-9]+ loss ' "$log" | awk -v tokens=$((BATCH_SIZE * SEQ_LEN * RANKS)) '
    { if (n == 0) first = $1; last = $1; n++ }
    END { if (n >= 2 && last > first) printf "%.1f", (n - 1) * tokens / (last - first) }')
  local losses first last
  losses=$(grep -oE 'step [0-9]+ loss [-0-9.naif]+' "$log" | awk '{print $4}')
  first=$(head -n 1 <<<"$losses"); last=$(tail -n 1 <<<"$losses")
  awk -v r="$round" -v v="$variant" -v b="$busy" -v s="$steady" -v f="$first" -v l="$last" \
    -v t0="$t0" -v t1="$t1" '
    { tps = $3 + 0; rss = $7 + 0; st = $11 + 0
      if (n == 0 || tps < min_tps) min_tps = tps
      if (rss > max_rss) max_rss = rss
      if (st > max_st) max_st = st
      if (match($0, /exposed comm [0-9.]+/)) {
        e = substr($0, RSTART + 13, RLENGTH - 13) + 0; if (exposed == "" || e > exposed) exposed = e }
      n++ }
    END { printf "%s\t%s\tok\t%s\t%s\t%.1f\t%.1f\t%.1f\t%s\t%s\t%.1f\t%s\n", r, v, b, s, min_tps, max_rss, max_st, f, l, t1 - t0, exposed }
  ' <<<"$results" >>"$RUNS"
  tail -n 1 "$RUNS" | awk -F'\t' '{printf "%s tokens/s steady (%.1f as printed), peak RSS %.0f MiB, loss %s -> %s, %.0f s\n", ($5 == "" ? "?" : $5), $6, $7, $9, $10, $11}' >&2
}

n=${#SELECTED[@]}
for ((round = 1; round <= REPEATS; round++)); do
  # Each round starts one variant later, so that no variant always runs first (or after the peak).
  for ((k = 0; k < n; k++)); do
    run_variant "$round" "${SELECTED[(k + round - 1) % n]}"
  done
done

# --- the table and the ratios ---------------------------------------------------------------------
"$PYTHON" - "$RUNS" "$PEAKS" "$JSON_OUT" "$GPT_PEER" "$FAMILY" "$PRESET" "$RANKS" "$SEQ_LEN" \
  "$BATCH_SIZE" "$STEPS" "$REPEATS" "$LR" "$SEED" "${SELECTED[@]}" <<'EOF'
import importlib.util, json, statistics, sys
(runs_path, peaks_path, json_out, peer_path, family, preset, ranks, seq, batch, steps, rounds, lr,
 seed, *variants) = sys.argv[1:]
spec = importlib.util.spec_from_file_location("peer", peer_path)
peer = importlib.util.module_from_spec(spec)
spec.loader.exec_module(peer)  # the peer's presets: the parameter count by formula
config = peer.Config(**peer.PRESETS[preset], **peer.COMMON)
params = config.parameter_count()
llama = family == "Llama"

peak = {}  # GFLOPS, summed over ranks
for line in open(peaks_path):
    dtype, _rank, gflops = line.split("\t")
    peak[dtype] = peak.get(dtype, 0.0) + float(gflops)

runs = []
for line in open(runs_path):
    f = line.rstrip("\n").split("\t")
    r = dict(round=int(f[0]), variant=f[1], status=f[2], busy_percent_before=float(f[3] or 0))
    if f[2] == "ok":
        r.update(steady_tokens_per_s=float(f[4]) if f[4] else None,
                 printed_tokens_per_s=float(f[5]), peak_rss_mib=float(f[6]),
                 model_state_mib=float(f[7]), first_loss=float(f[8]), last_loss=float(f[9]),
                 wall_s=float(f[10]),
                 exposed_comm_percent=float(f[11]) if f[11] and not f[1].startswith("ddp") else None)
        # The steady rate where the steps could be timed (2 steps or more), else the printed one.
        r["tokens_per_s"] = r["steady_tokens_per_s"] or r["printed_tokens_per_s"]
    else:
        r.update(reason=f[10])
    runs.append(r)

def label(v):
    kind, prec, *ac = v.split(":")
    name = {"ddp": "C++ DDP", "python": "PyTorch DDP", "fsdp2": "PyTorch FSDP2"}.get(
        kind, "FSDP " + kind.upper())
    extra = {"ac": " +act.ckpt", "reuse": " +malloc reuse"}.get(ac[0] if ac else "", "")
    return f"{name} {'bf16-mixed' if prec == 'bf16' else 'fp32'}{extra}"

rows = {}
for v in variants:
    ok = [r for r in runs if r["variant"] == v and r["status"] == "ok"]
    if not ok:
        rows[v] = None
        continue
    tps = statistics.median(r["tokens_per_s"] for r in ok)
    dtype = v.split(":")[1]
    rows[v] = dict(tokens_per_s=tps, rounds=[(r["tokens_per_s"], r["busy_percent_before"]) for r in ok],
                   failed_rounds=sum(1 for r in runs if r["variant"] == v and r["status"] != "ok"),
                   printed_tokens_per_s=statistics.median(r["printed_tokens_per_s"] for r in ok),
                   peak_rss_mib=statistics.median(r["peak_rss_mib"] for r in ok),
                   model_state_mib=statistics.median(r["model_state_mib"] for r in ok),
                   first_loss=ok[0]["first_loss"],
                   last_loss=statistics.median(r["last_loss"] for r in ok),
                   exposed_comm_percent=statistics.median(r["exposed_comm_percent"] for r in ok)
                   if all(r["exposed_comm_percent"] is not None for r in ok) else None,
                   mfu=6 * params * tps / (peak[dtype] * 1e9) if peak.get(dtype) else None)

print(f"\n{family} {preset} ({params / 1e6:.1f}M parameters), {ranks} ranks x 1 thread, seq {seq}, "
      f"batch {batch}/rank, {steps} steps/run, median of {rounds} round(s)")
if getattr(config, "tie_word_embeddings", False):  # the embedding is also the output projection
    print(f"MFU = 6 x {params / 1e6:.1f}M x tokens/s / peak (the brief's count; the input embedding "
          f"is tied to the output projection, so every parameter takes part in a matmul)")
else:
    lookup = config.vocab_size * config.hidden_size  # embed_in / embed_tokens: a lookup, no matmul
    print(f"MFU = 6 x {params / 1e6:.1f}M x tokens/s / peak (the brief's count; {lookup / 1e6:.1f}M of "
          f"the parameters are the input embedding, a lookup: counting only matmul parameters gives "
          f"{(params - lookup) / params:.2f}x these MFUs)")
print(f"matmul peak, {ranks} ranks x 1 thread at once: fp32 {peak.get('fp32', 0):.1f} GFLOPS, "
      f"bf16 {peak.get('bf16', 0):.1f} GFLOPS")
BUSY = 10  # % of the CPUs busy with other work in the second before a run: marked with *
print("tokens/s: steps 1.. (the warm-up step left out), median over rounds; 'as printed': the "
      f"runs' own figure, all steps; * after a round's figure: the CPUs were more than {BUSY} % "
      "busy with other work just before it started")
print("| variant | tokens/s | rounds | as printed | peak RSS/rank | model state/rank | MFU | exposed comm | loss step 0 | last loss |")
print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for v in variants:
    row = rows[v]
    if row is None:
        reasons = sorted({r.get("reason", "") for r in runs if r["variant"] == v})
        print(f"| {label(v)} | failed ({', '.join(reasons)}) | | | | | | | | |")
        continue
    per_round = " / ".join(f"{x:.1f}" + ("*" if busy > BUSY else "") for x, busy in row["rounds"])
    per_round += " (+failed)" if row["failed_rounds"] else ""
    mfu = f"{100 * row['mfu']:.1f} %" if row["mfu"] is not None else "?"
    exposed = row["exposed_comm_percent"]
    exposed = f"{exposed:.1f} %" if exposed is not None else "-"
    print(f"| {label(v)} | {row['tokens_per_s']:.1f} | {per_round} | {row['printed_tokens_per_s']:.1f} | "
          f"{row['peak_rss_mib'] / 1024:.2f} GiB | {row['model_state_mib']:.1f} MiB | {mfu} | {exposed} | "
          f"{row['first_loss']:.6f} | {row['last_loss']:.6f} |")

def ratio(a, b, key, bar=None, name=""):
    ra, rb = rows.get(a), rows.get(b)
    if ra is None or rb is None:
        missing = " and ".join(label(x) for x in (a, b) if rows.get(x) is None)
        print(f"  {name}: n/a ({missing} {'not selected' if not all(x in rows for x in (a, b)) else 'failed'})")
        return None
    value = ra[key] / rb[key]
    paired = []  # per round, for the spread
    for rnd in sorted({r["round"] for r in runs}):
        xa = [r[key] for r in runs if r["variant"] == a and r["round"] == rnd and r["status"] == "ok"]
        xb = [r[key] for r in runs if r["variant"] == b and r["round"] == rnd and r["status"] == "ok"]
        if xa and xb:
            paired.append(xa[0] / xb[0])
    verdict = "" if bar is None else ("  (bar >= %.2f: %s)" % (bar, "met" if value >= bar else "NOT met"))
    spread = f"; per round {', '.join(f'{p:.2f}' for p in paired)}" if len(paired) > 1 else ""
    print(f"  {name}: {value:.2f}{verdict}{spread}")
    return value

# The bars: GPT-NeoX's, or issue 27's for Llama (>= 1.25x the peer, >= 50 % MFU).
DDP_BAR, PEER_BAR, MFU_BAR = (None, 1.25, 0.5) if llama else (0.9, 1.5, None)

def mfu_line(v, bar, name):
    row = rows.get(v)
    if row is None or row["mfu"] is None:
        why = "not selected" if v not in rows else "failed" if row is None else "no peak"
        print(f"  {name}: n/a ({label(v)} {why})")
        return None
    verdict = "" if bar is None else ("  (bar >= %.0f %%: %s)" % (100 * bar, "met" if row["mfu"] >= bar else "NOT met"))
    print(f"  {name}: {100 * row['mfu']:.1f} %{verdict}")
    return row["mfu"]

print("\nratios (of the medians):")
ratios = {
    "full_shard_bf16_over_ddp_bf16_tokens_per_s": ratio(
        "full_shard:bf16", "ddp:bf16", "tokens_per_s", DDP_BAR, "FULL_SHARD bf16 / C++ DDP bf16 tokens/s"),
    "full_shard_bf16_over_python_ddp_bf16_tokens_per_s": ratio(
        "full_shard:bf16", "python:bf16", "tokens_per_s", PEER_BAR,
        "FULL_SHARD bf16 / PyTorch DDP bf16 tokens/s"),
    **({"full_shard_bf16_over_python_ddp_bf16_reuse_tokens_per_s": ratio(
        "full_shard:bf16", "python:bf16:reuse", "tokens_per_s", PEER_BAR,
        "FULL_SHARD bf16 / PyTorch DDP bf16 +malloc reuse tokens/s")}
       if "python:bf16:reuse" in rows else {}),
    **({"full_shard_bf16_mfu": mfu_line("full_shard:bf16", MFU_BAR, "MFU of FULL_SHARD bf16")}
       if llama else {}),
    "full_shard_fp32_over_ddp_fp32_peak_rss": ratio(
        "full_shard:fp32", "ddp:fp32", "peak_rss_mib", None, "FULL_SHARD fp32 / C++ DDP fp32 peak RSS"),
    "full_shard_fp32_over_ddp_fp32_tokens_per_s": ratio(
        "full_shard:fp32", "ddp:fp32", "tokens_per_s", None, "FULL_SHARD fp32 / C++ DDP fp32 tokens/s"),
    "full_shard_fp32_over_python_ddp_fp32_tokens_per_s": ratio(
        "full_shard:fp32", "python:fp32", "tokens_per_s", None,
        "FULL_SHARD fp32 / PyTorch DDP fp32 tokens/s"),
    "full_shard_fp32_over_fsdp2_fp32_tokens_per_s": ratio(
        "full_shard:fp32", "fsdp2:fp32", "tokens_per_s", None,
        "FULL_SHARD fp32 / PyTorch FSDP2 fp32 tokens/s"),
    "full_shard_bf16_over_fsdp2_bf16_tokens_per_s": ratio(
        "full_shard:bf16", "fsdp2:bf16", "tokens_per_s", None,
        "FULL_SHARD bf16 / PyTorch FSDP2 bf16 tokens/s"),
    "ddp_fp32_over_python_ddp_fp32_tokens_per_s": ratio(
        "ddp:fp32", "python:fp32", "tokens_per_s", None, "C++ DDP fp32 / PyTorch DDP fp32 tokens/s"),
    "full_shard_bf16_over_ddp_fp32_tokens_per_s": ratio(
        "full_shard:bf16", "ddp:fp32", "tokens_per_s", None,
        "FULL_SHARD bf16 / C++ DDP fp32 tokens/s (for reference)"),
}
if json_out:
    with open(json_out, "w") as f:
        json.dump({"benchmark": "gpt_fsdp", "family": family, "preset": preset, "parameters": params,
                   "ranks": int(ranks), "seq_len": int(seq), "batch_size": int(batch),
                   "steps": int(steps), "rounds": int(rounds), "lr": float(lr), "seed": int(seed),
                   "peak_gflops": peak, "runs": runs, "table": rows, "ratios": ratios}, f, indent=2)
        f.write("\n")
EOF

# --- with --profile: one more run of each variant, rank 0's step 1 under LibTorch's profiler -----
((PROFILE)) || exit 0
echo >&2
traces=()
for v in "${SELECTED[@]}"; do
  variant_command "$v"
  trace=$TMP/profile-${v//:/-}.json
  printf '  profiling %-20s ... ' "$v" >&2
  if timeout --foreground --kill-after=10 "$RUN_TIMEOUT" "$TRAINYARD" run --nproc-per-node "$RANKS" -- \
    "${CMD[@]}" --profile "$trace" >"$TMP/profile-${v//:/-}.log" 2>&1 && [[ -s $trace ]]; then
    echo "done" >&2
    traces+=("$v=$trace")
  else
    echo "failed (see --keep's logs)" >&2
  fi
done
if ((${#traces[@]})); then
  echo
  echo "where rank 0's step 1 went (self time of each operator, LibTorch's profiler on both sides):"
  "$PYTHON" "$ROOT/bench/profile_step.py" --top 8 "${traces[@]}"
fi
