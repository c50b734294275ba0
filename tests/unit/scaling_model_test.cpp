// The scaling model of `trainyard bench scaling` (Note [Scaling model]): the ring all-reduce cost
// at nccl-tests' bus bandwidth, predicted and measured weak-scaling efficiency, and its flags.
#include <gtest/gtest.h>

#include "trainyard/error.h"
#include "trainyard/plan/scaling_model.h"

namespace trainyard::plan {
namespace {

TEST(ScalingModel, RingAllReduceMovesTwoWMinusOneOverWOfTheBuffer) {
  EXPECT_EQ(ring_all_reduce_seconds(1'000'000'000, 1, 10.0), 0.0);  // one rank: nothing moves
  EXPECT_DOUBLE_EQ(ring_all_reduce_seconds(1'000'000'000, 2, 10.0), 0.1);      // 2(1)/2 x 1 GB / 10
  EXPECT_DOUBLE_EQ(ring_all_reduce_seconds(1'000'000'000, 4, 10.0), 0.15);     // 2(3)/4 x 0.1
  EXPECT_DOUBLE_EQ(ring_all_reduce_seconds(1'000'000'000, 16, 10.0), 0.1875);  // 30/16 x 0.1
}

TEST(ScalingModel, EfficiencyIsOneStepTimeOverTheStepTimeWithTheAllReduce) {
  const ScalingModelOptions model{
      .compute_time_s = 0.1, .gradient_bytes = 1'000'000'000, .busbw_gbps = 10.0};
  EXPECT_DOUBLE_EQ(predicted_step_time_s(model, 1), 0.1);
  EXPECT_DOUBLE_EQ(predicted_step_time_s(model, 2), 0.2);
  EXPECT_DOUBLE_EQ(predicted_efficiency(model, 1), 1.0);
  EXPECT_DOUBLE_EQ(predicted_efficiency(model, 2), 0.5);         // 0.1 / (0.1 + 0.1)
  EXPECT_DOUBLE_EQ(predicted_efficiency(model, 4), 0.1 / 0.25);  // 0.1 / (0.1 + 0.15)
  // The limit as W grows: compute / (compute + 2 x bytes / busbw) = 0.1 / 0.3.
  EXPECT_GT(predicted_efficiency(model, 1024), 1.0 / 3);
  EXPECT_LT(predicted_efficiency(model, 1024), 0.334);
}

TEST(ScalingModel, MeasuredEfficiencyComparesWithWTimesOneRank) {
  const ScalingPoint one{.world_size = 1, .epoch_time_s = 10, .samples_per_s = 100};
  const ScalingPoint two{.world_size = 2, .epoch_time_s = 6.25, .samples_per_s = 160};
  EXPECT_DOUBLE_EQ(measured_efficiency(one, one), 1.0);
  EXPECT_DOUBLE_EQ(measured_efficiency(two, one), 0.8);
  EXPECT_THROW(measured_efficiency(two, ScalingPoint{}), InvalidArgumentError);
}

TEST(ScalingModel, InvalidOptionsNameTheField) {
  try {
    predicted_efficiency({.compute_time_s = 0.1, .gradient_bytes = 4, .busbw_gbps = 0}, 2);
    FAIL() << "busbw 0 was accepted";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("busbw_gbps"), std::string::npos) << e.what();
  }
}

TEST(ScalingModel, ParsesWorldSizesAndByteCounts) {
  EXPECT_EQ(parse_world_sizes("1,2,4", "--world-sizes"), (std::vector<int>{1, 2, 4}));
  EXPECT_TRUE(parse_world_sizes("", "--predict").empty());
  EXPECT_THROW(parse_world_sizes("1,,2", "--world-sizes"), InvalidArgumentError);
  EXPECT_THROW(parse_world_sizes("1,0", "--world-sizes"), InvalidArgumentError);
  EXPECT_THROW(parse_world_sizes("2,2", "--world-sizes"), InvalidArgumentError);
  EXPECT_EQ(parse_byte_count("1048576", "--gradient-bytes"), 1 << 20);
  EXPECT_EQ(parse_byte_count("1K", "--gradient-bytes"), 1024);
  EXPECT_EQ(parse_byte_count("0.5M", "--gradient-bytes"), 1 << 19);
  EXPECT_EQ(parse_byte_count("2G", "--gradient-bytes"), std::int64_t{2} << 30);
  EXPECT_THROW(parse_byte_count("12X", "--gradient-bytes"), InvalidArgumentError);
  EXPECT_THROW(parse_byte_count("M", "--gradient-bytes"), InvalidArgumentError);
  EXPECT_THROW(parse_byte_count("0", "--gradient-bytes"), InvalidArgumentError);
}

}  // namespace
}  // namespace trainyard::plan
