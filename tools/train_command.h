// `trainyard train <recipe>`: the built-in training recipes.
#pragma once

#include <CLI/CLI.hpp>

namespace trainyard::cli {

// Adds the `train` subcommand; when it runs, its exit status goes to *exit_code.
void add_train_command(CLI::App& app, int& exit_code);

}  // namespace trainyard::cli
