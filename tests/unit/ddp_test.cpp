// DistributedDataParallel equivalence: W ranks (threads over an in-memory store, real Gloo
// groups) with batch B each must end where one process with batch W*B ends.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <thread>

#include "thread_ranks.h"
#include "trainyard/comm/process_group.h"
#include "trainyard/ddp/distributed_data_parallel.h"
#include "trainyard/error.h"

namespace {
namespace nn = torch::nn;
using trainyard::ddp::DdpOptions;
using trainyard::ddp::DistributedDataParallel;

constexpr int kSteps = 5;
constexpr int64_t kBatch = 8;  // per rank

struct Mlp : nn::Module {
  Mlp() {
    fc1 = register_module("fc1", nn::Linear(10, 32));
    fc2 = register_module("fc2", nn::Linear(32, 32));
    fc3 = register_module("fc3", nn::Linear(32, 4));
  }
  torch::Tensor forward(torch::Tensor x) { return fc3(torch::relu(fc2(torch::relu(fc1(x))))); }
  nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};

struct BnNet : nn::Module {
  BnNet() {
    // No conv bias: BatchNorm cancels it, its gradient is rounding noise that Adam would amplify.
    conv = register_module("conv", nn::Conv2d(nn::Conv2dOptions(1, 4, 3).padding(1).bias(false)));
    bn = register_module("bn", nn::BatchNorm2d(4));
    fc = register_module("fc", nn::Linear(4 * 6 * 6, 4));
  }
  torch::Tensor forward(torch::Tensor x) { return fc(torch::relu(bn(conv(x))).flatten(1)); }
  nn::Conv2d conv{nullptr};
  nn::BatchNorm2d bn{nullptr};
  nn::Linear fc{nullptr};
};

// `unused` never takes part in forward; `aux` only when the input's first feature is positive
// for the first sample, which the test arranges to hold on rank 0 only.
struct UnusedNet : nn::Module {
  UnusedNet() {
    fc1 = register_module("fc1", nn::Linear(10, 16));
    aux = register_module("aux", nn::Linear(16, 16));
    unused = register_module("unused", nn::Linear(16, 16));
    fc2 = register_module("fc2", nn::Linear(16, 4));
  }
  torch::Tensor forward(torch::Tensor x) {
    auto h = torch::relu(fc1(x));
    if (x[0][0].item<float>() > 0) h = torch::relu(aux(h));
    return fc2(h);
  }
  nn::Linear fc1{nullptr}, aux{nullptr}, unused{nullptr}, fc2{nullptr};
};

enum class ModelKind { kMlp, kBatchNorm, kUnused };

std::shared_ptr<nn::Module> make_model(ModelKind kind) {
  torch::manual_seed(1234);
  switch (kind) {
    case ModelKind::kMlp:
      return std::make_shared<Mlp>();
    case ModelKind::kBatchNorm:
      return std::make_shared<BnNet>();
    case ModelKind::kUnused:
      return std::make_shared<UnusedNet>();
  }
  return nullptr;
}

torch::Tensor forward(ModelKind kind, nn::Module& m, const torch::Tensor& x) {
  switch (kind) {
    case ModelKind::kMlp:
      return static_cast<Mlp&>(m).forward(x);
    case ModelKind::kBatchNorm:
      return static_cast<BnNet&>(m).forward(x);
    case ModelKind::kUnused:
      return static_cast<UnusedNet&>(m).forward(x);
  }
  return {};
}

// Inputs for (step, micro-step, rank): (kBatch, ...) each.
struct Data {
  std::vector<torch::Tensor> x, y;
  int world, micro;
  const torch::Tensor& input(int step, int m, int r) const {
    return x[(step * micro + m) * world + r];
  }
  const torch::Tensor& target(int step, int m, int r) const {
    return y[(step * micro + m) * world + r];
  }
};

Data make_data(ModelKind kind, int world, int micro) {
  torch::manual_seed(99);
  Data d{{}, {}, world, micro};
  for (int i = 0; i < kSteps * micro * world; ++i) {
    auto x = kind == ModelKind::kBatchNorm ? torch::randn({kBatch, 1, 6, 6})
                                           : torch::randn({kBatch, 10});
    if (kind == ModelKind::kUnused) x[0][0] = (i % world == 0) ? 1.0f : -1.0f;  // aux on rank 0
    d.x.push_back(x);
    d.y.push_back(torch::randint(0, 4, {kBatch}, torch::kInt64));
  }
  return d;
}

std::vector<torch::Tensor> state_of(nn::Module& m) {
  std::vector<torch::Tensor> out;
  for (auto& p : m.parameters()) out.push_back(p.detach().clone());
  for (auto& b : m.buffers()) out.push_back(b.detach().clone());
  return out;
}

// One process, the whole W*B batch per step. BatchNorm statistics are per rank in DDP (as in
// PyTorch without SyncBatchNorm), so each rank's slice is normalised on its own, and the
// running statistics follow rank 0's slice, the ones DDP broadcasts.
std::vector<torch::Tensor> train_reference(ModelKind kind, const Data& d) {
  auto model = make_model(kind);
  model->train();
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-2));
  for (int s = 0; s < kSteps; ++s) {
    opt.zero_grad();
    for (int m = 0; m < d.micro; ++m) {
      auto buffers_before = state_of(*model);
      for (int r = d.world - 1; r >= 0; --r) {
        {
          torch::NoGradGuard g;
          auto bufs = model->buffers();
          auto params = model->parameters().size();
          for (size_t i = 0; i < bufs.size(); ++i) bufs[i].copy_(buffers_before[params + i]);
        }
        auto loss =
            torch::cross_entropy_loss(forward(kind, *model, d.input(s, m, r)), d.target(s, m, r));
        (loss / (d.world * d.micro)).backward();
      }
    }
    opt.step();
  }
  return state_of(*model);
}

