// encode_lines / decode_lines: the line format of `trainyard tokenize`, on the tiny tokenizer.json
// of tokenizer_test.cpp (byte b is id 2 + b; "he" 259, "'s" 263, "Ġworld" 278).
#include "trainyard/hf/tokenize_lines.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>
#include <string>

#include "hf_test_data.h"
#include "trainyard/error.h"

namespace trainyard::hf {
namespace {

using test::kTinyTokenizerFile;

std::string encode_text(const Tokenizer& tok, const std::string& text, EncodeLinesOptions o = {}) {
  std::istringstream in(text);
  std::ostringstream out;
  encode_lines(tok, in, out, o);
  return out.str();
}

std::string decode_text(const Tokenizer& tok, const std::string& text) {
  std::istringstream in(text);
  std::ostringstream out;
  decode_lines(tok, in, out);
  return out.str();
}

TEST(TokenizeLines, OneLineOfIdsPerLineOfText) {
  const Tokenizer tok = Tokenizer::from_file(kTinyTokenizerFile);
  EXPECT_EQ(encode_text(tok, "the world\n\nhe's\n"), "118 259 278\n\n259 263\n");
  EXPECT_EQ(encode_text(tok, "he's"), "259 263\n");  // a last line without '\n' counts
  EXPECT_EQ(decode_text(tok, "118 259 278\n\n259 263\n"), "the world\n\nhe's\n");
  EXPECT_EQ(decode_text(tok, "118,259, 278\t0\n"), "the world<|endoftext|>\n");
}

TEST(TokenizeLines, ChunksAndThreadsDoNotChangeTheOutput) {
  const Tokenizer tok = Tokenizer::from_file(kTinyTokenizerFile);
  std::string text;
  for (int i = 0; i < 500; ++i) text += "line " + std::to_string(i) + " of the world, café\n";
  const std::string whole = encode_text(tok, text, {.threads = 1});
  EXPECT_EQ(encode_text(tok, text, {.threads = 3, .chunk_bytes = 100}), whole);
  EXPECT_EQ(decode_text(tok, whole), text);
}

TEST(TokenizeLines, ByteLevelKeepsCarriageReturns) {
  const Tokenizer tok = Tokenizer::byte_level();
  EXPECT_EQ(encode_text(tok, "A\r\n\xff\n"), "65 13\n255\n");
  EXPECT_EQ(decode_text(tok, "65 13\n255\n"), "A\r\n\xff\n");
}

TEST(TokenizeLines, DecodeNamesTheLineThatIsNotIds) {
  const Tokenizer tok = Tokenizer::from_file(kTinyTokenizerFile);
  try {
    decode_text(tok, "118\n118 x9\n");
    FAIL() << "decoded a line that is not ids";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("line 2 of the input: \"x9\""), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(decode_text(tok, "12.5\n"), InvalidArgumentError);
  EXPECT_THROW(decode_text(tok, "99999999999\n"), InvalidArgumentError);  // not an int32
}

}  // namespace
}  // namespace trainyard::hf
