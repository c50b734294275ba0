#include "trainyard/data/image_decode.h"

#include <png.h>
#include <turbojpeg.h>

#include <algorithm>
#include <cerrno>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>

#include "trainyard/error.h"

namespace trainyard::data {
namespace {

constexpr std::uint8_t kJpegSignature[] = {0xFF, 0xD8, 0xFF};
constexpr std::uint8_t kPngSignature[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};

bool starts_with(const std::uint8_t* data,
                 std::size_t size,
                 const std::uint8_t* signature,
                 std::size_t signature_size) {
  return size >= signature_size && std::memcmp(data, signature, signature_size) == 0;
}

void check_dimensions(const char* format, std::int64_t width, std::int64_t height) {
  TY_CHECK_T(CorruptDataError, width > 0 && height > 0, "the ", format, " header gives a size of ",
             width, "x", height, ".");
  TY_CHECK_T(CorruptDataError, width * height <= kMaxImagePixels, "the ", format, " image is ",
             width, "x", height, ", more than ", kMaxImagePixels,
             " pixels (the limit against decompression bombs, as PIL's).");
}

// --- JPEG -------------------------------------------------------------------------------------

struct TjDestroy {
  void operator()(void* handle) const { tjDestroy(handle); }
};

RgbImage decode_jpeg(const std::uint8_t* data, std::size_t size) {
  std::unique_ptr<void, TjDestroy> owner(tjInitDecompress());
  TY_CHECK_T(Error, owner != nullptr,
             "TurboJPEG could not create a decompressor: ", tjGetErrorStr2(nullptr));
  tjhandle handle = owner.get();
  const auto jpeg_size = static_cast<unsigned long>(size);
  int width = 0, height = 0, subsampling = 0, colorspace = 0;
  if (tjDecompressHeader3(handle, data, jpeg_size, &width, &height, &subsampling, &colorspace) !=
          0 &&
      (tjGetErrorCode(handle) == TJERR_FATAL || width <= 0 || height <= 0))
    throw CorruptDataError(detail::concat("libjpeg-turbo: ", tjGetErrorStr2(handle)));
  check_dimensions("JPEG", width, height);

  // CMYK and YCCK JPEGs decode to CMYK only; they are converted below.
  const bool cmyk = colorspace == TJCS_CMYK || colorspace == TJCS_YCCK;
  const int channels = cmyk ? 4 : 3;
  std::vector<std::uint8_t> decoded(static_cast<std::size_t>(width) * height * channels);
  // The accurate IDCT and fancy upsampling are libjpeg's defaults, which PIL decodes with.
  if (tjDecompress2(handle, data, jpeg_size, decoded.data(), width, /*pitch=*/0, height,
                    cmyk ? TJPF_CMYK : TJPF_RGB, TJFLAG_ACCURATEDCT | TJFLAG_LIMITSCANS) != 0) {
    // A warning leaves a complete image. PIL accepts those (extraneous bytes, damaged entropy
    // data) except a truncated file, which libjpeg reports as "Premature end of JPEG file".
    const std::string message = tjGetErrorStr2(handle);
    if (tjGetErrorCode(handle) == TJERR_FATAL ||
        message.find("Premature end of JPEG file") != std::string::npos)
      throw CorruptDataError("libjpeg-turbo: " + message);
  }
  if (!cmyk) {
    RgbImage image;
    image.height = height;
    image.width = width;
    image.pixels = std::move(decoded);
    return image;
  }
  // Adobe writes CMYK inverted (255 = no ink); libjpeg-turbo's own CMYK-to-RGB conversion
  // (cmyk.h) is R = C * K / 255.
  RgbImage image(height, width);
  const std::size_t pixels = static_cast<std::size_t>(width) * height;
  for (std::size_t i = 0; i < pixels; ++i) {
    const std::uint8_t* in = decoded.data() + i * 4;
    std::uint8_t* out = image.pixels.data() + i * 3;
    for (int c = 0; c < 3; ++c) out[c] = static_cast<std::uint8_t>((in[c] * in[3] + 127) / 255);
  }
  return image;
}

// --- PNG --------------------------------------------------------------------------------------
// libpng reports errors by longjmp to the setjmp in the frame that called it. The functions that
// set a jump point (png_read_header, png_read_pixels) hold no object with a destructor, so the
// jump skips nothing that must run; everything that owns memory lives in their caller.

struct PngRead {
  png_structp png = nullptr;
  png_infop info = nullptr;
  const std::uint8_t* data = nullptr;  // the caller's buffer; outlives the read
  std::size_t size = 0;
  std::size_t offset = 0;
  char message[256] = "";

