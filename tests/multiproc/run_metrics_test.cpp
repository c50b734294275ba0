// `trainyard run --metrics-port`: the standalone agent serves its node's and its ranks' metrics
// for Prometheus while the ranks run. The ranks (metrics_helper) publish known values as a
// trainyard rank does; /metrics must show exactly those, labelled node, job_id (the run id) and
// rank, beside the node's own families and the ranks' processes.
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>

#include "../prerequisite.h"
#include "multiproc_util.h"
#include "trainyard/cluster/node_resources.h"
#include "trainyard/net/http_client.h"

namespace trainyard::mptest {
namespace {

using namespace std::chrono_literals;

constexpr const char* kPromtool = "/usr/bin/promtool";

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(RunMetrics, ServesTheNodesAndTheRanksMetricsWhileTheyRun) {
  int port = 0;
  { bind_loopback(false, &port); }  // a free port (closed again at once)
  elastic::Subprocess run(elastic::SubprocessOptions{
      .argv = {TRAINYARD_CLI_PATH, "run", "--nproc-per-node", "2", "--rdzv-id", "m-run",
               "--metrics-port", std::to_string(port), "--", TRAINYARD_METRICS_HELPER, "6000"}});
  const std::string node = cluster::local_hostname();
  const std::string rank0 = "{node=\"" + node + "\",job_id=\"m-run\",rank=\"0\"}";
  const std::string rank1 = "{node=\"" + node + "\",job_id=\"m-run\",rank=\"1\"}";
  net::HttpClient client;
  std::string body;
  const auto until = std::chrono::steady_clock::now() + 20s;
  while (std::chrono::steady_clock::now() < until) {
    try {
      const auto r = client.perform(net::HttpRequest{
          .method = "GET", .url = "http://127.0.0.1:" + std::to_string(port) + "/metrics"});
      body = r.body;
      if (r.status == 200 && has(body, "trainyard_train_loss" + rank0) &&
          has(body, "trainyard_train_loss" + rank1) &&
          has(body, "trainyard_rank_resident_memory_bytes" + rank0) &&
          has(body, "trainyard_rank_resident_memory_bytes" + rank1)) {
        break;
      }
    } catch (const std::exception&) {
      // not listening yet
    }
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_TRUE(has(body, "trainyard_train_loss" + rank0 + " 0.25")) << body;
  EXPECT_TRUE(has(body, "trainyard_train_loss" + rank1 + " 1.25")) << body;
  EXPECT_TRUE(has(body, "trainyard_train_steps_total" + rank1 + " 20")) << body;
  EXPECT_TRUE(has(body, "trainyard_rank_resident_memory_bytes" + rank0)) << body;
  EXPECT_TRUE(has(body, "trainyard_node_cpu_utilization_ratio{node=\"" + node + "\"}")) << body;
  EXPECT_TRUE(has(body, "# TYPE trainyard_train_steps_total counter")) << body;
  // Prometheus' own linter finds nothing wrong with the text (Debian's prometheus ships promtool).
  if (access(kPromtool, X_OK) == 0) {
    TempDir dir;
    std::ofstream(dir.path() / "scrape.txt") << body;
    const RunOutput lint = run_program({"/bin/sh", "-c",
                                        std::string(kPromtool) + " check metrics < '" +
                                            (dir.path() / "scrape.txt").string() + "' 2>&1"},
                                       {}, 20s);
    EXPECT_EQ(lint.status.exit_code, 0) << lint.out << lint.err;
    EXPECT_EQ(lint.out, "") << body;
  } else if (test::running_under_ci()) {
    ADD_FAILURE() << kPromtool << " is missing under CI: scripts/setup.sh installs prometheus.";
  }
  const RunOutput done = collect(run, 20s);
  EXPECT_EQ(done.status.exit_code, 0) << done.out << done.err;
  EXPECT_TRUE(has(done.err, "/metrics")) << "the endpoint is announced: " << done.err;
}

}  // namespace
}  // namespace trainyard::mptest
