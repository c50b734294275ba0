// Seed 002's job through the real CLI: a tiny Llama (a Hugging Face folder: config.json and a
// Llama 2 tokenizer.json) fine-tuned on samsum-style records on two ranks as llama-recipes does,
// packed and padded, with eval perplexity per epoch; then generated from and exported.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

#include "../multiproc/multiproc_util.h"

namespace {
namespace fs = std::filesystem;
using trainyard::mptest::read_file;
using trainyard::mptest::run_program;
using trainyard::mptest::TempDir;
using namespace std::chrono_literals;

// A tiny Llama folder (random weights) with the Llama 2 style test tokenizer, and 240 dialogues.
void write_fixture(const fs::path& dir) {
  fs::create_directories(dir / "model");
  std::ofstream(dir / "model" / "config.json") << R"({"model_type": "llama",
      "vocab_size": 384, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
      "rms_norm_eps": 1e-5})";
  fs::copy_file(fs::path(TRAINYARD_SOURCE_DIR) / "tests/data/hf/tiny_llama2_tokenizer.json",
                dir / "model" / "tokenizer.json");
  const char* names[] = {"Anna", "Ben", "Cleo", "Dan", "Eve", "Finn"};
  const char* things[] = {"the report", "lunch", "the train", "a movie", "the keys", "dinner"};
  const char* times[] = {"today", "tomorrow", "at noon", "tonight", "on Monday", "later"};
  std::ofstream out(dir / "samsum.jsonl");
  for (int i = 0; i < 240; ++i) {
    const std::string a = names[i % 6], b = names[(i / 6 + 1 + i % 6) % 6];
    const std::string t = things[(i * 7) % 6], w = times[(i * 5 + i / 6) % 6];
    out << nlohmann::json{{"id", std::to_string(i)},
                          {"dialogue", a + ": Did you bring " + t + "?\n" + b +
                                           ": Not yet, I will bring " + t + " " + w + ".\n" + a +
                                           ": Great, thanks!"},
                          {"summary", b + " will bring " + t + " to " + a + " " + w + "."}}
               .dump()
        << "\n";
  }
}

