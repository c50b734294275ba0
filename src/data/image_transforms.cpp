#include "trainyard/data/image_transforms.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "trainyard/error.h"

namespace trainyard::data {

void ImageTransformOptions::validate() const {
  TY_CHECK(size >= 1, "ImageTransformOptions.size must be >= 1, got ", size, ".");
  TY_CHECK(resize_size == 0 || resize_size >= size, "ImageTransformOptions.resize_size ",
           resize_size, " is smaller than the crop size ", size,
           ". HINT: leave it 0 for the default (size * 256 / 224).");
  TY_CHECK(scale_min > 0 && scale_min <= scale_max && scale_max <= 1,
           "ImageTransformOptions scale range [", scale_min, ", ", scale_max,
           "] must satisfy 0 < scale_min <= scale_max <= 1.");
  TY_CHECK(ratio_min > 0 && ratio_min <= ratio_max, "ImageTransformOptions ratio range [",
           ratio_min, ", ", ratio_max, "] must satisfy 0 < ratio_min <= ratio_max.");
  TY_CHECK(flip_probability >= 0 && flip_probability <= 1,
           "ImageTransformOptions.flip_probability must be in [0, 1], got ", flip_probability, ".");
  for (int c = 0; c < 3; ++c)
    TY_CHECK(stddev[c] > 0, "ImageTransformOptions.stddev[", c, "] must be > 0, got ", stddev[c],
             ".");
}

// --- SampleRandom -----------------------------------------------------------------------------

namespace {

constexpr std::uint64_t kGolden = 0x9E3779B97F4A7C15ULL;

std::uint64_t splitmix64_mix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

}  // namespace

SampleRandom::SampleRandom(std::uint64_t seed, std::int64_t epoch, std::int64_t index) {
  std::uint64_t state = splitmix64_mix(seed + kGolden);
  state = splitmix64_mix(state ^ static_cast<std::uint64_t>(epoch));
  state_ = splitmix64_mix(state ^ static_cast<std::uint64_t>(index));
}

std::uint64_t SampleRandom::next() {
  state_ += kGolden;
  return splitmix64_mix(state_);
}

double SampleRandom::uniform(double low, double high) {
  const double unit = static_cast<double>(next() >> 11) * 0x1.0p-53;  // [0, 1), 53 bits
  return low + (high - low) * unit;
}

std::int64_t SampleRandom::uniform_int(std::int64_t low, std::int64_t high) {
  TY_ASSERT(high > low, "uniform_int(", low, ", ", high, ")");
  const double unit = static_cast<double>(next() >> 11) * 0x1.0p-53;
  const auto n = high - low;
  return low +
         std::min<std::int64_t>(static_cast<std::int64_t>(unit * static_cast<double>(n)), n - 1);
}

// --- Boxes ------------------------------------------------------------------------------------

namespace {

// Python's round(): half to even (the default floating-point rounding mode).
int round_half_even(double x) {
  return static_cast<int>(std::nearbyint(x));
}

}  // namespace

CropBox random_resized_crop_box(int height,
                                int width,
                                const ImageTransformOptions& options,
                                SampleRandom& random) {
  const double area = static_cast<double>(height) * width;
  const double log_ratio_min = std::log(options.ratio_min);
  const double log_ratio_max = std::log(options.ratio_max);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area = area * random.uniform(options.scale_min, options.scale_max);
    const double aspect_ratio = std::exp(random.uniform(log_ratio_min, log_ratio_max));
    const int w = round_half_even(std::sqrt(target_area * aspect_ratio));
    const int h = round_half_even(std::sqrt(target_area / aspect_ratio));
    if (0 < w && w <= width && 0 < h && h <= height) {
      const auto top = static_cast<int>(random.uniform_int(0, height - h + 1));
      const auto left = static_cast<int>(random.uniform_int(0, width - w + 1));
      return {.top = top, .left = left, .height = h, .width = w};
    }
  }
  // Fallback to the central crop.
  const double in_ratio = static_cast<double>(width) / height;
  int w = width;
  int h = height;
  if (in_ratio < options.ratio_min) {
    h = round_half_even(w / options.ratio_min);
  } else if (in_ratio > options.ratio_max) {
    w = round_half_even(h * options.ratio_max);
  }
  return {.top = (height - h) / 2, .left = (width - w) / 2, .height = h, .width = w};
}

