#include "trainyard/models/llama.h"

#include <torch/torch.h>

#include <cmath>
#include <numbers>

#include "models/transformer_parts.h"
#include "trainyard/error.h"
#include "trainyard/nn/unit_hook.h"

namespace trainyard::models {

std::optional<parts::ParamSpec> parts::llama_param_spec(const LlamaConfig& c,
                                                        std::string_view name) {
  const auto h = c.hidden_size, i = c.intermediate_size;
  const auto q = c.num_attention_heads * c.head_size();
  const auto kv = c.num_key_value_heads * c.head_size();
  auto dense = [](std::string_view field, std::int64_t in, std::int64_t out, bool bias) {
    return field == "bias" && !bias ? std::nullopt : parts::dense_spec(field, in, out);
  };
  auto norm = [h](std::string_view field) {
    return field == "weight" ? parts::norm_spec(field, h) : std::nullopt;
  };
  if (name == "model.embed_tokens.weight" || (name == "lm_head.weight" && !c.tie_word_embeddings))
    return parts::ParamSpec{parts::InitKind::kNormal, {c.vocab_size, h}};
  if (auto field = parts::after_prefix(name, "model.norm.")) return norm(*field);
  const auto p = parts::split_layer_name(name, "model.layers.", c.num_hidden_layers);
  if (!p) return std::nullopt;
  if (p->module == "input_layernorm" || p->module == "post_attention_layernorm")
    return norm(p->field);
  if (p->module == "self_attn.q_proj") return dense(p->field, h, q, c.qkv_bias);
  if (p->module == "self_attn.k_proj" || p->module == "self_attn.v_proj")
    return dense(p->field, h, kv, c.qkv_bias);
  if (p->module == "self_attn.o_proj") return dense(p->field, q, h, c.o_bias);
  if (p->module == "mlp.gate_proj" || p->module == "mlp.up_proj")
    return dense(p->field, h, i, c.mlp_bias);
  if (p->module == "mlp.down_proj") return dense(p->field, i, h, c.mlp_bias);
  return std::nullopt;
}

// Note [Llama 3 rotary scaling]
// Llama 3.1 and 3.2 stretch rotary embeddings past the 8192 positions they were trained on by
// wavelength (HF's _compute_llama3_parameters): with L = original_max_position_embeddings, a
// frequency whose wavelength 2*pi/f exceeds L / low_freq_factor is divided by `factor`, one
// shorter than L / high_freq_factor is kept, and those between are interpolated with
// s = (L / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor):
// (1 - s) * f / factor + s * f.
torch::Tensor llama_inv_freq(const LlamaConfig& c, const torch::Device& device) {
  const auto d = c.head_size();
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(device);
  auto inv_freq = 1.0 / torch::pow(c.rope_theta, torch::arange(0, d, 2, f32) / d);  // (d / 2)
  const auto& s = c.rope_scaling;
  switch (s.type) {
    case RopeScaling::Type::kNone:
      return inv_freq;
    case RopeScaling::Type::kLinear:
      return inv_freq / s.factor;
    case RopeScaling::Type::kLlama3: {
      const double old_len = static_cast<double>(s.original_max_position_embeddings);
      const double low_wavelen = old_len / s.low_freq_factor;
      const double high_wavelen = old_len / s.high_freq_factor;
      const auto wavelen = 2 * std::numbers::pi / inv_freq;
      auto scaled = torch::where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq);
      const auto smooth =
          (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      const auto smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled;
      const auto medium = (wavelen >= high_wavelen).logical_and(wavelen <= low_wavelen);
      return torch::where(medium, smoothed, scaled);
    }
  }
  return inv_freq;
}

LlamaAttentionImpl::LlamaAttentionImpl(const LlamaConfig& c, const torch::TensorOptions& options)
    : num_heads_(c.num_attention_heads),
      num_kv_heads_(c.num_key_value_heads),
      head_size_(c.head_size()),
      attention_dropout_(c.attention_dropout) {
  const auto h = c.hidden_size, q = num_heads_ * head_size_, kv = num_kv_heads_ * head_size_;
  q_proj = register_module("q_proj", Dense(h, q, c.qkv_bias, options));
  k_proj = register_module("k_proj", Dense(h, kv, c.qkv_bias, options));
  v_proj = register_module("v_proj", Dense(h, kv, c.qkv_bias, options));
  o_proj = register_module("o_proj", Dense(q, h, c.o_bias, options));
}

torch::Tensor LlamaAttentionImpl::forward_cached(const torch::Tensor& x,
                                                 const torch::Tensor& inv_freq,
                                                 KvCache::Layer* cache) {
  TY_CHECK(x.dim() == 3, "LlamaAttention expects (batch, seq, hidden) input, got ", x.sizes(), ".");
  const auto hs = head_size_;
  return o_proj->forward(
      parts::rotary_gqa_attention(parts::split_heads(q_proj->forward(x), num_heads_, hs),
                                  parts::split_heads(k_proj->forward(x), num_kv_heads_, hs),
                                  parts::split_heads(v_proj->forward(x), num_kv_heads_, hs),
                                  inv_freq, cache, attention_dropout_, is_training()));
}

LlamaMlpImpl::LlamaMlpImpl(const LlamaConfig& c, const torch::TensorOptions& options) {
  const auto h = c.hidden_size, i = c.intermediate_size;
  gate_proj = register_module("gate_proj", Dense(h, i, c.mlp_bias, options));
  up_proj = register_module("up_proj", Dense(h, i, c.mlp_bias, options));
  down_proj = register_module("down_proj", Dense(i, h, c.mlp_bias, options));
}

torch::Tensor LlamaMlpImpl::forward(const torch::Tensor& x) {
  return down_proj->forward(torch::silu(gate_proj->forward(x)) * up_proj->forward(x));
}

LlamaDecoderLayerImpl::LlamaDecoderLayerImpl(const LlamaConfig& c,
                                             const torch::TensorOptions& options)
    : config_(c) {
  // HF's registration order, which named_parameters() follows.
  self_attn = register_module("self_attn", LlamaAttention(c, options));
  mlp = register_module("mlp", LlamaMlp(c, options));
  input_layernorm =
      register_module("input_layernorm", RmsNorm(c.hidden_size, c.rms_norm_eps, options));
  post_attention_layernorm =
      register_module("post_attention_layernorm", RmsNorm(c.hidden_size, c.rms_norm_eps, options));
}

torch::Tensor LlamaDecoderLayerImpl::forward_cached(const torch::Tensor& x, KvCache::Layer* cache) {
  // The rotary table is recomputed per layer: d/2 values, nothing next to the attention, and the
  // layer stays a function of its input alone for activation checkpointing.
  const auto inv_freq = llama_inv_freq(config_, x.device());
  const auto h = x + self_attn->forward_cached(input_layernorm->forward(x), inv_freq, cache);
  return h + mlp->forward(post_attention_layernorm->forward(h));
}

LlamaModelImpl::LlamaModelImpl(const LlamaConfig& c, const torch::TensorOptions& options) {
  embed_tokens = register_module("embed_tokens", Embedding(c.vocab_size, c.hidden_size, options));
  layers = register_module("layers", torch::nn::ModuleList());
  for (std::int64_t i = 0; i < c.num_hidden_layers; ++i)
    layers->push_back(LlamaDecoderLayer(c, options));
  norm = register_module("norm", RmsNorm(c.hidden_size, c.rms_norm_eps, options));
}

LlamaDecoderLayerImpl& LlamaModelImpl::layer(std::int64_t index) {
  TY_CHECK(index >= 0 && index < num_layers(), "Llama layer index ", index, " is out of range for ",
           num_layers(), " layers.");
  return *layers->ptr<LlamaDecoderLayerImpl>(static_cast<std::size_t>(index));
}

LlamaImpl::LlamaImpl(LlamaConfig config, CausalLmInit init)
    : CausalLmImpl(config, init.seed), config_(std::move(config)) {
  config_.validate();
  TY_CHECK(!init.deferred || init.device.is_cpu(),
           "CausalLmInit: deferred parameters are CPU tensors; leave device at kCPU (got ",
           init.device, ").");
  const auto options = torch::TensorOptions().dtype(torch::kFloat32).device(init.device);
  {
    DeferredParameters deferred(init.deferred);
    model = register_module("model", LlamaModel(config_, options));
    if (!config_.tie_word_embeddings)
      lm_head = register_module(
          "lm_head", Dense(config_.hidden_size, config_.vocab_size, /*bias=*/false, options));
    if (init.lora) add_lora(*init.lora, options);
  }
  initialise(init);
}

torch::Tensor LlamaImpl::logits(const torch::Tensor& hidden) {
  if (config_.tie_word_embeddings)  // in the root unit with the embedding (unit_names())
    return torch::linear(hidden, model->embed_tokens->weight);
  return parts::call_as_unit(lm_head.ptr(), hidden);
}

torch::Tensor LlamaImpl::forward(const torch::Tensor& input_ids) {
  parts::check_token_ids(input_ids, 0, config_.max_position_embeddings, "Llama");
  // The embeddings, like the layers, are called as units, so a wrapper may shard them too.
  auto x = parts::call_as_unit(model->embed_tokens.ptr(), input_ids);
  x = parts::call_layers<LlamaDecoderLayerImpl>(model->layers, x);
  return logits(model->norm->forward(x));  // (B, T, vocab_size)
}

torch::Tensor LlamaImpl::forward_cached(const torch::Tensor& input_ids, KvCache& cache) {
  parts::check_token_ids(input_ids, cache.length(), config_.max_position_embeddings, "Llama");
  auto x = model->embed_tokens->forward(input_ids);
  x = parts::call_layers_cached<LlamaDecoderLayerImpl>(model->layers, x, cache);
  return logits(model->norm->forward(x)).to(torch::kFloat32);
}

void LlamaImpl::init_parameter(const std::string& full_name, torch::Tensor& tensor) const {
  const auto spec = parts::spec_with_lora(
      *this, full_name, [this](std::string_view n) { return parts::llama_param_spec(config_, n); });
  parts::init_from_spec(spec, full_name, tensor, seed(), config_.initializer_range, "Llama",
                        config_.num_hidden_layers);
}

bool LlamaImpl::is_layer(const torch::nn::Module& module) const {
  return dynamic_cast<const LlamaDecoderLayerImpl*>(&module) != nullptr;
}

std::vector<std::string> LlamaImpl::unit_names() const {
  if (config_.tie_word_embeddings) return {};
  return {"model.embed_tokens", "lm_head"};
}

CausalLm make_model(const LlamaConfig& config, CausalLmInit init) {
  return CausalLm(
      std::shared_ptr<CausalLmImpl>(std::make_shared<LlamaImpl>(config, std::move(init))));
}

}  // namespace trainyard::models
