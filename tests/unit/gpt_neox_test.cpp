// GPT-NeoX against Hugging Face's GPTNeoXForCausalLM: parameter counts, names and order, per-name
// initialisation, attention against a per-head loop written here, the residual forms, causality,
// the loss, the unit-hook seam FSDP uses, bf16, and config.json reading and validation.
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tensor_diff.h"
#include "trainyard/error.h"
#include "trainyard/models/gpt_neox.h"
#include "trainyard/nn/checkpoint.h"
#include "trainyard/nn/unit_hook.h"

#include <atomic>
#include <cmath>
#include <limits>

namespace {

using trainyard::test::max_rel_diff;

using trainyard::InvalidArgumentError;
using trainyard::models::causal_lm_loss;
using trainyard::models::GptNeoX;
using trainyard::models::GptNeoXAttentionImpl;
using trainyard::models::GptNeoXConfig;
using trainyard::models::GptNeoXImpl;
using trainyard::models::GptNeoXInit;
using trainyard::models::GptNeoXLayerImpl;

GptNeoXConfig tiny(double initializer_range = 0.02) {
  auto c = GptNeoXConfig::preset("tiny");
  c.initializer_range = initializer_range;
  return c;
}

// config.json read as trainyard reads it (CausalLmConfig::from_json); throws unless GPT-NeoX's.
GptNeoXConfig neox_from_json(const std::string& json_text) {
  const auto config = trainyard::models::CausalLmConfig::from_json(json_text);
  const auto* neox = config.get_if<GptNeoXConfig>();
  if (neox == nullptr) throw std::runtime_error("not a GPT-NeoX config.json: " + json_text);
  return *neox;
}

// Expects `fn` to throw InvalidArgumentError whose message contains every one of `parts`.
template <typename Fn>
void expect_invalid(Fn&& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
    ADD_FAILURE() << "no InvalidArgumentError thrown";
  } catch (const InvalidArgumentError& e) {
    for (const auto& part : parts)
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
          << "\"" << part << "\" not in: " << e.what();
  }
}