CropBox center_crop_box(int height, int width, int crop_height, int crop_width) {
  TY_CHECK(crop_height <= height && crop_width <= width, "A center crop of ", crop_height, "x",
           crop_width, " does not fit a ", height, "x", width, " image.");
  return {.top = round_half_even((height - crop_height) / 2.0),
          .left = round_half_even((width - crop_width) / 2.0),
          .height = crop_height,
          .width = crop_width};
}

std::array<int, 2> resize_shorter_side(int height, int width, int shorter) {
  const int short_side = std::min(height, width);
  const int long_side = std::max(height, width);
  // int(shorter * long / short) in Python: an exact product, a true division, truncation.
  const auto new_long = static_cast<int>(
      static_cast<double>(static_cast<std::int64_t>(shorter) * long_side) / short_side);
  if (width <= height) return {new_long, shorter};
  return {shorter, new_long};
}

// --- Resampling -------------------------------------------------------------------------------
// Note [PIL resize]
// torchvision's ImageFolder hands PIL images to its transforms, so Resize and RandomResizedCrop
// resample with PIL's bilinear filter, which antialiases when shrinking: the triangle kernel is
// stretched by the scale factor, so every source pixel contributes. Pretrained ImageNet models
// and their published accuracies come from that pipeline. torch's interpolate(bilinear) without
// antialias reads only the 2x2 nearest pixels and aliases at the ~2x shrink ImageNet images get;
// with antialias=true it is close to PIL's but computes in float without PIL's rounding between
// the passes, so some bytes differ by one. This is PIL's algorithm (Resample.c:
// precompute_coeffs, normalize_coeffs_8bpc, ImagingResampleHorizontal/Vertical_8bpc) on our HWC
// buffers: the same double-precision weights, converted to fixed point with 22 fractional bits,
// the horizontal pass into an 8-bit temporary, then the vertical pass. It needs no ATen call, so
// loader threads do not start ATen's intra-op thread pool.

namespace {

constexpr int kPrecisionBits = 32 - 8 - 2;

// For each output position o, `count[o]` input positions from `first[o]` with fixed-point
// weights weights[o * stride + i].
struct Taps {
  int stride = 0;
  std::vector<int> first;
  std::vector<int> count;
  std::vector<std::int32_t> weights;
};

double triangle(double x) {
  x = std::abs(x);
  return x < 1.0 ? 1.0 - x : 0.0;
}

Taps bilinear_taps(int in_size, int out_size) {
  const double scale = static_cast<double>(in_size) / out_size;
  const double filter_scale = std::max(scale, 1.0);
  const double support = 1.0 * filter_scale;  // the triangle's support is 1
  const double inverse_filter_scale = 1.0 / filter_scale;
  Taps taps;
  taps.stride = static_cast<int>(std::ceil(support)) * 2 + 1;
  taps.first.resize(out_size);
  taps.count.resize(out_size);
  taps.weights.assign(static_cast<std::size_t>(out_size) * taps.stride, 0);
  std::vector<double> w(taps.stride);
  for (int o = 0; o < out_size; ++o) {
    const double center = (o + 0.5) * scale;
    // C casts truncate toward zero, as in PIL.
    const int lo = std::max(static_cast<int>(center - support + 0.5), 0);
    const int hi = std::min(static_cast<int>(center + support + 0.5), in_size);
    const int n = hi - lo;
    double total = 0;
    for (int i = 0; i < n; ++i) {
      w[i] = triangle((i + lo - center + 0.5) * inverse_filter_scale);
      total += w[i];
    }
    std::int32_t* fixed = taps.weights.data() + static_cast<std::size_t>(o) * taps.stride;
    for (int i = 0; i < n; ++i) {
      const double normalised = total != 0.0 ? w[i] / total : w[i];  // >= 0
      fixed[i] = static_cast<std::int32_t>(0.5 + normalised * (1 << kPrecisionBits));
    }
    taps.first[o] = lo;
    taps.count[o] = n;
  }
  return taps;
}

std::uint8_t clip8(std::int32_t sum) {
  if (sum >= (1 << kPrecisionBits << 8)) return 255;
  if (sum <= 0) return 0;
  return static_cast<std::uint8_t>(sum >> kPrecisionBits);
}

RgbImage crop(const RgbImage& image, CropBox box) {
  RgbImage out(box.height, box.width);
  for (int y = 0; y < box.height; ++y)
    std::memcpy(out.at(y, 0), image.at(box.top + y, box.left),
                static_cast<std::size_t>(box.width) * 3);
  return out;
}

void flip_horizontal(RgbImage& image) {
  for (int y = 0; y < image.height; ++y) {
    std::uint8_t* row = image.at(y, 0);
    for (int a = 0, b = image.width - 1; a < b; ++a, --b)
      std::swap_ranges(row + a * 3, row + a * 3 + 3, row + b * 3);
  }
}

}  // namespace

