#include "trainyard/models/gpt_neox.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "models/transformer_parts.h"
#include "trainyard/error.h"
#include "trainyard/nn/unit_hook.h"

#include <optional>

namespace trainyard::models {
namespace {

using parts::maybe_dropout;

// What the parameter `name` of GptNeoX(config) is, or nullopt when there is none by that name.
std::optional<parts::ParamSpec> param_spec(const GptNeoXConfig& c, std::string_view name) {
  const auto h = c.hidden_size;
  if (name == "gpt_neox.embed_in.weight" || name == "embed_out.weight")
    return parts::ParamSpec{parts::InitKind::kNormal, {c.vocab_size, h}};
  if (auto field = parts::after_prefix(name, "gpt_neox.final_layer_norm."))
    return parts::norm_spec(*field, h);
  const auto p = parts::split_layer_name(name, "gpt_neox.layers.", c.num_hidden_layers);
  if (!p) return std::nullopt;
  if (p->module == "input_layernorm" || p->module == "post_attention_layernorm")
    return parts::norm_spec(p->field, h);
  if (p->module == "attention.query_key_value") return parts::dense_spec(p->field, h, 3 * h);
  if (p->module == "attention.dense") return parts::dense_spec(p->field, h, h);
  if (p->module == "mlp.dense_h_to_4h") return parts::dense_spec(p->field, h, c.intermediate_size);
  if (p->module == "mlp.dense_4h_to_h") return parts::dense_spec(p->field, c.intermediate_size, h);
  return std::nullopt;
}

}  // namespace

// --- attention, MLP, layer ---------------------------------------------------------------------

GptNeoXAttentionImpl::GptNeoXAttentionImpl(const GptNeoXConfig& config,
                                           const torch::TensorOptions& options)
    : num_heads_(config.num_attention_heads),
      head_size_(config.head_size()),
      rotary_ndims_(config.rotary_ndims()),
      rotary_base_(config.rotary_emb_base),
      attention_dropout_(config.attention_dropout) {
  const auto h = config.hidden_size;
  query_key_value = register_module("query_key_value", Dense(h, 3 * h, /*bias=*/true, options));
  dense = register_module("dense", Dense(h, h, /*bias=*/true, options));
}

torch::Tensor GptNeoXAttentionImpl::forward_cached(const torch::Tensor& x, KvCache::Layer* cache) {
  TY_CHECK(x.dim() == 3, "GptNeoXAttention expects (batch, seq, hidden) input, got ", x.sizes(),
           ".");
  const auto batch = x.size(0), seq = x.size(1), hs = head_size_;
  const std::int64_t past = cache != nullptr && cache->key.defined() ? cache->key.size(2) : 0;
  // Per head [q|k|v]: (B, T, heads, 3 * head_size), each part (B, heads, T, head_size).
  const auto qkv = query_key_value->forward(x).view({batch, seq, num_heads_, 3 * hs});
  auto q = qkv.narrow(-1, 0, hs).permute({0, 2, 1, 3});
  auto k = qkv.narrow(-1, hs, hs).permute({0, 2, 1, 3});
  auto v = qkv.narrow(-1, 2 * hs, hs).permute({0, 2, 1, 3});
  if (rotary_ndims_ > 0) {
    // HF's inv_freq = 1 / base^(arange(0, dim, 2) / dim) over the rotated dimensions.
    const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(x.device());
    const auto inv_freq =
        1.0 / torch::pow(rotary_base_, torch::arange(0, rotary_ndims_, 2, f32) / rotary_ndims_);
    const auto [cos, sin] = parts::rotary_cos_sin(inv_freq, past, seq, q.scalar_type());
    q = parts::apply_rotary(q, cos, sin, rotary_ndims_);
    k = parts::apply_rotary(k, cos, sin, rotary_ndims_);
  }
  if (cache != nullptr) {
    if (past > 0) {
      k = torch::cat({cache->key, k}, 2);
      v = torch::cat({cache->value, v}, 2);
    }
    cache->key = k;
    cache->value = v;
  }
  return dense->forward(parts::causal_attention(q, k, v, attention_dropout_, is_training()));
}

GptNeoXMlpImpl::GptNeoXMlpImpl(const GptNeoXConfig& config, const torch::TensorOptions& options) {
  const auto h = config.hidden_size, i = config.intermediate_size;
  dense_h_to_4h = register_module("dense_h_to_4h", Dense(h, i, /*bias=*/true, options));
  dense_4h_to_h = register_module("dense_4h_to_h", Dense(i, h, /*bias=*/true, options));
}

torch::Tensor GptNeoXMlpImpl::forward(const torch::Tensor& x) {
  return dense_4h_to_h->forward(torch::gelu(dense_h_to_4h->forward(x)));
}

GptNeoXLayerImpl::GptNeoXLayerImpl(const GptNeoXConfig& config, const torch::TensorOptions& options)
    : use_parallel_residual_(config.use_parallel_residual), hidden_dropout_(config.hidden_dropout) {
  const auto h = config.hidden_size;
  const auto eps = config.layer_norm_eps;
  // HF's registration order, which named_parameters() follows.
  input_layernorm = register_module("input_layernorm", LayerNorm(h, eps, options));
  post_attention_layernorm =
      register_module("post_attention_layernorm", LayerNorm(h, eps, options));
  attention = register_module("attention", GptNeoXAttention(config, options));
  mlp = register_module("mlp", GptNeoXMlp(config, options));
}

torch::Tensor GptNeoXLayerImpl::forward_cached(const torch::Tensor& x, KvCache::Layer* cache) {
  const bool training = is_training();
  auto attn_out = maybe_dropout(attention->forward_cached(input_layernorm->forward(x), cache),
                                hidden_dropout_, training);
  if (use_parallel_residual_) {
    const auto mlp_out = maybe_dropout(mlp->forward(post_attention_layernorm->forward(x)),
                                       hidden_dropout_, training);
    return mlp_out + attn_out + x;  // HF's order of the sums
  }
  attn_out = attn_out + x;
  const auto mlp_out = maybe_dropout(mlp->forward(post_attention_layernorm->forward(attn_out)),
                                     hidden_dropout_, training);
  return mlp_out + attn_out;
}

// --- model -----------------------------------------------------------------------------------

GptNeoXModelImpl::GptNeoXModelImpl(const GptNeoXConfig& config, const torch::TensorOptions& options)
    : max_positions_(config.max_position_embeddings), hidden_dropout_(config.hidden_dropout) {
  embed_in = register_module("embed_in", Embedding(config.vocab_size, config.hidden_size, options));
  layers = register_module("layers", torch::nn::ModuleList());
  for (std::int64_t i = 0; i < config.num_hidden_layers; ++i)
    layers->push_back(GptNeoXLayer(config, options));
  final_layer_norm = register_module("final_layer_norm",
                                     LayerNorm(config.hidden_size, config.layer_norm_eps, options));
}

GptNeoXLayerImpl& GptNeoXModelImpl::layer(std::int64_t index) {
  TY_CHECK(index >= 0 && index < num_layers(), "GptNeoX layer index ", index,
           " is out of range for ", num_layers(), " layers.");
  return *layers->ptr<GptNeoXLayerImpl>(static_cast<std::size_t>(index));
}

torch::Tensor GptNeoXModelImpl::forward(const torch::Tensor& input_ids) {
  parts::check_token_ids(input_ids, 0, max_positions_, "GptNeoX");
  // The embeddings, like the layers, are called as units, so a wrapper may shard them too.
  auto x = maybe_dropout(parts::call_as_unit(embed_in.ptr(), input_ids), hidden_dropout_,
                         is_training());  // (B, T, hidden)
  x = parts::call_layers<GptNeoXLayerImpl>(layers, x);
  return final_layer_norm->forward(x);
}

GptNeoXImpl::GptNeoXImpl(GptNeoXConfig config, GptNeoXInit init)
    : CausalLmImpl(config, init.seed), config_(std::move(config)) {
  config_.validate();
  TY_CHECK(!init.deferred || init.device.is_cpu(),
           "GptNeoXInit: deferred parameters are CPU tensors; leave device at kCPU (got ",
           init.device, ").");
  const auto options = torch::TensorOptions().dtype(torch::kFloat32).device(init.device);
  {
    DeferredParameters deferred(init.deferred);
    gpt_neox = register_module("gpt_neox", GptNeoXModel(config_, options));
    embed_out = register_module(
        "embed_out", Dense(config_.hidden_size, config_.vocab_size, /*bias=*/false, options));
    if (init.lora) add_lora(*init.lora, options);
  }
  initialise(init);
}

torch::Tensor GptNeoXImpl::forward(const torch::Tensor& input_ids) {
  return parts::call_as_unit(embed_out.ptr(), gpt_neox->forward(input_ids));  // (B, T, vocab)
}

torch::Tensor GptNeoXImpl::forward_cached(const torch::Tensor& input_ids, KvCache& cache) {
  auto& m = *gpt_neox;
  parts::check_token_ids(input_ids, cache.length(), config_.max_position_embeddings, "GptNeoX");
  auto x = m.embed_in->forward(input_ids);
  x = parts::call_layers_cached<GptNeoXLayerImpl>(m.layers, x, cache);
  return embed_out->forward(m.final_layer_norm->forward(x)).to(torch::kFloat32);
}

void GptNeoXImpl::init_parameter(const GptNeoXConfig& config,
                                 const std::string& full_name,
                                 torch::Tensor& tensor,
                                 std::uint64_t seed) {
  parts::init_from_spec(param_spec(config, full_name), full_name, tensor, seed,
                        config.initializer_range, "GptNeoX", config.num_hidden_layers);
}

void GptNeoXImpl::init_parameter(const std::string& full_name, torch::Tensor& tensor) const {
  const auto spec = parts::spec_with_lora(
      *this, full_name, [this](std::string_view n) { return param_spec(config_, n); });
  parts::init_from_spec(spec, full_name, tensor, seed(), config_.initializer_range, "GptNeoX",
                        config_.num_hidden_layers);
}

bool GptNeoXImpl::is_layer(const torch::nn::Module& module) const {
  return dynamic_cast<const GptNeoXLayerImpl*>(&module) != nullptr;
}

std::vector<std::string> GptNeoXImpl::unit_names() const {
  return {"gpt_neox.embed_in", "embed_out"};
}

CausalLm make_model(const GptNeoXConfig& config, CausalLmInit init) {
  return CausalLm(
      std::shared_ptr<CausalLmImpl>(std::make_shared<GptNeoXImpl>(config, std::move(init))));
}

}  // namespace trainyard::models