// Counts the bytes LibTorch allocates on the CPU while it is installed.
class CountingAllocator final : public c10::Allocator {
 public:
  CountingAllocator() : base_(c10::GetCPUAllocator()) {
    c10::SetCPUAllocator(this, std::numeric_limits<std::uint8_t>::max());
  }
  ~CountingAllocator() override {
    c10::SetCPUAllocator(base_, std::numeric_limits<std::uint8_t>::max());
  }
  c10::DataPtr allocate(std::size_t n) override {
    bytes_ += n;
    return base_->allocate(n);
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
  c10::DeleterFnPtr raw_deleter() const override { return base_->raw_deleter(); }
  std::size_t bytes() const { return bytes_; }

 private:
  c10::Allocator* base_;  // LibTorch's, outlives this
  std::atomic<std::size_t> bytes_{0};
};

// --- sizes -----------------------------------------------------------------------------------

TEST(GptNeoXConfigTest, ParameterCountsByFormulaMatchThePublishedModels) {
  EXPECT_EQ(GptNeoXConfig::preset("pythia-14m").parameter_count(), 14'067'712);
  EXPECT_EQ(GptNeoXConfig::preset("pythia-70m").parameter_count(), 70'426'624);
  EXPECT_EQ(GptNeoXConfig::preset("pythia-160m").parameter_count(), 162'322'944);
  EXPECT_EQ(GptNeoXConfig::preset("pythia-410m").parameter_count(), 405'334'016);
  EXPECT_EQ(GptNeoXConfig::preset("dolly-v2-7b").parameter_count(), 6'856'056'832);
}

TEST(GptNeoXTest, MetaConstructionMatchesTheFormulaAndAllocatesNothing) {
  {  // the counter sees CPU allocations at all
    CountingAllocator counting;
    auto t = torch::empty({1 << 20});
    EXPECT_GE(counting.bytes(), std::size_t{4} << 20);
  }
  for (const auto* name : {"pythia-14m", "pythia-70m", "dolly-v2-7b"}) {
    SCOPED_TRACE(name);
    const auto config = GptNeoXConfig::preset(name);
    CountingAllocator counting;
    GptNeoX model(config, GptNeoXInit{.device = torch::kMeta});
    std::int64_t numel = 0;
    for (const auto& p : model->parameters()) {
      EXPECT_TRUE(p.is_meta());
      numel += p.numel();
    }
    EXPECT_EQ(numel, config.parameter_count());
    EXPECT_TRUE(model->buffers().empty());
    // Bookkeeping only; the parameters alone would be 4 * numel bytes.
    EXPECT_LT(counting.bytes(), std::size_t{1} << 20);
  }
}

TEST(GptNeoXTest, SmallModelsHoldAsManyParametersAsTheFormulaSays) {
  for (const auto* name : {"tiny", "pythia-14m"}) {
    SCOPED_TRACE(name);
    const auto config = GptNeoXConfig::preset(name);
    GptNeoX model(config);
    std::int64_t numel = 0;
    for (const auto& p : model->parameters()) {
      EXPECT_TRUE(p.is_cpu());
      EXPECT_EQ(p.scalar_type(), torch::kFloat32);
      numel += p.numel();
    }
    EXPECT_EQ(numel, config.parameter_count());
  }
}

TEST(GptNeoXTest, ParameterNamesShapesAndOrderAreHuggingFaces) {
  const auto config = tiny();  // 2 layers, hidden 32, intermediate 64, vocab 128
  GptNeoX model(config, GptNeoXInit{.device = torch::kMeta});
  std::vector<std::pair<std::string, std::vector<std::int64_t>>> expected = {
      {"gpt_neox.embed_in.weight", {128, 32}}};
  for (int i = 0; i < 2; ++i) {
    const auto p = "gpt_neox.layers." + std::to_string(i) + ".";
    expected.insert(expected.end(), {
                                        {p + "input_layernorm.weight", {32}},
                                        {p + "input_layernorm.bias", {32}},
                                        {p + "post_attention_layernorm.weight", {32}},
                                        {p + "post_attention_layernorm.bias", {32}},
                                        {p + "attention.query_key_value.weight", {96, 32}},
                                        {p + "attention.query_key_value.bias", {96}},
                                        {p + "attention.dense.weight", {32, 32}},
                                        {p + "attention.dense.bias", {32}},
                                        {p + "mlp.dense_h_to_4h.weight", {64, 32}},
                                        {p + "mlp.dense_h_to_4h.bias", {64}},
                                        {p + "mlp.dense_4h_to_h.weight", {32, 64}},
                                        {p + "mlp.dense_4h_to_h.bias", {32}},
                                    });
  }
  expected.push_back({"gpt_neox.final_layer_norm.weight", {32}});
  expected.push_back({"gpt_neox.final_layer_norm.bias", {32}});
  expected.push_back({"embed_out.weight", {128, 32}});

  const auto params = model->named_parameters();
  ASSERT_EQ(params.size(), expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(params[i].key(), expected[i].first) << "at " << i;
    EXPECT_EQ(params[i].value().sizes(), torch::IntArrayRef(expected[i].second))
        << expected[i].first;
  }
  EXPECT_TRUE(model->named_buffers().is_empty());
}

TEST(GptNeoXTest, FsdpFindsEachLayerByDynamicCast) {
  GptNeoX model(tiny(), GptNeoXInit{.device = torch::kMeta});
  int layers = 0;
  for (const auto& m : model->modules())
    if (dynamic_cast<GptNeoXLayerImpl*>(m.get()) != nullptr) ++layers;
  EXPECT_EQ(layers, 2);
}

// --- initialisation --------------------------------------------------------------------------

TEST(GptNeoXTest, InitialisationIsDeterministicPerName) {
  const auto config = tiny();
  GptNeoX a(config, GptNeoXInit{.seed = 7});
  GptNeoX b(config, GptNeoXInit{.seed = 7});
  GptNeoX other_seed(config, GptNeoXInit{.seed = 8});
  auto one_layer_config = config;
  one_layer_config.num_hidden_layers = 1;
  GptNeoX one_layer(one_layer_config, GptNeoXInit{.seed = 7});  // built differently, same names

  const auto pa = a->named_parameters(), pb = b->named_parameters();
  const auto po = other_seed->named_parameters(), p1 = one_layer->named_parameters();
  for (const auto& item : pa) {
    const auto& name = item.key();
    SCOPED_TRACE(name);
    const auto& value = item.value();
    EXPECT_TRUE(torch::equal(value, pb[name]));
    if (const auto* in_one = p1.find(name)) {
      EXPECT_TRUE(torch::equal(value, *in_one));
    }
    const bool is_norm = name.find("layernorm") != std::string::npos ||
                         name.find("final_layer_norm") != std::string::npos;
    if (name.ends_with(".bias")) {
      EXPECT_EQ(value.abs().max().item<float>(), 0.0f);
      EXPECT_TRUE(torch::equal(value, po[name]));
    } else if (is_norm) {
      EXPECT_TRUE(torch::equal(value, torch::ones_like(value)));
      EXPECT_TRUE(torch::equal(value, po[name]));
    } else {  // normal(0, initializer_range), drawn per name
      EXPECT_FALSE(torch::equal(value, po[name]));
      EXPECT_NEAR(value.mean().item<double>(), 0.0, 0.003);
      EXPECT_NEAR(value.std().item<double>(), config.initializer_range, 0.002);
    }
    // What FSDP does: allocate one meta parameter, then initialise it by name.
    auto fresh = torch::empty(value.sizes());
    GptNeoXImpl::init_parameter(config, name, fresh, 7);
    EXPECT_TRUE(torch::equal(fresh, value));
    auto fresh_bf16 = torch::empty(value.sizes(), torch::kBFloat16);
    a->init_parameter(name, fresh_bf16);
    EXPECT_TRUE(torch::equal(fresh_bf16, value.to(torch::kBFloat16)));
  }
  // Distinct names get distinct draws.
  EXPECT_FALSE(torch::equal(pa["gpt_neox.layers.0.attention.dense.weight"],
                            pa["gpt_neox.layers.1.attention.dense.weight"]));
}

TEST(GptNeoXTest, InitParameterRefusesUnknownNamesWrongShapesAndMetaTensors) {
  const auto config = tiny();
  auto t = torch::empty({32, 32});
  expect_invalid(
      [&] {
        GptNeoXImpl::init_parameter(config, "gpt_neox.layers.2.attention.dense.weight", t, 0);
      },
      {"gpt_neox.layers.2.attention.dense.weight", "2 layers"});
  expect_invalid([&] { GptNeoXImpl::init_parameter(config, "module.embed_out.weight", t, 0); },
                 {"module.embed_out.weight"});
  expect_invalid(
      [&] {
        GptNeoXImpl::init_parameter(config, "gpt_neox.layers.0.mlp.dense_h_to_4h.weight", t, 0);
      },
      {"[64, 32]", "[32, 32]"});
  auto meta = torch::empty({32, 32}, torch::TensorOptions().device(torch::kMeta));
  expect_invalid(
      [&] {
        GptNeoXImpl::init_parameter(config, "gpt_neox.layers.0.attention.dense.weight", meta, 0);
      },
      {"meta"});
}

// --- forward -----------------------------------------------------------------------------------

// HF's attention written as plainly as possible, in double: a loop over batch and heads, the pair
// (i, i + rot/2) of each head rotated by the angle position * base^(-2i/rot), causal softmax.
torch::Tensor reference_attention(const torch::Tensor& x_in,
                                  GptNeoXAttentionImpl& attention,
                                  const GptNeoXConfig& config) {
  const auto x = x_in.to(torch::kFloat64);
  const auto w_qkv = attention.query_key_value->weight.detach().to(torch::kFloat64);
  const auto b_qkv = attention.query_key_value->bias.detach().to(torch::kFloat64);
  const auto w_out = attention.dense->weight.detach().to(torch::kFloat64);
  const auto b_out = attention.dense->bias.detach().to(torch::kFloat64);
  const auto batch = x.size(0), seq = x.size(1), hidden = x.size(2);
  const auto heads = config.num_attention_heads, hs = hidden / heads;
  const auto rot = config.rotary_ndims(), half = rot / 2;
  const auto qkv = torch::matmul(x, w_qkv.t()) + b_qkv;  // (B, T, 3 * hidden)
  auto merged = torch::zeros({batch, seq, hidden}, torch::kFloat64);
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t h = 0; h < heads; ++h) {
      auto q = qkv[b].narrow(1, h * 3 * hs, hs).clone();  // (T, hs)
      auto k = qkv[b].narrow(1, h * 3 * hs + hs, hs).clone();
      auto v = qkv[b].narrow(1, h * 3 * hs + 2 * hs, hs).clone();
      for (auto* m : {&q, &k}) {
        auto a = m->accessor<double, 2>();
        for (std::int64_t t = 0; t < seq; ++t) {
          for (std::int64_t i = 0; i < half; ++i) {
            const double angle =
                static_cast<double>(t) * std::pow(config.rotary_emb_base, -2.0 * i / rot);
            const double x1 = a[t][i], x2 = a[t][i + half];
            a[t][i] = x1 * std::cos(angle) - x2 * std::sin(angle);
            a[t][i + half] = x2 * std::cos(angle) + x1 * std::sin(angle);
          }
        }
      }
      auto qa = q.accessor<double, 2>(), ka = k.accessor<double, 2>(), va = v.accessor<double, 2>();
      auto out = merged.accessor<double, 3>();
      for (std::int64_t t = 0; t < seq; ++t) {
        std::vector<double> scores(t + 1);
        double max_score = -1e300, total = 0;
        for (std::int64_t u = 0; u <= t; ++u) {
          double dot = 0;
          for (std::int64_t d = 0; d < hs; ++d) dot += qa[t][d] * ka[u][d];
          scores[u] = dot / std::sqrt(static_cast<double>(hs));
          max_score = std::max(max_score, scores[u]);
        }
        for (auto& s : scores) total += (s = std::exp(s - max_score));
        for (std::int64_t u = 0; u <= t; ++u)
          for (std::int64_t d = 0; d < hs; ++d)
            out[b][t][h * hs + d] += scores[u] / total * va[u][d];
      }
    }
  }
  return torch::matmul(merged, w_out.t()) + b_out;
}

