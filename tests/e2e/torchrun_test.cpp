// torchrun's contract, checked by torchrun itself: PyTorch's own launcher from the venv
// (scripts/setup.sh) starts two ranks of a program built on trainyard's public API
// (examples/train_custom_model), which join through the variables torchrun sets (its agent's
// store included: TORCHELASTIC_USE_AGENT_STORE) and train data-parallel to the end.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "../multiproc/multiproc_util.h"

namespace {
using trainyard::mptest::run_program;
using trainyard::mptest::TempDir;
using namespace std::chrono_literals;

TEST(Torchrun, TrainsATrainyardProgramOnTwoRanks) {
  const std::string torchrun = std::filesystem::path(TRAINYARD_PYTHON).parent_path() / "torchrun";
  if (!std::filesystem::exists(torchrun))
    TY_MISSING_PREREQUISITE(torchrun << " is missing (scripts/setup.sh installs torch)");
  TempDir dir;
  // The example saves custom_model.pt in its working folder: the test's own.
  const std::string line = "cd '" + dir.str() + "' && exec '" + torchrun +
                           "' --standalone --no-python --nproc-per-node 2 '" TRAINYARD_EXAMPLE_PATH
                           "' 1 1024";
  const auto r = run_program({"/bin/sh", "-c", line}, {}, 60s);
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  ASSERT_TRUE(r.status.success()) << r.out << r.err;
  for (const char* rank : {"rank 0 epoch 0: mean loss", "rank 1 epoch 0: mean loss"})
    EXPECT_NE(r.out.find(rank), std::string::npos) << r.out << r.err;
  EXPECT_TRUE(std::filesystem::exists(dir.path() / "custom_model.pt")) << r.out << r.err;
}

}  // namespace
