#include "tools/scaling_chart.h"

#include <png.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <sstream>

#include "trainyard/error.h"
#include "trainyard/net/xml_escape.h"

namespace trainyard::cli {
namespace {

constexpr double kLeft = 80, kRight = 190, kTop = 50, kBottom = 60;  // margins, pixels
constexpr int kIdealSamples = 64;  // the ideal curve as a polyline

struct Rgb {
  std::uint8_t r, g, b;
};
constexpr Rgb kWhite{255, 255, 255}, kBlack{0, 0, 0}, kGrid{225, 225, 225};
constexpr Rgb kMeasured{31, 119, 180}, kIdeal{127, 127, 127}, kPredicted{214, 39, 40};

// Where values land: x is log2(W), y linear from 0; both in SVG/PNG pixel coordinates.
struct Geometry {
  double x_min = 0, x_max = 1;  // log2 of the world sizes, padded
  double y_max = 1;
  std::vector<int> x_ticks;     // world sizes
  std::vector<double> y_ticks;  // values
  double y_step = 1;

  double px(double world_size) const {
    const double plot = ScalingChart::kWidth - kLeft - kRight;
    return kLeft + (std::log2(world_size) - x_min) / (x_max - x_min) * plot;
  }
  double py(double value) const {
    const double plot = ScalingChart::kHeight - kTop - kBottom;
    return kTop + plot - std::clamp(value / y_max, 0.0, 1.0) * plot;
  }
};

std::optional<double> value_at_one(const ScalingChart& c) {
  for (const auto& p : c.measured)
    if (p.world_size == 1) return p.value;
  return std::nullopt;
}

double ideal_value(const ScalingChart& c, double one, double world_size) {
  return c.ideal_falls ? one / world_size : one * world_size;
}

// The ideal line, kIdealSamples + 1 points in pixels, from W = 1 (the measurement it goes through,
// on the W = 1 tick) to the largest world size on the chart. Not across the whole padded x axis:
// sampled from x_min, it began 0.3 octave left of W = 1, an ideal for less than one worker.
std::vector<std::array<double, 2>> ideal_line(const ScalingChart& c,
                                              const Geometry& g,
                                              double one) {
  const double last = std::log2(g.x_ticks.back());
  std::vector<std::array<double, 2>> points;
  for (int i = 0; i <= kIdealSamples; ++i) {
    const double ws = std::exp2(last * i / kIdealSamples);
    points.push_back({g.px(ws), g.py(ideal_value(c, one, ws))});
  }
  return points;
}

// "Nice" tick step (1, 2 or 5 x 10^k) giving at most 6 ticks up to `max`.
double nice_step(double max) {
  const double raw = max / 6;
  const double base = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * base >= raw) return m * base;
  return 10 * base;
}

Geometry geometry(const ScalingChart& c) {
  Geometry g;
  std::vector<int> sizes;
  double top = 0;
  for (const auto* points : {&c.measured, &c.predicted})
    for (const auto& p : *points) {
      sizes.push_back(p.world_size);
      top = std::max(top, p.value);
    }
  TY_CHECK(!sizes.empty(), "A scaling chart needs at least one point.");
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  g.x_ticks = sizes;
  g.x_min = std::log2(sizes.front()) - 0.3;
  g.x_max = std::log2(sizes.back()) + 0.3;
  if (const auto one = value_at_one(c); one && !c.ideal_falls)
    top = std::max(top, ideal_value(c, *one, sizes.back()));
  if (top <= 0) top = 1;
  g.y_step = nice_step(top * 1.05);
  g.y_max = std::ceil(top * 1.05 / g.y_step) * g.y_step;
  for (double v = 0; v <= g.y_max + g.y_step / 2; v += g.y_step) g.y_ticks.push_back(v);
  return g;
}

std::string number(double v, double step) {
  char buf[32];
  const int decimals = step >= 1 ? 0 : static_cast<int>(std::ceil(-std::log10(step) - 1e-9));
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

std::string hex(Rgb c) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "#%02x%02x%02x", c.r, c.g, c.b);
  return buf;
}

