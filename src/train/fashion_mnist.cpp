#include "trainyard/train/fashion_mnist.h"

#include <fcntl.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "trainyard/comm/process_group.h"
#include "trainyard/data/batch_loader.h"
#include "trainyard/data/distributed_sampler.h"
#include "trainyard/data/fashion_mnist.h"
#include "trainyard/ddp/distributed_data_parallel.h"
#include "trainyard/error.h"
#include "trainyard/log.h"
#include "trainyard/models/resnet.h"
#include "trainyard/optim/fused_adam.h"

namespace trainyard::train {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// A one-line bar redrawn with '\r'; only on an interactive terminal.
class ProgressBar {
 public:
  ProgressBar(bool enabled, int epoch, std::int64_t total)
      : enabled_(enabled), epoch_(epoch), total_(total) {}
  void update(std::int64_t done, double loss) {
    if (!enabled_ || total_ == 0) return;
    constexpr int kWidth = 30;
    int filled = static_cast<int>(kWidth * done / total_);
    // Drawn as "text\r" so it also works through the launcher's line prefixes.
    std::printf("Epoch %d [%s%s] %lld/%lld loss %.4f\r", epoch_, std::string(filled, '#').c_str(),
                std::string(kWidth - filled, '.').c_str(), static_cast<long long>(done),
                static_cast<long long>(total_), loss);
    std::fflush(stdout);
  }
  ~ProgressBar() {
    if (!enabled_) return;
    std::printf("%s\r", std::string(72, ' ').c_str());
    std::fflush(stdout);
  }

 private:
  bool enabled_;
  int epoch_;
  std::int64_t total_;
};

bool interactive_output() {
  const char* tty = std::getenv("TRAINYARD_TTY");
  return (tty != nullptr && std::string(tty) == "1") || ::isatty(STDOUT_FILENO) == 1;
}

void write_json_atomically(const fs::path& path, const nlohmann::json& value) {
  auto tmp = path;
  tmp += ".tmp";
  const std::string text = value.dump(2) + "\n";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  TY_CHECK_T(Error, fd >= 0, "Cannot write ", tmp.string(), ": ", std::strerror(errno), ".");
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) &&
                  ::fsync(fd) == 0;
  const int saved_errno = errno;
  ::close(fd);
  TY_CHECK_T(Error, ok, "Cannot write ", tmp.string(), ": ", std::strerror(saved_errno),
             ". HINT: is the storage full?");
  fs::rename(tmp, path);
}

nlohmann::json config_json(const FashionMnistOptions& o, int world_size, int threads) {
  return {{"recipe", "fashion-mnist"},   {"model", "resnet18 (1-channel 7x7 conv1, 10 classes)"},
          {"world_size", world_size},    {"epochs", o.epochs},
          {"batch_size", o.batch_size},  {"lr", o.lr},
          {"optimizer", "Adam"},         {"limit", o.limit},
          {"threads_per_rank", threads}, {"seed", o.seed},
          {"data_dir", o.data_dir},      {"bucket_cap_mb", o.bucket_cap_mb},
          {"storage", o.storage},        {"name", o.name}};
}

}  // namespace

void FashionMnistOptions::validate() const {
  TY_CHECK(workers >= 1, "--workers must be >= 1, got ", workers, ".");
  TY_CHECK(epochs >= 1, "--epochs must be >= 1, got ", epochs, ".");
  TY_CHECK(batch_size >= 1, "--batch-size must be >= 1, got ", batch_size, ".");
  TY_CHECK(lr > 0, "--lr must be > 0, got ", lr, ".");
  TY_CHECK(limit == -1 || limit >= 1, "--limit must be >= 1 (or omitted for all images), got ",
           limit, ".");
  TY_CHECK(bucket_cap_mb >= 1.0 / 1024 && bucket_cap_mb <= 64 * 1024,
           "--bucket-cap-mb must be between 1 KiB (0.0009765625) and 65536 MiB, got ",
           bucket_cap_mb, ".");
  TY_CHECK(threads >= 0, "--threads must be >= 0 (0: cores / workers), got ", threads, ".");
  TY_CHECK(!storage.empty(), "--storage must name a directory.");
  TY_CHECK(!name.empty() && name.find('/') == std::string::npos,
           "--name must be a non-empty folder name without '/', got '", name, "'.");
}

