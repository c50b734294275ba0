#include "trainyard/models/layers.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <charconv>
#include <cmath>
#include <limits>
#include <map>

#include "models/transformer_parts.h"
#include "trainyard/error.h"
#include "trainyard/models/causal_lm.h"
#include "trainyard/models/lora.h"
#include "trainyard/nn/attention.h"

namespace trainyard::models {

namespace {

// See DeferredParameters.
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
  TY_CHECK(weight.numel() == 0 || weight.storage().nbytes() > 0, "A model parameter of shape ",
           weight.sizes(),
           " has no memory: the model was built with CausalLmInit::deferred and runs only under "
           "FullyShardedDataParallel, which materialises it. HINT: build it without .deferred "
           "to run it on its own.");
  return weight;
}

}  // namespace

DeferredParameters::DeferredParameters(bool enabled) {
  building_deferred = enabled;
}
DeferredParameters::~DeferredParameters() {
  building_deferred = false;
}

DenseImpl::DenseImpl(std::int64_t in_features,
                     std::int64_t out_features,
                     bool bias,
                     const torch::TensorOptions& options) {
  weight = register_parameter("weight", empty_parameter({out_features, in_features}, options));
  if (bias) this->bias = register_parameter("bias", empty_parameter({out_features}, options));
}

torch::Tensor DenseImpl::forward(const torch::Tensor& x) {
  auto y = torch::linear(x, materialised(weight), bias);
  if (!lora_A) return y;
  const auto dropped = parts::maybe_dropout(x, lora_dropout_, is_training());
  const auto update = torch::linear(torch::linear(dropped, materialised(lora_A->weight)),
                                    materialised(lora_B->weight));
  return y + update * lora_scaling_;
}

void DenseImpl::add_lora(std::int64_t r,
                         double scaling,
                         double dropout,
                         const torch::TensorOptions& options) {
  TY_CHECK(!lora_A, "This linear layer has a LoRA adapter already.");
  lora_A = register_module("lora_A", LowRank(weight.size(1), r, options));
  lora_B = register_module("lora_B", LowRank(r, weight.size(0), options));
  lora_scaling_ = scaling;
  lora_dropout_ = dropout;
}

LowRankImpl::LowRankImpl(std::int64_t in_features,
                         std::int64_t out_features,
                         const torch::TensorOptions& options) {
  weight = register_parameter("weight", empty_parameter({out_features, in_features}, options));
}

LayerNormImpl::LayerNormImpl(std::int64_t features, double eps, const torch::TensorOptions& options)
    : eps(eps) {
  weight = register_parameter("weight", empty_parameter({features}, options));
  bias = register_parameter("bias", empty_parameter({features}, options));
}

torch::Tensor LayerNormImpl::forward(const torch::Tensor& x) {
  return torch::layer_norm(x, {weight.size(0)}, materialised(weight), bias, eps);
}

RmsNormImpl::RmsNormImpl(std::int64_t features, double eps, const torch::TensorOptions& options)
    : eps(eps) {
  weight = register_parameter("weight", empty_parameter({features}, options));
}

torch::Tensor RmsNormImpl::forward(const torch::Tensor& x) {
  const auto x32 = x.to(torch::kFloat32);
  const auto normed = x32 * torch::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return materialised(weight) * normed.to(x.scalar_type());
}

EmbeddingImpl::EmbeddingImpl(std::int64_t count,
                             std::int64_t dim,
                             const torch::TensorOptions& options) {
  weight = register_parameter("weight", empty_parameter({count, dim}, options));
}

torch::Tensor EmbeddingImpl::forward(const torch::Tensor& ids) {
  return torch::embedding(materialised(weight), ids);
}

// --- the causal-LM loss ------------------------------------------------------------------------

torch::Tensor CausalLmImpl::loss(const torch::Tensor& input_ids, const torch::Tensor& labels) {
  return causal_lm_loss(forward(input_ids), labels);
}

bool is_lora_parameter(std::string_view name) {
  return name.ends_with(".lora_A.weight") || name.ends_with(".lora_B.weight");
}

