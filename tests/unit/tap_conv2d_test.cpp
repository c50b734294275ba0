// TapConv2d against torch::nn::Conv2d: same outputs and the same input, weight and bias gradients
// on every geometry the per-tap path can meet (taps fully, partly or never live, strides, uneven
// and non-square maps, kernels larger than the map), and the fallback for what it does not handle.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tensor_diff.h"
#include "trainyard/models/resnet.h"
#include "trainyard/models/tap_conv2d.h"

namespace {

using trainyard::test::max_rel_diff;

using trainyard::models::TapConv2d;
namespace nn = torch::nn;

struct Geometry {
  int64_t in, out, kh, kw, stride, pad_h, pad_w, h, w;
  bool bias;
};

// Forward and backward through a TapConv2d that always takes the per-tap path and through a
// torch::nn::Conv2d with the same parameters; everything must agree.
void expect_same_as_torch(const Geometry& g, double max_live_fraction) {
  SCOPED_TRACE(::testing::Message()
               << g.in << "->" << g.out << " k" << g.kh << "x" << g.kw << " s" << g.stride << " p"
               << g.pad_h << "," << g.pad_w << " map " << g.h << "x" << g.w << " bias " << g.bias);
  torch::manual_seed(1);
  const auto options = nn::Conv2dOptions(g.in, g.out, {g.kh, g.kw})
                           .stride(g.stride)
                           .padding({g.pad_h, g.pad_w})
                           .bias(g.bias);
  TapConv2d tap(options);
  tap->max_live_fraction = max_live_fraction;
  nn::Conv2d reference(options);
  {
    torch::NoGradGuard no_grad;
    reference->weight.copy_(tap->weight);
    if (g.bias) reference->bias.copy_(tap->bias);
  }
  auto x1 = torch::randn({3, g.in, g.h, g.w}, torch::requires_grad());
  auto x2 = x1.detach().clone().requires_grad_();
  auto y1 = tap->forward(x1);
  auto y2 = reference->forward(x2);
  ASSERT_EQ(y1.sizes(), y2.sizes());
  EXPECT_LT(max_rel_diff(y1, y2), 1e-5);
  const auto grad = torch::randn_like(y2);
  y1.backward(grad);
  y2.backward(grad);
  EXPECT_LT(max_rel_diff(x1.grad(), x2.grad()), 1e-5);
  EXPECT_LT(max_rel_diff(tap->weight.grad(), reference->weight.grad()), 1e-5);
  if (g.bias) {
    EXPECT_LT(max_rel_diff(tap->bias.grad(), reference->bias.grad()), 1e-5);
  }
}

TEST(TapConv2dTest, MatchesTorchConvOnEveryGeometryWithThePerTapPath) {
  const std::vector<Geometry> geometries = {
      {8, 16, 3, 3, 1, 1, 1, 1, 1, false},  // one live tap of nine
      {8, 16, 3, 3, 1, 1, 1, 2, 2, false},  // partly live taps
      {8, 16, 3, 3, 2, 1, 1, 2, 2, true},   // stride 2: the top-left taps are dead
      {8, 16, 3, 3, 2, 1, 1, 5, 7, true},   // uneven, non-square map
      {6, 4, 1, 1, 2, 0, 0, 7, 7, false},   // 1x1 downsample
      {3, 5, 7, 7, 2, 3, 3, 9, 9, false},   // the stem's 7x7 conv
      {4, 4, 5, 3, 1, 2, 0, 3, 6, true},    // non-square kernel and padding
      {4, 4, 5, 5, 1, 2, 2, 1, 1, false},   // kernel larger than the map
      {4, 4, 3, 3, 3, 0, 0, 8, 8, false},   // windows with gaps: the last pixels are never read
  };
  for (const auto& g : geometries) expect_same_as_torch(g, /*max_live_fraction=*/1.0);
}

TEST(TapConv2dTest, MatchesTorchConvWithLibTorchsKernel) {
  expect_same_as_torch({8, 16, 3, 3, 1, 1, 1, 6, 6, true}, /*max_live_fraction=*/0.0);
}

TEST(TapConv2dTest, LiveFractionCountsTapsThatReadRealPixels) {
  using trainyard::models::live_fraction;
  EXPECT_DOUBLE_EQ(live_fraction({3, 3}, {1, 1}, {1, 1}, {1, 1}), 1.0 / 9);
  EXPECT_DOUBLE_EQ(live_fraction({3, 3}, {1, 1}, {1, 1}, {2, 2}), 16.0 / 36);
  EXPECT_DOUBLE_EQ(live_fraction({3, 3}, {2, 1}, {1, 1}, {2, 2}), (2.0 / 3) * (4.0 / 6));
  EXPECT_DOUBLE_EQ(live_fraction({1, 1}, {2, 2}, {0, 0}, {7, 7}), 1.0);
}

TEST(TapConv2dTest, FallsBackToTorchForGroupsAndDilation) {
  torch::manual_seed(2);
  TapConv2d grouped(nn::Conv2dOptions(4, 8, 3).groups(2).padding(1).dilation(2));
  auto x = torch::randn({2, 4, 5, 5});
  const auto expected = torch::conv2d(x, grouped->weight, grouped->bias, 1, 1, 2, 2);
  EXPECT_LT(max_rel_diff(grouped->forward(x), expected), 1e-6);
}

TEST(TapConv2dTest, ResNetKeepsTorchvisionParameterNames) {
  auto model = trainyard::models::resnet18(1, 10);
  const auto params = model->named_parameters();
  EXPECT_TRUE(params.contains("conv1.weight"));
  EXPECT_TRUE(params.contains("layer4.1.conv2.weight"));
  EXPECT_TRUE(params.contains("layer2.0.downsample.0.weight"));
  EXPECT_EQ(params.size(), 62u);
}

}  // namespace
