// `trainyard bench scaling` over real ranks: the FashionMNIST recipe at 1 and 2 local ranks, then
// the table on stdout, scaling.json with both world sizes, and the charts: the SVG has the
// documented size and one <circle> per measured point and per predicted one (every world size but
// 1), the PNG is a PNG of the documented size.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <regex>
#include <string>

#include "multiproc_util.h"

#ifndef TRAINYARD_CLI_PATH
#error "TRAINYARD_CLI_PATH must name the trainyard binary (a compile definition)"
#endif

namespace trainyard::mptest {
namespace {

using namespace std::chrono_literals;

constexpr const char* kCli = TRAINYARD_CLI_PATH;
constexpr int kWidth = 800;   // ScalingChart::kWidth
constexpr int kHeight = 500;  // ScalingChart::kHeight

int count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (auto pos = text.find(needle); pos != std::string::npos; pos = text.find(needle, pos + 1))
    ++n;
  return n;
}

std::uint32_t big_endian(const std::string& bytes, std::size_t at) {
  std::uint32_t v = 0;
  for (std::size_t i = 0; i < 4; ++i) v = v << 8 | static_cast<unsigned char>(bytes.at(at + i));
  return v;
}

TEST(BenchScaling, RunsEachWorldSizeAndDrawsTheCharts) {
  TempDir dir;
  const std::string out = (dir.path() / "scaling").string();
  auto r = run_program({kCli,        "bench",   "scaling",      "--world-sizes", "1,2",
                        "--busbw",   "1.0",     "--predict",    "4,16",          "--out",
                        out,         "--",      "train",        "fashion-mnist", "--epochs",
                        "1",         "--limit", "256",          "--batch-size",  "32",
                        "--threads", "1",       "--no-progress"},
                       {}, 150s);
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  ASSERT_TRUE(r.status.success()) << r.status.to_string() << "\n" << r.out << r.err;

  // The table: a header, one row per measured world size, one per predicted-only size.
  EXPECT_NE(r.out.find("epoch time (s)"), std::string::npos) << r.out;
  static const std::regex kMeasured(
      R"((^|\n) +([12]) +\d+\.\d{3} +\d+\.\d +\d\.\d{3} +\d\.\d{3}(?=\n))");
  EXPECT_EQ(std::distance(std::sregex_iterator(r.out.begin(), r.out.end(), kMeasured),
                          std::sregex_iterator()),
            2)
      << r.out;
  static const std::regex kPredicted(R"((^|\n) +(4|16) +\S+\* +\S+\* +- +\d\.\d{3}(?=\n))");
  EXPECT_EQ(std::distance(std::sregex_iterator(r.out.begin(), r.out.end(), kPredicted),
                          std::sregex_iterator()),
            2)
      << r.out;

  // scaling.json: both world sizes with positive times, and the predictions.
  const auto json = nlohmann::json::parse(read_file(std::filesystem::path(out) / "scaling.json"));
  ASSERT_EQ(json.at("points").size(), 2u) << json.dump(2);
  for (std::size_t i = 0; i < 2; ++i) {
    const auto& p = json["points"][i];
    EXPECT_EQ(p.at("world_size").get<int>(), static_cast<int>(i) + 1);
    EXPECT_GT(p.at("epoch_time_s").get<double>(), 0);
    EXPECT_GT(p.at("samples_per_s").get<double>(), 0);
    EXPECT_GT(p.at("predicted_efficiency").get<double>(), 0);
  }
  EXPECT_DOUBLE_EQ(json["points"][0].at("efficiency").get<double>(), 1.0);
  EXPECT_EQ(json.at("predictions").size(), 3u) << json.dump(2);  // W = 2, 4, 16
  // No --gradient-bytes: 4 bytes per parameter the recipe recorded in its config.json.
  const auto config =
      nlohmann::json::parse(read_file(std::filesystem::path(out) / "runs" / "w1" / "config.json"));
  ASSERT_TRUE(config.contains("parameters")) << config.dump(2);
  EXPECT_EQ(json.at("model").at("gradient_bytes").get<std::int64_t>(),
            4 * config.at("parameters").get<std::int64_t>())
      << json.dump(2);

  // The SVG: its size, and 2 measured + 3 predicted points.
  for (const char* name : {"scaling.svg", "throughput.svg"}) {
    const std::string svg = read_file(std::filesystem::path(out) / name);
    EXPECT_EQ(svg.rfind("<?xml", 0), 0u) << name;
    EXPECT_NE(svg.find("<svg "), std::string::npos) << name;
    EXPECT_NE(svg.find("width=\"" + std::to_string(kWidth) + "\""), std::string::npos) << name;
    EXPECT_NE(svg.find("height=\"" + std::to_string(kHeight) + "\""), std::string::npos) << name;
    EXPECT_EQ(count(svg, "</svg>"), 1) << name;
    EXPECT_EQ(count(svg, "<circle "), 5) << name;
    EXPECT_EQ(count(svg, "<circle class=\"measured\""), 2) << name;
    EXPECT_EQ(count(svg, "<circle class=\"predicted\""), 3) << name;
    EXPECT_EQ(count(svg, "<circle "), count(svg, "</circle>")) << name;
  }

  // The PNG: its signature, then IHDR with the documented width and height, 8-bit RGB.
  for (const char* name : {"scaling.png", "throughput.png"}) {
    const std::string png = read_file(std::filesystem::path(out) / name);
    ASSERT_GT(png.size(), 33u) << name;
    EXPECT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8)) << name;
    EXPECT_EQ(png.substr(12, 4), "IHDR") << name;
    EXPECT_EQ(big_endian(png, 16), static_cast<std::uint32_t>(kWidth)) << name;
    EXPECT_EQ(big_endian(png, 20), static_cast<std::uint32_t>(kHeight)) << name;
    EXPECT_EQ(static_cast<int>(png[24]), 8) << name;  // bit depth
    EXPECT_EQ(static_cast<int>(png[25]), 2) << name;  // colour type RGB
  }
}

TEST(BenchScaling, RefusesWorldSizesWithoutOneRank) {
  TempDir dir;
  auto r = run_program({kCli, "bench", "scaling", "--world-sizes", "2,4", "--out", dir.str(), "--",
                        "train", "fashion-mnist"});
  EXPECT_EQ(r.status.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("--world-sizes must include 1"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace trainyard::mptest
