// `trainyard plan`: per-device memory of every parallelism strategy for a model, a world size and
// a batch, and which strategy fits the devices (trainyard::plan; LibTorch-free).
#pragma once

#include <CLI/CLI.hpp>

namespace trainyard::cli {

// Adds the `plan` subcommand; when it runs, its exit status goes to *exit_code (0: printed; a bad
// flag throws InvalidArgumentError, which main() reports).
void add_plan_command(CLI::App& app, int& exit_code);

}  // namespace trainyard::cli