void run_ranks(int world,
               const std::function<void(int, c10::intrusive_ptr<c10d::ProcessGroup>)>& fn,
               bool shm = false) {
  trainyard::testing::run_thread_ranks(world, fn, {.shm = shm});
}

double relative_difference(const torch::Tensor& a, const torch::Tensor& b) {
  auto diff = (a.to(torch::kDouble) - b.to(torch::kDouble)).norm().item<double>();
  auto ref = b.to(torch::kDouble).norm().item<double>();
  return ref == 0 ? diff : diff / ref;
}

struct Case {
  ModelKind kind;
  int world;
  int micro;         // micro-steps per optimizer step; > 1 uses no_sync for all but the last
  bool shm = false;  // gradients all-reduced through shared memory instead of Gloo
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  static const char* const kNames[] = {"Mlp", "BatchNorm", "Unused"};
  return std::string(kNames[static_cast<int>(info.param.kind)]) + "_world" +
         std::to_string(info.param.world) + "_micro" + std::to_string(info.param.micro) +
         (info.param.shm ? "_shm" : "");
}

class DdpEquivalence : public ::testing::TestWithParam<Case> {};

TEST_P(DdpEquivalence, MatchesOneProcessWithTheWholeBatch) {
  torch::set_num_threads(1);
  const auto c = GetParam();
  const auto data = make_data(c.kind, c.world, c.micro);
  const auto expected = train_reference(c.kind, data);

  std::vector<std::vector<torch::Tensor>> got(c.world);
  std::vector<trainyard::ddp::DdpStepStats> stats(c.world);
  std::vector<std::shared_ptr<nn::Module>> models;
  for (int r = 0; r < c.world; ++r) models.push_back(make_model(c.kind));
  run_ranks(
      c.world,
      [&](int rank, c10::intrusive_ptr<c10d::ProcessGroup> pg) {
        auto& model = models[rank];
        model->train();
        DistributedDataParallel ddp(
            model, pg,
            DdpOptions{.bucket_size_bytes = 2048,
                       .first_bucket_size_bytes = 512,
                       .find_unused_parameters = c.kind == ModelKind::kUnused});
        torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-2));
        for (int s = 0; s < kSteps; ++s) {
          opt.zero_grad();
          for (int m = 0; m < c.micro; ++m) {
            auto step = [&] {
              ddp.reducer().prepare_forward();
              auto out = forward(c.kind, *model, data.input(s, m, rank));
              (torch::cross_entropy_loss(out, data.target(s, m, rank)) / c.micro).backward();
            };
            if (m + 1 < c.micro) {
              auto guard = ddp.no_sync();
              step();
            } else {
              step();
            }
          }
          opt.step();
        }
        got[rank] = state_of(*model);
        stats[rank] = ddp.reducer().last_step_stats();
      },
      c.shm);

  const auto num_params = models[0]->parameters().size();
  for (int r = 0; r < c.world; ++r) {
    // Parameters agree on every rank; buffers are compared on rank 0, whose buffers DDP keeps.
    const size_t upto = r == 0 ? expected.size() : num_params;
    for (size_t i = 0; i < upto; ++i) {
      EXPECT_LT(relative_difference(got[r][i], expected[i]), 1e-5)
          << "rank " << r << " tensor " << i << " (float32 sums in another order differ by ~1e-7)";
    }
    EXPECT_GE(stats[r].bucket_count, 2);
  }
  if (c.kind == ModelKind::kUnused) {
    EXPECT_EQ(stats[0].locally_unused_parameters, 2);  // unused.{weight,bias}
    EXPECT_EQ(stats[1].locally_unused_parameters, 4);  // plus aux.{weight,bias}
  }
}