TEST(GptNeoXTest, AttentionMatchesAPerHeadReferenceForEveryRotaryShare) {
  // rotary_pct 0.25, 0.5, 1: 2, 4 and 8 of each head's 8 dimensions rotated; 0: none.
  for (const double pct : {0.0, 0.25, 0.5, 1.0}) {
    SCOPED_TRACE(pct);
    auto config = tiny(/*initializer_range=*/0.3);  // peaked attention, so positions matter
    config.rotary_pct = pct;
    GptNeoX model(config, GptNeoXInit{.seed = 3});
    torch::manual_seed(0);
    const auto x = torch::randn({2, 9, config.hidden_size});
    auto& attention = *model->gpt_neox->layer(1).attention;
    const auto got = attention.forward(x);
    const auto want = reference_attention(x, attention, config);
    // fp32 against double over a 32-wide dot product and a softmax.
    EXPECT_LT(max_rel_diff(got, want), 2e-5);
  }
}

// LayerNorm and exact GELU written out, for the layer's two residual forms.
torch::Tensor reference_layer_norm(const torch::Tensor& x,
                                   const torch::Tensor& w,
                                   const torch::Tensor& b,
                                   double eps) {
  const auto mean = x.mean(-1, true);
  const auto var = (x - mean).pow(2).mean(-1, true);
  return (x - mean) / (var + eps).sqrt() * w + b;
}

