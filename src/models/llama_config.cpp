#include "trainyard/models/llama_config.h"

#include <algorithm>
#include <cmath>

#include "models/config_fields.h"
#include "trainyard/error.h"

namespace trainyard::models {
namespace {

using LlamaPreset = NamedPreset<LlamaConfig>;

// Sizes from each model's config.json on the Hugging Face hub.
const std::vector<LlamaPreset>& llama_presets() {
  const RopeScaling llama32{.type = RopeScaling::Type::kLlama3,
                            .factor = 32,
                            .low_freq_factor = 1,
                            .high_freq_factor = 4,
                            .original_max_position_embeddings = 8192};
  static const std::vector<LlamaPreset> all = {
      {"llama-2-7b", LlamaConfig{.max_position_embeddings = 4096, .rms_norm_eps = 1e-5}},
      {"llama-2-13b", LlamaConfig{.hidden_size = 5120,
                                  .intermediate_size = 13824,
                                  .num_hidden_layers = 40,
                                  .num_attention_heads = 40,
                                  .num_key_value_heads = 40,
                                  .max_position_embeddings = 4096,
                                  .rms_norm_eps = 1e-5}},
      {"llama-2-70b", LlamaConfig{.hidden_size = 8192,
                                  .intermediate_size = 28672,
                                  .num_hidden_layers = 80,
                                  .num_attention_heads = 64,
                                  .num_key_value_heads = 8,
                                  .max_position_embeddings = 4096,
                                  .rms_norm_eps = 1e-5}},
      {"llama-3-8b", LlamaConfig{.vocab_size = 128256,
                                 .intermediate_size = 14336,
                                 .num_key_value_heads = 8,
                                 .max_position_embeddings = 8192,
                                 .rms_norm_eps = 1e-5,
                                 .rope_theta = 500000}},
      {"llama-3.2-1b", LlamaConfig{.vocab_size = 128256,
                                   .hidden_size = 2048,
                                   .intermediate_size = 8192,
                                   .num_hidden_layers = 16,
                                   .num_attention_heads = 32,
                                   .num_key_value_heads = 8,
                                   .head_dim = 64,
                                   .max_position_embeddings = 131072,
                                   .rms_norm_eps = 1e-5,
                                   .rope_theta = 500000,
                                   .rope_scaling = llama32,
                                   .tie_word_embeddings = true}},
      {"tinyllama-1.1b", LlamaConfig{.hidden_size = 2048,
                                     .intermediate_size = 5632,
                                     .num_hidden_layers = 22,
                                     .num_attention_heads = 32,
                                     .num_key_value_heads = 4,
                                     .max_position_embeddings = 2048,
                                     .rms_norm_eps = 1e-5}},
      {"smollm2-135m", LlamaConfig{.vocab_size = 49152,
                                   .hidden_size = 576,
                                   .intermediate_size = 1536,
                                   .num_hidden_layers = 30,
                                   .num_attention_heads = 9,
                                   .num_key_value_heads = 3,
                                   .max_position_embeddings = 8192,
                                   .rms_norm_eps = 1e-5,
                                   .rope_theta = 100000,
                                   .tie_word_embeddings = true}},
      // For tests: 4 query heads sharing 2 key/value heads of 8 dimensions; bytes as tokens.
      {"llama-tiny", LlamaConfig{.vocab_size = 256,
                                 .hidden_size = 32,
                                 .intermediate_size = 64,
                                 .num_hidden_layers = 2,
                                 .num_attention_heads = 4,
                                 .num_key_value_heads = 2,
                                 .max_position_embeddings = 64,
                                 .rms_norm_eps = 1e-5}},
  };
  return all;
}

struct VariantNames {
  LlamaVariant variant;
  std::string_view model_type, hf_class;
};
constexpr VariantNames kVariants[] = {
    {LlamaVariant::kLlama, "llama", "LlamaForCausalLM"},
    {LlamaVariant::kMistral, "mistral", "MistralForCausalLM"},
    {LlamaVariant::kQwen2, "qwen2", "Qwen2ForCausalLM"},
};

const VariantNames& names_of(LlamaVariant variant) {
  for (const auto& v : kVariants)
    if (v.variant == variant) return v;
  return kVariants[0];
}

const char* rope_type_name(RopeScaling::Type type) {
  switch (type) {
    case RopeScaling::Type::kNone:
      return "default";
    case RopeScaling::Type::kLinear:
      return "linear";
    case RopeScaling::Type::kLlama3:
      return "llama3";
  }
  return "default";
}

// rope_scaling (transformers v4) or rope_parameters (v5, which also holds rope_theta).
void read_rope(const Json& j, LlamaConfig& c) {
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    const auto it = j.find(key);
    if (it == j.end() || it->is_null()) continue;
    TY_CHECK(it->is_object(), "config.json: \"", key, "\" must be an object, got ", it->dump(),
             ".");
    std::string type = it->value("rope_type", it->value("type", std::string("default")));
    if (type == "default") {
      c.rope_scaling = {};
    } else if (type == "linear") {
      c.rope_scaling.type = RopeScaling::Type::kLinear;
    } else if (type == "llama3") {
      c.rope_scaling.type = RopeScaling::Type::kLlama3;
    } else {
      throw InvalidArgumentError(detail::concat(
          "config.json: \"", key, "\" has rope_type \"", type,
          "\"; trainyard's Llama supports \"default\", \"linear\" and \"llama3\" rotary "
          "embeddings. HINT: a model with another scaling (dynamic, yarn, longrope) would give "
          "wrong logits here."));
    }
    // As transformers' rope validation: each scaling's parameters are given, never defaulted.
    std::vector<const char*> required;
    if (type == "linear") required = {"factor"};
    if (type == "llama3")
      required = {"factor", "original_max_position_embeddings", "low_freq_factor",
                  "high_freq_factor"};
    std::string missing;
    for (const char* name : required)
      if (!it->contains(name) || (*it)[name].is_null())
        missing += detail::concat(missing.empty() ? "" : ", ", "\"", name, "\"");
    TY_CHECK(missing.empty(), "config.json: \"", key, "\" of rope_type \"", type, "\" lacks ",
             missing,
             ", which transformers requires of it too. HINT: copy the model's "
             "config.json whole; Llama 3.1's rope_scaling has factor 8.0, low_freq_factor 1.0, "
             "high_freq_factor 4.0, original_max_position_embeddings 8192.");
    read_field(*it, "factor", c.rope_scaling.factor);
    read_field(*it, "low_freq_factor", c.rope_scaling.low_freq_factor);
    read_field(*it, "high_freq_factor", c.rope_scaling.high_freq_factor);
    read_field(*it, "original_max_position_embeddings",
               c.rope_scaling.original_max_position_embeddings);
    read_field(*it, "rope_theta", c.rope_theta);
  }
}

}  // namespace

