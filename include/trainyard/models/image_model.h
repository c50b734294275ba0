// Image classifiers by name: the base every trainyard image model derives from (ResNet,
// EfficientNet) and image_model(), which builds one from its torchvision name ("resnet50",
// "efficientnet_b3", ...) so a recipe or a CLI flag can pick the architecture.
#pragma once

#include <torch/nn/module.h>

#include <memory>
#include <string>
#include <vector>

namespace trainyard::models {

// A module mapping images to logits. Its parameters and buffers carry torchvision's names, so
// state dicts line up with the torchvision model of the same name.
class ImageModel : public torch::nn::Module {
 public:
  // (B, in_channels, H, W) -> (B, num_classes) logits
  virtual torch::Tensor forward(torch::Tensor x) = 0;
};

// The names image_model() knows, in the order its error message lists them.
const std::vector<std::string>& image_model_names();

// The model torchvision builds as torchvision.models.<name>(num_classes=num_classes), with its
// stem convolution taking `in_channels` channels. The result works where a module holder does:
// model->forward(x), model->parameters(), ddp::DistributedDataParallel(model, ...).
// Throws InvalidArgumentError for a name not in image_model_names(), listing those names.
std::shared_ptr<ImageModel> image_model(const std::string& name, int in_channels, int num_classes);

}  // namespace trainyard::models
