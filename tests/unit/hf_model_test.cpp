// Hugging Face model folders with trainyard's GPT-NeoX (models/hf_weights.h): a model written by
// another implementation (tests/unit/python/gpt_neox_reference.py, Debian's python3-torch) loads
// from model.safetensors and from pytorch_model.bin and gives that implementation's logits; export
// then load gives identical logits; FSDP reads each rank's slices of a folder's weights.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <fstream>
#include <iterator>

#include "../multiproc/multiproc_util.h"
#include "thread_ranks.h"
#include "tiny_gpt_neox.h"
#include "trainyard/error.h"
#include "trainyard/fsdp/fully_sharded_data_parallel.h"
#include "trainyard/hf/weight_reader.h"
#include "trainyard/models/hf_weights.h"

namespace {
namespace fs = std::filesystem;
using trainyard::mptest::TempDir;
using namespace trainyard::models;

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

torch::Tensor raw_tensor(const fs::path& p, torch::ScalarType dtype) {
  auto bytes = slurp(p);
  const auto n = static_cast<std::int64_t>(bytes.size() / c10::elementSize(dtype));
  return torch::from_blob(bytes.data(), {n}, dtype).clone();
}

bool python_torch_present() {
  return std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") == 0;
}

TEST(HfModel, AnotherImplementationsGptNeoXLoadsAndGivesItsLogits) {
  if (!python_torch_present())
    TY_MISSING_PREREQUISITE("/usr/bin/python3 has no torch (python3-torch): scripts/setup.sh");
  for (const char* dtype : {"f32", "bf16", "f16"}) {
    TempDir dir;
    const auto cmd = std::string("/usr/bin/python3 ") + TRAINYARD_SOURCE_DIR +
                     "/tests/unit/python/gpt_neox_reference.py " + dir.str() + " " + dtype;
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    const auto ids = raw_tensor(dir.path() / "ids.i64", torch::kInt64).view({2, 11});
    const auto expected = raw_tensor(dir.path() / "logits.f32", torch::kFloat32).view({2, 11, 72});
    for (const char* format : {"safetensors", "bin"}) {
      const auto folder = dir.path() / format;
      GptNeoX model(GptNeoXConfig::from_json(slurp(folder / "config.json")));
      const trainyard::hf::WeightReader reader(folder);
      load_hf_weights(*model, reader);
      torch::NoGradGuard no_grad;
      model->eval();
      const auto logits = model->forward(ids);
      EXPECT_LT((logits - expected).abs().max().item<double>(), 1e-4)
          << format << " in " << dtype << ": the reference's logits";
    }
  }
}

TEST(HfModel, ExportThenLoadGivesIdenticalLogits) {
  const auto config = trainyard::testing::tiny_gpt_neox_config();
  GptNeoX original(config, GptNeoXInit{.seed = 7});
  const auto ids = trainyard::testing::tiny_gpt_neox_batch(0, 2, 9);
  torch::NoGradGuard no_grad;
  const auto expected = original->forward(ids);
  // One file, shards of ~4 KB (several, with an index), and bf16.
  for (std::uint64_t shard_bytes : {std::uint64_t{5'000'000'000}, std::uint64_t{4096}}) {
    TempDir dir;
    export_hf(*original, config.to_json(), dir.str(), {.max_shard_bytes = shard_bytes});
    EXPECT_EQ(fs::exists(dir.path() / "model.safetensors.index.json"), shard_bytes == 4096);
    GptNeoX loaded(GptNeoXConfig::from_json(slurp(dir.path() / "config.json")),
                   GptNeoXInit{.seed = 99});
    load_hf_weights(*loaded, trainyard::hf::WeightReader(dir.path()));
    EXPECT_TRUE(torch::equal(loaded->forward(ids), expected)) << "shards of " << shard_bytes;
  }
  TempDir dir;
  export_hf(*original, config.to_json(), dir.str(), {.bf16 = true});
  GptNeoX loaded(config, GptNeoXInit{.seed = 99});
  load_hf_weights(*loaded, trainyard::hf::WeightReader(dir.path()));
  for (const auto& p : loaded->named_parameters())
    EXPECT_TRUE(torch::equal(
        p.value(), original->named_parameters()[p.key()].to(torch::kBFloat16).to(torch::kFloat32)))
        << p.key() << " is the bf16 rounding of the original";
}

TEST(HfModel, AShapeThatDisagreesWithTheConfigNamesTheTensorAndTheFile) {
  const auto config = trainyard::testing::tiny_gpt_neox_config();
  GptNeoX original(config);
  TempDir dir;
  export_hf(*original, config.to_json(), dir.str());
  auto other = config;
  other.vocab_size = config.vocab_size + 3;
  GptNeoX model(other);
  try {
    load_hf_weights(*model, trainyard::hf::WeightReader(dir.path()));
    FAIL() << "a 64-row embedding loaded into a 67-row model";
  } catch (const trainyard::CheckpointCorruptError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("gpt_neox.embed_in.weight"), std::string::npos) << what;
    EXPECT_NE(what.find("model.safetensors"), std::string::npos) << what;
  }
}

TEST(HfModel, FsdpReadsEachRanksSlicesOfAFoldersWeights) {
  const auto config = trainyard::testing::tiny_gpt_neox_config();
  GptNeoX original(config, GptNeoXInit{.seed = 7});
  TempDir dir;
  export_hf(*original, config.to_json(), dir.str());
  auto reader = std::make_shared<const trainyard::hf::WeightReader>(dir.path());
  for (int world : {1, 2}) {
    std::map<std::string, torch::Tensor> actual;
    auto store = c10::make_intrusive<c10d::HashStore>();
    trainyard::testing::run_thread_ranks(world, [&](int rank, auto pg) {
      GptNeoX model(config, GptNeoXInit{.deferred = true});
      std::map<std::string, std::vector<std::int64_t>> shapes;
      for (const auto& p : model->named_parameters()) shapes[p.key()] = p.value().sizes().vec();
      trainyard::fsdp::FsdpOptions options{
          .wrap = trainyard::fsdp::wrap_modules_of_type<GptNeoXLayerImpl>(),
          .param_slice_init =
              hf_slice_init(reader, [shapes](const std::string& n) { return shapes.at(n); })};
      trainyard::fsdp::FullyShardedDataParallel fsdp(
          model, trainyard::fsdp::make_fsdp_groups(options.sharding, pg, store, world), options);
      auto full = fsdp.full_parameters();
      if (rank == 0)
        for (auto& [name, t] : full) actual[name] = t;
    });
    for (const auto& p : original->named_parameters())
      EXPECT_TRUE(torch::equal(actual.at(p.key()), p.value())) << "W=" << world << " " << p.key();
  }
}

}  // namespace
