// What reads a causal-lm run outside training (`trainyard generate`, `trainyard export`:
// train::load_causal_lm, train::export_checkpoint) on small generated runs: the tiny GPT-NeoX
// saved as sharded FSDP checkpoints at world size 1, with a config.json as the recipe writes it.
// Such a reader verifies every file as a resume does.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>

#include "../hf_oracle.h"
#include "../log_capture.h"
#include "../temp_dir.h"
#include "thread_ranks.h"
#include "tiny_gpt_neox.h"
#include "trainyard/checkpoint/checkpointer.h"
#include "trainyard/error.h"
#include "trainyard/fsdp/fully_sharded_data_parallel.h"
#include "trainyard/fsdp/state_dict.h"
#include "trainyard/models/hf_weights.h"
#include "trainyard/train/causal_lm.h"

namespace trainyard::train {
namespace {

namespace fs = std::filesystem;
using trainyard::test::TempDir;

// A causal-lm run folder (TempDir/run) over a Hugging Face folder holding the tiny model's
// config.json (TempDir/model).
struct TinyRun {
  TempDir dir{"ty-causal-lm-reader"};
  fs::path model = dir.path() / "model";
  fs::path run = dir.path() / "run";

  TinyRun() {
    fs::create_directories(model);
    fs::create_directories(run);
    std::ofstream(model / "config.json") << testing::tiny_gpt_neox_config().to_json();
    std::ofstream(run / "config.json") << nlohmann::json{
        {"recipe", "causal-lm"},
        {"model", model.string()},
        {"tokenizer", "bytes"}}.dump();
  }

  // Saves the tiny model initialised from `seed` as the run's next sharded checkpoint.
  void save(std::uint64_t seed, std::int64_t step) {
    auto store = c10::make_intrusive<c10d::HashStore>();
    testing::run_thread_ranks(1, [&](int, auto pg) {
      models::GptNeoX model(testing::tiny_gpt_neox_config(), models::GptNeoXInit{.seed = seed});
      fsdp::FullyShardedDataParallel fsdp(
          model, fsdp::make_fsdp_groups(Strategy::kFullShard, pg, store, 1),
          fsdp::FsdpOptions{.wrap = fsdp::wrap_modules_of_type<models::GptNeoXLayerImpl>()});
      checkpoint::Checkpointer checkpointer(run.string(), {.job_instance = "test-job"});
      fsdp::save_checkpoint(fsdp, nullptr, checkpointer, *store, step);
    });
  }

