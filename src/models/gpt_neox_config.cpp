#include "trainyard/models/gpt_neox_config.h"

#include <nlohmann/json.hpp>

#include "models/config_fields.h"
#include "trainyard/error.h"

#include <cmath>

namespace trainyard::models {
namespace {

// --- presets and config.json -------------------------------------------------------------------

GptNeoXConfig pythia(std::int64_t vocab,
                     std::int64_t hidden,
                     std::int64_t layers,
                     std::int64_t heads,
                     std::int64_t intermediate) {
  return GptNeoXConfig{.vocab_size = vocab,
                       .hidden_size = hidden,
                       .num_hidden_layers = layers,
                       .num_attention_heads = heads,
                       .intermediate_size = intermediate,
                       .rotary_pct = 0.25,
                       .rotary_emb_base = 10000,
                       .max_position_embeddings = 2048};
}

using Preset = NamedPreset<GptNeoXConfig>;

const std::vector<Preset>& presets() {
  static const std::vector<Preset> all = {
      {"pythia-14m", pythia(50304, 128, 6, 4, 512)},
      {"pythia-70m", pythia(50304, 512, 6, 8, 2048)},
      {"pythia-160m", pythia(50304, 768, 12, 12, 3072)},
      {"pythia-410m", pythia(50304, 1024, 24, 16, 4096)},
      {"pythia-1b", pythia(50304, 2048, 16, 8, 8192)},
      {"dolly-v2-7b", pythia(50280, 4096, 32, 32, 16384)},
      // For tests: head_size 8 with rotary_pct 0.5 rotates 4 dimensions (two frequencies).
      {"tiny", GptNeoXConfig{.vocab_size = 128,
                             .hidden_size = 32,
                             .num_hidden_layers = 2,
                             .num_attention_heads = 4,
                             .intermediate_size = 64,
                             .rotary_pct = 0.5,
                             .max_position_embeddings = 64}},
  };
  return all;
}

// Newer transformers releases spell some fields differently; either spelling is accepted, both
// only when they agree.
void read_alias(const Json& j, const char* key, const char* alias, double& out) {
  read_field(j, key, out);
  if (!j.contains(alias)) return;
  double value = out;
  read_field(j, alias, value);
  TY_CHECK(!j.contains(key) || value == out, "config.json: \"", key, "\" (", out, ") and \"", alias,
           "\" (", value, ") disagree.");
  out = value;
}

}  // namespace

// --- GptNeoXConfig -----------------------------------------------------------------------------

GptNeoXConfig GptNeoXConfig::preset(const std::string& name) {
  return find_preset(presets(), name, "GPT-NeoX");
}

std::vector<std::string> GptNeoXConfig::preset_names() {
  return names_of(presets());
}

GptNeoXConfig GptNeoXConfig::from_json(const Json& j) {
  if (j.contains("hidden_act")) {
    TY_CHECK(j["hidden_act"] == "gelu", "config.json: \"hidden_act\" is ", j["hidden_act"].dump(),
             "; GptNeoX supports \"gelu\" (exact erf GELU) only.");
  }
  TY_CHECK(!j.contains("tie_word_embeddings") || j["tie_word_embeddings"] == false,
           "config.json: \"tie_word_embeddings\" is ",
           j.value("tie_word_embeddings", Json()).dump(),
           "; GptNeoX keeps embed_out separate from embed_in and does not support tied weights.");
  TY_CHECK(!j.contains("rope_scaling") || j["rope_scaling"].is_null(),
           "config.json: \"rope_scaling\" is ", j.value("rope_scaling", Json()).dump(),
           "; GptNeoX does not support scaled rotary embeddings.");
  TY_CHECK(!j.contains("attention_bias") || j["attention_bias"] == true,
           "config.json: \"attention_bias\" is ", j.value("attention_bias", Json()).dump(),
           "; GptNeoX does not support attention projections without bias.");

  GptNeoXConfig c;
  read_field(j, "vocab_size", c.vocab_size);
  read_field(j, "hidden_size", c.hidden_size);
  read_field(j, "num_hidden_layers", c.num_hidden_layers);
  read_field(j, "num_attention_heads", c.num_attention_heads);
  read_field(j, "intermediate_size", c.intermediate_size);
  read_alias(j, "rotary_pct", "partial_rotary_factor", c.rotary_pct);
  read_alias(j, "rotary_emb_base", "rope_theta", c.rotary_emb_base);
  // transformers 5 writes the rotary settings into "rope_parameters" instead (save_pretrained of
  // a GPTNeoXConfig has no top-level rotary_pct or rotary_emb_base): read there too, or a saved
  // folder would silently get the defaults.
  if (const auto it = j.find("rope_parameters"); it != j.end() && !it->is_null()) {
    TY_CHECK(it->is_object(), "config.json: \"rope_parameters\" must be an object, got ",
             it->dump(), ".");
    const std::string type = it->value("rope_type", std::string("default"));
    TY_CHECK(type == "default", "config.json: \"rope_parameters\" has rope_type \"", type,
             "\"; GptNeoX supports the default rotary embeddings only.");
    read_field(*it, "partial_rotary_factor", c.rotary_pct);
    read_field(*it, "rope_theta", c.rotary_emb_base);
  }
  read_field(j, "max_position_embeddings", c.max_position_embeddings);
  read_field(j, "layer_norm_eps", c.layer_norm_eps);
  read_field(j, "use_parallel_residual", c.use_parallel_residual);
  read_field(j, "hidden_dropout", c.hidden_dropout);
  read_field(j, "attention_dropout", c.attention_dropout);
  read_field(j, "initializer_range", c.initializer_range);
  // Hugging Face's defaults for these describe a 20B model: a config.json without them would
  // build one (tens of GB) instead of the model meant. The rest have harmless defaults.
  std::string missing;
  for (const char* key : {"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                          "intermediate_size", "max_position_embeddings"})
    if (!j.contains(key)) missing += detail::concat(missing.empty() ? "\"" : ", \"", key, "\"");
  TY_CHECK(missing.empty(), "config.json lacks ", missing,
           ", which give the model its size (Hugging Face's defaults for them describe a 20B "
           "model). HINT: use the config.json saved with the model's weights; it holds them all.");
  c.validate();
  return c;
}

std::string GptNeoXConfig::to_json() const {
  Json j = {
      {"architectures", {"GPTNeoXForCausalLM"}},
      {"model_type", "gpt_neox"},
      {"hidden_act", "gelu"},
      {"tie_word_embeddings", false},
      {"vocab_size", vocab_size},
      {"hidden_size", hidden_size},
      {"num_hidden_layers", num_hidden_layers},
      {"num_attention_heads", num_attention_heads},
      {"intermediate_size", intermediate_size},
      {"rotary_pct", rotary_pct},
      {"rotary_emb_base", rotary_emb_base},
      {"max_position_embeddings", max_position_embeddings},
      {"layer_norm_eps", layer_norm_eps},
      {"use_parallel_residual", use_parallel_residual},
      {"hidden_dropout", hidden_dropout},
      {"attention_dropout", attention_dropout},
      {"initializer_range", initializer_range},
  };
  return j.dump(2);
}

void GptNeoXConfig::validate() const {
  TY_CHECK(vocab_size >= 1, "GptNeoXConfig.vocab_size must be >= 1, got ", vocab_size, ".");
  TY_CHECK(hidden_size >= 1, "GptNeoXConfig.hidden_size must be >= 1, got ", hidden_size, ".");
  TY_CHECK(num_hidden_layers >= 0, "GptNeoXConfig.num_hidden_layers must be >= 0, got ",
           num_hidden_layers, ".");
  TY_CHECK(num_attention_heads >= 1, "GptNeoXConfig.num_attention_heads must be >= 1, got ",
           num_attention_heads, ".");
  TY_CHECK(hidden_size % num_attention_heads == 0, "GptNeoXConfig.hidden_size (", hidden_size,
           ") must be divisible by num_attention_heads (", num_attention_heads, ").");
  TY_CHECK(intermediate_size >= 1, "GptNeoXConfig.intermediate_size must be >= 1, got ",
           intermediate_size, ".");
  TY_CHECK(rotary_pct >= 0 && rotary_pct <= 1, "GptNeoXConfig.rotary_pct must be in [0, 1], got ",
           rotary_pct, ".");
  TY_CHECK(rotary_ndims() % 2 == 0, "GptNeoXConfig.rotary_pct (", rotary_pct,
           ") gives an odd number of rotary dimensions per head: int(head_size ", head_size(),
           " * rotary_pct) = ", rotary_ndims(), ". HINT: rotate-half needs an even count.");
  TY_CHECK(rotary_emb_base > 0 && std::isfinite(rotary_emb_base),
           "GptNeoXConfig.rotary_emb_base must be a positive number, got ", rotary_emb_base, ".");
  TY_CHECK(max_position_embeddings >= 1, "GptNeoXConfig.max_position_embeddings must be >= 1, got ",
           max_position_embeddings, ".");
  TY_CHECK(layer_norm_eps > 0 && std::isfinite(layer_norm_eps),
           "GptNeoXConfig.layer_norm_eps must be a positive number, got ", layer_norm_eps, ".");
  TY_CHECK(hidden_dropout >= 0 && hidden_dropout < 1,
           "GptNeoXConfig.hidden_dropout must be in [0, 1), got ", hidden_dropout, ".");
  TY_CHECK(attention_dropout >= 0 && attention_dropout < 1,
           "GptNeoXConfig.attention_dropout must be in [0, 1), got ", attention_dropout, ".");
  TY_CHECK(initializer_range >= 0 && std::isfinite(initializer_range),
           "GptNeoXConfig.initializer_range must be a number >= 0, got ", initializer_range, ".");
}

std::int64_t GptNeoXConfig::rotary_ndims() const {
  return static_cast<std::int64_t>(static_cast<double>(head_size()) * rotary_pct);
}

ParameterLayout GptNeoXConfig::parameter_layout() const {
  const auto h = hidden_size, i = intermediate_size;
  return {.embedding = vocab_size * h,           // gpt_neox.embed_in, embed_out
          .layer = {h, h, h, h,                  // input_, post_attention_layernorm
                    3 * h * h, 3 * h, h * h, h,  // attention.query_key_value, dense
                    i * h, i, h * i, h},         // mlp.dense_h_to_4h, dense_4h_to_h
          .layer_norm_elements = 4 * h,
          .num_layers = num_hidden_layers,
          .final_norm = {h, h},  // gpt_neox.final_layer_norm
          .tied = false};
}

std::vector<LayerLinear> GptNeoXConfig::layer_linears() const {
  const auto h = hidden_size, i = intermediate_size;
  return {{"attention.query_key_value", h, 3 * h},
          {"attention.dense", h, h},
          {"mlp.dense_h_to_4h", h, i},
          {"mlp.dense_4h_to_h", i, h}};
}

bool GptNeoXConfig::is_unused_checkpoint_tensor(std::string_view name) {
  for (std::string_view suffix :
       {".attention.rotary_emb.inv_freq", ".attention.bias", ".attention.masked_bias"})
    if (name.ends_with(suffix)) return true;
  return false;
}

// Note [GPT-NeoX activations]
// What autograd keeps per GPT-NeoX layer in trainyard's model (src/models/gpt_neox.cpp), for a
// micro-batch of B sequences of T tokens, hidden h, intermediate i, H heads, c bytes per compute
// element:
//   layer input x (B,T,h) c       kept by both layer norms
//   input_layernorm out (B,T,h) c kept by query_key_value
//   qkv (B,T,3h) c                v is a view of it, kept by probs @ v
//   q, k rotated, in fp32 (B,T,h) 4 each: kept by the fp32 score matmul
//   probs (B,H,T,T) 4             kept by softmax; under bf16 also its bf16 copy (2) for @ v
//   attention output (B,T,h) c    reshaped copy, kept by dense
//   post_attention_layernorm out (B,T,h) c   kept by dense_h_to_4h
//   dense_h_to_4h out, gelu out (B,T,i) c each
//   layer norm statistics 2 x 2 x (B,T) fp32
// fp32: 36 BTh + 8 BTi + 4 BHT^2 bytes; bf16-mixed: 22 BTh + 4 BTi + 6 BHT^2. DDP's autocast
// keeps its layer norms and residual stream in fp32: 24 BTh + 4 BTi + 6 BHT^2 (the planner
// counts FSDP's). The rest of the step's activations: Note [Activations around the layers] in
// src/plan/memory_plan.cpp.
double GptNeoXConfig::layer_activation_bytes(const ActivationShape& shape) const {
  const double b = static_cast<double>(shape.micro_batch), t = static_cast<double>(shape.seq_len);
  const double bth = b * t * static_cast<double>(hidden_size);
  const double bti = b * t * static_cast<double>(intermediate_size);
  const double bhtt = b * static_cast<double>(num_attention_heads) * t * t;
  const double c = shape.bf16 ? 2 : 4;
  return (shape.bf16 ? 22 : 36) * bth + 2 * c * bti + (shape.bf16 ? 6 : 4) * bhtt + 16 * b * t;
}

}  // namespace trainyard::models
