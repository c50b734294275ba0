// ResNet (He et al. 2015) built as torchvision builds it, with the same module tree and parameter
// names (conv1.weight, layer1.0.conv1.weight, layer2.0.downsample.0.weight, fc.bias, ...) so state
// dicts line up with torchvision's. BasicBlock variants: ResNet-18 and ResNet-34; Bottleneck
// variants (torchvision's v1.5, the stride on the 3x3 conv): ResNet-50 and ResNet-101.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include "trainyard/models/image_model.h"
#include "trainyard/models/tap_conv2d.h"

#include <array>

namespace trainyard::models {

enum class ResNetBlock {
  kBasic,       // two 3x3 convs, expansion 1 (ResNet-18, -34)
  kBottleneck,  // 1x1, 3x3, 1x1 convs, expansion 4 (ResNet-50, -101, -152)
};

struct ResNetOptions {
  std::array<int, 4> layers = {2, 2, 2, 2};  // blocks per stage: {2,2,2,2} is ResNet-18
  ResNetBlock block = ResNetBlock::kBasic;
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

// torchvision's Bottleneck: conv1 1x1 (in_planes -> planes), conv2 3x3 with the stride,
// conv3 1x1 (planes -> 4 * planes), each followed by its BatchNorm.
class BottleneckImpl : public torch::nn::Module {
 public:
  static constexpr int kExpansion = 4;
  BottleneckImpl(int in_planes, int planes, int stride, double max_live_fraction);
  torch::Tensor forward(torch::Tensor x);

  TapConv2d conv1{nullptr}, conv2{nullptr}, conv3{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr}, bn2{nullptr}, bn3{nullptr};
  torch::nn::Sequential downsample{nullptr};  // conv 1x1 + BatchNorm when the shape changes
};
TORCH_MODULE(Bottleneck);

class ResNetImpl : public ImageModel {
 public:
  explicit ResNetImpl(ResNetOptions options);
  // (B, in_channels, H, W) -> (B, num_classes) logits
  torch::Tensor forward(torch::Tensor x) override;

  TapConv2d conv1{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr};
  torch::nn::Sequential layer1{nullptr}, layer2{nullptr}, layer3{nullptr}, layer4{nullptr};
  torch::nn::Linear fc{nullptr};

 private:
  torch::nn::Sequential make_layer(int& in_planes, int planes, int blocks, int stride);

  ResNetOptions options_;
};
TORCH_MODULE(ResNet);

// torchvision's resnet18(num_classes) with the seed's change: conv1 takes `in_channels` channels
// (7x7, stride 2, padding 3, no bias) and keeps PyTorch's default Conv2d initialisation, as a
// conv1 replaced after construction does.
ResNet resnet18(int in_channels = 3,
                int num_classes = 1000,
                double max_live_fraction = kMaxLiveFraction);

// torchvision's resnet34/50/101(num_classes), conv1 taking `in_channels` channels; every conv,
// conv1 included, keeps torchvision's initialisation. ResNet-50 has 25,557,032 parameters at
// 3 channels and 1000 classes.
ResNet resnet34(int in_channels = 3,
                int num_classes = 1000,
                double max_live_fraction = kMaxLiveFraction);
ResNet resnet50(int in_channels = 3,
                int num_classes = 1000,
                double max_live_fraction = kMaxLiveFraction);
ResNet resnet101(int in_channels = 3,
                 int num_classes = 1000,
                 double max_live_fraction = kMaxLiveFraction);

}  // namespace trainyard::models
