#include "trainyard/models/llama.h"

#include <torch/torch.h>

#include <cmath>
#include <numbers>

#include "models/transformer_parts.h"
#include "trainyard/error.h"
#include "trainyard/nn/unit_hook.h"

namespace trainyard::models {
namespace {

// What the parameter `name` of Llama(config) is, or nullopt when there is none by that name.
std::optional<parts::ParamSpec> param_spec(const LlamaConfig& c, std::string_view name) {
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

// (B, kv_heads, T, d) -> (B, kv_heads * n, T, d), each key/value head repeated for the n query
// heads it serves (HF's repeat_kv).
torch::Tensor repeat_kv(const torch::Tensor& x, std::int64_t n) {
  if (n == 1) return x;
  const auto b = x.size(0), kv = x.size(1), t = x.size(2), d = x.size(3);
  return x.unsqueeze(2).expand({b, kv, n, t, d}).reshape({b, kv * n, t, d});
}

}  // namespace

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
  const auto batch = x.size(0), seq = x.size(1), hs = head_size_;
  const std::int64_t past = cache != nullptr && cache->key.defined() ? cache->key.size(2) : 0;
  // (B, heads, T, head_size) each.
  auto q = q_proj->forward(x).view({batch, seq, num_heads_, hs}).transpose(1, 2);
  auto k = k_proj->forward(x).view({batch, seq, num_kv_heads_, hs}).transpose(1, 2);
  auto v = v_proj->forward(x).view({batch, seq, num_kv_heads_, hs}).transpose(1, 2);
  const auto [cos, sin] = parts::rotary_cos_sin(inv_freq, past, seq, q.scalar_type());
  q = parts::apply_rotary(q, cos, sin, hs);
  k = parts::apply_rotary(k, cos, sin, hs);
  if (cache != nullptr) {  // the cache keeps the key/value heads, not their repeats
    if (past > 0) {
      k = torch::cat({cache->key, k}, 2);
      v = torch::cat({cache->value, v}, 2);
    }
    cache->key = k;
    cache->value = v;
  }
  const auto groups = num_heads_ / num_kv_heads_;
  return o_proj->forward(parts::causal_attention(q, repeat_kv(k, groups), repeat_kv(v, groups),
                                                 attention_dropout_, is_training()));
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

void LlamaImpl::check_ids(const torch::Tensor& input_ids, std::int64_t past) const {
  TY_CHECK(input_ids.dim() == 2 && input_ids.scalar_type() == torch::kInt64,
           "Llama expects (batch, seq) int64 token ids, got ", input_ids.sizes(), " ",
           input_ids.scalar_type(), ".");
  TY_CHECK(past + input_ids.size(1) <= config_.max_position_embeddings, "Llama got ",
           past + input_ids.size(1), " positions; max_position_embeddings is ",
           config_.max_position_embeddings, ".");
}

torch::Tensor LlamaImpl::logits(const torch::Tensor& hidden) {
  if (config_.tie_word_embeddings)  // in the root unit with the embedding (unit_names())
    return torch::linear(hidden, model->embed_tokens->weight);
  auto head = lm_head.ptr();
  return trainyard::nn::call_unit(*head, hidden,
                                  [head](const torch::Tensor& h) { return head->forward(h); });
}

torch::Tensor LlamaImpl::forward(const torch::Tensor& input_ids) {
  check_ids(input_ids, 0);
  auto& m = *model;
  // The embeddings, like the layers, are called as units, so a wrapper may shard them too.
  auto embed = m.embed_tokens.ptr();
  auto x = trainyard::nn::call_unit(
      *embed, input_ids, [embed](const torch::Tensor& ids) { return embed->forward(ids); });
  for (std::int64_t i = 0; i < m.num_layers(); ++i) {
    // The unit's forward holds the layer by value: a hook may call it again in backward
    // (activation checkpointing), after this frame is gone.
    auto unit = m.layers->ptr<LlamaDecoderLayerImpl>(static_cast<std::size_t>(i));
    x = trainyard::nn::call_unit(*unit, x,
                                 [unit](const torch::Tensor& h) { return unit->forward(h); });
  }
  return logits(m.norm->forward(x));  // (B, T, vocab_size)
}

torch::Tensor LlamaImpl::forward_cached(const torch::Tensor& input_ids, KvCache& cache) {
  auto& m = *model;
  check_ids(input_ids, cache.length());
  cache.layers.resize(static_cast<std::size_t>(m.num_layers()));
  auto x = m.embed_tokens->forward(input_ids);
  for (std::int64_t i = 0; i < m.num_layers(); ++i)
    x = m.layer(i).forward_cached(x, &cache.layers[static_cast<std::size_t>(i)]);
  return logits(m.norm->forward(x)).to(torch::kFloat32);
}

void LlamaImpl::init_parameter(const std::string& full_name, torch::Tensor& tensor) const {
  const auto spec = parts::spec_with_lora(
      *this, full_name, [this](std::string_view n) { return param_spec(config_, n); });
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

}  // namespace trainyard::models