INSTANTIATE_TEST_SUITE_P(Models,
                         DdpEquivalence,
                         ::testing::Values(Case{ModelKind::kMlp, 2, 1},
                                           Case{ModelKind::kMlp, 3, 1},
                                           Case{ModelKind::kMlp, 2, 3},
                                           Case{ModelKind::kBatchNorm, 2, 1},
                                           Case{ModelKind::kBatchNorm, 3, 2},
                                           Case{ModelKind::kUnused, 2, 1},
                                           Case{ModelKind::kUnused, 2, 2},
                                           Case{ModelKind::kMlp, 3, 2, true},
                                           Case{ModelKind::kBatchNorm, 2, 1, true},
                                           Case{ModelKind::kUnused, 3, 1, true}),
                         case_name);

TEST(Ddp, LaunchesBucketsWhileBackwardStillRuns) {
  torch::set_num_threads(1);
  std::vector<trainyard::ddp::DdpStepStats> stats(2);
  std::vector<std::shared_ptr<nn::Module>> models{make_model(ModelKind::kMlp),
                                                  make_model(ModelKind::kMlp)};
  run_ranks(2, [&](int rank, c10::intrusive_ptr<c10d::ProcessGroup> pg) {
    DistributedDataParallel ddp(models[rank], pg,
                                DdpOptions{.bucket_size_bytes = 1, .first_bucket_size_bytes = 1});
    ddp.reducer().prepare_forward();
    auto out = forward(ModelKind::kMlp, *models[rank], torch::randn({4, 10}));
    out.sum().backward();
    stats[rank] = ddp.reducer().last_step_stats();
  });
  for (const auto& s : stats) {
    EXPECT_EQ(s.bucket_count, 6);  // one bucket per parameter with a 1-byte cap
    // Every bucket but the one holding fc1's weight (the last gradient) can launch from a hook;
    // the engine's end-of-backward callback must not be where all of them start.
    EXPECT_GE(s.buckets_launched_in_backward, 5);
  }
}

TEST(Ddp, NamesParametersWithoutGradient) {
  torch::set_num_threads(1);
  std::vector<std::string> messages(2);
  std::vector<std::shared_ptr<nn::Module>> models{make_model(ModelKind::kUnused),
                                                  make_model(ModelKind::kUnused)};
  run_ranks(2, [&](int rank, c10::intrusive_ptr<c10d::ProcessGroup> pg) {
    DistributedDataParallel ddp(models[rank], pg);  // find_unused_parameters = false
    ddp.reducer().prepare_forward();
    auto x = torch::randn({4, 10});
    x[0][0] = 1.0f;  // aux used on both ranks, `unused` on neither
    try {
      forward(ModelKind::kUnused, *models[rank], x).sum().backward();
    } catch (const std::exception& e) {
      messages[rank] = e.what();
    }
  });
  for (const auto& m : messages) {
    EXPECT_NE(m.find("unused.weight"), std::string::npos) << m;
    EXPECT_NE(m.find("find_unused_parameters"), std::string::npos) << m;
  }
}

TEST(Ddp, BroadcastsRankZeroStateAtConstruction) {
  torch::set_num_threads(1);
  std::vector<std::shared_ptr<nn::Module>> models;
  for (int r = 0; r < 2; ++r) {
    torch::manual_seed(r);  // different initial weights per rank
    models.push_back(std::make_shared<BnNet>());
  }
  const auto rank0 = state_of(*models[0]);
  run_ranks(2, [&](int rank, c10::intrusive_ptr<c10d::ProcessGroup> pg) {
    DistributedDataParallel ddp(models[rank], pg);
  });
  const auto rank1 = state_of(*models[1]);
  for (size_t i = 0; i < rank0.size(); ++i) EXPECT_TRUE(torch::equal(rank0[i], rank1[i])) << i;
}

