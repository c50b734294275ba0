// CPU counting in a container: cgroup v1/v2 limits read from fake /proc and cgroup trees, the
// affinity count, and usable_cpu_count (affinity capped by the quota rounded down, >= 1).
#include "trainyard/cpu_count.h"

#include <gtest/gtest.h>

#include <cstdint>

#include "../fake_proc_tree.h"

namespace trainyard {
namespace {

using test::FakeProcTree;
constexpr std::int64_t kGiB = std::int64_t{1} << 30;

// usable_cpu_count over `root`'s trees, as if the affinity mask held `affinity` CPUs.
int usable(const FakeProcTree& root, int affinity) {
  return usable_cpu_count(
      {.proc_root = root.proc(), .cgroup_root = root.cgroup(), .affinity_cpus = affinity});
}

TEST(CgroupLimits, TheTightestOfTheCgroupAndItsAncestors) {
  FakeProcTree root;
  root.write("proc/self/cgroup", "0::/kubepods/pod1/ctr\n");
  root.write("cgroup/cpu.max", "max 100000\n");
  root.write("cgroup/kubepods/cpu.max", "max 100000\n");
  root.write("cgroup/kubepods/memory.max", "max\n");
  root.write("cgroup/kubepods/pod1/cpu.max", "150000 100000\n");
  root.write("cgroup/kubepods/pod1/memory.max", "2147483648\n");
  root.write("cgroup/kubepods/pod1/ctr/cpu.max", "250000 100000\n");
  root.write("cgroup/kubepods/pod1/ctr/memory.max", "max\n");
  const CgroupLimits limits = read_cgroup_limits(root.proc(), root.cgroup());
  ASSERT_TRUE(limits.cpu_quota.has_value());
  EXPECT_DOUBLE_EQ(*limits.cpu_quota, 1.5);
  EXPECT_EQ(limits.memory_max_bytes, 2 * kGiB);
}

TEST(CgroupLimits, CgroupNamespaceUsesTheMountsRoot) {
  FakeProcTree root;
  // Inside a cgroup namespace the process's cgroup is "/" (or a path the mount does not hold).
  root.write("proc/self/cgroup", "0::/\n");
  root.write("cgroup/cpu.max", "50000 100000\n");
  EXPECT_DOUBLE_EQ(read_cgroup_limits(root.proc(), root.cgroup()).cpu_quota.value_or(0), 0.5);

  root.write("proc/self/cgroup", "0::/not/in/this/mount\n");
  EXPECT_DOUBLE_EQ(read_cgroup_limits(root.proc(), root.cgroup()).cpu_quota.value_or(0), 0.5);
}

TEST(CgroupLimits, CgroupV1AndHybridHierarchies) {
  FakeProcTree root;
  // ECS on Amazon Linux 2: v1 controllers, and a hybrid host's v2 tree at <root>/unified.
  root.write("proc/self/cgroup",
             "12:cpu,cpuacct:/ecs/task1/ctr\n8:memory:/ecs/task1/ctr\n"
             "1:name=systemd:/ecs/task1/ctr\n0::/ecs/task1/ctr\n");
  root.write("cgroup/cpu,cpuacct/cpu.cfs_quota_us", "-1\n");
  root.write("cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000\n");
  root.write("cgroup/cpu,cpuacct/ecs/task1/cpu.cfs_quota_us", "200000\n");
  root.write("cgroup/cpu,cpuacct/ecs/task1/cpu.cfs_period_us", "100000\n");
  root.write("cgroup/cpu,cpuacct/ecs/task1/ctr/cpu.cfs_quota_us", "-1\n");
  root.write("cgroup/cpu,cpuacct/ecs/task1/ctr/cpu.cfs_period_us", "100000\n");
  root.write("cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");  // unlimited
  root.write("cgroup/memory/ecs/task1/ctr/memory.limit_in_bytes", "1073741824\n");
  root.write("cgroup/unified/ecs/task1/ctr/memory.max", "max\n");
  CgroupLimits limits = read_cgroup_limits(root.proc(), root.cgroup());
  EXPECT_DOUBLE_EQ(limits.cpu_quota.value_or(0), 2.0);
  EXPECT_EQ(limits.memory_max_bytes, kGiB);

  // A tighter limit in the v2 tree wins.
  root.write("cgroup/unified/ecs/task1/memory.max", "536870912\n");
  limits = read_cgroup_limits(root.proc(), root.cgroup());
  EXPECT_EQ(limits.memory_max_bytes, kGiB / 2);

  // A path the v1 mount does not hold (a cgroup namespace): the mount's root applies.
  root.write("proc/self/cgroup", "4:memory:/process_api/13bb2f\n1:cpu:/\n");
  root.write("cgroup/memory/memory.limit_in_bytes", "2147483648\n");
  root.write("cgroup/cpu/cpu.cfs_quota_us", "50000\n");
  root.write("cgroup/cpu/cpu.cfs_period_us", "100000\n");
  limits = read_cgroup_limits(root.proc(), root.cgroup());
  EXPECT_EQ(limits.memory_max_bytes, 2 * kGiB);
  EXPECT_DOUBLE_EQ(limits.cpu_quota.value_or(0), 0.5);
}

TEST(CgroupLimits, NoLimitsWhereNoneAreSet) {
  FakeProcTree root;
  root.write("proc/self/cgroup", "12:cpu,cpuacct:/docker/abc\n1:name=systemd:/docker/abc\n");
  root.write("cgroup/docker/abc/cpu.max", "100000 100000\n");  // ignored: no v2 line
  const CgroupLimits v1 = read_cgroup_limits(root.proc(), root.cgroup());
  EXPECT_FALSE(v1.cpu_quota.has_value());
  EXPECT_FALSE(v1.memory_max_bytes.has_value());

  root.write("proc/self/cgroup", "0::/free\n");
  root.write("cgroup/free/cpu.max", "max 100000\n");
  root.write("cgroup/free/memory.max", "max\n");
  const CgroupLimits none = read_cgroup_limits(root.proc(), root.cgroup());
  EXPECT_FALSE(none.cpu_quota.has_value());
  EXPECT_FALSE(none.memory_max_bytes.has_value());

  // Without a /proc/self/cgroup file at all.
  FakeProcTree empty;
  EXPECT_FALSE(read_cgroup_limits(empty.proc(), empty.cgroup()).cpu_quota.has_value());
}

TEST(CpuCount, FractionalQuotaRoundsDown) {
  FakeProcTree root;
  root.write("proc/self/cgroup", "0::/pod\n");
  root.write("cgroup/pod/cpu.max", "150000 100000\n");  // --cpus=1.5
  EXPECT_EQ(usable(root, 4), 1);
  root.write("cgroup/pod/cpu.max", "370000 100000\n");
  EXPECT_EQ(usable(root, 4), 3);
}

TEST(CpuCount, NoQuotaIsTheAffinityCount) {
  FakeProcTree root;
  root.write("proc/self/cgroup", "0::/free\n");
  root.write("cgroup/free/cpu.max", "max 100000\n");
  EXPECT_EQ(usable(root, 4), 4);
  // Without any cgroup tree, and for this process's own mask.
  FakeProcTree empty;
  EXPECT_EQ(usable(empty, 6), 6);
  EXPECT_EQ(usable_cpu_count({.proc_root = empty.proc(), .cgroup_root = empty.cgroup()}),
            affinity_cpu_count());
}

TEST(CpuCount, QuotaLargerThanTheAffinityMaskLeavesTheMask) {
  FakeProcTree root;
  root.write("proc/self/cgroup", "0::/pod\n");
  root.write("cgroup/pod/cpu.max", "800000 100000\n");  // 8 CPUs of quota, 2 in the cpuset
  EXPECT_EQ(usable(root, 2), 2);
}

TEST(CpuCount, AlwaysAtLeastOne) {
  FakeProcTree root;
  root.write("proc/self/cgroup", "0::/\n");
  root.write("cgroup/cpu.max", "50000 100000\n");  // half a CPU still offers one
  EXPECT_EQ(usable(root, 4), 1);
  EXPECT_GE(affinity_cpu_count(), 1);
  EXPECT_GE(usable_cpu_count(), 1);
  EXPECT_LE(usable_cpu_count(), affinity_cpu_count());
}

}  // namespace
}  // namespace trainyard
