// The causal-lm recipe end to end through the real CLI: two ranks with FULL_SHARD fine-tune a
// small GPT-NeoX on Debian's fortunes, then the run resumes from its sharded checkpoint at one
// rank; folders transformers saved train, and they and the runs' exports generate and compute
// what transformers does.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <regex>

#include "../hf_oracle.h"
#include "../multiproc/multiproc_util.h"
#include "trainyard/blas_core.h"
#include "trainyard/train/causal_lm.h"

namespace {
using trainyard::mptest::read_file;
using trainyard::mptest::run_program;
using trainyard::mptest::TempDir;
using namespace std::chrono_literals;

constexpr const char* kFortunes = "/usr/share/games/fortunes/fortunes";

std::vector<std::string> causal_lm_command(const TempDir& dir, std::vector<std::string> more) {
  std::vector<std::string> args = {TRAINYARD_CLI_PATH,
                                   "train",
                                   "causal-lm",
                                   "--model",
                                   "pythia-14m",
                                   "--data",
                                   kFortunes,
                                   "--seq-len",
                                   "64",
                                   "--batch-size",
                                   "8",
                                   "--lr",
                                   "1e-3",
                                   "--storage",
                                   dir.str(),
                                   "--no-progress"};
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

// The loss rank 0 printed for step `step` of epoch 0 ("epoch 0 step 1/57: loss ...").
double printed_loss(const std::string& out, int step) {
  std::smatch m;
  const std::regex line("epoch 0 step " + std::to_string(step) + "/\\d+: loss ([0-9.]+)");
  if (!std::regex_search(out, m, line)) return -1;
  return std::stod(m[1]);
}

TEST(CausalLm, TwoRanksWithFullShardLearnAndTheRunResumesAtOneRank) {
  if (!std::filesystem::exists(kFortunes))
    GTEST_SKIP() << kFortunes << " missing: scripts/setup.sh";
  TempDir dir;
  // bf16-mixed where the CPU computes bf16 fast (AVX-512), else fp32 (30x faster on AVX2 only).
  const std::string precision =
      trainyard::CpuVectorUnits::of_this_cpu().avx512 ? "bf16-mixed" : "fp32";
  auto first = run_program(causal_lm_command(dir, {"--workers", "2", "--strategy", "full_shard",
                                                   "--precision", precision, "--max-steps", "24"}),
                           {}, 100s);
  ASSERT_FALSE(first.timed_out) << first.out << first.err;
  ASSERT_TRUE(first.status.success()) << first.out << first.err;

  const double start_loss = printed_loss(first.out, 1);
  ASSERT_GT(start_loss, 0) << first.out;
  const auto result = nlohmann::json::parse(read_file(dir.path() / "causal-lm" / "result.json"));
  const double end_loss = result["train_loss"].get<double>();
  EXPECT_LT(end_loss, 0.6 * start_loss)
      << "the loss falls by a clear margin: " << start_loss << " -> " << end_loss;
  EXPECT_EQ(result["global_step"].get<int>(), 24);
  EXPECT_EQ(result["epoch"].get<int>(), 0);
  EXPECT_EQ(result["step"].get<int>(), 23);
  EXPECT_EQ(result["checkpoint_dir_name"].get<std::string>(), "checkpoint_000000");
  EXPECT_GT(result["tokens_per_s"].get<double>(), 0);
  EXPECT_GT(result["peak_rss_mib_rank1"].get<double>(), 0);
  EXPECT_EQ(result["config"]["strategy"].get<std::string>(), "full_shard");
  for (const char* row : {"Training result", "checkpoint_dir_name", "time_this_iter_s",
                          "training_iteration", "epoch", "step", "train_loss"})
    EXPECT_NE(first.out.find(row), std::string::npos) << row << "\n" << first.out;

  // Generation from the run's checkpoint differs from the same model before training (the preset
  // initialised with the recipe's seed), and is reproducible.
  auto generate = [&](const std::string& model) {
    auto r = run_program({TRAINYARD_CLI_PATH, "generate", "--model", model, "--prompt",
                          "Q:", "--greedy", "--max-new-tokens", "24", "--print-ids"},
                         {}, 60s);
    EXPECT_TRUE(r.status.success()) << r.out << r.err;
    return r.out;
  };
  const auto run_uri = (dir.path() / "causal-lm").string();
  const auto before = generate("pythia-14m");
  const auto after = generate(run_uri);
  EXPECT_EQ(std::count(after.begin(), after.end(), ','), 23) << after;
  EXPECT_NE(after, before) << "fine-tuning changed what the model generates";
  EXPECT_EQ(generate(run_uri), after);
  auto text = run_program({TRAINYARD_CLI_PATH, "generate", "--model", run_uri, "--prompt",
                           "Q:", "--max-new-tokens", "24", "--seed", "3"},
                          {}, 60s);
  EXPECT_TRUE(text.status.success()) << text.err;
  EXPECT_EQ(text.out.rfind("Q:", 0), 0u) << "the prompt, then its continuation: " << text.out;

  // Export writes a Hugging Face folder; generating from it gives the run's tokens exactly.
  auto exported = run_program({TRAINYARD_CLI_PATH, "export", "--checkpoint",
                               run_uri + "/checkpoint_000000", "--out", dir.str() + "/hf"},
                              {}, 60s);
  ASSERT_TRUE(exported.status.success()) << exported.out << exported.err;
  for (const char* file : {"config.json", "model.safetensors"})
    EXPECT_TRUE(std::filesystem::exists(dir.path() / "hf" / file)) << file;
  EXPECT_EQ(generate(dir.str() + "/hf"), after);

  // The same run at one rank and another strategy: it resumes from the 2-rank sharded checkpoint
  // where it stopped, and says what changed (Note [A run resumed as it was not set up]).
  auto second = run_program(causal_lm_command(dir, {"--workers", "1", "--strategy", "shard_grad_op",
                                                    "--precision", precision, "--max-steps", "30"}),
                            {}, 100s);
  ASSERT_FALSE(second.timed_out) << second.out << second.err;
  ASSERT_TRUE(second.status.success()) << second.out << second.err;
  EXPECT_NE(second.out.find("Resuming from checkpoint_000000 at step 24 (epoch 0, 384 samples "
                            "into it)"),
            std::string::npos)
      << second.out;
  EXPECT_NE(second.err.find("taken at world size 2; continuing at world size 1"), std::string::npos)
      << second.err;
  EXPECT_NE(second.err.find("checkpoint_000000 was saved by a run set up otherwise: strategy: "
                            "full_shard there, shard_grad_op here."),
            std::string::npos)
      << second.err;
  const double resumed_loss = printed_loss(second.out, 49);  // 384 / 8: step 49 of the epoch
  EXPECT_GT(resumed_loss, 0) << second.out;
  EXPECT_LT(resumed_loss, 0.75 * start_loss) << "the trained weights were loaded";
  const auto again = nlohmann::json::parse(read_file(dir.path() / "causal-lm" / "result.json"));
  EXPECT_EQ(again["global_step"].get<int>(), 30);
  EXPECT_EQ(again["checkpoint_dir_name"].get<std::string>(), "checkpoint_000001");
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "causal-lm" / "checkpoint_000000"))
      << "--num-to-keep defaults to 1, as the seed keeps";