LlamaConfig LlamaConfig::preset(const std::string& name) {
  return find_preset(llama_presets(), name, "Llama");
}

std::vector<std::string> LlamaConfig::preset_names() {
  return names_of(llama_presets());
}

LlamaConfig LlamaConfig::from_json(const Json& j) {
  LlamaConfig c;
  const auto model_type = j.value("model_type", std::string("llama"));
  const auto* named =
      std::find_if(std::begin(kVariants), std::end(kVariants),
                   [&](const VariantNames& v) { return v.model_type == model_type; });
  if (named == std::end(kVariants)) {
    std::string known;
    for (const auto& v : kVariants)
      known += detail::concat(known.empty() ? "" : ", ", '"', v.model_type, '"');
    throw InvalidArgumentError(detail::concat("config.json: \"model_type\" is \"", model_type,
                                              "\"; LlamaConfig reads ", known, "."));
  }
  c.variant = named->variant;
  if (j.contains("hidden_act"))
    TY_CHECK(j["hidden_act"] == "silu", "config.json: \"hidden_act\" is ", j["hidden_act"].dump(),
             "; Llama's MLP supports \"silu\" (SwiGLU) only.");
  read_field(j, "vocab_size", c.vocab_size);
  read_field(j, "hidden_size", c.hidden_size);
  read_field(j, "intermediate_size", c.intermediate_size);
  read_field(j, "num_hidden_layers", c.num_hidden_layers);
  read_field(j, "num_attention_heads", c.num_attention_heads);
  c.num_key_value_heads = c.num_attention_heads;  // HF: absent means multi-head attention
  if (j.contains("num_key_value_heads") && !j["num_key_value_heads"].is_null())
    read_field(j, "num_key_value_heads", c.num_key_value_heads);
  if (j.contains("head_dim") && !j["head_dim"].is_null()) read_field(j, "head_dim", c.head_dim);
  read_field(j, "max_position_embeddings", c.max_position_embeddings);
  read_field(j, "rms_norm_eps", c.rms_norm_eps);
  read_field(j, "rope_theta", c.rope_theta);
  read_rope(j, c);
  // Biases as transformers' classes have them: Qwen2Attention biases q/k/v and not o_proj, and
  // Mistral and Qwen2 have no attention_bias or mlp_bias setting (transformers ignores those keys
  // in their config.json, and so does this reader); Llama reads both.
  if (c.variant == LlamaVariant::kQwen2) {
    c.qkv_bias = true;
    c.o_bias = false;
  } else if (c.variant == LlamaVariant::kLlama) {
    bool attention_bias = false;
    read_field(j, "attention_bias", attention_bias);
    c.qkv_bias = c.o_bias = attention_bias;
    read_field(j, "mlp_bias", c.mlp_bias);
  }
  read_field(j, "tie_word_embeddings", c.tie_word_embeddings);
  read_field(j, "attention_dropout", c.attention_dropout);
  read_field(j, "initializer_range", c.initializer_range);
  std::string missing;
  for (const char* key : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                          "num_attention_heads", "max_position_embeddings"})
    if (!j.contains(key)) missing += detail::concat(missing.empty() ? "\"" : ", \"", key, "\"");
  TY_CHECK(missing.empty(), "config.json lacks ", missing,
           ", which give the model its size. HINT: use the config.json saved with the model's "
           "weights; it holds them all.");
  if (c.variant != LlamaVariant::kLlama)
    refuse_sliding_window(j,
                          c.variant == LlamaVariant::kMistral
                              ? WindowedLayers::kAll
                              : WindowedLayers::kFromMaxWindowLayers,
                          c.num_hidden_layers, c.max_position_embeddings);
  c.validate();
  return c;
}

