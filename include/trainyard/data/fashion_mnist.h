// FashionMNIST (Xiao et al. 2017): 60,000 training and 10,000 test 28x28 greyscale images of 10
// clothing classes, read from the IDX files of Debian's dataset-fashion-mnist package.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace trainyard::data {

inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

enum class Split { kTrain, kTest };

struct FashionMnist {
  torch::Tensor images;  // (N, 28, 28) uint8
  torch::Tensor labels;  // (N,) int64, in [0, 10)
  std::int64_t size() const { return labels.size(0); }
};

// Loads one split; `limit` >= 0 keeps only the first `limit` examples.
FashionMnist load_fashion_mnist(const std::string& dir, Split split, std::int64_t limit = -1);

// The batch for `indices`: images as (B, 1, 28, 28) float normalised with mean 0.5 and std 0.5
// (torchvision's ToTensor then Normalize((0.5,), (0.5,))), labels as (B,) int64.
std::pair<torch::Tensor, torch::Tensor> fashion_mnist_batch(
    const FashionMnist& data, const std::vector<std::int64_t>& indices);

}  // namespace trainyard::data
