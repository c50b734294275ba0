#!/usr/bin/env python3
"""Writes tiny_bpe_tokenizer.json, the hand-made tokenizer of tests/unit/tokenizer_test.cpp.

It is laid out as Pythia's tokenizer.json is (NFC, ByteLevel, BPE, "<|endoftext|>" 0 and
"<|padding|>" 1, runs of spaces as added tokens) but small enough to work ids out by hand:
the byte b has the id 2 + b, and each merge's result the next free id, in merge order.
Run: python3 make_tiny_bpe_tokenizer.py > tiny_bpe_tokenizer.json
"""
import json
import sys


def bytes_to_unicode():  # GPT-2's map, as in its encoder.py
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


MERGES = [
    "Ġ t", "h e", "Ġt he", "i n", "Ġ a", "' s", "1 2", "12 3", "Ã ©", "a f", "c af", "caf Ã©",
    "Ġ Ġ", "Ċ Ċ", "a a", "in g", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld", "ä ¸", "Ġ 1",
    "l l", "' ll", "Ġ c",
]


def added(id_, content, special, normalized):
    return {"id": id_, "content": content, "single_word": False, "lstrip": False,
            "rstrip": False, "normalized": normalized, "special": special}


def main():
    b2u = bytes_to_unicode()
    vocab = {"<|endoftext|>": 0, "<|padding|>": 1}
    for b in range(256):
        vocab[b2u[b]] = 2 + b
    for m in MERGES:
        a, b = m.split(" ")
        vocab.setdefault(a + b, len(vocab))
    n = len(vocab)
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                  "use_regex": True}
    tok = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [
            added(0, "<|endoftext|>", True, False),
            added(1, "<|padding|>", True, False),
            added(n, "   ", False, True),
            added(n + 1, "  ", False, True),
            added(n + 2, "e\u0301!", False, True),  # NFD: it matches "é!" once normalised
        ],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": byte_level,
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "vocab": vocab, "merges": MERGES},
    }
    json.dump(tok, sys.stdout, ensure_ascii=False, indent=1)
    sys.stdout.write("\n")


main()
