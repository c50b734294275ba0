// LoRA (models/lora.h) on trainyard's causal LMs: adapters where PEFT puts them, the base frozen,
// FULL_SHARD at W = 1, 2, 3 equal to one process with the frozen parameters unchanged, the merged
// weights W + (alpha / r) B A giving the adapted model's logits, and the counts the planner uses.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "thread_ranks.h"
#include "trainyard/error.h"
#include "trainyard/fsdp/fully_sharded_data_parallel.h"
#include "trainyard/models/causal_lm.h"
#include "trainyard/models/lora.h"

namespace {
using namespace trainyard::models;

// Dropout 0: the equivalence below compares exact arithmetic.
LoraOptions lora(std::vector<std::string> targets = {"q_proj", "v_proj"}) {
  return {.r = 4, .alpha = 8, .dropout = 0, .targets = std::move(targets)};
}

std::map<std::string, torch::Tensor> params_of(const CausalLm& model) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& p : model->named_parameters()) out[p.key()] = p.value().detach().clone();
  return out;
}

TEST(Lora, AdaptersAreWherePeftPutsThemAndOnlyTheyTrain) {
  const auto config = CausalLmConfig::preset("llama-tiny");
  auto model = make_causal_lm(config, {.seed = 1, .lora = lora()});
  std::int64_t trainable = 0;
  for (const auto& p : model->named_parameters()) {
    EXPECT_EQ(p.value().requires_grad(), is_lora_parameter(p.key())) << p.key();
    if (p.value().requires_grad()) trainable += p.value().numel();
  }
  const auto names = model->named_parameters();
  EXPECT_TRUE(names.contains("model.layers.0.self_attn.q_proj.lora_A.weight"));
  EXPECT_TRUE(names.contains("model.layers.1.self_attn.v_proj.lora_B.weight"));
  EXPECT_FALSE(names.contains("model.layers.0.self_attn.k_proj.lora_A.weight"));
  EXPECT_EQ(trainable, lora_parameter_count(config, lora()));
  // B starts at zero, so the adapted model computes what the base does.
  auto base = make_causal_lm(config, {.seed = 1});
  const auto ids = torch::randint(0, 256, {2, 7});
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(torch::allclose(model->forward(ids), base->forward(ids)));

  auto all = make_causal_lm(config, {.seed = 1, .lora = lora({"all-linear"})});
  EXPECT_EQ(lora_parameter_count(config, lora({"all-linear"})),
            2 * 4 * ((32 + 32) + 2 * (32 + 16) + (32 + 32) + 2 * (32 + 64) + (64 + 32)));
  EXPECT_FALSE(all->named_parameters().contains("lm_head.lora_A.weight")) << "not the head";
  auto neox = make_causal_lm(CausalLmConfig::preset("tiny"), {.lora = lora({"query_key_value"})});
  EXPECT_TRUE(neox->named_parameters().contains(
      "gpt_neox.layers.0.attention.query_key_value.lora_A.weight"));
  try {
    make_causal_lm(CausalLmConfig::preset("tiny"), {.lora = lora()});
    FAIL() << "GPT-NeoX has no q_proj";
  } catch (const trainyard::InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("--lora-targets names \"q_proj\", but GPT-NeoX's layers "
                                         "have the linear layers query_key_value, dense"),
              std::string::npos)
        << e.what();
  }
}

TEST(Lora, MergedWeightsAreTheBasePlusScaledBATimesAAndGiveTheSameLogits) {
  auto model = make_causal_lm(CausalLmConfig::preset("llama-tiny"), {.seed = 2, .lora = lora()});
  torch::NoGradGuard no_grad;
  for (auto& p : model->named_parameters())  // B nonzero, as after training
    if (p.key().ends_with("lora_B.weight")) p.value().normal_(0, 0.1);
  const auto params = params_of(model);
  const auto merged = merged_lora_parameters(*model);
  const std::string q = "model.layers.0.self_attn.q_proj.";
  for (const auto& [name, t] : merged) {
    EXPECT_FALSE(is_lora_parameter(name)) << name;
    if (name != q + "weight") continue;
    const auto expected =
        params.at(q + "weight") +
        2.0 * torch::matmul(params.at(q + "lora_B.weight"), params.at(q + "lora_A.weight"));
    EXPECT_TRUE(torch::allclose(t, expected, 0, 1e-6));
  }
  auto plain = make_causal_lm(CausalLmConfig::preset("llama-tiny"));
  auto named = plain->named_parameters();
  ASSERT_EQ(merged.size(), named.size());
  for (const auto& [name, t] : merged) named[name].copy_(t);
  const auto ids = torch::randint(0, 256, {2, 9});
  EXPECT_LT((plain->forward(ids) - model->forward(ids)).abs().max().item<double>(), 1e-5);
}