  ~PngRead() {
    if (png != nullptr) png_destroy_read_struct(&png, info != nullptr ? &info : nullptr, nullptr);
  }
};

void png_on_error(png_structp png, png_const_charp message) {
  auto* read = static_cast<PngRead*>(png_get_error_ptr(png));
  std::snprintf(read->message, sizeof(read->message), "%s", message);
  png_longjmp(png, 1);
}

// Warnings (a bad ancillary chunk, an sRGB profile libpng dislikes) are ignored, as PIL does.
void png_on_warning(png_structp, png_const_charp) {}

void png_on_read(png_structp png, png_bytep out, png_size_t n) {
  auto* read = static_cast<PngRead*>(png_get_io_ptr(png));
  if (n > read->size - read->offset) png_error(png, "the file ends early (truncated)");
  std::memcpy(out, read->data + read->offset, n);
  read->offset += n;
}

// Reads the header and asks libpng for 8-bit RGB rows; false on a libpng error.
bool png_read_header(
    PngRead& read, png_uint_32* width, png_uint_32* height, int* channels, int* bit_depth) {
  if (setjmp(png_jmpbuf(read.png))) return false;
  png_set_read_fn(read.png, &read, png_on_read);
  png_read_info(read.png, read.info);
  const int file_bit_depth = png_get_bit_depth(read.png, read.info);
  const int color_type = png_get_color_type(read.png, read.info);
  if (file_bit_depth == 16) png_set_strip_16(read.png);  // the high byte, as PIL keeps
  if (color_type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(read.png);
  if (color_type == PNG_COLOR_TYPE_GRAY && file_bit_depth < 8)
    png_set_expand_gray_1_2_4_to_8(read.png);
  if ((color_type & PNG_COLOR_MASK_COLOR) == 0) png_set_gray_to_rgb(read.png);
  if ((color_type & PNG_COLOR_MASK_ALPHA) != 0 || png_get_valid(read.png, read.info, PNG_INFO_tRNS))
    png_set_strip_alpha(read.png);
  png_set_interlace_handling(read.png);
  png_read_update_info(read.png, read.info);
  *width = png_get_image_width(read.png, read.info);
  *height = png_get_image_height(read.png, read.info);
  *channels = png_get_channels(read.png, read.info);
  *bit_depth = png_get_bit_depth(read.png, read.info);
  return true;
}

bool png_read_pixels(PngRead& read, png_bytepp rows) {
  if (setjmp(png_jmpbuf(read.png))) return false;
  png_read_image(read.png, rows);
  return true;
}

RgbImage decode_png(const std::uint8_t* data, std::size_t size) {
  PngRead read;
  read.data = data;
  read.size = size;
  read.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &read, png_on_error, png_on_warning);
  TY_CHECK_T(Error, read.png != nullptr, "libpng could not create a reader.");
  read.info = png_create_info_struct(read.png);
  TY_CHECK_T(Error, read.info != nullptr, "libpng could not create an info struct.");

  png_uint_32 width = 0, height = 0;
  int channels = 0, bit_depth = 0;
  if (!png_read_header(read, &width, &height, &channels, &bit_depth))
    throw CorruptDataError(detail::concat("libpng: ", read.message));
  check_dimensions("PNG", width, height);
  TY_ASSERT(channels == 3 && bit_depth == 8, "libpng gave ", channels, " channels of ", bit_depth,
            " bits after conversion to 8-bit RGB.");
  RgbImage image(static_cast<int>(height), static_cast<int>(width));
  std::vector<png_bytep> rows(height);
  for (png_uint_32 y = 0; y < height; ++y) rows[y] = image.at(static_cast<int>(y), 0);
  if (!png_read_pixels(read, rows.data()))
    throw CorruptDataError(detail::concat("libpng: ", read.message));
  return image;
}

}  // namespace

RgbImage decode_image(const std::uint8_t* data, std::size_t size) {
  if (starts_with(data, size, kJpegSignature, sizeof(kJpegSignature)))
    return decode_jpeg(data, size);
  if (starts_with(data, size, kPngSignature, sizeof(kPngSignature))) return decode_png(data, size);
  std::string head;
  for (std::size_t i = 0; i < std::min<std::size_t>(size, 4); ++i) {
    char hex[4];
    std::snprintf(hex, sizeof(hex), " %02x", data[i]);
    head += hex;
  }
  throw CorruptDataError(detail::concat(
      "not a JPEG or PNG file (", size, " bytes", size > 0 ? ", starting" : "", head,
      "). HINT: ImageFolder decodes JPEG and PNG only; convert other formats first."));
}

RgbImage decode_image_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TY_CHECK_T(Error, in.good(), "Cannot open image ", path, ": ", std::strerror(errno), ".");
  std::vector<std::uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                                  std::istreambuf_iterator<char>());
  TY_CHECK_T(Error, !in.bad(), "Cannot read image ", path, ": ", std::strerror(errno), ".");
  try {
    return decode_image(bytes.data(), bytes.size());
  } catch (const CorruptDataError& e) {
    throw CorruptDataError(detail::concat("Cannot decode ", path, ": ", e.what()));
  }
}

}  // namespace trainyard::data