std::string LlamaConfig::to_json() const {
  Json j = {
      {"architectures", {names_of(variant).hf_class}},
      {"model_type", model_type()},
      {"hidden_act", "silu"},
      {"vocab_size", vocab_size},
      {"hidden_size", hidden_size},
      {"intermediate_size", intermediate_size},
      {"num_hidden_layers", num_hidden_layers},
      {"num_attention_heads", num_attention_heads},
      {"num_key_value_heads", num_key_value_heads},
      {"max_position_embeddings", max_position_embeddings},
      {"rms_norm_eps", rms_norm_eps},
      {"rope_theta", rope_theta},
      {"mlp_bias", mlp_bias},
      {"tie_word_embeddings", tie_word_embeddings},
      {"attention_dropout", attention_dropout},
      {"initializer_range", initializer_range},
  };
  if (head_dim > 0) j["head_dim"] = head_dim;
  if (variant != LlamaVariant::kQwen2) j["attention_bias"] = qkv_bias;
  if (variant == LlamaVariant::kMistral) j["sliding_window"] = nullptr;
  if (variant == LlamaVariant::kQwen2) j["use_sliding_window"] = false;
  if (rope_scaling.type == RopeScaling::Type::kNone) {
    j["rope_scaling"] = nullptr;
  } else {
    j["rope_scaling"] = {{"rope_type", rope_type_name(rope_scaling.type)},
                         {"factor", rope_scaling.factor}};
    if (rope_scaling.type == RopeScaling::Type::kLlama3) {
      j["rope_scaling"]["low_freq_factor"] = rope_scaling.low_freq_factor;
      j["rope_scaling"]["high_freq_factor"] = rope_scaling.high_freq_factor;
      j["rope_scaling"]["original_max_position_embeddings"] =
          rope_scaling.original_max_position_embeddings;
    }
  }
  return j.dump(2);
}

void LlamaConfig::validate() const {
  auto positive = [](const char* field, std::int64_t value) {
    TY_CHECK(value >= 1, "LlamaConfig.", field, " must be >= 1, got ", value, ".");
  };
  positive("vocab_size", vocab_size);
  positive("hidden_size", hidden_size);
  positive("intermediate_size", intermediate_size);
  positive("num_attention_heads", num_attention_heads);
  positive("num_key_value_heads", num_key_value_heads);
  positive("max_position_embeddings", max_position_embeddings);
  TY_CHECK(num_hidden_layers >= 0, "LlamaConfig.num_hidden_layers must be >= 0, got ",
           num_hidden_layers, ".");
  TY_CHECK(head_dim > 0 || hidden_size % num_attention_heads == 0, "LlamaConfig.hidden_size (",
           hidden_size, ") must be divisible by num_attention_heads (", num_attention_heads,
           ") when head_dim is not given.");
  TY_CHECK(head_size() % 2 == 0, "LlamaConfig: the head size ", head_size(),
           " is odd; rotary embeddings rotate pairs of dimensions.");
  TY_CHECK(num_attention_heads % num_key_value_heads == 0, "LlamaConfig.num_attention_heads (",
           num_attention_heads, ") must be a multiple of num_key_value_heads (",
           num_key_value_heads, "): each key/value head serves the same number of query heads.");
  TY_CHECK(rms_norm_eps > 0 && std::isfinite(rms_norm_eps),
           "LlamaConfig.rms_norm_eps must be a positive number, got ", rms_norm_eps, ".");
  TY_CHECK(rope_theta > 0 && std::isfinite(rope_theta),
           "LlamaConfig.rope_theta must be a positive number, got ", rope_theta, ".");
  TY_CHECK(rope_scaling.factor > 0 && std::isfinite(rope_scaling.factor),
           "LlamaConfig.rope_scaling.factor must be a positive number, got ", rope_scaling.factor,
           ".");
  TY_CHECK(
      rope_scaling.type != RopeScaling::Type::kLlama3 ||
          (rope_scaling.high_freq_factor > rope_scaling.low_freq_factor &&
           rope_scaling.low_freq_factor > 0 && rope_scaling.original_max_position_embeddings >= 1),
      "LlamaConfig.rope_scaling (llama3) needs high_freq_factor > low_freq_factor > 0 and "
      "original_max_position_embeddings >= 1, got ",
      rope_scaling.high_freq_factor, ", ", rope_scaling.low_freq_factor, ", ",
      rope_scaling.original_max_position_embeddings, ".");
  TY_CHECK(attention_dropout >= 0 && attention_dropout < 1,
           "LlamaConfig.attention_dropout must be in [0, 1), got ", attention_dropout, ".");
  TY_CHECK(initializer_range >= 0 && std::isfinite(initializer_range),
           "LlamaConfig.initializer_range must be a number >= 0, got ", initializer_range, ".");
}

