// hf::Tokenizer on Llama-family tokenizer.json files: SentencePiece-style BPE (Llama 2, TinyLlama,
// Mistral: "▁" for spaces, byte_fallback, the Replace/ByteFallback/Fuse/Strip decoder, "<s>") and
// byte-level BPE with a Split pattern (Llama 3, Qwen2). Ids worked out on the tiny files of
// tests/data/hf/make_llama_tokenizers.py, HF's `tokenizers` as the oracle on random and
// adversarial text, decode(encode(x)) == x, and the errors for what it refuses.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>

#include "hf_test_data.h"
#include "tokenizer_test_util.h"
#include "trainyard/error.h"
#include "trainyard/hf/tokenizer.h"

namespace trainyard::hf {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Ids = std::vector<std::int32_t>;
using test::kTinyLlama2TokenizerFile;
using test::kTinyLlama3TokenizerFile;
using test::kTinyMetaspaceTokenizerFile;
using test::kTinyQwen2TokenizerFile;
using tokenizer_test::expect_matches_oracle;
using tokenizer_test::random_text;

// ---- ids of the tiny files (see their generator) ----------------------------------------------

// SentencePiece-style: <unk> 0, <s> 1, </s> 2, "<0xBB>" 3 + b, then characters and merges.
constexpr std::int32_t kUnk = 0, kBos = 1, kEos = 2;
constexpr std::int32_t fallback_id(unsigned char b) {
  return 3 + b;
}
constexpr std::int32_t kMeta = 259, kA = 260, kB = 261, kH = 267, kI = 268, kO = 274, kX = 283,
                       kY = 284, kSpHe = 309, kMetaThe = 310, kMetaA = 311, kLl = 314,
                       kMetaMeta = 319, kSp123 = 322, kMetaWorld = 327, kMetaCapitalI = 329,
                       kApostropheM = 330, kMetaZhong = 331;

// Byte-level: byte b's character is b; merges from 256; added tokens from 282.
constexpr std::int32_t kBlHe = 257, kBl123 = 262, kBlNewlines = 265, kBlApostropheCapitalS = 267,
                       kBlGworld = 272, kBlApostropheM = 275, kBlGhellos = 281;
constexpr std::int32_t kBeginOfText = 282, kEndOfText = 283, kEotId = 284;

// The file changed by `edit`, written to a file of its own (the oracle reads files).
fs::path variant(const fs::path& base,
                 const std::string& name,
                 const std::function<void(json&)>& edit) {
  std::ifstream in(base);
  json j = json::parse(in);
  edit(j);
  const fs::path dir = fs::path(::testing::TempDir()) / "trainyard_llama_tokenizer_test";
  fs::create_directories(dir);
  const fs::path path = dir / (name + ".json");
  std::ofstream(path) << j.dump(1);
  return path;
}

// Fragments that exercise these files' special tokens, merges, patterns and byte fallback.
const std::vector<std::string> kLlamaFragments = {"<s>",
                                                  "</s>",
                                                  "<unk>",
                                                  "<|begin_of_text|>",
                                                  "<|end_of_text|>",
                                                  "<|eot_id|>",
                                                  "<|endoftext|>",
                                                  "<|im_start|>",
                                                  "<s",
                                                  "▁",
                                                  "▁▁",
                                                  "hello",
                                                  " hello",
                                                  " hellos",
                                                  "hellos",
                                                  "I'M",
                                                  "'S",
                                                  "'ſ",
                                                  "'Re",
                                                  "1234567",
                                                  "中文",
                                                  " 中",
                                                  "\r\n",
                                                  " \n\n ",
                                                  "   \n",
                                                  " world",
                                                  "the",
                                                  " the",
                                                  "<0x41>",
                                                  "é",
                                                  "e\u0301",
                                                  "!!!",
                                                  "  ",
                                                  "    ",
                                                  "\t"};

// ---- SentencePiece-style BPE: Llama 2's normaliser --------------------------------------------

class Llama2Tokenizer : public ::testing::Test {
 protected:
  Tokenizer tok = Tokenizer::from_file(kTinyLlama2TokenizerFile);
};

TEST_F(Llama2Tokenizer, PrependsMetaSpaceAndMergesByRank) {
  EXPECT_EQ(tok.normalize("hello world"), "▁hello▁world");
  // "h e" (1) and "l l" (6) take the letters "e ll" (7) and "▁ hello" (10) would need.
  EXPECT_EQ(tok.encode("hello world"), (Ids{kBos, kMeta, kSpHe, kLl, kO, kMetaWorld}));
  EXPECT_EQ(tok.encode("hello world", false), (Ids{kMeta, kSpHe, kLl, kO, kMetaWorld}));
  // Every space is a "▁": two leading spaces and the prepended one make "▁▁" "▁the".
  EXPECT_EQ(tok.encode("  the  x", false), (Ids{kMetaMeta, kMetaThe, kMetaMeta, kX}));
  EXPECT_EQ(tok.encode("", true), Ids{kBos});
  EXPECT_EQ(tok.encode("1234567", false),
            (Ids{kMeta, kSp123, 295, 296, 297, 298}));  // no "▁ 1" merge
  EXPECT_EQ(tok.encode("I'M", false), (Ids{kMetaCapitalI, kApostropheM}));
}

TEST_F(Llama2Tokenizer, CharactersNotInTheVocabularyFallBackToTheirBytes) {
  EXPECT_EQ(tok.encode("x\ny", false), (Ids{kMeta, kX, fallback_id('\n'), kY}));
  // "中" is in the vocabulary ("▁ 中" merges), "文" (E6 96 87) is not.
  EXPECT_EQ(tok.encode("中文", false),
            (Ids{kMetaZhong, fallback_id(0xE6), fallback_id(0x96), fallback_id(0x87)}));
  EXPECT_EQ(tok.encode("😀", false), (Ids{kMeta, fallback_id(0xF0), fallback_id(0x9F),
                                         fallback_id(0x98), fallback_id(0x80)}));
  // The decoder turns a run of byte tokens back into its character; a run that is not UTF-8
  // becomes one U+FFFD per byte (HF's ByteFallback), and decode_bytes keeps the bytes.
  EXPECT_EQ(tok.decode(tok.encode("中文😀")), "<s> 中文😀");
  EXPECT_EQ(tok.decode(Ids{kX, fallback_id(0xE6), fallback_id(0x96), kY}), "x\uFFFD\uFFFDy");
  EXPECT_EQ(tok.decode_bytes(Ids{kX, fallback_id(0xE6), fallback_id(0x96), kY}), "x\xE6\x96y");
}

TEST_F(Llama2Tokenizer, SpecialTokensInTheTextAndEachPieceGetsItsMetaSpace) {
  // "<s>" is matched before the normaliser; each piece around it gets its own "▁".
  EXPECT_EQ(tok.encode("a<s>b"), (Ids{kBos, kMetaA, kBos, kMeta, kB}));
  EXPECT_EQ(tok.decode(Ids{kBos, kMetaA, kBos, kMeta, kB}), "<s> a<s> b");
  EXPECT_EQ(tok.decode(Ids{kBos, kMetaA, kBos, kMeta, kB}, true), "a b");
  EXPECT_EQ(tok.bos_id(), kBos);
  EXPECT_EQ(tok.eos_id(), kEos);
  EXPECT_EQ(tok.pad_id(), std::nullopt);
  EXPECT_EQ(tok.id_to_token(fallback_id('\n')), "<0x0A>");
}

TEST_F(Llama2Tokenizer, DecodeInvertsEncodeWithoutTheLeadingMetaSpace) {
  std::mt19937 rng(5);
  for (int i = 0; i < 1500; ++i) {
    std::string text = random_text(rng, kLlamaFragments);
    // Text that spells a special token or "▁" does not come back as itself.
    if (text.find('<') != std::string::npos || text.find("▁") != std::string::npos) continue;
    EXPECT_EQ(tok.decode(tok.encode(text), /*skip_special_tokens=*/true), text) << text;
  }
  EXPECT_EQ(tok.decode(tok.encode(" leading")), "<s>  leading");
}

TEST(LlamaTokenizer, ArbitraryBytesComeBackFromDecodeBytes) {
  // Bytes that are not UTF-8 (which HF cannot take) are encoded by their "<0xFF>" tokens, or by
  // their byte-level characters after the Split pattern (Note [Invalid UTF-8]).
  const Tokenizer llama2 = Tokenizer::from_file(kTinyLlama2TokenizerFile);
  const Tokenizer llama3 = Tokenizer::from_file(kTinyLlama3TokenizerFile);
  EXPECT_EQ(llama2.encode("a\xff", false), (Ids{kMetaA, fallback_id(0xFF)}));
  EXPECT_EQ(llama2.decode(llama2.encode("a\xff", false)), "a\uFFFD");
  std::mt19937 rng(13);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_int_distribution<int> length(0, 48);
  for (int i = 0; i < 2000; ++i) {
    std::string bytes;
    for (int n = length(rng); n > 0; --n) bytes.push_back(static_cast<char>(byte(rng)));
    EXPECT_EQ(llama3.decode_bytes(llama3.encode(bytes, false)), bytes)
        << testing::PrintToString(bytes);
    if (bytes.find("\xE2\x96\x81") != std::string::npos) continue;  // "▁" reads back as " "
    EXPECT_EQ(llama2.decode_bytes(llama2.encode(bytes, false)), bytes)
        << testing::PrintToString(bytes);
  }
}

TEST(LlamaTokenizer, UnknownCharactersWithoutByteFallbackAreFusedUnk) {
  const Tokenizer fused =
      Tokenizer::from_file(variant(kTinyLlama2TokenizerFile, "no_fallback",
                                   [](json& j) { j["model"]["byte_fallback"] = false; }));
  EXPECT_EQ(fused.encode("x😀😀y", false), (Ids{kMeta, kX, kUnk, kY}));
  const Tokenizer unfused =
      Tokenizer::from_file(variant(kTinyLlama2TokenizerFile, "no_fallback_no_fuse", [](json& j) {
        j["model"]["byte_fallback"] = false;
        j["model"]["fuse_unk"] = false;
      }));
  EXPECT_EQ(unfused.encode("x😀😀y", false), (Ids{kMeta, kX, kUnk, kUnk, kY}));
}

// ---- SentencePiece-style BPE: the Metaspace pre-tokeniser -------------------------------------

TEST(MetaspaceTokenizer, PrependSchemeFirstGivesOnlyTheTextsStartAMetaSpace) {
  const Tokenizer tok = Tokenizer::from_file(kTinyMetaspaceTokenizerFile);
  EXPECT_EQ(tok.encode("hello world"), (Ids{kBos, kMeta, kSpHe, kLl, kO, kMetaWorld}));
  // A leading space is the "▁" itself: no second one.
  EXPECT_EQ(tok.encode("  the  x", false), (Ids{kMeta, kMetaThe, kMetaMeta, kX}));
  // The piece after "<s>" does not begin the text.
  EXPECT_EQ(tok.encode("a<s>b", false), (Ids{kMetaA, kBos, kB}));
  EXPECT_EQ(tok.encode("<s>hello", false), (Ids{kBos, kSpHe, kLl, kO}));
  EXPECT_EQ(tok.encode(" hi", false), (Ids{kMeta, kH, kI}));
}

TEST(MetaspaceTokenizer, SplitAndAlwaysPrependAndTheMetaspaceDecoder) {
  const Tokenizer tok =
      Tokenizer::from_file(variant(kTinyMetaspaceTokenizerFile, "metaspace_split", [](json& j) {
        j["pre_tokenizer"]["split"] = true;
        j["pre_tokenizer"]["prepend_scheme"] = "always";
        j["decoder"] = {{"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", "always"}};
      }));
  // Split: "▁a", "▁", "▁b" are words of their own, so the "▁ ▁" merge never sees the pair that
  // the unsplit file merges.
  EXPECT_EQ(tok.encode("a  b", false), (Ids{kMetaA, kMeta, kMeta, kB}));
  EXPECT_EQ(Tokenizer::from_file(kTinyMetaspaceTokenizerFile).encode("a  b", false),
            (Ids{kMetaA, kMetaMeta, kB}));
  EXPECT_EQ(tok.encode("a<s>b", false), (Ids{kMetaA, kBos, kMeta, kB}));
  // The decoder drops the first token's "▁" and turns the others into spaces.
  EXPECT_EQ(tok.decode(Ids{kMetaA, kMeta, kMeta, kB}), "a  b");
  EXPECT_EQ(tok.decode(Ids{kMetaMeta, kMetaA}), " a");
}

// ---- byte-level BPE with a Split pattern: Llama 3 and Qwen2 -----------------------------------

TEST(Llama3Tokenizer, SplitsWithLlama3sPatternThenByteLevel) {
  const Tokenizer tok = Tokenizer::from_file(kTinyLlama3TokenizerFile);
  EXPECT_EQ(tok.encode("hello world"), (Ids{kBeginOfText, kBlHe, 'l', 'l', 'o', kBlGworld}));
  // ignore_merges: a word the vocabulary holds is one token, though no merge makes it.
  EXPECT_EQ(tok.encode(" hellos", false), Ids{kBlGhellos});
  // Contractions in any case; " he" is a letter run led by its space.
  EXPECT_EQ(tok.encode("I'M he'S", false),
            (Ids{'I', kBlApostropheM, ' ', kBlHe, kBlApostropheCapitalS}));
  // Digits in runs of at most three.
  EXPECT_EQ(tok.encode("1234567", false), (Ids{kBl123, '4', '5', '6', '7'}));
  // "\s*[\r\n]+" takes the newlines, " b" keeps its space.
  EXPECT_EQ(tok.encode("a\n\n b", false), (Ids{'a', kBlNewlines, ' ', 'b'}));
  EXPECT_EQ(tok.encode("<|eot_id|>x"), (Ids{kBeginOfText, kEotId, 'x'}));
  EXPECT_EQ(tok.bos_id(), kBeginOfText);
  EXPECT_EQ(tok.eos_id(), kEndOfText);
  std::mt19937 rng(9);
  for (int i = 0; i < 1500; ++i) {
    const std::string text = random_text(rng, kLlamaFragments);
    EXPECT_EQ(tok.decode(tok.encode(text, false)), text) << text;
  }
}

TEST(Qwen2Tokenizer, SingleDigitsNfcAndNoBos) {
  const Tokenizer tok = Tokenizer::from_file(kTinyQwen2TokenizerFile);
  EXPECT_EQ(tok.encode("1234567"), (Ids{'1', '2', '3', '4', '5', '6', '7'}));
  EXPECT_EQ(tok.encode("cafe\u0301"), Ids{279});  // NFC first: "café"
  EXPECT_EQ(tok.bos_id(), std::nullopt);
  EXPECT_EQ(tok.eos_id(), 282);  // "<|endoftext|>"
}

// ---- Hugging Face's library as the oracle ------------------------------------------------------

TEST(LlamaTokenizerOracle, Llama2) {
  expect_matches_oracle(kTinyLlama2TokenizerFile, 21, kLlamaFragments);
}

TEST(LlamaTokenizerOracle, Llama2WithoutByteFallbackWithAndWithoutFusedUnk) {
  for (bool fuse : {true, false})
    expect_matches_oracle(variant(kTinyLlama2TokenizerFile, "oracle_unk",
                                  [&](json& j) {
                                    j["model"]["byte_fallback"] = false;
                                    j["model"]["fuse_unk"] = fuse;
                                  }),
                          22, kLlamaFragments);
}

TEST(LlamaTokenizerOracle, MetaspaceEachPrependSchemeSplitAndDecoder) {
  for (const char* scheme : {"first", "always", "never"})
    for (bool split : {false, true})
      for (bool metaspace_decoder : {false, true})
        expect_matches_oracle(variant(kTinyMetaspaceTokenizerFile, "oracle_metaspace",
                                      [&](json& j) {
                                        j["pre_tokenizer"]["prepend_scheme"] = scheme;
                                        j["pre_tokenizer"]["split"] = split;
                                        if (metaspace_decoder)
                                          j["decoder"] = {{"type", "Metaspace"},
                                                          {"replacement", "▁"},
                                                          {"prepend_scheme", scheme},
                                                          {"split", split}};
                                      }),
                              23, kLlamaFragments);
}

TEST(LlamaTokenizerOracle, Llama3) {
  expect_matches_oracle(kTinyLlama3TokenizerFile, 24, kLlamaFragments);
}

TEST(LlamaTokenizerOracle, Llama3WithoutIgnoreMerges) {
  expect_matches_oracle(variant(kTinyLlama3TokenizerFile, "oracle_merges",
                                [](json& j) { j["model"]["ignore_merges"] = false; }),
                        25, kLlamaFragments);
}

TEST(LlamaTokenizerOracle, Qwen2) {
  expect_matches_oracle(kTinyQwen2TokenizerFile, 26, kLlamaFragments);
}

TEST(LlamaTokenizerOracle, EverySplitBehaviourAndInvert) {
  for (const char* behavior :
       {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"})
    for (bool invert : {false, true})
      for (const json& pattern : {json{{"Regex", "\\p{N}|\\s+"}}, json{{"String", " "}}})
        expect_matches_oracle(variant(kTinyLlama3TokenizerFile, "oracle_split",
                                      [&](json& j) {
                                        auto& split = j["pre_tokenizer"]["pretokenizers"][0];
                                        split["pattern"] = pattern;
                                        split["behavior"] = behavior;
                                        split["invert"] = invert;
                                      }),
                              27, kLlamaFragments);
}

// ---- files it refuses ---------------------------------------------------------------------------

std::string load_error(const fs::path& base, const std::function<void(json&)>& edit) {
  const fs::path path = variant(base, "refused", edit);
  try {
    Tokenizer::from_file(path);
  } catch (const InvalidArgumentError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(path.string()), std::string::npos) << message;
    return message;
  }
  ADD_FAILURE() << "loaded a file it should refuse";
  return "";
}

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE((haystack).find(needle), std::string::npos) << (haystack)

TEST(LlamaTokenizer, RefusesWhatItDoesNotImplementNamingTheComponent) {
  EXPECT_CONTAINS(
      load_error(kTinyLlama2TokenizerFile, [](json& j) { j["model"]["type"] = "Unigram"; }),
      "field \"model.type\" is \"Unigram\", which trainyard does not implement");
  EXPECT_CONTAINS(load_error(kTinyLlama2TokenizerFile,
                             [](json& j) {
                               j["normalizer"]["normalizers"][1] = {{"type", "Lowercase"}};
                             }),
                  "field \"normalizer.normalizers[1].type\" is \"Lowercase\"");
  EXPECT_CONTAINS(load_error(kTinyLlama2TokenizerFile,
                             [](json& j) {
                               j["decoder"]["decoders"][2] = {{"type", "CTC"}};
                             }),
                  "field \"decoder.decoders[2].type\" is \"CTC\"");
  EXPECT_CONTAINS(
      load_error(kTinyLlama3TokenizerFile,
                 [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Sideways"; }),
      "field \"pre_tokenizer.pretokenizers[0].behavior\" is \"Sideways\"");
  EXPECT_CONTAINS(load_error(kTinyLlama3TokenizerFile,
                             [](json& j) {
                               j["pre_tokenizer"]["pretokenizers"][1] = {{"type", "Digits"}};
                             }),
                  "field \"pre_tokenizer.pretokenizers[1].type\" is \"Digits\"");
  EXPECT_CONTAINS(load_error(kTinyLlama3TokenizerFile,
                             [](json& j) {
                               auto& steps = j["pre_tokenizer"]["pretokenizers"];
                               std::swap(steps[0], steps[1]);
                             }),
                  "ByteLevel as the last pre-tokenizer");
  EXPECT_CONTAINS(
      load_error(kTinyLlama3TokenizerFile,
                 [](json& j) {
                   j["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {{"Regex", "(a"}};
                 }),
      "field \"pre_tokenizer.pretokenizers[0].pattern\": the pattern (a does not "
      "compile");
  EXPECT_CONTAINS(load_error(kTinyMetaspaceTokenizerFile,
                             [](json& j) { j["pre_tokenizer"]["prepend_scheme"] = "sometimes"; }),
                  "field \"pre_tokenizer.prepend_scheme\" is \"sometimes\"");
}

}  // namespace
}  // namespace trainyard::hf
