// Instruction records for seed 002's fine-tuning (data/instruction_data.h): samsum, alpaca and
// templated JSON lines read into prompts and responses, every bad input named by file and line,
// BOS + prompt + response + EOS with the prompt masked, packing, padding and length grouping.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <fstream>
#include <set>

#include "../multiproc/multiproc_util.h"
#include "trainyard/data/instruction_data.h"
#include "trainyard/error.h"
#include "trainyard/ignore_index.h"

namespace {
using namespace trainyard::data;
using trainyard::mptest::TempDir;

std::string write(const TempDir& dir, const std::string& name, const std::string& text) {
  const auto path = (dir.path() / name).string();
  std::ofstream(path) << text;
  return path;
}

std::string refusal(const std::string& path, const RecordFormat& format) {
  try {
    read_records(path, format);
  } catch (const trainyard::InvalidArgumentError& e) {
    return e.what();
  }
  ADD_FAILURE() << "accepted " << path;
  return "";
}

TEST(InstructionData, SamsumAlpacaAndTemplatedRecordsBecomePromptsAndResponses) {
  TempDir dir;
  const auto samsum =
      read_records(write(dir, "s.jsonl",
                         R"({"id": "1", "dialogue": "A: hi\nB: hello", "summary": "They greet."})"
                         "\n\n"
                         R"({"id": "2", "dialogue": "A: bye", "summary": "A leaves."})"
                         "\n"),
                   {.format = DataFormat::kSamsum});
  ASSERT_EQ(samsum.size(), 2u);
  EXPECT_EQ(samsum[0].prompt, "Summarize this dialog:\nA: hi\nB: hello\n---\nSummary:\n");
  EXPECT_EQ(samsum[0].response, "They greet.");
  EXPECT_EQ(samsum[1].where, (dir.path() / "s.jsonl").string() + ":3");

  const auto alpaca =
      read_records(write(dir, "a.json",
                         R"([{"instruction": "Add.", "input": "2 and 3", "output": "5"},
                {"instruction": "Say hi.", "input": "", "output": "hi"}])"),
                   {.format = DataFormat::kAlpaca});
  ASSERT_EQ(alpaca.size(), 2u);
  EXPECT_NE(alpaca[0].prompt.find("### Input:\n2 and 3\n\n### Response:\n"), std::string::npos);
  EXPECT_EQ(alpaca[1].prompt.find("### Input:"), std::string::npos);  // the prompt without input
  EXPECT_EQ(alpaca[1].response, "hi");

  const auto jsonl = read_records(write(dir, "q.jsonl", R"({"q": "2+2?", "a": "4"})"),
                                  {.format = DataFormat::kJsonl,
                                   .prompt_template = "Q: {q} {{literal}}\nA: ",
                                   .response_field = "a"});
  EXPECT_EQ(jsonl[0].prompt, "Q: 2+2? {literal}\nA: ");
  EXPECT_EQ(jsonl[0].response, "4");
}

TEST(InstructionData, BadRecordsAreNamedByFileAndLine) {
  TempDir dir;
  const auto missing =
      refusal(write(dir, "m.jsonl",
                    "{\"dialogue\": \"A: x\", \"summary\": \"s\"}\n{\"dialogue\": \"y\"}\n"),
              {.format = DataFormat::kSamsum});
  EXPECT_NE(missing.find("m.jsonl:2: the record has no \"summary\" field"), std::string::npos)
      << missing;
  const auto invalid = refusal(write(dir, "i.jsonl",
                                     "{\"dialogue\": \"a\", \"summary\": \"b\"}\n"
                                     "{\"dialogue\": \"a\",\n"),
                               {.format = DataFormat::kSamsum});
  EXPECT_NE(invalid.find("i.jsonl:2 is not valid JSON"), std::string::npos) << invalid;
  const auto unknown = refusal(
      write(dir, "u.jsonl", R"({"q": "x", "a": "y"})"),
      {.format = DataFormat::kJsonl, .prompt_template = "{question}", .response_field = "a"});
  EXPECT_NE(unknown.find("u.jsonl:1: the record has no \"question\" field"), std::string::npos)
      << unknown;
  const auto not_string = refusal(write(dir, "n.json", R"([{"dialogue": 3, "summary": "s"}])"),
                                  {.format = DataFormat::kSamsum});
  EXPECT_NE(not_string.find("n.json[0]: the field \"dialogue\" must be a string"),
            std::string::npos)
      << not_string;
  EXPECT_NE(refusal(write(dir, "e.jsonl", "\n\n"), {.format = DataFormat::kSamsum})
                .find("holds no record"),
            std::string::npos);
}

// One id per character, so lengths are easy to read.
ExampleTokens char_tokens() {
  return {
      .encode =
          [](std::string_view text) { return std::vector<std::int32_t>(text.begin(), text.end()); },
      .bos = 1,
      .eos = 2};
}