  // Once more with the same --max-steps: nothing is left, and the run says so instead of
  // reporting a throughput and loss it never measured.
  auto third = run_program(
      causal_lm_command(dir, {"--workers", "1", "--precision", precision, "--max-steps", "30"}), {},
      100s);
  ASSERT_TRUE(third.status.success()) << third.out << third.err;
  EXPECT_NE((third.out + third.err).find("Nothing left to train: checkpoint_000001 is at step 30"),
            std::string::npos)
      << third.out << third.err;
  EXPECT_EQ(third.out.find("nan"), std::string::npos) << third.out;
  EXPECT_EQ(third.out.find("tokens/s"), std::string::npos) << third.out;
  const auto done = nlohmann::json::parse(read_file(dir.path() / "causal-lm" / "result.json"));
  EXPECT_EQ(done["global_step"].get<int>(), 30);
  EXPECT_FALSE(done.contains("train_loss")) << done.dump();
}

// With a tokenizer.json the corpus is tokenised by it (and cached under its hash), the run
// records it, and generation decodes with it.
TEST(CausalLm, ATokenizerJsonTokenisesTheCorpusAndDecodesGeneration) {
  TempDir dir;
  const std::string tokenizer =
      std::string(TRAINYARD_SOURCE_DIR) + "/tests/data/hf/tiny_bpe_tokenizer.json";
  auto r = run_program(causal_lm_command(dir, {"--workers", "1", "--tokenizer", tokenizer,
                                               "--max-steps", "2", "--seq-len", "32"}),
                       {}, 60s);
  ASSERT_TRUE(r.status.success()) << r.out << r.err;
  const auto config = nlohmann::json::parse(read_file(dir.path() / "causal-lm" / "config.json"));
  EXPECT_EQ(config["tokenizer"].get<std::string>(), tokenizer);
  EXPECT_LT(config["tokens"].get<std::int64_t>(), 23600) << "fewer tokens than the corpus's bytes";
  auto g = run_program({TRAINYARD_CLI_PATH, "generate", "--model", dir.str() + "/causal-lm",
                        "--prompt", "Q: What", "--max-new-tokens", "8", "--seed", "1"},
                       {}, 60s);
  ASSERT_TRUE(g.status.success()) << g.err;
  EXPECT_EQ(g.out.rfind("Q: What", 0), 0u) << g.out;
}

