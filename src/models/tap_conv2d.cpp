#include "trainyard/models/tap_conv2d.h"

#include <torch/torch.h>

#include <algorithm>

#include "trainyard/error.h"

namespace trainyard::models {
namespace {

// Along one spatial dimension, the outputs [out_begin, out_end) whose input pixel for kernel
// tap `tap` lies inside the image; the first of them reads input `in_begin`, the next ones
// every `stride` pixels after it.
struct LiveRange {
  int64_t out_begin = 0, out_end = 0, in_begin = 0;
  int64_t size() const { return out_end - out_begin; }
};

LiveRange live_range(int64_t tap, int64_t stride, int64_t pad, int64_t in_size, int64_t out_size) {
  // Output o reads input o * stride + tap - pad, which must lie in [0, in_size).
  LiveRange r;
  r.out_begin = tap >= pad ? 0 : (pad - tap + stride - 1) / stride;
  const int64_t last = in_size - 1 - tap + pad;  // o * stride <= last
  r.out_end = last < 0 ? 0 : std::min(out_size, last / stride + 1);
  r.out_end = std::max(r.out_begin, r.out_end);
  r.in_begin = r.out_begin * stride + tap - pad;
  return r;
}

// The live inputs of one tap along `dim` of a (C, N, H, W) tensor.
torch::Tensor live_inputs(const torch::Tensor& t, int64_t dim, const LiveRange& r, int64_t stride) {
  return t.slice(dim, r.in_begin, r.in_begin + (r.size() - 1) * stride + 1, stride);
}

// One dimension's share of (tap, output) pairs that read a real pixel.
double live_fraction_1d(int64_t kernel, int64_t stride, int64_t pad, int64_t in_size) {
  const int64_t out_size = (in_size + 2 * pad - kernel) / stride + 1;
  int64_t live = 0;
  for (int64_t tap = 0; tap < kernel; ++tap)
    live += live_range(tap, stride, pad, in_size, out_size).size();
  return static_cast<double>(live) / static_cast<double>(kernel * out_size);
}

struct TapConv2dFunction : torch::autograd::Function<TapConv2dFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx,
                               const torch::Tensor& x,
                               const torch::Tensor& weight,
                               std::vector<int64_t> stride,
                               std::vector<int64_t> padding,
                               double max_live_fraction) {
    ctx->save_for_backward({x, weight});
    ctx->saved_data["max_live_fraction"] = max_live_fraction;
    ctx->saved_data["stride"] = stride;
    ctx->saved_data["padding"] = padding;
    return at::conv2d(x, weight, /*bias=*/{}, stride, padding);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& x = saved[0];
    const auto& weight = saved[1];
    const auto stride = ctx->saved_data["stride"].toIntVector();
    const auto padding = ctx->saved_data["padding"].toIntVector();
    const auto& g = grads[0];
    const bool need_x = ctx->needs_input_grad(0), need_w = ctx->needs_input_grad(1);
    const bool small_map =
        live_fraction(weight.sizes().slice(2), stride, padding, x.sizes().slice(2)) <=
        ctx->saved_data["max_live_fraction"].toDouble();
    auto [grad_x, grad_w, unused_bias] = at::convolution_backward(
        g, x, weight, /*bias_sizes=*/c10::nullopt, stride, padding, /*dilation=*/{1, 1},
        /*transposed=*/false, /*output_padding=*/{0, 0}, /*groups=*/1,
        {need_x, need_w && !small_map, false});
    if (need_w && small_map) {
      grad_w = conv2d_weight_grad_per_tap(g, x, {weight.size(2), weight.size(3)}, stride, padding);
    }
    return {grad_x, grad_w, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor conv2d_weight_grad_per_tap(const torch::Tensor& grad_output,
                                         const torch::Tensor& x,
                                         torch::IntArrayRef kernel_size,
                                         torch::IntArrayRef stride,
                                         torch::IntArrayRef padding) {
  TY_CHECK(grad_output.dim() == 4 && x.dim() == 4,
           "conv2d_weight_grad_per_tap expects 4-d (N, C, H, W) tensors, got ", grad_output.sizes(),
           " and ", x.sizes(), ".");
  const int64_t out_channels = grad_output.size(1), in_channels = x.size(1);
  // Channels first, so that each tap's live pixels are the columns of a (channels x pixels) matrix.
  const auto g = grad_output.transpose(0, 1).contiguous();  // (K, N, OH, OW)
  const auto in = x.transpose(0, 1).contiguous();           // (C, N, H, W)
  // Written in place, tap by tap; taps that read only padding stay zero. One contiguous zero-fill
  // costs less than finding and clearing the dead taps' strided slots.
  auto grad_w =
      torch::zeros({out_channels, in_channels, kernel_size[0], kernel_size[1]}, g.options());
  auto product = torch::empty({out_channels, in_channels}, g.options());
  for (int64_t i = 0; i < kernel_size[0]; ++i) {
    const auto rows = live_range(i, stride[0], padding[0], x.size(2), grad_output.size(2));
    if (rows.size() == 0) continue;
    for (int64_t j = 0; j < kernel_size[1]; ++j) {
      const auto cols = live_range(j, stride[1], padding[1], x.size(3), grad_output.size(3));
      if (cols.size() == 0) continue;
      const auto g_tap = g.slice(2, rows.out_begin, rows.out_end)
                             .slice(3, cols.out_begin, cols.out_end)
                             .reshape({out_channels, -1});
      const auto x_tap = live_inputs(live_inputs(in, 2, rows, stride[0]), 3, cols, stride[1])
                             .reshape({in_channels, -1});
      at::mm_out(product, g_tap, x_tap.t());
      grad_w.select(3, j).select(2, i).copy_(product);
    }
  }
  return grad_w;
}

double live_fraction(torch::IntArrayRef kernel_size,
                     torch::IntArrayRef stride,
                     torch::IntArrayRef padding,
                     torch::IntArrayRef input_size) {
  return live_fraction_1d(kernel_size[0], stride[0], padding[0], input_size[0]) *
         live_fraction_1d(kernel_size[1], stride[1], padding[1], input_size[1]);
}

torch::Tensor tap_conv2d(const torch::Tensor& x,
                         const torch::Tensor& weight,
                         const torch::Tensor& bias,
                         torch::IntArrayRef stride,
                         torch::IntArrayRef padding,
                         double max_live_fraction) {
  auto out = TapConv2dFunction::apply(x, weight, stride.vec(), padding.vec(), max_live_fraction);
  if (bias.defined()) out = out + bias.view({1, -1, 1, 1});
  return out;
}

torch::Tensor TapConv2dImpl::forward(const torch::Tensor& x) {
  const auto& o = options;
  const auto* padding = std::get_if<torch::ExpandingArray<2>>(&o.padding());
  const bool plain = padding != nullptr && o.groups() == 1 && (*o.dilation())[0] == 1 &&
                     (*o.dilation())[1] == 1 &&
                     std::holds_alternative<torch::enumtype::kZeros>(o.padding_mode());
  if (!plain || x.dim() != 4) return torch::nn::Conv2dImpl::forward(x);
  return tap_conv2d(x, weight, bias, *o.stride(), **padding, max_live_fraction);
}

}  // namespace trainyard::models