void CausalLmImpl::add_lora(const LoraOptions& lora, const torch::TensorOptions& options) {
  lora.validate();
  const auto targets = lora_targets(lm_config_, lora);  // refuses unknown names
  for (auto& item : named_modules("", /*include_self=*/false)) {
    auto* dense = dynamic_cast<DenseImpl*>(item.value().get());
    if (dense == nullptr || item.key().find("layers.") == std::string::npos) continue;
    for (const auto& t : targets)
      if (std::string_view(item.key()).ends_with("." + t.name))
        dense->add_lora(lora.r, lora.scaling(), lora.dropout, options);
  }
  lora_ = lora;
}

std::vector<std::pair<std::string, torch::Tensor>> merged_lora_parameters(
    const CausalLmImpl& model) {
  torch::NoGradGuard no_grad;
  std::map<std::string, torch::Tensor> merged;  // "<linear>.weight" -> W + s B A
  const double scaling = model.lora() ? model.lora()->scaling() : 0;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    const auto* dense = dynamic_cast<const DenseImpl*>(item.value().get());
    if (dense == nullptr || !dense->lora_A) continue;
    merged[item.key() + ".weight"] = dense->weight.to(torch::kFloat32) +
                                     torch::matmul(dense->lora_B->weight.to(torch::kFloat32),
                                                   dense->lora_A->weight.to(torch::kFloat32)) *
                                         scaling;
  }
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& p : model.named_parameters()) {
    if (is_lora_parameter(p.key())) continue;
    const auto it = merged.find(p.key());
    out.emplace_back(
        p.key(), it != merged.end() ? it->second : p.value().detach().to(torch::kFloat32).clone());
  }
  return out;
}

