// Decoding of image files to 8-bit RGB: JPEG with libjpeg-turbo's TurboJPEG API and PNG with
// libpng, the format chosen by the file's signature (as PIL does), not its name. The libraries'
// headers stay in image_decode.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace trainyard::data {

// An 8-bit RGB image, (height, width, 3) row-major: pixel (y, x) channel c is at
// pixels[(y * width + x) * 3 + c].
struct RgbImage {
  int height = 0;
  int width = 0;
  std::vector<std::uint8_t> pixels;

  RgbImage() = default;
  RgbImage(int h, int w) : height(h), width(w), pixels(static_cast<std::size_t>(h) * w * 3) {}
  std::uint8_t* at(int y, int x) {
    return pixels.data() + (static_cast<std::size_t>(y) * width + x) * 3;
  }
  const std::uint8_t* at(int y, int x) const {
    return pixels.data() + (static_cast<std::size_t>(y) * width + x) * 3;
  }
};

// Images with more pixels are refused, as PIL refuses decompression bombs (2 * MAX_IMAGE_PIXELS).
inline constexpr std::int64_t kMaxImagePixels = 178956970;

// Decodes a JPEG or PNG held in memory. Throws CorruptDataError with the decoder's message when
// the data is neither, is damaged or truncated, or is too large. As with PIL, a JPEG that
// libjpeg-turbo only warns about (extraneous bytes, damaged entropy data) decodes, unless it is
// truncated. Conversions follow PIL's convert("RGB"): greyscale is replicated,
// a palette is looked up, alpha and transparency are dropped (not composited), 16-bit samples
// keep their high byte, CMYK JPEGs (Adobe's inverted convention) are multiplied out. Gamma and
// colour profiles are ignored, as PIL ignores them. Thread-safe.
RgbImage decode_image(const std::uint8_t* data, std::size_t size);

// Reads and decodes the file at `path`. Throws Error when it cannot be read, CorruptDataError
// when it cannot be decoded; both messages name the file.
RgbImage decode_image_file(const std::string& path);

}  // namespace trainyard::data
