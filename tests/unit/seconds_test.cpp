// parse_seconds: the one parser behind every time flag, variable and --rdzv-conf value.
#include "trainyard/seconds.h"

#include <gtest/gtest.h>

namespace trainyard {
namespace {

using std::chrono::milliseconds;

TEST(Seconds, WholeAndFractionalNumbersWithinTheRange) {
  EXPECT_EQ(parse_seconds("30", 0, 60), milliseconds(30'000));
  EXPECT_EQ(parse_seconds("0.5", 0, 60), milliseconds(500));
  EXPECT_EQ(parse_seconds("1e2", 0, 1e6), milliseconds(100'000));
  EXPECT_EQ(parse_seconds("0", 0, 60), milliseconds(0));
  EXPECT_EQ(parse_seconds("60", 0, 60), milliseconds(60'000));  // both ends are in the range
  EXPECT_EQ(parse_seconds("0.0015", 0, 60), milliseconds(2));   // rounded to the millisecond
}

TEST(Seconds, AnythingElseIsRejected) {
  for (const char* bad : {"", " 5", "5 ", "5s", "five", "-1", "61", "nan", "inf", "1e400"})
    EXPECT_FALSE(parse_seconds(bad, 0, 60).has_value()) << "'" << bad << "'";
}

}  // namespace
}  // namespace trainyard