// A 50 MB prompt is dropped by its size: never encoded (it took 2.4 GB to find it too long), and
// counted like any prompt that fills seq_len (Note [Prompts longer than seq_len]).
TEST(InstructionData, APromptFarLongerThanSeqLenIsDroppedWithoutEncodingIt) {
  std::size_t longest_encoded = 0;
  ExampleTokens tokens = char_tokens();
  tokens.encode = [&longest_encoded](std::string_view text) {
    longest_encoded = std::max(longest_encoded, text.size());
    return std::vector<std::int32_t>(text.begin(), text.end());
  };
  tokens.longest_token_bytes = 3;
  const std::vector<PromptResponse> records = {{std::string(50 << 20, 'p'), "r", "big"},
                                               {"ab", "xyz", "small"}};
  const auto examples = tokenize_examples(records, tokens, 64, /*truncate=*/true);
  EXPECT_EQ(examples.size(), 1);
  EXPECT_EQ(examples.dropped, 1);
  EXPECT_EQ(examples.first_dropped, "big");
  EXPECT_EQ(longest_encoded, 3u) << "only the small record's texts were encoded";
  // At the bound (4 x 3 bytes x 64) a prompt is still encoded: it might fit.
  const std::vector<PromptResponse> at_bound = {{std::string(4 * 3 * 64, 'p'), "r", "edge"}};
  EXPECT_EQ(tokenize_examples(at_bound, tokens, 64, true).dropped, 1);
  EXPECT_EQ(longest_encoded, 4u * 3 * 64);
}

TEST(InstructionData, ExamplesMaskBosAndPromptAndCountWhatSeqLenCuts) {
  const std::vector<PromptResponse> records = {{"ab", "xyz", "r0"},
                                               {"abcdefgh", "z", "r1"},  // 1 + 8 = 9 >= 8: dropped
                                               {"a", "uvwxyz", "r2"}};   // 1 + 1 + 6 + 1 = 9 > 8
  const auto padded = tokenize_examples(records, char_tokens(), 8, /*truncate=*/true);
  ASSERT_EQ(padded.size(), 2);
  EXPECT_EQ(padded.dropped, 1);
  EXPECT_EQ(padded.first_dropped, "r1");
  EXPECT_EQ(padded.truncated, 1);
  const std::int32_t m = static_cast<std::int32_t>(trainyard::kIgnoreIndex);
  EXPECT_EQ(std::vector<std::int32_t>(padded.ids.begin(), padded.ids.begin() + 7),
            (std::vector<std::int32_t>{1, 'a', 'b', 'x', 'y', 'z', 2}));
  EXPECT_EQ(std::vector<std::int32_t>(padded.labels.begin(), padded.labels.begin() + 7),
            (std::vector<std::int32_t>{m, m, m, 'x', 'y', 'z', 2}));
  EXPECT_EQ(padded.length(1), 8);  // cut at seq_len, EOS lost

  const auto whole = tokenize_examples(records, char_tokens(), 8, /*truncate=*/false);
  EXPECT_EQ(whole.truncated, 0);
  EXPECT_EQ(whole.tokens(), 7 + 9);
  const auto rows = pack(whole, 5);  // 16 tokens: three rows of 5, the last token left out
  ASSERT_EQ(rows.size(), 3);
  EXPECT_EQ(rows.ids, std::vector<std::int32_t>(whole.ids.begin(), whole.ids.begin() + 15));
  EXPECT_EQ(rows.labels,
            std::vector<std::int32_t>(whole.labels.begin(), whole.labels.begin() + 15));

  const auto batch = example_batch(padded, {1, 0}, /*pad_id=*/0);
  EXPECT_EQ(batch.input_ids.sizes(), (torch::IntArrayRef{2, 8}));
  EXPECT_EQ(batch.tokens, 8 + 7);
  EXPECT_EQ(batch.input_ids[1][7].item<std::int64_t>(), 0);  // padding
  EXPECT_EQ(batch.labels[1][7].item<std::int64_t>(), trainyard::kIgnoreIndex);
  EXPECT_EQ(batch.labels[1][3].item<std::int64_t>(), 'x');
}

TEST(InstructionData, LengthGroupedBatchesAreDisjointEqualPerRankAndOfSimilarLengths) {
  Examples examples;
  for (int e = 0; e < 37; ++e) {  // lengths 1 ... 37
    for (int t = 0; t <= e; ++t) {
      examples.ids.push_back(t);
      examples.labels.push_back(t);
    }
    examples.offsets.push_back(static_cast<std::int64_t>(examples.ids.size()));
  }
  for (const int world : {1, 2, 3}) {
    std::set<std::int64_t> seen;
    std::size_t per_rank = 0;
    for (int rank = 0; rank < world; ++rank) {
      const auto batches = length_grouped_batches(examples, 4, world, rank, 7, 1);
      if (rank == 0) per_rank = batches.size();
      EXPECT_EQ(batches.size(), per_rank) << "W=" << world;
      for (const auto& b : batches) {
        ASSERT_EQ(b.size(), 4u);
        // Neighbours in length order: the longest and shortest of a batch differ by 3.
        EXPECT_EQ(examples.length(b.front()) - examples.length(b.back()), 3);
        for (auto e : b) EXPECT_TRUE(seen.insert(e).second) << "example " << e << " twice";
      }
    }
    EXPECT_EQ(per_rank, 9u / world);  // 37 / 4 = 9 whole batches, trimmed to a multiple of W
  }
  EXPECT_NE(length_grouped_batches(examples, 4, 1, 0, 7, 1),
            length_grouped_batches(examples, 4, 1, 0, 7, 2))
      << "each epoch shuffles the batches";
}

}  // namespace