FashionMnistResult run_fashion_mnist_rank(const FashionMnistOptions& options) {
  options.validate();
  const auto start = Clock::now();
  auto dist = init();
  const int rank = dist->rank();
  const int world = dist->world_size();
  auto log = logger("train");

  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int local_ranks = std::max(1, dist->env().local_world_size);
  const int threads = options.threads > 0 ? options.threads : std::max(1, cores / local_ranks);
  torch::set_num_threads(threads);

  const std::string data_dir = options.data_dir.empty() ? data::kFashionMnistDir : options.data_dir;
  auto train_set = data::load_fashion_mnist(data_dir, data::Split::kTrain, options.limit);
  auto test_set = data::load_fashion_mnist(data_dir, data::Split::kTest);

  const fs::path run_dir = fs::path(options.storage) / options.name;
  auto resolved = options;
  resolved.data_dir = data_dir;
  const auto config = config_json(resolved, world, threads);
  if (rank == 0) {
    fs::create_directories(run_dir);
    write_json_atomically(run_dir / "config.json", config);
    log->info("configuration: {}", config.dump());
  }

  torch::manual_seed(options.seed);
  auto model = models::resnet18(/*in_channels=*/1, /*num_classes=*/10);
  ddp::DistributedDataParallel ddp(model, dist->process_group(),
                                   ddp::DdpOptions{.bucket_size_bytes = static_cast<std::size_t>(
                                                       options.bucket_cap_mb * (1 << 20))});
  optim::FusedAdam optimizer(model->parameters(), torch::optim::AdamOptions(options.lr));

  data::DistributedSampler sampler({.dataset_size = train_set.size(),
                                    .num_replicas = world,
                                    .rank = rank,
                                    .shuffle = true,
                                    .seed = options.seed});
  auto make_batch = [&train_set](const std::vector<std::int64_t>& idx) {
    auto [x, y] = data::fashion_mnist_batch(train_set, idx);
    return data::Batch{x, y};
  };

  const bool progress = options.progress && rank == 0 && interactive_output();
  double train_time = 0;
  std::int64_t samples_seen = 0;  // this rank
  for (int epoch = 0; epoch < options.epochs; ++epoch) {
    const auto epoch_start = Clock::now();
    sampler.set_epoch(epoch);
    model->train();
    data::BatchLoader loader(sampler.indices(), make_batch, {.batch_size = options.batch_size});
    ProgressBar bar(progress, epoch, loader.num_batches());
    std::int64_t step = 0;
    // Seconds per phase over the epoch, for the debug summary.
    double t_data = 0, t_forward = 0, t_backward = 0, t_optimizer = 0, t_comm = 0;
    auto lap = Clock::now();
    auto take = [&lap](double& into) {
      auto now = Clock::now();
      into += std::chrono::duration<double>(now - lap).count();
      lap = now;
    };
    while (auto batch = loader.next()) {
      take(t_data);
      optimizer.zero_grad();
      auto loss = torch::cross_entropy_loss(ddp.forward(batch->inputs), batch->targets);
      take(t_forward);
      loss.backward();
      take(t_backward);
      t_comm += ddp.reducer().last_step_stats().exposed_comm_ms / 1e3;
      optimizer.step();
      take(t_optimizer);
      samples_seen += batch->inputs.size(0);
      ++step;
      if (progress && (step % 5 == 0 || step == loader.num_batches()))
        bar.update(step, loss.item<double>());
      lap = Clock::now();
    }
    if (step > 0)
      log->debug(
          "epoch {}: per step {:.1f} ms data wait, {:.1f} ms forward, {:.1f} ms backward "
          "(of which {:.1f} ms waiting for all-reduces), {:.1f} ms optimizer",
          epoch, 1e3 * t_data / step, 1e3 * t_forward / step, 1e3 * t_backward / step,
          1e3 * t_comm / step, 1e3 * t_optimizer / step);
    const double epoch_time = seconds_since(epoch_start);
    train_time += epoch_time;
    std::printf(
        "[Epoch %d | CPU%d: Process rank %d | Batchsize: %lld | Steps: %lld | Total epoch "
        "time: %.4f]\n",
        epoch, dist->local_rank(), rank, static_cast<long long>(options.batch_size),
        static_cast<long long>(step), epoch_time);
    std::fflush(stdout);
  }

  // Evaluation: rank r takes test images r, r+W, ...; sums are all-reduced, so every image
  // counts exactly once.
  // Every rank evaluates rank 0's BatchNorm statistics, the ones the checkpoint holds.
  ddp.reducer().sync_buffers();
  model->eval();
  double loss_sum = 0;
  double correct = 0;
  double count = 0;
  {
    torch::NoGradGuard no_grad;
    std::vector<std::int64_t> mine;
    for (std::int64_t i = rank; i < test_set.size(); i += world) mine.push_back(i);
    for (std::size_t b = 0; b < mine.size(); b += 512) {
      std::vector<std::int64_t> idx(mine.begin() + b,
                                    mine.begin() + std::min(mine.size(), b + 512));
      auto [x, y] = data::fashion_mnist_batch(test_set, idx);
      auto logits = model->forward(x);
      loss_sum += torch::cross_entropy_loss(logits, y, {}, torch::Reduction::Sum).item<double>();
      correct += logits.argmax(1).eq(y).sum().item<double>();
      count += static_cast<double>(idx.size());
    }
  }
  // (4,): loss sum, correct, count, samples trained; summed over ranks.
  auto totals =
      torch::tensor({loss_sum, correct, count, static_cast<double>(samples_seen)}, torch::kFloat64);
  if (world > 1) {
    std::vector<torch::Tensor> v{totals};
    dist->process_group()->allreduce(v)->wait();
  }
  // The slowest rank's training time decides throughput.
  auto slowest = torch::tensor({train_time}, torch::kFloat64);
  if (world > 1) {
    std::vector<torch::Tensor> v{slowest};
    c10d::AllreduceOptions max_op;
    max_op.reduceOp = c10d::ReduceOp::MAX;
    dist->process_group()->allreduce(v, max_op)->wait();
  }

  FashionMnistResult result;
  result.loss = totals[0].item<double>() / totals[2].item<double>();
  result.accuracy = totals[1].item<double>() / totals[2].item<double>();
  result.train_time_s = slowest.item<double>();
  result.train_samples_per_s = totals[3].item<double>() / result.train_time_s;
  result.world_size = world;
  result.run_dir = run_dir.string();
  result.checkpoint_dir_name = "checkpoint_000000";

  if (rank == 0) {
    const auto checkpoint_dir = run_dir / result.checkpoint_dir_name;
    fs::create_directories(checkpoint_dir);
    torch::save(model, (checkpoint_dir / "model.pt").string());
    result.time_total_s = seconds_since(start);
    nlohmann::json out = {{"loss", result.loss},
                          {"accuracy", result.accuracy},
                          {"time_this_iter_s", result.time_total_s},
                          {"time_total_s", result.time_total_s},
                          {"training_iteration", 1},
                          {"checkpoint_dir_name", result.checkpoint_dir_name},
                          {"train_time_s", result.train_time_s},
                          {"train_samples_per_s", result.train_samples_per_s},
                          {"world_size", world},
                          {"config", config}};
    write_json_atomically(run_dir / "result.json", out);
    log->info("test accuracy {:.4f}, loss {:.5f}; {:.1f} training samples/s; results in {}",
              result.accuracy, result.loss, result.train_samples_per_s, run_dir.string());
  }
  dist->barrier();
  return result;
}

