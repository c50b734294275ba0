// Seed 002's job through the real CLI: a tiny Llama (a Hugging Face folder: config.json and a
// Llama 2 tokenizer.json) fine-tuned on samsum-style records on two ranks as llama-recipes does,
// packed and padded, with eval perplexity per epoch; then generated from and exported. LoRA on a
// base that transformers saved: PEFT loads the adapter-only export onto it as the merged export.
#include <gtest/gtest.h>

#include <algorithm>

#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

#include "../hf_oracle.h"
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
  // Each epoch's better eval loss saved a checkpoint kept as the best; num_to_keep 1 then
  // removed the first.
  EXPECT_TRUE(fs::exists(dir.path() / "packed" / "checkpoint_000001" / "BEST.txt"));
  EXPECT_FALSE(fs::exists(dir.path() / "packed" / "checkpoint_000000"));
  EXPECT_EQ(result["checkpoint_dir_name"], "checkpoint_000001");
  // A resumed epoch that does worse (a learning rate that wrecks the model) must not replace
  // the best its earlier attempt kept: the best stays and survives retention.
  auto worse = run_program(command(dir.path(), {"--epochs", "3", "--name", "packed", "--lr", "10"}),
                           {}, 120s);
  ASSERT_TRUE(worse.status.success()) << worse.out << worse.err;
  EXPECT_TRUE(fs::exists(dir.path() / "packed" / "checkpoint_000001" / "BEST.txt"))
      << worse.out << worse.err;
  EXPECT_TRUE(fs::exists(dir.path() / "packed" / "checkpoint_000002"));
  EXPECT_FALSE(fs::exists(dir.path() / "packed" / "checkpoint_000002" / "BEST.txt"));
  auto removed = run_program({TRAINYARD_CLI_PATH, "export", "--checkpoint",
                              (dir.path() / "packed" / "checkpoint_000000").string(), "--out",
                              (dir.path() / "removed").string()});
  EXPECT_FALSE(removed.status.success());
  EXPECT_NE(removed.err.find("is not a complete checkpoint of"), std::string::npos) << removed.err;
  EXPECT_NE(removed.err.find("export one of its complete checkpoints: checkpoint_000001, "
                             "checkpoint_000002"),
            std::string::npos)
      << removed.err;

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
                        (dir.path() / "packed" / "checkpoint_000001").string(), "--out",
                        (dir.path() / "exported").string()},
                       {}, 60s);
  ASSERT_TRUE(e.status.success()) << e.err;
  EXPECT_EQ(nlohmann::json::parse(read_file(dir.path() / "exported" / "config.json"))["model_type"],
            "llama");
  EXPECT_TRUE(fs::exists(dir.path() / "exported" / "tokenizer.json"));
}

// command() without its --precision (and the value after it).
std::vector<std::string> without_precision(std::vector<std::string> args) {
  const auto it = std::find(args.begin(), args.end(), "--precision");
  if (it != args.end()) args.erase(it, it + 2);
  return args;
}

