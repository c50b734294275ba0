// torchvision's ImageNet transforms on 8-bit RGB images, as its ImageFolder pipeline applies them
// to PIL images: train = RandomResizedCrop + RandomHorizontalFlip, eval = Resize + CenterCrop,
// both followed by ToTensor + Normalize. Randomness comes from a generator seeded per sample.
#pragma once

#include <array>
#include <cstdint>

#include "trainyard/data/image_decode.h"

namespace trainyard::data {

inline constexpr std::array<float, 3> kImageNetMean = {0.485f, 0.456f, 0.406f};
inline constexpr std::array<float, 3> kImageNetStd = {0.229f, 0.224f, 0.225f};

enum class ImageTransform {
  kTrain,  // RandomResizedCrop(size, scale, ratio) + RandomHorizontalFlip(flip_probability)
  kEval,   // Resize(resize_size) + CenterCrop(size)
};

struct ImageTransformOptions {
  static constexpr int kDefaultSize = 224;

  ImageTransform kind = ImageTransform::kTrain;
  int size = kDefaultSize;  // side of the square output, pixels
  int resize_size = 0;      // kEval: the shorter side before the crop, pixels; 0: size * 256 / 224
  double scale_min = 0.08;  // kTrain: the crop's area as a fraction of the image's
  double scale_max = 1.0;
  double ratio_min = 3.0 / 4.0;  // kTrain: the crop's width / height before resizing
  double ratio_max = 4.0 / 3.0;
  double flip_probability = 0.5;
  std::array<float, 3> mean = kImageNetMean;  // Normalize, per RGB channel
  std::array<float, 3> stddev = kImageNetStd;

  // Throws InvalidArgumentError naming the field and value.
  void validate() const;
  // resize_size, or its default size * 256 / 224 (256 for 224) when 0.
  int eval_resize_size() const { return resize_size > 0 ? resize_size : size * 256 / 224; }
};

// A per-sample random stream: the same (seed, epoch, index) always gives the same draws, whatever
// thread runs the sample. splitmix64 (Steele et al. 2014) over a mix of the three.
class SampleRandom {
 public:
  SampleRandom(std::uint64_t seed, std::int64_t epoch, std::int64_t index);

  std::uint64_t next();
  double uniform(double low, double high);                        // in [low, high)
  std::int64_t uniform_int(std::int64_t low, std::int64_t high);  // in [low, high), high > low

 private:
  std::uint64_t state_;
};

// A rectangle of an image, pixels.
struct CropBox {
  int top = 0;
  int left = 0;
  int height = 0;
  int width = 0;
  bool operator==(const CropBox&) const = default;
};

// RandomResizedCrop.get_params: ten tries at a random area and log-uniform aspect ratio that fit
// the image, then the central crop with the ratio clamped to [ratio_min, ratio_max]. Python's
// round-half-to-even rounding included.
CropBox random_resized_crop_box(int height,
                                int width,
                                const ImageTransformOptions& options,
                                SampleRandom& random);

// CenterCrop's box for a crop no larger than the image: offsets round((image - crop) / 2), halves
// to even as Python rounds.
CropBox center_crop_box(int height, int width, int crop_height, int crop_width);

// Resize(shorter): the shorter side becomes `shorter`, the longer int(shorter * longer / short).
// Returns {height, width}.
std::array<int, 2> resize_shorter_side(int height, int width, int shorter);

// Resamples `box` of `image` to height x width with PIL's bilinear filter: separable, the
// triangle kernel widened by the scale factor when shrinking (antialiasing), 22-bit fixed-point
// weights, the horizontal pass first, rounded to 8 bits between the passes. The result equals
// PIL's image.crop(box).resize((width, height), BILINEAR) byte for byte. See Note [PIL resize].
RgbImage resize_bilinear(const RgbImage& image, CropBox box, int height, int width);

// The train or eval transform up to ToTensor: the (size, size) RGB image, flipped or not.
RgbImage transform_image(const RgbImage& image,
                         const ImageTransformOptions& options,
                         SampleRandom& random);

// ToTensor + Normalize: writes (3, height, width) floats (x / 255 - mean[c]) / stddev[c] to `out`,
// computed in float32 in torchvision's order, so the values are the same to the bit.
void to_normalized_chw(const RgbImage& image,
                       const std::array<float, 3>& mean,
                       const std::array<float, 3>& stddev,
                       float* out);

}  // namespace trainyard::data