  // Overwrites the last floats of checkpoint `name`'s shard with NaNs, keeping its size: what a
  // disk or copy fault leaves, which only the SHA-256 can tell.
  void write_nans_into_shard(const std::string& name) {
    const auto shard = run / name / "shard_00000_of_00001.safetensors";
    ASSERT_TRUE(fs::exists(shard)) << shard;
    const auto size = fs::file_size(shard);
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    f.seekp(static_cast<std::streamoff>(size - 4 * sizeof(float)));
    for (int i = 0; i < 4; ++i) f.write(reinterpret_cast<const char*>(&nan), sizeof nan);
    ASSERT_TRUE(f.good());
    ASSERT_EQ(fs::file_size(shard), size);
  }
};

bool has_nan(models::CausalLm& model) {
  for (const auto& p : model->parameters())
    if (torch::isnan(p).any().item<bool>()) return true;
  return false;
}

std::string message_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const CheckpointCorruptError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a CheckpointCorruptError";
  return "";
}

TEST(CausalLmReader, GenerateSkipsACheckpointWhoseShardFailsItsSha256) {
  TinyRun r;
  r.save(/*seed=*/1, /*step=*/10);
  r.save(/*seed=*/2, /*step=*/20);
  r.write_nans_into_shard("checkpoint_000001");

  trainyard::test::LogCapture log("train");
  auto lm = load_causal_lm(r.run.string());
  EXPECT_NE(log.text().find("Skipping checkpoint_000001 and trying the one before it: "),
            std::string::npos)
      << log.text();
  EXPECT_NE(log.text().find("shard_00000_of_00001.safetensors does not match its SHA-256"),
            std::string::npos)
      << log.text();
  EXPECT_NE(lm.description.find("checkpoint_000000 (step 10)"), std::string::npos)
      << lm.description;
  EXPECT_FALSE(has_nan(lm.model));
  models::GptNeoX expected(testing::tiny_gpt_neox_config(), models::GptNeoXInit{.seed = 1});
  for (const auto& p : expected->named_parameters())
    EXPECT_TRUE(torch::equal(p.value(), lm.model->named_parameters()[p.key()])) << p.key();
}

TEST(CausalLmReader, GenerateRefusesARunWhoseOnlyCheckpointFailsItsSha256) {
  TinyRun r;
  r.save(/*seed=*/1, /*step=*/10);
  r.write_nans_into_shard("checkpoint_000000");

  const auto message = message_of([&] { load_causal_lm(r.run.string()); });
  EXPECT_NE(message.find("No checkpoint of " + r.run.string() + " loads: "), std::string::npos)
      << message;
  EXPECT_NE(message.find("checkpoint_000000/shard_00000_of_00001.safetensors does not match its "
                         "SHA-256 in the manifest."),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("HINT: "), std::string::npos) << message;
}

TEST(CausalLmReader, ExportRefusesACheckpointWhoseShardFailsItsSha256) {
  TinyRun r;
  r.save(/*seed=*/1, /*step=*/10);
  r.save(/*seed=*/2, /*step=*/20);
  r.write_nans_into_shard("checkpoint_000001");
  const auto out = r.dir.path() / "hf";

  const auto message =
      message_of([&] { export_checkpoint((r.run / "checkpoint_000001").string(), out.string()); });
  EXPECT_NE(message.find("Cannot export " + (r.run / "checkpoint_000001").string() + ": "),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("shard_00000_of_00001.safetensors does not match its SHA-256"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("HINT: export another of the run's checkpoints (checkpoint_000000)."),
            std::string::npos)
      << message;
  EXPECT_FALSE(fs::exists(out / "model.safetensors")) << "nothing exported";

  // The intact one before it exports.
  EXPECT_NE(export_checkpoint((r.run / "checkpoint_000000").string(), out.string())
                .find("checkpoint_000000 (step 10)"),
            std::string::npos);
  EXPECT_TRUE(fs::exists(out / "model.safetensors"));
}

std::string invalid_message_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const InvalidArgumentError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an InvalidArgumentError";
  return "";
}

// A Hugging Face folder whose config.json holds only the model type: Hugging Face's defaults
// would build a 20B model. The missing fields are named instead.
TEST(CausalLmReader, AConfigWithoutTheModelsSizeIsRefusedNamingTheFields) {
  TempDir dir;
  std::ofstream(dir.path() / "config.json") << R"({"model_type": "gpt_neox"})";
  const auto message = invalid_message_of([&] { load_causal_lm(dir.str()); });
  EXPECT_NE(message.find((dir.path() / "config.json").string() +
                         ": config.json lacks \"vocab_size\", \"hidden_size\", "
                         "\"num_hidden_layers\", \"num_attention_heads\", "
                         "\"intermediate_size\", \"max_position_embeddings\""),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("HINT: "), std::string::npos) << message;
}

// A model far larger than any machine's memory is refused before anything is allocated (See
// Note [A reader checks the model's size]): 1000 layers of width 65536 hold about 5e13
// parameters, 200 TB in fp32.
TEST(CausalLmReader, AModelLargerThanTheMemoryIsRefusedBeforeAllocating) {
  TempDir dir;
  auto config = testing::tiny_gpt_neox_config();
  config.hidden_size = 65536;
  config.num_attention_heads = 512;
  config.intermediate_size = 4 * 65536;
  config.num_hidden_layers = 1000;
  models::export_hf(
      {{"embed_out.weight", {2, 2}}},
      [](const std::string&, float* dst) { std::fill_n(dst, 4, 0.0f); }, config.to_json(),
      dir.str());
  const auto message = invalid_message_of([&] { load_causal_lm(dir.str()); });
  EXPECT_NE(message.find((dir.path() / "config.json").string() + " describes a GPT-NeoX of "),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("GB in fp32, but this process may take only "), std::string::npos)
      << message;
  EXPECT_NE(message.find("hidden_size 65536, num_hidden_layers 1000"), std::string::npos)
      << message;
}

// Weights with tensors the model lacks (a config.json with fewer layers than the weights) or
// without ones it needs are refused naming them; an old checkpoint's rotary_emb.inv_freq buffer
// is ignored by name.
TEST(CausalLmReader, HuggingFaceWeightsMustMatchTheModelTensorForTensor) {
  const auto config = testing::tiny_gpt_neox_config();  // 3 layers
  models::GptNeoX model(config, models::GptNeoXInit{.seed = 5});
  models::TensorShapes tensors;
  for (const auto& p : model->named_parameters())
    tensors.emplace_back(p.key(), p.value().sizes().vec());
  tensors.emplace_back("gpt_neox.layers.0.attention.rotary_emb.inv_freq",
                       std::vector<std::int64_t>{2});
  auto fill = [&](const std::string& name, float* dst) {
    if (name.ends_with("inv_freq")) {
      std::fill_n(dst, 2, 1.0f);
      return;
    }
    auto values = model->named_parameters()[name].contiguous();
    std::copy_n(values.data_ptr<float>(), values.numel(), dst);
  };
  TempDir dir;
  models::export_hf(tensors, fill, config.to_json(), dir.str());
  auto lm = load_causal_lm(dir.str());  // inv_freq ignored
  EXPECT_TRUE(torch::equal(lm.model->named_parameters()["embed_out.weight"],
                           model->named_parameters()["embed_out.weight"]));

  auto fewer = config;
  fewer.num_hidden_layers = 2;
  std::ofstream(dir.path() / "config.json") << fewer.to_json();
  auto message = message_of([&] { load_causal_lm(dir.str()); });
  EXPECT_NE(message.find(dir.str() + "'s weights do not match the model its config.json "
                                     "describes. It holds 12 tensors the model does not have: "
                                     "\"gpt_neox.layers.2."),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("and 4 more."), std::string::npos) << message;
  EXPECT_EQ(message.find("inv_freq"), std::string::npos) << message;
  EXPECT_NE(message.find("HINT: "), std::string::npos) << message;

  auto more = config;
  more.num_hidden_layers = 4;
  std::ofstream(dir.path() / "config.json") << more.to_json();
  message = message_of([&] { load_causal_lm(dir.str()); });
  EXPECT_NE(message.find("It lacks 12 tensors the model needs: \"gpt_neox.layers.3."),
            std::string::npos)
      << message;
}

// A tied Llama whose weights also hold "lm_head.weight" (some exporters write it) reads as
// transformers reads it (Note [A tied model's written output projection]): equal to the
// embedding, the extra tensor is unused; different, the model is untied and uses it. Its logits
// are transformers' either way.
TEST(CausalLmReader, ATiedModelsWrittenOutputProjectionReadsAsTransformersReadsIt) {
  TY_REQUIRE_HF_ORACLE("transformers");
  const models::LlamaConfig tied{.vocab_size = 64,
                                 .hidden_size = 16,
                                 .intermediate_size = 32,
                                 .num_hidden_layers = 1,
                                 .num_attention_heads = 2,
                                 .num_key_value_heads = 2,
                                 .max_position_embeddings = 32,
                                 .tie_word_embeddings = true};
  auto model = models::make_causal_lm(tied, {.seed = 5});
  const auto embedding = model->named_parameters()["model.embed_tokens.weight"].contiguous();
  models::TensorShapes tensors;
  for (const auto& p : model->named_parameters())
    tensors.emplace_back(p.key(), p.value().sizes().vec());
  ASSERT_FALSE(model->named_parameters().contains("lm_head.weight"));
  tensors.emplace_back("lm_head.weight", std::vector<std::int64_t>{64, 16});
  TempDir dir;
  const auto ids = torch::arange(10).view({1, 10});
  std::vector<test::OracleInput> folders;
  for (const bool equal : {true, false}) {
    auto fill = [&](const std::string& name, float* dst) {
      const auto values = name == "lm_head.weight" && !equal ? torch::full({64, 16}, 0.25)
                          : name == "lm_head.weight"         ? embedding
                                                     : model->named_parameters()[name].contiguous();
      std::copy_n(values.data_ptr<float>(), values.numel(), dst);
    };
    const auto folder = dir.path() / (equal ? "equal" : "different");
    models::export_hf(tensors, fill, models::CausalLmConfig(tied).to_json(), folder.string());
    folders.push_back({folder, ids});
  }
  const auto theirs = test::transformers_logits(folders);
  torch::NoGradGuard no_grad;
  for (std::size_t i = 0; i < folders.size(); ++i) {
    auto lm = load_causal_lm(folders[i].folder.string());
    EXPECT_EQ(lm.model->named_parameters().contains("lm_head.weight"), i == 1);
    EXPECT_LT((lm.model->forward(ids) - theirs[i]).abs().max().item<double>(), 1e-4)
        << folders[i].folder;
  }
  // The untied model's output projection is the written one.
  auto untied = load_causal_lm(folders[1].folder.string());
  EXPECT_TRUE(torch::equal(untied.model->named_parameters()["lm_head.weight"],
                           torch::full({64, 16}, 0.25f)));
}

// A run whose config.json names a model with fewer layers than its checkpoint: generate and
// export refuse it naming the parameter, never a silent subset.
TEST(CausalLmReader, ACheckpointWithParametersTheModelLacksIsRefused) {
  TinyRun r;
  r.save(/*seed=*/1, /*step=*/10);
  auto fewer = testing::tiny_gpt_neox_config();
  fewer.num_hidden_layers = 2;
  std::ofstream(r.model / "config.json") << fewer.to_json();
  const std::string expected = "holds parameter \"gpt_neox.layers.2.";
  auto message = message_of([&] { load_causal_lm(r.run.string()); });
  EXPECT_NE(message.find(expected), std::string::npos) << message;
  message = message_of([&] {
    export_checkpoint((r.run / "checkpoint_000000").string(), (r.dir.path() / "hf").string());
  });
  EXPECT_NE(message.find(expected), std::string::npos) << message;
  EXPECT_NE(message.find("which the model of the run's config.json has not"), std::string::npos)
      << message;
}

// export --out refuses, writing nothing, a file, a folder holding files and a run's folder
// (whose config.json it overwrote), unless overwrite (--force).
TEST(CausalLmReader, ExportRefusesAFileANonEmptyFolderAndARunFolderUnlessForced) {
  TinyRun r;
  r.save(/*seed=*/1, /*step=*/10);
  const auto checkpoint = (r.run / "checkpoint_000000").string();
  const auto file = r.dir.path() / "model.bin";
  std::ofstream(file) << "x";
  auto message = invalid_message_of([&] { export_checkpoint(checkpoint, file.string()); });
  EXPECT_NE(message.find("The export folder " + file.string() +
                         " is an existing file, not a folder. HINT: name a new folder"),
            std::string::npos)
      << message;

  // No name, and a folder nobody writes into (root neither): a message, not "filesystem error".
  message = invalid_message_of([&] { export_checkpoint(checkpoint, ""); });
  EXPECT_NE(message.find("--out is empty"), std::string::npos) << message;
  message =
      invalid_message_of([&] { export_checkpoint(checkpoint, "/proc", {.overwrite = true}); });
  EXPECT_NE(message.find("Cannot write into the export folder /proc: "), std::string::npos)
      << message;
  message = invalid_message_of([&] { export_checkpoint(checkpoint, "/proc/trainyard/x"); });
  EXPECT_NE(message.find("Cannot make the export folder /proc/trainyard/x: "), std::string::npos)
      << message;

  const auto full = r.dir.path() / "full";
  fs::create_directories(full);
  std::ofstream(full / "notes.txt") << "mine";
  message = invalid_message_of([&] { export_checkpoint(checkpoint, full.string()); });
  EXPECT_NE(message.find("The export folder " + full.string() +
                         " is not empty (it holds notes.txt): the export would write over its "
                         "files. HINT: name a new or empty folder, or pass --force"),
            std::string::npos)
      << message;
  EXPECT_FALSE(fs::exists(full / "config.json"));
  export_checkpoint(checkpoint, full.string(), {.overwrite = true});
  EXPECT_TRUE(fs::exists(full / "model.safetensors"));

  const auto run_config = r.run / "config.json";
  std::ifstream before_in(run_config);
  const std::string before((std::istreambuf_iterator<char>(before_in)),
                           std::istreambuf_iterator<char>());
  message = invalid_message_of([&] { export_checkpoint(checkpoint, r.run.string()); });
  EXPECT_NE(message.find("The export folder " + r.run.string() +
                         " is a training run's folder (its config.json names a recipe, or it "
                         "holds checkpoints): the export would replace the run's config.json."),
            std::string::npos)
      << message;
  std::ifstream after_in(run_config);
  EXPECT_EQ(
      std::string((std::istreambuf_iterator<char>(after_in)), std::istreambuf_iterator<char>()),
      before)
      << "the run's config.json is untouched";
}

}  // namespace
}  // namespace trainyard::train
