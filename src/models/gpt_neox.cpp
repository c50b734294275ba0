#include "trainyard/models/gpt_neox.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "trainyard/error.h"
#include "trainyard/nn/attention.h"
#include "trainyard/nn/unit_hook.h"

#include <charconv>
#include <cmath>
#include <limits>
#include <optional>

namespace trainyard::models {
namespace {

// --- per-name initialisation (Note [Per-name initialisation]) ---------------------------------

enum class InitKind { kNormal, kZeros, kOnes };

struct ParamSpec {
  InitKind kind;
  std::vector<std::int64_t> shape;
};

bool starts_with(const std::string& s, std::string_view prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

// Dense weight and bias, or LayerNorm weight and bias, by the last component of the name.
std::optional<ParamSpec> dense_spec(std::string_view field, std::int64_t in, std::int64_t out) {
  if (field == "weight") return ParamSpec{InitKind::kNormal, {out, in}};
  if (field == "bias") return ParamSpec{InitKind::kZeros, {out}};
  return std::nullopt;
}

std::optional<ParamSpec> norm_spec(std::string_view field, std::int64_t features) {
  if (field == "weight") return ParamSpec{InitKind::kOnes, {features}};
  if (field == "bias") return ParamSpec{InitKind::kZeros, {features}};
  return std::nullopt;
}

// What the parameter `name` of GptNeoX(config) is, or nullopt when there is none by that name.
std::optional<ParamSpec> param_spec(const GptNeoXConfig& c, const std::string& name) {
  const auto h = c.hidden_size;
  if (name == "gpt_neox.embed_in.weight") return ParamSpec{InitKind::kNormal, {c.vocab_size, h}};
  if (name == "embed_out.weight") return ParamSpec{InitKind::kNormal, {c.vocab_size, h}};
  if (starts_with(name, "gpt_neox.final_layer_norm."))
    return norm_spec(std::string_view(name).substr(26), h);
  constexpr std::string_view kLayers = "gpt_neox.layers.";
  if (!starts_with(name, kLayers)) return std::nullopt;
  // gpt_neox.layers.<index>.<module path>.<weight|bias>
  std::string_view rest = std::string_view(name).substr(kLayers.size());
  std::int64_t index = -1;
  auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), index);
  if (ec != std::errc() || end == rest.data() || index >= c.num_hidden_layers || *end != '.')
    return std::nullopt;
  rest = rest.substr(end - rest.data() + 1);
  const auto dot = rest.rfind('.');
  if (dot == std::string_view::npos) return std::nullopt;
  const auto module = rest.substr(0, dot), field = rest.substr(dot + 1);
  if (module == "input_layernorm" || module == "post_attention_layernorm")
    return norm_spec(field, h);
  if (module == "attention.query_key_value") return dense_spec(field, h, 3 * h);
  if (module == "attention.dense") return dense_spec(field, h, h);
  if (module == "mlp.dense_h_to_4h") return dense_spec(field, h, c.intermediate_size);
  if (module == "mlp.dense_4h_to_h") return dense_spec(field, c.intermediate_size, h);
  return std::nullopt;
}

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// The generator seed of one parameter: FNV-1a of its name mixed with the model's seed.
std::uint64_t parameter_seed(std::uint64_t seed, const std::string& name) {
  std::uint64_t hash = 14695981039346656037ULL;
  for (const unsigned char ch : name) {
    hash ^= ch;
    hash *= 1099511628211ULL;
  }
  return splitmix64(hash ^ splitmix64(seed));
}

// --- forward helpers -----------------------------------------------------------------------

torch::Tensor maybe_dropout(const torch::Tensor& x, double p, bool training) {
  return p > 0 && training ? torch::dropout(x, p, /*train=*/true) : x;
}

// HF's rotary tables for positions [0, seq_len): inv_freq = 1 / base^(arange(0, dim, 2) / dim),
// emb = cat(freqs, freqs); both (seq_len, dim), fp32. Cheap next to the attention itself, so
// computed per call rather than cached.
std::pair<torch::Tensor, torch::Tensor> rotary_tables(std::int64_t seq_len,
                                                      std::int64_t dim,
                                                      double base,
                                                      const torch::Device& device) {
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(device);
  const auto inv_freq = 1.0 / torch::pow(base, torch::arange(0, dim, 2, f32) / dim);  // (dim/2)
  const auto t = torch::arange(seq_len, f32);
  const auto freqs = torch::outer(t, inv_freq);     // (seq_len, dim/2)
  const auto emb = torch::cat({freqs, freqs}, -1);  // (seq_len, dim)
  return {emb.cos(), emb.sin()};
}

// (x1, x2) -> (-x2, x1) over the halves of the last dimension.
torch::Tensor rotate_half(const torch::Tensor& x) {
  const auto half = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

// Rotates the first `dim` dimensions of x (B, heads, T, head_size) by position; cos/sin (T, dim)
// already in x's dtype.
torch::Tensor apply_rotary(const torch::Tensor& x,
                           const torch::Tensor& cos,
                           const torch::Tensor& sin,
                           std::int64_t dim) {
  const auto rot = x.narrow(-1, 0, dim);
  const auto pass = x.narrow(-1, dim, x.size(-1) - dim);
  return torch::cat({rot * cos + rotate_half(rot) * sin, pass}, -1);
}

}  // namespace

// --- building blocks -----------------------------------------------------------------------

namespace {

// Set while a GptNeoX is built with GptNeoXInit::deferred: the building blocks, which get only
// TensorOptions, then create parameters with their shape and no memory. Thread-local, so models
// built on other threads at the same time are unaffected.
thread_local bool building_deferred = false;

torch::Tensor empty_parameter(at::IntArrayRef shape, const torch::TensorOptions& options) {
  if (!building_deferred) return torch::empty(shape, options);
  // A CPU tensor whose storage has zero bytes, sized as `shape`: FSDP gives it values unit by
  // unit (FsdpOptions::param_init) and views them in its own storage.
  auto t = torch::empty({0}, options.device(torch::kCPU));
  t.unsafeGetTensorImpl()->set_sizes_contiguous(shape);
  return t;
}

// A deferred model's parameters have no memory until FSDP gathers them: running one without FSDP
// would read through a null pointer.
const torch::Tensor& materialised(const torch::Tensor& weight) {
  TY_CHECK(weight.numel() == 0 || weight.storage().nbytes() > 0, "GptNeoX: a parameter of shape ",
           weight.sizes(),
           " has no memory: the model was built with GptNeoXInit::deferred and runs only under "
           "FullyShardedDataParallel, which materialises it. HINT: build it without .deferred "
           "to run it on its own.");
  return weight;
}

}  // namespace

DenseImpl::DenseImpl(std::int64_t in_features,
                     std::int64_t out_features,
                     bool bias,
                     const torch::TensorOptions& options) {
  weight = register_parameter("weight", empty_parameter({out_features, in_features}, options));
  if (bias) this->bias = register_parameter("bias", empty_parameter({out_features}, options));
}

torch::Tensor DenseImpl::forward(const torch::Tensor& x) {
  return torch::linear(x, materialised(weight), bias);
}

LayerNormImpl::LayerNormImpl(std::int64_t features, double eps, const torch::TensorOptions& options)
    : eps(eps) {
  weight = register_parameter("weight", empty_parameter({features}, options));
  bias = register_parameter("bias", empty_parameter({features}, options));
}

torch::Tensor LayerNormImpl::forward(const torch::Tensor& x) {
  return torch::layer_norm(x, {weight.size(0)}, materialised(weight), bias, eps);
}

EmbeddingImpl::EmbeddingImpl(std::int64_t count,
                             std::int64_t dim,
                             const torch::TensorOptions& options) {
  weight = register_parameter("weight", empty_parameter({count, dim}, options));
}

torch::Tensor EmbeddingImpl::forward(const torch::Tensor& ids) {
  return torch::embedding(materialised(weight), ids);
}

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
    auto [cos, sin] = rotary_tables(past + seq, rotary_ndims_, rotary_base_, x.device());
    cos = cos.narrow(0, past, seq).to(q.scalar_type());  // HF casts the fp32 tables to the
    sin = sin.narrow(0, past, seq).to(q.scalar_type());  // activations' dtype
    q = apply_rotary(q, cos, sin, rotary_ndims_);
    k = apply_rotary(k, cos, sin, rotary_ndims_);
  }
  if (cache != nullptr) {
    if (past > 0) {
      k = torch::cat({cache->key, k}, 2);
      v = torch::cat({cache->value, v}, 2);
    }
    cache->key = k;
    cache->value = v;
  }
  if (past == 0 && nn::fused_causal_attention_available(q)) {  // Note [Fused attention on GPUs]
    const auto out = nn::fused_causal_attention(q, k, v, is_training() ? attention_dropout_ : 0.0)
                         .permute({0, 2, 1, 3})
                         .reshape({batch, seq, num_heads_ * hs});
    return dense->forward(out);
  }
  // Scores and softmax in fp32 whatever the activations' dtype, as HF upcasts.
  auto scores = torch::matmul(q.to(torch::kFloat32), k.to(torch::kFloat32).transpose(-1, -2))
                    .mul_(1.0 / std::sqrt(static_cast<double>(hs)));  // (B, heads, T, past + T)
  // Query i (position past + i) sees keys 0 ... past + i.
  const auto future =
      torch::ones({seq, past + seq}, x.options().dtype(torch::kBool)).triu(past + 1);
  // The most negative value of the scores' dtype (HF's finfo(dtype).min): under CPU autocast the
  // matmul above gives bf16 scores, to which float's lowest does not convert.
  const double lowest = scores.scalar_type() == torch::kBFloat16
                            ? static_cast<double>(std::numeric_limits<c10::BFloat16>::lowest())
                            : std::numeric_limits<float>::lowest();
  scores.masked_fill_(future, lowest);
  auto probs = torch::softmax(scores, -1).to(v.scalar_type());
  probs = maybe_dropout(probs, attention_dropout_, is_training());
  const auto out = torch::matmul(probs, v)  // (B, heads, T, head_size)
                       .permute({0, 2, 1, 3})
                       .reshape({batch, seq, num_heads_ * hs});
  return dense->forward(out);
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
  TY_CHECK(input_ids.dim() == 2 && input_ids.scalar_type() == torch::kInt64,
           "GptNeoX expects (batch, seq) int64 token ids, got ", input_ids.sizes(), " ",
           input_ids.scalar_type(), ".");
  TY_CHECK(input_ids.size(1) <= max_positions_, "GptNeoX got a sequence of ", input_ids.size(1),
           " tokens; max_position_embeddings is ", max_positions_, ".");
  // The embeddings, like the layers, are called as units, so a wrapper may shard them too.
  auto embed = embed_in.ptr();
  auto x = maybe_dropout(
      trainyard::nn::call_unit(*embed, input_ids,
                               [embed](const torch::Tensor& ids) { return embed->forward(ids); }),
      hidden_dropout_, is_training());  // (B, T, hidden)
  for (std::int64_t i = 0; i < num_layers(); ++i) {
    // The unit's forward holds the layer by value: a hook may call it again in backward
    // (activation checkpointing), after this frame is gone.
    auto unit = layers->ptr<GptNeoXLayerImpl>(static_cast<std::size_t>(i));
    x = trainyard::nn::call_unit(*unit, x,
                                 [unit](const torch::Tensor& h) { return unit->forward(h); });
  }
  return final_layer_norm->forward(x);
}