torch::Tensor reference_mlp(const torch::Tensor& x, trainyard::models::GptNeoXMlpImpl& mlp) {
  const auto h = torch::matmul(x, mlp.dense_h_to_4h->weight.t()) + mlp.dense_h_to_4h->bias;
  const auto g = 0.5 * h * (1 + torch::erf(h / std::sqrt(2.0)));
  return torch::matmul(g, mlp.dense_4h_to_h->weight.t()) + mlp.dense_4h_to_h->bias;
}

TEST(GptNeoXTest, ParallelAndSequentialResidualsFollowTheirFormulas) {
  auto parallel_config = tiny(0.2), sequential_config = tiny(0.2);
  sequential_config.use_parallel_residual = false;
  // Same seed and names, so the same weights (Note [Per-name initialisation]).
  GptNeoX parallel(parallel_config, GptNeoXInit{.seed = 5});
  GptNeoX sequential(sequential_config, GptNeoXInit{.seed = 5});
  torch::NoGradGuard no_grad;
  torch::manual_seed(0);
  const auto x = torch::randn({2, 6, 32});
  auto& layer = parallel->gpt_neox->layer(0);
  auto ln1 = [&](const torch::Tensor& t) {
    return reference_layer_norm(t, layer.input_layernorm->weight, layer.input_layernorm->bias,
                                1e-5);
  };
  auto ln2 = [&](const torch::Tensor& t) {
    return reference_layer_norm(t, layer.post_attention_layernorm->weight,
                                layer.post_attention_layernorm->bias, 1e-5);
  };
  auto attn = [&](const torch::Tensor& t) { return layer.attention->forward(t); };
  const auto want_parallel = x + attn(ln1(x)) + reference_mlp(ln2(x), *layer.mlp);
  const auto mid = x + attn(ln1(x));
  const auto want_sequential = mid + reference_mlp(ln2(mid), *layer.mlp);

  const auto got_parallel = layer.forward(x);
  const auto got_sequential = sequential->gpt_neox->layer(0).forward(x);
  EXPECT_LT(max_rel_diff(got_parallel, want_parallel), 1e-5);
  EXPECT_LT(max_rel_diff(got_sequential, want_sequential), 1e-5);
  EXPECT_GT(max_rel_diff(got_parallel, got_sequential), 1e-3);

  const auto ids = torch::randint(128, {2, 6});
  EXPECT_GT(max_rel_diff(parallel->forward(ids), sequential->forward(ids)), 1e-3);
}