// --pure-bf16 (llama-recipes' --pure_bf16) on two ranks: learns, records its precision, resumes
// from its bf16 state; DDP and a second precision flag are refused before any rank starts.
TEST(LlamaRecipe, PureBf16LearnsOnTwoRanksAndIsRefusedWithDdp) {
  TempDir dir;
  write_fixture(dir.path());
  auto run = [&](const std::string& epochs, std::vector<std::string> more = {}) {
    more.insert(more.end(), {"--pure-bf16", "--epochs", epochs, "--name", "pure"});
    return run_program(without_precision(command(dir.path(), more)), {}, 120s);
  };
  auto first = run("1");
  ASSERT_TRUE(first.status.success()) << first.out << first.err;
  const auto losses = printed(first.out, R"(step \d+/\d+: loss ([0-9.]+))");
  ASSERT_GE(losses.size(), 10u) << first.out;
  EXPECT_LT(losses.back(), losses.front() * 0.8) << first.out;
  const auto result = nlohmann::json::parse(read_file(dir.path() / "pure" / "result.json"));
  EXPECT_EQ(result["config"]["precision"], "pure-bf16");
  auto second = run("2");
  ASSERT_TRUE(second.status.success()) << second.out << second.err;
  EXPECT_NE(second.err.find("checkpoint_000000"), std::string::npos) << "resumed from it";
  EXPECT_NE(second.out.find("Epoch 2:"), std::string::npos) << second.out;
  // Its checkpoint holds bf16 slices, which generation reads by ranges like fp32 ones.
  auto g = run_program({TRAINYARD_CLI_PATH, "generate", "--model", (dir.path() / "pure").string(),
                        "--prompt", "Summarize", "--max-new-tokens", "4"},
                       {}, 60s);
  ASSERT_TRUE(g.status.success()) << g.err;

  auto ddp = run("1", {"--strategy", "ddp"});
  EXPECT_FALSE(ddp.status.success());
  EXPECT_NE(ddp.err.find("--pure-bf16 needs an FSDP --strategy"), std::string::npos) << ddp.err;
  auto both = run_program(command(dir.path(), {"--pure-bf16"}));
  EXPECT_FALSE(both.status.success());
  EXPECT_NE(both.err.find("--precision excludes --pure-bf16"), std::string::npos) << both.err;
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
  // A LoRA flag without --peft lora would run a full fine-tune.
  const std::pair<std::string, std::string> lora_flags[] = {{"--lora-r", "8"},
                                                            {"--lora-alpha", "16"},
                                                            {"--lora-dropout", "0.1"},
                                                            {"--lora-targets", "q_proj"}};
  for (const auto& [flag, value] : lora_flags) {
    auto lora = run_program(command(dir.path(), {flag, value}));
    EXPECT_FALSE(lora.status.success()) << flag;
    EXPECT_NE(lora.err.find(flag + " applies to LoRA adapters, but --peft lora is not"),
              std::string::npos)
        << lora.err;
  }
  // A prompt longer than --seq-len: every record dropped, counted and named.
  auto short_seq = run_program(command(dir.path(), {"--seq-len", "16", "--workers", "1"}), {}, 60s);
  EXPECT_FALSE(short_seq.status.success());
  EXPECT_NE(short_seq.err.find("records were dropped: their prompt alone fills --seq-len 16"),
            std::string::npos)
      << short_seq.out << short_seq.err;
}

}  // namespace