// The legend's rows: label, colour, marker (0 line + filled dot, 1 dashed line, 2 hollow dot).
struct LegendRow {
  const char* label;
  Rgb color;
  int marker;
};
std::vector<LegendRow> legend_rows(const ScalingChart& c) {
  std::vector<LegendRow> rows = {{"measured", kMeasured, 0}};
  if (value_at_one(c)) rows.push_back({"ideal", kIdeal, 1});
  if (!c.predicted.empty()) rows.push_back({"predicted", kPredicted, 2});
  return rows;
}

// --- PNG: an RGB canvas with lines, dots and a 5x7 font --------------------------------------

// 5x7 glyphs, one byte per row, bit 4 the leftmost column. Lower case draws as upper case;
// characters without a glyph are blank.
const std::array<std::uint8_t, 7>* glyph(char ch) {
  struct Glyph {
    char ch;
    std::array<std::uint8_t, 7> rows;
  };
  static const Glyph kFont[] = {
      {'0', {0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E}},
      {'1', {0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E}},
      {'2', {0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F}},
      {'3', {0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E}},
      {'4', {0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02}},
      {'5', {0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E}},
      {'6', {0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E}},
      {'7', {0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08}},
      {'8', {0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E}},
      {'9', {0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C}},
      {'.', {0x00, 0x00, 0x00, 0x00, 0x00, 0x0C, 0x0C}},
      {'-', {0x00, 0x00, 0x00, 0x1F, 0x00, 0x00, 0x00}},
      {'/', {0x00, 0x01, 0x02, 0x04, 0x08, 0x10, 0x00}},
      {'(', {0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02}},
      {')', {0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08}},
      {':', {0x00, 0x0C, 0x0C, 0x00, 0x0C, 0x0C, 0x00}},
      {'A', {0x0E, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11}},
      {'B', {0x1E, 0x11, 0x11, 0x1E, 0x11, 0x11, 0x1E}},
      {'C', {0x0E, 0x11, 0x10, 0x10, 0x10, 0x11, 0x0E}},
      {'D', {0x1C, 0x12, 0x11, 0x11, 0x11, 0x12, 0x1C}},
      {'E', {0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x1F}},
      {'F', {0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x10}},
      {'G', {0x0E, 0x11, 0x10, 0x17, 0x11, 0x11, 0x0F}},
      {'H', {0x11, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11}},
      {'I', {0x0E, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E}},
      {'J', {0x07, 0x02, 0x02, 0x02, 0x02, 0x12, 0x0C}},
      {'K', {0x11, 0x12, 0x14, 0x18, 0x14, 0x12, 0x11}},
      {'L', {0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x1F}},
      {'M', {0x11, 0x1B, 0x15, 0x15, 0x11, 0x11, 0x11}},
      {'N', {0x11, 0x11, 0x19, 0x15, 0x13, 0x11, 0x11}},
      {'O', {0x0E, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E}},
      {'P', {0x1E, 0x11, 0x11, 0x1E, 0x10, 0x10, 0x10}},
      {'Q', {0x0E, 0x11, 0x11, 0x11, 0x15, 0x12, 0x0D}},
      {'R', {0x1E, 0x11, 0x11, 0x1E, 0x14, 0x12, 0x11}},
      {'S', {0x0F, 0x10, 0x10, 0x0E, 0x01, 0x01, 0x1E}},
      {'T', {0x1F, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04}},
      {'U', {0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E}},
      {'V', {0x11, 0x11, 0x11, 0x11, 0x11, 0x0A, 0x04}},
      {'W', {0x11, 0x11, 0x11, 0x15, 0x15, 0x15, 0x0A}},
      {'X', {0x11, 0x11, 0x0A, 0x04, 0x0A, 0x11, 0x11}},
      {'Y', {0x11, 0x11, 0x0A, 0x04, 0x04, 0x04, 0x04}},
      {'Z', {0x1F, 0x01, 0x02, 0x04, 0x08, 0x10, 0x1F}},
  };
  const char up = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  for (const auto& g : kFont)
    if (g.ch == up) return &g.rows;
  return nullptr;
}

class Canvas {
 public:
  Canvas(int width, int height) : width_(width), height_(height), rgb_(3u * width * height, 255) {}

