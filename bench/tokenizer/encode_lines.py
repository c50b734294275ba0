"""Hugging Face's ids for each line of a UTF-8 file, a line of space-separated ids per line, as
`trainyard tokenize` and tokenizer_bench --ids-out write them.

Usage: python encode_lines.py TOKENIZER_JSON IN.txt OUT.txt"""
import sys

from tokenizers import Tokenizer

tokenizer_path, input_path, output_path = sys.argv[1:]
tokenizer = Tokenizer.from_file(tokenizer_path)
with open(input_path, encoding="utf-8", newline="") as f:
    lines = f.read().split("\n")
if lines and lines[-1] == "":
    lines.pop()
with open(output_path, "w", encoding="utf-8") as out:
    for i in range(0, len(lines), 1000):
        for encoding in tokenizer.encode_batch(lines[i:i + 1000]):
            out.write(" ".join(map(str, encoding.ids)) + "\n")
