#!/usr/bin/env bash
# llama_lora.sh — LoRA fine-tuning with trainyard's causal-lm recipe (issue 27): the Llama-2-7B
# size on this 24 GiB, 2-core machine, and LoRA and pure bf16 against full fine-tuning at
# smollm2-135m, each run through the real CLI, 2 ranks x 1 thread, FULL_SHARD, bf16-mixed unless
# said, packed samsum-style records (a generated set: bench data, not a model's quality).
#
#   7b:      --model llama-2-7b --peft lora (random initialisation: the bf16 frozen base) with
#            --tokenizer tests/data/hf/tiny_llama2_tokenizer.json (Llama 2's layout), seq 128,
#            batch 1, activation checkpointing, --max-steps 2. Reports the time from the command's
#            start to rank 0's first step line, seconds per step after it, each rank's peak RSS
#            (the recipe's getrusage), and the checkpoint's size (the adapters and their AdamW
#            state only). Bar: peak RSS <= 9 GiB a rank.
#   smollm2: the same data, seq 256, batch 4 per rank, --max-steps STEPS, full fine-tuning
#            (bf16-mixed) against --peft lora (r 16, q_proj,v_proj) and against full fine-tuning
#            with --pure-bf16 (bf16 weights, gradients and AdamW state), alternating ROUNDS times:
#            steady tokens/s (after the first step) and peak RSS of each, and their ratios.
#
#   bench/llama_lora.sh                   # both: ~6 minutes on a quiet machine
#   bench/llama_lora.sh --parts smollm2 --rounds 3
# Flags: --parts 7b,smollm2  --rounds N (2)  --steps N (6)  --keep (the run folders and logs)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TRAINYARD=${BENCH_TRAINYARD:-$ROOT/build/trainyard}
PARTS=7b,smollm2
ROUNDS=2
STEPS=6
KEEP=0
while (($#)); do
  case $1 in
    --parts) PARTS=${2:?}; shift 2 ;;
    --rounds) ROUNDS=${2:?}; shift 2 ;;
    --steps) STEPS=${2:?}; shift 2 ;;
    --keep) KEEP=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "llama_lora.sh: error: unknown flag $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ -x $TRAINYARD ]] || { echo "llama_lora.sh: error: build $TRAINYARD first" >&2; exit 2; }
TMP=$(mktemp -d /tmp/llama_lora.XXXXXX)
((KEEP)) && echo "keeping $TMP" || trap 'rm -rf "$TMP"' EXIT

# 2,400 samsum-style records, deterministic.
/usr/bin/python3 - "$TMP/samsum.jsonl" <<'PY'
import json, random, sys
random.seed(1)
names = ["Anna", "Ben", "Cleo", "Dan", "Eve", "Finn", "Gus", "Hana"]
things = ["the report", "lunch", "the train tickets", "a movie", "the keys", "dinner", "a book"]
times = ["today", "tomorrow", "at noon", "tonight", "on Monday", "later", "next week"]
with open(sys.argv[1], "w") as f:
    for i in range(2400):
        a, b = random.sample(names, 2)
        t, w = random.choice(things), random.choice(times)
        d = f"{a}: Did you bring {t}?\n{b}: Not yet, I will bring {t} {w}.\n{a}: Great, thanks!"
        f.write(json.dumps({"id": str(i), "dialogue": d, "summary": f"{b} will bring {t} to {a} {w}."}) + "\n")
PY