  void set(int x, int y, Rgb c) {
    if (x < 0 || y < 0 || x >= width_ || y >= height_) return;
    auto* p = &rgb_[3u * (static_cast<std::size_t>(y) * width_ + x)];
    p[0] = c.r, p[1] = c.g, p[2] = c.b;
  }
  // A square pen of `thickness` pixels stepped along the segment; with dash > 0, on for `dash`
  // pixels, off for `dash`.
  void line(double x0, double y0, double x1, double y1, Rgb c, int thickness = 1, int dash = 0) {
    const double length = std::hypot(x1 - x0, y1 - y0);
    const int steps = std::max(1, static_cast<int>(std::ceil(length)));
    for (int i = 0; i <= steps; ++i) {
      if (dash > 0 && (i / dash) % 2 == 1) continue;
      const double t = static_cast<double>(i) / steps;
      const int x = static_cast<int>(std::lround(x0 + t * (x1 - x0)));
      const int y = static_cast<int>(std::lround(y0 + t * (y1 - y0)));
      for (int dy = -(thickness / 2); dy < thickness - thickness / 2; ++dy)
        for (int dx = -(thickness / 2); dx < thickness - thickness / 2; ++dx)
          set(x + dx, y + dy, c);
    }
  }
  // A disc of radius r, or with `hollow` a ring 2 pixels wide with a white inside.
  void dot(double cx, double cy, double r, Rgb c, bool hollow) {
    for (int y = static_cast<int>(cy - r - 1); y <= static_cast<int>(cy + r + 1); ++y)
      for (int x = static_cast<int>(cx - r - 1); x <= static_cast<int>(cx + r + 1); ++x) {
        const double d = std::hypot(x - cx, y - cy);
        if (d <= r) set(x, y, hollow && d < r - 2 ? kWhite : c);
      }
  }
  // Text at (x, y) = its top-left corner, each font pixel `scale` pixels square.
  void text(double x, double y, const std::string& s, Rgb c, int scale = 2) {
    int pen = static_cast<int>(x);
    for (char ch : s) {
      if (const auto* rows = glyph(ch))
        for (int row = 0; row < 7; ++row)
          for (int col = 0; col < 5; ++col)
            if ((*rows)[row] & (0x10 >> col))
              for (int sy = 0; sy < scale; ++sy)
                for (int sx = 0; sx < scale; ++sx)
                  set(pen + col * scale + sx, static_cast<int>(y) + row * scale + sy, c);
      pen += 6 * scale;
    }
  }
  static int text_width(const std::string& s, int scale = 2) {
    return static_cast<int>(s.size()) * 6 * scale;
  }

  void write_png(const std::string& path) const;

 private:
  int width_, height_;
  std::vector<std::uint8_t> rgb_;  // (height, width, 3), row-major
};

void Canvas::write_png(const std::string& path) const {
  const std::string tmp = path + ".tmp";
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(tmp.c_str(), "wb"), &std::fclose);
  TY_CHECK_T(Error, file != nullptr, "Could not write the chart to ", tmp, ".");
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png != nullptr ? png_create_info_struct(png) : nullptr;
  std::vector<png_bytep> rows(height_);
  for (int y = 0; y < height_; ++y)
    rows[y] = const_cast<png_bytep>(rgb_.data() + 3u * static_cast<std::size_t>(y) * width_);
  volatile bool ok = png != nullptr && info != nullptr;  // volatile: read after a longjmp
  // libpng reports errors by longjmp; nothing with a destructor lives between here and there.
  if (ok && setjmp(png_jmpbuf(png)) == 0) {
    png_init_io(png, file.get());
    png_set_IHDR(png, info, width_, height_, 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
                 PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    png_write_info(png, info);
    png_write_image(png, rows.data());
    png_write_end(png, nullptr);
  } else {
    ok = false;
  }
  png_destroy_write_struct(&png, &info);
  ok = std::fclose(file.release()) == 0 && ok;
  std::error_code ec;
  if (ok) std::filesystem::rename(tmp, path, ec);
  if (!ok || ec) std::filesystem::remove(tmp, ec);
  TY_CHECK_T(Error, ok && !ec, "Could not write the chart to ", path,
             " (libpng or the file system failed).");
}

}  // namespace