namespace {

// --peft lora on two ranks, bf16-mixed: the checkpoint holds the adapters only, a second start
// resumes from it, generation and both exports work from the run.
TEST(LlamaRecipe, LoraTrainsAdaptersOnlyAndExportsThemMergedOrAsPeft) {
  TempDir dir;
  write_fixture(dir.path());
  auto run = [&](const std::string& epochs) {
    return run_program(
        command(dir.path(), {"--peft", "lora", "--lora-r", "8", "--lora-targets", "q_proj,v_proj",
                             "--precision", "bf16-mixed", "--epochs", epochs, "--name", "lora"}),
        {}, 120s);
  };
  auto first = run("1");
  ASSERT_TRUE(first.status.success()) << first.out << first.err;
  const auto ckpt = dir.path() / "lora" / "checkpoint_000000";
  const auto meta = nlohmann::json::parse(read_file(ckpt / "fsdp.json"));
  ASSERT_EQ(meta["parameters"].size(), 2u * 2u * 2u) << "2 layers x q,v x A,B";
  for (const auto& [name, p] : meta["parameters"].items())
    EXPECT_NE(name.find(".lora_"), std::string::npos) << name << ": the base is not saved";
  auto second = run("2");
  ASSERT_TRUE(second.status.success()) << second.out << second.err;
  EXPECT_NE(second.err.find("checkpoint_000000"), std::string::npos) << "resumed from it";
  EXPECT_NE(second.out.find("Epoch 2:"), std::string::npos) << second.out;

  auto g = run_program({TRAINYARD_CLI_PATH, "generate", "--model", (dir.path() / "lora").string(),
                        "--prompt", "Summarize", "--max-new-tokens", "4"},
                       {}, 60s);
  ASSERT_TRUE(g.status.success()) << g.err;
  const auto newest = dir.path() / "lora" / "checkpoint_000001";
  for (const bool adapter_only : {false, true}) {
    const auto out = dir.path() / (adapter_only ? "adapter" : "merged");
    std::vector<std::string> args = {TRAINYARD_CLI_PATH, "export", "--checkpoint",
                                     newest.string(),    "--out",  out.string()};
    if (adapter_only) args.push_back("--adapter-only");
    auto e = run_program(args, {}, 60s);
    ASSERT_TRUE(e.status.success()) << e.err;
  }
  const auto adapter = nlohmann::json::parse(read_file(dir.path() / "adapter/adapter_config.json"));
  EXPECT_EQ(adapter["peft_type"], "LORA");
  EXPECT_EQ(adapter["r"], 8);
  const auto weights = read_file(dir.path() / "adapter/adapter_model.safetensors");
  EXPECT_NE(weights.find("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"),
            std::string::npos);
  const auto merged = read_file(dir.path() / "merged/model.safetensors");
  EXPECT_EQ(merged.find("lora_"), std::string::npos) << "merged: a plain Llama";
  EXPECT_NE(merged.find("model.layers.1.self_attn.q_proj.weight"), std::string::npos);
}

// Note [A LoRA checkpoint's base]: the checkpoint records the base it adapts, and the run's
// readers and its resume refuse a base whose weights changed or went missing, naming the file,
// where they would merge the adapters onto other (or random) weights.
TEST(LlamaRecipe, LoraCheckpointsRefuseABaseThatChangedOrIsGone) {
  TY_REQUIRE_HF_ORACLE("transformers");
  TempDir dir;
  const auto base = dir.path() / "base";
  trainyard::test::transformers_save({{base, "llama"}});
  auto train = [&](const std::string& steps) {
    return run_program(
        trainyard::test::train_on_bytes_command(
            base, dir.path(), "lora", {"--lr", "1e-2", "--max-steps", steps, "--peft", "lora"}),
        {}, 90s);
  };
  auto first = train("2");
  ASSERT_TRUE(first.status.success()) << first.out << first.err;
  const auto checkpoint = dir.path() / "lora" / "checkpoint_000000";
  const auto recorded = nlohmann::json::parse(read_file(checkpoint / "lora_base.json"));
  EXPECT_EQ(recorded["model"], base.string());
  fs::path weights;  // the first shard of the saved folder
  for (const auto& [name, file] : recorded["files"].items())
    if (weights.empty() && name.find(".safetensors") != std::string::npos &&
        name.find(".index.json") == std::string::npos)
      weights = base / name;
  ASSERT_FALSE(weights.empty()) << recorded.dump();
  auto export_to = [&](const std::string& out) {
    return run_program({TRAINYARD_CLI_PATH, "export", "--checkpoint", checkpoint.string(), "--out",
                        (dir.path() / out).string()},
                       {}, 60s);
  };
  auto refused = [&](const trainyard::mptest::RunOutput& r, const std::string& why) {
    EXPECT_FALSE(r.status.success()) << r.out;
    EXPECT_NE(r.err.find(why), std::string::npos) << r.err;
  };

  // Other weights of the same shapes: the last float of the shard's data changed.
  const auto original = read_file(weights);
  std::string changed = original;
  changed[changed.size() - 2] = static_cast<char>(changed[changed.size() - 2] ^ 0x40);
  std::ofstream(weights, std::ios::binary | std::ios::trunc) << changed;
  const std::string why = weights.filename().string() + " changed";
  refused(export_to("merged"), why);
  refused(run_program({TRAINYARD_CLI_PATH, "generate", "--model", (dir.path() / "lora").string(),
                       "--prompt-ids", "65,66", "--max-new-tokens", "2", "--print-ids"},
                      {}, 60s),
          why);
  refused(train("4"), why);
  EXPECT_FALSE(fs::exists(dir.path() / "lora" / "checkpoint_000001")) << "the resume saved nothing";

  std::ofstream(weights, std::ios::binary | std::ios::trunc) << original;
  auto restored = export_to("merged");
  EXPECT_TRUE(restored.status.success()) << "the same base again: " << restored.err;

  // Resumed as a full fine-tune: the flags are the reason it cannot load, and the error says so
  // (Note [A run resumed as it was not set up]).
  refused(run_program(trainyard::test::train_on_bytes_command(base, dir.path(), "lora",
                                                              {"--lr", "1e-2", "--max-steps", "4"}),
                      {}, 90s),
          "was saved by a run set up otherwise (training: LoRA (r 16, alpha 32, targets "
          "q_proj,v_proj) there, full fine-tune here)");
  EXPECT_EQ(nlohmann::json::parse(read_file(dir.path() / "lora" / "config.json"))["peft"]["type"],
            "lora")
      << "the failed resume left the run's config.json as it was (Note [config.json after the "
         "resume])";

  fs::remove(weights);
  // Gone: the reader names the file (the folder's index lists it), or the fingerprint does.
  refused(export_to("merged2"), weights.filename().string());
  fs::remove_all(base);
  refused(export_to("merged3"), "adapts the base model " + base.string());
}

// --peft lora on a base with weights (a tied Llama with llama3 rotary scaling that transformers'
// save_pretrained wrote, sharded: tests/hf_oracle.h), every linear layer adapted, alpha / r = 4:
// peft.PeftModel.from_pretrained loads the --adapter-only export onto that base, and its logits
// equal transformers' on the merged export to 1e-4 (fp32 both: PEFT adds (alpha / r) B A x to
// W x, the merged export holds W + (alpha / r) B A). The adapters moved the model away from its
// base, so the two are not the base's logits twice.
TEST(LlamaRecipe, LoraAdapterOnlyExportOnItsBaseInPeftGivesTheMergedExportsLogits) {
  TY_REQUIRE_HF_ORACLE("transformers, peft");
  TempDir dir;
  const auto base = dir.path() / "base";
  trainyard::test::transformers_save({{base, "llama"}});
  auto train = run_program(trainyard::test::train_on_bytes_command(
                               base, dir.path(), "lora",
                               {"--lr", "1e-2", "--max-steps", "4", "--peft", "lora", "--lora-r",
                                "4", "--lora-alpha", "16", "--lora-targets", "all-linear"}),
                           {}, 90s);
  ASSERT_TRUE(train.status.success()) << train.out << train.err;
  const auto result = nlohmann::json::parse(read_file(dir.path() / "lora" / "result.json"));
  const auto checkpoint = dir.path() / "lora" / result["checkpoint_dir_name"].get<std::string>();
  for (const char* kind : {"merged", "adapter"}) {
    std::vector<std::string> args = {TRAINYARD_CLI_PATH,  "export", "--checkpoint",
                                     checkpoint.string(), "--out",  (dir.path() / kind).string()};
    if (std::string(kind) == "adapter") args.push_back("--adapter-only");
    auto e = run_program(args, {}, 60s);
    ASSERT_TRUE(e.status.success()) << kind << ": " << e.err;
  }
  const auto adapter = nlohmann::json::parse(read_file(dir.path() / "adapter/adapter_config.json"));
  EXPECT_EQ(adapter["base_model_name_or_path"], base.string());
  EXPECT_EQ(adapter["lora_alpha"].get<double>(), 16);

  auto gen = at::make_generator<at::CPUGeneratorImpl>(29);
  const auto ids =
      torch::randint(0, 256, {2, 13}, gen, torch::TensorOptions().dtype(torch::kInt64));
  const auto peft = trainyard::test::peft_logits(base, dir.path() / "adapter", ids);
  const auto hf = trainyard::test::transformers_logits({{dir.path() / "merged", ids}, {base, ids}});
  EXPECT_LT((peft - hf[0]).abs().max().item<double>(), 1e-4) << "PEFT on the base vs merged";
  EXPECT_GT((hf[0] - hf[1]).abs().max().item<double>(), 1e-2) << "the adapters changed the model";
}

}  // namespace