// FULL_SHARD with layer units (LoRA's trainable and the base's frozen parameters in each), a
// deferred model, AdamW with weight decay: equal to one process on the combined batch (fp32,
// 1e-5 relative: the reduction order), and the base bit-for-bit unchanged.
TEST(Lora, FullShardMatchesOneProcessAndTheBaseNeverChanges) {
  const auto config = CausalLmConfig::preset("llama-tiny");
  constexpr int kSteps = 3;
  constexpr std::int64_t kBatch = 2, kSeq = 8;
  for (const int world : {1, 2, 3}) {
    auto batch = [&](int step) {
      auto gen = at::make_generator<at::CPUGeneratorImpl>(50 + step);
      return torch::randint(0, 256, {world * kBatch, kSeq}, gen,
                            torch::TensorOptions().dtype(torch::kInt64));
    };
    auto adamw = [](std::vector<torch::Tensor> p) {
      return torch::optim::AdamW(std::move(p), torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
    };
    auto reference = make_causal_lm(config, {.seed = 4, .lora = lora()});
    const auto initial = params_of(reference);
    std::vector<torch::Tensor> trainable;
    for (const auto& p : reference->parameters())
      if (p.requires_grad()) trainable.push_back(p);
    auto opt = adamw(trainable);
    for (int step = 0; step < kSteps; ++step) {
      opt.zero_grad();
      const auto ids = batch(step);
      causal_lm_loss(reference->forward(ids), ids).backward();
      opt.step();
    }
    std::map<std::string, torch::Tensor> sharded;
    trainyard::testing::run_thread_ranks(world, [&](int rank, auto pg) {
      auto model = make_causal_lm(config, {.seed = 4, .deferred = true, .lora = lora()});
      auto store = c10::make_intrusive<c10d::HashStore>();
      trainyard::fsdp::FullyShardedDataParallel fsdp(
          model,
          trainyard::fsdp::make_fsdp_groups(trainyard::Strategy::kFullShard, pg, store, world),
          {.wrap = {.wraps = [model](const std::string&, const torch::nn::Module& m,
                                     std::int64_t) { return model->is_layer(m); }},
           .param_init = [model](const std::string& n, torch::Tensor& t) {
             model->init_parameter(n, t);
           }});
      auto o = adamw(fsdp.parameters());
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
    for (const auto& [name, expected] : params_of(reference)) {
      ASSERT_TRUE(sharded.count(name)) << name;
      if (!is_lora_parameter(name)) {
        EXPECT_TRUE(torch::equal(sharded[name], initial.at(name))) << name << " W=" << world;
        EXPECT_TRUE(torch::equal(expected, initial.at(name))) << name << " (one process)";
        continue;
      }
      const double rel = (sharded[name] - expected).norm().item<double>() /
                         (expected.norm().item<double>() + 1e-12);
      EXPECT_LT(rel, 1e-5) << name << " W=" << world;
      if (name.ends_with("lora_B.weight")) {
        EXPECT_GT(expected.abs().max().item<double>(), 0);
      }
    }
  }
}

}  // namespace

namespace {

// Note [Freeing units with frozen parameters]: in backward each LoRA layer is freed once its
// input's gradient is computed, so at most a few layers' full weights are gathered at once (here
// 8 layers; before, every layer stayed gathered until the end of backward). With bf16-mixed the
// frozen shards are bf16 (Note [Frozen shards]).
TEST(Lora, FullShardKeepsFewLayersGatheredInBackwardAndFrozenShardsInBf16) {
  auto config = LlamaConfig::preset("llama-tiny");
  config.num_hidden_layers = 8;
  trainyard::testing::run_thread_ranks(2, [&](int rank, auto pg) {
    auto model = make_causal_lm(config, {.deferred = true, .lora = lora()});
    auto store = c10::make_intrusive<c10d::HashStore>();
    trainyard::fsdp::FullyShardedDataParallel fsdp(
        model, trainyard::fsdp::make_fsdp_groups(trainyard::Strategy::kFullShard, pg, store, 2),
        {.wrap = {.wraps = [model](const std::string&, const torch::nn::Module& m,
                                   std::int64_t) { return model->is_layer(m); }},
         .mixed_precision = {.param_dtype = torch::kBFloat16, .reduce_dtype = torch::kFloat32},
         .activation_checkpointing = true,
         .param_init = [model](const std::string& n, torch::Tensor& t) {
           model->init_parameter(n, t);
         }});
    // Trainable: the adapters' fp32 shards alone; frozen: half of the rest, in bf16.
    std::int64_t trainable = 0;
    for (const auto& p : fsdp.parameters()) trainable += p.numel();
    const auto adapters = lora_parameter_count(CausalLmConfig(config), lora());
    EXPECT_GE(trainable * 2, adapters);
    EXPECT_LT(trainable * 2, adapters + 64);  // padding
    const auto frozen = CausalLmConfig(config).parameter_count();
    EXPECT_LT(fsdp.sharded_state_bytes(), (frozen / 2) * 2 + trainable * 4 + 1024);
    const auto ids = torch::randint(0, 256, {2, 16});
    causal_lm_loss(fsdp.forward(ids), ids).backward();
    // bf16 bytes of a layer's base (q, o 32x32; k, v 16x32; gate, up, down 32x64; two norms)
    // and of the root (embed_tokens, lm_head, norm).
    const std::int64_t layer = (2 * 32 * 32 + 2 * 16 * 32 + 3 * 32 * 64 + 2 * 32) * 2;
    const std::int64_t root = (2 * 256 * 32 + 32) * 2;
    if (rank == 0) {
      // All eight layers gathered would be root + 8 layers (181 KB).
      EXPECT_LT(fsdp.last_stats().peak_gathered_bytes, root + 4 * layer)
          << "at most a few layers and the root at once";
    }
  });
}

}  // namespace
