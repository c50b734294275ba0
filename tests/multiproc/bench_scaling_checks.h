// What every `trainyard bench scaling` run must leave, whether its workers are local ranks or
// nodes: the table on stdout (one row per measured world size, one per predicted-only size),
// scaling.json with the measured points and the predictions, and the charts: each SVG has the
// documented size and one <circle> per measured and per predicted point (every world size but 1),
// each PNG is an 8-bit RGB PNG of the documented size. Shared by tests/multiproc and tests/e2e.
#pragma once

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include "multiproc_util.h"

namespace trainyard::mptest {

inline constexpr int kScalingChartWidth = 800;   // ScalingChart::kWidth
inline constexpr int kScalingChartHeight = 500;  // ScalingChart::kHeight

inline int count_of(const std::string& text, const std::string& needle) {
  int n = 0;
  for (auto pos = text.find(needle); pos != std::string::npos; pos = text.find(needle, pos + 1))
    ++n;
  return n;
}

inline std::uint32_t big_endian_u32(const std::string& bytes, std::size_t at) {
  std::uint32_t v = 0;
  for (std::size_t i = 0; i < 4; ++i) v = v << 8 | static_cast<unsigned char>(bytes.at(at + i));
  return v;
}

inline int regex_count(const std::string& text, const std::string& pattern) {
  const std::regex re(pattern);
  return static_cast<int>(
      std::distance(std::sregex_iterator(text.begin(), text.end(), re), std::sregex_iterator()));
}

// Checks a run with --busbw (a model) at `measured` world sizes (sorted, starting at 1) and
// --predict `predicted_only` (sizes not measured), its stdout `out`, its folder `dir`.
inline void expect_scaling_outputs(const std::string& out,
                                   const std::filesystem::path& dir,
                                   const std::vector<int>& measured,
                                   const std::vector<int>& predicted_only) {
  // The table: a header, one row per measured world size, one per predicted-only size.
  EXPECT_NE(out.find("epoch time (s)"), std::string::npos) << out;
  for (int w : measured)
    EXPECT_EQ(regex_count(out, "(^|\\n) +" + std::to_string(w) +
                                   R"( +\d+\.\d{3} +\d+\.\d +\d\.\d{3} +\d\.\d{3}(?=\n))"),
              1)
        << "W = " << w << "\n"
        << out;
  for (int w : predicted_only)
    EXPECT_EQ(
        regex_count(out, "(^|\\n) +" + std::to_string(w) + R"( +\S+\* +\S+\* +- +\d\.\d{3}(?=\n))"),
        1)
        << "W = " << w << "\n"
        << out;

  // scaling.json: every world size with positive times, and the predictions.
  const auto json = nlohmann::json::parse(read_file(dir / "scaling.json"));
  ASSERT_EQ(json.at("points").size(), measured.size()) << json.dump(2);
  for (std::size_t i = 0; i < measured.size(); ++i) {
    const auto& p = json["points"][i];
    EXPECT_EQ(p.at("world_size").get<int>(), measured[i]);
    EXPECT_GT(p.at("epoch_time_s").get<double>(), 0);
    EXPECT_GT(p.at("samples_per_s").get<double>(), 0);
    EXPECT_GT(p.at("predicted_efficiency").get<double>(), 0);
  }
  EXPECT_DOUBLE_EQ(json["points"][0].at("efficiency").get<double>(), 1.0);
  const std::size_t predictions = measured.size() - 1 + predicted_only.size();  // all but W = 1
  EXPECT_EQ(json.at("predictions").size(), predictions) << json.dump(2);
  // No --gradient-bytes: 4 bytes per parameter the recipe recorded in its config.json.
  const auto config = nlohmann::json::parse(read_file(dir / "runs" / "w1" / "config.json"));
  ASSERT_TRUE(config.contains("parameters")) << config.dump(2);
  EXPECT_EQ(json.at("model").at("gradient_bytes").get<std::int64_t>(),
            4 * config.at("parameters").get<std::int64_t>())
      << json.dump(2);

  // The SVGs: their size, and the measured and predicted points.
  const int points = static_cast<int>(measured.size() + predictions);
  for (const char* name : {"scaling.svg", "throughput.svg"}) {
    const std::string svg = read_file(dir / name);
    EXPECT_EQ(svg.rfind("<?xml", 0), 0u) << name;
    EXPECT_NE(svg.find("<svg "), std::string::npos) << name;
    EXPECT_NE(svg.find("width=\"" + std::to_string(kScalingChartWidth) + "\""), std::string::npos)
        << name;
    EXPECT_NE(svg.find("height=\"" + std::to_string(kScalingChartHeight) + "\""), std::string::npos)
        << name;
    EXPECT_EQ(count_of(svg, "</svg>"), 1) << name;
    EXPECT_EQ(count_of(svg, "<circle "), points) << name;
    EXPECT_EQ(count_of(svg, "<circle class=\"measured\""), static_cast<int>(measured.size()))
        << name;
    EXPECT_EQ(count_of(svg, "<circle class=\"predicted\""), static_cast<int>(predictions)) << name;
    EXPECT_EQ(count_of(svg, "<circle "), count_of(svg, "</circle>")) << name;
  }

  // The PNGs: the signature, then IHDR with the documented width and height, 8-bit RGB.
  for (const char* name : {"scaling.png", "throughput.png"}) {
    const std::string png = read_file(dir / name);
    ASSERT_GT(png.size(), 33u) << name;
    EXPECT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8)) << name;
    EXPECT_EQ(png.substr(12, 4), "IHDR") << name;
    EXPECT_EQ(big_endian_u32(png, 16), static_cast<std::uint32_t>(kScalingChartWidth)) << name;
    EXPECT_EQ(big_endian_u32(png, 20), static_cast<std::uint32_t>(kScalingChartHeight)) << name;
    EXPECT_EQ(static_cast<int>(png[24]), 8) << name;  // bit depth
    EXPECT_EQ(static_cast<int>(png[25]), 2) << name;  // colour type RGB
  }
}

}  // namespace trainyard::mptest
