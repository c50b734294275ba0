// docs/grafana/trainyard.json is built from the metric names trainyard exports: every name a
// panel queries is one of metrics/names.h's, and the panels cover the training, node and GPU
// families. (The multiproc Prometheus test runs every panel's query against a real server.)
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::set<std::string> names_in(const std::string& text, const std::regex& pattern) {
  std::set<std::string> out;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), pattern);
       it != std::sregex_iterator(); ++it)
    out.insert((*it)[1].str());
  return out;
}

}  // namespace

TEST(GrafanaDashboard, QueriesOnlyExportedNamesAndCoversTheFamilies) {
  const std::string dir = TRAINYARD_SOURCE_DIR;
  const auto exported = names_in(read_text(dir + "/include/trainyard/metrics/names.h"),
                                 std::regex("\"(trainyard_[a-z_]+)\""));
  ASSERT_GT(exported.size(), 30u);
  const auto dashboard = nlohmann::json::parse(read_text(dir + "/docs/grafana/trainyard.json"));
  std::set<std::string> queried;
  int targets = 0;
  for (const auto& panel : dashboard.at("panels")) {
    if (!panel.contains("targets")) continue;
    for (const auto& target : panel["targets"]) {
      ++targets;
      const std::string expr = target.at("expr").get<std::string>();
      for (const auto& name : names_in(expr, std::regex("(trainyard_[a-z_]+)"))) {
        EXPECT_TRUE(exported.count(name)) << "panel \"" << panel["title"].get<std::string>()
                                          << "\" queries " << name << ", which names.h lacks";
        queried.insert(name);
      }
    }
  }
  EXPECT_GT(targets, 20);
  for (const char* must :
       {"trainyard_train_loss", "trainyard_train_samples_per_second",
        "trainyard_train_step_phase_seconds_total", "trainyard_collective_bytes_total",
        "trainyard_node_cpu_utilization_ratio", "trainyard_gpu_utilization_ratio",
        "trainyard_gpu_memory_used_bytes", "trainyard_gpu_xid_errors_total",
        "trainyard_cluster_nodes"})
    EXPECT_TRUE(queried.count(must)) << "no panel shows " << must;
  // Importable: the data source is an input, and the job and node variables exist.
  EXPECT_EQ(dashboard.at("__inputs")[0].at("pluginId"), "prometheus");
  std::set<std::string> variables;
  for (const auto& v : dashboard.at("templating").at("list")) variables.insert(v.at("name"));
  EXPECT_EQ(variables, (std::set<std::string>{"job", "node"}));
}
