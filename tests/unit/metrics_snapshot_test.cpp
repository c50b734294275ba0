// The metrics data model: registry, JSON round trip, labels, and Prometheus' text format.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <thread>
#include <vector>

#include "trainyard/error.h"
#include "trainyard/metrics/registry.h"
#include "trainyard/metrics/snapshot.h"

using namespace trainyard::metrics;

TEST(MetricsRegistry, CountersAddFromManyThreads) {
  Registry registry;
  Counter& c = registry.counter("trainyard_test_calls_total", "Calls.", {{"op", "all_reduce"}});
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) c.add(0.5);
    });
  for (auto& t : threads) t.join();
  // The same name and labels give the same series.
  EXPECT_EQ(&c, &registry.counter("trainyard_test_calls_total", "Calls.", {{"op", "all_reduce"}}));
  EXPECT_DOUBLE_EQ(
      find_value(registry.snapshot(), "trainyard_test_calls_total", {{"op", "all_reduce"}}),
      20000.0);
}

TEST(MetricsRegistry, RefusesBadNamesAndTypeChanges) {
  Registry registry;
  registry.gauge("trainyard_test_value", "A value.").set(3);
  EXPECT_THROW(registry.counter("trainyard_test_value", "x"), trainyard::InvalidArgumentError);
  EXPECT_THROW(registry.gauge("9starts_with_digit", "x"), trainyard::InvalidArgumentError);
  EXPECT_THROW(registry.gauge("trainyard_ok", "x", {{"__reserved", "v"}}),
               trainyard::InvalidArgumentError);
  EXPECT_THROW(registry.gauge("trainyard_ok2", "x", {{"bad-label", "v"}}),
               trainyard::InvalidArgumentError);
}

TEST(MetricsSnapshot, JsonRoundTripKeepsLabelOrderAndSpecialValues) {
  Snapshot s{Family{.name = "trainyard_a_total",
                    .type = MetricType::kCounter,
                    .help = "A \"quoted\" help\nline.",
                    .samples = {Sample{{{"z", "1"}, {"a", "2"}}, 1.5},
                                Sample{{}, std::numeric_limits<double>::infinity()}}},
             Family{.name = "trainyard_b", .type = MetricType::kGauge, .help = "", .samples = {}}};
  s[0].samples.push_back(Sample{{{"k", "v"}}, std::numeric_limits<double>::quiet_NaN()});
  Snapshot back = snapshot_from_json(snapshot_json(s), "the test");
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[0].samples[0], s[0].samples[0]);
  EXPECT_TRUE(std::isinf(back[0].samples[1].value));
  EXPECT_TRUE(std::isnan(back[0].samples[2].value));
  EXPECT_EQ(back[0].help, s[0].help);
  EXPECT_EQ(back[1].type, MetricType::kGauge);
}

TEST(MetricsSnapshot, MalformedJsonNamesWhatIsWrong) {
  try {
    snapshot_from_json(R"([{"name":"trainyard_x","type":"summary","samples":[]}])",
                       "rank 3's file");
    FAIL();
  } catch (const trainyard::InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 3's file"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("summary"), std::string::npos) << e.what();
  }
  EXPECT_THROW(snapshot_from_json("{", "x"), trainyard::InvalidArgumentError);
}

TEST(MetricsSnapshot, LabelsAndMerge) {
  Snapshot a{Family{"trainyard_x", MetricType::kGauge, "X.", {Sample{{{"rank", "1"}}, 1}}}};
  Snapshot b{Family{"trainyard_x", MetricType::kGauge, "X.", {Sample{{}, 2}}},
             Family{"trainyard_y", MetricType::kGauge, "Y.", {Sample{{}, 3}}}};
  a = with_labels(std::move(a), {{"job", "j"}, {"rank", "0"}});
  // The sample's own rank label wins; job comes first.
  EXPECT_EQ(a[0].samples[0].labels, (Labels{{"job", "j"}, {"rank", "1"}}));
  merge_into(a, with_labels(b, {{"job", "j"}, {"rank", "2"}}));
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a[0].samples.size(), 2u);
  EXPECT_DOUBLE_EQ(find_value(a, "trainyard_x", {{"rank", "2"}}), 2);
  EXPECT_TRUE(std::isnan(find_value(a, "trainyard_x", {{"rank", "7"}})));
}

TEST(MetricsSnapshot, PrometheusTextFormat) {
  Snapshot s{
      Family{"trainyard_collective_bytes_total",
             MetricType::kCounter,
             "Bytes sent.\\ok",
             {Sample{{{"op", "all_reduce"}, {"path", "a\"b\\c\nd"}}, 1048576}, Sample{{}, 0.25}}},
      Family{"trainyard_gpu_power_watts",
             MetricType::kGauge,
             "Power.",
             {Sample{{}, -std::numeric_limits<double>::infinity()}}}};
  EXPECT_EQ(prometheus_text(s),
            "# HELP trainyard_collective_bytes_total Bytes sent.\\\\ok\n"
            "# TYPE trainyard_collective_bytes_total counter\n"
            "trainyard_collective_bytes_total{op=\"all_reduce\",path=\"a\\\"b\\\\c\\nd\"} 1048576\n"
            "trainyard_collective_bytes_total 0.25\n"
            "# HELP trainyard_gpu_power_watts Power.\n"
            "# TYPE trainyard_gpu_power_watts gauge\n"
            "trainyard_gpu_power_watts -Inf\n");
}