void print_training_result(const std::string& result_json_path) {
  std::ifstream in(result_json_path);
  TY_CHECK_T(Error, in.good(), "No result at ", result_json_path,
             ": the job did not finish. HINT: the ranks' output above names the cause.");
  nlohmann::json r;
  try {
    r = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw CorruptDataError(detail::concat(result_json_path, " is not valid JSON: ", e.what()));
  }
  auto fixed = [](double v, int precision) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*f", precision, v);
    return std::string(buf);
  };
  const std::vector<std::pair<std::string, std::string>> rows = {
      {"checkpoint_dir_name", r.value("checkpoint_dir_name", "")},
      {"time_this_iter_s", fixed(r.value("time_this_iter_s", 0.0), 3)},
      {"time_total_s", fixed(r.value("time_total_s", 0.0), 3)},
      {"training_iteration", std::to_string(r.value("training_iteration", 0))},
      {"accuracy", fixed(r.value("accuracy", 0.0), 4)},
      {"loss", fixed(r.value("loss", 0.0), 5)}};
  std::size_t value_width = 9;
  for (const auto& [key, value] : rows) value_width = std::max(value_width, value.size());
  const std::size_t inner = 2 + 21 + 1 + value_width;  // the box's width inside its borders
  std::string rule;
  for (std::size_t i = 0; i < inner; ++i) rule += "─";
  std::printf("╭%s╮\n│ %-*s│\n├%s┤\n", rule.c_str(), static_cast<int>(inner - 1), "Training result",
              rule.c_str());
  for (const auto& [key, value] : rows)
    std::printf("│ %-21s %*s │\n", key.c_str(), static_cast<int>(value_width), value.c_str());
  std::printf("╰%s╯\n", rule.c_str());
  std::fflush(stdout);
}

}  // namespace trainyard::train
