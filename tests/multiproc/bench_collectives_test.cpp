// `trainyard bench collectives` as real ranks under `trainyard run`: the report parses in
// nccl-tests' format (every stdout line a '#' comment or a row), each op's sizes double from
// --min-bytes to --max-bytes, size/count/redop/root are nccl-tests', no element is wrong, and the
// numbers agree with each other (algbw = size / time, busbw = algbw x the op's factor, the
// closing average = the mean of the rows' busbw) within the printed rounding. Through the
// shared-memory group, through Gloo (TRAINYARD_SHM=0), and with an odd world size.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "multiproc_util.h"
#include "trainyard/comm/collective_bench.h"
#include "trainyard/error.h"

#ifndef TRAINYARD_CLI_PATH
#error "TRAINYARD_CLI_PATH must name the trainyard binary (a compile definition)"
#endif

namespace trainyard::mptest {
namespace {

using namespace std::chrono_literals;

constexpr std::int64_t kMinBytes = 1024;
constexpr std::int64_t kMaxBytes = 256 << 10;
const std::vector<std::string> kOps = {"all_reduce", "all_gather", "reduce_scatter", "broadcast"};

struct Row {
  std::string op;
  std::int64_t size = 0;
  std::int64_t count = 0;
  std::string type;
  std::string redop;
  int root = 0;
  double time_us = 0;
  std::string time_text;  // as printed, for its number of decimals
  double algbw = 0;
  double busbw = 0;
  std::int64_t wrong = 0;
};

struct Report {
  std::vector<std::string> ops;     // block titles in order
  std::vector<std::string> places;  // "in place" or "out of place", per block
  std::vector<Row> rows;
  std::string parameters;  // the "# nThread ..." line
  std::string group;       // the "# Using process group ..." line
  std::string out_of_bounds;
  double avg_busbw = std::numeric_limits<double>::quiet_NaN();
  int column_headers = 0;
};

// Parses rank 0's stdout; a line that is neither a comment nor a row fails the test.
Report parse_report(const std::string& out) {
  static const std::regex kRow(
      R"(^ *(\d+) +(\d+) +(\S+) +(\S+) +(-?\d+) +(\d+(?:\.\d+)?) +(\d+\.\d\d) +(\d+\.\d\d) +(-?\d+)$)");
  static const std::regex kTitle(
      R"(^# (all_reduce|all_gather|reduce_scatter|broadcast) \((in place|out of place)\)$)");
  static const std::regex kAvg(R"(^# Avg bus bandwidth    : (\S+) *$)");
  static const std::string kColumns =
      "#       size         count      type   redop    root     time   algbw   busbw #wrong";
  Report r;
  std::istringstream in(out);
  std::string line;
  std::smatch m;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    if (std::regex_match(line, m, kRow)) {
      EXPECT_FALSE(r.ops.empty()) << "a row before any op's title: " << line;
      Row row{.op = r.ops.empty() ? "" : r.ops.back(),
              .size = std::stoll(m[1]),
              .count = std::stoll(m[2]),
              .type = m[3],
              .redop = m[4],
              .root = std::stoi(m[5]),
              .time_us = std::stod(m[6]),
              .time_text = m[6],
              .algbw = std::stod(m[7]),
              .busbw = std::stod(m[8]),
              .wrong = std::stoll(m[9])};
      r.rows.push_back(row);
    } else if (std::regex_match(line, m, kTitle)) {
      r.ops.push_back(m[1]);
      r.places.push_back(m[2]);
    } else if (std::regex_match(line, m, kAvg)) {
      r.avg_busbw = std::stod(m[1]);
    } else if (line == kColumns) {
      ++r.column_headers;
    } else if (line.rfind("# nThread ", 0) == 0) {
      r.parameters = line;
    } else if (line.rfind("# Using process group ", 0) == 0) {
      r.group = line;
    } else if (line.rfind("# Out of bounds values : ", 0) == 0) {
      r.out_of_bounds = line;
    } else {
      EXPECT_EQ(line[0], '#') << "neither a comment nor a row in nccl-tests' format: " << line;
    }
  }
  return r;
}

double factor_of(const std::string& op, int world) {
  if (op == "all_reduce") return 2.0 * (world - 1) / world;
  if (op == "broadcast") return 1.0;
  return 1.0 * (world - 1) / world;
}

// Half a unit in the last printed place of nccl-tests' time column.
double time_rounding(const std::string& text) {
  const auto dot = text.find('.');
  if (dot == std::string::npos) return 0.5;
  return 0.5 * std::pow(10.0, -static_cast<double>(text.size() - dot - 1));
}

void expect_report(const Report& r, int world, const std::string& backend, bool in_place) {
  EXPECT_NE(r.parameters.find("minBytes 1024 maxBytes 262144 step: 2(factor) warmup iters: 1 "
                              "iters: 5 agg iters: 1 validation: 1"),
            std::string::npos)
      << r.parameters;
  EXPECT_NE(
      r.group.find("# Using process group " + backend + ": " + std::to_string(world) + " ranks"),
      std::string::npos)
      << r.group;
  ASSERT_EQ(r.ops, kOps);
  EXPECT_EQ(r.column_headers, 4);
  for (std::size_t i = 0; i < r.ops.size(); ++i) {
    const bool flat = r.ops[i] == "all_gather" || r.ops[i] == "reduce_scatter";
    EXPECT_EQ(r.places[i], in_place || !flat ? "in place" : "out of place") << r.ops[i];
  }

  double busbw_sum = 0;
  for (const auto& op : kOps) {
    SCOPED_TRACE(op);
    std::vector<Row> rows;
    for (const auto& row : r.rows)
      if (row.op == op) rows.push_back(row);
    ASSERT_EQ(rows.size(), 9u) << "1K, 2K, ..., 256K";
    const bool flat = op == "all_gather" || op == "reduce_scatter";
    std::int64_t nominal = kMinBytes;
    for (const auto& row : rows) {
      SCOPED_TRACE("nominal size " + std::to_string(nominal));
      // nccl-tests: size is the whole tensor, count the elements one call names (the per-rank
      // slot for the flat collectives, which round the whole down to a multiple of W floats).
      if (flat) {
        EXPECT_EQ(row.count, nominal / 4 / world);
        EXPECT_EQ(row.size, row.count * world * 4);
      } else {
        EXPECT_EQ(row.count, nominal / 4);
        EXPECT_EQ(row.size, nominal);
      }
      EXPECT_EQ(row.type, "float");
      EXPECT_EQ(row.redop, op == "all_reduce" || op == "reduce_scatter" ? "sum" : "none");
      EXPECT_EQ(row.root, op == "broadcast" ? 0 : -1);
      EXPECT_EQ(row.wrong, 0);
      ASSERT_GT(row.time_us, 0);
      // algbw = size / time (GB/s = bytes per us / 1e3), both printed rounded.
      const double algbw = static_cast<double>(row.size) / row.time_us / 1e3;
      EXPECT_NEAR(row.algbw, algbw, 0.0051 + algbw * time_rounding(row.time_text) / row.time_us);
      const double factor = factor_of(op, world);
      EXPECT_NEAR(row.busbw, row.algbw * factor, 0.0051 + 0.005 * factor);
      busbw_sum += row.busbw;
      nominal *= 2;
    }
  }
  EXPECT_EQ(r.out_of_bounds, "# Out of bounds values : 0 OK");
  ASSERT_FALSE(std::isnan(r.avg_busbw)) << "no '# Avg bus bandwidth' line";
  const double mean = busbw_sum / static_cast<double>(r.rows.size());
  EXPECT_NEAR(r.avg_busbw, mean, 0.0051 + 1e-5 * mean);
}

RunOutput run_bench(int world,
                    std::vector<std::string> extra_flags = {},
                    std::vector<std::pair<std::string, std::string>> env = {}) {
  std::vector<std::string> argv = {kCli,
                                   "run",
                                   "--nproc-per-node",
                                   std::to_string(world),
                                   "--no-prefix",
                                   "--",
                                   kCli,
                                   "bench",
                                   "collectives",
                                   "--min-bytes",
                                   "1K",
                                   "--max-bytes",
                                   "256K",
                                   "--iters",
                                   "5",
                                   "--warmup",
                                   "1"};
  argv.insert(argv.end(), extra_flags.begin(), extra_flags.end());
  return run_program(std::move(argv), std::move(env), 45s);
}

TEST(BenchCollectives, TwoRanksThroughSharedMemory) {
  const auto r = run_bench(2);
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  ASSERT_TRUE(r.status.success()) << r.status.to_string() << "\n" << r.out << r.err;
  expect_report(parse_report(r.out), 2, "trainyard-shm", /*in_place=*/false);
}

TEST(BenchCollectives, TwoRanksThroughGloo) {
  const auto r = run_bench(2, {}, {{"TRAINYARD_SHM", "0"}});
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  ASSERT_TRUE(r.status.success()) << r.status.to_string() << "\n" << r.out << r.err;
  expect_report(parse_report(r.out), 2, "gloo", /*in_place=*/false);
}

// An odd world size, with buffers in shared memory: every collective in place, and the flat ones
// round each size down to a multiple of 3 floats.
TEST(BenchCollectives, ThreeRanksInPlaceInSharedMemory) {
  const auto r = run_bench(3, {"--buffer", "shared"});
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  ASSERT_TRUE(r.status.success()) << r.status.to_string() << "\n" << r.out << r.err;
  expect_report(parse_report(r.out), 3, "trainyard-shm", /*in_place=*/true);
}

TEST(BenchCollectives, ABareStartSaysHowToLaunchIt) {
  ASSERT_EQ(std::getenv("WORLD_SIZE"), nullptr) << "this test runs the command outside a job";
  const auto r = run_program({kCli, "bench", "collectives"}, {}, 20s);
  EXPECT_EQ(r.status.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("RANK and WORLD_SIZE are not set"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("HINT: trainyard run --nproc-per-node 2 -- trainyard bench collectives"),
            std::string::npos)
      << r.err;
}

// The closing lines as nccl-tests writes them: rows with wrong elements are counted (not the
// elements), and the average is the plain mean of every row's busbw.
TEST(BenchCollectives, FooterCountsFailedRowsAndAveragesBusBandwidth) {
  using comm::BenchOp;
  using comm::CollectiveBenchRow;
  const std::vector<CollectiveBenchRow> rows = {
      {.op = BenchOp::kAllReduce, .busbw_gbps = 1.0, .wrong = 0},
      {.op = BenchOp::kAllGather, .busbw_gbps = 2.0, .wrong = 7},
      {.op = BenchOp::kBroadcast, .busbw_gbps = 6.0, .wrong = -1},
  };
  EXPECT_EQ(comm::format_bench_footer(rows),
            "# Out of bounds values : 1 FAILED\n# Avg bus bandwidth    : 3\n#\n");
  EXPECT_EQ(comm::total_wrong(rows), 7);
  EXPECT_EQ(
      comm::format_bench_row({.op = BenchOp::kReduceScatter,
                              .size_bytes = 3072,
                              .count = 256,
                              .time_us = 123.456,
                              .algbw_gbps = 0.0249,
                              .busbw_gbps = 0.0166,
                              .wrong = 0}),
      "        3072           256     float     sum      -1    123.5    0.02    0.02      0\n");
}

TEST(BenchCollectives, SizesTakeNcclTestsSuffixes) {
  EXPECT_EQ(comm::parse_bench_bytes("1K", "--min-bytes"), 1024);
  EXPECT_EQ(comm::parse_bench_bytes("64M", "--max-bytes"), 64 << 20);
  EXPECT_EQ(comm::parse_bench_bytes("1g", "--max-bytes"), 1 << 30);
  EXPECT_EQ(comm::parse_bench_bytes("0.5K", "--min-bytes"), 512);
  EXPECT_EQ(comm::parse_bench_bytes("4096", "--min-bytes"), 4096);
  EXPECT_THROW(comm::parse_bench_bytes("1KB", "--min-bytes"), InvalidArgumentError);
  EXPECT_THROW(comm::parse_bench_bytes("", "--min-bytes"), InvalidArgumentError);
  EXPECT_THROW(comm::parse_bench_bytes("-1", "--min-bytes"), InvalidArgumentError);
  EXPECT_THROW(comm::parse_collective_ops("all_reduce,allgather"), InvalidArgumentError);
}

}  // namespace
}  // namespace trainyard::mptest