TEST(Ddp, RejectsRanksWithDifferentModels) {
  torch::set_num_threads(1);
  std::vector<std::string> messages(2);
  std::vector<std::shared_ptr<nn::Module>> models{make_model(ModelKind::kMlp),
                                                  make_model(ModelKind::kBatchNorm)};
  run_ranks(2, [&](int rank, c10::intrusive_ptr<c10d::ProcessGroup> pg) {
    try {
      DistributedDataParallel ddp(models[rank], pg);
    } catch (const trainyard::InvalidArgumentError& e) {
      messages[rank] = e.what();
    }
  });
  for (const auto& m : messages)
    EXPECT_NE(m.find("ranks hold different models"), std::string::npos) << m;
}

}  // namespace

namespace {

TEST(Ddp, ADeadPeerIsAnErrorWithinTheTimeoutNotAHang) {
  torch::set_num_threads(1);
  std::vector<std::shared_ptr<nn::Module>> models{make_model(ModelKind::kMlp),
                                                  make_model(ModelKind::kMlp)};
  std::string message;
  std::chrono::duration<double> waited{};
  trainyard::testing::run_thread_ranks(
      2,
      [&](int rank, c10::intrusive_ptr<c10d::ProcessGroup> pg) {
        DistributedDataParallel ddp(models[rank], pg);
        if (rank == 1) return;  // this rank "dies": its group goes away before the backward
        ddp.reducer().prepare_forward();
        auto start = std::chrono::steady_clock::now();
        try {
          forward(ModelKind::kMlp, *models[rank], torch::randn({4, 10})).sum().backward();
        } catch (const std::exception& e) {
          message = e.what();
        }
        waited = std::chrono::steady_clock::now() - start;
      },
      {.timeout = std::chrono::seconds(2)});
  EXPECT_NE(message.find("rank 0/2"), std::string::npos) << message;
  EXPECT_NE(message.find("HINT"), std::string::npos) << message;
  EXPECT_LT(waited.count(), 10.0) << "bounded by the 2 s collective timeout";
}

}  // namespace

namespace {

// Passes values through; its backward fails, as user code in a backward pass can.
struct FailingBackward : torch::autograd::Function<FailingBackward> {
  static torch::Tensor forward(torch::autograd::AutogradContext*, torch::Tensor x) {
    return x.clone();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list) {
    throw std::runtime_error("injected failure in backward");
  }
};

TEST(Ddp, RecoversAfterABackwardThatFailedHalfway) {
  torch::set_num_threads(1);
  std::vector<std::shared_ptr<nn::Module>> models{make_model(ModelKind::kMlp),
                                                  make_model(ModelKind::kMlp)};
  std::vector<torch::Tensor> grads(2);
  std::vector<std::string> first_errors(2);
  run_ranks(2, [&](int rank, c10::intrusive_ptr<c10d::ProcessGroup> pg) {
    auto& m = static_cast<Mlp&>(*models[rank]);
    DistributedDataParallel ddp(models[rank], pg,
                                DdpOptions{.bucket_size_bytes = 1, .first_bucket_size_bytes = 1});
    // fc3's and fc2's gradients land and their buckets launch; then backward fails before fc1.
    ddp.reducer().prepare_forward();
    auto h = FailingBackward::apply(torch::relu(m.fc1(torch::randn({4, 10}))));
    try {
      m.fc3(torch::relu(m.fc2(h))).sum().backward();
    } catch (const std::exception& e) {
      first_errors[rank] = e.what();
    }
    // The next step must synchronise normally.
    for (auto& p : m.parameters()) p.mutable_grad() = torch::Tensor();
    ddp.reducer().prepare_forward();
    torch::manual_seed(rank);
    m.forward(torch::randn({4, 10})).sum().backward();
    grads[rank] = m.fc1->weight.grad().clone();
  });
  for (const auto& e : first_errors) EXPECT_NE(e.find("injected failure"), std::string::npos) << e;
  EXPECT_TRUE(torch::allclose(grads[0], grads[1])) << "the second step's gradients are averaged";
}

}  // namespace