TEST(GptNeoXTest, LogitsAtAPositionDependOnlyOnTokensUpToIt) {
  GptNeoX model(tiny(0.2), GptNeoXInit{.seed = 1});
  torch::NoGradGuard no_grad;
  torch::manual_seed(0);
  const auto ids = torch::randint(128, {2, 10});
  auto changed = ids.clone();
  const std::int64_t t = 5;
  changed.select(1, t + 1).add_(1).remainder_(128);
  const auto a = model->forward(ids), b = model->forward(changed);
  ASSERT_EQ(a.sizes(), (std::vector<std::int64_t>{2, 10, 128}));
  // Masked scores add exact zeros: positions <= t are bit for bit the same.
  EXPECT_TRUE(torch::equal(a.narrow(1, 0, t + 1), b.narrow(1, 0, t + 1)));
  EXPECT_GT(max_rel_diff(a.select(1, t + 1), b.select(1, t + 1)), 1e-4);
  EXPECT_GT(max_rel_diff(a.select(1, t + 2), b.select(1, t + 2)), 1e-4);
}

TEST(GptNeoXTest, LossIsShiftedMeanCrossEntropySkippingIgnoredLabels) {
  GptNeoX model(tiny(0.2), GptNeoXInit{.seed = 2});
  torch::manual_seed(0);
  const auto ids = torch::randint(128, {3, 7});
  auto labels = ids.clone();
  labels[1][4] = trainyard::models::kIgnoreIndex;
  labels[2][0] = trainyard::models::kIgnoreIndex;  // position 0 is never a target anyway
  const auto logits = model->forward(ids);
  const auto log_probs = torch::log_softmax(logits.detach().to(torch::kFloat64), -1);
  double total = 0;
  int count = 0;
  for (int b = 0; b < 3; ++b)
    for (int t = 0; t + 1 < 7; ++t) {
      const auto target = labels[b][t + 1].item<std::int64_t>();
      if (target == trainyard::models::kIgnoreIndex) continue;
      total -= log_probs[b][t][target].item<double>();
      ++count;
    }
  ASSERT_EQ(count, 17);
  const auto loss = model->loss(ids, labels);
  EXPECT_EQ(loss.scalar_type(), torch::kFloat32);
  EXPECT_NEAR(loss.item<double>(), total / count, 1e-5);
  EXPECT_NEAR(causal_lm_loss(logits, labels).item<double>(), total / count, 1e-5);

  // Every parameter gets a gradient.
  loss.backward();
  for (const auto& item : model->named_parameters()) {
    ASSERT_TRUE(item.value().grad().defined()) << item.key();
    EXPECT_GT(item.value().grad().abs().sum().item<double>(), 0) << item.key();
  }
}