std::vector<std::string> command(const fs::path& dir, std::vector<std::string> more) {
  std::vector<std::string> args = {TRAINYARD_CLI_PATH,
                                   "train",
                                   "causal-lm",
                                   "--model",
                                   (dir / "model").string(),
                                   "--data",
                                   (dir / "samsum.jsonl").string(),
                                   "--data-format",
                                   "samsum",
                                   "--val-fraction",
                                   "0.1",
                                   "--seq-len",
                                   "128",
                                   "--batch-size",
                                   "4",
                                   "--workers",
                                   "2",
                                   "--precision",
                                   "fp32",
                                   "--lr",
                                   "3e-3",
                                   "--storage",
                                   dir.string(),
                                   "--no-progress"};
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

std::vector<double> printed(const std::string& out, const std::string& pattern) {
  std::vector<double> values;
  const std::regex re(pattern);
  for (std::sregex_iterator it(out.begin(), out.end(), re), end; it != end; ++it)
    values.push_back(std::stod((*it)[1]));
  return values;
}

TEST(LlamaRecipe, SamsumOnTwoRanksLearnsAndPrintsEvalPerplexityPerEpochPackedAndPadded) {
  TempDir dir;
  write_fixture(dir.path());
  auto packed = run_program(command(dir.path(), {"--epochs", "2", "--name", "packed"}), {}, 120s);
  ASSERT_TRUE(packed.status.success()) << packed.out << packed.err;
  const auto losses = printed(packed.out, R"(step \d+/\d+: loss ([0-9.]+))");
  ASSERT_GE(losses.size(), 20u) << packed.out;
  EXPECT_LT(losses.back(), losses.front() * 0.6) << packed.out;
  EXPECT_EQ(printed(packed.out, R"(Epoch \d: train_perplexity=([0-9.]+))").size(), 2u);
  const auto eval = printed(packed.out, R"( eval_ppl=([0-9.]+))");
  ASSERT_EQ(eval.size(), 2u) << packed.out;
  EXPECT_LT(eval[1], eval[0]) << "the second epoch's eval perplexity is lower";
  const auto result = nlohmann::json::parse(read_file(dir.path() / "packed" / "result.json"));
  for (const char* key : {"avg_train_prep", "avg_train_loss", "avg_eval_prep", "avg_eval_loss",
                          "avg_epoch_time", "avg_checkpoint_time", "eval_ppl"})
    EXPECT_TRUE(result.contains(key)) << key;
  EXPECT_EQ(result["config"]["model_type"], "llama");
  EXPECT_EQ(result["config"]["batching"], "packing");
  EXPECT_EQ(result["config"]["lr"].get<double>(), 3e-3);
  EXPECT_EQ(result["config"]["gamma"].get<double>(), 0.85) << "llama-recipes' StepLR default";
  EXPECT_NE(packed.out.find("avg_eval_prep"), std::string::npos) << "in the seed's table";

  // Padding: length-grouped batches; two micro-batches per step.
  auto padded = run_program(command(dir.path(), {"--batching", "padding", "--name", "padded",
                                                 "--gradient-accumulation-steps", "2"}),
                            {}, 120s);
  ASSERT_TRUE(padded.status.success()) << padded.out << padded.err;
  const auto padded_losses = printed(padded.out, R"(step \d+/\d+: loss ([0-9.]+))");
  ASSERT_GE(padded_losses.size(), 10u);
  EXPECT_LT(padded_losses.back(), padded_losses.front());
  EXPECT_EQ(printed(padded.out, R"( eval_ppl=([0-9.]+))").size(), 1u);

  // The run generates from its checkpoint and exports a Llama folder.
  auto g = run_program({TRAINYARD_CLI_PATH, "generate", "--model", (dir.path() / "packed").string(),
                        "--prompt", "Summarize this dialog:", "--max-new-tokens", "4"},
                       {}, 60s);
  ASSERT_TRUE(g.status.success()) << g.err;
  auto e = run_program({TRAINYARD_CLI_PATH, "export", "--checkpoint",
                        (dir.path() / "packed" / "checkpoint_000000").string(), "--out",
                        (dir.path() / "exported").string()},
                       {}, 60s);
  ASSERT_TRUE(e.status.success()) << e.err;
  EXPECT_EQ(nlohmann::json::parse(read_file(dir.path() / "exported" / "config.json"))["model_type"],
            "llama");
  EXPECT_TRUE(fs::exists(dir.path() / "exported" / "tokenizer.json"));
}

TEST(LlamaRecipe, BadRecordsAndFlagsAreRefusedNamingTheFileAndLine) {
  TempDir dir;
  write_fixture(dir.path());
  std::ofstream(dir.path() / "bad.jsonl") << R"({"dialogue": "A: x", "summary": "s"})"
                                          << "\n"
                                          << R"({"dialogue": "A: y"})"
                                          << "\n";
  auto missing = run_program(
      command(dir.path(), {"--data", (dir.path() / "bad.jsonl").string(), "--workers", "1"}), {},
      60s);
  EXPECT_FALSE(missing.status.success());
  EXPECT_NE(missing.err.find("bad.jsonl:2: the record has no \"summary\" field"), std::string::npos)
      << missing.out << missing.err;
  auto jsonl = run_program(command(dir.path(), {"--data-format", "jsonl"}));
  EXPECT_FALSE(jsonl.status.success());
  EXPECT_NE(jsonl.err.find("--data-format jsonl needs --prompt-template"), std::string::npos)
      << jsonl.err;
  auto both = run_program(command(dir.path(), {"--val-data", "x.jsonl"}));
  EXPECT_FALSE(both.status.success());
  EXPECT_NE(both.err.find("Give --val-data or --val-fraction, not both"), std::string::npos)
      << both.err;
  // A prompt longer than --seq-len: every record dropped, counted and named.
  auto short_seq = run_program(command(dir.path(), {"--seq-len", "16", "--workers", "1"}), {}, 60s);
  EXPECT_FALSE(short_seq.status.success());
  EXPECT_NE(short_seq.err.find("records were dropped: their prompt alone fills --seq-len 16"),
            std::string::npos)
      << short_seq.out << short_seq.err;
}

}  // namespace
