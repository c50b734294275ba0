#include "trainyard/models/resnet.h"

#include <torch/torch.h>

#include "trainyard/error.h"

namespace trainyard::models {
namespace nn = torch::nn;

namespace {
TapConv2d conv(int in, int out, int kernel, int stride, int padding, double max_live_fraction) {
  TapConv2d c(nn::Conv2dOptions(in, out, kernel).stride(stride).padding(padding).bias(false));
  c->max_live_fraction = max_live_fraction;
  return c;
}

// torchvision's downsample: a strided 1x1 conv and a BatchNorm bringing the block's input to the
// shape of its output, or null where the shapes already agree.
nn::Sequential downsample_or_null(int in_planes, int out_planes, int stride, double tap) {
  if (stride == 1 && in_planes == out_planes) return nullptr;
  return nn::Sequential(conv(in_planes, out_planes, 1, stride, 0, tap),
                        nn::BatchNorm2d(out_planes));
}

int expansion(ResNetBlock block) {
  return block == ResNetBlock::kBottleneck ? BottleneckImpl::kExpansion
                                           : BasicBlockImpl::kExpansion;
}
}  // namespace

BasicBlockImpl::BasicBlockImpl(int in_planes, int planes, int stride, double max_live_fraction) {
  const auto tap = max_live_fraction;
  conv1 = register_module("conv1", conv(in_planes, planes, 3, stride, 1, tap));
  bn1 = register_module("bn1", nn::BatchNorm2d(planes));
  conv2 = register_module("conv2", conv(planes, planes, 3, 1, 1, tap));
  bn2 = register_module("bn2", nn::BatchNorm2d(planes));
  if (auto d = downsample_or_null(in_planes, planes * kExpansion, stride, tap))
    downsample = register_module("downsample", d);
}

torch::Tensor BasicBlockImpl::forward(torch::Tensor x) {
  // In-place ReLU and residual add, as torchvision's ReLU(inplace=True) and `out += identity`:
  // fewer allocations and one less pass over each activation.
  auto out = bn1->forward(conv1->forward(x)).relu_();
  out = bn2->forward(conv2->forward(out));
  out += downsample ? downsample->forward(x) : x;
  return out.relu_();
}

BottleneckImpl::BottleneckImpl(int in_planes, int planes, int stride, double max_live_fraction) {
  const auto tap = max_live_fraction;
  conv1 = register_module("conv1", conv(in_planes, planes, 1, 1, 0, tap));
  bn1 = register_module("bn1", nn::BatchNorm2d(planes));
  conv2 = register_module("conv2", conv(planes, planes, 3, stride, 1, tap));
  bn2 = register_module("bn2", nn::BatchNorm2d(planes));
  conv3 = register_module("conv3", conv(planes, planes * kExpansion, 1, 1, 0, tap));
  bn3 = register_module("bn3", nn::BatchNorm2d(planes * kExpansion));
  if (auto d = downsample_or_null(in_planes, planes * kExpansion, stride, tap))
    downsample = register_module("downsample", d);
}

torch::Tensor BottleneckImpl::forward(torch::Tensor x) {
  auto out = bn1->forward(conv1->forward(x)).relu_();
  out = bn2->forward(conv2->forward(out)).relu_();
  out = bn3->forward(conv3->forward(out));
  out += downsample ? downsample->forward(x) : x;
  return out.relu_();
}

ResNetImpl::ResNetImpl(ResNetOptions options) : options_(options) {
  TY_CHECK(options.in_channels >= 1, "ResNetOptions.in_channels must be >= 1, got ",
           options.in_channels, ".");
  TY_CHECK(options.num_classes >= 1, "ResNetOptions.num_classes must be >= 1, got ",
           options.num_classes, ".");
  for (int i = 0; i < 4; ++i) {
    TY_CHECK(options.layers[i] >= 1, "ResNetOptions.layers[", i, "] must be >= 1, got ",
             options.layers[i], ".");
  }
  int in_planes = 64;
  const auto tap = options.max_live_fraction;
  TY_CHECK(tap >= 0, "ResNetOptions.max_live_fraction must be >= 0, got ", tap, ".");
  conv1 = register_module("conv1", conv(options.in_channels, 64, 7, 2, 3, tap));
  bn1 = register_module("bn1", nn::BatchNorm2d(64));
  layer1 = register_module("layer1", make_layer(in_planes, 64, options.layers[0], 1));
  layer2 = register_module("layer2", make_layer(in_planes, 128, options.layers[1], 2));
  layer3 = register_module("layer3", make_layer(in_planes, 256, options.layers[2], 2));
  layer4 = register_module("layer4", make_layer(in_planes, 512, options.layers[3], 2));
  fc = register_module("fc", nn::Linear(512 * expansion(options.block), options.num_classes));

  // torchvision: He initialisation (fan_out) for convolutions, BatchNorm to identity.
  torch::NoGradGuard no_grad;
  for (auto& m : modules(/*include_self=*/false)) {
    if (auto* c = m->as<nn::Conv2d>()) {
      nn::init::kaiming_normal_(c->weight, 0.0, torch::kFanOut, torch::kReLU);
    } else if (auto* bn = m->as<nn::BatchNorm2d>()) {
      nn::init::ones_(bn->weight);
      nn::init::zeros_(bn->bias);
    }
  }
}

// One stage: the first block takes the stride and the change of width, the others keep both.
nn::Sequential ResNetImpl::make_layer(int& in_planes, int planes, int blocks, int stride) {
  const auto tap = options_.max_live_fraction;
  nn::Sequential layer;
  for (int i = 0; i < blocks; ++i) {
    const int block_stride = i == 0 ? stride : 1;
    if (options_.block == ResNetBlock::kBottleneck) {
      layer->push_back(Bottleneck(in_planes, planes, block_stride, tap));
    } else {
      layer->push_back(BasicBlock(in_planes, planes, block_stride, tap));
    }
    in_planes = planes * expansion(options_.block);
  }
  return layer;
}

torch::Tensor ResNetImpl::forward(torch::Tensor x) {
  x = bn1->forward(conv1->forward(x)).relu_();
  x = torch::max_pool2d(x, /*kernel_size=*/3, /*stride=*/2, /*padding=*/1);
  x = layer4->forward(layer3->forward(layer2->forward(layer1->forward(x))));
  x = torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1);  // (B, 512 * expansion)
  return fc->forward(x);
}

