// Rank metrics files: FilePublisher writes a registry's snapshot, read_rank_files reads a folder.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>

#include "../temp_dir.h"
#include "trainyard/error.h"
#include "trainyard/metrics/names.h"
#include "trainyard/metrics/rank_files.h"
#include "trainyard/metrics/registry.h"

using namespace trainyard::metrics;
namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

using trainyard::test::TempDir;

bool eventually(const std::function<bool()>& cond, std::chrono::milliseconds timeout = 5s) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (cond()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return cond();
}

using trainyard::test::write_text;

// The value of `name` in rank `rank`'s file, or NaN when there is none.
double read_value(const std::string& dir, int rank, std::string_view name, const Labels& m = {}) {
  for (const RankSnapshot& r : read_rank_files(dir))
    if (r.rank == rank) return find_value(r.snapshot, name, m);
  return std::nan("");
}

constexpr std::string_view kSteps = name::kTrainStepsTotal;
constexpr std::string_view kLoss = name::kTrainLoss;

}  // namespace

TEST(MetricsRankFiles, PathNamesTheRank) {
  EXPECT_EQ(rank_file_path("/tmp/m", 3), "/tmp/m/rank_3.json");
  EXPECT_EQ(rank_file_path("/tmp/m/", 12), "/tmp/m/rank_12.json");
}

TEST(MetricsRankFiles, RoundTripOfKnownValues) {
  TempDir dir;
  Registry registry;
  registry.counter(kSteps, "Steps.").add(42);
  registry.gauge(kLoss, "Loss.").set(2.5);
  registry.counter(name::kCollectiveBytes, "Bytes.", {{"op", "all_reduce"}}).add(1024);
  registry.counter(name::kCollectiveBytes, "Bytes.", {{"op", "broadcast"}}).add(8);
  {
    FilePublisher publisher(registry, {.dir = dir.str(), .rank = 2, .interval = 1h});
    publisher.publish_now();
    const auto ranks = read_rank_files(dir.str());
    ASSERT_EQ(ranks.size(), 1u);
    EXPECT_EQ(ranks[0].rank, 2);
    EXPECT_EQ(ranks[0].snapshot, registry.snapshot());
    EXPECT_DOUBLE_EQ(find_value(ranks[0].snapshot, name::kCollectiveBytes, {{"op", "broadcast"}}),
                     8.0);
    // stop() writes once more, and promptly although the interval is an hour.
    registry.counter(kSteps, "Steps.").add(1);
    const auto before = std::chrono::steady_clock::now();
    publisher.stop();
    EXPECT_LT(std::chrono::steady_clock::now() - before, 2s);
    EXPECT_DOUBLE_EQ(read_value(dir.str(), 2, kSteps), 43.0);
    publisher.stop();  // idempotent
  }
  EXPECT_TRUE(fs::exists(rank_file_path(dir.str(), 2)));
  // No temporary file is left behind.
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir.path())) {
    ++files;
    EXPECT_EQ(e.path().filename().string(), "rank_2.json");
  }
  EXPECT_EQ(files, 1);
}

TEST(MetricsRankFiles, PublishesEveryIntervalAndCreatesTheFolder) {
  TempDir dir;
  const std::string sub = (dir.path() / "metrics" / "run").string();  // created by the publisher
  Registry registry;
  Counter& steps = registry.counter(kSteps, "Steps.");
  steps.add(1);
  FilePublisher publisher(registry, {.dir = sub, .rank = 0, .interval = 30ms});
  EXPECT_TRUE(eventually([&] { return read_value(sub, 0, kSteps) == 1.0; }));
  steps.add(4);
  EXPECT_TRUE(eventually([&] { return read_value(sub, 0, kSteps) == 5.0; }));
  registry.gauge(kLoss, "Loss.").set(0.75);
  EXPECT_TRUE(eventually([&] { return read_value(sub, 0, kLoss) == 0.75; }));
}

