// Hugging Face model folders with trainyard's GPT-NeoX (models/hf_weights.h): a model written by
// another implementation (tests/unit/python/gpt_neox_reference.py, the venv's torch) loads
// from model.safetensors and from pytorch_model.bin and gives that implementation's logits, and
// transformers computes trainyard's logits on it and on trainyard's export; folders transformers'
// save_pretrained wrote, sharded, of every architecture give trainyard transformers' logits;
// export then load gives identical logits; FSDP reads each rank's slices of a folder's weights.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <fstream>
#include <iterator>

#include "../hf_oracle.h"
#include "../multiproc/multiproc_util.h"
#include "thread_ranks.h"
#include "tiny_gpt_neox.h"
#include "trainyard/error.h"
#include "trainyard/fsdp/fully_sharded_data_parallel.h"
#include "trainyard/hf/weight_reader.h"
#include "trainyard/models/causal_lm.h"
#include "trainyard/models/hf_weights.h"

namespace {
namespace fs = std::filesystem;
using trainyard::mptest::TempDir;
using namespace trainyard::models;

using trainyard::test::read_raw_tensor;

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

bool python_torch_present() {
  return std::system(TRAINYARD_PYTHON " -c 'import torch' >/dev/null 2>&1") == 0;
}

TEST(HfModel, AnotherImplementationsGptNeoXLoadsAndGivesItsLogits) {
  if (!python_torch_present())
    TY_MISSING_PREREQUISITE(TRAINYARD_PYTHON " has no torch (scripts/setup.sh installs it)");
  for (const char* dtype : {"f32", "bf16", "f16"}) {
    TempDir dir;
    const auto cmd = std::string(TRAINYARD_PYTHON " ") + TRAINYARD_SOURCE_DIR +
                     "/tests/unit/python/gpt_neox_reference.py " + dir.str() + " " + dtype;
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    const auto ids = read_raw_tensor(dir.path() / "ids.i64", torch::kInt64).view({2, 11});
    const auto expected =
        read_raw_tensor(dir.path() / "logits.f32", torch::kFloat32).view({2, 11, 72});
    for (const char* format : {"safetensors", "bin"}) {
      const auto folder = dir.path() / format;
      GptNeoX model(
          *CausalLmConfig::from_json(slurp(folder / "config.json")).get_if<GptNeoXConfig>());
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

// transformers (AutoModelForCausalLM, fp32: tests/hf_oracle.h) computes trainyard's logits to
// 1e-4 on the reference's folders (safetensors and pytorch_model.bin) and on trainyard's export
// of the model (config.json as GptNeoXConfig::to_json writes it): both run fp32 from the same
// weights.
TEST(GptNeoXTransformers, ReferenceFoldersAndTheExportGiveTrainyardsLogits) {
  TY_REQUIRE_HF_ORACLE("transformers");  // and so torch, which the reference needs
  TempDir dir;
  const auto cmd = std::string(TRAINYARD_PYTHON " ") + TRAINYARD_SOURCE_DIR +
                   "/tests/unit/python/gpt_neox_reference.py " + dir.str() + " f32";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const auto folder = dir.path() / "safetensors";
  const auto config =
      *CausalLmConfig::from_json(slurp(folder / "config.json")).get_if<GptNeoXConfig>();
  GptNeoX model(config);
  load_hf_weights(*model, trainyard::hf::WeightReader(folder));
  export_hf(*model, config.to_json(), (dir.path() / "exported").string());
  const auto ids = read_raw_tensor(dir.path() / "ids.i64", torch::kInt64).view({2, 11});
  torch::NoGradGuard no_grad;
  model->eval();
  const auto ours = model->forward(ids);
  const std::vector<trainyard::test::OracleInput> inputs = {
      {folder, ids}, {dir.path() / "bin", ids}, {dir.path() / "exported", ids}};
  const auto theirs = trainyard::test::transformers_logits(inputs);
  for (std::size_t i = 0; i < inputs.size(); ++i)
    EXPECT_LT((ours - theirs[i]).abs().max().item<double>(), 1e-4) << inputs[i].folder;
}

// Folders transformers' save_pretrained wrote (5.x: rope_parameters, dtype; shards of 20 KB with
// model.safetensors.index.json), one per architecture trainyard reads, with what each varies
// from its defaults (hf_oracle.py's KINDS: partial rotary, rope_theta, llama3 scaling, tied
// embeddings, head_dim, one key/value head, q/k/v biases, Qwen3's per-head norms): trainyard reads
// config.json and the shards and computes transformers' logits to 1e-4.
TEST(SavePretrainedFolders, ShardedGptNeoXLlamaMistralQwen2Qwen3GiveTrainyardsLogits) {
  TY_REQUIRE_HF_ORACLE("transformers");
  TempDir dir;
  const std::vector<std::string> kinds = {"gpt_neox", "llama", "mistral", "qwen2", "qwen3"};
  std::vector<std::pair<fs::path, std::string>> folders;
  for (const auto& kind : kinds) folders.emplace_back(dir.path() / kind, kind);
  trainyard::test::transformers_save(folders);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(17);
  const auto ids =
      torch::randint(0, 256, {2, 13}, gen, torch::TensorOptions().dtype(torch::kInt64));
  std::vector<trainyard::test::OracleInput> inputs;
  for (const auto& folder : folders) inputs.push_back({folder.first, ids});
  const auto theirs = trainyard::test::transformers_logits(inputs);
  torch::NoGradGuard no_grad;
  for (std::size_t i = 0; i < folders.size(); ++i) {
    const auto& [folder, kind] = folders[i];
    ASSERT_TRUE(fs::exists(folder / "model.safetensors.index.json")) << kind;
    const auto config = CausalLmConfig::from_json(slurp(folder / "config.json"));
    auto model = make_causal_lm(config, {.seed = 7});
    load_hf_weights(*model, trainyard::hf::WeightReader(folder));
    model->eval();
    EXPECT_LT((model->forward(ids) - theirs[i]).abs().max().item<double>(), 1e-4)
        << kind << ": " << slurp(folder / "config.json");
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
    GptNeoX loaded(
        *CausalLmConfig::from_json(slurp(dir.path() / "config.json")).get_if<GptNeoXConfig>(),
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
