#include "trainyard/models/efficientnet.h"

#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "trainyard/error.h"

namespace trainyard::models {
namespace nn = torch::nn;

namespace {

// One row of the EfficientNet paper's Table 1, as torchvision's _efficientnet_conf lists it for
// B0; the other variants scale the channels and the layer counts.
struct StageConfig {
  double expand_ratio;
  int kernel;
  int stride;
  int in_channels;
  int out_channels;
  int layers;
};
constexpr std::array<StageConfig, 7> kStages = {{
    {1, 3, 1, 32, 16, 1},
    {6, 3, 2, 16, 24, 2},
    {6, 5, 2, 24, 40, 2},
    {6, 3, 2, 40, 80, 3},
    {6, 5, 1, 80, 112, 3},
    {6, 5, 2, 112, 192, 4},
    {6, 3, 1, 192, 320, 1},
}};

// torchvision's efficientnet_b0 .. efficientnet_b7.
struct VariantConfig {
  double width_mult;
  double depth_mult;
  double dropout;
};
constexpr std::array<VariantConfig, 8> kVariants = {{
    {1.0, 1.0, 0.2},
    {1.0, 1.1, 0.2},
    {1.1, 1.2, 0.3},
    {1.2, 1.4, 0.3},
    {1.4, 1.8, 0.4},
    {1.6, 2.2, 0.4},
    {1.8, 2.6, 0.5},
    {2.0, 3.1, 0.5},
}};
// B5..B7 pass norm_layer=partial(BatchNorm2d, eps=0.001, momentum=0.01); B0..B4 keep the defaults.
constexpr int kFirstVariantWithTfBatchNorm = 5;

// torchvision's Conv2dNormActivation: conv ("0", no bias, "same" padding for odd kernels),
// BatchNorm ("1") and, where `silu`, SiLU ("2").
TensorSequential conv_norm_activation(int in_channels,
                                      int out_channels,
                                      int kernel,
                                      int stride,
                                      int groups,
                                      const BatchNormSettings& batch_norm,
                                      bool silu) {
  TensorSequential layers(
      nn::Conv2d(nn::Conv2dOptions(in_channels, out_channels, kernel)
                     .stride(stride)
                     .padding((kernel - 1) / 2)
                     .groups(groups)
                     .bias(false)),
      nn::BatchNorm2d(
          nn::BatchNormOptions(out_channels).eps(batch_norm.eps).momentum(batch_norm.momentum)));
  if (silu) layers->push_back(nn::SiLU());
  return layers;
}

void check_batch_norm(const BatchNormSettings& batch_norm, const char* owner) {
  TY_CHECK(batch_norm.eps > 0, owner, ".batch_norm.eps must be > 0, got ", batch_norm.eps, ".");
  TY_CHECK(batch_norm.momentum >= 0 && batch_norm.momentum <= 1, owner,
           ".batch_norm.momentum must be in [0, 1], got ", batch_norm.momentum, ".");
}

}  // namespace

StochasticDepthImpl::StochasticDepthImpl(double p, StochasticDepthMode mode) : p(p), mode(mode) {
  TY_CHECK(p >= 0 && p <= 1, "StochasticDepth's drop probability must be in [0, 1], got ", p, ".");
}

torch::Tensor StochasticDepthImpl::forward(torch::Tensor x) {
  if (!is_training() || p == 0) return x;
  const double survival_rate = 1 - p;
  // (B, 1, ..., 1) for kRow, (1, ..., 1) for kBatch
  std::vector<int64_t> noise_shape(x.dim(), 1);
  if (mode == StochasticDepthMode::kRow) noise_shape[0] = x.size(0);
  auto noise = torch::empty(noise_shape, x.options()).bernoulli_(survival_rate);
  if (survival_rate > 0) noise.div_(survival_rate);
  return x * noise;
}

SqueezeExcitationImpl::SqueezeExcitationImpl(int channels, int squeeze_channels) {
  avgpool = register_module("avgpool", nn::AdaptiveAvgPool2d(1));
  fc1 = register_module("fc1", nn::Conv2d(nn::Conv2dOptions(channels, squeeze_channels, 1)));
  fc2 = register_module("fc2", nn::Conv2d(nn::Conv2dOptions(squeeze_channels, channels, 1)));
  activation = register_module("activation", nn::SiLU());
  scale_activation = register_module("scale_activation", nn::Sigmoid());
}

torch::Tensor SqueezeExcitationImpl::forward(torch::Tensor x) {
  auto scale = fc1->forward(avgpool->forward(x));  // (B, squeeze_channels, 1, 1)
  scale = scale_activation->forward(fc2->forward(activation->forward(scale)));  // (B, C, 1, 1)
  return scale * x;
}

int make_divisible(double value, int divisor) {
  // As Python's max(divisor, int(value + divisor / 2) // divisor * divisor), for value > 0.
  int rounded = std::max(divisor, static_cast<int>(value + divisor / 2.0) / divisor * divisor);
  if (rounded < 0.9 * value) rounded += divisor;  // never more than 10% below the value
  return rounded;
}

MBConvImpl::MBConvImpl(MBConvOptions options) {
  TY_CHECK(options.stride == 1 || options.stride == 2, "MBConvOptions.stride must be 1 or 2, got ",
           options.stride, ".");
  TY_CHECK(options.kernel >= 1 && options.kernel % 2 == 1,
           "MBConvOptions.kernel must be odd and >= 1, got ", options.kernel, ".");
  TY_CHECK(options.expand_ratio > 0, "MBConvOptions.expand_ratio must be > 0, got ",
           options.expand_ratio, ".");
  TY_CHECK(options.in_channels >= 1 && options.out_channels >= 1,
           "MBConvOptions.in_channels and out_channels must be >= 1, got ", options.in_channels,
           " and ", options.out_channels, ".");
  check_batch_norm(options.batch_norm, "MBConvOptions");
  residual = options.stride == 1 && options.in_channels == options.out_channels;

  const int in = options.in_channels;
  const int expanded = make_divisible(in * options.expand_ratio, 8);
  const auto& bn = options.batch_norm;
  block = nn::Sequential();
  if (expanded != in) block->push_back(conv_norm_activation(in, expanded, 1, 1, 1, bn, true));
  block->push_back(conv_norm_activation(expanded, expanded, options.kernel, options.stride,
                                        /*groups=*/expanded, bn, true));
  block->push_back(SqueezeExcitation(expanded, std::max(1, in / 4)));
  block->push_back(conv_norm_activation(expanded, options.out_channels, 1, 1, 1, bn, false));
  register_module("block", block);
  stochastic_depth =
      register_module("stochastic_depth",
                      StochasticDepth(options.stochastic_depth_prob, StochasticDepthMode::kRow));
}

torch::Tensor MBConvImpl::forward(torch::Tensor x) {
  auto out = block->forward(x);
  if (residual) {
    out = stochastic_depth->forward(out);
    out += x;
  }
  return out;
}

EfficientNetOptions EfficientNetOptions::variant(int variant) {
  TY_CHECK(variant >= 0 && variant < static_cast<int>(kVariants.size()),
           "EfficientNet variant must be 0..7 (B0..B7), got ", variant, ".");
  const auto& v = kVariants[variant];
  EfficientNetOptions options{
      .width_mult = v.width_mult, .depth_mult = v.depth_mult, .dropout = v.dropout};
  if (variant >= kFirstVariantWithTfBatchNorm) options.batch_norm = {.eps = 1e-3, .momentum = 0.01};
  return options;
}

void EfficientNetOptions::validate() const {
  TY_CHECK(width_mult > 0, "EfficientNetOptions.width_mult must be > 0, got ", width_mult, ".");
  TY_CHECK(depth_mult > 0, "EfficientNetOptions.depth_mult must be > 0, got ", depth_mult, ".");
  TY_CHECK(dropout >= 0 && dropout <= 1, "EfficientNetOptions.dropout must be in [0, 1], got ",
           dropout, ".");
  TY_CHECK(stochastic_depth_prob >= 0 && stochastic_depth_prob <= 1,
           "EfficientNetOptions.stochastic_depth_prob must be in [0, 1], got ",
           stochastic_depth_prob, ".");
  TY_CHECK(in_channels >= 1, "EfficientNetOptions.in_channels must be >= 1, got ", in_channels,
           ".");
  TY_CHECK(num_classes >= 1, "EfficientNetOptions.num_classes must be >= 1, got ", num_classes,
           ".");
  check_batch_norm(batch_norm, "EfficientNetOptions");
}

EfficientNetImpl::EfficientNetImpl(EfficientNetOptions options) {
  options.validate();
  const auto& bn = options.batch_norm;
  auto width = [&](int channels) { return make_divisible(channels * options.width_mult, 8); };
  auto depth = [&](int layers) { return static_cast<int>(std::ceil(layers * options.depth_mult)); };

  features = nn::Sequential();
  features->push_back(
      conv_norm_activation(options.in_channels, width(kStages[0].in_channels), 3, 2, 1, bn, true));
  int total_blocks = 0;
  for (const auto& stage : kStages) total_blocks += depth(stage.layers);
  int block_index = 0;
  for (const auto& stage : kStages) {
    TensorSequential blocks;
    for (int i = 0; i < depth(stage.layers); ++i) {
      // As torchvision: stochastic_depth_prob * block_index / total_blocks, in that order.
      const double drop = options.stochastic_depth_prob * block_index / total_blocks;
      blocks->push_back(MBConv(MBConvOptions{
          .expand_ratio = stage.expand_ratio,
          .kernel = stage.kernel,
          .stride = i == 0 ? stage.stride : 1,
          .in_channels = i == 0 ? width(stage.in_channels) : width(stage.out_channels),
          .out_channels = width(stage.out_channels),
          .stochastic_depth_prob = drop,
          .batch_norm = bn}));
      ++block_index;
    }
    features->push_back(blocks);
  }
  const int last_channels = width(kStages.back().out_channels);
  const int head_channels = 4 * last_channels;
  features->push_back(conv_norm_activation(last_channels, head_channels, 1, 1, 1, bn, true));
  register_module("features", features);
  avgpool = register_module("avgpool", nn::AdaptiveAvgPool2d(1));
  classifier = register_module(
      "classifier",
      nn::Sequential(nn::Dropout(options.dropout), nn::Linear(head_channels, options.num_classes)));

  torch::NoGradGuard no_grad;
  for (auto& m : modules(/*include_self=*/false)) {
    if (auto* c = m->as<nn::Conv2d>()) {
      // kaiming_normal_(mode="fan_out") with its default leaky_relu(0) gain, sqrt(2).
      nn::init::kaiming_normal_(c->weight, 0.0, torch::kFanOut);
      if (c->bias.defined()) nn::init::zeros_(c->bias);
    } else if (auto* b = m->as<nn::BatchNorm2d>()) {
      nn::init::ones_(b->weight);
      nn::init::zeros_(b->bias);
    } else if (auto* linear = m->as<nn::Linear>()) {
      const double range = 1.0 / std::sqrt(static_cast<double>(linear->options.out_features()));
      nn::init::uniform_(linear->weight, -range, range);
      nn::init::zeros_(linear->bias);
    }
  }
}

torch::Tensor EfficientNetImpl::forward(torch::Tensor x) {
  x = features->forward(x);
  x = avgpool->forward(x).flatten(1);  // (B, 4 * last stage channels)
  return classifier->forward(x);
}

EfficientNet efficientnet(int variant, int num_classes, int in_channels) {
  auto options = EfficientNetOptions::variant(variant);
  options.in_channels = in_channels;
  options.num_classes = num_classes;
  return EfficientNet(options);
}

}  // namespace trainyard::models