GptNeoXImpl::GptNeoXImpl(GptNeoXConfig config, GptNeoXInit init)
    : config_(std::move(config)), seed_(init.seed) {
  config_.validate();
  TY_CHECK(!init.deferred || init.device.is_cpu(),
           "GptNeoXInit: deferred parameters are CPU tensors; leave device at kCPU (got ",
           init.device, ").");
  const auto options = torch::TensorOptions().dtype(torch::kFloat32).device(init.device);
  building_deferred = init.deferred;
  try {
    gpt_neox = register_module("gpt_neox", GptNeoXModel(config_, options));
    embed_out = register_module(
        "embed_out", Dense(config_.hidden_size, config_.vocab_size, /*bias=*/false, options));
  } catch (...) {
    building_deferred = false;
    throw;
  }
  building_deferred = false;
  if (init.device.is_meta() || init.deferred) return;
  auto params = named_parameters();
  for (auto& item : params) init_parameter(item.key(), item.value());
}

torch::Tensor GptNeoXImpl::forward(const torch::Tensor& input_ids) {
  auto head = embed_out.ptr();
  return trainyard::nn::call_unit(
      *head, gpt_neox->forward(input_ids),
      [head](const torch::Tensor& h) { return head->forward(h); });  // (B, T, vocab_size)
}

