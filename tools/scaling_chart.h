// The chart `trainyard bench scaling` draws: a measured quantity (epoch time, throughput) against
// the number of workers on a log2 axis, measured points joined by a line, the ideal line dashed,
// predicted points hollow, with a legend. As SVG text written by hand and as a PNG drawn into an
// RGB buffer by a small line/point/5x7-font rasteriser and written with libpng.
#pragma once

#include <string>
#include <vector>

namespace trainyard::cli {

struct ChartPoint {
  int world_size = 1;
  double value = 0;
};

struct ScalingChart {
  static constexpr int kWidth = 800;   // pixels, SVG and PNG
  static constexpr int kHeight = 500;  // pixels, SVG and PNG

  std::string title;                  // "FashionMNIST: epoch time against workers"
  std::string y_label;                // "epoch time (s)"
  std::string x_label = "workers";    // what W counts: "workers", "nodes of 1 rank"
  std::vector<ChartPoint> measured;   // filled circles joined by a line
  std::vector<ChartPoint> predicted;  // hollow circles
  // The ideal line through the W = 1 measurement, from W = 1 to the largest W charted: value(1) / W
  // when `ideal_falls` (times), value(1) x W otherwise (throughput). None without a measured W = 1
  // point.
  bool ideal_falls = true;
};

// The chart as an SVG document: one <circle> per measured and per predicted point, nothing else
// drawn as a circle (the legend's markers are <rect>s and <path>s).
std::string chart_svg(const ScalingChart& chart);

// Writes the chart as an 8-bit RGB PNG of kWidth x kHeight to `path` (through a temporary file
// renamed into place). Throws Error when the file cannot be written.
void write_chart_png(const ScalingChart& chart, const std::string& path);

}  // namespace trainyard::cli