std::string chart_svg(const ScalingChart& c) {
  const Geometry g = geometry(c);
  const double w = ScalingChart::kWidth, h = ScalingChart::kHeight;
  const double x0 = kLeft, x1 = w - kRight, y0 = h - kBottom, y1 = kTop;
  std::ostringstream s;
  s << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
    << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << w << "\" height=\"" << h
    << "\" viewBox=\"0 0 " << w << ' ' << h << "\" font-family=\"sans-serif\" font-size=\"13\">\n"
    << "<rect x=\"0\" y=\"0\" width=\"" << w << "\" height=\"" << h << "\" fill=\"white\"/>\n"
    << "<text x=\"" << w / 2 << "\" y=\"28\" text-anchor=\"middle\" font-size=\"16\">"
    << net::xml_escape(c.title) << "</text>\n";
  // Grid, ticks and labels.
  for (double v : g.y_ticks) {
    s << "<line x1=\"" << x0 << "\" y1=\"" << g.py(v) << "\" x2=\"" << x1 << "\" y2=\"" << g.py(v)
      << "\" stroke=\"" << hex(kGrid) << "\"/>\n"
      << "<text x=\"" << x0 - 8 << "\" y=\"" << g.py(v) + 4 << "\" text-anchor=\"end\">"
      << number(v, g.y_step) << "</text>\n";
  }
  for (int ws : g.x_ticks) {
    s << "<line x1=\"" << g.px(ws) << "\" y1=\"" << y0 << "\" x2=\"" << g.px(ws) << "\" y2=\""
      << y0 + 6 << "\" stroke=\"black\"/>\n"
      << "<text x=\"" << g.px(ws) << "\" y=\"" << y0 + 22 << "\" text-anchor=\"middle\">" << ws
      << "</text>\n";
  }
  s << "<path d=\"M" << x0 << ' ' << y1 << " V" << y0 << " H" << x1
    << "\" fill=\"none\" stroke=\"black\"/>\n"
    << "<text x=\"" << (x0 + x1) / 2 << "\" y=\"" << h - 14 << "\" text-anchor=\"middle\">"
    << net::xml_escape(c.x_label) << " (world size, log scale)</text>\n"
    << "<text transform=\"translate(20 " << (y0 + y1) / 2
    << ") rotate(-90)\" text-anchor=\"middle\">" << net::xml_escape(c.y_label) << "</text>\n";
  // The ideal line, then the measured line and points, then the predicted points.
  if (const auto one = value_at_one(c)) {
    s << "<polyline fill=\"none\" stroke=\"" << hex(kIdeal)
      << "\" stroke-width=\"2\" stroke-dasharray=\"6 4\" points=\"";
    const auto points = ideal_line(c, g, *one);
    for (std::size_t i = 0; i < points.size(); ++i)
      s << (i > 0 ? " " : "") << points[i][0] << ',' << points[i][1];
    s << "\"/>\n";
  }
  auto measured = c.measured;
  std::sort(measured.begin(), measured.end(),
            [](const ChartPoint& a, const ChartPoint& b) { return a.world_size < b.world_size; });
  s << "<polyline fill=\"none\" stroke=\"" << hex(kMeasured) << "\" stroke-width=\"2\" points=\"";
  for (std::size_t i = 0; i < measured.size(); ++i)
    s << (i > 0 ? " " : "") << g.px(measured[i].world_size) << ',' << g.py(measured[i].value);
  s << "\"/>\n";
  for (const auto& p : measured)
    s << "<circle class=\"measured\" cx=\"" << g.px(p.world_size) << "\" cy=\"" << g.py(p.value)
      << "\" r=\"5\" fill=\"" << hex(kMeasured) << "\"><title>W=" << p.world_size << ": " << p.value
      << "</title></circle>\n";
  for (const auto& p : c.predicted)
    s << "<circle class=\"predicted\" cx=\"" << g.px(p.world_size) << "\" cy=\"" << g.py(p.value)
      << "\" r=\"5\" fill=\"white\" stroke=\"" << hex(kPredicted)
      << "\" stroke-width=\"2\"><title>W=" << p.world_size << " predicted: " << p.value
      << "</title></circle>\n";
  // The legend, right of the plot; markers are paths and rects, so circles count points only.
  double ly = kTop + 10;
  for (const auto& row : legend_rows(c)) {
    const double lx = x1 + 20;
    if (row.marker == 2) {
      s << "<rect x=\"" << lx + 10 << "\" y=\"" << ly - 5
        << "\" width=\"10\" height=\"10\" rx=\"5\""
        << " fill=\"white\" stroke=\"" << hex(row.color) << "\" stroke-width=\"2\"/>\n";
    } else {
      s << "<path d=\"M" << lx << ' ' << ly << " H" << lx + 30 << "\" stroke=\"" << hex(row.color)
        << "\" stroke-width=\"2\"" << (row.marker == 1 ? " stroke-dasharray=\"6 4\"" : "")
        << "/>\n";
      if (row.marker == 0)
        s << "<rect x=\"" << lx + 10 << "\" y=\"" << ly - 5
          << "\" width=\"10\" height=\"10\" rx=\"5\" fill=\"" << hex(row.color) << "\"/>\n";
    }
    s << "<text x=\"" << lx + 40 << "\" y=\"" << ly + 4 << "\">" << row.label << "</text>\n";
    ly += 24;
  }
  s << "</svg>\n";
  return s.str();
}

