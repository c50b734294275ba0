#!/usr/bin/env bash
# cpu_allocator.sh — the ways init() can keep freed memory for reuse (TRAINYARD_CPU_ALLOCATOR, Note
# [Reusing freed memory]) side by side on GPT-NeoX training: `caching` (trainyard's caching CPU
# allocator, the default), `glibc-reuse` (mallopt: every block from the heap, never given back; the
# default before the caching allocator) and `glibc` (glibc's defaults). The allocators alternate
# within each round. Per run: tokens/s over steps 1.. (the first step, which faults everything in,
# left out), peak RSS of rank 0, and rank 0's RSS after step 1 and after the last step (their
# difference is what the process kept growing by: fragmentation).
#
#   bench/cpu_allocator.sh                                  # pythia-70m FULL_SHARD fp32, 7 steps, 2 rounds
#   bench/cpu_allocator.sh --precision bf16-mixed --strategy ddp --rounds 3
#
# Flags (defaults): --preset pythia-70m --strategy full_shard --precision fp32 --seq-len 256
# --batch-size 4 --steps 7 --rounds 2 --ranks 2 --allocators caching,glibc-reuse,glibc
# --data /usr/share/games/fortunes/fortunes. It runs, per round and allocator:
#   TRAINYARD_CPU_ALLOCATOR=A build/trainyard run --nproc-per-node R -- \
#       build/examples/train_gpt_fsdp --preset P --strategy S --precision X --seq-len T \
#       --batch-size B --steps N --data FILE --memory-trace
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PRESET=pythia-70m STRATEGY=full_shard PRECISION=fp32 SEQ_LEN=256 BATCH=4 STEPS=7 ROUNDS=2 RANKS=2
ALLOCATORS=caching,glibc-reuse,glibc
DATA=/usr/share/games/fortunes/fortunes
die() { echo "cpu_allocator.sh: error: $*" >&2; exit 2; }
while (($#)); do
  case $1 in
    --preset) PRESET=${2:?}; shift 2 ;;
    --strategy) STRATEGY=${2:?}; shift 2 ;;
    --precision) PRECISION=${2:?}; shift 2 ;;
    --seq-len) SEQ_LEN=${2:?}; shift 2 ;;
    --batch-size) BATCH=${2:?}; shift 2 ;;
    --steps) STEPS=${2:?}; shift 2 ;;
    --rounds) ROUNDS=${2:?}; shift 2 ;;
    --ranks) RANKS=${2:?}; shift 2 ;;
    --allocators) ALLOCATORS=${2:?}; shift 2 ;;
    --data) DATA=${2:?}; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
for v in SEQ_LEN BATCH STEPS ROUNDS RANKS; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "--${v,,} must be a positive integer, got '${!v}'"
done
((STEPS >= 3)) || die "--steps must be at least 3 (step 0 is warm-up; growth is measured from step 1)"
EXAMPLE=$ROOT/build/examples/train_gpt_fsdp
[[ -x $EXAMPLE && -x $ROOT/build/trainyard ]] || die "build the project first (cmake --build build)"
[[ -r $DATA ]] || die "--data $DATA cannot be read (apt-get install fortunes)"
IFS=, read -r -a allocs <<<"$ALLOCATORS"
for a in "${allocs[@]}"; do
  [[ $a == caching || $a == glibc-reuse || $a == glibc ]] || die "unknown allocator '$a' (caching, glibc-reuse, glibc)"
done
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

echo "GPT-NeoX $PRESET, $STRATEGY $PRECISION, $RANKS ranks x 1 thread, seq $SEQ_LEN, batch $BATCH/rank, $STEPS steps, $ROUNDS round(s)"
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPU(s), OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}"
results=$TMP/results
: >"$results"
for ((r = 1; r <= ROUNDS; r++)); do
  n=${#allocs[@]}
  for ((k = 0; k < n; k++)); do
    a=${allocs[$(((k + r - 1) % n))]}  # each round starts one allocator later
    log=$TMP/$a.$r.log
    printf '  round %d/%d %-12s ... ' "$r" "$ROUNDS" "$a" >&2
    env -u MALLOC_MMAP_MAX_ -u MALLOC_TRIM_THRESHOLD_ TRAINYARD_CPU_ALLOCATOR="$a" \
      "$ROOT/build/trainyard" run --nproc-per-node "$RANKS" -- stdbuf -oL "$EXAMPLE" \
      --preset "$PRESET" --strategy "$STRATEGY" --precision "$PRECISION" --seq-len "$SEQ_LEN" \
      --batch-size "$BATCH" --steps "$STEPS" --data "$DATA" --memory-trace 2>&1 |
      while IFS= read -r line; do printf '%s %s\n' "$EPOCHREALTIME" "$line"; done >"$log" || true
    # steady tokens/s from the stamps of the loss lines; RSS lines of rank 0 after the optimizer
    row=$(awk -v tokens=$((BATCH * SEQ_LEN * RANKS)) -v last=$((STEPS - 1)) '
      /\]: step [0-9]+ loss [-0-9.naif]+$/ { if (n == 0) first = $1; t = $1; n++ }
      /rank 0 step 1 optimizer RSS/ { for (i = 1; i <= NF; i++) if ($i == "RSS") s1 = $(i + 1) }
      $0 ~ "rank 0 step " last " optimizer RSS" { for (i = 1; i <= NF; i++) if ($i == "RSS") sl = $(i + 1) }
      /rank 0: .* peak RSS/ { for (i = 1; i <= NF; i++) if ($i == "RSS") peak = $(i + 1) }
      END { if (n < 2 || s1 == "" || sl == "" || peak == "") exit 1
            printf "%.1f %.0f %.0f %.0f", (n - 1) * tokens / (t - first), peak, s1 / 1024, sl / 1024 }' "$log") || {
      echo "failed: $(grep -m 1 -iE 'error|train_gpt_fsdp:' "$log" | cut -c 1-160)" >&2
      continue
    }
    echo "$a $r $row" >>"$results"
    read -r tps peak s1 sl <<<"$row"
    echo "$tps tokens/s, peak RSS $peak MiB, RSS after step 1 $s1 MiB, after step $((STEPS - 1)) $sl MiB" >&2
  done
done

echo
echo "RSS columns: rank 0's, the largest over rounds"
echo "| TRAINYARD_CPU_ALLOCATOR | tokens/s (median) | rounds | peak RSS | RSS after step 1 | RSS after step $((STEPS - 1)) | growth |"
echo "| --- | ---: | --- | ---: | ---: | ---: | ---: |"
for a in "${allocs[@]}"; do
  awk -v a="$a" '$1 == a { n++; tps[n] = $3; rounds = rounds (rounds == "" ? "" : " / ") $3
      if ($4 > peak) peak = $4; if ($5 > s1) s1 = $5; if ($6 > sl) sl = $6 }
    END { if (n == 0) { printf "| %s | failed | | | | | |\n", a; exit }
          for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (tps[j] < tps[i]) { x = tps[i]; tps[i] = tps[j]; tps[j] = x }
          med = n % 2 ? tps[(n + 1) / 2] : (tps[n / 2] + tps[n / 2 + 1]) / 2
          printf "| %s | %.1f | %s | %d MiB | %d MiB | %d MiB | %+d MiB |\n", a, med, rounds, peak, s1, sl, sl - s1 }' "$results"
done