RgbImage resize_bilinear(const RgbImage& image, CropBox box, int height, int width) {
  TY_CHECK(box.top >= 0 && box.left >= 0 && box.height >= 1 && box.width >= 1 &&
               box.top + box.height <= image.height && box.left + box.width <= image.width,
           "resize_bilinear: the box (top ", box.top, ", left ", box.left, ", ", box.height, "x",
           box.width, ") is not inside the ", image.height, "x", image.width, " image.");
  TY_CHECK(height >= 1 && width >= 1, "resize_bilinear: the output size ", height, "x", width,
           " is empty.");
  if (box.height == height && box.width == width) return crop(image, box);

  const Taps across = bilinear_taps(box.width, width);
  const Taps down = bilinear_taps(box.height, height);
  const std::int32_t half = 1 << (kPrecisionBits - 1);

  // Horizontal pass, over the box's rows [row_first, row_last) that the vertical pass reads.
  const int row_first = down.first.front();
  const int row_last = down.first.back() + down.count.back();
  RgbImage temp(row_last - row_first, width);
  for (int r = 0; r < temp.height; ++r) {
    const std::uint8_t* in = image.at(box.top + row_first + r, box.left);
    std::uint8_t* out = temp.at(r, 0);
    for (int x = 0; x < width; ++x) {
      const std::uint8_t* p = in + across.first[x] * 3;
      const std::int32_t* k = across.weights.data() + static_cast<std::size_t>(x) * across.stride;
      std::int32_t s0 = half, s1 = half, s2 = half;
      for (int i = 0; i < across.count[x]; ++i, p += 3) {
        s0 += p[0] * k[i];
        s1 += p[1] * k[i];
        s2 += p[2] * k[i];
      }
      out[x * 3 + 0] = clip8(s0);
      out[x * 3 + 1] = clip8(s1);
      out[x * 3 + 2] = clip8(s2);
    }
  }

  // Vertical pass.
  RgbImage result(height, width);
  const std::size_t row_bytes = static_cast<std::size_t>(width) * 3;
  std::vector<std::int32_t> sums(row_bytes);
  for (int y = 0; y < height; ++y) {
    std::fill(sums.begin(), sums.end(), half);
    const std::int32_t* k = down.weights.data() + static_cast<std::size_t>(y) * down.stride;
    for (int i = 0; i < down.count[y]; ++i) {
      const std::uint8_t* in = temp.at(down.first[y] - row_first + i, 0);
      for (std::size_t b = 0; b < row_bytes; ++b) sums[b] += in[b] * k[i];
    }
    std::uint8_t* out = result.at(y, 0);
    for (std::size_t b = 0; b < row_bytes; ++b) out[b] = clip8(sums[b]);
  }
  return result;
}

RgbImage transform_image(const RgbImage& image,
                         const ImageTransformOptions& options,
                         SampleRandom& random) {
  const int size = options.size;
  if (options.kind == ImageTransform::kTrain) {
    const CropBox box = random_resized_crop_box(image.height, image.width, options, random);
    RgbImage out = resize_bilinear(image, box, size, size);
    // RandomHorizontalFlip: flip when rand() < p.
    if (random.uniform(0.0, 1.0) < options.flip_probability) flip_horizontal(out);
    return out;
  }
  const auto [height, width] =
      resize_shorter_side(image.height, image.width, options.eval_resize_size());
  const CropBox whole{.top = 0, .left = 0, .height = image.height, .width = image.width};
  // Resize returns the image itself when the size does not change; resize_bilinear copies it.
  const RgbImage resized = resize_bilinear(image, whole, height, width);
  return crop(resized, center_crop_box(height, width, size, size));
}

void to_normalized_chw(const RgbImage& image,
                       const std::array<float, 3>& mean,
                       const std::array<float, 3>& stddev,
                       float* out) {
  const std::size_t plane = static_cast<std::size_t>(image.height) * image.width;
  for (int c = 0; c < 3; ++c) {
    float* channel = out + c * plane;
    const std::uint8_t* in = image.pixels.data() + c;
    // ToTensor divides by 255, then Normalize subtracts and divides, each rounded to float32.
    for (std::size_t i = 0; i < plane; ++i)
      channel[i] = (static_cast<float>(in[i * 3]) / 255.0f - mean[c]) / stddev[c];
  }
}

}  // namespace trainyard::data
