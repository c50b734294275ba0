#include "tools/train_command.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "tools/launch_flags.h"
#include "tools/recipe.h"
#include "tools/stop_signals.h"
#include "trainyard/blas_core.h"
#include "trainyard/comm/dist_env.h"
#include "trainyard/elastic/launcher.h"
#include "trainyard/env.h"
#include "trainyard/storage/storage.h"
#include "trainyard/train/result.h"

namespace trainyard::cli {
namespace {

// Bare start: run the recipe's ranks through the launcher, then print the result table.
int launch_recipe(const Recipe& recipe, const std::vector<std::string>& args) {
  const auto start = std::chrono::steady_clock::now();
  elastic::LaunchOptions launch = recipe.launch;
  launch.nproc_per_node = recipe.scaling.workers;
  launch.run_id = recipe.run.name;
  launch.restart_backoff_max = std::max(launch.restart_backoff_max, launch.restart_backoff);
  launch.extra_env = {{kRecipeParentEnv, "1"}};
  // The ranks run this same command line; under the launcher's environment each is one rank.
  launch.command = {elastic::self_executable()};
  launch.command.insert(launch.command.end(), args.begin() + 1, args.end());
  auto result = launch_until_signalled(launch);
  if (!result.succeeded) return result.exit_code();
  train::print_training_result(recipe.run.uri());
  const auto total =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - start)
          .count();
  std::printf("\nTotal running time: %lldmin %llds\n", static_cast<long long>(total / 60),
              static_cast<long long>(total % 60));
  return 0;
}

// The RunConfig and ScalingConfig flags every recipe has.
void add_shared_flags(CLI::App& c, Recipe& r, bool& no_progress) {
  c.add_option("--workers", r.scaling.workers, "Ranks to start when run bare")
      ->capture_default_str();
  c.add_option("--storage", r.run.storage,
               "Where runs go: a directory, file:///dir or s3://bucket/prefix; this run is "
               "STORAGE/NAME")
      ->capture_default_str();
  c.add_option("--name", r.run.name,
               "The run's folder under --storage; a new start resumes its newest checkpoint")
      ->capture_default_str();
  c.add_option("--checkpoint-every", r.run.checkpoint_every,
               "Save a checkpoint every N steps (0: only at the end)")
      ->capture_default_str();
  c.add_option("--num-to-keep", r.run.num_to_keep, "Keep the newest K checkpoints (0: all)")
      ->capture_default_str();
  c.add_option("--threads", r.scaling.threads, "Intra-op threads per rank (0: usable CPUs / ranks)")
      ->capture_default_str();
  c.add_option("--device", r.scaling.device,
               "cpu, or cuda: each rank on the GPU numbered LOCAL_RANK, collectives on NCCL")
      ->envname(kDeviceEnv)
      ->capture_default_str();
  add_seconds_option(c, r.run.collective_timeout,
                     {.names = "--collective-timeout",
                      .description = "Seconds a collective or store wait may take before it fails",
                      .min = 0.001,
                      .max = 1e6,
                      .env = kCollectiveTimeoutEnv});
  // Run bare, the recipe is the launcher: --max-restarts, --hang-timeout, ... as `trainyard run`
  // takes them.
  add_restart_flags(c, r.launch);
  c.add_flag("--no-progress", no_progress, "Never draw a progress bar");
}

}  // namespace

void add_train_command(CLI::App& app, std::vector<std::string> args, int& exit_code) {
  auto* train = app.add_subcommand("train", "Run a built-in training recipe.");
  train->require_subcommand(1);

  // CLI11 binds flags to storage that outlives parsing: the recipes live as long as the program.
  static auto recipes = builtin_recipes();
  static bool no_progress = false;
  for (auto& owned : recipes) {
    Recipe& recipe = *owned;
    auto* command = train->add_subcommand(recipe.name(), recipe.summary());
    // A flag given twice takes its last value, as in most launchers: `scripts/quickstart.sh
    // --epochs 1` appends to the seed's `--epochs 10`.
    command->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    add_shared_flags(*command, recipe, no_progress);
    recipe.add_flags(*command);
    command->callback([&recipe, &exit_code, args] {
      recipe.progress = !no_progress;
      recipe.validate();
      if (!dist_env_present()) {
        set_blas_core_for_children();
        exit_code = launch_recipe(recipe, args);
        return;
      }
      // A rank computes: it needs OpenBLAS's right kernels in this very process.
      std::vector<char*> self_argv;
      for (const auto& a : args) self_argv.push_back(const_cast<char*>(a.c_str()));
      self_argv.push_back(nullptr);
      reexec_if_blas_core_misdetected(self_argv.data());
      recipe.run_rank();
      // Rank 0 prints the table, unless the bare parent that launched this job prints it.
      if (parse_dist_env().rank == 0 && std::getenv(kRecipeParentEnv) == nullptr)
        train::print_training_result(recipe.run.uri());
      exit_code = 0;
    });
  }
}

}  // namespace trainyard::cli
