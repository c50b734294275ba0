#!/usr/bin/env bash
# causal_lm.sh — the causal-lm recipe (`trainyard train causal-lm`, the seed's fine-tuning job) on
# 2 ranks: tokens/s and peak RSS per rank for each variant, measured side by side in one
# invocation (the variants alternate within each round; the table takes the median over rounds).
#
# Usage: bench/causal_lm.sh [--model pythia-70m] [--data FILE] [--seq-len 256] [--batch-size 4]
#                           [--steps 6] [--rounds 2] [--variants LIST] [--keep]
# Variants (comma-separated names for --variants; default all):
#   full_shard:bf16 full_shard:bf16:ac full_shard:fp32 full_shard:fp32:ac ddp:bf16 ddp:fp32
# (":ac" adds --activation-checkpointing; bf16 is --precision bf16-mixed.)
# tokens/s counts token positions (padding included, as every position is computed) over the
# steps after the first of each run, from the run's result.json (steady_tokens_per_s: the slowest
# rank's time); peak RSS is each rank's ru_maxrss. One thread per rank.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TRAINYARD=${BENCH_TRAINYARD:-$ROOT/build/trainyard}
MODEL=pythia-70m
DATA=/usr/share/games/fortunes/fortunes
SEQ_LEN=256
BATCH=4
STEPS=6
ROUNDS=2
VARIANTS=full_shard:bf16,full_shard:bf16:ac,full_shard:fp32,full_shard:fp32:ac,ddp:bf16,ddp:fp32
KEEP=0
die() { echo "causal_lm.sh: error: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case $1 in
    --model) MODEL=${2:?}; shift 2 ;;
    --data) DATA=${2:?}; shift 2 ;;
    --seq-len) SEQ_LEN=${2:?}; shift 2 ;;
    --batch-size) BATCH=${2:?}; shift 2 ;;
    --steps) STEPS=${2:?}; shift 2 ;;
    --rounds) ROUNDS=${2:?}; shift 2 ;;
    --variants) VARIANTS=${2:?}; shift 2 ;;
    --keep) KEEP=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown flag $1 (see --help)" ;;
  esac
done
[ -x "$TRAINYARD" ] || die "$TRAINYARD is not built: cmake --build build"
[ -r "$DATA" ] || die "--data $DATA is not readable (Debian's fortunes package provides the default)"
[ "$STEPS" -ge 2 ] || die "--steps must be >= 2 (the first step is left out of tokens/s)"
TMP=$(mktemp -d /tmp/causal_lm_bench.XXXXXX)
[ "$KEEP" = 1 ] || trap 'rm -rf "$TMP"' EXIT

IFS=, read -r -a variants <<<"$VARIANTS"
declare -A tps rss0 rss1
for round in $(seq 1 "$ROUNDS"); do
  for v in "${variants[@]}"; do
    IFS=: read -r strategy precision ac <<<"$v"
    case $precision in bf16) p=bf16-mixed ;; fp32) p=fp32 ;; *) die "variant $v: precision bf16 or fp32" ;; esac
    flags=(--strategy "$strategy" --precision "$p")
    [ "${ac:-}" = ac ] && flags+=(--activation-checkpointing)
    name="${v//:/_}_$round"
    if "$TRAINYARD" train causal-lm --model "$MODEL" --data "$DATA" --workers 2 --threads 1 \
        --seq-len "$SEQ_LEN" --batch-size "$BATCH" --max-steps "$STEPS" --storage "$TMP" \
        --name "$name" --no-progress "${flags[@]}" >"$TMP/$name.log" 2>&1; then
      read -r t r0 r1 < <(/usr/bin/python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
print(r["steady_tokens_per_s"], r["peak_rss_mib_rank0"], r["peak_rss_mib_rank1"])' \
        "$TMP/$name/result.json")
      tps[$v]+="$t "; rss0[$v]+="$r0 "; rss1[$v]+="$r1 "
    else
      tps[$v]+="failed "; echo "causal_lm.sh: $v round $round failed; see $TMP/$name.log" >&2
    fi
    rm -rf "${TMP:?}/$name"  # its checkpoint: the next variant needs the disk and page cache
  done
done

median() { tr ' ' '\n' | grep -v '^$' | grep -v failed | sort -g | awk '{a[NR]=$1} END {if (NR==0) print "failed"; else if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
base=$(echo "${tps[${variants[0]}]}" | median)
echo "causal-lm, $MODEL, 2 ranks x 1 thread, seq $SEQ_LEN, batch $BATCH/rank, $STEPS steps, $ROUNDS rounds ($(date -u +%F), $(git -C "$ROOT" rev-parse --short HEAD))"
printf '| %-20s | %12s | %8s | %-22s | %18s |\n' variant "tokens/s" "vs ${variants[0]}" "each round" "peak RSS r0/r1 MiB"
printf '|%s|%s|%s|%s|%s|\n' "----------------------" "--------------" "----------" "------------------------" "--------------------"
for v in "${variants[@]}"; do
  m=$(echo "${tps[$v]}" | median)
  ratio=$(awk -v a="$m" -v b="$base" 'BEGIN { if (a+0 > 0 && b+0 > 0) printf "%.2f", a/b; else print "-" }')
  r0=$(echo "${rss0[$v]:-}" | median); r1=$(echo "${rss1[$v]:-}" | median)
  rounds=$(for t in ${tps[$v]}; do awk -v t="$t" 'BEGIN { if (t+0 > 0) printf "%.0f ", t; else printf "%s ", t }'; done)
  printf '| %-20s | %12.1f | %8s | %-22s | %18s |\n' "$v" "$m" "$ratio" "$rounds" "${r0%.*}/${r1%.*}"
done
