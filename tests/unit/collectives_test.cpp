// Flat all_gather / reduce_scatter (collectives.h) agree with the arithmetic over a
// ShmProcessGroup (in shared memory, staged or in place) and over a plain Gloo group (a ring of
// send/recv), at world sizes 1 to 4, for slot sizes no world size or chunk divides, fp32 and bf16;
// ranks that issue different flat collectives get an error. Ranks are threads over one HashStore.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <string>
#include <tuple>

#include "thread_ranks.h"
#include "trainyard/comm/collectives.h"
#include "trainyard/comm/process_group.h"
#include "trainyard/comm/shm_process_group.h"
#include "trainyard/error.h"

namespace {
namespace comm = trainyard::comm;
using Group = c10::intrusive_ptr<c10d::ProcessGroup>;

enum class Backend { kShm, kGloo };

std::string name_of(Backend b) {
  return b == Backend::kShm ? "Shm" : "Gloo";
}

void run_ranks(Backend backend,
               int world,
               const std::function<void(int, Group)>& fn,
               std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  // 4 KB chunks: the staged shared-memory path spans many of them.
  trainyard::testing::run_thread_ranks(
      world, fn, {.timeout = timeout, .shm = backend == Backend::kShm, .shm_chunk_bytes = 4096});
}

// Rank r's deterministic values for element i: distinct per rank and element, exact in fp32.
torch::Tensor values_of(int rank, std::int64_t numel, torch::ScalarType dtype = torch::kFloat32) {
  return (torch::arange(numel, torch::kFloat32).remainder(1000) + 1000 * rank).to(dtype);
}

// Smooth non-integer values of every sign, for the bf16 tests.
torch::Tensor wavy_of(int rank, std::int64_t numel) {
  return torch::sin(torch::arange(numel, torch::kFloat32) * 0.37 + rank) * (rank + 1.5);
}

constexpr std::int64_t kSlotSizes[] = {1, 7, 1000, 10007};  // 10,007 floats: ~10 chunks per slot

class Collectives : public ::testing::TestWithParam<std::tuple<Backend, int>> {};

TEST_P(Collectives, GathersAndReducesOrdinaryTensors) {
  const auto [backend, world] = GetParam();
  run_ranks(backend, world, [&, backend = backend, world = world](int rank, Group pg) {
    EXPECT_EQ(comm::capabilities_of(pg).native_flat_collectives, backend == Backend::kShm);
    for (const auto n : kSlotSizes) {
      auto gathered = torch::full({world * n}, -1.0f);
      trainyard::wait_work(comm::all_gather_flat(pg, gathered, values_of(rank, n)));
      for (int p = 0; p < world; ++p)
        EXPECT_TRUE(torch::equal(gathered.narrow(0, p * n, n), values_of(p, n)))
            << "n " << n << " rank " << rank << " slot " << p;

      // Rank p contributes (p + 1) * arange: slot r sums to W(W+1)/2 * arange's slot r, exactly.
      const auto base = torch::arange(world * n, torch::kFloat32);
      auto sum = torch::empty({n});
      trainyard::wait_work(comm::reduce_scatter_flat(pg, sum, base * (rank + 1)));
      EXPECT_TRUE(torch::equal(sum, base.narrow(0, rank * n, n) * (world * (world + 1) / 2.0f)))
          << "n " << n << " rank " << rank;

      auto avg = torch::empty({n});
      trainyard::wait_work(comm::reduce_scatter_flat(
          pg, avg, torch::full({world * n}, static_cast<float>(rank + 1)), comm::ReduceOp::kAvg));
      EXPECT_EQ(avg.min().item<float>(), (world + 1) / 2.0f) << "n " << n;
      EXPECT_EQ(avg.max().item<float>(), (world + 1) / 2.0f) << "n " << n;
    }
  });
}

TEST_P(Collectives, WorkInPlaceOnCollectiveBuffersAndReuseThem) {
  const auto [backend, world] = GetParam();
  run_ranks(backend, world, [&, world = world](int rank, Group pg) {
    const std::int64_t n = 4099;
    // Shared memory under the shm group (read in place), ordinary memory under Gloo.
    auto params = trainyard::allocate_collective_buffer(pg, world * n, torch::dtype(torch::kFloat));
    auto grads = trainyard::allocate_collective_buffer(pg, world * n, torch::dtype(torch::kFloat));
    for (int round = 0; round < 3; ++round) {  // buffers are reused, as FSDP's are
      auto shard = params.narrow(0, rank * n, n);
      shard.copy_(values_of(rank, n) + round);
      trainyard::wait_work(comm::all_gather_flat(pg, params, shard));  // input is its own slot
      for (int p = 0; p < world; ++p)
        EXPECT_TRUE(torch::equal(params.narrow(0, p * n, n), values_of(p, n) + round))
            << "rank " << rank << " round " << round << " slot " << p;

      grads.copy_(torch::arange(world * n, torch::kFloat32) * (rank + 1 + round));
      auto own = grads.narrow(0, rank * n, n);  // the output is the input's own slot
      trainyard::wait_work(comm::reduce_scatter_flat(pg, own, grads));
      const float factor = world * (world + 1) / 2.0f + world * round;
      EXPECT_TRUE(
          torch::equal(own, torch::arange(rank * n, (rank + 1) * n, torch::kFloat32) * factor))
          << "rank " << rank << " round " << round;
    }
  });
}

TEST_P(Collectives, SeveralInFlightCompleteInOrder) {
  const auto [backend, world] = GetParam();
  run_ranks(backend, world, [&, world = world](int rank, Group pg) {
    std::vector<torch::Tensor> outputs;
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    for (int i = 0; i < 4; ++i) {  // alternating kinds and sizes, none waited for until the end
      const std::int64_t n = 501 * (i + 1);
      if (i % 2 == 0) {
        outputs.push_back(torch::empty({world * n}));
        works.push_back(comm::all_gather_flat(pg, outputs.back(), values_of(rank, n) + i));
      } else {
        outputs.push_back(torch::empty({n}));
        works.push_back(
            comm::reduce_scatter_flat(pg, outputs.back(), torch::full({world * n}, 1.0f * i)));
      }
    }
    for (auto& w : works) trainyard::wait_work(w);
    for (int i = 0; i < 4; ++i) {
      const std::int64_t n = 501 * (i + 1);
      if (i % 2 == 0) {
        for (int p = 0; p < world; ++p)
          EXPECT_TRUE(torch::equal(outputs[i].narrow(0, p * n, n), values_of(p, n) + i));
      } else {
        EXPECT_EQ(outputs[i].min().item<float>(), static_cast<float>(world * i));
        EXPECT_EQ(outputs[i].max().item<float>(), static_cast<float>(world * i));
      }
    }
  });
}

// bf16 inputs against the fp32 sum of the same bf16 values, taken in rank order. Tolerances:
//   shared memory: it sums in that order in fp32, so an fp32 output is exact and a bf16 output
//     is that sum rounded once (ties aside, equal to the reference rounded to bf16);
//   Gloo ring: partial sums cross each of the W - 2 inner hops as bf16 (Note [Ring
//     collectives]), each rounding by at most half a bf16 ulp (2^-8 relative: 8 significant bits)
//     of a partial sum bounded by sum_p |x_p|; a bf16 output adds one more rounding of the result.
TEST_P(Collectives, SumsBfloat16InFloat32) {
  const auto [backend, world] = GetParam();
  run_ranks(backend, world, [&, backend = backend, world = world](int rank, Group pg) {
    const std::int64_t n = 3001;
    auto reference = torch::zeros({world * n});
    auto magnitude = torch::zeros({world * n});  // sum_p |x_p|
    for (int p = 0; p < world; ++p) {
      auto x = wavy_of(p, world * n).to(torch::kBFloat16).to(torch::kFloat32);
      reference += x;
      magnitude += x.abs();
    }
    const auto mine = reference.narrow(0, rank * n, n);
    const auto bound =
        magnitude.narrow(0, rank * n, n) * (std::ldexp(1.0, -8) * std::max(0, world - 2)) + 1e-6;
    const auto input = wavy_of(rank, world * n).to(torch::kBFloat16);

    auto out32 = torch::empty({n}, torch::kFloat32);
    trainyard::wait_work(comm::reduce_scatter_flat(pg, out32, input));
    auto out16 = torch::empty({n}, torch::kBFloat16);
    trainyard::wait_work(comm::reduce_scatter_flat(pg, out16, input));
    if (backend == Backend::kShm) {
      EXPECT_TRUE(torch::equal(out32, mine)) << "rank " << rank;
      EXPECT_TRUE(torch::equal(out16, mine.to(torch::kBFloat16))) << "rank " << rank;
    } else {
      EXPECT_TRUE(((out32 - mine).abs() <= bound).all().item<bool>())
          << "rank " << rank << " max error " << (out32 - mine).abs().max().item<float>();
      const auto bound16 = bound + mine.abs() * std::ldexp(1.0, -8);
      EXPECT_TRUE(((out16.to(torch::kFloat32) - mine).abs() <= bound16).all().item<bool>());
    }

    auto avg = torch::empty({n}, torch::kFloat32);
    trainyard::wait_work(comm::reduce_scatter_flat(pg, avg, input, comm::ReduceOp::kAvg));
    EXPECT_TRUE(((avg - mine / world).abs() <= bound / world + 1e-6).all().item<bool>());

    // All-gather copies bf16 as it is.
    auto gathered = torch::empty({world * n}, torch::kBFloat16);
    trainyard::wait_work(comm::all_gather_flat(pg, gathered, input.narrow(0, 0, n)));
    for (int p = 0; p < world; ++p)
      EXPECT_TRUE(torch::equal(gathered.narrow(0, p * n, n), wavy_of(p, n).to(torch::kBFloat16)));
  });
}

TEST_P(Collectives, RejectsTensorsThatDoNotFitTheWorldSize) {
  const auto [backend, world] = GetParam();
  run_ranks(backend, world, [&, world = world](int rank, Group pg) {
    try {
      comm::all_gather_flat(pg, torch::empty({world * 10 + 1}), torch::empty({10}));
      ADD_FAILURE() << "no error";
    } catch (const trainyard::InvalidArgumentError& e) {
      EXPECT_NE(std::string(e.what()).find("it must have " + std::to_string(world * 10)),
                std::string::npos)
          << e.what();
    }
    EXPECT_THROW(comm::reduce_scatter_flat(pg, torch::empty({10}, torch::kInt64),
                                           torch::empty({world * 10}, torch::kInt64)),
                 trainyard::InvalidArgumentError);
    // Neither CPU nor CUDA: refused before any communication.
    const auto meta = torch::TensorOptions().device(torch::kMeta);
    try {
      comm::all_gather_flat(pg, torch::empty({world * 10}, meta), torch::empty({10}, meta));
      ADD_FAILURE() << "no error for meta tensors";
    } catch (const trainyard::InvalidArgumentError& e) {
      EXPECT_NE(std::string(e.what()).find("CPU or CUDA tensors"), std::string::npos) << e.what();
    }
    EXPECT_THROW(comm::all_gather_flat(pg, torch::empty({world * 10}), torch::empty({10}, meta)),
                 trainyard::InvalidArgumentError);  // two devices
    EXPECT_FALSE(comm::capabilities_of(pg).device_tensors) << "a CPU group";
  });
}

INSTANTIATE_TEST_SUITE_P(BackendsAndWorldSizes,
                         Collectives,
                         ::testing::Combine(::testing::Values(Backend::kShm, Backend::kGloo),
                                            ::testing::Values(1, 2, 3, 4)),
                         [](const auto& info) {
                           return name_of(std::get<0>(info.param)) + "World" +
                                  std::to_string(std::get<1>(info.param));
                         });

// Two ranks: each is the other's ring neighbour, so both see the mismatch.
class CollectivesMismatch : public ::testing::TestWithParam<Backend> {};

TEST_P(CollectivesMismatch, RanksIssuingDifferentFlatCollectivesGetAnError) {
  const auto backend = GetParam();
  std::vector<std::string> messages(2);
  run_ranks(backend, 2, [&](int rank, Group pg) {
    const std::int64_t n = 100;
    try {
      if (rank == 0) {
        trainyard::wait_work(comm::all_gather_flat(pg, torch::empty({2 * n}), torch::ones({n})));
      } else {
        trainyard::wait_work(
            comm::reduce_scatter_flat(pg, torch::empty({n}), torch::ones({2 * n})));
      }
    } catch (const trainyard::Error& e) {
      messages[rank] = e.what();
    }
  });
  for (const auto& m : messages) {
    EXPECT_NE(m.find("every rank must issue the same collectives in the same order"),
              std::string::npos)
        << m;
    if (backend == Backend::kShm) {
      EXPECT_NE(m.find("an all-gather of 800 bytes of Float"), std::string::npos) << m;
      EXPECT_NE(m.find("a reduce-scatter with SUM of 800 bytes of Float"), std::string::npos) << m;
    } else {
      EXPECT_NE(m.find("all_gather_flat of 100 x Float per rank"), std::string::npos) << m;
      EXPECT_NE(m.find("reduce_scatter_flat with SUM of 100 x Float per rank"), std::string::npos)
          << m;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends,
                         CollectivesMismatch,
                         ::testing::Values(Backend::kShm, Backend::kGloo),
                         [](const auto& info) { return name_of(info.param); });

// Many ranks each adding 1 to rank 0's 256, in bf16: a naive bf16 sum rounds 257 back to 256 at
// every addition and ends at 256; summed in fp32 the result is 259 (the shared-memory path sums
// raw inputs), which rounds to 260 in a bf16 output.
TEST(CollectivesPrecision, Float32AccumulationBeatsNaiveBfloat16Summation) {
  const int world = 4;
  auto naive = torch::full({1}, 256.0f, torch::kBFloat16);
  for (int p = 1; p < world; ++p) naive += torch::ones({1}, torch::kBFloat16);
  EXPECT_EQ(naive.item<float>(), 256.0f);

  run_ranks(Backend::kShm, world, [&](int rank, Group pg) {
    const std::int64_t n = 513;
    const auto input = torch::full({world * n}, rank == 0 ? 256.0f : 1.0f).to(torch::kBFloat16);
    auto out32 = torch::empty({n}, torch::kFloat32);
    trainyard::wait_work(comm::reduce_scatter_flat(pg, out32, input));
    EXPECT_EQ(out32.min().item<float>(), 259.0f);
    EXPECT_EQ(out32.max().item<float>(), 259.0f);
    auto out16 = torch::empty({n}, torch::kBFloat16);
    trainyard::wait_work(comm::reduce_scatter_flat(pg, out16, input));
    EXPECT_EQ(out16.min().item<float>(), 260.0f);
  });
}

// The ring rounds partial sums to bf16 between hops (Note [Ring collectives]): where rank 0's 256
// joins a chain early, the ones after it are lost as in a naive sum; where it joins last, the
// result is exact. Every result stays within the stated bound of 259.
TEST(CollectivesPrecision, RingRoundsPartialSumsToBfloat16BetweenHops) {
  const int world = 4;
  std::vector<float> results(world);
  run_ranks(Backend::kGloo, world, [&](int rank, Group pg) {
    const auto input = torch::full({world * 5}, rank == 0 ? 256.0f : 1.0f).to(torch::kBFloat16);
    auto out = torch::empty({5}, torch::kFloat32);
    trainyard::wait_work(comm::reduce_scatter_flat(pg, out, input));
    results[rank] = out.max().item<float>();
  });
  // Slot c's chain starts at rank c + 1 and ends at rank c; 256 + 1 rounds to 256 in bf16.
  EXPECT_EQ(results, (std::vector<float>{259.0f, 259.0f, 257.0f, 257.0f}));
}

TEST(CollectivesCapabilities, OnlyTheSharedMemoryGroupHasThem) {
  run_ranks(Backend::kShm, 2, [](int, Group pg) {
    const auto caps = comm::capabilities_of(pg);
    EXPECT_TRUE(caps.shared_memory);
    EXPECT_TRUE(caps.average_in_collective);
    EXPECT_TRUE(caps.native_flat_collectives);
    const auto inner =
        comm::capabilities_of(dynamic_cast<trainyard::ShmProcessGroup&>(*pg).inner());
    EXPECT_FALSE(inner.shared_memory);
    EXPECT_FALSE(inner.average_in_collective);
    EXPECT_FALSE(inner.native_flat_collectives);
  });
}

}  // namespace
