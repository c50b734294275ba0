"""Trains a byte-level BPE tokenizer.json with Hugging Face's own `tokenizers`, as GPT-NeoX's was
made: NFC, ByteLevel pre-tokeniser, the default trainer (30,000 entries). bench/tokenizer.sh then
lays it out as Pythia's (pythia_layout.py).

Usage: python train_bpe.py OUT.json TEXT_FILE..."""
import sys

from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

out, *files = sys.argv[1:]
tokenizer = Tokenizer(models.BPE())
tokenizer.normalizer = normalizers.NFC()
tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
tokenizer.train(files)
tokenizer.save(out, pretty=False)
