#!/usr/bin/env python3
"""Gives a trained byte-level BPE tokenizer.json Pythia's layout: all 256 byte characters in the
vocabulary, "<|endoftext|>" and "<|padding|>" as special tokens, runs of 24 down to 2 spaces as
added tokens, merges written "a b", ByteLevel post-processor and decoder.
Usage: pythia_layout.py IN.json OUT.json"""
import json
import sys


def bytes_to_unicode():  # GPT-2's map
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for c in cs]


def added(id_, content, special):
    return {"id": id_, "content": content, "single_word": False, "lstrip": False,
            "rstrip": False, "normalized": not special, "special": special}


t = json.load(open(sys.argv[1], encoding="utf-8"))
vocab = t["model"]["vocab"]
for c in bytes_to_unicode():
    vocab.setdefault(c, len(vocab))
n = len(vocab)
t["added_tokens"] = [added(n, "<|endoftext|>", True), added(n + 1, "<|padding|>", True)] + [
    added(n + 2 + 24 - k, " " * k, False) for k in range(24, 1, -1)]
byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
              "use_regex": True}
t["post_processor"] = byte_level
t["decoder"] = byte_level
t["model"]["merges"] = [m if isinstance(m, str) else " ".join(m) for m in t["model"]["merges"]]
json.dump(t, open(sys.argv[2], "w", encoding="utf-8"), ensure_ascii=False)
