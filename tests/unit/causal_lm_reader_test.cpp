// What reads a causal-lm run outside training (`trainyard generate`, `trainyard export`:
// train::load_causal_lm, train::export_checkpoint) on small generated runs: the tiny GPT-NeoX
// saved as sharded FSDP checkpoints at world size 1, with a config.json as the recipe writes it.
// Such a reader verifies every file as a resume does.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>

#include "../log_capture.h"
#include "../temp_dir.h"
#include "thread_ranks.h"
#include "tiny_gpt_neox.h"
#include "trainyard/checkpoint/checkpointer.h"
#include "trainyard/error.h"
#include "trainyard/fsdp/fully_sharded_data_parallel.h"
#include "trainyard/fsdp/state_dict.h"
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
          model, fsdp::make_fsdp_groups(fsdp::ShardingStrategy::kFullShard, pg, store, 1),
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

bool has_nan(models::GptNeoX& model) {
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

}  // namespace
}  // namespace trainyard::train