class CountingHook final : public trainyard::nn::UnitHook {
 public:
  torch::Tensor run(torch::nn::Module& unit,
                    const torch::Tensor& input,
                    const trainyard::nn::UnitForward& forward) override {
    units.push_back(&unit);
    return forward(input);
  }
  std::vector<const torch::nn::Module*> units;
};

TEST(GptNeoXTest, EveryLayerRunsThroughItsUnitHookOncePerForward) {
  GptNeoX model(tiny(), GptNeoXInit{.seed = 4});
  const auto ids = torch::randint(128, {2, 5});
  const auto plain = model->forward(ids);
  auto hook = std::make_shared<CountingHook>();
  std::vector<const torch::nn::Module*> layers;
  for (const auto& m : model->modules())
    if (dynamic_cast<GptNeoXLayerImpl*>(m.get()) != nullptr) layers.push_back(m.get());
  for (const auto* layer : layers) trainyard::nn::set_unit_hook(*layer, hook);
  const auto hooked = model->forward(ids);
  model->forward(ids);
  // The registry is process-wide and keyed by address: remove before the model goes away.
  for (const auto* layer : layers) trainyard::nn::set_unit_hook(*layer, nullptr);
  EXPECT_TRUE(torch::equal(plain, hooked));
  std::vector<const torch::nn::Module*> twice = layers;
  twice.insert(twice.end(), layers.begin(), layers.end());
  EXPECT_EQ(hook->units, twice);
}

TEST(GptNeoXTest, Bf16ForwardIsCloseToFp32) {
  const auto config = tiny(0.2);
  GptNeoX fp32(config, GptNeoXInit{.seed = 6});
  GptNeoX bf16(config, GptNeoXInit{.seed = 6});
  bf16->to(torch::kBFloat16);
  torch::NoGradGuard no_grad;
  torch::manual_seed(0);
  const auto ids = torch::randint(128, {2, 12});
  const auto want = fp32->forward(ids);
  const auto got = bf16->forward(ids);
  EXPECT_EQ(got.scalar_type(), torch::kBFloat16);
  // bf16 keeps 8 significant bits (relative rounding 2^-9 ~ 0.2%): weights, activations and
  // every matmul output are rounded through 2 layers, a final norm and a 32-wide projection;
  // a few percent of the largest logit covers that, far below what a wrong formula gives.
  EXPECT_LT(max_rel_diff(got, want), 4e-2);
  EXPECT_TRUE(torch::isfinite(bf16->loss(ids, ids)).item<bool>());
}

