// ImageFolder: the scan (torchvision's class order and sample order, its errors), decoding of
// every PNG colour type and of JPEGs (written here with libpng and TurboJPEG), corrupt files,
// the transforms against bytes and values torchvision 0.14 + PIL 9.4 produced, and the
// loader's batches (the same for 1 and 3 threads, early stop, errors).
#include <gtest/gtest.h>
#include <png.h>
#include <torch/torch.h>
#include <turbojpeg.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "../image_fixtures.h"
#include "../temp_dir.h"
#include "trainyard/data/distributed_sampler.h"
#include "trainyard/data/image_decode.h"
#include "trainyard/data/image_folder.h"
#include "trainyard/data/image_transforms.h"
#include "trainyard/error.h"

namespace {
namespace fs = std::filesystem;
using namespace trainyard::data;
using trainyard::CorruptDataError;
using trainyard::InvalidArgumentError;
using trainyard::test::TempDir;

// Fixtures: files written with libpng and TurboJPEG.
using trainyard::test::jpeg_bytes;
using trainyard::test::PngSpec;
using trainyard::test::write_bytes;
using trainyard::test::write_png;
using trainyard::test::write_png_rgb;

// The test pattern torchvision's references below were computed from: sharp wrap-arounds and a
// product term, so that resampling errors show.
RgbImage pattern(int height, int width, int salt = 0) {
  RgbImage image(height, width);
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x)
      for (int c = 0; c < 3; ++c)
        image.at(y, x)[c] =
            static_cast<std::uint8_t>((y * 37 + x * 11 + c * 71 + ((x * y) % 13) * 5 + salt) % 256);
  return image;
}

RgbImage smooth(int height, int width) {
  RgbImage image(height, width);
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x) {
      image.at(y, x)[0] = static_cast<std::uint8_t>(40 + 5 * x);
      image.at(y, x)[1] = static_cast<std::uint8_t>(30 + 6 * y);
      image.at(y, x)[2] = static_cast<std::uint8_t>(200 - 2 * (x + y));
    }
  return image;
}

