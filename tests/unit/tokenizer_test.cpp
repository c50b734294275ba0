// hf::Tokenizer against Hugging Face's `tokenizers`: ids worked out by hand on a tiny
// tokenizer.json laid out as Pythia's (tests/data/hf/make_tiny_bpe_tokenizer.py: byte b is id
// 2 + b, merges get ids from 258 in merge order), the library itself as an oracle on random text
// when its npm package is installed, decode(encode(x)) == x, and the errors for files it refuses.
#include "trainyard/hf/tokenizer.h"

#include <gtest/gtest.h>
#include <unicode/uchar.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "../temp_dir.h"
#include "hf_test_data.h"
#include "tokenizer_test_util.h"
#include "trainyard/error.h"

namespace trainyard::hf {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Ids = std::vector<std::int32_t>;

using test::kTinyTokenizerFile;
using tokenizer_test::expect_matches_oracle;
using tokenizer_test::random_text;
using tokenizer_test::utf8;

// Ids of the tiny file (see its generator).
constexpr std::int32_t byte_id(unsigned char b) {
  return 2 + b;
}
constexpr std::int32_t kSpace = byte_id(' ');  // "Ġ"
constexpr std::int32_t kGt = 258, kHe = 259, kGthe = 260, kApostropheS = 263, k12 = 264, k123 = 265,
                       kCafe = 269, kSpaceSpace = 270, kAa = 272, kGworld = 278, kE4B8 = 279,
                       kApostropheLl = 282, kGc = 283;
constexpr std::int32_t kThreeSpaces = 284, kTwoSpaces = 285, kEAcuteBang = 286;

Ids bytes_of(std::string_view s) {
  Ids ids;
  for (char c : s) ids.push_back(byte_id(static_cast<unsigned char>(c)));
  return ids;
}

Ids cat(std::initializer_list<Ids> parts) {
  Ids all;
  for (const Ids& p : parts) all.insert(all.end(), p.begin(), p.end());
  return all;
}

json tiny_json() {
  std::ifstream in(kTinyTokenizerFile);
  return json::parse(in);
}

// The tiny file changed by `edit`, written to a file of its own (the oracle reads files).
fs::path write_variant(const std::string& name, const std::function<void(json&)>& edit) {
  json j = tiny_json();
  edit(j);
  const fs::path dir = fs::path(::testing::TempDir()) / "trainyard_tokenizer_test";
  fs::create_directories(dir);
  const fs::path path = dir / (name + ".json");
  std::ofstream(path) << j.dump(1);
  return path;
}

// Removes the added tokens that are runs of spaces.
void drop_space_tokens(json& j) {
  json kept = json::array();
  for (const auto& t : j["added_tokens"])
    if (t["content"].get<std::string>().find_first_not_of(' ') != std::string::npos)
      kept.push_back(t);
  j["added_tokens"] = kept;
}

// ---- hand-worked ids ---------------------------------------------------------------------------

class TinyTokenizer : public ::testing::Test {
 protected:
  Tokenizer tok = Tokenizer::from_file(kTinyTokenizerFile);
  Ids encode(std::string_view text) { return tok.encode(text); }
};

TEST_F(TinyTokenizer, VocabularyAndNamedTokens) {
  EXPECT_EQ(tok.vocab_size(), 287);
  EXPECT_EQ(tok.longest_token_bytes(), 13u) << "<|endoftext|>";
  EXPECT_EQ(tok.token_to_id("Ġthe"), kGthe);
  EXPECT_EQ(tok.token_to_id("  "), kTwoSpaces);
  EXPECT_EQ(tok.token_to_id("not a token"), std::nullopt);
  EXPECT_EQ(tok.id_to_token(kGworld), "Ġworld");
  EXPECT_EQ(tok.id_to_token(1000), std::nullopt);
  EXPECT_EQ(tok.eos_id(), 0);
  EXPECT_EQ(tok.pad_id(), 1);
  EXPECT_FALSE(tok.is_byte_level());
  EXPECT_EQ(tok.source(), kTinyTokenizerFile.string());
}

TEST_F(TinyTokenizer, MergesApplyByRankNotByPosition) {
  EXPECT_EQ(encode(""), Ids{});
  // "h e" (rank 1) then nothing: "Ġt he" needs the space.
  EXPECT_EQ(encode("the"), (Ids{byte_id('t'), kHe}));
  // "Ġ t" (0), "h e" (1), "Ġt he" (2).
  EXPECT_EQ(encode(" the"), Ids{kGthe});
  // "Ġ w" (16), "o r" (17), "l d" (19), "Ġw or" (18), "Ġwor ld" (20).
  EXPECT_EQ(encode("the world"), (Ids{byte_id('t'), kHe, kGworld}));
  // "Ã ©" (8), "a f" (9), "c af" (10), "caf Ã©" (11) win over "Ġ c" (25), whose pair is gone.
  EXPECT_EQ(encode(" café"), (Ids{kSpace, kCafe}));
  // The lowest-rank pair first, then leftmost among equals: "a a" twice, the odd one left.
  EXPECT_EQ(encode("aaaa"), (Ids{kAa, kAa}));
  EXPECT_EQ(encode("aaaaa"), (Ids{kAa, kAa, byte_id('a')}));
  EXPECT_EQ(encode(" c"), Ids{kGc});
}

TEST_F(TinyTokenizer, DigitsSplitFromLettersAndMergeByRank) {
  // "1 2" (6) before "Ġ 1" (22): " 12" is "Ġ" "12", and "12 3" (7) makes "123".
  EXPECT_EQ(encode("123456 12"), cat({{k123}, bytes_of("456"), {kSpace, k12}}));
  EXPECT_EQ(encode("abc123"), cat({bytes_of("abc"), {k123}}));
  // Other scripts' digits are \p{N} too: fullwidth "１２" stays one piece, split from "x".
  EXPECT_EQ(encode("x１２"), cat({bytes_of("x"), bytes_of("１２")}));
}

TEST_F(TinyTokenizer, ContractionsAreTheirOwnPieces) {
  EXPECT_EQ(encode("he's"), (Ids{kHe, kApostropheS}));
  // "l l" (23) then "' ll" (24); "it" has no merges.
  EXPECT_EQ(encode("it'll"), cat({bytes_of("it"), {kApostropheLl}}));
  // Upper case is no contraction: "'" is punctuation, "S" a letter.
  EXPECT_EQ(encode("'S"), bytes_of("'S"));
  // A contraction is matched only at an apostrophe; " 's" is " '" then "s".
  EXPECT_EQ(encode("x 's"), bytes_of("x 's"));
  EXPECT_EQ(encode("x'sy"), cat({bytes_of("x"), {kApostropheS}, bytes_of("y")}));
}

TEST_F(TinyTokenizer, RunsOfSpacesBecomeAddedTokensLongestFirst) {
  // Pythia's added tokens for runs of spaces are matched before the pre-tokeniser, longest first:
  // four spaces are "   " and then " b".
  EXPECT_EQ(encode("a    b"), cat({bytes_of("a"), {kThreeSpaces, kSpace}, bytes_of("b")}));
  EXPECT_EQ(encode("a  b"), cat({bytes_of("a"), {kTwoSpaces}, bytes_of("b")}));
  EXPECT_EQ(encode("a "), cat({bytes_of("a"), {kSpace}}));
  EXPECT_EQ(encode("     "), (Ids{kThreeSpaces, kTwoSpaces}));
}

TEST(HfTokenizer, RunsOfWhiteSpaceLeaveTheLastOneToTheNextWord) {
  const Tokenizer tok = Tokenizer::from_file(write_variant("no_space_tokens", drop_space_tokens));
  // "\s+(?!\S)" takes all but the last space, which goes with "b"; "Ġ Ġ" (12) merges pairs.
  EXPECT_EQ(tok.encode("a    b"),
            cat({bytes_of("a"), {kSpaceSpace, kSpace}, {kSpace}, bytes_of("b")}));
  // At the end of the text the run is one piece.
  EXPECT_EQ(tok.encode("a  "), cat({bytes_of("a"), {kSpaceSpace}}));
  // A lone white space that is not U+0020 is a piece of its own ("\s+"): "\n" then "b".
  EXPECT_EQ(tok.encode("a\nb"), bytes_of("a\nb"));
  // "\n\n" before a letter: the run minus its last character, then that "\n" alone, so the
  // "Ċ Ċ" merge never sees the pair.
  EXPECT_EQ(tok.encode("a\n\nb"), bytes_of("a\n\nb"));
  EXPECT_EQ(tok.encode("a\n\n"), cat({bytes_of("a"), {271}}));
  // No-break space (U+00A0) is \s: it splits "a" from "b" and stays a piece of its own.
  EXPECT_EQ(tok.encode("a\u00a0b"), bytes_of("a\u00a0b"));
  // Tabs, form feeds and line separators count; U+200B (zero-width space) does not.
  EXPECT_EQ(tok.encode(" \t the"), cat({bytes_of(" \t"), {kGthe}}));
}

TEST_F(TinyTokenizer, NonAsciiTextIsNormalisedToNfcFirst) {
  const std::string decomposed = "cafe\u0301";  // e + combining acute
  EXPECT_EQ(tok.normalize(decomposed), "café");
  EXPECT_EQ(encode(decomposed), Ids{kCafe});
  // "中" is E4 B8 AD: "ä ¸" merges the first two bytes.
  EXPECT_EQ(encode("中"), (Ids{kE4B8, byte_id(0xAD)}));
  EXPECT_EQ(encode("😀"), bytes_of("😀"));
  // Hangul jamo compose under NFC.
  EXPECT_EQ(encode("\u1100\u1161"), bytes_of("가"));
}

TEST_F(TinyTokenizer, SpecialTokensAreMatchedBeforeEverythingElse) {
  EXPECT_EQ(encode("<|endoftext|>the"), (Ids{0, byte_id('t'), kHe}));
  EXPECT_EQ(encode("a<|endoftext|>b<|padding|>"), (Ids{byte_id('a'), 0, byte_id('b'), 1}));
  EXPECT_EQ(encode("<|endof"), bytes_of("<|endof"));
  // A normalised added token ("é!", written decomposed in the file) matches either spelling.
  EXPECT_EQ(encode("xé!"), (Ids{byte_id('x'), kEAcuteBang}));
  EXPECT_EQ(encode("xe\u0301!"), (Ids{byte_id('x'), kEAcuteBang}));
  // Pythia's post-processor (ByteLevel) adds nothing.
  EXPECT_EQ(tok.encode(" the", false), tok.encode(" the", true));
}

TEST_F(TinyTokenizer, DecodeIsHfsLossyByteLevelDecoder) {
  EXPECT_EQ(tok.decode(encode(" the world, café.")), " the world, café.");
  EXPECT_EQ(tok.id_to_token(kEAcuteBang), "é!");  // normalised, as HF gives it back
  EXPECT_EQ(tok.decode(Ids{0, kGthe, 1}), "<|endoftext|> the<|padding|>");
  EXPECT_EQ(tok.decode(Ids{0, kGthe, 1}, /*skip_special_tokens=*/true), " the");
  EXPECT_EQ(tok.decode(Ids{kTwoSpaces, kThreeSpaces}), "     ");
  EXPECT_EQ(tok.decode(Ids{-1, 99999, kGthe}), " the");  // unknown ids are dropped
  // A character cut between ids: each maximal ill-formed part becomes one U+FFFD.
  EXPECT_EQ(tok.decode(Ids{kE4B8}), "\uFFFD");
  EXPECT_EQ(tok.decode(Ids{byte_id(0xF0), byte_id(0x80), byte_id('b')}), "\uFFFD\uFFFDb");
  EXPECT_EQ(tok.decode(Ids{byte_id(0xEB), byte_id(0x9E), byte_id('~')}), "\uFFFD~");
  EXPECT_EQ(tok.decode_bytes(Ids{kE4B8}), "\xE4\xB8");
  // The added token's text goes through the decoder as well: "é" is byte 0xE9 there.
  EXPECT_EQ(tok.decode(Ids{kEAcuteBang}), "\uFFFD!");
}

TEST(HfTokenizer, DecodeInvertsEncodeOnArbitraryBytes) {
  // Without the "é!" token: HF's decoder reads an added token's text as byte-level characters
  // too, so "é" (the character for byte 0xE9) does not come back.
  const Tokenizer tok = Tokenizer::from_file(
      write_variant("no_e_acute", [](json& j) { j["added_tokens"].erase(4); }));
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_int_distribution<int> length(0, 64);
  for (int i = 0; i < 2000; ++i) {
    std::string bytes;
    for (int n = length(rng); n > 0; --n) bytes.push_back(static_cast<char>(byte(rng)));
    // Ill-formed bytes pass through (Note [Invalid UTF-8]); well-formed runs come back in NFC.
    EXPECT_EQ(tok.decode_bytes(tok.encode(bytes)), tok.normalize(bytes))
        << testing::PrintToString(bytes);
    const std::string text = tok.normalize(random_text(rng));
    EXPECT_EQ(tok.decode(tok.encode(text)), text) << text;
  }
}

TEST(HfTokenizer, ByteLevelFallbackIsTheIdentityOnBytes) {
  const Tokenizer tok = Tokenizer::byte_level();
  EXPECT_TRUE(tok.is_byte_level());
  EXPECT_EQ(tok.vocab_size(), 256);
  EXPECT_EQ(tok.longest_token_bytes(), 1u);
  EXPECT_EQ(tok.encode("A\xff"), (Ids{65, 255}));
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> byte(0, 255);
  for (int i = 0; i < 200; ++i) {
    std::string bytes;
    for (int n = i; n > 0; --n) bytes.push_back(static_cast<char>(byte(rng)));
    const Ids ids = tok.encode(bytes);
    ASSERT_EQ(ids.size(), bytes.size());
    EXPECT_EQ(tok.decode(ids), bytes);
  }
}

TEST(HfTokenizer, DirectoryWithoutTokenizerJsonFallsBackToBytes) {
  const fs::path dir = fs::path(::testing::TempDir()) / "trainyard_tokenizer_no_json";
  trainyard::test::remove_all(dir);
  fs::create_directories(dir);
  EXPECT_TRUE(Tokenizer::from_directory(dir).is_byte_level());
  fs::copy_file(kTinyTokenizerFile, dir / "tokenizer.json", fs::copy_options::overwrite_existing);
  EXPECT_EQ(Tokenizer::from_directory(dir).encode(" the"), Ids{kGthe});
  EXPECT_THROW(Tokenizer::from_directory(dir / "missing"), InvalidArgumentError);
}

TEST(HfTokenizer, MergesWrittenAsPairsGiveTheSameIds) {
  const Tokenizer strings = Tokenizer::from_file(kTinyTokenizerFile);
  const Tokenizer pairs = Tokenizer::from_file(write_variant("pairs", [](json& j) {
    json merges = json::array();
    for (const auto& m : j["model"]["merges"]) {
      const std::string s = m.get<std::string>();
      merges.push_back({s.substr(0, s.find(' ')), s.substr(s.find(' ') + 1)});
    }
    j["model"]["merges"] = merges;
  }));
  for (const char* text : {" the world", " café", "123456 12", "it'll", "aaaaa"})
    EXPECT_EQ(pairs.encode(text), strings.encode(text)) << text;
}

TEST(HfTokenizer, PrefixSpaceIgnoreMergesAndTemplate) {
  const Tokenizer tok = Tokenizer::from_file(write_variant("prefix_template", [](json& j) {
    j["pre_tokenizer"]["add_prefix_space"] = true;
    j["model"]["ignore_merges"] = true;
    j["model"]["vocab"]["Ġcaf"] = 287;  // no merge makes it; ignore_merges takes it whole
    j["post_processor"] = json::parse(R"({"type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
                 {"Sequence": {"id": "A", "type_id": 0}}],
      "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
      "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [0],
                                            "tokens": ["<|endoftext|>"]}}})");
  }));
  EXPECT_EQ(tok.encode("the"), (Ids{0, kGthe}));
  EXPECT_EQ(tok.encode("the", false), Ids{kGthe});
  EXPECT_EQ(tok.encode("caf", false), Ids{287});
  // Each piece between added tokens gets its own prefix space.
  EXPECT_EQ(tok.encode("the<|padding|>the", false), (Ids{kGthe, 1, kGthe}));
}

