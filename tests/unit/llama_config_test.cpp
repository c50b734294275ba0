// LlamaConfig and CausalLmConfig (LibTorch-free): the presets' exact parameter counts, config.json
// of Llama 2/3, Mistral and Qwen2 read with rope_scaling or transformers v5's rope_parameters,
// dispatch on model_type, and what is refused by name.
#include <gtest/gtest.h>

#include <string>

#include "trainyard/error.h"
#include "trainyard/models/causal_lm_config.h"
#include "trainyard/models/lora.h"
#include "trainyard/plan/memory_plan.h"

namespace {
using namespace trainyard::models;

// The counts published for each model (Hugging Face's num_parameters()).
TEST(LlamaConfigTest, PresetsHaveTheirExactParameterCounts) {
  const std::pair<const char*, std::int64_t> expected[] = {
      {"llama-2-7b", 6'738'415'616},   {"llama-2-13b", 13'015'864'320},
      {"llama-2-70b", 68'976'648'192}, {"llama-3-8b", 8'030'261'248},
      {"llama-3.2-1b", 1'235'814'400}, {"tinyllama-1.1b", 1'100'048'384},
      {"smollm2-135m", 134'515'008},
  };
  for (const auto& [name, count] : expected) {
    EXPECT_EQ(CausalLmConfig::preset(name).parameter_count(), count) << name;
    EXPECT_EQ(CausalLmConfig::preset(name).architecture(), "Llama") << name;
  }
  EXPECT_EQ(CausalLmConfig::preset("pythia-70m").architecture(), "GPT-NeoX");
}

std::string expect_refused(const std::string& json) {
  try {
    CausalLmConfig::from_json(json);
  } catch (const trainyard::InvalidArgumentError& e) {
    return e.what();
  }
  ADD_FAILURE() << "accepted: " << json;
  return "";
}

constexpr const char* kSizes =
    R"("vocab_size": 100, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
       "num_attention_heads": 4, "max_position_embeddings": 128)";

std::string config(const std::string& model_type, const std::string& extra = "") {
  return "{\"model_type\": \"" + model_type + "\", " + kSizes + (extra.empty() ? "" : ", ") +
         extra + "}";
}

