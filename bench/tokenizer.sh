#!/usr/bin/env bash
# tokenizer.sh — hf::Tokenizer throughput in MB/s, and its ids checked against Hugging Face's
# `tokenizers` (Python, in the venv scripts/setup.sh makes) on the same text. No model is downloaded: Hugging
# Face's library trains a 30,000-entry byte-level BPE on text already on the machine (Python's
# standard library sources and Debian's copyright files), laid out as Pythia's tokenizer.json.
#
#   bench/tokenizer.sh [--threads N] [--synthetic-mb 50] [--no-check]
#
# Inputs: /usr/share/games/fortunes/fortunes (24 KB, repeated), the training text itself
# (~25 MB, 591k lines) and synthetic pseudo-English. "check" compares every line's ids of the
# first two inputs with Hugging Face's.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BENCH=${BENCH_TOKENIZER:-$ROOT/build/bench/tokenizer_bench}
PYTHON=${BENCH_PYTHON:-/opt/trainyard/venv/bin/python}
FORTUNES=/usr/share/games/fortunes/fortunes
THREADS=$(nproc)
SYNTHETIC_MB=50
CHECK=1
while (($#)); do
  case $1 in
    --threads) THREADS=${2:?}; shift 2 ;;
    --synthetic-mb) SYNTHETIC_MB=${2:?}; shift 2 ;;
    --no-check) CHECK=0; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "tokenizer.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[[ -x $BENCH ]] || { echo "tokenizer.sh: $BENCH is missing: build tokenizer_bench" >&2; exit 2; }
"$PYTHON" -c 'import tokenizers' 2>/dev/null || { echo "tokenizer.sh: $PYTHON cannot import tokenizers: run scripts/setup.sh" >&2; exit 2; }
[[ -f $FORTUNES ]] || { echo "tokenizer.sh: $FORTUNES is missing: run scripts/setup.sh" >&2; exit 2; }

TMP=$(mktemp -d "${TMPDIR:-/tmp}/tokenizer_bench.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

# The text: well-formed UTF-8 only (Hugging Face's library takes nothing else).
find /usr/lib/python3.11 -name '*.py' | sort | head -1500 | xargs cat > "$TMP/py.all"
find /usr/share/doc -name copyright | sort | xargs cat > "$TMP/copyright.all"
head -c 5000000 "$TMP/py.all" | iconv -f utf-8 -t utf-8 -c > "$TMP/py.txt"
head -c 30000000 "$TMP/copyright.all" | iconv -f utf-8 -t utf-8 -c > "$TMP/copyright.txt"
cat "$TMP/copyright.txt" "$TMP/py.txt" > "$TMP/text.txt"

"$PYTHON" "$ROOT/bench/tokenizer/train_bpe.py" "$TMP/trained.json" \
  "$TMP/py.txt" "$TMP/copyright.txt" "$FORTUNES"
"$PYTHON" "$ROOT/bench/tokenizer/pythia_layout.py" "$TMP/trained.json" "$TMP/tokenizer.json"

"$BENCH" "$TMP/tokenizer.json" --file "$FORTUNES" --threads "$THREADS" --ids-out "$TMP/fortunes.ids"
"$BENCH" "$TMP/tokenizer.json" --file "$TMP/text.txt" --synthetic-mb "$SYNTHETIC_MB" \
  --threads "$THREADS" --ids-out "$TMP/text.ids"

if ((CHECK)); then
  for name in fortunes text; do
    input=$FORTUNES
    [[ $name == text ]] && input=$TMP/text.txt
    "$PYTHON" "$ROOT/bench/tokenizer/encode_lines.py" "$TMP/tokenizer.json" "$input" \
      "$TMP/$name.hf.ids"
    if cmp -s "$TMP/$name.ids" "$TMP/$name.hf.ids"; then
      echo "check: $name: ids identical to Hugging Face's on $(wc -l < "$input") lines"
    else
      echo "check: $name: ids DIFFER from Hugging Face's:" >&2
      diff <(cat -n "$TMP/$name.ids") <(cat -n "$TMP/$name.hf.ids") | head -5 >&2
      exit 1
    fi
  done
fi
