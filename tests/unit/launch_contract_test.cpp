// The engines' launch contracts (elastic/launch_contract.h): each engine's variables exactly as it
// sets them give the node count, this node's rank, node 0's address and the run id, each named by
// its variable; Slurm's compressed host lists expand as Slurm expands them; and a contract that
// contradicts itself, or another engine's, is an error naming the variables.
#include "trainyard/elastic/launch_contract.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "trainyard/error.h"

namespace trainyard::elastic {
namespace {

EnvLookup env_of(std::map<std::string, std::string> vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

std::string error_of(const std::map<std::string, std::string>& vars) {
  try {
    detect_launch_contract(env_of(vars));
  } catch (const InvalidArgumentError& e) {
    return e.what();
  }
  return "";
}

TEST(SlurmHostlist, ExpandsRangesListsPaddingAndSeveralGroups) {
  using V = std::vector<std::string>;
  EXPECT_EQ(expand_slurm_hostlist("node[01-03,7],gpu5"),
            (V{"node01", "node02", "node03", "node7", "gpu5"}));
  EXPECT_EQ(expand_slurm_hostlist("n[098-100]"), (V{"n098", "n099", "n100"}));
  EXPECT_EQ(expand_slurm_hostlist("r[1-2]n[1-2]"), (V{"r1n1", "r1n2", "r2n1", "r2n2"}));
  EXPECT_EQ(expand_slurm_hostlist("solo"), (V{"solo"}));
  EXPECT_EQ(expand_slurm_hostlist("a-1,b-[2-3]"), (V{"a-1", "b-2", "b-3"}));
  for (const char* bad : {"node[01-03", "node]1", "node[]", "node[3-1]", "node[a-b]", "a,,b"}) {
    try {
      expand_slurm_hostlist(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const InvalidArgumentError& e) {
      EXPECT_NE(std::string(e.what()).find("SLURM_JOB_NODELIST"), std::string::npos) << e.what();
    }
  }
}

// Each bracket group is small but their product is not: expansion stops past twice the job's
// node count (or at 2^20 hosts), where it used to reach 2.2 GB and std::bad_alloc; one range of
// 2^20 is valid.
TEST(SlurmHostlist, StopsAtTheNodeCountAndTakesOneLargeRange) {
  const auto error = [](auto&& fn) {
    try {
      fn();
    } catch (const InvalidArgumentError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const auto product = error([] { expand_slurm_hostlist("a[1-1000]b[1-1000]c[1-1000]"); });
  EXPECT_NE(product.find("SLURM_JOB_NODELIST names more than 1048576 hosts"), std::string::npos)
      << product;
  EXPECT_EQ(expand_slurm_hostlist("n[0-1048575]").size(), 1048576u);
  const auto capped = error([] {
    detect_launch_contract(env_of({{"SLURM_JOB_ID", "1"},
                                   {"SLURM_NNODES", "2"},
                                   {"SLURM_NODEID", "0"},
                                   {"SLURM_PROCID", "0"},
                                   {"SLURM_JOB_NODELIST", "a[1-1000]b[1-1000]c[1-1000]"}}));
  });
  EXPECT_NE(capped.find("names more than 5 hosts"), std::string::npos) << capped;
}

TEST(LaunchContract, NoEngineGivesNothing) {
  const auto c = detect_launch_contract(env_of({{"HOME", "/root"}}));
  EXPECT_EQ(c.engine, "");
  EXPECT_FALSE(c.nnodes || c.node_rank || c.master_addr || c.master_port || c.run_id);
}

TEST(LaunchContract, EachEngineAsItSetsItsVariables) {
  auto slurm = detect_launch_contract(env_of({{"SLURM_JOB_ID", "4242"},
                                              {"SLURM_NNODES", "3"},
                                              {"SLURM_NODEID", "2"},
                                              {"SLURM_PROCID", "2"},
                                              {"SLURM_JOB_NODELIST", "node[07-08],gpu1"}}));
  EXPECT_EQ(slurm.engine, "slurm");
  EXPECT_EQ(slurm.nnodes->value, "3");
  EXPECT_EQ(slurm.nnodes->source, "SLURM_NNODES");
  EXPECT_EQ(slurm.node_rank->value, 2);
  EXPECT_EQ(slurm.master_addr->value, "node07");
  EXPECT_EQ(slurm.master_addr->source, "the first host of SLURM_JOB_NODELIST");
  EXPECT_FALSE(slurm.master_port) << "Slurm gives none: the default";
  EXPECT_EQ(slurm.run_id->value, "4242");

  // Kubeflow Trainer v2: PET_* only, no WORLD_SIZE or RANK, nproc "auto" on GPU pods.
  auto kubeflow = detect_launch_contract(env_of({{"KUBERNETES_SERVICE_HOST", "10.96.0.1"},
                                                 {"PET_NNODES", "2"},
                                                 {"PET_NPROC_PER_NODE", "auto"},
                                                 {"PET_NODE_RANK", "1"},
                                                 {"PET_MASTER_ADDR", "job-node-0-0.job"},
                                                 {"PET_MASTER_PORT", "29500"}}));
  EXPECT_EQ(kubeflow.engine, "kubeflow");
  EXPECT_EQ(kubeflow.nproc_per_node->value, "auto");
  EXPECT_EQ(kubeflow.master_addr->value, "job-node-0-0.job");
  EXPECT_EQ(kubeflow.master_port->value, 29500);
  EXPECT_EQ(kubeflow.node_rank->source, "PET_NODE_RANK");
  // The same variables outside a pod: torchrun's own.
  EXPECT_EQ(detect_launch_contract(env_of({{"PET_NNODES", "1:4"}})).engine, "torchrun");
  EXPECT_EQ(detect_launch_contract(env_of({{"PET_NNODES", "1:4"}})).nnodes->value, "1:4");

  auto sky = detect_launch_contract(env_of({{"SKYPILOT_NODE_IPS", "10.0.0.5\n10.0.0.6\n"},
                                            {"SKYPILOT_NODE_RANK", "0"},
                                            {"SKYPILOT_NUM_NODES", "2"},
                                            {"SKYPILOT_NUM_GPUS_PER_NODE", "8"},
                                            {"SKYPILOT_TASK_ID", "sky-2026-x"}}));
  EXPECT_EQ(sky.engine, "skypilot");
  EXPECT_EQ(sky.master_addr->value, "10.0.0.5");
  EXPECT_EQ(sky.nproc_per_node->value, "8");
  EXPECT_FALSE(detect_launch_contract(env_of({{"SKYPILOT_NODE_IPS", "10.0.0.5"},
                                              {"SKYPILOT_NODE_RANK", "0"},
                                              {"SKYPILOT_NUM_NODES", "1"},
                                              {"SKYPILOT_NUM_GPUS_PER_NODE", "0"}}))
                   .nproc_per_node)
      << "0 GPUs (a CPU node) says nothing about ranks per node";

  auto dstack = detect_launch_contract(env_of({{"DSTACK_MASTER_NODE_IP", "10.1.0.1"},
                                               {"DSTACK_NODES_IPS", "10.1.0.1\n10.1.0.2"},
                                               {"DSTACK_NODE_RANK", "1"},
                                               {"DSTACK_NODES_NUM", "2"},
                                               {"DSTACK_GPUS_PER_NODE", "0"},
                                               {"DSTACK_RUN_NAME", "ft"}}));
  EXPECT_EQ(dstack.engine, "dstack");
  EXPECT_EQ(dstack.master_addr->source, "DSTACK_MASTER_NODE_IP");
  EXPECT_EQ(dstack.run_id->value, "ft");

  // Volcano's pytorch plugin: WORLD_SIZE and RANK count pods (nodes).
  auto volcano = detect_launch_contract(env_of({{"VC_TASK_INDEX", "0"},
                                                {"MASTER_ADDR", "job-master-0.job"},
                                                {"MASTER_PORT", "23456"},
                                                {"WORLD_SIZE", "3"},
                                                {"RANK", "2"}}));
  EXPECT_EQ(volcano.engine, "volcano");
  EXPECT_EQ(volcano.nnodes->value, "3");
  EXPECT_EQ(volcano.node_rank->value, 2);
  EXPECT_EQ(volcano.master_port->value, 23456);
  // A rank's own RANK and WORLD_SIZE (a launcher inside a rank) are no engine's.
  EXPECT_EQ(detect_launch_contract(env_of({{"RANK", "1"}, {"WORLD_SIZE", "2"}})).engine, "");
}

TEST(LaunchContract, InconsistentContractsAreErrorsNamingTheVariables) {
  EXPECT_NE(error_of({{"SLURM_JOB_ID", "1"},
                      {"SLURM_NNODES", "2"},
                      {"SLURM_NODEID", "2"},
                      {"SLURM_JOB_NODELIST", "n[1-2]"}})
                .find("SLURM_NODEID=2 is not below SLURM_NNODES=2"),
            std::string::npos);
  EXPECT_NE(error_of({{"SLURM_JOB_ID", "1"},
                      {"SLURM_NNODES", "2"},
                      {"SLURM_NODEID", "0"},
                      {"SLURM_JOB_NODELIST", "n[1-3]"}})
                .find("SLURM_JOB_NODELIST names 3 host(s) but SLURM_NNODES is 2"),
            std::string::npos);
  EXPECT_NE(error_of({{"SLURM_JOB_ID", "1"},
                      {"SLURM_NNODES", "2"},
                      {"SLURM_NODEID", "0"},
                      {"SLURM_JOB_NODELIST", "n[1-2]"},
                      {"PET_NNODES", "3"}})
                .find("SLURM_NNODES=2 and PET_NNODES=3 disagree on the number of nodes"),
            std::string::npos);
  EXPECT_NE(error_of({{"SLURM_JOB_ID", "1"}}).find("SLURM_JOB_NODELIST is not"), std::string::npos);
  EXPECT_NE(error_of({{"PET_NODE_RANK", "x"}}).find("PET_NODE_RANK='x' must be a whole number"),
            std::string::npos);
  EXPECT_NE(error_of({{"DSTACK_MASTER_NODE_IP", "10.1.0.9"},
                      {"DSTACK_NODES_IPS", "10.1.0.1\n10.1.0.2"},
                      {"DSTACK_NODE_RANK", "0"},
                      {"DSTACK_NODES_NUM", "2"}})
                .find("DSTACK_MASTER_NODE_IP=10.1.0.9 is not the first of DSTACK_NODES_IPS"),
            std::string::npos);
  // Agreeing engines are fine.
  EXPECT_EQ(error_of({{"SLURM_JOB_ID", "1"},
                      {"SLURM_NNODES", "2"},
                      {"SLURM_NODEID", "1"},
                      {"SLURM_JOB_NODELIST", "n[1-2]"},
                      {"PET_NNODES", "2"},
                      {"PET_NODE_RANK", "1"}}),
            "");
}

}  // namespace
}  // namespace trainyard::elastic
