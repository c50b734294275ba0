// Note [Hang watchdog]: a rank beats inside a step and inside a checkpoint save, so that one slow
// step (a bf16 output layer on a CPU that emulates bf16) or a large save is not taken for a hang:
// each FSDP unit's forward, the start of its backward and each gradient beat, one rank or many;
// so do DDP's gradient hooks, at world size 1 too; a FileStorage write and a file's SHA-256 beat
// in slices. The beats land in the file the launcher reads ($TRAINYARD_HEARTBEAT_FILE, set before
// this process's first beat: one ctest per suite runs this suite in a process of its own).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>

#include "../temp_dir.h"
#include "thread_ranks.h"
#include "tiny_gpt_neox.h"
#include "trainyard/checkpoint/checkpointer.h"
#include "trainyard/ddp/distributed_data_parallel.h"
#include "trainyard/fsdp/fully_sharded_data_parallel.h"
#include "trainyard/heartbeat.h"
#include "trainyard/models/causal_lm.h"
#include "trainyard/models/gpt_neox.h"
#include "trainyard/storage/storage.h"

namespace {

using Clock = std::chrono::steady_clock;
using trainyard::models::GptNeoX;
using trainyard::models::GptNeoXLayerImpl;

class StepBeats : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new trainyard::test::TempDir("ty-step-beats");
    file_ = new trainyard::HeartbeatFile((dir_->path() / "heartbeat").string());
    ::setenv(trainyard::kHeartbeatFileEnv, file_->path().c_str(), 1);
  }
  static void TearDownTestSuite() {
    ::unsetenv(trainyard::kHeartbeatFileEnv);
    delete file_;
    delete dir_;
  }

  // Whether `work` beat: the file's last beat is no earlier than its start. This thread beats
  // first (so heartbeat_while_waiting speaks for it, as for a training loop's thread).
  static bool beats(const std::function<void()>& work) {
    trainyard::heartbeat();
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    const auto start = Clock::now();
    work();
    const auto last = file_->last_beat();
    return last.has_value() && *last >= start;
  }

  static trainyard::test::TempDir* dir_;
  static trainyard::HeartbeatFile* file_;
};
trainyard::test::TempDir* StepBeats::dir_ = nullptr;
trainyard::HeartbeatFile* StepBeats::file_ = nullptr;

TEST_F(StepBeats, FsdpUnitsAndGradientsBeatInsideAStepOnOneRank) {
  trainyard::testing::run_thread_ranks(1, [&](int, auto pg) {
    GptNeoX model(trainyard::testing::tiny_gpt_neox_config());
    trainyard::fsdp::FullyShardedDataParallel fsdp(
        model, trainyard::fsdp::FsdpGroups{.shard = pg, .world_size = 1},
        trainyard::fsdp::FsdpOptions{
            .wrap = trainyard::fsdp::wrap_modules_of_type<GptNeoXLayerImpl>()});
    const auto ids = trainyard::testing::tiny_gpt_neox_batch(0, 2, 8);
    torch::Tensor loss;
    EXPECT_TRUE(beats([&] { loss = trainyard::models::causal_lm_loss(fsdp.forward(ids), ids); }))
        << "the forward's units";
    EXPECT_TRUE(beats([&] { loss.backward(); })) << "the backward's units and gradients";
  });
}

TEST_F(StepBeats, DdpGradientHooksBeatAtWorldSizeOne) {
  trainyard::testing::run_thread_ranks(1, [&](int, auto pg) {
    GptNeoX model(trainyard::testing::tiny_gpt_neox_config());
    trainyard::ddp::DistributedDataParallel ddp(model, pg);
    const auto ids = trainyard::testing::tiny_gpt_neox_batch(0, 2, 8);
    const auto loss = trainyard::models::causal_lm_loss(ddp.forward(ids), ids);
    EXPECT_TRUE(beats([&] { loss.backward(); }));
  });
}

TEST_F(StepBeats, ALargeCheckpointFileBeatsWhileWrittenAndHashed) {
  const std::string bytes((std::size_t{64} << 20) + 1, 'x');  // two slices
  auto storage = trainyard::storage::open_storage(dir_->str());
  EXPECT_TRUE(beats([&] { storage->write("checkpoint_000000/model.safetensors", bytes); }));
  EXPECT_TRUE(beats([&] { trainyard::checkpoint::sha256_hex(bytes); }));
}

}  // namespace
