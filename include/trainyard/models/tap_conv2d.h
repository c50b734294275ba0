// A drop-in torch::nn::Conv2d (same options, same `weight`/`bias` parameters and initialisation)
// whose weight gradient on small feature maps is computed one kernel tap at a time.
//
// Note [Per-tap weight gradient]
// The weight gradient of a convolution is, for each kernel tap (i, j),
//   dW[:, :, i, j] = G_(i,j) * X_(i,j)^T
// where G_(i,j) is the (K x N*h*w) matrix of output gradients at the output positions whose input
// pixel for that tap lies inside the image, and X_(i,j) the (C x N*h*w) matrix of those input
// pixels. On the 1x1 and 2x2 maps of a ResNet's last stages most taps read only padding: a 3x3
// conv on a 1x1 map has one live tap of nine. oneDNN's backward-weights kernel (LibTorch 1.13,
// one thread) still pays for all nine and takes ~22 ms for ResNet-18's 512->512 conv at batch 128;
// the live tap alone is one 512x128x512 GEMM, ~1 ms. Where most (tap, output pixel) pairs are
// live, as on larger maps, oneDNN is faster and is kept. The switch point, a live fraction of
// kMaxLiveFraction, is measured by bench/conv_bench: per-tap wins at 0.11 and 0.44, loses at 0.69.
#pragma once

#include <torch/nn/modules/conv.h>
#include <torch/nn/pimpl.h>

namespace trainyard::models {

inline constexpr double kMaxLiveFraction = 0.5;

// The share of (kernel tap, output pixel) pairs whose input pixel lies inside the image rather
// than in the zero padding: 1 for a 1x1 conv, 1/9 for a 3x3 conv with padding 1 on a 1x1 map.
double live_fraction(torch::IntArrayRef kernel_size,
                     torch::IntArrayRef stride,
                     torch::IntArrayRef padding,
                     torch::IntArrayRef input_size);

// conv2d(x, weight, bias, stride, padding) for dilation 1, groups 1 and zero padding, with the
// per-tap weight gradient when live_fraction(...) <= max_live_fraction.
torch::Tensor tap_conv2d(const torch::Tensor& x,
                         const torch::Tensor& weight,
                         const torch::Tensor& bias,
                         torch::IntArrayRef stride,
                         torch::IntArrayRef padding,
                         double max_live_fraction = kMaxLiveFraction);

// The weight gradient alone, per tap, for any map size (what the backward pass uses on small maps).
torch::Tensor conv2d_weight_grad_per_tap(const torch::Tensor& grad_output,
                                         const torch::Tensor& x,
                                         torch::IntArrayRef kernel_size,
                                         torch::IntArrayRef stride,
                                         torch::IntArrayRef padding);

class TapConv2dImpl : public torch::nn::Conv2dImpl {
 public:
  using torch::nn::Conv2dImpl::Conv2dImpl;
  // The weight gradient is computed per tap when live_fraction(...) is at most this; 0 keeps
  // LibTorch's kernel (for comparisons).
  double max_live_fraction = kMaxLiveFraction;
  // Falls back to torch::nn::Conv2dImpl::forward for dilation, groups or a non-zero padding mode.
  torch::Tensor forward(const torch::Tensor& x);
};
TORCH_MODULE(TapConv2d);

}  // namespace trainyard::models
