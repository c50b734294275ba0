// Data preparation for causal language modelling (data/text_lines.h): the seed's line filter,
// truncation and padding, the padding masked out of the labels, and the token cache.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "../log_capture.h"
#include "../temp_dir.h"
#include "trainyard/data/text_lines.h"
#include "trainyard/error.h"
#include "trainyard/models/gpt_neox.h"

namespace {
namespace fs = std::filesystem;
using namespace trainyard::data;

std::vector<std::int32_t> bytes_of(std::string_view s) {
  return {reinterpret_cast<const unsigned char*>(s.data()),
          reinterpret_cast<const unsigned char*>(s.data()) + s.size()};
}

TEST(TextLines, DropsEmptyLinesAndSpeakerNames) {
  const std::string corpus =
      "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\r\n"
      "  \nWhat say you: no\nMENENIUS:\r\nlast line without newline";
  const auto lines = training_lines(corpus);
  const std::vector<std::string_view> expected = {"Before we proceed any further, hear me speak.",
                                                  "Speak, speak.", "  ", "What say you: no",
                                                  "last line without newline"};
  EXPECT_EQ(lines, expected);
}

TEST(TextLines, TruncatesPadsAndMasksThePadding) {
  const std::vector<std::string_view> lines = {"abcdef", "xy", ""};
  const auto t = tokenize_lines(lines, bytes_of, /*seq_len=*/4, /*pad_id=*/7);
  ASSERT_EQ(t.size(), 2) << "a line with no token is dropped";
  EXPECT_EQ(t.skipped, 1);
  EXPECT_EQ(t.lengths, (std::vector<std::int32_t>{4, 2}));
  EXPECT_EQ(t.ids, (std::vector<std::int32_t>{'a', 'b', 'c', 'd', 'x', 'y', 7, 7}));
  EXPECT_EQ(t.tokens(), 6);

  const auto batch = causal_lm_batch(t, {1, 0});
  auto rows = [](std::vector<std::int64_t> v) { return torch::tensor(v).view({2, 4}); };
  EXPECT_TRUE(torch::equal(batch.input_ids, rows({'x', 'y', 7, 7, 'a', 'b', 'c', 'd'})));
  const std::int64_t m = trainyard::kIgnoreIndex;
  EXPECT_TRUE(torch::equal(batch.labels, rows({'x', 'y', m, m, 'a', 'b', 'c', 'd'})));
  EXPECT_EQ(batch.tokens, 6);
}

class TokenCache : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("ty-text-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
    corpus_ = (dir_ / "corpus.txt").string();
    std::ofstream(corpus_) << "KING:\nto be or not\nthat is\n";
  }
  void TearDown() override { trainyard::test::remove_all(dir_); }
  fs::path dir_;
  std::string corpus_;
};

TEST_F(TokenCache, TheSecondPreparationReadsTheCacheNextToTheCorpus) {
  int calls = 0;
  Encoder counting = [&](std::string_view s) {
    ++calls;
    return bytes_of(s);
  };
  const auto first = prepare_text(corpus_, "bytes", counting, 8, 0);
  EXPECT_FALSE(first.from_cache);
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(fs::path(first.cache_path).parent_path(), dir_);
  EXPECT_TRUE(fs::exists(first.cache_path));

  const auto second = prepare_text(corpus_, "bytes", counting, 8, 0);
  EXPECT_TRUE(second.from_cache);
  EXPECT_EQ(calls, 2) << "nothing tokenised again";
  EXPECT_EQ(second.lines.ids, first.lines.ids);
  EXPECT_EQ(second.lines.lengths, first.lines.lengths);

  // Another sequence length or tokenizer is another preparation.
  EXPECT_FALSE(prepare_text(corpus_, "bytes", counting, 4, 0).from_cache);
  EXPECT_FALSE(prepare_text(corpus_, "other", counting, 8, 0).from_cache);
}

TEST_F(TokenCache, AChangedCorpusOrADamagedCacheIsPreparedAgain) {
  const auto first = prepare_text(corpus_, "bytes", bytes_of, 8, 0);
  std::ofstream(corpus_, std::ios::app) << "one more line\n";
  const auto changed = prepare_text(corpus_, "bytes", bytes_of, 8, 0);
  EXPECT_FALSE(changed.from_cache);
  EXPECT_EQ(changed.lines.size(), 3);

  fs::resize_file(changed.cache_path, fs::file_size(changed.cache_path) - 3);  // torn
  const auto again = prepare_text(corpus_, "bytes", bytes_of, 8, 0);
  EXPECT_FALSE(again.from_cache);
  EXPECT_EQ(again.lines.ids, changed.lines.ids);
}

// A line of one token has nothing to predict after the shift (a batch of them trains with a loss
// of NaN): such lines are skipped and counted, from the cache too; a corpus left empty is an
// error naming the file and why.
TEST_F(TokenCache, LinesOfOneTokenAreSkippedAndCountedAndNoneLeftIsAnError) {
  std::ofstream(corpus_, std::ios::trunc) << "KING:\nab\nc\nd\n";
  for (bool cached : {false, true}) {
    trainyard::test::LogCapture log("data");
    const auto text = prepare_text(corpus_, "bytes", bytes_of, 8, 0);
    EXPECT_EQ(text.from_cache, cached);
    EXPECT_EQ(text.lines.size(), 1);
    EXPECT_EQ(text.lines.skipped, 2);
    EXPECT_NE(log.text().find("Skipped 2 of the 3 training lines of " + corpus_ +
                              ": they encode to fewer than 2 tokens"),
              std::string::npos)
        << log.text();
  }
  std::ofstream(corpus_, std::ios::trunc) << "a\nb\nc\n";
  try {
    prepare_text(corpus_, "bytes", bytes_of, 8, 0);
    FAIL() << "every line is one token";
  } catch (const trainyard::InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("The corpus " + corpus_ +
                                         " leaves nothing to train on: all 3 of its training "
                                         "lines encode to fewer than 2 tokens"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("HINT: "), std::string::npos) << e.what();
  }
}

TEST_F(TokenCache, ACorpusWithoutTrainingLinesOrFileIsAClearError) {
  std::ofstream(corpus_, std::ios::trunc) << "A:\n\nB:\n";
  try {
    prepare_text(corpus_, "bytes", bytes_of, 8, 0);
    FAIL() << "no training line";
  } catch (const trainyard::InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("has no training line"), std::string::npos) << e.what();
  }
  try {
    prepare_text((dir_ / "missing.txt").string(), "bytes", bytes_of, 8, 0);
    FAIL() << "no file";
  } catch (const trainyard::InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("missing.txt does not exist"), std::string::npos)
        << e.what();
  }
  // A device has no end to read to (it ended in std::bad_alloc); a folder is not a corpus.
  for (const std::string& not_a_file : {std::string("/dev/zero"), dir_.string()}) {
    try {
      prepare_text(not_a_file, "bytes", bytes_of, 8, 0);
      FAIL() << not_a_file << " was read";
    } catch (const trainyard::InvalidArgumentError& e) {
      EXPECT_NE(std::string(e.what()).find("--data " + not_a_file + " is a "), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("regular file"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