// A tokenizer that may delete text says nothing of a text's token count from its length
// (Note [Prompts longer than seq_len]): 0, so that no long prompt is dropped unencoded.
TEST(HfTokenizer, LongestTokenIsUnknownWhereAStepDeletesText) {
  const auto longest = [](const std::function<void(json&)>& edit) {
    return Tokenizer::from_file(write_variant("longest", edit)).longest_token_bytes();
  };
  EXPECT_EQ(longest([](json&) {}), 13u);
  EXPECT_EQ(
      longest([](json& j) {
        j["normalizer"] = {{"type", "Replace"}, {"pattern", {{"String", "abc"}}}, {"content", ""}};
      }),
      0u);
  EXPECT_EQ(longest([](json& j) {
              j["normalizer"] = {
                  {"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}};
            }),
            13u)
      << "Llama 2's space to \"\u2581\" only grows a text";
  EXPECT_EQ(longest([](json& j) {
              j["pre_tokenizer"] = {{"type", "Sequence"},
                                    {"pretokenizers",
                                     {{{"type", "Split"},
                                       {"pattern", {{"Regex", "x+"}}},
                                       {"behavior", "Removed"},
                                       {"invert", false}},
                                      j["pre_tokenizer"]}}};
            }),
            0u);
}

// ---- files it refuses ---------------------------------------------------------------------------

std::string load_error(const std::function<void(json&)>& edit) {
  const fs::path path = write_variant("refused", edit);
  try {
    Tokenizer::from_file(path);
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(path.string()), std::string::npos) << message;
    return message;
  }
  ADD_FAILURE() << "loaded a file it should refuse";
  return "";
}

TEST(HfTokenizer, RefusesOtherModelsAndPreTokenizersNamingTheField) {
  EXPECT_NE(load_error([](json& j) { j["model"]["type"] = "WordPiece"; }).find("\"model.type\""),
            std::string::npos);
  EXPECT_NE(load_error([](json& j) { j["model"]["type"] = "Unigram"; }).find("Unigram"),
            std::string::npos);
  EXPECT_NE(load_error([](json& j) {
              j["pre_tokenizer"] = {{"type", "Whitespace"}};
            }).find("\"pre_tokenizer.type\" is \"Whitespace\""),
            std::string::npos);
  EXPECT_NE(load_error([](json& j) {
              j["normalizer"] = {{"type", "Lowercase"}};
            }).find("\"normalizer.type\""),
            std::string::npos);
  EXPECT_NE(load_error([](json& j) {
              j["decoder"] = {{"type", "WordPiece"}};
            }).find("\"decoder.type\""),
            std::string::npos);
  EXPECT_NE(load_error([](json& j) {
              j["truncation"] = {{"max_length", 512}};
            }).find("truncation"),
            std::string::npos);
  EXPECT_NE(
      load_error([](json& j) { j["model"]["merges"][3] = "i n g"; }).find("\"model.merges[3]\""),
      std::string::npos);
  EXPECT_NE(load_error([](json& j) { j["model"]["merges"].push_back("x yz"); }).find("\"yz\""),
            std::string::npos);
  // Not the JSON library's "key 'merges' not found": the field, and what belongs there.
  const auto no_merges = load_error([](json& j) { j["model"].erase("merges"); });
  EXPECT_NE(no_merges.find("field \"model.merges\" is missing; a BPE model lists its merges"),
            std::string::npos)
      << no_merges;
  EXPECT_NE(load_error([](json& j) {
              j["model"]["merges"][0] = json::array({1, 2});
            }).find("\"model.merges[0]\""),
            std::string::npos);
  const auto empty = load_error([](json& j) {
    j["model"]["vocab"] = json::object();
    j["model"]["merges"] = json::array();
  });
  EXPECT_NE(empty.find("has an empty vocabulary (\"model.vocab\" holds no token): every text "
                       "would encode to no token. HINT: "),
            std::string::npos)
      << empty;
  EXPECT_THROW(Tokenizer::from_json("{\"model\": ", "broken.json"), CorruptDataError);
  EXPECT_THROW(Tokenizer::from_file("/nonexistent/tokenizer.json"), InvalidArgumentError);
}

// ---- many threads ------------------------------------------------------------------------------

TEST_F(TinyTokenizer, EncodeBatchMatchesEncodeOnEveryThread) {
  std::mt19937 rng(3);
  std::vector<std::string> texts(3000);
  for (auto& t : texts) t = random_text(rng);
  const auto batch = tok.encode_batch(texts, true, 4);
  ASSERT_EQ(batch.size(), texts.size());
  const Tokenizer fresh = Tokenizer::from_file(kTinyTokenizerFile);  // its own, cold cache
  for (std::size_t i = 0; i < texts.size(); ++i) ASSERT_EQ(batch[i], fresh.encode(texts[i])) << i;
}

// ---- Hugging Face's library as the oracle ------------------------------------------------------

TEST(HfTokenizerOracle, PythiaLayout) {
  expect_matches_oracle(kTinyTokenizerFile, 1);
}

TEST(HfTokenizerOracle, WithoutSpaceTokensWithPrefixSpaceAndTemplate) {
  expect_matches_oracle(write_variant("oracle_prefix",
                                      [](json& j) {
                                        drop_space_tokens(j);
                                        j["pre_tokenizer"]["add_prefix_space"] = true;
                                        j["post_processor"] =
                                            json::parse(R"({"type": "TemplateProcessing",
      "single": [{"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}],
      "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
      "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [0],
                                            "tokens": ["<|endoftext|>"]}}})");
                                      }),
                        2);
}

TEST(HfTokenizerOracle, StrippingAndSingleWordAddedTokensAndPairMerges) {
  expect_matches_oracle(
      write_variant("oracle_strip",
                    [](json& j) {
                      j["added_tokens"][0]["lstrip"] = true;       // <|endoftext|>
                      j["added_tokens"][1]["rstrip"] = true;       // <|padding|>
                      j["added_tokens"][4]["single_word"] = true;  // é!
                      j["model"]["ignore_merges"] = true;
                      json merges = json::array();
                      for (const auto& m : j["model"]["merges"]) {
                        const std::string s = m.get<std::string>();
                        merges.push_back({s.substr(0, s.find(' ')), s.substr(s.find(' ') + 1)});
                      }
                      j["model"]["merges"] = merges;
                    }),
      3);
}

}  // namespace
}  // namespace trainyard::hf
