// A temporary folder standing in for /proc and /sys/fs/cgroup, for the tests of CPU counting,
// cgroup limits and node resources.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "temp_dir.h"

namespace trainyard::test {

class FakeProcTree {
 public:
  std::string proc() const { return dir_.str() + "/proc"; }
  std::string cgroup() const { return dir_.str() + "/cgroup"; }
  // Writes `text` to <root>/<relative>, creating the folders on the way.
  void write(const std::string& relative, const std::string& text) const {
    write_text(dir_.path() / relative, text);
  }
  // proc/meminfo with MemTotal and MemAvailable in kB.
  void meminfo(std::int64_t total_kb, std::int64_t available_kb) const {
    write("proc/meminfo", "MemTotal:       " + std::to_string(total_kb) +
                              " kB\nMemFree:         1000 kB\nMemAvailable:   " +
                              std::to_string(available_kb) + " kB\nBuffers:  10 kB\n");
  }

 private:
  TempDir dir_{"trainyard-resources"};
};

}  // namespace trainyard::test
