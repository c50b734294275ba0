// `trainyard run`: the torchrun-compatible local launcher command. Starts --nproc-per-node ranks
// of a program with the torchrun environment contract (see trainyard/elastic/launcher.h).
#pragma once

#include <CLI/CLI.hpp>

namespace trainyard::cli {

// Adds the `run` subcommand to app. When it runs, exit_code receives the launcher's exit code
// (0, the failing rank's code, or 128 + signal). Usage errors that CLI11 cannot see (a missing
// program, an unsupported multi-node setup) throw trainyard::InvalidArgumentError from parse().
void add_run_command(CLI::App& app, int& exit_code);

}  // namespace trainyard::cli