std::string_view LlamaConfig::model_type() const {
  return names_of(variant).model_type;
}

ParameterLayout LlamaConfig::parameter_layout() const {
  const auto h = hidden_size, i = intermediate_size;
  const auto q = num_attention_heads * head_size(), kv = num_key_value_heads * head_size();
  ParameterLayout p{.embedding = vocab_size * h,              // model.embed_tokens (and lm_head)
                    .layer = {q * h, kv * h, kv * h, h * q},  // q, k, v, o projections
                    .layer_norm_elements = 2 * h,
                    .num_layers = num_hidden_layers,
                    .final_norm = {h},  // model.norm
                    .tied = tie_word_embeddings};
  if (qkv_bias) p.layer.insert(p.layer.end(), {q, kv, kv});
  if (o_bias) p.layer.push_back(h);
  p.layer.insert(p.layer.end(), {i * h, i * h, h * i});  // gate, up, down projections
  if (mlp_bias) p.layer.insert(p.layer.end(), {i, i, h});
  p.layer.insert(p.layer.end(), {h, h});  // input_layernorm, post_attention_layernorm
  return p;
}

std::vector<LayerLinear> LlamaConfig::layer_linears() const {
  const auto h = hidden_size, i = intermediate_size;
  const auto q = num_attention_heads * head_size(), kv = num_key_value_heads * head_size();
  return {{"self_attn.q_proj", h, q}, {"self_attn.k_proj", h, kv}, {"self_attn.v_proj", h, kv},
          {"self_attn.o_proj", q, h}, {"mlp.gate_proj", h, i},     {"mlp.up_proj", h, i},
          {"mlp.down_proj", i, h}};
}

bool LlamaConfig::is_unused_checkpoint_tensor(std::string_view name) const {
  return name.ends_with(".self_attn.rotary_emb.inv_freq") || name == "model.rotary_emb.inv_freq" ||
         (tie_word_embeddings && name == "lm_head.weight");
}

// Note [Llama activations]
// What autograd keeps per Llama layer in trainyard's model (src/models/llama.cpp), counted as for
// GPT-NeoX, with q = heads x head_size and a = num_attention_heads:
//   each RMSNorm: its fp32 input (B,T,h) 4 (the layer input itself in fp32), the normalised
//   value cast back (B,T,h) c and its output (B,T,h) c (bf16: 8 BTh a norm; fp32: 12 BTh)
//   q and the repeated k in fp32 for the score matmul (B,T,q) 4 each; the repeated v (B,T,q) c
//   probs (B,a,T,T) 4, under bf16 also its bf16 copy (2); the attention output (B,T,q) c
//   gate_proj out, silu out, up_proj out and their product (B,T,i) c each
// bf16-mixed: 16 BTh + (8 + 2c) BTq + 4c BTi + 6 BaT^2; fp32 24 BTh + the same with c = 4 and
// 4 BaT^2. The rest of the step's: Note [Activations around the
// layers] in src/plan/memory_plan.cpp. These are counted from the code, not yet calibrated against
// measured peak RSS as GPT-NeoX's were (Note [CPU ranks]).
double LlamaConfig::layer_activation_bytes(const ActivationShape& shape) const {
  const double b = static_cast<double>(shape.micro_batch), t = static_cast<double>(shape.seq_len);
  const double bth = b * t * static_cast<double>(hidden_size);
  const double btq = b * t * static_cast<double>(num_attention_heads * head_size());
  const double bti = b * t * static_cast<double>(intermediate_size);
  const double bhtt = b * static_cast<double>(num_attention_heads) * t * t;
  const double c = shape.bf16 ? 2 : 4;
  return (shape.bf16 ? 16 : 24) * bth + (8 + 2 * c) * btq + 4 * c * bti +
         (shape.bf16 ? 6 : 4) * bhtt + 8 * b * t;
}

}  // namespace trainyard::models
