// trainyard under a real Slurm (Debian's slurm-wlm 22.05 with munge): slurmctld and a slurmd on
// each of two network-namespace hosts (tests/e2e/slurm_cluster.sh). deploy/slurm's sbatch script
// trains FashionMNIST on both nodes, loses one mid-job and finishes on the other; the plain
// `srun trainyard run -- ...` form trains on both from Slurm's variables alone.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "../multiproc/multiproc_util.h"
#include "../prerequisite.h"
#include "../text.h"
#include "netns_hosts.h"
#include "trainyard/elastic/subprocess.h"

namespace slurm {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using trainyard::mptest::Hosts;
using trainyard::mptest::read_file;
using trainyard::mptest::run_program;
using trainyard::mptest::TempDir;
using trainyard::test::contains;

const fs::path kRepository = TRAINYARD_SOURCE_DIR;
const fs::path kClusterScript = kRepository / "tests/e2e/slurm_cluster.sh";

// slurmctld on node01 and a slurmd on every host, up until destroyed. Check ok() first.
class SlurmCluster {
 public:
  SlurmCluster(const Hosts& hosts, int n, fs::path dir) : dir_(std::move(dir)) {
    std::vector<std::string> argv = {kClusterScript.string(), "up", dir_.string()};
    for (int i = 0; i < n; ++i) argv.push_back(hosts.name(i) + ":" + hosts.addr(i));
    auto r = run_program(argv, {}, 60s);
    ok_ = r.status.success() && !r.timed_out;
    error_ = r.out + r.err;
  }
  ~SlurmCluster() { run_program({kClusterScript.string(), "down", dir_.string()}, {}, 10s); }
  bool ok() const { return ok_; }
  const std::string& error() const { return error_; }

  // argv run on node I (from 1), as from a login shell there, with the built trainyard on PATH.
  trainyard::elastic::SubprocessOptions on(int node, std::vector<std::string> argv) const {
    argv.insert(argv.begin(), {kClusterScript.string(), "on", dir_.string(), std::to_string(node)});
    const std::string path =
        fs::path(TRAINYARD_CLI_PATH).parent_path().string() + ":" + std::getenv("PATH");
    return {.argv = std::move(argv), .env = {{"PATH", path}}};
  }

  // `scontrol show job JOB` once the job has ended (its JobState no longer pending, running or
  // completing), or its last answer when `timeout` passes first.
  std::string wait_for_job_end(const std::string& job, std::chrono::seconds timeout) const {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::string state;
    while (std::chrono::steady_clock::now() < deadline) {
      auto show = on(1, {"scontrol", "show", "job", job});
      state = run_program(show.argv, show.env).out;
      if (!contains(state, "JobState=PENDING") && !contains(state, "JobState=RUNNING") &&
          !contains(state, "JobState=COMPLETING") && contains(state, "JobState="))
        return state;
      std::this_thread::sleep_for(500ms);
    }
    return state;
  }

 private:
  fs::path dir_;
  bool ok_ = false;
  std::string error_;
};

// Two namespace hosts with a Slurm cluster on them, for each test.
class Slurm : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!hosts_.ok())
      TY_MISSING_PREREQUISITE("cannot create network namespaces here: " << hosts_.error());
    if (!run_program({"sh", "-c", "command -v slurmctld slurmd munged"}).status.success())
      TY_MISSING_PREREQUISITE("slurmctld, slurmd or munged is missing: scripts/setup.sh");
    cluster_ = std::make_unique<SlurmCluster>(hosts_, 2, dir_.path() / "cluster");
    ASSERT_TRUE(cluster_->ok()) << cluster_->error();
  }
  // Destroyed in reverse: the daemons stop, then the namespaces go, then the folder.
  TempDir dir_;
  Hosts hosts_{2};
  std::unique_ptr<SlurmCluster> cluster_;
};

// The recipe's flags for a short job, after the script's own (a recipe takes a flag's last value).
std::vector<std::string> short_job(const fs::path& storage, const std::string& name) {
  return {"--epochs",       "1",      "--batch-size", "32",           "--threads", "1", "--storage",
          storage.string(), "--name", name,           "--no-progress"};
}

