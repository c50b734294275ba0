// Trains a byte-level BPE tokenizer.json with Hugging Face's own `tokenizers` (npm), as GPT-NeoX's
// was made: NFC, ByteLevel pre-tokeniser, default trainer (30,000 entries). bench/tokenizer.sh
// then lays it out as Pythia's (pythia_layout.py).
// Usage: node train_bpe.js PACKAGE_DIR OUT.json TEXT_FILE...
'use strict';
const [packageDir, out, ...files] = process.argv.slice(2);
const t = require(packageDir);
const tokenizer = new t.Tokenizer(t.BPE.empty());
tokenizer.setNormalizer(t.nfcNormalizer());
tokenizer.setPreTokenizer(t.byteLevelPreTokenizer(false, true));
tokenizer.train(files);
tokenizer.save(out, false);