TEST(MetricsRankFiles, ReadsRanksInOrderAndSkipsCorruptAndForeignFiles) {
  TempDir dir;
  Registry r0, r1, r10;
  r0.counter(kSteps, "Steps.").add(10);
  r1.counter(kSteps, "Steps.").add(11);
  r10.counter(kSteps, "Steps.").add(20);
  FilePublisher p10(r10, {.dir = dir.str(), .rank = 10, .interval = 1h});
  FilePublisher p1(r1, {.dir = dir.str(), .rank = 1, .interval = 1h});
  FilePublisher p0(r0, {.dir = dir.str(), .rank = 0, .interval = 1h});
  p10.stop();
  p1.stop();
  p0.stop();
  write_text(rank_file_path(dir.str(), 3), "[{\"name\": \"trainyard_x\", \"type\": ");  // cut off
  write_text(rank_file_path(dir.str(), 4), "[{\"name\": \"9bad\", \"type\": \"gauge\"}]");
  write_text(dir.path() / ".rank_5.json.tmp.123", "[]");  // a publisher's temporary file
  write_text(dir.path() / "rank_x.json", "[]");
  write_text(dir.path() / "rank_6.json.bak", "[]");
  fs::create_directories(dir.path() / "rank_7.json");  // a folder: cannot be read, skipped

  for (int round = 0; round < 2; ++round) {  // the second round's warnings are rate-limited
    const auto ranks = read_rank_files(dir.str());
    ASSERT_EQ(ranks.size(), 3u);
    EXPECT_EQ(ranks[0].rank, 0);
    EXPECT_EQ(ranks[1].rank, 1);
    EXPECT_EQ(ranks[2].rank, 10);
    EXPECT_DOUBLE_EQ(find_value(ranks[0].snapshot, kSteps), 10.0);
    EXPECT_DOUBLE_EQ(find_value(ranks[1].snapshot, kSteps), 11.0);
    EXPECT_DOUBLE_EQ(find_value(ranks[2].snapshot, kSteps), 20.0);
  }
}

TEST(MetricsRankFiles, MissingFolderReadsAsNothing) {
  TempDir dir;
  EXPECT_TRUE(read_rank_files((dir.path() / "absent").string()).empty());
  EXPECT_TRUE(read_rank_files(dir.str()).empty());
  EXPECT_NO_THROW(clear_rank_files((dir.path() / "absent").string()));
}

TEST(MetricsRankFiles, ClearRemovesRankFilesOnly) {
  TempDir dir;
  Registry registry;
  for (int rank : {0, 1, 5}) FilePublisher(registry, {.dir = dir.str(), .rank = rank}).stop();
  write_text(dir.path() / ".rank_2.json.tmp.99", "[");
  write_text(dir.path() / "notes.txt", "kept");
  ASSERT_EQ(read_rank_files(dir.str()).size(), 3u);
  clear_rank_files(dir.str());
  EXPECT_TRUE(read_rank_files(dir.str()).empty());
  EXPECT_FALSE(fs::exists(dir.path() / ".rank_2.json.tmp.99"));
  EXPECT_TRUE(fs::exists(dir.path() / "notes.txt"));
}

TEST(MetricsRankFiles, UnwritableFolderNeverThrows) {
  TempDir dir;
  write_text(dir.path() / "a_file", "x");
  // A folder below a regular file cannot be created, even by root.
  const std::string bad = (dir.path() / "a_file" / "metrics").string();
  Registry registry;
  registry.counter(kSteps, "Steps.").add(1);
  {
    FilePublisher publisher(registry, {.dir = bad, .rank = 0, .interval = 10ms});
    std::this_thread::sleep_for(60ms);  // several failing writes, one warning
    EXPECT_NO_THROW(publisher.publish_now());
    EXPECT_NO_THROW(publisher.stop());
  }
  EXPECT_TRUE(read_rank_files(bad).empty());
}

TEST(MetricsRankFiles, OptionsAreValidated) {
  Registry registry;
  try {
    FilePublisher p(registry, {.dir = ""});
    FAIL() << "an empty dir was accepted";
  } catch (const trainyard::InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("FilePublisherOptions.dir"), std::string::npos);
  }
  try {
    FilePublisher p(registry, {.dir = "/tmp", .rank = -1});
    FAIL() << "a negative rank was accepted";
  } catch (const trainyard::InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("rank is -1"), std::string::npos);
  }
  try {
    FilePublisher p(registry, {.dir = "/tmp", .rank = 0, .interval = 0ms});
    FAIL() << "a zero interval was accepted";
  } catch (const trainyard::InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("interval is 0 ms"), std::string::npos);
  }
}
