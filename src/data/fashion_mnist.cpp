#include "trainyard/data/fashion_mnist.h"

#include <torch/torch.h>

#include "trainyard/data/idx.h"
#include "trainyard/error.h"

namespace trainyard::data {

FashionMnist load_fashion_mnist(const std::string& dir, Split split, std::int64_t limit) {
  const std::string prefix = split == Split::kTrain ? "train" : "t10k";
  const std::string images_path = dir + "/" + prefix + "-images-idx3-ubyte.gz";
  const std::string labels_path = dir + "/" + prefix + "-labels-idx1-ubyte.gz";
  FashionMnist out;
  out.images = read_idx_ubyte(images_path, 3);
  out.labels = read_idx_ubyte(labels_path, 1).to(torch::kInt64);
  TY_CHECK_T(CorruptDataError, out.images.size(0) == out.labels.size(0), "FashionMNIST in ", dir,
             ": ", images_path, " holds ", out.images.size(0), " images but ", labels_path,
             " holds ", out.labels.size(0), " labels.");
  TY_CHECK_T(CorruptDataError, out.images.size(1) == 28 && out.images.size(2) == 28,
             "FashionMNIST images in ", images_path, " are ", out.images.size(1), "x",
             out.images.size(2), ", expected 28x28.");
  if (limit >= 0 && limit < out.size()) {
    out.images = out.images.narrow(0, 0, limit).contiguous();
    out.labels = out.labels.narrow(0, 0, limit).contiguous();
  }
  return out;
}

std::pair<torch::Tensor, torch::Tensor> fashion_mnist_batch(
    const FashionMnist& data, const std::vector<std::int64_t>& indices) {
  auto idx = torch::tensor(indices, torch::kInt64);
  // (B, 1, 28, 28): (x / 255 - 0.5) / 0.5 = x / 127.5 - 1
  auto images =
      data.images.index_select(0, idx).unsqueeze(1).to(torch::kFloat32).div_(127.5).sub_(1.0);
  auto labels = data.labels.index_select(0, idx);
  return {images, labels};
}

}  // namespace trainyard::data
