// `trainyard --version` names the LibTorch it runs with, what it was built against and its
// process-group backends; and the CPU build loads none of LibTorch's CUDA libraries (Note
// [Linking LibTorch without CUDA] in cmake/libtorch.cmake), as the dynamic loader itself reports.
#include <gtest/gtest.h>

#include <regex>
#include <string>

#include "../multiproc/multiproc_util.h"

namespace {
using trainyard::mptest::run_program;
using namespace std::chrono_literals;

TEST(Version, NamesTheLibTorchItRunsWithWhatItWasBuiltAgainstAndItsBackends) {
  const auto r = run_program({TRAINYARD_CLI_PATH, "--version"}, {}, 30s);
  ASSERT_TRUE(r.status.success()) << r.out << r.err;
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(^trainyard \d+\.\d+\.\d+\n)"))) << r.out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      r.out, m, std::regex(R"(LibTorch (2\.\d+\.\d+)\S* \(CPU\), built against (2\.\d+\.\d+)\n)")))
      << r.out;
  EXPECT_EQ(m[1].str(), m[2].str()) << "runs with another LibTorch than it was built against";
  EXPECT_NE(r.out.find("process-group backends: gloo, shm"), std::string::npos) << r.out;
}

TEST(Version, TheCpuBuildLoadsNoneOfLibTorchsCudaLibraries) {
  // LD_DEBUG=files: the loader prints each shared object it opens ("file=libX.so [0];  ...").
  const auto r = run_program({TRAINYARD_CLI_PATH, "--version"}, {{"LD_DEBUG", "files"}}, 30s);
  ASSERT_TRUE(r.status.success()) << r.out << r.err;
  ASSERT_NE(r.err.find("file=libtorch_cpu.so"), std::string::npos) << r.err;
  for (const char* lib : {"libtorch_cuda", "libc10_cuda", "libcudnn", "libcublas", "libnccl",
                          "libtorch.so", "libcusparse", "libnvshmem"})
    EXPECT_EQ(r.err.find(std::string("file=") + lib), std::string::npos)
        << "the CPU build loaded " << lib;
}

}  // namespace
