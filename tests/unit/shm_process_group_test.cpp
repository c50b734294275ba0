// ShmProcessGroup: all-reduce and broadcast through shared memory agree with the arithmetic, over
// many chunks and odd world sizes, staged or in place (allocate_shared buffers); ranks that issue
// different in-place collectives get an error; other collectives reach the inner group; a missing
// peer is a TimeoutError, not a hang. Ranks are threads over one HashStore.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <functional>
#include <thread>

#include "thread_ranks.h"
#include "trainyard/comm/process_group.h"
#include "trainyard/comm/shm_process_group.h"
#include "trainyard/error.h"

namespace {
using trainyard::ShmOptions;
using trainyard::ShmProcessGroup;

constexpr std::size_t kChunk = 4096;  // tiny chunks: every tensor below spans many of them

void run_shm_ranks(int world,
                   const std::function<void(int, c10::intrusive_ptr<c10d::ProcessGroup>)>& fn,
                   std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  trainyard::testing::run_thread_ranks(
      world, fn, {.timeout = timeout, .shm = true, .shm_chunk_bytes = kChunk});
}

class ShmAllreduce : public ::testing::TestWithParam<int> {};

TEST_P(ShmAllreduce, SumsMinMaxAndBroadcastsOverManyChunks) {
  const int world = GetParam();
  std::vector<std::string> backends(world);
  run_shm_ranks(world, [&](int rank, c10::intrusive_ptr<c10d::ProcessGroup> pg) {
    backends[rank] = pg->getBackendName();
    // 10,007 floats: 40 KB over 4 KB chunks, and a length no world size divides.
    auto x = torch::arange(10007, torch::kFloat32) * (rank + 1);
    std::vector<torch::Tensor> v{x};
    pg->allreduce(v)->wait();
    const float factor = world * (world + 1) / 2.0f;
    EXPECT_TRUE(torch::equal(x, torch::arange(10007, torch::kFloat32) * factor)) << "rank " << rank;

    auto avg = torch::full({9001}, static_cast<float>(rank + 1));
    std::vector<torch::Tensor> av{avg};
    c10d::AllreduceOptions avg_op;
    avg_op.reduceOp = c10d::ReduceOp::AVG;
    pg->allreduce(av, avg_op)->wait();
    EXPECT_FLOAT_EQ(avg.min().item<float>(), (world + 1) / 2.0f);
    EXPECT_FLOAT_EQ(avg.max().item<float>(), (world + 1) / 2.0f);

    auto y = torch::full({3001}, static_cast<int64_t>(rank * 10), torch::kInt64);
    std::vector<torch::Tensor> w{y};
    c10d::AllreduceOptions max_op;
    max_op.reduceOp = c10d::ReduceOp::MAX;
    pg->allreduce(w, max_op)->wait();
    EXPECT_EQ(y.min().item<int64_t>(), (world - 1) * 10);
    c10d::AllreduceOptions min_op;
    min_op.reduceOp = c10d::ReduceOp::MIN;
    pg->allreduce(w, min_op)->wait();  // all equal now: min is the max
    EXPECT_EQ(y.max().item<int64_t>(), (world - 1) * 10);

    auto b = rank == world - 1 ? torch::randn({5000}, torch::kFloat64)
                               : torch::zeros({5000}, torch::kFloat64);
    std::vector<torch::Tensor> bv{b};
    c10d::BroadcastOptions from_last;
    from_last.rootRank = world - 1;
    pg->broadcast(bv, from_last)->wait();
    auto sum = b.sum().clone();
    std::vector<torch::Tensor> sv{sum};
    c10d::AllreduceOptions max_sum;
    max_sum.reduceOp = c10d::ReduceOp::MAX;
    pg->allreduce(sv, max_sum)->wait();
    EXPECT_EQ(sum.item<double>(), b.sum().item<double>()) << "every rank holds the root's data";
    EXPECT_NE(b.abs().sum().item<double>(), 0.0);

    // Several in flight at once complete in order.
    std::vector<torch::Tensor> many;
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    for (int i = 0; i < 5; ++i) {
      many.push_back(torch::ones({777 * (i + 1)}));
      std::vector<torch::Tensor> one{many.back()};
      works.push_back(pg->allreduce(one));
    }
    for (auto& work : works) work->wait();
    for (auto& t : many) EXPECT_EQ(t.min().item<float>(), static_cast<float>(world));
  });
  for (const auto& b : backends) EXPECT_EQ(b, "trainyard-shm");
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ShmAllreduce, ::testing::Values(1, 2, 3, 4));

TEST(ShmProcessGroup, ForwardsWhatItDoesNotHandleToTheInnerGroup) {
  run_shm_ranks(2, [](int rank, c10::intrusive_ptr<c10d::ProcessGroup> pg) {
    // Non-contiguous tensors, bfloat16 and allgather go to Gloo; the results must still be right.
    auto t = torch::ones({4, 4}).t() * (rank + 1);
    std::vector<torch::Tensor> v{t};
    pg->allreduce(v)->wait();
    EXPECT_EQ(t.min().item<float>(), 3.0f);
    std::vector<std::vector<torch::Tensor>> out{{torch::zeros({2}), torch::zeros({2})}};
    std::vector<torch::Tensor> in{torch::full({2}, static_cast<float>(rank))};
    pg->allgather(out, in)->wait();
    EXPECT_EQ(out[0][1].min().item<float>(), 1.0f);
    pg->barrier()->wait();
  });
}

TEST(ShmProcessGroup, AMissingPeerIsATimeoutNotAHang) {
  std::string message;
  auto start = std::chrono::steady_clock::now();
  run_shm_ranks(
      2,
      [&](int rank, c10::intrusive_ptr<c10d::ProcessGroup> pg) {
        if (rank == 1) return;  // never joins the all-reduce
        auto t = torch::ones({100});
        std::vector<torch::Tensor> v{t};
        try {
          pg->allreduce(v)->wait();
        } catch (const std::exception& e) {
          message = e.what();
        }
      },
      std::chrono::milliseconds(1000));
  auto elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(message.find("rank 1 did not reach a shared-memory collective within 1000 ms"),
            std::string::npos)
      << message;
  EXPECT_LT(elapsed, 10.0);
}

class ShmInPlace : public ::testing::TestWithParam<int> {};

TEST_P(ShmInPlace, AllreducesAndBroadcastsSharedBuffersWhereTheyAre) {
  const int world = GetParam();
  run_shm_ranks(world, [&](int rank, c10::intrusive_ptr<c10d::ProcessGroup> pg) {
    auto* shm = dynamic_cast<ShmProcessGroup*>(pg.get());
    ASSERT_NE(shm, nullptr);
    // 100,003 floats (a length no world size divides) and a second buffer of int64.
    auto grads = shm->allocate_shared(100003, torch::kFloat32);
    auto counts = trainyard::allocate_collective_buffer(pg, 1001, torch::dtype(torch::kInt64));
    EXPECT_EQ(grads.sum().item<float>(), 0.0f) << "zero-filled";
    const auto base = torch::arange(100003, torch::kFloat32);
    for (int round = 0; round < 3; ++round) {  // buffers are reused, as DDP's buckets are
      grads.copy_(base * (rank + 1 + round));
      std::vector<torch::Tensor> v{grads};
      pg->allreduce(v)->wait();
      const float factor = world * (world + 1) / 2.0f + world * round;
      EXPECT_TRUE(torch::equal(grads, base * factor)) << "rank " << rank << " round " << round;
    }
    // A slice of a buffer (a DDP parameter's view), averaged.
    auto slice = grads.narrow(0, 10, 5000);
    slice.fill_(static_cast<float>(rank + 1));
    std::vector<torch::Tensor> sv{slice};
    c10d::AllreduceOptions avg;
    avg.reduceOp = c10d::ReduceOp::AVG;
    pg->allreduce(sv, avg)->wait();
    EXPECT_FLOAT_EQ(slice.min().item<float>(), (world + 1) / 2.0f);
    EXPECT_FLOAT_EQ(slice.max().item<float>(), (world + 1) / 2.0f);
    EXPECT_EQ(grads[9].item<float>(), 9.0f * (world * (world + 1) / 2.0f + world * 2))
        << "outside the slice nothing changed";

    counts.fill_(rank == world - 1 ? 42 : -1);
    std::vector<torch::Tensor> cv{counts};
    c10d::BroadcastOptions from_last;
    from_last.rootRank = world - 1;
    pg->broadcast(cv, from_last)->wait();
    EXPECT_EQ(counts.min().item<int64_t>(), 42);
    EXPECT_EQ(counts.max().item<int64_t>(), 42);
  });
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ShmInPlace, ::testing::Values(1, 2, 3, 4));

TEST(ShmProcessGroup, RanksIssuingDifferentInPlaceCollectivesGetAnError) {
  std::vector<std::string> messages(2);
  run_shm_ranks(2, [&](int rank, c10::intrusive_ptr<c10d::ProcessGroup> pg) {
    auto buffer = dynamic_cast<ShmProcessGroup&>(*pg).allocate_shared(200, torch::kFloat32);
    std::vector<torch::Tensor> v{buffer.narrow(0, rank * 100, 100)};  // different halves
    try {
      pg->allreduce(v)->wait();
    } catch (const std::exception& e) {
      messages[rank] = e.what();
    }
  });
  for (const auto& m : messages)
    EXPECT_NE(m.find("every rank must issue the same collectives"), std::string::npos) << m;
}

TEST(ShmProcessGroup, RanksReducingWithDifferentOpsGetAnErrorNamingBoth) {
  std::vector<std::string> messages(2);
  run_shm_ranks(2, [&](int rank, c10::intrusive_ptr<c10d::ProcessGroup> pg) {
    auto buffer = dynamic_cast<ShmProcessGroup&>(*pg).allocate_shared(100, torch::kFloat32);
    std::vector<torch::Tensor> v{buffer};
    c10d::AllreduceOptions opts;
    opts.reduceOp = rank == 0 ? c10d::ReduceOp::SUM : c10d::ReduceOp::AVG;
    try {
      pg->allreduce(v, opts)->wait();
    } catch (const std::exception& e) {
      messages[rank] = e.what();
    }
  });
  for (const auto& m : messages) {
    EXPECT_NE(m.find("with SUM"), std::string::npos) << m;
    EXPECT_NE(m.find("with AVG"), std::string::npos) << m;
  }
}

TEST(ShmProcessGroup, CollectiveBuffersOfOtherGroupsAreOrdinaryMemory) {
  trainyard::testing::run_thread_ranks(2, [](int rank, c10::intrusive_ptr<c10d::ProcessGroup> pg) {
    auto t = trainyard::allocate_collective_buffer(pg, 64, torch::dtype(torch::kFloat32));
    EXPECT_EQ(t.numel(), 64);
    EXPECT_EQ(t.abs().sum().item<float>(), 0.0f);
    t.fill_(static_cast<float>(rank));
    std::vector<torch::Tensor> v{t};
    pg->allreduce(v)->wait();
    EXPECT_EQ(t.min().item<float>(), 1.0f);
  });
}

}  // namespace