// A folder transformers' save_pretrained wrote, sharded (tests/hf_oracle.h: 256 tokens, so bytes
// train it), of each architecture: the recipe trains three steps from its weights; `trainyard
// generate --greedy --print-ids` from the folder and from the run's export gives transformers'
// greedy ids; and transformers loads the export and computes trainyard's logits to 1e-4 (both
// fp32 from the same weights).
class CausalLmTransformers : public testing::TestWithParam<const char*> {};

TEST_P(CausalLmTransformers, SavedShardedFolderTrainsAndItAndItsExportGenerateAsTransformers) {
  TY_REQUIRE_HF_ORACLE("transformers");
  TempDir dir;
  const auto saved = dir.path() / "saved", exported = dir.path() / "exported";
  trainyard::test::transformers_save({{saved, GetParam()}});
  auto train = run_program(trainyard::test::train_on_bytes_command(
                               saved, dir.path(), "run", {"--lr", "1e-3", "--max-steps", "3"}),
                           {}, 90s);
  ASSERT_TRUE(train.status.success()) << train.out << train.err;
  EXPECT_NE((train.out + train.err).find("Initial weights: " + saved.string()), std::string::npos)
      << "it trains from the folder's weights: " << train.err;
  const auto result = nlohmann::json::parse(read_file(dir.path() / "run" / "result.json"));
  EXPECT_EQ(result["global_step"].get<int>(), 3);
  const auto checkpoint = dir.path() / "run" / result["checkpoint_dir_name"].get<std::string>();
  auto e = run_program({TRAINYARD_CLI_PATH, "export", "--checkpoint", checkpoint.string(), "--out",
                        exported.string()},
                       {}, 60s);
  ASSERT_TRUE(e.status.success()) << e.err;

  const std::string prompt = "65,110,110,97,32";  // "Anna "
  constexpr std::int64_t kNewTokens = 12;
  const auto theirs = trainyard::test::transformers_greedy(
      {saved, exported}, trainyard::test::ids_of(prompt), kNewTokens);
  for (std::size_t i = 0; i < 2; ++i) {
    const auto& folder = i == 0 ? saved : exported;
    auto g = run_program(
        {TRAINYARD_CLI_PATH, "generate", "--model", folder.string(), "--prompt-ids", prompt,
         "--greedy", "--max-new-tokens", std::to_string(kNewTokens), "--print-ids"},
        {}, 60s);
    ASSERT_TRUE(g.status.success()) << g.err;
    EXPECT_EQ(trainyard::test::ids_of(g.out), theirs[i]) << folder << ": " << g.out;
  }
  auto gen = at::make_generator<at::CPUGeneratorImpl>(23);
  const auto ids =
      torch::randint(0, 256, {2, 13}, gen, torch::TensorOptions().dtype(torch::kInt64));
  auto lm = trainyard::train::load_causal_lm(exported.string());
  lm.model->eval();
  torch::NoGradGuard no_grad;
  const auto ours = lm.model->forward(ids);
  const auto logits = trainyard::test::transformers_logits({{exported, ids}});
  EXPECT_LT((ours - logits[0]).abs().max().item<double>(), 1e-4)
      << read_file(exported / "config.json");
}

INSTANTIATE_TEST_SUITE_P(Architectures,
                         CausalLmTransformers,
                         testing::Values("gpt_neox", "llama", "mistral", "qwen2", "qwen3"),
                         [](const testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param);
                         });

// Working in ids (--prompt-ids, --print-ids), the model's whole vocabulary applies: on a
// 512-token folder without tokenizer.json (whose byte tokenizer knows 256 ids) greedy ids equal
// transformers', ids above 255 among them.
TEST(CausalLmGenerate, PrintIdsUsesTheModelsWholeVocabularyAsTransformers) {
  TY_REQUIRE_HF_ORACLE("transformers");
  TempDir dir;
  const auto folder = dir.path() / "wide_llama";
  trainyard::test::transformers_save({{folder, "wide_llama"}});
  const std::string prompt = "300,65,400,110,97";
  constexpr std::int64_t kNewTokens = 16;
  const auto theirs = trainyard::test::transformers_greedy(
      {folder}, trainyard::test::ids_of(prompt), kNewTokens)[0];
  ASSERT_TRUE(std::any_of(theirs.begin(), theirs.end(), [](auto id) { return id > 255; }))
      << "the test needs a continuation with ids a byte tokenizer lacks";
  auto g = run_program(
      {TRAINYARD_CLI_PATH, "generate", "--model", folder.string(), "--prompt-ids", prompt,
       "--greedy", "--max-new-tokens", std::to_string(kNewTokens), "--print-ids"},
      {}, 60s);
  ASSERT_TRUE(g.status.success()) << g.err;
  EXPECT_EQ(trainyard::test::ids_of(g.out), theirs) << g.out;
}

