#pragma once

#include <CLI/CLI.hpp>

namespace trainyard::cli {

// `trainyard export`: a causal-lm run's checkpoint as a Hugging Face model folder.
void add_export_command(CLI::App& app, int& exit_code);

}  // namespace trainyard::cli
