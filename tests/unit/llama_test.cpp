// Llama, Mistral and Qwen2 (models/llama.h): models written by another implementation
// (tests/unit/python/llama_reference.py) load from their folders and give its logits and greedy
// tokens, and transformers computes trainyard's logits on those folders and on trainyard's exports
// of them; the presets' parameter counts; config.json's rope_scaling and refusals; and FSDP over a
// tiny Llama (tied and untied) equals one process.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <fstream>
#include <iterator>

#include "../hf_oracle.h"
#include "../multiproc/multiproc_util.h"
#include "thread_ranks.h"
#include "trainyard/error.h"
#include "trainyard/fsdp/fully_sharded_data_parallel.h"
#include "trainyard/hf/weight_reader.h"
#include "trainyard/models/generate.h"
#include "trainyard/models/hf_weights.h"
#include "trainyard/models/llama.h"
#include "trainyard/train/causal_lm.h"

namespace {
namespace fs = std::filesystem;
using trainyard::mptest::TempDir;
using namespace trainyard::models;

using trainyard::test::read_raw_tensor;

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The reference's folders, written once for the suite; empty without the venv's torch.
fs::path reference_dir() {
  static TempDir dir;
  static const bool written = [] {
    if (std::system(TRAINYARD_PYTHON " -c 'import torch' >/dev/null 2>&1") != 0) return false;
    const auto cmd = std::string(TRAINYARD_PYTHON " ") + TRAINYARD_SOURCE_DIR +
                     "/tests/unit/python/llama_reference.py " + dir.str();
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    return true;
  }();
  return written ? dir.path() : fs::path();
}

#define REQUIRE_REFERENCE()                                   \
  if (reference_dir().empty())                                \
  TY_MISSING_PREREQUISITE(TRAINYARD_PYTHON                    \
                          " with torch writes the reference " \
                          "models: scripts/setup.sh")

// The reference's folders (see llama_reference.py for what each varies).
constexpr const char* kVariants[] = {"gqa", "tied", "qwen2", "llama3", "linear", "mistral"};

// Logits agree to 1e-4: the reference computes in float64 from the same f32 weights, so the
// difference is this model's fp32 rounding over two layers.
TEST(Llama, AnotherImplementationsModelsLoadAndGiveItsLogitsAndGreedyTokens) {
  REQUIRE_REFERENCE();
  for (const char* variant : kVariants) {
    const auto folder = reference_dir() / variant;
    const auto config = CausalLmConfig::from_json(slurp(folder / "config.json"));
    ASSERT_NE(config.get_if<LlamaConfig>(), nullptr) << variant;
    auto model = make_causal_lm(config, {.seed = 7});
    load_hf_weights(*model, trainyard::hf::WeightReader(folder));
    model->eval();
    torch::NoGradGuard no_grad;
    const auto ids = read_raw_tensor(folder / "ids.i64", torch::kInt64).view({2, 13});
    const auto expected =
        read_raw_tensor(folder / "logits.f32", torch::kFloat32).view({2, 13, config.vocab_size()});
    EXPECT_LT((model->forward(ids) - expected).abs().max().item<double>(), 1e-4) << variant;
    // The cached forward, fed the sequence in two parts, gives the same logits.
    KvCache cache;
    const auto first = model->forward_cached(ids.narrow(1, 0, 6), cache);
    const auto rest = model->forward_cached(ids.narrow(1, 6, 7), cache);
    EXPECT_LT((torch::cat({first, rest}, 1) - expected).abs().max().item<double>(), 1e-4)
        << variant << ": forward_cached";
    const auto greedy = read_raw_tensor(folder / "greedy.i64", torch::kInt64);
    const std::vector<std::int64_t> prompt(ids.data_ptr<std::int64_t>(),
                                           ids.data_ptr<std::int64_t>() + 5);
    const auto tokens = generate(*model, prompt, {.max_new_tokens = 8, .greedy = true});
    EXPECT_EQ(tokens, std::vector<std::int64_t>(greedy.data_ptr<std::int64_t>(),
                                                greedy.data_ptr<std::int64_t>() + greedy.numel()))
        << variant << ": greedy generation";
  }
}

// transformers (AutoModelForCausalLM, fp32: tests/hf_oracle.h) loads each reference folder and
// trainyard's export of it (config.json as LlamaConfig::to_json writes it) and computes
// trainyard's logits to 1e-4: both run fp32 from the same weights, and each is within ~1e-5 of
// the reference's float64. A tensor transformers' class for the model_type does not take fails
// the oracle, naming it, rather than giving another model's logits.
TEST(LlamaTransformers, ReferenceFoldersAndTheirExportsGiveTrainyardsLogits) {
  REQUIRE_REFERENCE();
  TY_REQUIRE_HF_ORACLE("transformers");
  TempDir exports;
  std::vector<trainyard::test::OracleInput> inputs;
  std::vector<torch::Tensor> ours;
  torch::NoGradGuard no_grad;
  for (const char* variant : kVariants) {
    const auto folder = reference_dir() / variant;
    const auto config = CausalLmConfig::from_json(slurp(folder / "config.json"));
    auto model = make_causal_lm(config);
    load_hf_weights(*model, trainyard::hf::WeightReader(folder));
    model->eval();
    const auto ids = read_raw_tensor(folder / "ids.i64", torch::kInt64).view({2, 13});
    export_hf(*model, config.to_json(), (exports.path() / variant).string());
    const auto logits = model->forward(ids);
    for (const auto& f : {folder, exports.path() / variant}) {
      inputs.push_back({f, ids});
      ours.push_back(logits);
    }
  }
  const auto theirs = trainyard::test::transformers_logits(inputs);
  for (std::size_t i = 0; i < inputs.size(); ++i)
    EXPECT_LT((ours[i] - theirs[i]).abs().max().item<double>(), 1e-4)
        << inputs[i].folder << (i % 2 == 0 ? " (the reference's)" : " (trainyard's export)");
}

TEST(Llama, ExportThenLoadGivesIdenticalLogits) {
  REQUIRE_REFERENCE();
  const auto folder = reference_dir() / "qwen2";
  const auto config = CausalLmConfig::from_json(slurp(folder / "config.json"));
  auto model = make_causal_lm(config);
  load_hf_weights(*model, trainyard::hf::WeightReader(folder));
  TempDir out;
  export_hf(*model, config.to_json(), out.str());
  const auto again = CausalLmConfig::from_json(slurp(out.path() / "config.json"));
  EXPECT_EQ(again, config);
  auto loaded = make_causal_lm(again);
  load_hf_weights(*loaded, trainyard::hf::WeightReader(out.path()));
  torch::NoGradGuard no_grad;
  const auto ids = torch::randint(0, config.vocab_size(), {2, 9});
  EXPECT_TRUE(torch::equal(model->forward(ids), loaded->forward(ids)));
}

// Every parameter's shape counted without memory (on the meta device) agrees with the formula,
// so the presets' exact counts (LlamaConfigTest) hold for the model built.
TEST(Llama, PresetsBuildTheParametersTheirCountsSay) {
  for (const char* name : {"llama-tiny", "smollm2-135m", "tinyllama-1.1b", "llama-2-7b",
                           "llama-3.2-1b", "llama-2-70b", "qwen3-0.6b"}) {
    const auto config = CausalLmConfig::preset(name);
    auto model = make_causal_lm(config, {.device = torch::kMeta});
    std::int64_t count = 0;
    for (const auto& p : model->parameters()) count += p.numel();
    EXPECT_EQ(count, config.parameter_count()) << name;
  }
}

TEST(Llama, DeferredInitialisationEqualsEagerAndNamesUnknownParameters) {
  auto eager = make_causal_lm(CausalLmConfig::preset("llama-tiny"), {.seed = 3});
  for (const auto& p : eager->named_parameters()) {
    auto t = torch::empty_like(p.value());
    eager->init_parameter(p.key(), t);
    EXPECT_TRUE(torch::equal(t, p.value())) << p.key();
  }
  auto t = torch::empty({32});
  try {
    eager->init_parameter("model.layers.2.input_layernorm.weight", t);
    FAIL() << "a third layer of a two-layer model";
  } catch (const trainyard::InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("is not a parameter of Llama with 2 layers"),
              std::string::npos)
        << e.what();
  }
}