TEST(GptNeoXTest, DropoutOnlyInTraining) {
  auto config = tiny(0.2);
  config.hidden_dropout = 0.3;
  config.attention_dropout = 0.3;
  GptNeoX model(config);
  const auto ids = torch::randint(128, {2, 6});
  model->train();
  EXPECT_FALSE(torch::equal(model->forward(ids), model->forward(ids)));
  model->eval();
  EXPECT_TRUE(torch::equal(model->forward(ids), model->forward(ids)));
}

TEST(GptNeoXTest, RefusesBadInputs) {
  GptNeoX model(tiny());
  expect_invalid(
      [&] {
        model->forward(torch::zeros({2, 65}, torch::kInt64));
      },
      {"65", "max_position_embeddings is 64"});
  expect_invalid([&] { model->forward(torch::zeros({2, 3})); }, {"int64"});
  expect_invalid(
      [&] {
        causal_lm_loss(torch::zeros({2, 1, 8}), torch::zeros({2, 1}, torch::kInt64));
      },
      {"at least 2"});
}

// --- config ------------------------------------------------------------------------------------

// EleutherAI/pythia-70m's config.json.
constexpr const char* kPythia70mJson = R"({
  "architectures": ["GPTNeoXForCausalLM"],
  "bos_token_id": 0,
  "eos_token_id": 0,
  "hidden_act": "gelu",
  "hidden_size": 512,
  "initializer_range": 0.02,
  "intermediate_size": 2048,
  "layer_norm_eps": 1e-05,
  "max_position_embeddings": 2048,
  "model_type": "gpt_neox",
  "num_attention_heads": 8,
  "num_hidden_layers": 6,
  "rotary_emb_base": 10000,
  "rotary_pct": 0.25,
  "tie_word_embeddings": false,
  "torch_dtype": "float16",
  "transformers_version": "4.24.0",
  "use_cache": true,
  "use_parallel_residual": true,
  "vocab_size": 50304
})";

TEST(GptNeoXConfigTest, ReadsHuggingFaceConfigJsonAndRoundTrips) {
  const auto config = neox_from_json(kPythia70mJson);
  EXPECT_EQ(config, GptNeoXConfig::preset("pythia-70m"));
  EXPECT_EQ(config.head_size(), 64);
  EXPECT_EQ(config.rotary_ndims(), 16);
  for (const auto& name : GptNeoXConfig::preset_names()) {
    SCOPED_TRACE(name);
    const auto preset = GptNeoXConfig::preset(name);
    EXPECT_EQ(neox_from_json(preset.to_json()), preset);
  }
  // Newer transformers spell two fields differently.
  const auto renamed = neox_from_json(
      R"({"vocab_size": 100, "hidden_size": 512, "num_hidden_layers": 2,
          "num_attention_heads": 8, "intermediate_size": 64, "max_position_embeddings": 32,
          "rope_theta": 500, "partial_rotary_factor": 0.5})");
  EXPECT_EQ(renamed.rotary_emb_base, 500);
  EXPECT_EQ(renamed.rotary_pct, 0.5);
}