std::vector<std::uint8_t> from_hex(const std::string& hex) {
  std::vector<std::uint8_t> out;
  for (std::size_t i = 0; i + 1 < hex.size(); i += 2)
    out.push_back(static_cast<std::uint8_t>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

void touch_dir(const fs::path& path) {
  fs::create_directories(path);
}

std::string file_in(const TempDir& dir, const std::string& name) {
  return (dir.path() / name).string();
}

template <typename Fn>
std::string error_message(Fn&& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no exception)";
}

// --- Scan -------------------------------------------------------------------------------------

TEST(ImageFolderScan, ClassesSortedByNameAndSamplesInTorchvisionOrder) {
  TempDir dir;
  const fs::path root = dir.path();
  for (const char* name : {"zebra", "ant", "Moose", "ant/sub"}) touch_dir(root / name);
  const RgbImage image = pattern(4, 5);
  for (const char* file : {"zebra/z.png", "ant/b.PNG", "ant/sub/x.png", "Moose/m.png"})
    write_png_rgb((root / file).string(), image);
  write_bytes((root / "ant/a.jpeg").string(),
              jpeg_bytes(image.pixels, image.width, image.height, TJPF_RGB, TJSAMP_444, 90));
  write_bytes((root / "ant/notes.txt").string(), {'h', 'i'});  // not an image: ignored
  write_bytes((root / "readme.png").string(), {'x'});          // a file in the root: no class

  ImageFolder folder(root.string());
  EXPECT_EQ(folder.classes(), (std::vector<std::string>{"Moose", "ant", "zebra"}));
  std::vector<std::pair<std::string, std::int64_t>> samples;
  for (const auto& s : folder.samples())
    samples.emplace_back(fs::relative(s.path, root).string(), s.label);
  // sorted(os.walk(...)): the class folder's files before its subfolder's.
  EXPECT_EQ(samples, (std::vector<std::pair<std::string, std::int64_t>>{{"Moose/m.png", 0},
                                                                        {"ant/a.jpeg", 1},
                                                                        {"ant/b.PNG", 1},
                                                                        {"ant/sub/x.png", 1},
                                                                        {"zebra/z.png", 2}}));
  EXPECT_EQ(folder.size(), 5);
}

TEST(ImageFolderScan, ErrorsNameTheProblem) {
  TempDir dir;
  const std::string missing = (dir.path() / "nowhere").string();
  auto message = error_message([&] { ImageFolder{missing}; });
  EXPECT_NE(message.find(missing), std::string::npos) << message;
  EXPECT_NE(message.find("does not exist"), std::string::npos) << message;
  EXPECT_NE(message.find("HINT"), std::string::npos) << message;
  EXPECT_THROW(ImageFolder{missing}, InvalidArgumentError);

  write_bytes((dir.path() / "loose.png").string(), {'x'});
  message = error_message([&] { ImageFolder{dir.str()}; });
  EXPECT_NE(message.find("no class folders"), std::string::npos) << message;

  touch_dir(dir.path() / "cats");
  touch_dir(dir.path() / "dogs");
  write_bytes((dir.path() / "dogs/list.txt").string(), {'x'});
  message = error_message([&] { ImageFolder{dir.str()}; });
  EXPECT_NE(message.find("holds no images"), std::string::npos) << message;
  EXPECT_NE(message.find(".jpg .jpeg .png"), std::string::npos) << message;

  write_png_rgb((dir.path() / "dogs/d.png").string(), pattern(2, 2));
  touch_dir(dir.path() / "empty_birds");
  message = error_message([&] { ImageFolder{dir.str()}; });
  EXPECT_NE(message.find("without images: cats, empty_birds"), std::string::npos) << message;
  EXPECT_THROW(ImageFolder{dir.str()}, InvalidArgumentError);
}

// A symbolic link back up the tree (ln -s .. train/cat/loop) is a loop, named, not a walk that
// never ends; the same folder linked twice elsewhere is no loop.
TEST(ImageFolderScan, ASymbolicLinkLoopIsAnErrorNamingThePath) {
  TempDir dir;
  const fs::path root = dir.path() / "train";
  touch_dir(root / "cat" / "deep");
  touch_dir(root / "dog");
  write_png_rgb((root / "cat/c.png").string(), pattern(2, 2));
  write_png_rgb((root / "dog/d.png").string(), pattern(2, 2));
  fs::create_directory_symlink(dir.path() / "elsewhere", root / "dog" / "more");
  touch_dir(dir.path() / "elsewhere");
  write_png_rgb((dir.path() / "elsewhere/e.png").string(), pattern(2, 2));
  EXPECT_EQ(ImageFolder(root.string()).size(), 3) << "links are followed, as torchvision does";

  fs::create_directory_symlink("..", root / "cat" / "loop");
  auto message = error_message([&] { ImageFolder{root.string()}; });
  EXPECT_NE(message.find("The ImageFolder path " + (root / "cat" / "loop").string() +
                         " leads back to " + root.string() + " (a symbolic link loop)"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("HINT: remove the link"), std::string::npos) << message;
  EXPECT_THROW(ImageFolder{root.string()}, CorruptDataError);

  fs::remove(root / "cat" / "loop");
  fs::create_directory_symlink("..", root / "cat" / "deep" / "up");
  message = error_message([&] { ImageFolder{root.string()}; });
  EXPECT_NE(message.find((root / "cat" / "deep" / "up").string() + " leads back to " +
                         (root / "cat").string() + " (a symbolic link loop)"),
            std::string::npos)
      << message;
}

// --- Decoding ---------------------------------------------------------------------------------

std::vector<std::uint8_t> decode_file(const std::string& path, int* height, int* width) {
  RgbImage image = decode_image_file(path);
  *height = image.height;
  *width = image.width;
  return image.pixels;
}

TEST(ImageDecode, PngColourTypesBecomeExactRgb) {
  TempDir dir;
  int h = 0, w = 0;
  // Greyscale 8-bit, replicated.
  write_png(file_in(dir, "gray.png"), {.width = 3,
                                       .height = 2,
                                       .color_type = PNG_COLOR_TYPE_GRAY,
                                       .rows = {0, 17, 34, 51, 200, 255}});
  EXPECT_EQ(decode_file(file_in(dir, "gray.png"), &h, &w),
            (std::vector<std::uint8_t>{0, 0, 0, 17, 17, 17, 34, 34, 34, 51, 51, 51, 200, 200, 200,
                                       255, 255, 255}));
  EXPECT_EQ(h, 2);
  EXPECT_EQ(w, 3);
  // Greyscale 1-bit: 0 and 1 become 0 and 255.
  write_png(file_in(dir, "bits.png"), {.width = 8,
                                       .height = 1,
                                       .color_type = PNG_COLOR_TYPE_GRAY,
                                       .bit_depth = 1,
                                       .rows = {0b10110010}});
  std::vector<std::uint8_t> expected;
  for (int bit : {1, 0, 1, 1, 0, 0, 1, 0}) expected.insert(expected.end(), 3, bit ? 255 : 0);
  EXPECT_EQ(decode_file(file_in(dir, "bits.png"), &h, &w), expected);
  // RGBA and grey + alpha: the alpha is dropped, not composited (PIL's convert("RGB")).
  write_png(file_in(dir, "rgba.png"), {.width = 2,
                                       .height = 1,
                                       .color_type = PNG_COLOR_TYPE_RGBA,
                                       .rows = {10, 20, 30, 0, 200, 100, 50, 128}});
  EXPECT_EQ(decode_file(file_in(dir, "rgba.png"), &h, &w),
            (std::vector<std::uint8_t>{10, 20, 30, 200, 100, 50}));
  write_png(
      file_in(dir, "ga.png"),
      {.width = 2, .height = 1, .color_type = PNG_COLOR_TYPE_GRAY_ALPHA, .rows = {90, 0, 7, 255}});
  EXPECT_EQ(decode_file(file_in(dir, "ga.png"), &h, &w),
            (std::vector<std::uint8_t>{90, 90, 90, 7, 7, 7}));
  // A palette with transparency: looked up, transparency dropped.
  write_png(file_in(dir, "palette.png"),
            {.width = 2,
             .height = 2,
             .color_type = PNG_COLOR_TYPE_PALETTE,
             .rows = {3, 0, 1, 2},
             .palette = {{255, 0, 0}, {0, 255, 0}, {0, 0, 255}, {12, 34, 56}},
             .transparency = {0, 128}});
  EXPECT_EQ(decode_file(file_in(dir, "palette.png"), &h, &w),
            (std::vector<std::uint8_t>{12, 34, 56, 255, 0, 0, 0, 255, 0, 0, 0, 255}));
  // 16-bit RGB, big-endian samples: the high byte is kept.
  write_png(file_in(dir, "deep.png"),
            {.width = 2,
             .height = 1,
             .bit_depth = 16,
             .rows = {0x12, 0x34, 0xAB, 0xCD, 0xFF, 0xFF, 0x00, 0x80, 0x7F, 0xFF, 0x80, 0x00}});
  EXPECT_EQ(decode_file(file_in(dir, "deep.png"), &h, &w),
            (std::vector<std::uint8_t>{0x12, 0xAB, 0xFF, 0x00, 0x7F, 0x80}));
  // Interlaced (Adam7) RGB.
  const RgbImage image = pattern(9, 7);
  write_png(file_in(dir, "adam7.png"),
            {.width = 7, .height = 9, .rows = image.pixels, .interlaced = true});
  EXPECT_EQ(decode_file(file_in(dir, "adam7.png"), &h, &w), image.pixels);
}

int max_difference(const std::vector<std::uint8_t>& a, const std::vector<std::uint8_t>& b) {
  EXPECT_EQ(a.size(), b.size());
  int worst = 0;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    worst = std::max(worst, std::abs(int(a[i]) - int(b[i])));
  return worst;
}

TEST(ImageDecode, JpegRgbGreyAndCmykCloseToTheSource) {
  // JPEG is lossy: at quality 95 with 4:4:4 sampling a smooth image comes back within a few
  // levels; the bounds leave room for the quantisation, not for a colour-conversion mistake.
  const RgbImage source = smooth(24, 32);
  const auto rgb = jpeg_bytes(source.pixels, 32, 24, TJPF_RGB, TJSAMP_444, 95);
  ASSERT_FALSE(rgb.empty());
  RgbImage decoded = decode_image(rgb.data(), rgb.size());
  ASSERT_EQ(decoded.height, 24);
  ASSERT_EQ(decoded.width, 32);
  EXPECT_LE(max_difference(decoded.pixels, source.pixels), 4);

  std::vector<std::uint8_t> grey(16 * 16);
  for (int i = 0; i < 256; ++i) grey[i] = static_cast<std::uint8_t>(i / 16 * 10 + i % 16 * 3);
  const auto grey_jpeg = jpeg_bytes(grey, 16, 16, TJPF_GRAY, TJSAMP_GRAY, 95);
  decoded = decode_image(grey_jpeg.data(), grey_jpeg.size());
  std::vector<std::uint8_t> grey_rgb;
  for (auto v : grey) grey_rgb.insert(grey_rgb.end(), 3, v);
  EXPECT_LE(max_difference(decoded.pixels, grey_rgb), 4);
  for (int i = 0; i < 256; ++i) {  // replicated exactly
    EXPECT_EQ(decoded.pixels[i * 3], decoded.pixels[i * 3 + 1]);
    EXPECT_EQ(decoded.pixels[i * 3], decoded.pixels[i * 3 + 2]);
  }

  // CMYK (written as YCCK): R = C * K / 255, as libjpeg-turbo converts Adobe's inverted CMYK.
  std::vector<std::uint8_t> cmyk;
  for (int i = 0; i < 64; ++i) cmyk.insert(cmyk.end(), {200, 100, 50, 220});
  const auto cmyk_jpeg = jpeg_bytes(cmyk, 8, 8, TJPF_CMYK, TJSAMP_444, 95);
  decoded = decode_image(cmyk_jpeg.data(), cmyk_jpeg.size());
  std::vector<std::uint8_t> expected;
  for (int i = 0; i < 64; ++i) expected.insert(expected.end(), {173, 86, 43});
  EXPECT_LE(max_difference(decoded.pixels, expected), 3);
}

TEST(ImageDecode, DamagedDataThrowsTheDecodersMessage) {
  const std::vector<std::uint8_t> text = {'<', 'h', 't', 'm', 'l', '>'};
  auto message = error_message([&] { decode_image(text.data(), text.size()); });
  EXPECT_NE(message.find("not a JPEG or PNG file (6 bytes, starting 3c 68 74 6d)"),
            std::string::npos)
      << message;
  EXPECT_THROW(decode_image(text.data(), text.size()), CorruptDataError);

  const RgbImage source = pattern(32, 32);
  auto jpeg = jpeg_bytes(source.pixels, 32, 32, TJPF_RGB, TJSAMP_420, 90);
  jpeg.resize(jpeg.size() / 2);
  message = error_message([&] { decode_image(jpeg.data(), jpeg.size()); });
  EXPECT_NE(message.find("libjpeg-turbo: Premature end of JPEG file"), std::string::npos)
      << message;
  jpeg.resize(2);
  EXPECT_THROW(decode_image(jpeg.data(), jpeg.size()), CorruptDataError);
}

// --- Corrupt files in a folder ----------------------------------------------------------------

// One class: a.png (good), b_text.jpg (not an image), c_cut.jpg and d_cut.png (truncated).
void write_damaged_folder(const fs::path& root) {
  touch_dir(root / "things");
  const RgbImage image = pattern(16, 16);
  write_png_rgb((root / "things/a.png").string(), image);
  write_bytes((root / "things/b_text.jpg").string(), {'n', 'o', 't', ' ', 'a', ' ', 'j', 'p'});
  auto jpeg = jpeg_bytes(image.pixels, 16, 16, TJPF_RGB, TJSAMP_420, 90);
  jpeg.resize(jpeg.size() * 2 / 3);
  write_bytes((root / "things/c_cut.jpg").string(), jpeg);
  write_png_rgb((root / "things/d_cut.png").string(), image);
  fs::resize_file(root / "things/d_cut.png", 60);
}

TEST(ImageFolderCorrupt, SkippedCountedAndReplacedByTheNextGoodImage) {
  TempDir dir;
  write_damaged_folder(dir.path());
  ImageFolder folder(dir.str());
  ASSERT_EQ(folder.size(), 4);
  auto loaded = folder.load(1);  // b, c and d fail; wraps around to a
  EXPECT_EQ(loaded.index, 0);
  EXPECT_EQ(loaded.image.pixels, pattern(16, 16).pixels);
  auto stats = folder.stats();
  EXPECT_EQ(stats.decoded, 1);
  EXPECT_EQ(stats.skipped, 1);
  EXPECT_EQ(stats.corrupt_files, 3);
  // Known corrupt files are not read again, but each replaced sample counts.
  EXPECT_EQ(folder.load(3).index, 0);
  EXPECT_EQ(folder.load(0).index, 0);
  stats = folder.stats();
  EXPECT_EQ(stats.decoded, 3);
  EXPECT_EQ(stats.skipped, 2);
  EXPECT_EQ(stats.corrupt_files, 3);
}

// A class whose every file is corrupt is an error naming the class, not only per-file warnings.
TEST(ImageFolderCorrupt, AClassWithoutOneGoodImageIsAnErrorNamingIt) {
  TempDir dir;
  touch_dir(dir.path() / "good");
  write_png_rgb((dir.path() / "good/a.png").string(), pattern(4, 4));
  write_png_rgb((dir.path() / "good/b.png").string(), pattern(4, 4));
  touch_dir(dir.path() / "broken");
  write_bytes((dir.path() / "broken/x.png").string(), {'n', 'o', 'p', 'e'});
  write_bytes((dir.path() / "broken/y.jpg").string(), {'n', 'o', 'p', 'e'});
  ImageFolder folder(dir.str());
  ASSERT_EQ(folder.classes(), (std::vector<std::string>{"broken", "good"}));
  const auto message = error_message([&] { folder.load(0); });
  EXPECT_NE(message.find("Class 'broken' of the ImageFolder " + dir.str() +
                         " has no image that decodes: all 2 of its files under " +
                         (dir.path() / "broken").string() + " failed"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("HINT: "), std::string::npos) << message;
  EXPECT_EQ(folder.load(2).index, 2) << "the good class still loads";
}

TEST(ImageFolderCorrupt, StrictThrowsNamingTheFileAndTheDecoder) {
  TempDir dir;
  write_damaged_folder(dir.path());
  ImageFolder folder(dir.str(), {.strict = true});
  auto message = error_message([&] { folder.load(1); });
  EXPECT_NE(message.find("things/b_text.jpg: not a JPEG or PNG file"), std::string::npos)
      << message;
  message = error_message([&] { folder.load(2); });
  EXPECT_NE(message.find("things/c_cut.jpg: libjpeg-turbo: "), std::string::npos) << message;
  message = error_message([&] { folder.load(3); });
  EXPECT_NE(message.find("things/d_cut.png: libpng: "), std::string::npos) << message;
  EXPECT_THROW(folder.load(3), CorruptDataError);
  EXPECT_EQ(folder.load(0).index, 0);
}

// --- Transforms -------------------------------------------------------------------------------
// References: torchvision 0.14.1 with PIL 9.4 on Image.fromarray(pattern(41, 29)) (Debian 12's
// the venv's torchvision), printed as hex.

const char* kEvalResize9Crop8 =  // Compose([Resize(9), CenterCrop(8)])
    "5f928178a3748f806e968167876f777464937079a969958e876a6675667f5d64974a76ad639d9180b48e979b"
    "7aae8b5863839975a0778c955c966f75987070797a875d7797768d9099686d816a84776b945e829b69928a85"
    "9e6c958c5f9c7e636a7f99748678839d689c7e5f9b63687a61886a7394618d90b04f64a2487645638b4e738e"
    "62947d77a65f8cb3538ea2526b818b7f9f678f91609b85588e746d697087627698588e929e6e658b657f8369"
    "915e7a966290927fa76f929868978862";
const char* kResizedCropShrink =  // F.resized_crop(img, 3, 5, 20, 15, [8, 8])
    "816182844a91655c9f3e72b35c7abb5b9b9f71a98581a86b4c8dbc5c94a26bac857faf7a85ad80a58454a76e"
    "53c168629e9f6aad5c559a6b61a457709066705f5d934661a76771b888488659589d3669b03571b84483b26b"
    "b29574bb9c82c9aa549a9c63a2667bac6f93878b958975a8a63fa17d58a48e6fa89050b45f579c7967874483"
    "7946867468a7557eb2518e95555fa1666caa5781a45494a9559a907caf728fb3589f884361a8717fc67e90bc"
    "46a89e4fa7853ec84b56af506e6a407b";
const char* kResizedCropGrow =  // F.resized_crop(img, 1, 2, 5, 4, [8, 8])
    "458cd34990d75198df59a0e761a8ef69b0b771b83f75bc035aa1785ea57c67ae8570b78e7ac19882c97c8cd3"
    "3e90d71e77be057cbf0a87c21591c81f9dd42ba6e134aff23db3fa4194db229bb629a76a35b34a41c0574ec0"
    "834eb6d144b1f83fb2a940b98447c73a55d0175ed31a61d0435ec89356c3ba51cf265dd72a65e63174e72e75"
    "d81f66d62164e33671ea41785c337a80337ac63178c7327982357c683f86784f9681589f01488f3a4188ab32"
    "79ad347b3f468d11589f236ab12c73ba";

TEST(ImageTransforms, EvalMatchesTorchvisionByteForByteAndValueForValue) {
  const RgbImage image = pattern(41, 29);
  EXPECT_EQ(resize_shorter_side(41, 29, 9), (std::array<int, 2>{12, 9}));
  EXPECT_EQ(resize_shorter_side(29, 41, 9), (std::array<int, 2>{9, 12}));
  // round((13 - 8) / 2) = round(2.5) = 2: Python rounds halves to even.
  EXPECT_EQ(center_crop_box(10, 13, 8, 8), (CropBox{.top = 1, .left = 2, .height = 8, .width = 8}));
  EXPECT_EQ(ImageTransformOptions{}.eval_resize_size(), 256);
  EXPECT_EQ(ImageTransformOptions{.size = 32}.eval_resize_size(), 36);

  const ImageTransformOptions options{.kind = ImageTransform::kEval, .size = 8, .resize_size = 9};
  SampleRandom unused(0, 0, 0);
  const RgbImage out = transform_image(image, options, unused);
  EXPECT_EQ(out.pixels, from_hex(kEvalResize9Crop8));

  // ToTensor + Normalize, to the bit.
  std::vector<float> chw(3 * 8 * 8);
  to_normalized_chw(out, options.mean, options.stddev, chw.data());
  EXPECT_EQ(chw[0 * 64 + 0 * 8 + 0], -0x1.f6d66cp-2f);
  EXPECT_EQ(chw[1 * 64 + 3 * 8 + 5], 0x1.75f5f8p-1f);
  EXPECT_EQ(chw[2 * 64 + 7 * 8 + 7], -0x1.8ac948p-4f);
}

TEST(ImageTransforms, ResizeMatchesPilWhenShrinkingAndGrowing) {
  const RgbImage image = pattern(41, 29);
  EXPECT_EQ(resize_bilinear(image, {.top = 3, .left = 5, .height = 20, .width = 15}, 8, 8).pixels,
            from_hex(kResizedCropShrink));
  EXPECT_EQ(resize_bilinear(image, {.top = 1, .left = 2, .height = 5, .width = 4}, 8, 8).pixels,
            from_hex(kResizedCropGrow));
  // The same size is a plain crop.
  const RgbImage same =
      resize_bilinear(image, {.top = 0, .left = 0, .height = 41, .width = 29}, 41, 29);
  EXPECT_EQ(same.pixels, image.pixels);
}

TEST(ImageTransforms, RandomResizedCropKeepsScaleAndRatioInRange) {
  const ImageTransformOptions options;
  double smallest = 1, largest = 0;
  std::vector<CropBox> boxes;
  for (int i = 0; i < 2000; ++i) {
    SampleRandom random(7, 0, i);
    const CropBox box = random_resized_crop_box(100, 80, options, random);
    ASSERT_GE(box.top, 0);
    ASSERT_GE(box.left, 0);
    ASSERT_LE(box.top + box.height, 100);
    ASSERT_LE(box.left + box.width, 80);
    // The rounding of width and height moves the area and ratio by a few per cent at most.
    const double scale = double(box.height) * box.width / (100.0 * 80.0);
    const double ratio = double(box.width) / box.height;
    EXPECT_GE(scale, 0.08 * 0.9);
    EXPECT_LE(scale, 1.0);
    EXPECT_GE(ratio, 0.75 * 0.95);
    EXPECT_LE(ratio, 4.0 / 3.0 * 1.05);
    smallest = std::min(smallest, scale);
    largest = std::max(largest, scale);
    boxes.push_back(box);
  }
  EXPECT_LT(smallest, 0.1);
  EXPECT_GT(largest, 0.9);
  // The same seed, epoch and index give the same box; another epoch another.
  SampleRandom again(7, 0, 5), other_epoch(7, 1, 5);
  EXPECT_EQ(random_resized_crop_box(100, 80, options, again), boxes[5]);
  EXPECT_NE(random_resized_crop_box(100, 80, options, other_epoch), boxes[5]);
  // Ten misses (a 1000x10 strip fits no crop of ratio >= 3/4) fall back to the central crop
  // with the ratio clamped: w = 10, h = round(10 / 0.75) = 13.
  SampleRandom strip(1, 0, 0);
  EXPECT_EQ(random_resized_crop_box(1000, 10, options, strip),
            (CropBox{.top = 493, .left = 0, .height = 13, .width = 10}));
}

TEST(ImageTransforms, TrainFlipsAboutHalfTheTimeAndNormalises) {
  // With scale 1 and ratio 1 the crop is the whole 16x16 image, so the output is the image or
  // its mirror.
  const RgbImage image = pattern(16, 16);
  RgbImage mirror(16, 16);
  for (int y = 0; y < 16; ++y)
    for (int x = 0; x < 16; ++x) std::copy_n(image.at(y, 15 - x), 3, mirror.at(y, x));
  const ImageTransformOptions options{
      .size = 16, .scale_min = 1, .scale_max = 1, .ratio_min = 1, .ratio_max = 1};
  int flips = 0;
  for (int i = 0; i < 400; ++i) {
    SampleRandom random(11, 2, i);
    const RgbImage out = transform_image(image, options, random);
    ASSERT_TRUE(out.pixels == image.pixels || out.pixels == mirror.pixels);
    flips += out.pixels == mirror.pixels;
  }
  EXPECT_GT(flips, 160);  // binomial(400, 0.5): mean 200, standard deviation 10
  EXPECT_LT(flips, 240);

  // The default train transform: (3, 224, 224) values within the normalised range of [0, 255].
  const RgbImage photo = pattern(300, 400, 3);
  SampleRandom random(0, 0, 0);
  const RgbImage out = transform_image(photo, ImageTransformOptions{}, random);
  ASSERT_EQ(out.height, 224);
  ASSERT_EQ(out.width, 224);
  std::vector<float> chw(3 * 224 * 224);
  to_normalized_chw(out, kImageNetMean, kImageNetStd, chw.data());
  for (int c = 0; c < 3; ++c) {
    const auto begin = chw.begin() + c * 224 * 224;
    const auto [lo, hi] = std::minmax_element(begin, begin + 224 * 224);
    EXPECT_GE(*lo, -kImageNetMean[c] / kImageNetStd[c] - 1e-6f);
    EXPECT_LE(*hi, (1 - kImageNetMean[c]) / kImageNetStd[c] + 1e-6f);
  }
}

TEST(ImageTransforms, OptionsAreValidated) {
  auto message =
      error_message([] { ImageTransformOptions{.size = 224, .resize_size = 200}.validate(); });
  EXPECT_NE(message.find("resize_size 200 is smaller than the crop size 224"), std::string::npos)
      << message;
  EXPECT_THROW(ImageTransformOptions{.scale_min = 0}.validate(), InvalidArgumentError);
  EXPECT_THROW(ImageTransformOptions{.flip_probability = 2}.validate(), InvalidArgumentError);
  EXPECT_NO_THROW(ImageTransformOptions{}.validate());
}

// --- Loader -----------------------------------------------------------------------------------

// Two classes of six images each, of different sizes, PNG and JPEG.
void write_small_folder(const fs::path& root) {
  for (int i = 0; i < 12; ++i) {
    const fs::path folder = root / (i % 2 == 0 ? "even" : "odd");
    touch_dir(folder);
    const RgbImage image = pattern(20 + i, 24 - i, i * 17);
    const std::string stem = (folder / ("img" + std::to_string(i))).string();
    if (i % 3 == 0)
      write_bytes(stem + ".jpg",
                  jpeg_bytes(image.pixels, image.width, image.height, TJPF_RGB, TJSAMP_420, 90));
    else
      write_png_rgb(stem + ".png", image);
  }
}

std::vector<Batch> all_batches(ImageFolderLoader& loader) {
  std::vector<Batch> out;
  while (auto batch = loader.next()) out.push_back(*batch);
  return out;
}

TEST(ImageFolderLoader, BatchesAreTheSameForOneAndThreeThreads) {
  TempDir dir;
  write_small_folder(dir.path());
  ImageFolder folder(dir.str());
  DistributedSampler sampler({.dataset_size = folder.size(), .seed = 3});
  sampler.set_epoch(1);
  const auto indices = sampler.indices();
  ImageLoaderOptions options{
      .batch_size = 5, .threads = 1, .transform = {.size = 8}, .seed = 42, .epoch = 1};
  ImageFolderLoader one(folder, indices, options);
  options.threads = 3;
  options.prefetch_batches = 3;
  ImageFolderLoader three(folder, indices, options);
  ASSERT_EQ(one.num_batches(), 3);
  const auto a = all_batches(one);
  const auto b = all_batches(three);
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(a[2].inputs.sizes(), (std::vector<std::int64_t>{2, 3, 8, 8}));
  for (std::size_t k = 0; k < a.size(); ++k) {
    EXPECT_EQ(a[k].inputs.dtype(), torch::kFloat32);
    EXPECT_EQ(a[k].targets.dtype(), torch::kInt64);
    EXPECT_TRUE(torch::equal(a[k].inputs, b[k].inputs)) << "batch " << k;
    EXPECT_TRUE(torch::equal(a[k].targets, b[k].targets)) << "batch " << k;
  }
  // Row r of batch k is sample indices[5k + r], transformed with its own seed.
  for (std::size_t p = 0; p < indices.size(); ++p) {
    const auto index = indices[p];
    const auto& batch = a[p / 5];
    const auto row = static_cast<std::int64_t>(p % 5);
    EXPECT_EQ(batch.targets[row].item<std::int64_t>(), folder.samples()[index].label);
    SampleRandom random(42, 1, index);
    const RgbImage out = transform_image(folder.load(index).image, options.transform, random);
    auto expected = torch::empty({3, 8, 8});
    to_normalized_chw(out, kImageNetMean, kImageNetStd, expected.data_ptr<float>());
    EXPECT_TRUE(torch::equal(batch.inputs[row], expected)) << "position " << p;
  }
  EXPECT_EQ(folder.stats().skipped, 0);
}

TEST(ImageFolderLoader, DropLastAndEarlyStop) {
  TempDir dir;
  write_small_folder(dir.path());
  ImageFolder folder(dir.str());
  std::vector<std::int64_t> indices(12);
  for (int i = 0; i < 12; ++i) indices[i] = 11 - i;
  ImageLoaderOptions options{.batch_size = 5,
                             .drop_last = true,
                             .threads = 2,
                             .transform = {.kind = ImageTransform::kEval, .size = 8}};
  {
    ImageFolderLoader loader(folder, indices, options);
    EXPECT_EQ(loader.num_batches(), 2);
    EXPECT_EQ(all_batches(loader).size(), 2u);
    EXPECT_FALSE(loader.next().has_value());
  }
  // The consumer stops after one batch, or takes none: the destructor returns.
  options.prefetch_batches = 1;
  {
    ImageFolderLoader loader(folder, indices, options);
    ASSERT_TRUE(loader.next().has_value());
  }
  { ImageFolderLoader loader(folder, indices, options); }
  ImageFolderLoader empty(folder, {}, options);
  EXPECT_FALSE(empty.next().has_value());
}

TEST(ImageFolderLoader, CorruptFilesKeepTheBatchSizeOrFailWithStrict) {
  TempDir dir;
  write_damaged_folder(dir.path());
  const ImageLoaderOptions options{.batch_size = 4, .threads = 3, .transform = {.size = 8}};
  ImageFolder lenient(dir.str());
  ImageFolderLoader loader(lenient, {0, 1, 2, 3}, options);
  auto batch = loader.next();
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(batch->inputs.size(0), 4);
  EXPECT_EQ(lenient.stats().skipped, 3);
  EXPECT_EQ(lenient.stats().corrupt_files, 3);

  ImageFolder strict(dir.str(), {.strict = true});
  ImageFolderLoader failing(strict, {0, 0, 2, 0}, options);
  const auto message = error_message([&] { all_batches(failing); });
  EXPECT_NE(message.find("things/c_cut.jpg"), std::string::npos) << message;
  EXPECT_THROW(failing.next(), CorruptDataError);  // the error stays
}

TEST(ImageFolderLoader, OptionsAreValidated) {
  TempDir dir;
  write_small_folder(dir.path());
  ImageFolder folder(dir.str());
  auto message = error_message(
      [&] { ImageFolderLoader loader(folder, {0}, ImageLoaderOptions{.threads = 0}); });
  EXPECT_NE(message.find("threads (--loader-threads) must be >= 1, got 0"), std::string::npos)
      << message;
  message = error_message([&] { ImageFolderLoader loader(folder, {12}, ImageLoaderOptions{}); });
  EXPECT_NE(message.find("index 12 is outside"), std::string::npos) << message;
}

}  // namespace