void CausalLmImpl::initialise(const CausalLmInit& init) {
  if (!init.device.is_meta() && !init.deferred) {
    auto params = named_parameters();
    for (auto& item : params) init_parameter(item.key(), item.value());
  }
  if (!lora_) return;
  for (auto& p : named_parameters())
    if (!is_lora_parameter(p.key())) p.value().set_requires_grad(false);
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

namespace parts {
namespace {

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

}  // namespace

std::optional<ParamSpec> dense_spec(std::string_view field, std::int64_t in, std::int64_t out) {
  if (field == "weight") return ParamSpec{InitKind::kNormal, {out, in}};
  if (field == "bias") return ParamSpec{InitKind::kZeros, {out}};
  return std::nullopt;
}

std::optional<ParamSpec> lora_spec(
    std::string_view name,
    std::int64_t r,
    const std::function<std::optional<ParamSpec>(std::string_view)>& base) {
  for (const std::string_view factor : {".lora_A.weight", ".lora_B.weight"}) {
    if (!name.ends_with(factor)) continue;
    const auto weight = std::string(name.substr(0, name.size() - factor.size())) + ".weight";
    const auto spec = base(weight);
    if (!spec || spec->shape.size() != 2) return std::nullopt;
    const auto out = spec->shape[0], in = spec->shape[1];
    if (factor == ".lora_B.weight") return ParamSpec{InitKind::kZeros, {out, r}};
    return ParamSpec{InitKind::kUniform, {r, in}, 1.0 / std::sqrt(static_cast<double>(in))};
  }
  return std::nullopt;
}

std::optional<ParamSpec> spec_with_lora(
    const CausalLmImpl& model,
    std::string_view name,
    const std::function<std::optional<ParamSpec>(std::string_view)>& base) {
  if (model.lora())
    if (auto spec = lora_spec(name, model.lora()->r, base)) return spec;
  return base(name);
}

std::optional<ParamSpec> norm_spec(std::string_view field, std::int64_t features) {
  if (field == "weight") return ParamSpec{InitKind::kOnes, {features}};
  if (field == "bias") return ParamSpec{InitKind::kZeros, {features}};
  return std::nullopt;
}

std::optional<std::string_view> after_prefix(std::string_view name, std::string_view prefix) {
  if (!name.starts_with(prefix)) return std::nullopt;
  return name.substr(prefix.size());
}

std::optional<LayerParamName> split_layer_name(std::string_view name,
                                               std::string_view prefix,
                                               std::int64_t num_layers) {
  auto rest = after_prefix(name, prefix);
  if (!rest) return std::nullopt;
  LayerParamName out;
  auto [end, ec] = std::from_chars(rest->data(), rest->data() + rest->size(), out.index);
  if (ec != std::errc() || end == rest->data() || out.index < 0 || out.index >= num_layers ||
      end == rest->data() + rest->size() || *end != '.')
    return std::nullopt;
  const auto path = rest->substr(static_cast<std::size_t>(end - rest->data()) + 1);
  const auto dot = path.rfind('.');
  if (dot == std::string_view::npos) return std::nullopt;
  out.module = path.substr(0, dot);
  out.field = path.substr(dot + 1);
  return out;
}

void init_from_spec(const std::optional<ParamSpec>& spec,
                    const std::string& name,
                    torch::Tensor& tensor,
                    std::uint64_t seed,
                    double stddev,
                    std::string_view model,
                    std::int64_t num_layers) {
  TY_CHECK(spec.has_value(), "\"", name, "\" is not a parameter of ", model, " with ", num_layers,
           " layers. HINT: pass the name as named_parameters() of the model gives it, without a "
           "wrapper's prefix.");
  TY_CHECK(tensor.sizes() == torch::IntArrayRef(spec->shape), model, " parameter \"", name,
           "\" has shape ", torch::IntArrayRef(spec->shape), ", but the tensor to initialise is ",
           tensor.sizes(), ".");
  TY_CHECK(!tensor.is_meta(), model, " parameter \"", name,
           "\" cannot be initialised on the meta device; allocate it first.");
  torch::NoGradGuard no_grad;
  switch (spec->kind) {
    case InitKind::kZeros:
      tensor.zero_();
      return;
    case InitKind::kOnes:
      tensor.fill_(1);
      return;
    case InitKind::kUniform: {
      auto generator = at::make_generator<at::CPUGeneratorImpl>(parameter_seed(seed, name));
      tensor.copy_(torch::empty(tensor.sizes(), torch::kFloat32)
                       .uniform_(-spec->bound, spec->bound, generator));
      return;
    }
    case InitKind::kNormal: {
      auto generator = at::make_generator<at::CPUGeneratorImpl>(parameter_seed(seed, name));
      if (tensor.is_cpu() && tensor.scalar_type() == torch::kFloat32 && tensor.is_contiguous()) {
        tensor.normal_(0, stddev, generator);
      } else {  // the same fp32 values, rounded or moved
        tensor.copy_(torch::empty(tensor.sizes(), torch::kFloat32).normal_(0, stddev, generator));
      }
      return;
    }
  }
}

torch::Tensor maybe_dropout(const torch::Tensor& x, double p, bool training) {
  return p > 0 && training ? torch::dropout(x, p, /*train=*/true) : x;
}

torch::Tensor rotate_half(const torch::Tensor& x) {
  const auto half = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

std::pair<torch::Tensor, torch::Tensor> rotary_cos_sin(const torch::Tensor& inv_freq,
                                                       std::int64_t past,
                                                       std::int64_t seq,
                                                       torch::ScalarType dtype) {
  // Cheap next to the attention itself, so computed per call rather than cached.
  const auto t = torch::arange(past, past + seq, inv_freq.options());
  const auto freqs = torch::outer(t, inv_freq);     // (seq, dim/2)
  const auto emb = torch::cat({freqs, freqs}, -1);  // (seq, dim)
  return {emb.cos().to(dtype), emb.sin().to(dtype)};
}

torch::Tensor apply_rotary(const torch::Tensor& x,
                           const torch::Tensor& cos,
                           const torch::Tensor& sin,
                           std::int64_t dim) {
  if (dim == x.size(-1)) return x * cos + rotate_half(x) * sin;
  const auto rot = x.narrow(-1, 0, dim);
  const auto pass = x.narrow(-1, dim, x.size(-1) - dim);
  return torch::cat({rot * cos + rotate_half(rot) * sin, pass}, -1);
}

torch::Tensor repeat_kv(const torch::Tensor& x, std::int64_t n) {
  if (n == 1) return x;
  const auto b = x.size(0), kv = x.size(1), t = x.size(2), d = x.size(3);
  return x.unsqueeze(2).expand({b, kv, n, t, d}).reshape({b, kv * n, t, d});
}

torch::Tensor causal_attention(const torch::Tensor& q,
                               const torch::Tensor& k,
                               const torch::Tensor& v,
                               double dropout,
                               bool training) {
  const auto batch = q.size(0), heads = q.size(1), seq = q.size(2), hs = q.size(3);
  const auto past = k.size(2) - seq;
  if (past == 0 && nn::fused_causal_attention_available(q)) {  // Note [Fused attention on GPUs]
    return nn::fused_causal_attention(q, k, v, training ? dropout : 0.0)
        .permute({0, 2, 1, 3})
        .reshape({batch, seq, heads * hs});
  }
  // Scores and softmax in fp32 whatever the activations' dtype, as HF upcasts.
  auto scores = torch::matmul(q.to(torch::kFloat32), k.to(torch::kFloat32).transpose(-1, -2))
                    .mul_(1.0 / std::sqrt(static_cast<double>(hs)));  // (B, heads, T, past + T)
  // Query i (position past + i) sees keys 0 ... past + i.
  const auto future =
      torch::ones({seq, past + seq}, q.options().dtype(torch::kBool)).triu(past + 1);
  // The most negative value of the scores' dtype (HF's finfo(dtype).min): under CPU autocast the
  // matmul above gives bf16 scores, to which float's lowest does not convert.
  const double lowest = scores.scalar_type() == torch::kBFloat16
                            ? static_cast<double>(std::numeric_limits<c10::BFloat16>::lowest())
                            : std::numeric_limits<float>::lowest();
  scores.masked_fill_(future, lowest);
  auto probs = torch::softmax(scores, -1).to(v.scalar_type());
  probs = maybe_dropout(probs, dropout, training);
  return torch::matmul(probs, v)  // (B, heads, T, head_size)
      .permute({0, 2, 1, 3})
      .reshape({batch, seq, heads * hs});
}

void check_token_ids(const torch::Tensor& ids,
                     std::int64_t past,
                     std::int64_t max_positions,
                     std::string_view model) {
  TY_CHECK(ids.dim() == 2 && ids.scalar_type() == torch::kInt64, model,
           " expects (batch, seq) int64 token ids, got ", ids.sizes(), " ", ids.scalar_type(), ".");
  TY_CHECK(past + ids.size(1) <= max_positions, model, " got ", past + ids.size(1),
           " positions; max_position_embeddings is ", max_positions, ".");
}

torch::Tensor split_heads(const torch::Tensor& x, std::int64_t heads, std::int64_t d) {
  return x.view({x.size(0), x.size(1), heads, d}).transpose(1, 2);
}

torch::Tensor rotary_gqa_attention(torch::Tensor q,
                                   torch::Tensor k,
                                   torch::Tensor v,
                                   const torch::Tensor& inv_freq,
                                   KvCache::Layer* cache,
                                   double dropout,
                                   bool training) {
  const std::int64_t past = cache != nullptr && cache->key.defined() ? cache->key.size(2) : 0;
  const auto d = q.size(3);
  const auto [cos, sin] = rotary_cos_sin(inv_freq, past, q.size(2), q.scalar_type());
  q = apply_rotary(q, cos, sin, d);
  k = apply_rotary(k, cos, sin, d);
  if (cache != nullptr) {
    if (past > 0) {
      k = torch::cat({cache->key, k}, 2);
      v = torch::cat({cache->value, v}, 2);
    }
    cache->key = k;
    cache->value = v;
  }
  const auto groups = q.size(1) / k.size(1);
  return causal_attention(q, repeat_kv(k, groups), repeat_kv(v, groups), dropout, training);
}

}  // namespace parts
}  // namespace trainyard::models
