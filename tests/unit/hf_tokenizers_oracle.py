"""The oracle of the tokenizer tests: Hugging Face's own `tokenizers` library (from the venv
scripts/setup.sh makes) encodes and decodes what the test asks.

Usage: python hf_tokenizers_oracle.py TOKENIZER_JSON REQUEST_JSON
  REQUEST_JSON: {"encode": [text, ...], "decode": [[id, ...], ...]}
  stdout:       {"encode": [[id, ...], ...], "decode": [text, ...], "decode_skip": [text, ...]}
encode adds special tokens (HF's default); decode_skip skips them.
"""
import json
import sys

from tokenizers import Tokenizer

tokenizer_path, request_path = sys.argv[1:]
tokenizer = Tokenizer.from_file(tokenizer_path)
with open(request_path, encoding="utf-8") as f:
    request = json.load(f)
answer = {
    "encode": [tokenizer.encode(text, add_special_tokens=True).ids for text in request["encode"]],
    "decode": [tokenizer.decode(ids, skip_special_tokens=False) for ids in request["decode"]],
    "decode_skip": [tokenizer.decode(ids, skip_special_tokens=True) for ids in request["decode"]],
}
json.dump(answer, sys.stdout)
