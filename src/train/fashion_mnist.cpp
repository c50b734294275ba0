#include "trainyard/train/fashion_mnist.h"

#include <torch/torch.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <thread>

#include "trainyard/blas_core.h"
#include "trainyard/checkpoint/checkpointer.h"
#include "trainyard/checkpoint/torch_state.h"
#include "trainyard/comm/process_group.h"
#include "trainyard/data/batch_loader.h"
#include "trainyard/data/distributed_sampler.h"
#include "trainyard/data/fashion_mnist.h"
#include "trainyard/ddp/distributed_data_parallel.h"
#include "trainyard/error.h"
#include "trainyard/heartbeat.h"
#include "trainyard/log.h"
#include "trainyard/models/resnet.h"
#include "trainyard/optim/sharded_adam.h"

namespace trainyard::train {
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

// Where a run stands; state.json in each checkpoint.
struct Progress {
  int epoch = 0;                    // the epoch to run next (or being run)
  std::int64_t epoch_position = 0;  // sample positions of that epoch done, all ranks together
  std::int64_t global_step = 0;     // optimizer steps since the run began
  int world_size = 1;               // when the checkpoint was taken
};

nlohmann::json to_json(const Progress& p) {
  return {{"epoch", p.epoch},
          {"epoch_position", p.epoch_position},
          {"global_step", p.global_step},
          {"world_size", p.world_size}};
}

Progress progress_from_json(const std::string& text, const std::string& what) {
  try {
    const auto j = nlohmann::json::parse(text);
    return Progress{.epoch = j.at("epoch").get<int>(),
                    .epoch_position = j.at("epoch_position").get<std::int64_t>(),
                    .global_step = j.at("global_step").get<std::int64_t>(),
                    .world_size = j.at("world_size").get<int>()};
  } catch (const std::exception& e) {
    throw CheckpointCorruptError(
        detail::concat(what, " is not a valid training state: ", e.what()));
  }
}

std::string json_text(const nlohmann::json& value) {
  return value.dump(2) + "\n";
}

nlohmann::json config_json(const FashionMnistOptions& o, int world_size, int threads) {
  return {{"recipe", "fashion-mnist"},
          {"model", "resnet18 (1-channel 7x7 conv1, 10 classes)"},
          {"world_size", world_size},
          {"epochs", o.epochs},
          {"batch_size", o.batch_size},
          {"lr", o.lr},
          {"optimizer", "Adam (ShardedAdam: ZeRO-1 across the ranks)"},
          {"blas_core", blas_core_name()},
          {"limit", o.limit},
          {"threads_per_rank", threads},
          {"seed", o.seed},
          {"data_dir", o.data_dir},
          {"bucket_cap_mb", o.bucket_cap_mb},
          {"storage", o.storage},
          {"name", o.name},
          {"checkpoint_every", o.checkpoint_every},
          {"num_to_keep", o.num_to_keep},
          {"collective_timeout_s", o.collective_timeout_s}};
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
  TY_CHECK(!storage.empty(), "--storage must name a directory, file:///dir or s3://bucket/prefix.");
  TY_CHECK(checkpoint_every >= 0, "--checkpoint-every must be >= 0 (0: only at the end), got ",
           checkpoint_every, ".");
  TY_CHECK(num_to_keep >= 0, "--num-to-keep must be >= 0 (0: keep all), got ", num_to_keep, ".");
  TY_CHECK(max_restarts >= 0, "--max-restarts must be >= 0, got ", max_restarts, ".");
  TY_CHECK(collective_timeout_s > 0 && collective_timeout_s <= 1e6,
           "--collective-timeout must be in (0, 1000000] seconds, got ", collective_timeout_s, ".");
  TY_CHECK(hang_timeout_s >= 0 && hang_timeout_s <= 1e6,
           "--hang-timeout must be in [0, 1000000] seconds (0: off), got ", hang_timeout_s, ".");
  TY_CHECK(!name.empty() && name.find('/') == std::string::npos,
           "--name must be a non-empty folder name without '/', got '", name, "'.");
}

FashionMnistResult run_fashion_mnist_rank(const FashionMnistOptions& options) {
  options.validate();
  const auto start = Clock::now();
  auto init_options = init_options_from_env();  // the join timeout
  init_options.timeout =
      std::chrono::milliseconds(static_cast<std::int64_t>(options.collective_timeout_s * 1000));
  auto dist = init(init_options);
  const int rank = dist->rank();
  const int world = dist->world_size();
  const int restart_count = dist->env().restart_count;
  auto log = logger("train");

  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int local_ranks = std::max(1, dist->env().local_world_size);
  const int threads = options.threads > 0 ? options.threads : std::max(1, cores / local_ranks);
  torch::set_num_threads(threads);

  const std::string data_dir = options.data_dir.empty() ? data::kFashionMnistDir : options.data_dir;
  auto train_set = data::load_fashion_mnist(data_dir, data::Split::kTrain, options.limit);
  auto test_set = data::load_fashion_mnist(data_dir, data::Split::kTest);

  const std::string run_uri = storage::join_uri(options.storage, options.name);
  // Rank 0 writes the checkpoints and holds the run's lease (Note [Run lease]); the others only
  // read the one rank 0 chose.
  checkpoint::Checkpointer checkpointer(
      run_uri, {.num_to_keep = options.num_to_keep, .read_only = rank != 0});
  auto resolved = options;
  resolved.data_dir = data_dir;
  const auto config = config_json(resolved, world, threads);
  if (rank == 0) {
    checkpointer.storage().write("config.json", json_text(config));
    log->info("configuration: {}", config.dump());
  }

  torch::manual_seed(options.seed);
  auto model = models::resnet18(/*in_channels=*/1, /*num_classes=*/10);

  // Rank 0 picks the checkpoint to resume from (the newest that verifies) and tells the others,
  // so that every rank loads the same one even while rank 0 of an earlier attempt is saving.
  std::optional<checkpoint::LoadedCheckpoint> resume;
  if (rank == 0) resume = checkpointer.load_latest();
  auto chosen =
      torch::tensor({resume ? checkpoint::checkpoint_number(resume->name) : -1}, torch::kInt64);
  if (world > 1) {
    std::vector<torch::Tensor> v{chosen};
    wait_work(dist->process_group()->broadcast(v));
  }
  if (rank != 0 && chosen.item<std::int64_t>() >= 0) {
    resume = checkpointer.load(checkpoint::checkpoint_name(chosen.item<std::int64_t>()));
  }
  Progress progress{.world_size = world};
  if (resume) {
    const auto where = storage::join_uri(run_uri, resume->name);
    auto file = [&](const std::string& f) -> const std::string& {
      auto it = resume->checkpoint.files.find(f);
      TY_CHECK_T(CheckpointCorruptError, it != resume->checkpoint.files.end(), where, " has no ", f,
                 ".");
      return it->second;
    };
    checkpoint::load_module(*model, file("model.pt"), where + "/model.pt");
    checkpoint::load_cpu_rng_state(file("rng.pt"), where + "/rng.pt");
    progress = progress_from_json(file("state.json"), where + "/state.json");
    if (progress.world_size != world) {
      log->warn(
          "{} was taken at world size {}; continuing at world size {} from the same sample "
          "position.",
          resume->name, progress.world_size, world);
    }
  }

  ddp::DistributedDataParallel ddp(model, dist->process_group(),
                                   ddp::DdpOptions{.bucket_size_bytes = static_cast<std::size_t>(
                                                       options.bucket_cap_mb * (1 << 20))});
  // Each rank updates its share of the parameters; see Note [Optimizer sharding].
  optim::ShardedAdam optimizer(model->parameters(), torch::optim::AdamOptions(options.lr),
                               dist->process_group());
  if (resume) {
    const auto where = storage::join_uri(run_uri, resume->name) + "/optimizer.pt";
    auto it = resume->checkpoint.files.find("optimizer.pt");
    TY_CHECK_T(CheckpointCorruptError, it != resume->checkpoint.files.end(), where, " is missing.");
    optimizer.load_state_bytes(it->second, where);
    if (rank == 0) {
      std::printf("Resuming from %s at step %lld (epoch %d, %lld samples into it)\n",
                  resume->name.c_str(), static_cast<long long>(progress.global_step),
                  progress.epoch, static_cast<long long>(progress.epoch_position));
      std::fflush(stdout);
    }
  } else if (rank == 0) {
    if (const auto damaged = checkpointer.list_damaged(); !damaged.empty()) {
      std::string names;
      for (const auto& n : damaged) names += (names.empty() ? "" : ", ") + n;
      std::printf(
          "No checkpoint of %s verifies: starting from scratch; the damaged ones (%s) are kept "
          "for inspection\n",
          run_uri.c_str(), names.c_str());
      std::fflush(stdout);
    }
  }
  std::string last_checkpoint = resume ? resume->name : "";
  std::int64_t last_checkpoint_step = resume ? progress.global_step : -1;

  // Collective: the optimizer's moments are gathered from their owners on every rank at the same
  // steps. Then rank 0 saves while the others go on to the next step and wait for it in the next
  // all-reduce. Serialising is the stall; the files are written in the background while training
  // goes on.
  auto save_checkpoint = [&] {
    heartbeat();  // around each phase that may take a while: Note [Hang watchdog]
    const auto t0 = Clock::now();
    auto optimizer_state = optimizer.state_to_bytes(/*root=*/0);
    last_checkpoint_step = progress.global_step;  // on every rank: it decides the final save
    if (rank != 0) return;
    progress.world_size = world;
    checkpoint::Checkpoint c{.step = progress.global_step};
    c.files["model.pt"] = checkpoint::module_to_bytes(*model);
    c.files["optimizer.pt"] = std::move(optimizer_state);
    c.files["rng.pt"] = checkpoint::cpu_rng_state_to_bytes();
    c.files["state.json"] = json_text(to_json(progress));
    const double serialize_s = seconds_since(t0);
    checkpointer.save_in_background(std::move(c));  // waits for the previous save first
    heartbeat();
    log->info("Checkpoint of step {}: training stalled {:.2f} s ({:.2f} s serialising)",
              progress.global_step, seconds_since(t0), serialize_s);
  };

  data::DistributedSampler sampler({.dataset_size = train_set.size(),
                                    .num_replicas = world,
                                    .rank = rank,
                                    .shuffle = true,
                                    .seed = options.seed});
  auto make_batch = [&train_set](const std::vector<std::int64_t>& idx) {
    auto [x, y] = data::fashion_mnist_batch(train_set, idx);
    return data::Batch{x, y};
  };

  const bool bar_enabled = options.progress && rank == 0 && interactive_output();
  const std::string restarts =
      restart_count > 0 ? detail::concat(" | Restarts: ", restart_count) : std::string();
  double train_time = 0;
  std::int64_t samples_seen = 0;  // this rank, this attempt
  for (int epoch = progress.epoch; epoch < options.epochs; ++epoch) {
    const auto epoch_start = Clock::now();
    sampler.set_epoch(epoch);
    model->train();
    const std::int64_t first_position = epoch == progress.epoch ? progress.epoch_position : 0;
    data::BatchLoader loader(sampler.indices(first_position), make_batch,
                             {.batch_size = options.batch_size});
    ProgressBar bar(bar_enabled, epoch, loader.num_batches());
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
      heartbeat();  // one step of progress; see Note [Hang watchdog]
      samples_seen += batch->inputs.size(0);
      ++step;
      ++progress.global_step;
      if (step == loader.num_batches()) {
        progress.epoch = epoch + 1;
        progress.epoch_position = 0;
      } else {
        progress.epoch = epoch;
        progress.epoch_position =
            first_position - first_position % world + step * options.batch_size * world;
      }
      if (bar_enabled && (step % 5 == 0 || step == loader.num_batches()))
        bar.update(step, loss.item<double>());
      if (resume && samples_seen == batch->inputs.size(0)) {
        log->info(
            "First step after resuming from {} done: step {}, {:.2f} s after this rank started",
            resume->name, progress.global_step, seconds_since(start));
      } else {
        log->debug("step {} done", progress.global_step);
      }
      if (options.checkpoint_every > 0 && progress.global_step % options.checkpoint_every == 0)
        save_checkpoint();
      lap = Clock::now();
    }
    progress.epoch = epoch + 1;
    progress.epoch_position = 0;
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
        "time: %.4f%s]\n",
        epoch, dist->local_rank(), rank, static_cast<long long>(options.batch_size),
        static_cast<long long>(step), epoch_time, restarts.c_str());
    std::fflush(stdout);
  }
  if (last_checkpoint_step != progress.global_step) save_checkpoint();
  if (rank == 0) {
    if (auto name = checkpointer.wait()) last_checkpoint = *name;
    heartbeat();
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
      heartbeat();
    }
  }
  // (4,): loss sum, correct, count, samples trained; summed over ranks.
  auto totals =
      torch::tensor({loss_sum, correct, count, static_cast<double>(samples_seen)}, torch::kFloat64);
  if (world > 1) {
    std::vector<torch::Tensor> v{totals};
    wait_work(dist->process_group()->allreduce(v));
  }
  // The slowest rank's training time decides throughput.
  auto slowest = torch::tensor({train_time}, torch::kFloat64);
  if (world > 1) {
    std::vector<torch::Tensor> v{slowest};
    c10d::AllreduceOptions max_op;
    max_op.reduceOp = c10d::ReduceOp::MAX;
    wait_work(dist->process_group()->allreduce(v, max_op));
  }

  FashionMnistResult result;
  result.loss = totals[0].item<double>() / totals[2].item<double>();
  result.accuracy = totals[1].item<double>() / totals[2].item<double>();
  result.train_time_s = slowest.item<double>();
  result.train_samples_per_s =
      result.train_time_s > 0 ? totals[3].item<double>() / result.train_time_s : 0;
  result.world_size = world;
  result.run_uri = run_uri;
  result.restart_count = restart_count;
  result.global_step = progress.global_step;
  // Rank 0's name; the other ranks learn it from the result file.
  result.checkpoint_dir_name = last_checkpoint;

  if (rank == 0) {
    result.time_total_s = seconds_since(start);
    nlohmann::json out = {{"loss", result.loss},
                          {"accuracy", result.accuracy},
                          {"time_this_iter_s", result.time_total_s},
                          {"time_total_s", result.time_total_s},
                          {"training_iteration", 1},
                          {"checkpoint_dir_name", result.checkpoint_dir_name},
                          {"restart_count", restart_count},
                          {"global_step", progress.global_step},
                          {"train_time_s", result.train_time_s},
                          {"train_samples_per_s", result.train_samples_per_s},
                          {"world_size", world},
                          {"config", config}};
    checkpointer.storage().write("result.json", json_text(out));
    log->info("test accuracy {:.4f}, loss {:.5f}; {:.1f} training samples/s; results in {}",
              result.accuracy, result.loss, result.train_samples_per_s, run_uri);
  }
  dist->barrier();
  return result;
}

void print_training_result(const std::string& run_uri) {
  const auto text = storage::open_storage(run_uri)->read("result.json");
  const auto path = storage::join_uri(run_uri, "result.json");
  TY_CHECK_T(Error, text.has_value(), "No result at ", path,
             ": the job did not finish. HINT: the ranks' output above names the cause.");
  nlohmann::json r;
  try {
    r = nlohmann::json::parse(*text);
  } catch (const std::exception& e) {
    throw CorruptDataError(detail::concat(path, " is not valid JSON: ", e.what()));
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
      {"restart_count", std::to_string(r.value("restart_count", 0))},
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
