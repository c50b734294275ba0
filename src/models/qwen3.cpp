#include "trainyard/models/qwen3.h"

#include <torch/torch.h>

#include "models/transformer_parts.h"
#include "trainyard/error.h"

namespace trainyard::models {
namespace {

// Llama's parameters plus each layer's self_attn.q_norm and self_attn.k_norm (head_dim).
std::optional<parts::ParamSpec> param_spec(const Qwen3Config& c, std::string_view name) {
  const auto p = parts::split_layer_name(name, "model.layers.", c.num_hidden_layers);
  if (p && (p->module == "self_attn.q_norm" || p->module == "self_attn.k_norm"))
    return p->field == "weight" ? parts::norm_spec(p->field, c.llama().head_size()) : std::nullopt;
  return parts::llama_param_spec(c.llama(), name);
}

}  // namespace

Qwen3AttentionImpl::Qwen3AttentionImpl(const Qwen3Config& c, const torch::TensorOptions& options)
    : num_heads_(c.num_attention_heads),
      num_kv_heads_(c.num_key_value_heads),
      head_size_(c.llama().head_size()),
      attention_dropout_(c.attention_dropout) {
  const auto h = c.hidden_size, q = num_heads_ * head_size_, kv = num_kv_heads_ * head_size_;
  const bool bias = c.attention_bias;
  q_proj = register_module("q_proj", Dense(h, q, bias, options));
  k_proj = register_module("k_proj", Dense(h, kv, bias, options));
  v_proj = register_module("v_proj", Dense(h, kv, bias, options));
  o_proj = register_module("o_proj", Dense(q, h, bias, options));
  q_norm = register_module("q_norm", RmsNorm(head_size_, c.rms_norm_eps, options));
  k_norm = register_module("k_norm", RmsNorm(head_size_, c.rms_norm_eps, options));
}

torch::Tensor Qwen3AttentionImpl::forward_cached(const torch::Tensor& x,
                                                 const torch::Tensor& inv_freq,
                                                 KvCache::Layer* cache) {
  TY_CHECK(x.dim() == 3, "Qwen3Attention expects (batch, seq, hidden) input, got ", x.sizes(), ".");
  const auto hs = head_size_;
  // As HF's: each head normalised over its head_dim, then split into (B, heads, T, head_dim).
  auto heads = [hs](const torch::Tensor& y, RmsNorm& norm, std::int64_t n) {
    return norm->forward(y.view({y.size(0), y.size(1), n, hs})).transpose(1, 2);
  };
  return o_proj->forward(
      parts::rotary_gqa_attention(heads(q_proj->forward(x), q_norm, num_heads_),
                                  heads(k_proj->forward(x), k_norm, num_kv_heads_),
                                  parts::split_heads(v_proj->forward(x), num_kv_heads_, hs),
                                  inv_freq, cache, attention_dropout_, is_training()));
}

Qwen3DecoderLayerImpl::Qwen3DecoderLayerImpl(const Qwen3Config& c,
                                             const torch::TensorOptions& options)
    : rotary_(c.llama()) {
  // HF's registration order, which named_parameters() follows.
  self_attn = register_module("self_attn", Qwen3Attention(c, options));
  mlp = register_module("mlp", LlamaMlp(rotary_, options));
  input_layernorm =
      register_module("input_layernorm", RmsNorm(c.hidden_size, c.rms_norm_eps, options));
  post_attention_layernorm =
      register_module("post_attention_layernorm", RmsNorm(c.hidden_size, c.rms_norm_eps, options));
}

torch::Tensor Qwen3DecoderLayerImpl::forward_cached(const torch::Tensor& x, KvCache::Layer* cache) {
  // As LlamaDecoderLayerImpl's: the rotary table per layer keeps the layer a function of its input.
  const auto inv_freq = llama_inv_freq(rotary_, x.device());
  const auto h = x + self_attn->forward_cached(input_layernorm->forward(x), inv_freq, cache);
  return h + mlp->forward(post_attention_layernorm->forward(h));
}

Qwen3ModelImpl::Qwen3ModelImpl(const Qwen3Config& c, const torch::TensorOptions& options) {
  embed_tokens = register_module("embed_tokens", Embedding(c.vocab_size, c.hidden_size, options));
  layers = register_module("layers", torch::nn::ModuleList());
  for (std::int64_t i = 0; i < c.num_hidden_layers; ++i)
    layers->push_back(Qwen3DecoderLayer(c, options));
  norm = register_module("norm", RmsNorm(c.hidden_size, c.rms_norm_eps, options));
}

Qwen3Impl::Qwen3Impl(Qwen3Config config, CausalLmInit init)
    : CausalLmImpl(config, init.seed), config_(std::move(config)) {
  config_.validate();
  TY_CHECK(!init.deferred || init.device.is_cpu(),
           "CausalLmInit: deferred parameters are CPU tensors; leave device at kCPU (got ",
           init.device, ").");
  const auto options = torch::TensorOptions().dtype(torch::kFloat32).device(init.device);
  {
    DeferredParameters deferred(init.deferred);
    model = register_module("model", Qwen3Model(config_, options));
    if (!config_.tie_word_embeddings)
      lm_head = register_module(
          "lm_head", Dense(config_.hidden_size, config_.vocab_size, /*bias=*/false, options));
    if (init.lora) add_lora(*init.lora, options);
  }
  initialise(init);
}

torch::Tensor Qwen3Impl::logits(const torch::Tensor& hidden) {
  if (config_.tie_word_embeddings)  // in the root unit with the embedding (unit_names())
    return torch::linear(hidden, model->embed_tokens->weight);
  return parts::call_as_unit(lm_head.ptr(), hidden);
}

torch::Tensor Qwen3Impl::forward(const torch::Tensor& input_ids) {
  parts::check_token_ids(input_ids, 0, config_.max_position_embeddings, "Qwen3");
  auto x = parts::call_as_unit(model->embed_tokens.ptr(), input_ids);
  x = parts::call_layers<Qwen3DecoderLayerImpl>(model->layers, x);
  return logits(model->norm->forward(x));  // (B, T, vocab_size)
}

torch::Tensor Qwen3Impl::forward_cached(const torch::Tensor& input_ids, KvCache& cache) {
  parts::check_token_ids(input_ids, cache.length(), config_.max_position_embeddings, "Qwen3");
  auto x = model->embed_tokens->forward(input_ids);
  x = parts::call_layers_cached<Qwen3DecoderLayerImpl>(model->layers, x, cache);
  return logits(model->norm->forward(x)).to(torch::kFloat32);
}

void Qwen3Impl::init_parameter(const std::string& full_name, torch::Tensor& tensor) const {
  const auto spec = parts::spec_with_lora(
      *this, full_name, [this](std::string_view n) { return param_spec(config_, n); });
  parts::init_from_spec(spec, full_name, tensor, seed(), config_.initializer_range, "Qwen3",
                        config_.num_hidden_layers);
}

bool Qwen3Impl::is_layer(const torch::nn::Module& module) const {
  return dynamic_cast<const Qwen3DecoderLayerImpl*>(&module) != nullptr;
}

std::vector<std::string> Qwen3Impl::unit_names() const {
  if (config_.tie_word_embeddings) return {};
  return {"model.embed_tokens", "lm_head"};
}

CausalLm make_model(const Qwen3Config& config, CausalLmInit init) {
  return CausalLm(
      std::shared_ptr<CausalLmImpl>(std::make_shared<Qwen3Impl>(config, std::move(init))));
}

}  // namespace trainyard::models
