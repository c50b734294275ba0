// A user-defined model trained data-parallel with trainyard's public API. Run it as the ranks of
// a job:
//   build/trainyard run --nproc-per-node 2 -- build/examples/train_custom_model [epochs] [limit]
// Each rank trains on its slice of FashionMNIST; gradients are averaged during backward.
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>

#include "trainyard/comm/process_group.h"
#include "trainyard/data/batch_loader.h"
#include "trainyard/data/distributed_sampler.h"
#include "trainyard/data/fashion_mnist.h"
#include "trainyard/ddp/distributed_data_parallel.h"

// Any torch::nn::Module works; this one is a small convolutional network.
struct NetImpl : torch::nn::Module {
  NetImpl() {
    conv1 =
        register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 16, 3).padding(1)));
    conv2 =
        register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 3).padding(1)));
    fc = register_module("fc", torch::nn::Linear(32 * 7 * 7, 10));
  }
  torch::Tensor forward(torch::Tensor x) {            // (B, 1, 28, 28)
    x = torch::max_pool2d(torch::relu(conv1(x)), 2);  // (B, 16, 14, 14)
    x = torch::max_pool2d(torch::relu(conv2(x)), 2);  // (B, 32, 7, 7)
    return fc(x.flatten(1));                          // (B, 10)
  }
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(Net);

int main(int argc, char** argv) try {
  const int epochs = argc > 1 ? std::atoi(argv[1]) : 2;
  const std::int64_t limit = argc > 2 ? std::atoll(argv[2]) : 12000;

  // 1. Join the job: reads RANK, WORLD_SIZE, MASTER_ADDR, ... and builds the Gloo group.
  auto dist = trainyard::init();
  torch::set_num_threads(1);

  // 2. Wrap the model: rank 0's weights are broadcast, gradients get all-reduced in buckets.
  Net net;
  trainyard::ddp::DistributedDataParallel model(net, dist->process_group());
  torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));

  // 3. Data: each rank reads its own disjoint slice, reshuffled every epoch.
  namespace data = trainyard::data;
  auto train = data::load_fashion_mnist(data::kFashionMnistDir, data::Split::kTrain, limit);
  data::DistributedSampler sampler(
      {.dataset_size = train.size(), .num_replicas = dist->world_size(), .rank = dist->rank()});

  // 4. Train: the loop is the same as in a single process.
  for (int epoch = 0; epoch < epochs; ++epoch) {
    sampler.set_epoch(epoch);
    data::BatchLoader loader(sampler.indices(),
                             [&](const std::vector<std::int64_t>& idx) {
                               auto [x, y] = data::fashion_mnist_batch(train, idx);
                               return data::Batch{x, y};
                             },
                             {.batch_size = 64});
    double loss_sum = 0;
    std::int64_t steps = 0;
    while (auto batch = loader.next()) {
      optimizer.zero_grad();
      auto loss = torch::cross_entropy_loss(model.forward(batch->inputs), batch->targets);
      loss.backward();  // gradients are averaged across ranks when this returns
      optimizer.step();
      loss_sum += loss.item<double>();
      ++steps;
    }
    std::printf("rank %d epoch %d: mean loss %.4f over %lld steps\n", dist->rank(), epoch,
                loss_sum / steps, static_cast<long long>(steps));
  }

  // 5. Every rank holds the same weights; rank 0 saves them.
  if (dist->rank() == 0) torch::save(net, "custom_model.pt");
  dist->barrier();
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "train_custom_model: %s\n", e.what());
  return 1;
}