// Note [Non-finite training]: at --lr 1e3 (fp32) the loss grows for four steps and turns NaN at
// the fifth, after checkpoints at steps 2 and 4 (at 1e6 it is NaN at step 2, before any). The run
// fails naming the step, every checkpoint it kept holds finite weights (retention at
// --num-to-keep 1 would otherwise have deleted the last good one), and the newest exports.
TEST(CausalLm, ANonFiniteLossFailsTheRunAndNoCheckpointHoldsNonFiniteWeights) {
  if (!std::filesystem::exists(kFortunes))
    GTEST_SKIP() << kFortunes << " missing: scripts/setup.sh";
  TempDir dir;
  auto args = causal_lm_command(dir, {"--workers", "1", "--precision", "fp32", "--max-steps", "16",
                                      "--checkpoint-every", "2", "--num-to-keep", "1"});
  *(std::find(args.begin(), args.end(), "--lr") + 1) = "1e3";
  auto r = run_program(args, {}, 90s);
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_FALSE(r.status.success()) << "a run whose loss is not finite fails: " << r.out << r.err;
  const std::regex stopped(
      R"(the loss of step (\d+) \(epoch 0\) is (nan|inf|-nan)|step (\d+) \(epoch 0\) left NaN or Inf in the weights)");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.err, m, stopped)) << r.out << r.err;
  EXPECT_NE(r.err.find("HINT: lower --lr"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "causal-lm" / "result.json")) << "no result";
  std::vector<std::filesystem::path> kept;
  for (const auto& e : std::filesystem::directory_iterator(dir.path() / "causal-lm"))
    if (e.path().filename().string().rfind("checkpoint_", 0) == 0) kept.push_back(e.path());
  ASSERT_EQ(kept.size(), 1u) << "the last finite checkpoint is kept";

  auto exported = run_program(
      {TRAINYARD_CLI_PATH, "export", "--checkpoint", kept[0].string(), "--out", dir.str() + "/hf"},
      {}, 60s);
  ASSERT_TRUE(exported.status.success()) << exported.err;
  auto finite = run_program({TRAINYARD_PYTHON, "-c",
                             "import sys, torch\n"
                             "from safetensors.torch import load_file\n"
                             "w = load_file(sys.argv[1])\n"
                             "print(all(bool(torch.isfinite(t).all()) for t in w.values()))",
                             dir.str() + "/hf/model.safetensors"},
                            {}, 60s);
  ASSERT_TRUE(finite.status.success()) << finite.err;
  EXPECT_EQ(finite.out, "True\n") << kept[0] << " holds NaN or Inf";
}

TEST(CausalLm, BadFlagsAreRefusedBeforeAnyRankStarts) {
  TempDir dir;
  auto no_data = run_program({TRAINYARD_CLI_PATH, "train", "causal-lm", "--storage", dir.str()});
  EXPECT_FALSE(no_data.status.success());
  EXPECT_NE(no_data.err.find("--data is required"), std::string::npos) << no_data.err;

  auto bad = run_program(causal_lm_command(dir, {"--strategy", "zero4"}));
  EXPECT_FALSE(bad.status.success());
  EXPECT_NE(bad.err.find("--strategy must be one of full_shard"), std::string::npos) << bad.err;

  auto ddp_ac =
      run_program(causal_lm_command(dir, {"--strategy", "ddp", "--activation-checkpointing"}));
  EXPECT_FALSE(ddp_ac.status.success());
  EXPECT_NE(ddp_ac.err.find("--activation-checkpointing needs an FSDP --strategy"),
            std::string::npos)
      << ddp_ac.err;

  auto no_model = run_program(causal_lm_command(dir, {"--model", "/nonexistent/model"}));
  EXPECT_FALSE(no_model.status.success());
  EXPECT_NE(no_model.err.find("--model /nonexistent/model is neither a folder"), std::string::npos)
      << no_model.err;
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "causal-lm")) << "no rank started";
}

}  // namespace
