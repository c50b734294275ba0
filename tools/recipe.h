// The built-in recipes, as the CLI reads them: `trainyard train NAME [flags]` for each. A recipe
// has its own flags (epochs, lr, ...) besides the RunConfig and ScalingConfig flags every recipe
// shares, which the CLI adds. Run bare, the CLI launches scaling.workers ranks of the same
// command line; under `trainyard run` (the environment contract present) it runs one rank.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "trainyard/elastic/launcher.h"
#include "trainyard/train/run_config.h"

namespace CLI {
class App;
}

namespace trainyard::cli {

class Recipe {
 public:
  virtual ~Recipe() = default;
  virtual std::string name() const = 0;
  // One line for `trainyard train --help`.
  virtual std::string summary() const = 0;
  // Adds the recipe's own flags to its subcommand, bound to this object.
  virtual void add_flags(CLI::App& command) = 0;
  // Throws InvalidArgumentError naming the first bad flag (the shared configs' too).
  virtual void validate() const = 0;
  // Runs one rank of the job (the environment contract must be present); rank 0 writes
  // <run>/result.json.
  virtual void run_rank() = 0;

  // The shared configs, bound to the common flags; each recipe sets its defaults (the run's name).
  train::RunConfig run;
  train::ScalingConfig scaling;
  // Run bare: the launcher's restart policy (launch_flags.h: add_restart_flags).
  elastic::LaunchOptions launch;
  bool progress = true;  // a progress bar on rank 0 when the output is a terminal
};

// fashion-mnist, image-folder, causal-lm: fresh objects holding their defaults.
std::vector<std::unique_ptr<Recipe>> builtin_recipes();

}  // namespace trainyard::cli
