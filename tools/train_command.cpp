#include "tools/train_command.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "trainyard/blas_core.h"
#include "trainyard/storage/storage.h"
#include "trainyard/comm/dist_env.h"
#include "trainyard/data/fashion_mnist.h"
#include "trainyard/elastic/launcher.h"
#include "trainyard/train/fashion_mnist.h"

namespace trainyard::cli {
namespace {

constexpr const char* kParentEnv = "TRAINYARD_RECIPE_PARENT";

// Bare start: run the recipe's ranks through the launcher, then print the result table.
int launch_fashion_mnist(const train::FashionMnistOptions& o,
                         const std::vector<std::string>& args) {
  const auto start = std::chrono::steady_clock::now();
  elastic::LaunchOptions launch;
  launch.nproc_per_node = o.workers;
  launch.run_id = o.name;
  launch.max_restarts = o.max_restarts;
  launch.hang_timeout =
      std::chrono::milliseconds(static_cast<std::int64_t>(o.hang_timeout_s * 1000));
  launch.extra_env = {{kParentEnv, "1"}};
  // The ranks run this same command line; under the launcher's environment each is one rank.
  launch.command = {elastic::self_executable()};
  launch.command.insert(launch.command.end(), args.begin() + 1, args.end());
  auto result = elastic::launch(launch);
  if (!result.succeeded) return result.exit_code();
  train::print_training_result(storage::join_uri(o.storage, o.name));
  const auto total =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - start)
          .count();
  std::printf("\nTotal running time: %lldmin %llds\n", static_cast<long long>(total / 60),
              static_cast<long long>(total % 60));
  return 0;
}

}  // namespace

void add_train_command(CLI::App& app, std::vector<std::string> args, int& exit_code) {
  auto* train = app.add_subcommand("train", "Run a built-in training recipe.");
  train->require_subcommand(1);

  static train::FashionMnistOptions o;  // CLI11 binds flags to storage that outlives parsing
  static bool no_progress = false;      // bound like `o`: read after this function returns
  auto* fm = train->add_subcommand(
      "fashion-mnist",
      "ResNet18 on FashionMNIST with DistributedDataParallel (the seed's Ray Train job). Run bare "
      "it starts --workers local ranks itself; under `trainyard run` it is one rank of that job.");
  // A flag given twice takes its last value, as in most launchers: `scripts/quickstart.sh
  // --epochs 1` appends to the seed's `--epochs 10`.
  fm->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  fm->add_option("--workers", o.workers, "Ranks to start when run bare")->capture_default_str();
  fm->add_option("--epochs", o.epochs, "Passes over the training set")->capture_default_str();
  fm->add_option("--batch-size", o.batch_size, "Batch size per rank")->capture_default_str();
  fm->add_option("--lr", o.lr, "Adam learning rate")->capture_default_str();
  fm->add_option("--storage", o.storage,
                 "Where runs go: a directory, file:///dir or s3://bucket/prefix; this run is "
                 "STORAGE/NAME")
      ->capture_default_str();
  fm->add_option("--name", o.name,
                 "The run's folder under --storage; a new start resumes its newest checkpoint")
      ->capture_default_str();
  fm->add_option("--checkpoint-every", o.checkpoint_every,
                 "Save a checkpoint every N steps (0: only at the end)")
      ->capture_default_str();
  fm->add_option("--num-to-keep", o.num_to_keep, "Keep the newest K checkpoints (0: all)")
      ->capture_default_str();
  fm->add_option("--max-restarts", o.max_restarts,
                 "Run bare: restart the ranks up to N times after a failure")
      ->capture_default_str();
  fm->add_option("--limit", o.limit, "Use the first N training images (-1: all)")
      ->capture_default_str();
  fm->add_option("--threads", o.threads, "Intra-op threads per rank (0: cores / ranks)")
      ->capture_default_str();
  fm->add_option("--bucket-cap-mb", o.bucket_cap_mb, "DDP gradient bucket size in MiB")
      ->capture_default_str();
  fm->add_option("--seed", o.seed, "Seed for initialisation and shuffling")->capture_default_str();
  fm->add_option("--data-dir", o.data_dir, "Folder with the FashionMNIST IDX files")
      ->default_str(data::kFashionMnistDir);
  fm->add_option("--collective-timeout", o.collective_timeout_s,
                 "Seconds a collective or store wait may take before it fails")
      ->envname(kCollectiveTimeoutEnv)
      ->capture_default_str();
  fm->add_option("--hang-timeout", o.hang_timeout_s,
                 "Run bare: restart (or stop) the ranks when one makes no progress for this many "
                 "seconds; 0: off")
      ->envname(elastic::kHangTimeoutEnv)
      ->capture_default_str();
  fm->add_flag("--no-progress", no_progress, "Never draw a progress bar");
  fm->callback([&exit_code, args = std::move(args)] {
    o.progress = !no_progress;
    o.validate();
    if (!dist_env_present()) {
      set_blas_core_for_children();
      exit_code = launch_fashion_mnist(o, args);
      return;
    }
    // A rank computes: it needs OpenBLAS's right kernels in this very process.
    std::vector<char*> self_argv;
    for (const auto& a : args) self_argv.push_back(const_cast<char*>(a.c_str()));
    self_argv.push_back(nullptr);
    reexec_if_blas_core_misdetected(self_argv.data());
    auto result = train::run_fashion_mnist_rank(o);
    // Rank 0 prints the table, unless the bare parent that launched this job prints it.
    if (parse_dist_env().rank == 0 && std::getenv(kParentEnv) == nullptr)
      train::print_training_result(result.run_uri);
    exit_code = 0;
  });
}

}  // namespace trainyard::cli