TEST(LlamaConfigTest, ReadsEachModelTypeAndRoundTrips) {
  const auto llama =
      CausalLmConfig::from_json(config("llama", R"("num_key_value_heads": 2, "rope_theta": 500000.0,
                         "rope_scaling": {"rope_type": "llama3", "factor": 32.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192},
                         "tie_word_embeddings": true, "attention_bias": false)"));
  const auto* l = llama.get_if<LlamaConfig>();
  ASSERT_NE(l, nullptr);
  EXPECT_EQ(l->num_key_value_heads, 2);
  EXPECT_EQ(l->rope_theta, 500000);
  EXPECT_EQ(l->rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_EQ(l->rope_scaling.factor, 32);
  EXPECT_TRUE(l->tie_word_embeddings);
  EXPECT_EQ(CausalLmConfig::from_json(llama.to_json()), llama);

  // transformers v5 moves rope_theta and the scaling into rope_parameters.
  const auto v5 = CausalLmConfig::from_json(config(
      "llama", R"("rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6})"));
  EXPECT_EQ(v5.get_if<LlamaConfig>()->rope_scaling.type, RopeScaling::Type::kLinear);
  EXPECT_EQ(v5.get_if<LlamaConfig>()->rope_theta, 1e6);

  const auto qwen = CausalLmConfig::from_json(
      config("qwen2", R"("sliding_window": 16, "use_sliding_window": false)"));
  EXPECT_EQ(qwen.model_type(), "qwen2");
  EXPECT_TRUE(qwen.get_if<LlamaConfig>()->qkv_bias);
  EXPECT_FALSE(qwen.get_if<LlamaConfig>()->o_bias);
  EXPECT_EQ(CausalLmConfig::from_json(qwen.to_json()), qwen);

  const auto mistral = CausalLmConfig::from_json(config("mistral", R"("sliding_window": null)"));
  EXPECT_EQ(mistral.model_type(), "mistral");
  EXPECT_EQ(CausalLmConfig::from_json(mistral.to_json()), mistral);
  // Without model_type a config.json is GPT-NeoX's, as before Llama.
  EXPECT_NE(CausalLmConfig::from_json(std::string("{") + kSizes + "}").get_if<GptNeoXConfig>(),
            nullptr);
}

TEST(LlamaConfigTest, WhatTheModelLacksIsRefusedByName) {
  EXPECT_NE(expect_refused(config("mistral", R"("sliding_window": 32)"))
                .find("\"sliding_window\" is 32, shorter than max_position_embeddings (128)"),
            std::string::npos);
  EXPECT_NE(expect_refused(config("llama", R"("rope_scaling": {"rope_type": "yarn", "factor": 4})"))
                .find("rope_type \"yarn\""),
            std::string::npos);
  // A llama3 scaling without its frequency bounds is not Llama 3's: refused, not defaulted.
  const auto partial =
      expect_refused(config("llama", R"("rope_scaling": {"rope_type": "llama3", "factor": 8.0})"));
  EXPECT_NE(partial.find("rope_type \"llama3\" lacks \"original_max_position_embeddings\", "
                         "\"low_freq_factor\", \"high_freq_factor\""),
            std::string::npos)
      << partial;
  EXPECT_NE(expect_refused(config("llama", R"("rope_scaling": {"type": "linear"})"))
                .find("lacks \"factor\""),
            std::string::npos);
  EXPECT_NE(expect_refused(config("llama", R"("hidden_act": "gelu")")).find("\"hidden_act\""),
            std::string::npos);
  EXPECT_NE(expect_refused(config("llama", R"("num_key_value_heads": 3)"))
                .find("must be a multiple of num_key_value_heads (3)"),
            std::string::npos);
  const auto unknown = expect_refused(config("gemma"));
  EXPECT_NE(unknown.find("\"model_type\" is \"gemma\""), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("\"llama\", \"mistral\", \"qwen2\", \"qwen3\""), std::string::npos)
      << unknown;
  const auto missing = expect_refused(R"({"model_type": "llama", "hidden_size": 32})");
  EXPECT_NE(missing.find("lacks \"vocab_size\""), std::string::npos) << missing;
}

// Qwen3 (qwen3_config.h), the architecture added through the seam of models/architecture.h.
TEST(Qwen3ConfigTest, ReadsQwen3sDefaultsRoundTripsAndCountsThePerHeadNorms) {
  const auto preset = CausalLmConfig::preset("qwen3-0.6b");
  EXPECT_EQ(preset.parameter_count(), 596'049'920);  // Qwen3-0.6B's num_parameters()
  EXPECT_EQ(preset.architecture(), "Qwen3");
  EXPECT_EQ(preset.model_type(), "qwen3");

  // head_dim is 128 unless given (not hidden_size / heads); attention_bias biases all four
  // projections; mlp_bias, which transformers' Qwen3 ignores, adds nothing.
  const auto qwen3 =
      CausalLmConfig::from_json(config("qwen3", R"("attention_bias": true, "mlp_bias": true)"));
  const auto* q = qwen3.get_if<Qwen3Config>();
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->head_dim, 128);
  EXPECT_TRUE(q->attention_bias);
  EXPECT_EQ(CausalLmConfig::from_json(qwen3.to_json()), qwen3);
  const std::int64_t h = 32, i = 64, qd = 4 * 128, kv = 4 * 128, d = 128;
  const std::int64_t layer = h * qd + 2 * h * kv + qd * h + (qd + 2 * kv + h)  // attention
                             + 3 * h * i                                       // MLP, no biases
                             + 2 * h + 2 * d;  // the two RMSNorms, q_norm and k_norm
  EXPECT_EQ(qwen3.parameter_count(), 100 * h + 2 * layer + h + 100 * h);
  EXPECT_EQ(qwen3.layer_linears().size(), 7u);

  // Without use_sliding_window, transformers ignores the window.
  EXPECT_NO_THROW(CausalLmConfig::from_json(config("qwen3", R"("sliding_window": 32)")));
}

// As transformers reads them: Qwen's window slides only on the layers from max_window_layers on
// (default 28) or those layer_types names; Mistral's on all, 4096 long when the key is absent.
TEST(LlamaConfigTest, OnlyALayerThatSlidesWithinAShortWindowIsRefused) {
  for (const char* qwen : {"qwen2", "qwen3"}) {
    EXPECT_NO_THROW(CausalLmConfig::from_json(
        config(qwen, R"("use_sliding_window": true, "sliding_window": 32)")))
        << qwen << ": both layers are below max_window_layers 28";
    const auto from_layer_1 = expect_refused(config(
        qwen, R"("use_sliding_window": true, "sliding_window": 32, "max_window_layers": 1)"));
    EXPECT_NE(from_layer_1.find("\"sliding_window\" is 32, shorter than max_position_embeddings "
                                "(128), and layer 1 attends within it (use_sliding_window true, "
                                "max_window_layers 1)"),
              std::string::npos)
        << from_layer_1;
    const auto typed = expect_refused(config(qwen, R"("use_sliding_window": true,
        "sliding_window": 32, "layer_types": ["sliding_attention", "full_attention"])"));
    EXPECT_NE(typed.find("layer 0 attends within it"), std::string::npos) << typed;
    EXPECT_NO_THROW(CausalLmConfig::from_json(config(qwen, R"("use_sliding_window": true,
        "sliding_window": 32, "layer_types": ["full_attention", "full_attention"])")));
  }
  EXPECT_NO_THROW(CausalLmConfig::from_json(config("mistral")));  // 4096 >= 128
  const auto long_context = expect_refused(R"({"model_type": "mistral", "vocab_size": 100,
      "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
      "num_attention_heads": 4, "max_position_embeddings": 8192})");
  EXPECT_NE(long_context.find("\"sliding_window\" is 4096, shorter than max_position_embeddings "
                              "(8192), and layer 0"),
            std::string::npos)
      << long_context;
}

}  // namespace

namespace {

// `trainyard plan --model llama-2-7b --peft lora`: the exact count, the adapters' count and share,
// and LoRA's model states (Note [LoRA model states]).
TEST(LlamaConfigTest, ThePlanCountsTheModelAndItsLoraAdapters) {
  using namespace trainyard::plan;
  PlanOptions options{.model = CausalLmConfig::preset("llama-2-7b"),
                      .world_size = 2,
                      .seq_len = 128,
                      .lora = LoraOptions{}};
  const auto text = format_plan(plan_memory(options));
  EXPECT_NE(text.find("Model: 6,738,415,616 parameters"), std::string::npos) << text;
  // 32 layers x (q_proj 16 x (4096 + 4096) + v_proj the same).
  EXPECT_EQ(lora_parameter_count(*options.model, *options.lora), 8'388'608);
  EXPECT_NE(text.find("LoRA (r 16 on q_proj,v_proj): 8,388,608 trainable parameters (0.124%"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("base 6.28 GiB (bf16, frozen, sharded 2 ways)"), std::string::npos) << text;
  options.lora->targets = {"query_key_value"};
  EXPECT_THROW(plan_memory(options), trainyard::InvalidArgumentError);
}

}  // namespace