TEST_F(Slurm, SbatchScriptTrainsOnTwoNodesAndFinishesOnOneWhenTheOtherIsLost) {
  const fs::path out = dir_.path() / "job.out";
  std::vector<std::string> argv = {"sbatch", "--parsable", "--output", out.string(),
                                   (kRepository / "deploy/slurm/fashion-mnist.sbatch").string()};
  for (const auto& a : short_job(dir_.path(), "slurm")) argv.push_back(a);
  // 1024 images, 2 ranks x 32: 16 steps, the first checkpoint at step 4; the rest of the epoch
  // (24 steps alone) runs on the surviving node.
  argv.insert(argv.end(), {"--limit", "1024", "--checkpoint-every", "4"});
  auto options = cluster_->on(1, argv);
  // The survivor waits a second, not torchrun's 30, for the lost node to come back.
  options.env.emplace_back("PET_RDZV_CONF", "last_call_timeout=1");
  auto submitted = trainyard::mptest::run_program(options.argv, options.env);
  ASSERT_TRUE(submitted.status.success()) << submitted.out << submitted.err;
  // --parsable prints the job id alone ("7", or "7;cluster").
  const std::string job = submitted.out.substr(0, submitted.out.find_first_not_of("0123456789"));
  ASSERT_FALSE(job.empty()) << submitted.out;
  ASSERT_TRUE(trainyard::mptest::wait_for_files(
      {dir_.path() / "slurm" / "checkpoint_000000" / "MANIFEST.json"}, 60s))
      << read_file(out);
  // node02 is gone: its slurmd, the job step and trainyard's agent and rank, all at once.
  hosts_.kill_all(1);
  const std::string state = cluster_->wait_for_job_end(job, 60s);
  const std::string log = read_file(out);
  // Slurm too sees the job through: the node's loss does not end it (--no-kill).
  ASSERT_TRUE(contains(state, "JobState=COMPLETED") && contains(state, "ExitCode=0:0"))
      << state << log;
  // Both nodes met at the rendezvous that the first node of SLURM_JOB_NODELIST serves, the job
  // id the run id, and trained together; after the loss, the survivor met there alone and resumed
  // from the checkpoint.
  const std::string store = "rendezvous c10d store at node01:29400";
  EXPECT_TRUE(contains(log, store + " (served here) run id '" + job + "', this node node01:"))
      << log;
  EXPECT_TRUE(contains(log, store + " run id '" + job + "', this node node02:")) << log;
  EXPECT_TRUE(contains(log, "group_world_size=2")) << log;
  EXPECT_TRUE(contains(log, "group_world_size=1")) << log;
  EXPECT_TRUE(contains(log, "Resuming from checkpoint_")) << log;
  const auto result = trainyard::mptest::result_of(dir_.path(), "slurm");
  EXPECT_EQ(result["world_size"].get<int>(), 1) << result.dump();
  // Ten balanced classes: well above chance (0.1) unless training state was lost on the way.
  EXPECT_GT(result["accuracy"].get<double>(), 0.3) << result.dump();
}

TEST_F(Slurm, PlainSrunTrainsOnTwoNodesFromSlurmsVariablesAlone) {
  std::vector<std::string> argv = {"srun",          "--nodes", "2",  "--ntasks-per-node", "1",
                                   "trainyard",     "run",     "--", "trainyard",         "train",
                                   "fashion-mnist", "--limit", "512"};
  for (const auto& a : short_job(dir_.path(), "srun")) argv.push_back(a);
  trainyard::elastic::Subprocess srun(cluster_->on(1, argv));
  auto done = trainyard::mptest::collect(srun, 50s);
  ASSERT_TRUE(done.status.success() && !done.timed_out) << done.out << done.err;
  const std::string log = done.out + done.err;
  EXPECT_TRUE(contains(log, "on 2 node(s), this is node 1; world size 2, master node01:29500"))
      << log;
  // Each agent says where its settings came from.
  EXPECT_TRUE(contains(log,
                       "Launch settings: engine: slurm (from SLURM_JOB_ID); nnodes: 2 (from "
                       "SLURM_NNODES); node_rank: 1 (from SLURM_NODEID)"))
      << log;
  EXPECT_EQ(trainyard::mptest::result_of(dir_.path(), "srun")["world_size"].get<int>(), 2);
}

}  // namespace slurm
