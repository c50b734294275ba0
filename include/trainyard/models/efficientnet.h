// EfficientNet B0..B7 (Tan & Le 2019) built as torchvision 0.14 builds it, with the same module
// tree and parameter names (features.1.0.block.1.0.weight, features.2.0.block.2.fc1.bias,
// classifier.1.weight, ...) so state dicts line up with torchvision's. Also the pieces it is made
// of: TensorSequential, StochasticDepth, SqueezeExcitation and the MBConv block.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/pooling.h>
#include <torch/nn/pimpl.h>

#include "trainyard/models/image_model.h"

#include <utility>

namespace trainyard::models {

// A Sequential whose forward is Tensor -> Tensor, so that it can sit inside another Sequential
// (LibTorch's SequentialImpl::forward is a template, which AnyModule cannot hold). torchvision's
// Conv2dNormActivation and each EfficientNet stage are one.
class TensorSequentialImpl : public torch::nn::SequentialImpl {
 public:
  using torch::nn::SequentialImpl::SequentialImpl;
  torch::Tensor forward(torch::Tensor x) { return SequentialImpl::forward(std::move(x)); }
};
TORCH_MODULE(TensorSequential);

enum class StochasticDepthMode {
  kRow,    // each row of the batch is dropped on its own
  kBatch,  // the whole batch is dropped or kept together
};

// torchvision.ops.StochasticDepth (Huang et al. 2016): in training, zeroes the input with
// probability `p` (per row or for the whole batch) and scales what survives by 1 / (1 - p);
// in evaluation, the identity. No parameters or buffers.
class StochasticDepthImpl : public torch::nn::Module {
 public:
  StochasticDepthImpl(double p, StochasticDepthMode mode);
  torch::Tensor forward(torch::Tensor x);

  double p;
  StochasticDepthMode mode;
};
TORCH_MODULE(StochasticDepth);

// torchvision.ops.SqueezeExcitation with SiLU: x * sigmoid(fc2(silu(fc1(avgpool(x))))), where
// fc1 and fc2 are 1x1 convs with bias (channels -> squeeze_channels -> channels).
class SqueezeExcitationImpl : public torch::nn::Module {
 public:
  SqueezeExcitationImpl(int channels, int squeeze_channels);
  // (B, C, H, W) -> (B, C, H, W)
  torch::Tensor forward(torch::Tensor x);

  torch::nn::AdaptiveAvgPool2d avgpool{nullptr};
  torch::nn::Conv2d fc1{nullptr}, fc2{nullptr};
  torch::nn::SiLU activation{nullptr};
  torch::nn::Sigmoid scale_activation{nullptr};
};
TORCH_MODULE(SqueezeExcitation);

// BatchNorm settings shared by every BatchNorm of one network.
struct BatchNormSettings {
  double eps = 1e-5;
  double momentum = 0.1;  // PyTorch's convention: running = (1 - momentum) * running + momentum * x
};

struct MBConvOptions {
  double expand_ratio = 6;  // expanded channels = make_divisible(in_channels * expand_ratio, 8)
  int kernel = 3;           // of the depthwise conv
  int stride = 1;           // of the depthwise conv: 1 or 2
  int in_channels = 0;
  int out_channels = 0;
  double stochastic_depth_prob = 0;
  BatchNormSettings batch_norm;
};

// The inverted-residual block with squeeze-and-excitation. `block` holds, in order: the 1x1
// expansion (conv, BatchNorm, SiLU; absent when expand_ratio leaves the width unchanged), the
// depthwise conv (conv, BatchNorm, SiLU), SqueezeExcitation with max(1, in_channels / 4) squeeze
// channels, and the 1x1 projection (conv, BatchNorm). With stride 1 and equal widths the block is
// residual and its branch goes through stochastic_depth first.
class MBConvImpl : public torch::nn::Module {
 public:
  explicit MBConvImpl(MBConvOptions options);
  // (B, in_channels, H, W) -> (B, out_channels, H / stride, W / stride), rounded up
  torch::Tensor forward(torch::Tensor x);

  torch::nn::Sequential block{nullptr};
  StochasticDepth stochastic_depth{nullptr};
  bool residual = false;
};
TORCH_MODULE(MBConv);

// torchvision's _make_divisible(value, divisor): the multiple of `divisor` nearest `value`, at
// least `divisor` and no less than 90% of `value`.
int make_divisible(double value, int divisor = 8);

struct EfficientNetOptions {
  double width_mult = 1.0;  // channels of every stage, before make_divisible(..., 8)
  double depth_mult = 1.0;  // blocks of every stage, rounded up
  double dropout = 0.2;     // before the classifier's Linear
  // The last block's; block i of n gets stochastic_depth_prob * i / n.
  double stochastic_depth_prob = 0.2;
  int in_channels = 3;
  int num_classes = 1000;
  BatchNormSettings batch_norm;

  // torchvision's efficientnet_b<variant> settings, variant 0..7: B0 is width 1.0, depth 1.0,
  // dropout 0.2; B7 width 2.0, depth 3.1, dropout 0.5 and BatchNorm eps 1e-3, momentum 0.01
  // (B5..B7). Throws InvalidArgumentError for another variant.
  static EfficientNetOptions variant(int variant);
  // Throws InvalidArgumentError naming the first field out of range.
  void validate() const;
};

// `features` is a Sequential of the stem (3x3 stride-2 conv, BatchNorm, SiLU), seven stages
// (each a Sequential of MBConv blocks) and the head (1x1 conv to 4x the last stage's width,
// BatchNorm, SiLU); then `avgpool` and `classifier` (Dropout, Linear). Initialised as torchvision
// does: He normal (fan_out) convs with zero biases, BatchNorm to identity, Linear weights
// uniform in +-1/sqrt(num_classes) with zero bias.
class EfficientNetImpl : public ImageModel {
 public:
  explicit EfficientNetImpl(EfficientNetOptions options);
  // (B, in_channels, H, W) -> (B, num_classes) logits
  torch::Tensor forward(torch::Tensor x) override;

  torch::nn::Sequential features{nullptr};
  torch::nn::AdaptiveAvgPool2d avgpool{nullptr};
  torch::nn::Sequential classifier{nullptr};
};
TORCH_MODULE(EfficientNet);

// torchvision's efficientnet_b<variant>(num_classes), variant 0..7, its stem taking
// `in_channels` channels. B0 has 5,288,548 parameters at 3 channels and 1000 classes.
EfficientNet efficientnet(int variant, int num_classes = 1000, int in_channels = 3);

}  // namespace trainyard::models