torch::Tensor GptNeoXImpl::forward_cached(const torch::Tensor& input_ids, KvCache& cache) {
  auto& m = *gpt_neox;
  const auto past = cache.length();
  TY_CHECK(input_ids.dim() == 2 && input_ids.scalar_type() == torch::kInt64,
           "GptNeoX expects (batch, seq) int64 token ids, got ", input_ids.sizes(), " ",
           input_ids.scalar_type(), ".");
  TY_CHECK(past + input_ids.size(1) <= config_.max_position_embeddings, "GptNeoX got ",
           past + input_ids.size(1), " positions; max_position_embeddings is ",
           config_.max_position_embeddings, ".");
  cache.layers.resize(static_cast<std::size_t>(m.num_layers()));
  auto x = m.embed_in->forward(input_ids);
  for (std::int64_t i = 0; i < m.num_layers(); ++i)
    x = m.layer(i).forward_cached(x, &cache.layers[static_cast<std::size_t>(i)]);
  return embed_out->forward(m.final_layer_norm->forward(x)).to(torch::kFloat32);
}

torch::Tensor GptNeoXImpl::loss(const torch::Tensor& input_ids, const torch::Tensor& labels) {
  return causal_lm_loss(forward(input_ids), labels);
}

void GptNeoXImpl::init_parameter(const GptNeoXConfig& config,
                                 const std::string& full_name,
                                 torch::Tensor& tensor,
                                 std::uint64_t seed) {
  const auto spec = param_spec(config, full_name);
  TY_CHECK(spec.has_value(), "\"", full_name, "\" is not a parameter of GptNeoX with ",
           config.num_hidden_layers,
           " layers. HINT: pass the name as named_parameters() of the GptNeoX model gives it, "
           "without a wrapper's prefix.");
  TY_CHECK(tensor.sizes() == torch::IntArrayRef(spec->shape), "GptNeoX parameter \"", full_name,
           "\" has shape ", torch::IntArrayRef(spec->shape), ", but the tensor to initialise is ",
           tensor.sizes(), ".");
  TY_CHECK(!tensor.is_meta(), "GptNeoX parameter \"", full_name,
           "\" cannot be initialised on the meta device; allocate it first.");
  torch::NoGradGuard no_grad;
  switch (spec->kind) {
    case InitKind::kZeros:
      tensor.zero_();
      return;
    case InitKind::kOnes:
      tensor.fill_(1);
      return;
    case InitKind::kNormal: {
      auto generator = at::make_generator<at::CPUGeneratorImpl>(parameter_seed(seed, full_name));
      const double stddev = config.initializer_range;
      if (tensor.is_cpu() && tensor.scalar_type() == torch::kFloat32 && tensor.is_contiguous()) {
        tensor.normal_(0, stddev, generator);
      } else {  // the same fp32 values, rounded or moved
        tensor.copy_(torch::empty(tensor.sizes(), torch::kFloat32).normal_(0, stddev, generator));
      }
      return;
    }
  }
}

