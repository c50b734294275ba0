// The scaling chart `trainyard bench scaling` draws (tools/scaling_chart.cpp): the ideal line
// begins at the W = 1 measurement, on the W = 1 tick, in the SVG and in the PNG.
#include "tools/scaling_chart.h"

#include <gtest/gtest.h>
#include <png.h>

#include <cstdint>
#include <regex>
#include <string>
#include <vector>

#include "../temp_dir.h"

namespace trainyard::cli {
namespace {

ScalingChart chart(bool ideal_falls) {
  ScalingChart c{.title = "FashionMNIST: epoch time against workers",
                 .y_label = "epoch time (s)",
                 .measured = {{1, 15.5}, {2, 12.1}, {3, 14.2}},
                 .predicted = {{4, 4.8}, {8, 2.5}, {16, 1.2}},
                 .ideal_falls = ideal_falls};
  if (!ideal_falls)
    for (auto* points : {&c.measured, &c.predicted})
      for (auto& p : *points) p.value = 6144 / p.value;  // samples/s
  return c;
}

// The x of the tick labelled `world_size` on the x axis (a black tick line, then its label).
double svg_tick_x(const std::string& svg, int world_size) {
  const std::regex tick(
      "<line x1=\"([0-9.]+)\" y1=\"[0-9.]+\" x2=\"[0-9.]+\" y2=\"[0-9.]+\" "
      "stroke=\"black\"/>\n<text [^>]*text-anchor=\"middle\">" +
      std::to_string(world_size) + "</text>");
  std::smatch m;
  EXPECT_TRUE(std::regex_search(svg, m, tick)) << "no x tick for W=" << world_size;
  return m.empty() ? -1 : std::stod(m[1].str());
}

// The ideal line's points, (x, y) pairs in order.
std::vector<std::pair<double, double>> svg_ideal_points(const std::string& svg) {
  std::smatch m;
  EXPECT_TRUE(std::regex_search(
      svg, m, std::regex("<polyline [^>]*stroke-dasharray=\"6 4\" points=\"([^\"]*)\"")));
  std::vector<std::pair<double, double>> points;
  if (m.empty()) return points;
  const std::string text = m[1].str();
  const std::regex pair("([-0-9.e]+),([-0-9.e]+)");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), pair); it != std::sregex_iterator();
       ++it)
    points.emplace_back(std::stod((*it)[1].str()), std::stod((*it)[2].str()));
  return points;
}

TEST(ScalingChart, SvgIdealLineRunsFromTheW1TickToTheLargestW) {
  for (bool falls : {true, false}) {
    const std::string svg = chart_svg(chart(falls));
    const auto points = svg_ideal_points(svg);
    ASSERT_GE(points.size(), 2u) << "ideal_falls " << falls;
    EXPECT_NEAR(points.front().first, svg_tick_x(svg, 1), 1e-3) << "ideal_falls " << falls;
    EXPECT_NEAR(points.back().first, svg_tick_x(svg, 16), 1e-3) << "ideal_falls " << falls;
    for (std::size_t i = 1; i < points.size(); ++i)
      EXPECT_GT(points[i].first, points[i - 1].first) << "left to right, point " << i;
  }
}

// The PNG as (height, width, 3) RGB bytes.
std::vector<std::uint8_t> read_png(const std::string& path, int* width, int* height) {
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  EXPECT_NE(png_image_begin_read_from_file(&image, path.c_str()), 0) << image.message;
  image.format = PNG_FORMAT_RGB;
  std::vector<std::uint8_t> rgb(PNG_IMAGE_SIZE(image));
  EXPECT_NE(png_image_finish_read(&image, nullptr, rgb.data(), 0, nullptr), 0) << image.message;
  *width = static_cast<int>(image.width);
  *height = static_cast<int>(image.height);
  return rgb;
}

// In the PNG of `c`: the x of the W = 1 tick and of the ideal line's leftmost pixel.
struct PngColumns {
  int tick_x = -1;
  int ideal_x = -1;
};
PngColumns png_columns(const ScalingChart& c, const test::TempDir& dir) {
  const std::string path = dir.str() + "/chart.png";
  write_chart_png(c, path);
  int w = 0, h = 0;
  const auto rgb = read_png(path, &w, &h);
  EXPECT_EQ(w, ScalingChart::kWidth);
  EXPECT_EQ(h, ScalingChart::kHeight);
  const auto is = [&](int x, int y, std::uint8_t r, std::uint8_t g, std::uint8_t b) {
    const std::uint8_t* p = &rgb[3u * (static_cast<std::size_t>(y) * w + x)];
    return p[0] == r && p[1] == g && p[2] == b;
  };
  PngColumns columns;
  // The W = 1 tick is the leftmost x tick: the first black pixel right of the y axis (x = 80, the
  // left margin; its labels lie left of it) in a row crossing the ticks below the x axis (y = 440).
  const int tick_row = ScalingChart::kHeight - 60 + 3;
  for (int x = 81; x < w && columns.tick_x < 0; ++x)
    if (is(x, tick_row, 0, 0, 0)) columns.tick_x = x;
  // The ideal line is the only grey (the legend's sample lies right of the plot).
  for (int x = 0; x < w && columns.ideal_x < 0; ++x)
    for (int y = 0; y < h && columns.ideal_x < 0; ++y)
      if (is(x, y, 127, 127, 127)) columns.ideal_x = x;
  return columns;
}

TEST(ScalingChart, PngIdealLineStartsAtTheW1Tick) {
  test::TempDir dir("ty-scaling-chart");
  for (bool falls : {true, false}) {
    // With W = 1 measured alone, nothing but its dot (radius 5 px) covers the line's start: the
    // first grey pixel shows within the dot's radius right of the tick.
    ScalingChart alone = chart(falls);
    alone.measured.resize(1);
    const PngColumns a = png_columns(alone, dir);
    ASSERT_GE(a.tick_x, 0) << "ideal_falls " << falls;
    ASSERT_GE(a.ideal_x, 0) << "ideal_falls " << falls;
    // The 2 px pen reaches 1 px left of the point it draws.
    EXPECT_GE(a.ideal_x, a.tick_x - 1) << "the ideal begins left of W=1; ideal_falls " << falls;
    EXPECT_LE(a.ideal_x, a.tick_x + 6) << "ideal_falls " << falls;
    // With the measured line over it too, still nothing left of W = 1.
    const PngColumns b = png_columns(chart(falls), dir);
    EXPECT_EQ(b.tick_x, a.tick_x);
    EXPECT_GE(b.ideal_x, b.tick_x - 1) << "the ideal begins left of W=1; ideal_falls " << falls;
  }
}

}  // namespace
}  // namespace trainyard::cli
