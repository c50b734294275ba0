// ResNet (He et al. 2015) built as torchvision builds it, with the same module tree and parameter
// names (conv1.weight, layer1.0.conv1.weight, layer2.0.downsample.0.weight, fc.bias, ...) so state
// dicts line up with torchvision's. BasicBlock variants: ResNet-18 and ResNet-34.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include "trainyard/models/tap_conv2d.h"

#include <array>

namespace trainyard::models {

struct ResNetOptions {
  std::array<int, 4> layers = {2, 2, 2, 2};  // BasicBlocks per stage: {2,2,2,2} is ResNet-18
  int in_channels = 3;
  int num_classes = 1000;
  // Convolutions use the per-tap weight gradient (Note [Per-tap weight gradient]) where at most
  // this share of (tap, output pixel) pairs reads real pixels; 0 keeps LibTorch's kernel.
  double max_live_fraction = kMaxLiveFraction;
};

class BasicBlockImpl : public torch::nn::Module {
 public:
  static constexpr int kExpansion = 1;
  BasicBlockImpl(int in_planes, int planes, int stride, double max_live_fraction);
  torch::Tensor forward(torch::Tensor x);

  TapConv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr}, bn2{nullptr};
  torch::nn::Sequential downsample{nullptr};  // conv 1x1 + BatchNorm when the shape changes
};
TORCH_MODULE(BasicBlock);

class ResNetImpl : public torch::nn::Module {
 public:
  explicit ResNetImpl(ResNetOptions options);
  // (B, in_channels, H, W) -> (B, num_classes) logits
  torch::Tensor forward(torch::Tensor x);

  TapConv2d conv1{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr};
  torch::nn::Sequential layer1{nullptr}, layer2{nullptr}, layer3{nullptr}, layer4{nullptr};
  torch::nn::Linear fc{nullptr};

 private:
  torch::nn::Sequential make_layer(
      int& in_planes, int planes, int blocks, int stride, double max_live_fraction);
};
TORCH_MODULE(ResNet);

// torchvision's resnet18(num_classes) with the seed's change: conv1 takes `in_channels` channels
// (7x7, stride 2, padding 3, no bias) and keeps PyTorch's default Conv2d initialisation, as a
// conv1 replaced after construction does.
ResNet resnet18(int in_channels = 3,
                int num_classes = 1000,
                double max_live_fraction = kMaxLiveFraction);

}  // namespace trainyard::models
