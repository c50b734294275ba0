#!/usr/bin/env python3
"""Writes the hand-made Llama-family tokenizer.json files of tests/unit/tokenizer_test.cpp.

tiny_llama2_tokenizer.json: SentencePiece-style BPE as Llama 2, TinyLlama and Mistral ship it
  (normalizer Prepend "▁" + Replace " " -> "▁", no pre-tokenizer, byte_fallback, fuse_unk, the
  Replace/ByteFallback/Fuse/Strip decoder, "<s>" before the text). <unk> 0, <s> 1, </s> 2, byte b
  is "<0xBB>" 3 + b; then single characters from 259, then each merge's result, in order.
tiny_metaspace_tokenizer.json: the same vocabulary as newer files write it: no normalizer, a
  Metaspace pre-tokenizer (prepend_scheme "first", split false) and merges as pairs.
tiny_llama3_tokenizer.json: byte-level BPE as Llama 3 ships it (Split with Llama 3's pattern, then
  ByteLevel without its own pattern, ignore_merges, "<|begin_of_text|>" before the text): byte b's
  character is id b, each merge's result the next id from 256, then two whole words, then the
  added tokens (282, 283, 284).
tiny_qwen2_tokenizer.json: the same vocabulary as Qwen2 ships it: NFC, Qwen2's pattern (single
  digits), no BOS, "<|endoftext|>".
Run: python3 make_llama_tokenizers.py   (writes the four files beside itself)
"""
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))

# ---- SentencePiece-style (Llama 2) ---------------------------------------------------------

SP_CHARS = list("▁abcdefghijklmnopqrstuvwxyzHIMTW0123456789.,!?'") + ["中", "é"]
SP_MERGES = [
    ("▁", "t"), ("h", "e"), ("▁t", "he"), ("▁", "a"), ("i", "n"), ("in", "g"), ("l", "l"),
    ("e", "ll"), ("h", "ell"), ("hell", "o"), ("▁", "hello"), ("▁", "▁"), ("▁▁", "▁▁"),
    ("1", "2"), ("12", "3"), ("▁", "w"), ("o", "r"), ("▁w", "or"), ("l", "d"), ("▁wor", "ld"),
    ("'", "s"), ("▁", "I"), ("'", "M"), ("▁", "中"),
]


def sp_vocab():
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab["<0x%02X>" % b] = 3 + b
    for c in SP_CHARS:
        vocab.setdefault(c, len(vocab))
    for a, b in SP_MERGES:
        vocab.setdefault(a + b, len(vocab))
    return vocab


def special(id_, content):
    return {"id": id_, "content": content, "single_word": False, "lstrip": False,
            "rstrip": False, "normalized": False, "special": True}


def template(bos_name, bos_id):
    return {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": bos_name, "type_id": 0}},
                   {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": bos_name, "type_id": 0}},
                 {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": bos_name, "type_id": 1}},
                 {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {bos_name: {"id": bos_name, "ids": [bos_id], "tokens": [bos_name]}},
    }


SP_DECODER = {"type": "Sequence", "decoders": [
    {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
    {"type": "ByteFallback"},
    {"type": "Fuse"},
    {"type": "Strip", "content": " ", "start": 1, "stop": 0},
]}


def sp_model(merges_as_pairs):
    merges = [[a, b] if merges_as_pairs else a + " " + b for a, b in SP_MERGES]
    return {"type": "BPE", "dropout": None, "unk_token": "<unk>",
            "continuing_subword_prefix": None, "end_of_word_suffix": None, "fuse_unk": True,
            "byte_fallback": True, "ignore_merges": False, "vocab": sp_vocab(), "merges": merges}


def llama2():
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [special(0, "<unk>"), special(1, "<s>"), special(2, "</s>")],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
        ]},
        "pre_tokenizer": None,
        "post_processor": template("<s>", 1),
        "decoder": SP_DECODER,
        "model": sp_model(merges_as_pairs=False),
    }


def metaspace():
    tok = llama2()
    tok["normalizer"] = None
    tok["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first",
                            "split": False}
    tok["model"] = sp_model(merges_as_pairs=True)
    return tok

# ---- byte-level with a Split pattern (Llama 3, Qwen2) --------------------------------------


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


LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                 r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
BL_MERGES = [
    ("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("in", "g"), ("1", "2"), ("12", "3"),
    ("Ġ", "Ġ"), ("ĠĠ", "ĠĠ"), ("Ċ", "Ċ"), ("'", "s"), ("'", "S"), ("Ġ", "w"), ("o", "r"),
    ("Ġw", "or"), ("l", "d"), ("Ġwor", "ld"), ("ä", "¸"), ("Ġ", "I"), ("'", "M"), ("Ã", "©"),
    ("c", "af"), ("a", "f"), ("caf", "Ã©"),
]
# Whole words the vocabulary holds but no merge makes: ignore_merges gives them in one token.
BL_WHOLE_WORDS = ["Ġhello", "Ġhellos"]


def bl_vocab():
    b2u = bytes_to_unicode()
    vocab = {b2u[b]: b for b in range(256)}
    for a, b in BL_MERGES:
        vocab.setdefault(a + b, len(vocab))
    for w in BL_WHOLE_WORDS:
        vocab.setdefault(w, len(vocab))
    return vocab


def byte_level(use_regex):
    return {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
            "use_regex": use_regex}


def split_then_byte_level(pattern):
    return {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
        byte_level(False),
    ]}


def bl_model():
    return {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
            "ignore_merges": True, "vocab": bl_vocab(), "merges": [[a, b] for a, b in BL_MERGES]}


def llama3():
    n = len(bl_vocab())
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [special(n, "<|begin_of_text|>"), special(n + 1, "<|end_of_text|>"),
                         special(n + 2, "<|eot_id|>")],
        "normalizer": None,
        "pre_tokenizer": split_then_byte_level(LLAMA3_PATTERN),
        "post_processor": {"type": "Sequence", "processors": [
            byte_level(True), template("<|begin_of_text|>", n)]},
        "decoder": byte_level(True),
        "model": bl_model(),
    }


def qwen2():
    n = len(bl_vocab())
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [special(n, "<|endoftext|>"), special(n + 1, "<|im_start|>"),
                         special(n + 2, "<|im_end|>")],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": split_then_byte_level(QWEN2_PATTERN),
        "post_processor": byte_level(False),
        "decoder": byte_level(False),
        "model": bl_model(),
    }


def main():
    for name, tok in [("tiny_llama2_tokenizer.json", llama2()),
                      ("tiny_metaspace_tokenizer.json", metaspace()),
                      ("tiny_llama3_tokenizer.json", llama3()),
                      ("tiny_qwen2_tokenizer.json", qwen2())]:
        with open(os.path.join(HERE, name), "w", encoding="utf-8") as f:
            json.dump(tok, f, ensure_ascii=False, indent=1)
            f.write("\n")


main()