ResNet resnet18(int in_channels, int num_classes, double max_live_fraction) {
  ResNet model(ResNetOptions{.layers = {2, 2, 2, 2},
                             .block = ResNetBlock::kBasic,
                             .in_channels = in_channels,
                             .num_classes = num_classes,
                             .max_live_fraction = max_live_fraction});
  model->conv1->reset_parameters();
  return model;
}

ResNet resnet34(int in_channels, int num_classes, double max_live_fraction) {
  return ResNet(ResNetOptions{.layers = {3, 4, 6, 3},
                              .block = ResNetBlock::kBasic,
                              .in_channels = in_channels,
                              .num_classes = num_classes,
                              .max_live_fraction = max_live_fraction});
}

ResNet resnet50(int in_channels, int num_classes, double max_live_fraction) {
  return ResNet(ResNetOptions{.layers = {3, 4, 6, 3},
                              .block = ResNetBlock::kBottleneck,
                              .in_channels = in_channels,
                              .num_classes = num_classes,
                              .max_live_fraction = max_live_fraction});
}

ResNet resnet101(int in_channels, int num_classes, double max_live_fraction) {
  return ResNet(ResNetOptions{.layers = {3, 4, 23, 3},
                              .block = ResNetBlock::kBottleneck,
                              .in_channels = in_channels,
                              .num_classes = num_classes,
                              .max_live_fraction = max_live_fraction});
}

}  // namespace trainyard::models