# run NAME ARGS...: the recipe, rank 0's lines stamped with seconds since the start, without the
# hang watchdog (one operation may outlast its 30 s here: on a CPU without AVX-512 smollm2's bf16
# output layer and loss alone take ~36 s, emulated); prints
# "first_step_s per_step_s peak_rss_rank0 peak_rss_rank1 steady_tokens_per_s".
run() {
  local name=$1; shift
  local start; start=$(date +%s.%N)
  "$TRAINYARD" train causal-lm --data "$TMP/samsum.jsonl" --data-format samsum --batching packing \
      --workers 2 --threads 1 --strategy full_shard --no-progress --hang-timeout 0 \
      --storage "$TMP/runs" --name "$name" "$@" 2>&1 |
    while IFS= read -r line; do
      printf '%.3f %s\n' "$(echo "$(date +%s.%N) - $start" | bc)" "$line"
    done >"$TMP/$name.log"
  /usr/bin/python3 - "$TMP/$name.log" "$TMP/runs/$name/result.json" <<'PY'
import json, re, sys
steps = [float(l.split()[0]) for l in open(sys.argv[1]) if re.search(r"step \d+/\d+: loss", l)]
r = json.load(open(sys.argv[2]))
per = (steps[-1] - steps[0]) / (len(steps) - 1) if len(steps) > 1 else float("nan")
print(f"{steps[0]:.1f} {per:.2f} {r['peak_rss_mib_rank0']:.0f} {r['peak_rss_mib_rank1']:.0f} "
      f"{r.get('steady_tokens_per_s', 0):.1f}")
PY
}

if [[ ,$PARTS, == *,7b,* ]]; then
  echo "== llama-2-7b, --peft lora (r 16, q_proj,v_proj), 2 ranks FULL_SHARD bf16-mixed, seq 128, batch 1, activation checkpointing, 2 steps"
  read -r first per r0 r1 _ < <(run lora7b --model llama-2-7b --peft lora --precision bf16-mixed \
      --tokenizer "$ROOT/tests/data/hf/tiny_llama2_tokenizer.json" --seq-len 128 --batch-size 1 \
      --activation-checkpointing --max-steps 2)
  ckpt=$(du -sm "$TMP/runs/lora7b/checkpoint_000000" | cut -f1)
  echo "time to first step: ${first} s; seconds per step after it: ${per}; peak RSS: rank 0 ${r0} MiB, rank 1 ${r1} MiB (bar <= 9216 MiB: $([[ $r0 -le 9216 && $r1 -le 9216 ]] && echo met || echo MISSED)); checkpoint ${ckpt} MiB"
fi

if [[ ,$PARTS, == *,smollm2,* ]]; then
  echo "== smollm2-135m, full fine-tuning (bf16-mixed) vs --peft lora vs --pure-bf16, seq 256, batch 4 per rank, $STEPS steps, $ROUNDS rounds"
  printf '%-6s %-5s %12s %12s %12s\n' round kind tokens/s rss0_MiB rss1_MiB
  for ((k = 1; k <= ROUNDS; ++k)); do
    for kind in full lora pure; do
      extra=(--precision bf16-mixed)
      [[ $kind == lora ]] && extra+=(--peft lora)
      [[ $kind == pure ]] && extra=(--pure-bf16)
      read -r _ _ r0 r1 tps < <(run "s$k$kind" --model smollm2-135m --seq-len 256 --batch-size 4 \
          --max-steps "$STEPS" "${extra[@]}")
      printf '%-6s %-5s %12s %12s %12s\n' "$k" "$kind" "$tps" "$r0" "$r1"
      echo "$kind $tps $r0" >>"$TMP/smollm2.rows"
    done
  done
  /usr/bin/python3 - "$TMP/smollm2.rows" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
med = lambda kind, i: statistics.median(float(r[i]) for r in rows if r[0] == kind)
print(f"median tokens/s: full {med('full', 1):.1f}, lora {med('lora', 1):.1f}, lora/full {med('lora', 1) / med('full', 1):.2f}")
print(f"median peak RSS rank 0: full {med('full', 2):.0f} MiB, lora {med('lora', 2):.0f} MiB, lora/full {med('lora', 2) / med('full', 2):.2f}")
print(f"pure bf16: median tokens/s {med('pure', 1):.1f} (pure/full {med('pure', 1) / med('full', 1):.2f}), peak RSS rank 0 {med('pure', 2):.0f} MiB (pure/full {med('pure', 2) / med('full', 2):.2f})")
PY
fi
