// The checked-in Hugging Face fixtures of tests/data/hf, for the tokenizer tests.
#pragma once

#include <filesystem>

namespace trainyard::test {

// A byte-level BPE tokenizer.json with a few merges: byte b is id 2 + b ("he" 259, "'s" 263,
// "Ġworld" 278).
inline const std::filesystem::path kTinyTokenizerFile =
    std::filesystem::path(TRAINYARD_TEST_DATA_DIR) / "hf" / "tiny_bpe_tokenizer.json";

// Written by tests/data/hf/make_llama_tokenizers.py (see there for their ids): SentencePiece-style
// BPE as Llama 2 ships it and as newer files write it (Metaspace), and byte-level BPE with a Split
// pattern as Llama 3 and Qwen2 ship it.
inline const std::filesystem::path kTinyLlama2TokenizerFile =
    std::filesystem::path(TRAINYARD_TEST_DATA_DIR) / "hf" / "tiny_llama2_tokenizer.json";
inline const std::filesystem::path kTinyMetaspaceTokenizerFile =
    std::filesystem::path(TRAINYARD_TEST_DATA_DIR) / "hf" / "tiny_metaspace_tokenizer.json";
inline const std::filesystem::path kTinyLlama3TokenizerFile =
    std::filesystem::path(TRAINYARD_TEST_DATA_DIR) / "hf" / "tiny_llama3_tokenizer.json";
inline const std::filesystem::path kTinyQwen2TokenizerFile =
    std::filesystem::path(TRAINYARD_TEST_DATA_DIR) / "hf" / "tiny_qwen2_tokenizer.json";

}  // namespace trainyard::test