void GptNeoXImpl::init_parameter(const std::string& full_name, torch::Tensor& tensor) const {
  init_parameter(config_, full_name, tensor, seed_);
}

torch::Tensor causal_lm_loss(const torch::Tensor& logits, const torch::Tensor& labels) {
  TY_CHECK(logits.dim() == 3 && labels.dim() == 2 && logits.size(0) == labels.size(0) &&
               logits.size(1) == labels.size(1),
           "causal_lm_loss expects logits (B, T, V) and labels (B, T), got ", logits.sizes(),
           " and ", labels.sizes(), ".");
  TY_CHECK(labels.scalar_type() == torch::kInt64, "causal_lm_loss expects int64 labels, got ",
           labels.scalar_type(), ".");
  const auto seq = logits.size(1);
  TY_CHECK(seq >= 2, "causal_lm_loss needs at least 2 positions to predict a next token, got ", seq,
           ".");
  // Position t predicts token t + 1.
  const auto shifted_logits =
      logits.narrow(1, 0, seq - 1).to(torch::kFloat32).reshape({-1, logits.size(2)});
  const auto shifted_labels = labels.narrow(1, 1, seq - 1).reshape({-1});
  return torch::nn::functional::cross_entropy(
      shifted_logits, shifted_labels,
      torch::nn::functional::CrossEntropyFuncOptions().ignore_index(kIgnoreIndex));
}

}  // namespace trainyard::models
