// `trainyard train <recipe>`: the built-in training recipes.
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

namespace trainyard::cli {

// Adds the `train` subcommand; when it runs, its exit status goes to *exit_code. `args` is the
// process's command line (argv), which a bare recipe start hands on to the ranks it launches.
void add_train_command(CLI::App& app, std::vector<std::string> args, int& exit_code);

}  // namespace trainyard::cli