TEST(GptNeoXConfigTest, BadConfigsNameTheFieldAndValue) {
  auto config = GptNeoXConfig::preset("tiny");
  config.hidden_size = 30;  // 4 heads
  expect_invalid([&] { config.validate(); }, {"hidden_size (30)", "num_attention_heads (4)"});
  config = GptNeoXConfig::preset("tiny");
  config.rotary_pct = 0.375;  // 8 * 0.375 = 3 rotary dimensions
  expect_invalid([&] { config.validate(); }, {"rotary_pct (0.375)", "= 3"});
  config = GptNeoXConfig::preset("tiny");
  config.layer_norm_eps = 0;
  expect_invalid([&] { config.validate(); }, {"layer_norm_eps", "0"});
  config = GptNeoXConfig::preset("tiny");
  config.attention_dropout = 1.5;
  expect_invalid([&] { config.validate(); }, {"attention_dropout", "1.5"});
  config = GptNeoXConfig::preset("tiny");
  config.vocab_size = 0;
  expect_invalid([&] { GptNeoX model(config, GptNeoXInit{.device = torch::kMeta}); },
                 {"vocab_size", "0"});

  expect_invalid([] { GptNeoXConfig::preset("pythia-2.8b"); },
                 {"pythia-2.8b", "pythia-14m", "pythia-70m", "dolly-v2-7b", "tiny"});
  expect_invalid([] { neox_from_json("{\"hidden_size\": 512,"); }, {"not valid JSON"});
  expect_invalid([] { neox_from_json(R"({"hidden_size": "512"})"); },
                 {"\"hidden_size\"", "integer", "\"512\""});
  expect_invalid(
      [] {
        neox_from_json(
            R"({"vocab_size": 100, "hidden_size": 500, "num_hidden_layers": 2,
                "num_attention_heads": 64, "intermediate_size": 64,
                "max_position_embeddings": 32})");
      },
      {"hidden_size (500)", "num_attention_heads (64)"});
  // Hugging Face's defaults of the size fields describe a 20B model: they are required.
  expect_invalid([] { neox_from_json(R"({"model_type": "gpt_neox"})"); },
                 {"config.json lacks \"vocab_size\", \"hidden_size\", \"num_hidden_layers\", "
                  "\"num_attention_heads\", \"intermediate_size\", \"max_position_embeddings\", "
                  "which give the model its size",
                  "HINT: use the config.json saved with the model's weights"});
  expect_invalid(
      [] {
        neox_from_json(R"({"vocab_size": 100, "hidden_size": 32,
                                     "num_attention_heads": 4, "intermediate_size": 64})");
      },
      {"config.json lacks \"num_hidden_layers\", \"max_position_embeddings\", which"});
  expect_invalid([] { neox_from_json(R"({"tie_word_embeddings": true})"); },
                 {"tie_word_embeddings", "true"});
  expect_invalid([] { neox_from_json(R"({"hidden_act": "gelu_new"})"); },
                 {"hidden_act", "gelu_new"});
  expect_invalid([] { neox_from_json(R"({"rope_scaling": {"type": "linear"}})"); },
                 {"rope_scaling"});
  expect_invalid([] { neox_from_json(R"({"rotary_pct": 0.5, "partial_rotary_factor": 0.25})"); },
                 {"rotary_pct", "partial_rotary_factor"});
}

}  // namespace

namespace {

// Activation checkpointing (nn::checkpoint) recomputes a layer in backward and must give the
// same input and parameter gradients as the plain backward.
TEST(ActivationCheckpoint, GivesThePlainGradients) {
  GptNeoX model(GptNeoXConfig::preset("tiny"), trainyard::models::GptNeoXInit{.seed = 2});
  auto layer = model->gpt_neox->layers->ptr<trainyard::models::GptNeoXLayerImpl>(0);
  auto x = torch::randn({2, 5, GptNeoXConfig::preset("tiny").hidden_size}, torch::requires_grad());
  layer->forward(x).pow(2).sum().backward();
  auto plain_x = x.grad().clone();
  std::vector<torch::Tensor> plain;
  for (auto& p : layer->parameters()) plain.push_back(p.grad().clone());
  x.mutable_grad().reset();
  layer->zero_grad();
  auto out =
      trainyard::nn::checkpoint([layer](const torch::Tensor& h) { return layer->forward(h); }, x);
  out.pow(2).sum().backward();
  EXPECT_TRUE(torch::allclose(x.grad(), plain_x, 1e-5, 1e-6));
  auto params = layer->parameters();
  for (std::size_t i = 0; i < params.size(); ++i)
    EXPECT_TRUE(torch::allclose(params[i].grad(), plain[i], 1e-5, 1e-6)) << i;
}

}  // namespace
