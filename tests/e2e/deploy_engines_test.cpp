// The sample task files for SkyPilot, dstack and Volcano (deploy/skypilot, deploy/dstack,
// deploy/volcano) run as those engines run them: their own `trainyard run` command, which has no
// launcher flags, started on two network-namespace hosts with exactly the variables the engine
// sets on each node, trains the seed's FashionMNIST job across both (a short epoch: the test's
// flags come after the sample's, and a recipe takes a flag's last value).
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "../multiproc/multiproc_util.h"
#include "../prerequisite.h"
#include "../text.h"
#include "netns_hosts.h"
#include "trainyard/elastic/subprocess.h"

namespace engines {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using trainyard::mptest::Hosts;
using trainyard::mptest::TempDir;
using trainyard::test::contains;

const fs::path kRepository = TRAINYARD_SOURCE_DIR;
const char* const kFashionMnist = "/usr/share/datasets/fashion-mnist";

std::vector<std::string> words_of(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

// The sample's command as argv, both `trainyard`s the built binary, then the test's own flags.
std::vector<std::string> command_of(std::vector<std::string> argv, const fs::path& storage) {
  EXPECT_GE(argv.size(), 4u);
  EXPECT_EQ(argv[0], "trainyard");
  EXPECT_EQ(argv[1], "run");
  EXPECT_EQ(argv[2], "--") << "the sample gives no launcher flags: the engine's variables do";
  for (auto& w : argv)
    if (w == "trainyard") w = TRAINYARD_CLI_PATH;
  argv.insert(argv.end(),
              {"--epochs", "1", "--limit", "512", "--batch-size", "64", "--threads", "1",
               "--storage", storage.string(), "--name", "engine", "--no-progress"});
  return argv;
}

using NodeEnv = std::vector<std::pair<std::string, std::string>>;

// Runs `argv` on two namespace hosts, node i with env_of(i, hosts), and checks the job.
void train_on_two_hosts(const std::vector<std::string>& argv,
                        const std::function<NodeEnv(int, const Hosts&)>& env_of,
                        const fs::path& storage) {
  Hosts hosts(2);
  if (!hosts.ok())
    TY_MISSING_PREREQUISITE("cannot create network namespaces here: " << hosts.error());
  if (!fs::exists(kFashionMnist))
    TY_MISSING_PREREQUISITE(kFashionMnist << " missing: scripts/setup.sh");
  std::vector<std::unique_ptr<trainyard::elastic::Subprocess>> nodes;
  for (int i = 0; i < 2; ++i) {
    auto env = env_of(i, hosts);
    env.insert(env.end(),
               {{"TRAINYARD_JOIN_TIMEOUT", "20"}, {"TRAINYARD_COLLECTIVE_TIMEOUT", "30"}});
    nodes.push_back(std::make_unique<trainyard::elastic::Subprocess>(
        trainyard::elastic::SubprocessOptions{.argv = hosts.in(i, argv), .env = std::move(env)}));
  }
  auto out = trainyard::mptest::collect_all({nodes[0].get(), nodes[1].get()}, 50s);
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(out[i].status.success() && !out[i].timed_out) << "node " << i << ":\n"
                                                              << out[i].out << out[i].err;
    EXPECT_TRUE(contains(out[i].err, "on 2 node(s), this is node " + std::to_string(i)))
        << out[i].err;
  }
  EXPECT_TRUE(fs::exists(storage / "engine" / "result.json"));
}

std::string ips(const Hosts& hosts) {
  return hosts.addr(0) + "\n" + hosts.addr(1) + "\n";
}

TEST(DeployEngines, SkyPilotTaskTrainsOnTwoHostsFromItsVariables) {
  const auto task = YAML::LoadFile((kRepository / "deploy/skypilot/fashion-mnist.yaml").string());
  EXPECT_EQ(task["num_nodes"].as<int>(), 2);
  TempDir dir;
  train_on_two_hosts(
      command_of(words_of(task["run"].as<std::string>()), dir.path()),
      [](int i, const Hosts& hosts) {
        return NodeEnv{{"SKYPILOT_NODE_IPS", ips(hosts)},
                       {"SKYPILOT_NODE_RANK", std::to_string(i)},
                       {"SKYPILOT_NUM_NODES", "2"},
                       {"SKYPILOT_NUM_GPUS_PER_NODE", "0"},
                       {"SKYPILOT_TASK_ID", "sky-test"}};
      },
      dir.path());
}

TEST(DeployEngines, DstackTaskTrainsOnTwoHostsFromItsVariables) {
  const auto task =
      YAML::LoadFile((kRepository / "deploy/dstack/fashion-mnist.dstack.yml").string());
  EXPECT_EQ(task["type"].as<std::string>(), "task");
  EXPECT_EQ(task["nodes"].as<int>(), 2);
  TempDir dir;
  train_on_two_hosts(
      command_of(words_of(task["commands"][0].as<std::string>()), dir.path()),
      [](int i, const Hosts& hosts) {
        return NodeEnv{{"DSTACK_MASTER_NODE_IP", hosts.addr(0)},
                       {"DSTACK_NODES_IPS", ips(hosts)},
                       {"DSTACK_NODE_RANK", std::to_string(i)},
                       {"DSTACK_NODES_NUM", "2"},
                       {"DSTACK_GPUS_PER_NODE", "0"},
                       {"DSTACK_RUN_NAME", "dstack-test"}};
      },
      dir.path());
}

TEST(DeployEngines, VolcanoJobTrainsOnTwoHostsFromThePytorchPluginsVariables) {
  const auto job = YAML::LoadFile((kRepository / "deploy/volcano/fashion-mnist.yaml").string());
  EXPECT_EQ(job["kind"].as<std::string>(), "Job");
  EXPECT_EQ(job["spec"]["plugins"]["pytorch"][2].as<std::string>(), "--port=23456");
  const auto tasks = job["spec"]["tasks"];
  ASSERT_EQ(tasks.size(), 2u);
  EXPECT_EQ(tasks[0]["name"].as<std::string>(), "master");
  const auto container = tasks[0]["template"]["spec"]["containers"][0];
  // The image's ENTRYPOINT is trainyard; args follow it. The worker task is the same pod.
  std::vector<std::string> argv = {"trainyard"};
  for (const auto& a : container["args"]) argv.push_back(a.as<std::string>());
  EXPECT_EQ(YAML::Dump(tasks[1]["template"]), YAML::Dump(tasks[0]["template"]));
  TempDir dir;
  train_on_two_hosts(
      command_of(argv, dir.path()),
      [](int i, const Hosts& hosts) {
        // The plugin counts pods: master RANK 0, worker RANK 1; each task indexes its own pods.
        return NodeEnv{{"MASTER_ADDR", hosts.addr(0)},
                       {"MASTER_PORT", "23456"},
                       {"WORLD_SIZE", "2"},
                       {"RANK", std::to_string(i)},
                       {"VC_TASK_INDEX", "0"}};
      },
      dir.path());
}

}  // namespace engines
