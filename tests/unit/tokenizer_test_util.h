// Helpers of the tokenizer tests: random text that exercises the tokenizers' patterns, and Hugging
// Face's `tokenizers` (Python, run by tests/unit/hf_tokenizers_oracle.py) as an oracle.
#pragma once

#include <gtest/gtest.h>
#include <unicode/uchar.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "../prerequisite.h"
#include "../temp_dir.h"
#include "trainyard/hf/tokenizer.h"

namespace trainyard::hf::tokenizer_test {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Ids = std::vector<std::int32_t>;

inline std::string utf8(char32_t c) {
  std::string out;
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
  return out;
}

// Random well-formed text built from the pieces that exercise the pattern, the normaliser and
// the added tokens (and `extra` ones), and from any code point at all.
inline std::string random_text(std::mt19937& rng, const std::vector<std::string>& extra = {}) {
  static const std::vector<std::string> fragments = {"the",         " the",
                                                     "The",         " world",
                                                     "café",        "cafe\u0301",
                                                     "e\u0301!",    "é!",
                                                     "123",         "4567",
                                                     " 12",         "'s",
                                                     "'t",          "'re",
                                                     "'ve",         "'m",
                                                     "'ll",         "'d",
                                                     "'S",          "'LL",
                                                     "''",          "'",
                                                     "don't",       "<|endoftext|>",
                                                     "<|padding|>", "<|endof",
                                                     "|>",          "  ",
                                                     "   ",         "    ",
                                                     "\n",          "\n\n",
                                                     "\t",          " \n ",
                                                     "\r\n",        "中文",
                                                     "한국어",      "\u1100\u1161",
                                                     "😀",           "👍🏽",
                                                     "Ⅻ",           "²",
                                                     "٣",           "１２",
                                                     "\u00a0",      "\u3000",
                                                     "\u2003",      "\u0085",
                                                     "\u2028",      "\u200b",
                                                     "\u001c",      "\u000b",
                                                     "!!",          "?",
                                                     "...",         "aaaa",
                                                     "ing",         "ll",
                                                     "ä",           "Ω",
                                                     "ß",           "ﬁ",
                                                     "\u0301",      "\u0301\u0301"};
  std::uniform_int_distribution<int> count(1, 10);
  std::uniform_int_distribution<int> kind(0, 9);
  std::uniform_int_distribution<std::size_t> pick(0, fragments.size() + extra.size() - 1);
  std::uniform_int_distribution<int> ascii(0x20, 0x7E);
  std::uniform_int_distribution<std::uint32_t> bmp(0xA0, 0xFFFD);
  std::uniform_int_distribution<std::uint32_t> any(0, 0x10FFFF);
  std::string s;
  for (int n = count(rng); n > 0; --n) {
    const int k = kind(rng);
    if (k < 5) {
      const std::size_t i = pick(rng);
      s += i < fragments.size() ? fragments[i] : extra[i - fragments.size()];
    } else if (k < 7) {
      s += static_cast<char>(ascii(rng));
    } else {
      // Any character Unicode 15.0 assigns (ICU 72's), private use and noncharacters included.
      // Not the unassigned ones: HF's pattern knows Unicode 16.0 (Note [Unicode versions]).
      char32_t c = 0;
      do {
        c = k < 9 ? bmp(rng) : any(rng);
      } while ((c >= 0xD800 && c <= 0xDFFF) ||
               (u_charType(c) == U_UNASSIGNED &&
                !u_hasBinaryProperty(c, UCHAR_NONCHARACTER_CODE_POINT)));
      s += utf8(c);
    }
  }
  return s;
}

struct OracleAnswer {
  std::vector<Ids> encode;
  std::vector<std::string> decode;
  std::vector<std::string> decode_skip;
};

// Runs tests/unit/hf_tokenizers_oracle.py; nullopt when the venv's Python cannot import
// `tokenizers`.
inline std::optional<OracleAnswer> ask_oracle(const fs::path& tokenizer_json,
                                              const std::vector<std::string>& texts,
                                              const std::vector<Ids>& id_lists) {
  if (std::system(TRAINYARD_PYTHON " -c 'import tokenizers' >/dev/null 2>&1") != 0)
    return std::nullopt;
  // A folder of this call's own: ctest -j runs the oracle tests as parallel processes, which
  // overwrote each other's answer in a shared folder (a flaky mismatch).
  const trainyard::test::TempDir dir("ty-tokenizer-oracle");
  const fs::path request = dir.path() / "request.json";
  const fs::path answer = dir.path() / "answer.json";
  std::ofstream(request) << json{{"encode", texts}, {"decode", id_lists}}.dump();
  const std::string command = std::string(TRAINYARD_PYTHON " '") + TRAINYARD_SOURCE_DIR +
                              "/tests/unit/hf_tokenizers_oracle.py' '" + tokenizer_json.string() +
                              "' '" + request.string() + "' > '" + answer.string() + "'";
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
  std::ifstream in(answer);
  const json j = json::parse(in);
  return OracleAnswer{j["encode"].get<std::vector<Ids>>(),
                      j["decode"].get<std::vector<std::string>>(),
                      j["decode_skip"].get<std::vector<std::string>>()};
}

// Compares encode() (with special tokens), decode() and decode(skip) with HF's on fixed, random
// (random_text with `extra` fragments) and adversarial texts, and on random id lists.
inline void expect_matches_oracle(const fs::path& file,
                                  unsigned seed,
                                  const std::vector<std::string>& extra = {}) {
  const Tokenizer tok = Tokenizer::from_file(file);
  std::mt19937 rng(seed);
  std::vector<std::string> texts = {"", " ", "  ", "\n", "the  the   the    x", "he's it'll"};
  texts.insert(texts.end(), extra.begin(), extra.end());
  // TRAINYARD_ORACLE_TEXTS=N asks about N random texts instead (a longer soak).
  const char* count = std::getenv("TRAINYARD_ORACLE_TEXTS");
  for (int i = 0, n = count ? std::atoi(count) : 1500; i < n; ++i)
    texts.push_back(random_text(rng, extra));
  std::vector<Ids> id_lists;
  std::uniform_int_distribution<std::int32_t> id(-2,
                                                 static_cast<std::int32_t>(tok.vocab_size()) + 2);
  std::uniform_int_distribution<int> length(0, 12);
  for (int i = 0; i < 500; ++i) {
    Ids ids;
    for (int n = length(rng); n > 0; --n) ids.push_back(id(rng));
    id_lists.push_back(ids);
  }
  // HF's decode takes ids as u32; negative ones cannot be sent.
  for (Ids& ids : id_lists) std::erase_if(ids, [](std::int32_t i) { return i < 0; });
  const auto oracle = ask_oracle(file, texts, id_lists);
  if (!oracle)
    TY_MISSING_PREREQUISITE(
        TRAINYARD_PYTHON
        " cannot import Hugging Face's tokenizers "
        "(scripts/setup.sh installs it); only the hand-worked ids were checked.");
  int mismatches = 0;
  for (std::size_t i = 0; i < texts.size() && mismatches < 10; ++i) {
    const Ids ours = tok.encode(texts[i]);
    if (ours != oracle->encode[i]) ++mismatches;
    EXPECT_EQ(ours, oracle->encode[i]) << "text " << testing::PrintToString(texts[i]);
  }
  for (std::size_t i = 0; i < id_lists.size() && mismatches < 10; ++i) {
    const std::string ours = tok.decode(id_lists[i]);
    const std::string skipped = tok.decode(id_lists[i], true);
    if (ours != oracle->decode[i] || skipped != oracle->decode_skip[i]) ++mismatches;
    EXPECT_EQ(ours, oracle->decode[i]) << "ids " << testing::PrintToString(id_lists[i]);
    EXPECT_EQ(skipped, oracle->decode_skip[i]) << "ids " << testing::PrintToString(id_lists[i]);
  }
}

}  // namespace trainyard::hf::tokenizer_test
