// NodeResources: detection (usable CPUs and memory under cgroup limits on fake trees, NVML
// absent), overrides, the JSON form, and UsageSampler on fake and real /proc. Reading the cgroup
// limits themselves is tested in cpu_count_test.cpp.
#include "trainyard/cluster/node_resources.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>
#include <thread>

#include "../fake_proc_tree.h"
#include "trainyard/error.h"

namespace trainyard::cluster {
namespace {

constexpr std::int64_t kGiB = std::int64_t{1} << 30;

using FakeRoot = test::FakeProcTree;

DetectOptions fake_options(const FakeRoot& root) {
  return DetectOptions{.proc_root = root.proc(),
                       .cgroup_root = root.cgroup(),
                       .nvml_library = "/nonexistent/libnvidia-ml.so.1"};
}

TEST(NodeResources, DetectsThisMachine) {
  const NodeResources resources = detect_resources();
  EXPECT_GE(resources.cpu, 1.0);
  EXPECT_LE(resources.cpu, affinity_cpu_count());
  EXPECT_EQ(resources.cpu, usable_cpu_count());
  EXPECT_EQ(resources.cpu, std::floor(resources.cpu));  // whole CPUs when detected
  EXPECT_GT(resources.memory_bytes, 0);
  EXPECT_EQ(resources.gpu, static_cast<double>(resources.gpus.size()));
  EXPECT_FALSE(local_hostname().empty());
}

TEST(NodeResources, OverridesReplaceDetectedValues) {
  const NodeResources resources =
      detect_resources({.num_cpus = 0.5, .num_gpus = 0, .memory_bytes = 3 * kGiB});
  EXPECT_EQ(resources.cpu, 0.5);
  EXPECT_EQ(resources.gpu, 0.0);
  EXPECT_TRUE(resources.gpus.empty());
  EXPECT_EQ(resources.memory_bytes, 3 * kGiB);

  // A declared GPU count need not match the machine's (Ray's --num-gpus).
  EXPECT_EQ(detect_resources({.num_gpus = 2}).gpu, 2.0);
}

TEST(NodeResources, BadOverridesNameTheField) {
  try {
    detect_resources({.num_cpus = -1});
    FAIL() << "a negative num_cpus was accepted";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("DetectOptions::num_cpus must be a finite number >= 0, "
                                         "not -1; HINT: pass --num-cpus"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(detect_resources({.num_gpus = std::nan("")}), InvalidArgumentError);
  EXPECT_THROW(detect_resources({.memory_bytes = -5}), InvalidArgumentError);
}

TEST(NodeResources, NoNvmlMeansNoGpusAndNoError) {
  EXPECT_TRUE(detect_nvml_gpus("/nonexistent/libnvidia-ml.so.1").empty());
  // A library that loads but is not NVML.
  EXPECT_TRUE(detect_nvml_gpus("libm.so.6").empty());
  FakeRoot root;
  root.meminfo(16 * 1024 * 1024, 8 * 1024 * 1024);
  const NodeResources resources = detect_resources(fake_options(root));
  EXPECT_EQ(resources.gpu, 0.0);
  EXPECT_TRUE(resources.gpus.empty());
}

TEST(NodeResources, VisibleDevicesSelectGpusAsCudaDoes) {
  const std::vector<GpuInfo> gpus = {{.index = 0, .name = "A", .memory_bytes = 1},
                                     {.index = 1, .name = "B", .memory_bytes = 2},
                                     {.index = 2, .name = "C", .memory_bytes = 3}};
  const auto indices = [](const std::vector<GpuInfo>& selected) {
    std::vector<int> out;
    for (const auto& gpu : selected) out.push_back(gpu.index);
    return out;
  };
  EXPECT_EQ(indices(select_visible_gpus(gpus, "2,0")), (std::vector<int>{2, 0}));
  EXPECT_EQ(indices(select_visible_gpus(gpus, " 1 ")), (std::vector<int>{1}));
  EXPECT_EQ(indices(select_visible_gpus(gpus, "")), (std::vector<int>{}));
  EXPECT_EQ(indices(select_visible_gpus(gpus, "0,7,1")), (std::vector<int>{0}));  // stops at 7
  EXPECT_EQ(indices(select_visible_gpus(gpus, "-1")), (std::vector<int>{}));
  EXPECT_EQ(indices(select_visible_gpus(gpus, "1,,2")), (std::vector<int>{1}));
  EXPECT_EQ(indices(select_visible_gpus(gpus, "GPU-8f2c1a")), (std::vector<int>{0, 1, 2}));
  // Without NVML there is nothing to select from, whatever the value.
  EXPECT_TRUE(
      detect_resources({.visible_devices = "0", .nvml_library = "/nonexistent/libnvidia-ml.so.1"})
          .gpus.empty());
}

TEST(NodeResources, CpuAndMemoryUnderCgroupLimits) {
  FakeRoot root;
  root.write("proc/self/cgroup", "0::/kubepods/pod1/ctr\n");
  root.write("cgroup/kubepods/pod1/cpu.max", "150000 100000\n");
  root.write("cgroup/kubepods/pod1/memory.max", "2147483648\n");
  root.write("cgroup/kubepods/pod1/ctr/cpu.max", "250000 100000\n");
  root.write("cgroup/kubepods/pod1/ctr/memory.max", "max\n");
  // detect_resources rounds the quota down and caps MemTotal (16 GiB here).
  root.meminfo(16 * 1024 * 1024, 8 * 1024 * 1024);
  NodeResources resources = detect_resources(fake_options(root));
  EXPECT_EQ(resources.cpu, 1.0);
  EXPECT_EQ(resources.memory_bytes, 2 * kGiB);

  // Inside a cgroup namespace the mount's root holds the limits; half a CPU still offers one.
  root.write("proc/self/cgroup", "0::/\n");
  root.write("cgroup/cpu.max", "50000 100000\n");
  root.meminfo(4 * 1024 * 1024, 1024 * 1024);
  resources = detect_resources(fake_options(root));
  EXPECT_EQ(resources.cpu, 1.0);
  EXPECT_EQ(resources.memory_bytes, 4 * kGiB);
}

TEST(NodeResources, WholeCpuQuotaCapsTheAffinityCount) {
  FakeRoot root;
  root.write("proc/self/cgroup", "0::/job\n");
  root.write("cgroup/job/cpu.max", "370000 100000\n");
  root.meminfo(1024, 512);
  EXPECT_EQ(detect_resources(fake_options(root)).cpu, std::min(affinity_cpu_count(), 3));
}

TEST(NodeResources, NoLimitsLeaveTheAffinityCountAndMemTotal) {
  FakeRoot root;
  root.write("proc/self/cgroup", "0::/free\n");
  root.write("cgroup/free/cpu.max", "max 100000\n");
  root.write("cgroup/free/memory.max", "max\n");
  root.meminfo(8 * 1024 * 1024, 1024);
  const NodeResources resources = detect_resources(fake_options(root));
  EXPECT_EQ(resources.cpu, affinity_cpu_count());
  EXPECT_EQ(resources.memory_bytes, 8 * kGiB);
}

TEST(NodeResources, JsonForm) {
  const NodeResources resources{.cpu = 8,
                                .gpu = 2,
                                .memory_bytes = 64 * kGiB,
                                .gpus = {{.index = 0, .name = "A", .memory_bytes = 40 * kGiB},
                                         {.index = 1, .name = "B", .memory_bytes = 80 * kGiB}}};
  const nlohmann::json j = resources;
  EXPECT_EQ(j, nlohmann::json::parse(R"({"cpu": 8.0, "gpu": 2.0, "memory_bytes": 68719476736,
      "gpus": [{"index": 0, "name": "A", "memory_bytes": 42949672960},
               {"index": 1, "name": "B", "memory_bytes": 85899345920}]})"));
  EXPECT_EQ(j.get<NodeResources>(), resources);

  const auto no_gpus =
      nlohmann::json::parse(R"({"cpu": 1.5, "gpu": 0, "memory_bytes": 1024})").get<NodeResources>();
  EXPECT_EQ(no_gpus, (NodeResources{.cpu = 1.5, .memory_bytes = 1024}));

  try {
    nlohmann::json::parse(R"({"gpu": 0, "memory_bytes": 1})").get<NodeResources>();
    FAIL() << "resources without cpu were accepted";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("has no 'cpu' field"), std::string::npos) << e.what();
  }
}

TEST(UsageSampler, CpuFromProcStatDeltasAndMemoryFromMeminfo) {
  FakeRoot root;
  // user nice system idle iowait irq softirq steal guest guest_nice; 4 CPUs.
  const std::string cpus =
      "cpu0 1 0 0 1 0 0 0 0 0 0\ncpu1 1 0 0 1 0 0 0 0 0 0\n"
      "cpu2 1 0 0 1 0 0 0 0 0 0\ncpu3 1 0 0 1 0 0 0 0 0 0\n";
  root.write("proc/stat", "cpu  1000 0 500 8000 500 0 0 0 100 0\n" + cpus + "intr 1 2 3\n");
  root.meminfo(16 * 1024 * 1024, 12 * 1024 * 1024);
  UsageSampler sampler({.proc_root = root.proc()});

  // +400 ticks: 100 user + 50 nice + 50 system busy, 150 idle + 50 iowait idle.
  root.write("proc/stat", "cpu  1100 50 550 8150 550 0 0 0 100 0\n" + cpus);
  UsageSample sample = sampler.sample();
  EXPECT_DOUBLE_EQ(sample.cpu_fraction, 0.5);
  EXPECT_DOUBLE_EQ(sample.cpu_used, 2.0);
  EXPECT_EQ(sample.memory_total_bytes, 16 * kGiB);
  EXPECT_EQ(sample.memory_used_bytes, 4 * kGiB);

  // No tick since: the last reading stands rather than a 0/0.
  sample = sampler.sample();
  EXPECT_DOUBLE_EQ(sample.cpu_fraction, 0.5);

  // +100 ticks, all idle.
  root.write("proc/stat", "cpu  1100 50 550 8250 550 0 0 0 100 0\n" + cpus);
  EXPECT_DOUBLE_EQ(sampler.sample().cpu_fraction, 0.0);
}

TEST(UsageSampler, UnreadableProcIsAnError) {
  FakeRoot root;
  try {
    UsageSampler sampler({.proc_root = root.proc()});
    FAIL() << "a missing stat file was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Could not read " + root.proc() + "/stat"),
              std::string::npos)
        << e.what();
  }
}

TEST(UsageSampler, ABusyThreadShowsAsCpuUse) {
  UsageSampler sampler;
  std::atomic<bool> stop{false};
  std::thread busy([&] {
    volatile std::uint64_t spin = 0;
    while (!stop.load(std::memory_order_relaxed)) spin = spin + 1;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const UsageSample sample = sampler.sample();
  stop = true;
  busy.join();
  // The spinning thread keeps at least one core busy (or, on a crowded machine, others do).
  EXPECT_GT(sample.cpu_used, 0.5);
  EXPECT_GT(sample.cpu_fraction, 0.0);
  EXPECT_LE(sample.cpu_fraction, 1.0);
  EXPECT_GT(sample.memory_used_bytes, 0);
  EXPECT_GT(sample.memory_total_bytes, sample.memory_used_bytes);
}

}  // namespace
}  // namespace trainyard::cluster
