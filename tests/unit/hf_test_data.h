// The checked-in Hugging Face fixtures of tests/data/hf, for the tokenizer tests.
#pragma once

#include <filesystem>

namespace trainyard::test {

// A byte-level BPE tokenizer.json with a few merges: byte b is id 2 + b ("he" 259, "'s" 263,
// "Ġworld" 278).
inline const std::filesystem::path kTinyTokenizerFile =
    std::filesystem::path(TRAINYARD_TEST_DATA_DIR) / "hf" / "tiny_bpe_tokenizer.json";

}  // namespace trainyard::test