void write_chart_png(const ScalingChart& c, const std::string& path) {
  const Geometry g = geometry(c);
  const int w = ScalingChart::kWidth, h = ScalingChart::kHeight;
  const double x0 = kLeft, x1 = w - kRight, y0 = h - kBottom, y1 = kTop;
  Canvas canvas(w, h);
  canvas.text((w - Canvas::text_width(c.title)) / 2.0, 14, c.title, kBlack);
  for (double v : g.y_ticks) {
    canvas.line(x0, g.py(v), x1, g.py(v), kGrid);
    const auto label = number(v, g.y_step);
    canvas.text(x0 - 8 - Canvas::text_width(label), g.py(v) - 7, label, kBlack);
  }
  for (int ws : g.x_ticks) {
    canvas.line(g.px(ws), y0, g.px(ws), y0 + 6, kBlack);
    const auto label = std::to_string(ws);
    canvas.text(g.px(ws) - Canvas::text_width(label) / 2.0, y0 + 12, label, kBlack);
  }
  canvas.line(x0, y1, x0, y0, kBlack);
  canvas.line(x0, y0, x1, y0, kBlack);
  const std::string x_label = c.x_label + " (log scale)";
  canvas.text((x0 + x1 - Canvas::text_width(x_label)) / 2, h - 24, x_label, kBlack);
  canvas.text(x0 - 60, y1 - 18, c.y_label, kBlack, 1);
  if (const auto one = value_at_one(c)) {
    const auto points = ideal_line(c, g, *one);
    for (std::size_t i = 0; i + 1 < points.size(); i += 2)  // every other segment: the dashes
      canvas.line(points[i][0], points[i][1], points[i + 1][0], points[i + 1][1], kIdeal, 2);
  }
  auto measured = c.measured;
  std::sort(measured.begin(), measured.end(),
            [](const ChartPoint& a, const ChartPoint& b) { return a.world_size < b.world_size; });
  for (std::size_t i = 1; i < measured.size(); ++i)
    canvas.line(g.px(measured[i - 1].world_size), g.py(measured[i - 1].value),
                g.px(measured[i].world_size), g.py(measured[i].value), kMeasured, 2);
  for (const auto& p : measured) canvas.dot(g.px(p.world_size), g.py(p.value), 5, kMeasured, false);
  for (const auto& p : c.predicted)
    canvas.dot(g.px(p.world_size), g.py(p.value), 5, kPredicted, true);
  double ly = kTop + 10;
  for (const auto& row : legend_rows(c)) {
    const double lx = x1 + 20;
    if (row.marker != 2) canvas.line(lx, ly, lx + 30, ly, row.color, 2, row.marker == 1 ? 6 : 0);
    if (row.marker != 1) canvas.dot(lx + 15, ly, 5, row.color, row.marker == 2);
    canvas.text(lx + 40, ly - 7, row.label, kBlack);
    ly += 24;
  }
  canvas.write_png(path);
}

}  // namespace trainyard::cli
