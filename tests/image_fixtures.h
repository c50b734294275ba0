// Image files for tests, written with libpng and TurboJPEG (link PNG::PNG and
// libjpeg-turbo::turbojpeg): PNGs of any colour type and bit depth, JPEGs of RGB, greyscale and
// CMYK pixels, and raw bytes (damaged or truncated files).
#pragma once

#include <gtest/gtest.h>
#include <png.h>
#include <turbojpeg.h>

#include <csetjmp>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "trainyard/data/image_decode.h"

namespace trainyard::test {

struct PngSpec {
  int width = 0;
  int height = 0;
  int color_type = PNG_COLOR_TYPE_RGB;
  int bit_depth = 8;
  std::vector<std::uint8_t> rows;  // packed rows, as the file stores them
  std::vector<png_color> palette;
  std::vector<std::uint8_t> transparency;  // tRNS alphas of the palette entries
  bool interlaced = false;
};

// libpng errors longjmp here; no object with a destructor lives in this frame.
inline bool write_png_file(
    std::FILE* file, png_structp png, png_infop info, const PngSpec& spec, png_bytepp rows) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_init_io(png, file);
  png_set_IHDR(png, info, spec.width, spec.height, spec.bit_depth, spec.color_type,
               spec.interlaced ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  if (!spec.palette.empty())
    png_set_PLTE(png, info, spec.palette.data(), static_cast<int>(spec.palette.size()));
  if (!spec.transparency.empty())
    png_set_tRNS(png, info, spec.transparency.data(), static_cast<int>(spec.transparency.size()),
                 nullptr);
  png_write_info(png, info);
  png_write_image(png, rows);
  png_write_end(png, nullptr);
  return true;
}

// Writes `spec` as a PNG file; a failure fails the test (a fatal assertion in this function).
inline void write_png(const std::string& path, const PngSpec& spec) {
  std::FILE* file = std::fopen(path.c_str(), "wb");
  ASSERT_NE(file, nullptr) << path;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  const std::size_t stride = spec.rows.size() / spec.height;
  std::vector<png_bytep> rows;
  for (int y = 0; y < spec.height; ++y)
    rows.push_back(const_cast<png_bytep>(spec.rows.data()) + y * stride);
  const bool ok = write_png_file(file, png, info, spec, rows.data());
  png_destroy_write_struct(&png, &info);
  std::fclose(file);
  ASSERT_TRUE(ok) << "libpng could not write " << path;
}

inline void write_png_rgb(const std::string& path, const data::RgbImage& image) {
  write_png(path, {.width = image.width, .height = image.height, .rows = image.pixels});
}

// TurboJPEG's compressor. pixel_format TJPF_RGB, TJPF_GRAY (with TJSAMP_GRAY) or TJPF_CMYK.
// Empty when TurboJPEG fails.
inline std::vector<std::uint8_t> jpeg_bytes(const std::vector<std::uint8_t>& pixels,
                                            int width,
                                            int height,
                                            int pixel_format,
                                            int subsampling,
                                            int quality) {
  tjhandle handle = tjInitCompress();
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  const int rc = tjCompress2(handle, pixels.data(), width, 0, height, pixel_format, &buffer, &size,
                             subsampling, quality, TJFLAG_ACCURATEDCT);
  std::vector<std::uint8_t> out;
  if (rc == 0) out.assign(buffer, buffer + size);
  tjFree(buffer);
  tjDestroy(handle);
  return out;
}

inline void write_bytes(const std::string& path, const std::vector<std::uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

}  // namespace trainyard::test