// FULL_SHARD over W thread ranks, layers and (untied) embeddings as units, deferred
// initialisation, against one process on the combined batch. SGD in fp32: 1e-5 relative, the
// reduction order's rounding.
void expect_fsdp_matches_one_process(LlamaConfig config, int world, bool checkpointing) {
  constexpr int kSteps = 3;
  constexpr std::int64_t kBatch = 2, kSeq = 9;
  auto batch = [&](int step) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(100 + step);
    return torch::randint(0, config.vocab_size, {world * kBatch, kSeq}, gen,
                          torch::TensorOptions().dtype(torch::kInt64));
  };
  auto sgd = [](std::vector<torch::Tensor> params) {
    return torch::optim::SGD(std::move(params), torch::optim::SGDOptions(0.05).momentum(0.9));
  };
  auto reference = make_causal_lm(config, {.seed = 5});
  auto opt = sgd(reference->parameters());
  for (int step = 0; step < kSteps; ++step) {
    opt.zero_grad();
    const auto ids = batch(step);
    causal_lm_loss(reference->forward(ids), ids).backward();
    opt.step();
  }
  std::map<std::string, torch::Tensor> sharded;
  trainyard::testing::run_thread_ranks(world, [&](int rank, auto pg) {
    auto model = make_causal_lm(config, {.seed = 5, .deferred = true});
    auto store = c10::make_intrusive<c10d::HashStore>();
    trainyard::fsdp::FullyShardedDataParallel fsdp(
        model, trainyard::fsdp::make_fsdp_groups(trainyard::Strategy::kFullShard, pg, store, world),
        {.wrap = trainyard::train::causal_lm_wrap_policy(model),
         .activation_checkpointing = checkpointing,
         .param_init = [model](const std::string& n, torch::Tensor& t) {
           model->init_parameter(n, t);
         }});
    auto o = sgd(fsdp.parameters());
    for (int step = 0; step < kSteps; ++step) {
      o.zero_grad();
      const auto ids = batch(step).narrow(0, rank * kBatch, kBatch);
      causal_lm_loss(fsdp.forward(ids), ids).backward();
      o.step();
    }
    auto full = fsdp.full_parameters();
    if (rank == 0)
      for (auto& [name, t] : full) sharded[name] = t;
  });
  const auto expected = reference->named_parameters();
  ASSERT_EQ(sharded.size(), expected.size());
  for (const auto& p : expected) {
    ASSERT_TRUE(sharded.count(p.key())) << p.key();
    const double rel = (sharded[p.key()] - p.value()).norm().item<double>() /
                       (p.value().norm().item<double>() + 1e-12);
    EXPECT_LT(rel, 1e-5) << p.key() << " W=" << world;
  }
}

TEST(Llama, FullShardMatchesOneProcessUntiedAndTied) {
  auto untied = LlamaConfig::preset("llama-tiny");
  auto tied = untied;
  tied.tie_word_embeddings = true;
  for (int world : {1, 2, 3}) expect_fsdp_matches_one_process(untied, world, world == 2);
  for (int world : {2, 3}) expect_fsdp_matches_one_process(tied, world, world == 3);
}

}  // namespace
